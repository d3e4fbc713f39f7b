//! The declarative description of every table and key of the workflow format.
//!
//! One source of truth serves four consumers: the shape check of the syntax tree (unknown
//! keys, wrong types, missing keys), the KDL mapping (which nodes are keyed collections),
//! the JSON Schema of the TOML form (`ralph-flow schema`), and the key tables of
//! WORKFLOW-SPEC.md.

/// The type a key accepts.
/// Whether a string is a worker label (see [`Ty::Label`]).
pub fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/'))
}

#[derive(Debug)]
pub enum Ty {
    /// Any string.
    Str,
    /// A string that is a minijinja template.
    Template,
    /// A string that is a minijinja expression.
    Expr,
    /// A worker label: ASCII letters, digits and `-`, `_`, `.`, `:`, `/`.
    Label,
    /// A string chosen from a fixed set.
    Enum(&'static [&'static str]),
    /// A non-negative integer, or a template over params that renders to one.
    Count,
    /// Any integer.
    Int,
    /// A number.
    Number,
    /// A boolean.
    Bool,
    /// A duration: seconds as an integer, or a string such as `90s`, `10m`, `2h`, `1d`,
    /// or a template over params that renders to one.
    Duration,
    /// An action: `continue`, `break`, `fail`, `approve`, `reject`, `exit:NAME` or a stage id.
    Action,
    /// Any value (param defaults, inline JSON Schemas).
    Any,
    /// A list; a single item is accepted as a list of one.
    List(&'static Ty),
    /// A nested table with fixed keys.
    Table(&'static TableSpec),
    /// A table of user-chosen keys mapping to values of one type (env vars, params).
    Map(&'static Ty),
    /// A table of named items, each a table; in KDL written as `singular "name" { ... }`.
    Named(&'static TableSpec, &'static str),
    /// An array of tables; in KDL written as repeated `singular ...` nodes.
    Tables(&'static TableSpec, &'static str),
    /// Either a string or a table.
    StrOrTable(&'static TableSpec),
}

/// One key of a table.
#[derive(Debug)]
pub struct Field {
    pub key: &'static str,
    pub ty: Ty,
    pub required: bool,
    /// The stage or agent kinds this key applies to; empty means all.
    pub kinds: &'static [&'static str],
    pub doc: &'static str,
}

/// A table of the format.
#[derive(Debug)]
pub struct TableSpec {
    pub name: &'static str,
    pub doc: &'static str,
    pub fields: &'static [Field],
    /// The key whose value selects the kind, for tables whose keys depend on a kind.
    pub kind_key: Option<&'static str>,
}

impl TableSpec {
    /// Returns the field with the given key.
    pub fn field(&self, key: &str) -> Option<&'static Field>
    where
        Self: 'static,
    {
        self.fields.iter().find(|f| f.key == key)
    }
}

const fn f(key: &'static str, ty: Ty, doc: &'static str) -> Field {
    Field {
        key,
        ty,
        required: false,
        kinds: &[],
        doc,
    }
}
const fn req(key: &'static str, ty: Ty, doc: &'static str) -> Field {
    Field {
        key,
        ty,
        required: true,
        kinds: &[],
        doc,
    }
}
const fn k(key: &'static str, kinds: &'static [&'static str], ty: Ty, doc: &'static str) -> Field {
    Field {
        key,
        ty,
        required: false,
        kinds,
        doc,
    }
}

keywords! {
    /// The kind of a stage (`kind`).
    pub enum StageKind {
        Agent = "agent",
        Command = "command",
        Gate = "gate",
        Check = "check",
        Subflow = "subflow",
        Loop = "loop",
        ForEach = "for_each",
        Group = "group",
    }
}

impl StageKind {
    /// Tells whether the kind has a body of stages.
    pub fn is_region(self) -> bool {
        matches!(
            self,
            StageKind::Loop | StageKind::ForEach | StageKind::Group
        )
    }
}

/// The stage kinds.
pub const STAGE_KINDS: &[&str] = StageKind::NAMES;
keywords! {
    /// The kind of backend an agent uses (`kind`). An agent CLI (`is_agent_cli`) is one file
    /// of backend/cli plus its line in that module's table.
    #[derive(Default)]
    pub enum AgentKind {
        Claude = "claude",
        Codex = "codex",
        Gemini = "gemini",
        Qwen = "qwen",
        Opencode = "opencode",
        OpenAi = "openai",
        Anthropic = "anthropic",
        #[default]
        Command = "command",
        Replay = "replay",
        Acp = "acp",
    }
}

impl AgentKind {
    /// Whether the kind runs an agent's command-line program, which takes `permissions`
    /// (the `command` kind runs any program, and takes none).
    pub const fn is_agent_cli(self) -> bool {
        matches!(
            self,
            Self::Claude | Self::Codex | Self::Gemini | Self::Qwen | Self::Opencode
        )
    }

    /// The dialect of the output schema an agent CLI takes by flag (claude and qwen
    /// `--json-schema`, both checked by Ajv in strict mode; codex `--output-schema`); `None`
    /// for one that has no such flag.
    pub const fn cli_schema_dialect(self) -> Option<crate::dialect::Dialect> {
        use crate::dialect::Dialect;
        match self {
            Self::Claude | Self::Qwen => Some(Dialect::Claude),
            Self::Codex => Some(Dialect::OpenAiStrict),
            _ => None,
        }
    }

    /// Whether the kind calls a model's HTTP API itself (`base_url`, `api_key_env`).
    pub const fn is_http(self) -> bool {
        matches!(self, Self::OpenAi | Self::Anthropic)
    }

    /// Whether a stage's output schema can reach the kind's model (`structured_output`).
    pub const fn takes_structured_output(self) -> bool {
        self.is_agent_cli() || self.is_http() || matches!(self, Self::Acp)
    }

    /// Whether the kind runs a program of the agent's `command` (`command`, `acp`).
    pub const fn runs_command(self) -> bool {
        matches!(self, Self::Command | Self::Acp)
    }

    /// Whether the kind takes `permissions` (the agent CLIs, mapped to their flags; `acp`,
    /// whose agent asks the workflow's policy).
    pub const fn takes_permissions(self) -> bool {
        self.is_agent_cli() || matches!(self, Self::Acp)
    }
}

/// The names of the agent kinds for which a test of [`AgentKind`] holds, in declaration
/// order: `agent_kinds_where!(is_agent_cli)`.
macro_rules! agent_kinds_where {
    ($test:ident) => {{
        const COUNT: usize = {
            let (mut n, mut i) = (0, 0);
            while i < AgentKind::ALL.len() {
                if AgentKind::ALL[i].$test() {
                    n += 1;
                }
                i += 1;
            }
            n
        };
        const NAMES: [&str; COUNT] = {
            let mut out = [""; COUNT];
            let (mut n, mut i) = (0, 0);
            while i < AgentKind::ALL.len() {
                if AgentKind::ALL[i].$test() {
                    out[n] = AgentKind::ALL[i].as_str();
                    n += 1;
                }
                i += 1;
            }
            out
        };
        &NAMES
    }};
}

/// The agent backend kinds.
pub const AGENT_KINDS: &[&str] = AgentKind::NAMES;
/// The param types.
pub const PARAM_TYPES: &[&str] = &["string", "int", "float", "bool", "list"];
/// The types of a list param's items.
pub const PARAM_ITEM_TYPES: &[&str] = &["string", "int", "float", "bool"];
/// What an agent may do unattended: the named levels (a workflow's `[policy.NAME]` may be
/// named too).
pub const PERMISSIONS: &[&str] = &["read-only", "edit", "commit", "full"];
/// The output extraction modes.
pub const EXTRACT_MODES: &[&str] = &["text", "json", "fenced_json", "markers", "regex"];
/// How a `command` agent may get its prompt.
pub const PROMPT_VIA: &[&str] = &["stdin", "file", "arg"];
/// The OpenAI APIs an `openai` agent may call.
pub const OPENAI_APIS: &[&str] = &["chat", "responses"];
/// When a worktree may be removed.
pub const CLEANUPS: &[&str] = &["on_success", "always", "never"];
/// The fan-in aggregation modes.
pub const AGGREGATE_MODES: &[&str] = &[
    "collect", "all", "any", "worst", "best", "highest", "lowest",
];

/// The kinds a stage key is for, by the kinds' words: a kind misspelt does not compile.
macro_rules! kinds {
    ($($kind:ident),+) => {
        &[$(StageKind::$kind.as_str()),+]
    };
}

const BODY: &[&str] = kinds![Loop, ForEach, Group];
const RUNS_COMMAND: &[&str] = kinds![Command, Check];
const AGENT_STAGES: &[&str] = kinds![Agent];
const COMMAND_STAGES: &[&str] = kinds![Command];
const CHECK_STAGES: &[&str] = kinds![Check];
const GATE_STAGES: &[&str] = kinds![Gate];
const SUBFLOW_STAGES: &[&str] = kinds![Subflow];
const LOOP_STAGES: &[&str] = kinds![Loop];
const FOR_EACH_STAGES: &[&str] = kinds![ForEach];
const FANS_IN_STAGES: &[&str] = kinds![ForEach, Group];
const ITERATES_STAGES: &[&str] = kinds![Loop, ForEach];
const CALLS_STAGES: &[&str] = kinds![Agent, Command, Check];

/// The top level of a workflow file.
pub static WORKFLOW: TableSpec = TableSpec {
    name: "workflow",
    doc: "The top level of a workflow file.",
    kind_key: None,
    fields: &[
        // Required of every file but one pulled in by `include` (see `model::lower`), which
        // the JSON Schema of a file cannot tell apart.
        f(
            "name",
            Ty::Str,
            "The workflow's name: lowercase letters, digits, `-` and `_`. Required, except in a file pulled in by `include`.",
        ),
        f(
            "version",
            Ty::Str,
            "The workflow's version, for people and lockfiles.",
        ),
        f(
            "description",
            Ty::Str,
            "What the workflow does, shown by `explain`.",
        ),
        f(
            "extends",
            Ty::StrOrTable(&EXTENDS),
            "A base workflow this file builds on: a path, a preset name (`spider`) or a preset of a source (`team:spider`), alone or as `workflow` with `params`; see Reuse.",
        ),
        f(
            "include",
            Ty::List(&Ty::Str),
            "Files (paths or preset names) whose params, agents, resources, exits and stages are merged into this one.",
        ),
        f(
            "prompt_path",
            Ty::List(&Ty::Str),
            "Directories searched in order for every `prompt_file`, before the directory of the file that names it; relative to this file. An extending file's directories come before its base's.",
        ),
        f(
            "worktree",
            Ty::Table(&WORKTREE),
            "The whole run works in its own git worktree and branch, made under the state directory (see Worktrees).",
        ),
        f(
            "file_roots",
            Ty::List(&Ty::Str),
            "Directories outside the workspace that the template helpers (`read_file`, `file_exists`, `glob`, `tail`) may read; relative to this file. Without them, helpers read only the workspace and the state directory.",
        ),
        f(
            "secrets",
            Ty::List(&Ty::Str),
            "Names of environment variables whose values are secrets: masked as `[REDACTED]` in everything the run writes or prints, besides the agents' key variables and the well-known names (see Secrets under Running workflows). Added to those of the files this one extends and includes.",
        ),
        f(
            "sources",
            Ty::Named(&SOURCE, "source"),
            "Git repositories that presets come from, pinned to a revision, named in references as `SOURCE:PRESET`; see Reuse.",
        ),
        f(
            "max_concurrency",
            Ty::Count,
            "The most stages that run at once in the whole run.",
        ),
        f(
            "budget",
            Ty::Table(&BUDGET),
            "Token and cost limits for the whole run.",
        ),
        f(
            "params",
            Ty::Named(&PARAM, "param"),
            "Typed inputs, set with `--set name=value`.",
        ),
        f(
            "agents",
            Ty::Named(&AGENT, "agent"),
            "Named backend configurations.",
        ),
        f(
            "resources",
            Ty::Named(&RESOURCE, "resource"),
            "Named resources with a capacity, such as a merge queue.",
        ),
        f(
            "exits",
            Ty::Named(&EXIT, "exit"),
            "Named outcomes with their process exit codes.",
        ),
        f(
            "stages",
            Ty::Named(&STAGE, "stage"),
            "The stages, keyed by id.",
        ),
        f(
            "overrides",
            Ty::Named(&OVERRIDE, "override"),
            "Changes to stages of the extended workflow, keyed by stage id.",
        ),
        f(
            "notify",
            Ty::Named(&NOTIFY, "notifier"),
            "Where a waiting gate (and, when asked, the run's end) is announced: a webhook, Slack, ntfy or a command; see Notifications.",
        ),
        // Permission policies (issue 32).
        f(
            "policy",
            Ty::Named(&POLICY, "policy"),
            "Named permission policies, which an agent's or an agent stage's `permissions` names: what the agent may edit, which commands it may run, network and the rest; see Permission policies.",
        ),
    ],
};

/// `policy.NAME`: a permission policy (issue 32).
pub static POLICY: TableSpec = TableSpec {
    name: "policy",
    doc: "What an agent may do unattended, named by `permissions`: a level it starts from and the rules it adds. Lists add to those of what it extends; `edit`, `network` and `other` replace them.",
    kind_key: None,
    fields: &[
        f(
            "extends",
            Ty::Str,
            "What it starts from: a level (`read-only`, the default; `edit`; `commit`; `full`) or another policy's name.",
        ),
        f(
            "edit",
            Ty::Any,
            "The files the agent may change: `true` (any file of the workspace but its `.git`), `false` (none), or a list of globs relative to the workspace (`[\"src/**\", \"tests\"]`; a directory names what is in it).",
        ),
        f(
            "allow",
            Ty::List(&Ty::Str),
            "Commands the agent may run, by pattern: words matched one by one, each a glob, a last `*` matching any further words (`git commit *`, `cargo test`).",
        ),
        f(
            "deny",
            Ty::List(&Ty::Str),
            "Commands the agent may never run, by pattern; a `deny` wins over every `allow`, also over a `full` level's.",
        ),
        f(
            "network",
            Ty::Bool,
            "Whether the agent may fetch from the network.",
        ),
        f(
            "other",
            Ty::Bool,
            "Whether the agent may do what no other rule covers (an MCP tool, a mode switch).",
        ),
    ],
};

/// `extends`.
pub static EXTENDS: TableSpec = TableSpec {
    name: "extends",
    doc: "The base workflow and the params given to it.",
    kind_key: None,
    fields: &[
        req(
            "workflow",
            Ty::Str,
            "The base workflow: a path relative to this file (ending in `.toml` or `.kdl`), a preset name, or `SOURCE:PRESET`.",
        ),
        f(
            "params",
            Ty::Map(&Ty::Any),
            "Values for the base workflow's params.",
        ),
    ],
};

/// `sources.NAME`.
pub static SOURCE: TableSpec = TableSpec {
    name: "source",
    doc: "A git repository of presets, pinned to a revision; `ralph-flow.lock` beside this file records the commit and a content hash.",
    kind_key: None,
    fields: &[
        req(
            "git",
            Ty::Str,
            "The repository: a URL, or a path relative to this file.",
        ),
        req(
            "rev",
            Ty::Str,
            "The revision: a tag, a branch or a commit id. The lockfile pins what it resolved to.",
        ),
        f(
            "path",
            Ty::Str,
            "The directory inside the repository that holds the presets (default: its root).",
        ),
    ],
};

/// `budget`.
pub static BUDGET: TableSpec = TableSpec {
    name: "budget",
    doc: "Limits on tokens and cost; when one is passed, `on_exceeded` is taken.",
    kind_key: None,
    fields: &[
        f(
            "tokens",
            Ty::Count,
            "The most tokens (input plus output) that may be used.",
        ),
        f(
            "cost_usd",
            Ty::Number,
            "The most money, in US dollars, that may be spent.",
        ),
        f(
            "on_exceeded",
            Ty::Action,
            "The action when a limit is passed (default `fail`).",
        ),
    ],
};

/// `params.NAME`.
pub static PARAM: TableSpec = TableSpec {
    name: "param",
    doc: "A typed input of the workflow.",
    kind_key: None,
    fields: &[
        req(
            "type",
            Ty::Enum(PARAM_TYPES),
            "The type: string, int, float, bool or list (its items are strings unless `items` says otherwise).",
        ),
        f(
            "items",
            Ty::Enum(PARAM_ITEM_TYPES),
            "For a list: the type of its items (default `string`).",
        ),
        f(
            "default",
            Ty::Any,
            "The value when none is set; a param without a default is required.",
        ),
        f("description", Ty::Str, "What the param is for."),
        f("choices", Ty::List(&Ty::Any), "The only values allowed."),
    ],
};

/// `agents.NAME`.
pub static AGENT: TableSpec = TableSpec {
    name: "agent",
    doc: "A named backend configuration.",
    kind_key: Some("kind"),
    fields: &[
        req(
            "kind",
            Ty::Enum(AGENT_KINDS),
            "The backend: claude, codex, gemini, qwen, opencode, openai, anthropic, command or replay.",
        ),
        f(
            "model",
            Ty::Template,
            "The model name, passed to the backend.",
        ),
        f(
            "args",
            Ty::List(&Ty::Template),
            "Extra arguments for CLI backends.",
        ),
        f(
            "env",
            Ty::Map(&Ty::Template),
            "Extra environment variables for CLI backends.",
        ),
        f("timeout", Ty::Duration, "The longest one call may take."),
        f(
            "idle_timeout",
            Ty::Duration,
            "The longest a call may go without output.",
        ),
        f(
            "context_window",
            Ty::Count,
            "The model's context window in tokens; longer prompts are refused before sending.",
        ),
        f(
            "fallbacks",
            Ty::List(&Ty::Str),
            "Agents that take over when this one is rate-limited or missing.",
        ),
        k(
            "command",
            agent_kinds_where!(runs_command),
            Ty::List(&Ty::Template),
            "The argv of a `command` agent, or of an `acp` agent's program (`[\"gemini\", \"--acp\"]`).",
        ),
        k(
            "prompt_via",
            &["command"],
            Ty::Enum(PROMPT_VIA),
            "How a `command` agent gets the prompt (default `stdin`).",
        ),
        k(
            "base_url",
            agent_kinds_where!(is_http),
            Ty::Str,
            "The API's base URL, for compatible servers.",
        ),
        k(
            "api_key_env",
            agent_kinds_where!(is_http),
            Ty::Str,
            "The environment variable that holds the API key.",
        ),
        k(
            "api",
            &["openai"],
            Ty::Enum(OPENAI_APIS),
            "Which OpenAI API to call (default `chat`).",
        ),
        k(
            "max_tokens",
            agent_kinds_where!(is_http),
            Ty::Count,
            "The most output tokens to ask for.",
        ),
        k("file", &["replay"], Ty::Str, "The recording to replay."),
        k(
            "permissions",
            agent_kinds_where!(takes_permissions),
            Ty::Str,
            "What the agent may do unattended: a level, `read-only` (default), `edit` (write files in its working directory), `commit` (edit and commit, never push) or `full` (no restriction), or the name of one of the workflow's `[policy.NAME]`; see Permission policies.",
        ),
        k(
            "structured_output",
            agent_kinds_where!(takes_structured_output),
            Ty::Enum(STRUCTURED_OUTPUT_MODES),
            "How a stage's output schema reaches the model: `auto` (default), `json_schema`, `json_object`, `guided_json`, `prompt` or `off`.",
        ),
    ],
};

/// The values of an agent's `structured_output`.
pub const STRUCTURED_OUTPUT_MODES: &[&str] = &[
    "auto",
    "json_schema",
    "json_object",
    "guided_json",
    "prompt",
    "off",
];

/// `resources.NAME`.
pub static RESOURCE: TableSpec = TableSpec {
    name: "resource",
    doc: "A named resource that at most `capacity` stages hold at once.",
    kind_key: None,
    fields: &[
        req(
            "capacity",
            Ty::Count,
            "How many stages may hold it at once.",
        ),
        f(
            "order",
            Ty::List(&Ty::Str),
            "Priority values from first served to last; without it, higher numbers go first.",
        ),
    ],
};

/// The kinds of a notifier (`notify.NAME.kind`).
pub const NOTIFY_KINDS: &[&str] = &["webhook", "slack", "ntfy", "command"];

/// The events a notifier may announce (`notify.NAME.on`).
pub const NOTIFY_EVENTS: &[&str] = &["gate", "finished", "failed", "cancelled"];

/// The kinds of notifier that post to a URL.
const URL_NOTIFIERS: &[&str] = &["webhook", "slack", "ntfy"];

/// `notify.NAME`: a notifier, in a workflow or in the user's config file.
pub static NOTIFY: TableSpec = TableSpec {
    name: "notifier",
    doc: "Where a waiting gate, and the run's end when asked, is announced. Delivery never blocks or fails the run; each outcome is an event of the run.",
    kind_key: Some("kind"),
    fields: &[
        req(
            "kind",
            Ty::Enum(NOTIFY_KINDS),
            "How: `webhook` (a JSON POST), `slack` (a Slack incoming webhook), `ntfy` (a POST to an ntfy topic) or `command` (a program that reads the JSON on stdin).",
        ),
        k(
            "url",
            URL_NOTIFIERS,
            Ty::Str,
            "The http(s) URL posted to (for ntfy, the topic's URL). A URL that holds a secret (a Slack webhook, a private topic) belongs in an environment variable named by `url_env`.",
        ),
        k(
            "url_env",
            URL_NOTIFIERS,
            Ty::Str,
            "The environment variable that holds the URL; its value is masked as a secret.",
        ),
        k(
            "headers_env",
            &["webhook", "ntfy"],
            Ty::Map(&Ty::Str),
            "HTTP headers sent with each POST, each mapped to the environment variable that holds its value (`{ Authorization = \"HOOK_TOKEN\" }`); the values are masked as secrets.",
        ),
        k(
            "argv",
            &["command"],
            Ty::List(&Ty::Str),
            "The program and its arguments, as a list (never through a shell); it reads the event as JSON on stdin, with RALPH_FLOW_RUN_ID, RALPH_FLOW_EVENT, RALPH_FLOW_GATE and RALPH_FLOW_WORKFLOW set.",
        ),
        f(
            "on",
            Ty::List(&Ty::Enum(NOTIFY_EVENTS)),
            "What is announced: `gate` (a gate starts waiting), `finished`, `failed`, `cancelled` (default `[\"gate\"]`).",
        ),
        f(
            "retries",
            Ty::Count,
            "How many times a failed delivery is tried again, with exponential backoff, on a connection error, a timeout, a 5xx, 408 or 429 (default 5).",
        ),
        f(
            "timeout",
            Ty::Duration,
            "The longest one delivery may take (default `10s`).",
        ),
        f(
            "monitor_url",
            Ty::Str,
            "The monitor's base URL (`http://host:8080`), for the run's link; default `$RALPH_FLOW_MONITOR_URL`.",
        ),
    ],
};

/// The user's config file (`$XDG_CONFIG_HOME/ralph-flow/config.toml`).
pub static USER_CONFIG: TableSpec = TableSpec {
    name: "config",
    doc: "The user's config file: what applies to every run the user starts.",
    kind_key: None,
    fields: &[f(
        "notify",
        Ty::Named(&NOTIFY, "notifier"),
        "Notifiers added to every run's own.",
    )],
};

/// `exits.NAME`.
pub static EXIT: TableSpec = TableSpec {
    name: "exit",
    doc: "A named outcome of the run.",
    kind_key: None,
    fields: &[
        req("code", Ty::Int, "The process exit code."),
        f(
            "message",
            Ty::Template,
            "What is printed when the run ends this way.",
        ),
    ],
};

/// `stages.ID`.
pub static STAGE: TableSpec = TableSpec {
    name: "stage",
    doc: "A step of the workflow; `kind` says which keys apply.",
    kind_key: Some("kind"),
    fields: &[
        req(
            "kind",
            Ty::Enum(STAGE_KINDS),
            "agent, command, gate, check, subflow, loop, for_each or group.",
        ),
        f(
            "description",
            Ty::Str,
            "What the stage does, shown by `explain` and `graph`.",
        ),
        f(
            "needs",
            Ty::List(&Ty::Str),
            "Stages (in the same body) that must settle before this one starts: one id, or a list of ids.",
        ),
        f(
            "when",
            Ty::Expr,
            "A condition; when false the stage is skipped.",
        ),
        f(
            "optional",
            Ty::Bool,
            "When the stage is skipped, the stages that need it run as if it had run: its skip does not spread to them (default false).",
        ),
        k(
            "labels",
            CALLS_STAGES,
            Ty::List(&Ty::Label),
            "Labels a worker must have to carry out the stage's work, in a run on workers (`ralph-flow worker --labels`): an agent's CLI, a toolchain, a GPU. Elsewhere they are not used.",
        ),
        f(
            "route",
            Ty::Table(&ROUTE),
            "Where to go next, by a value of this stage's output.",
        ),
        f(
            "on_fail",
            Ty::Action,
            "The action when the stage fails (default: `continue` inside a loop, `fail` outside).",
        ),
        f(
            "on_error",
            Ty::Action,
            "The action when the stage cannot run for reasons outside the work: an agent that cannot be reached, a timeout, a program that cannot start (default `fail`).",
        ),
        k(
            "then",
            CALLS_STAGES,
            Ty::Action,
            "The action taken when the stage completes and no route case took one: `exit:NAME`, `fail`, `continue` or `break` (a stage run when a loop or gate gives up says so how the run goes on).",
        ),
        f(
            "feedback",
            Ty::Template,
            "What this stage hands to the next iteration when it ends one.",
        ),
        f("timeout", Ty::Duration, "The longest the stage may run."),
        f(
            "idle_timeout",
            Ty::Duration,
            "The longest the stage may go without output.",
        ),
        f(
            "retries",
            Ty::Count,
            "Retries of transient failures and of outputs that fail their schema (default 2).",
        ),
        f(
            "resource",
            Ty::Str,
            "A resource the stage holds while it runs.",
        ),
        f(
            "priority",
            Ty::Expr,
            "The stage's place in the resource's queue.",
        ),
        f(
            "budget",
            Ty::Table(&BUDGET),
            "Token and cost limits for this stage.",
        ),
        f(
            "output",
            Ty::Table(&OUTPUT),
            "How to extract and validate the stage's output.",
        ),
        k(
            "agent",
            AGENT_STAGES,
            Ty::Template,
            "The agent to run; may be a template over params that names an agent.",
        ),
        k(
            "prompt",
            AGENT_STAGES,
            Ty::Template,
            "The prompt, written inline.",
        ),
        k(
            "prompt_file",
            AGENT_STAGES,
            Ty::Str,
            "The prompt, in a template file: looked up in the `prompt_path` directories, else relative to the workflow.",
        ),
        // Permission policies (issue 32).
        k(
            "permissions",
            AGENT_STAGES,
            Ty::Str,
            "What the agent may do in this stage, instead of its agent's `permissions`: a level (`read-only`, `edit`, `commit`, `full`) or a `[policy.NAME]`.",
        ),
        k(
            "argv",
            RUNS_COMMAND,
            Ty::List(&Ty::Template),
            "The command and its arguments; never passed through a shell.",
        ),
        k("cwd", RUNS_COMMAND, Ty::Template, "The working directory."),
        k(
            "env",
            RUNS_COMMAND,
            Ty::Map(&Ty::Template),
            "Extra environment variables.",
        ),
        k(
            "stdin",
            RUNS_COMMAND,
            Ty::Template,
            "Text written to the command's standard input.",
        ),
        k(
            "ok_codes",
            COMMAND_STAGES,
            Ty::List(&Ty::Int),
            "Exit codes that count as success (default [0]).",
        ),
        k(
            "pass_codes",
            CHECK_STAGES,
            Ty::List(&Ty::Int),
            "Exit codes that pass the check (default [0]).",
        ),
        k(
            "expect",
            CHECK_STAGES,
            Ty::Expr,
            "A condition over outputs (and this command's `output`) that must hold.",
        ),
        k(
            "message",
            GATE_STAGES,
            Ty::Template,
            "What the person approving is shown.",
        ),
        k(
            "show",
            GATE_STAGES,
            Ty::List(&Ty::Template),
            "Files to show with the message.",
        ),
        k(
            "on_timeout",
            GATE_STAGES,
            Ty::Action,
            "The action when nobody answers in time: approve, reject, fail or exit:NAME, or a stage beside the gate to run instead.",
        ),
        k(
            "on_reject",
            GATE_STAGES,
            Ty::Action,
            "The action on reject (default: `continue` inside a loop, `fail` outside).",
        ),
        k(
            "workflow",
            SUBFLOW_STAGES,
            Ty::Str,
            "The workflow file to run, relative to this file.",
        ),
        k(
            "params",
            SUBFLOW_STAGES,
            Ty::Map(&Ty::Template),
            "Params for the subflow.",
        ),
        k(
            "max_iterations",
            LOOP_STAGES,
            Ty::Count,
            "The most iterations; required.",
        ),
        k(
            "until",
            LOOP_STAGES,
            Ty::Expr,
            "The loop ends after an iteration where this holds.",
        ),
        k(
            "on_exhausted",
            LOOP_STAGES,
            Ty::Action,
            "The action when the iterations run out (default `fail`), or a stage beside the loop to run instead (see Loops).",
        ),
        k(
            "stuck",
            LOOP_STAGES,
            Ty::Table(&STUCK),
            "Stuck detection over iterations.",
        ),
        k(
            "escalation",
            LOOP_STAGES,
            Ty::Tables(&ESCALATION, "escalation"),
            "Rules that run extra stages when they hold.",
        ),
        k(
            "over",
            FOR_EACH_STAGES,
            Ty::Expr,
            "The list to fan out over.",
        ),
        k(
            "as",
            FOR_EACH_STAGES,
            Ty::Str,
            "The name of the item variable (default `item`).",
        ),
        k(
            "key",
            FOR_EACH_STAGES,
            Ty::Expr,
            "A stable id for each item (default: its index).",
        ),
        k(
            "max_concurrency",
            FANS_IN_STAGES,
            Ty::Count,
            "The most items or members that run at once.",
        ),
        k(
            "aggregate",
            FANS_IN_STAGES,
            Ty::Table(&AGGREGATE),
            "How results fan in.",
        ),
        k(
            "result",
            FANS_IN_STAGES,
            Ty::Str,
            "The body stage whose output is the result of an item (default: the body's last stage).",
        ),
        k(
            "worktree",
            ITERATES_STAGES,
            Ty::Table(&WORKTREE),
            "Run the body in its own git worktree.",
        ),
        k(
            "stages",
            BODY,
            Ty::Named(&STAGE, "stage"),
            "The body: stages keyed by id.",
        ),
    ],
};

/// `stages.ID.route`.
pub static ROUTE: TableSpec = TableSpec {
    name: "route",
    doc: "Chooses what happens next from one field of the stage's output.",
    kind_key: None,
    fields: &[
        req(
            "on",
            Ty::Str,
            "The output field to route on, as a dotted path such as `verdict`.",
        ),
        req("cases", Ty::Map(&Ty::Action), "Actions by value."),
        f(
            "default",
            Ty::Action,
            "The action for values without a case (default `fail`).",
        ),
    ],
};

/// `stages.ID.output`.
pub static OUTPUT: TableSpec = TableSpec {
    name: "output",
    doc: "How the stage's output is extracted from its text and validated.",
    kind_key: None,
    fields: &[
        f(
            "extract",
            Ty::Enum(EXTRACT_MODES),
            "text, json, fenced_json, markers or regex (default: json when a schema is given, else text).",
        ),
        f(
            "schema",
            Ty::StrOrTable(&SCHEMA_INLINE),
            "A JSON Schema file relative to the workflow, or an inline schema.",
        ),
        f(
            "pattern",
            Ty::Str,
            "With `extract = \"regex\"`: a regex whose named groups become fields.",
        ),
        f(
            "markers",
            Ty::Named(&MARKER, "marker"),
            "Marker lines that become fields, such as `VERDICT: ...`.",
        ),
        f(
            "files",
            Ty::List(&Ty::Template),
            "Files the stage produces, as paths or globs.",
        ),
    ],
};

/// An inline JSON Schema (any keys).
pub static SCHEMA_INLINE: TableSpec = TableSpec {
    name: "schema",
    doc: "An inline JSON Schema.",
    kind_key: None,
    fields: &[],
};

/// `output.markers.NAME`.
pub static MARKER: TableSpec = TableSpec {
    name: "marker",
    doc: "A field read from marker lines of the text. The last matching line wins.",
    kind_key: None,
    fields: &[
        f(
            "prefix",
            Ty::Str,
            "Lines starting with this text match; the rest of the line is the value.",
        ),
        f(
            "pattern",
            Ty::Str,
            "Lines matching this regex match; the first capture group is the value.",
        ),
        f("many", Ty::Bool, "Collect every match into a list."),
        f("values", Ty::List(&Ty::Str), "The only values allowed."),
    ],
};

/// `stuck`.
pub static STUCK: TableSpec = TableSpec {
    name: "stuck",
    doc: "Stops a loop whose iterations keep producing the same findings.",
    kind_key: None,
    fields: &[
        req(
            "on",
            Ty::Expr,
            "The value compared across iterations, such as the review's findings.",
        ),
        f(
            "repeats",
            Ty::Count,
            "How many iterations in a row must agree (default 2).",
        ),
        f(
            "then",
            Ty::Action,
            "The action when stuck (default `fail`), or a stage beside the loop to run instead.",
        ),
    ],
};

/// `escalation`.
pub static ESCALATION: TableSpec = TableSpec {
    name: "escalation",
    doc: "Runs extra stages of the loop body when a condition holds.",
    kind_key: None,
    fields: &[
        req(
            "when",
            Ty::Expr,
            "The condition, over loop variables and outputs.",
        ),
        req(
            "run",
            Ty::List(&Ty::Str),
            "Body stages that run only when a rule naming them holds.",
        ),
        f("description", Ty::Str, "Why the rule exists."),
    ],
};

/// `aggregate`.
pub static AGGREGATE: TableSpec = TableSpec {
    name: "aggregate",
    doc: "Combines the results of a fan-out into one value.",
    kind_key: None,
    fields: &[
        req(
            "mode",
            Ty::Enum(AGGREGATE_MODES),
            "collect, all, any, worst, best, highest or lowest.",
        ),
        f("field", Ty::Str, "The output field compared or tested."),
        f(
            "order",
            Ty::List(&Ty::Str),
            "For worst and best: the values from best to worst (default: the schema's enum order).",
        ),
    ],
};

/// `worktree`.
pub static WORKTREE: TableSpec = TableSpec {
    name: "worktree",
    doc: "An isolated git worktree and branch for a loop or for each item.",
    kind_key: None,
    fields: &[
        req("branch", Ty::Template, "The branch name."),
        f(
            "base",
            Ty::Template,
            "The revision to branch from (default `HEAD`).",
        ),
        f(
            "cleanup",
            Ty::Enum(CLEANUPS),
            "When to remove the worktree (default `on_success`).",
        ),
    ],
};

/// `overrides.STAGE`.
pub static OVERRIDE: TableSpec = TableSpec {
    name: "override",
    doc: "Replaces settings of a stage of the extended workflow.",
    kind_key: None,
    fields: &[
        f("prompt", Ty::Template, "A new inline prompt."),
        f("prompt_file", Ty::Str, "A new prompt file."),
        f("agent", Ty::Template, "A new agent."),
        f("timeout", Ty::Duration, "A new timeout."),
        f("idle_timeout", Ty::Duration, "A new idle timeout."),
        f("retries", Ty::Count, "A new number of retries."),
        f("max_iterations", Ty::Count, "A new bound for a loop."),
        f(
            "max_concurrency",
            Ty::Count,
            "A new concurrency limit for a fan-out.",
        ),
        f("when", Ty::Expr, "A new condition."),
        f(
            "optional",
            Ty::Bool,
            "Whether the stage's skip counts as done for the stages that need it.",
        ),
        f("budget", Ty::Table(&BUDGET), "A new budget."),
    ],
};

/// The pseudo-table of [`WellKnown`] entries that hold for every action-valued key.
pub const ACTION: &str = "action";

/// A value people often write for a key of a fixed set of values (or for an action), with a
/// sentence that says what to write instead: the names other tools use for an agent CLI, the
/// type names of other languages, local model servers that speak the OpenAI API.
///
/// The one table of such names: the shape check gives the sentence instead of a "did you
/// mean" (next to the list of allowed values), as the action check does for actions.
#[derive(Debug)]
pub struct WellKnown {
    /// The table ([`TableSpec::name`]) whose keys take these values, or [`ACTION`].
    pub table: &'static str,
    /// The keys; empty for [`ACTION`] (every action-valued key).
    pub keys: &'static [&'static str],
    /// The wrong values, as compared: lowercase, with `_`, `.` and spaces written as `-`.
    pub wrong: &'static [&'static str],
    /// The value the sentence recommends (first); for an action, empty when the sentence
    /// holds wherever an action is written (else it is given only where that action is).
    pub right: &'static str,
    /// The sentence, with settings written in TOML; `{key}` stands for the key.
    advice: &'static str,
}

impl WellKnown {
    /// The sentence for `key`, in TOML and in KDL.
    pub fn advice(&self, key: &str) -> (String, String) {
        let toml = self.advice.replace("{key}", key);
        let kdl = toml.replace(" = ", "=");
        (toml, kdl)
    }
}

const fn wk(
    table: &'static str,
    keys: &'static [&'static str],
    wrong: &'static [&'static str],
    right: &'static str,
    advice: &'static str,
) -> WellKnown {
    WellKnown {
        table,
        keys,
        wrong,
        right,
        advice,
    }
}

const KIND: &[&str] = &["kind"];
const PARAM_TYPE_KEYS: &[&str] = &["type", "items"];

/// Every well-known wrong value (see [`WellKnown`]).
pub static WELL_KNOWN: &[WellKnown] = &[
    // Agent kinds.
    wk(
        "agent",
        KIND,
        &[
            "claude-code",
            "claudecode",
            "claude-cli",
            "claude-code-cli",
            "anthropic-claude",
            "anthropic-cli",
        ],
        "claude",
        "the claude CLI agent (Claude Code) is `kind = \"claude\"`; `kind = \"anthropic\"` calls Anthropic's API itself",
    ),
    wk(
        "agent",
        KIND,
        &[
            "claude-api",
            "anthropic-api",
            "claude-http",
            "anthropic-http",
        ],
        "anthropic",
        "Anthropic's API is `kind = \"anthropic\"`; `kind = \"claude\"` runs the claude CLI",
    ),
    wk(
        "agent",
        KIND,
        &[
            "sonnet",
            "opus",
            "haiku",
            "claude-sonnet",
            "claude-opus",
            "claude-haiku",
        ],
        "claude",
        "`kind` is the backend: `kind = \"claude\"` (the claude CLI) or `kind = \"anthropic\"` (the API); the model goes in `model`",
    ),
    wk(
        "agent",
        KIND,
        &["gemini-cli", "google-gemini", "gemini-code"],
        "gemini",
        "the gemini CLI agent is `kind = \"gemini\"`",
    ),
    wk(
        "agent",
        KIND,
        &["codex-cli", "openai-codex"],
        "codex",
        "the codex CLI agent is `kind = \"codex\"`",
    ),
    wk(
        "agent",
        KIND,
        &["qwen-code", "qwen-cli", "qwen-coder"],
        "qwen",
        "the qwen CLI agent (Qwen Code) is `kind = \"qwen\"`",
    ),
    wk(
        "agent",
        KIND,
        &["opencode-ai", "opencode-cli", "sst-opencode"],
        "opencode",
        "the opencode CLI agent is `kind = \"opencode\"`",
    ),
    wk(
        "agent",
        KIND,
        &[
            "gpt", "chatgpt", "gpt-4", "gpt-4o", "gpt-4-1", "gpt-5", "o3", "o4-mini",
        ],
        "openai",
        "`kind` is the backend: OpenAI's API is `kind = \"openai\"` (`kind = \"codex\"` runs the codex CLI); the model goes in `model`",
    ),
    wk(
        "agent",
        KIND,
        &[
            "openai-compatible",
            "openai-compat",
            "openai-api",
            "openai-http",
            "azure-openai",
            "azure",
            "litellm",
        ],
        "openai",
        "a server that speaks the OpenAI API is `kind = \"openai\"`, with its address in `base_url`",
    ),
    wk(
        "agent",
        KIND,
        &["openrouter"],
        "openai",
        "OpenRouter speaks the OpenAI API: use `kind = \"openai\"` with `base_url = \"https://openrouter.ai/api/v1\"`",
    ),
    wk(
        "agent",
        KIND,
        &["ollama"],
        "openai",
        "an ollama server speaks the OpenAI API: use `kind = \"openai\"` with `base_url = \"http://localhost:11434/v1\"`",
    ),
    wk(
        "agent",
        KIND,
        &["lmstudio", "lm-studio"],
        "openai",
        "LM Studio's server speaks the OpenAI API: use `kind = \"openai\"` with `base_url = \"http://localhost:1234/v1\"`",
    ),
    wk(
        "agent",
        KIND,
        &["vllm"],
        "openai",
        "a vLLM server speaks the OpenAI API: use `kind = \"openai\"` with `base_url = \"http://localhost:8000/v1\"`",
    ),
    wk(
        "agent",
        KIND,
        &["llama-cpp", "llamacpp", "llama-server"],
        "openai",
        "llama.cpp's llama-server speaks the OpenAI API: use `kind = \"openai\"` with `base_url = \"http://localhost:8080/v1\"`",
    ),
    wk(
        "agent",
        KIND,
        &[
            "shell", "script", "program", "exec", "cli", "custom", "process",
        ],
        "command",
        "an agent that is a program of your own is `kind = \"command\"`, with the program and its arguments in `command`",
    ),
    wk(
        "agent",
        KIND,
        &[
            "mock",
            "fake",
            "recording",
            "recorded",
            "playback",
            "record",
        ],
        "replay",
        "an agent that plays back a recorded session is `kind = \"replay\"`, with the recording in `file`",
    ),
    // Param types.
    wk(
        "param",
        PARAM_TYPE_KEYS,
        &["integer", "i32", "i64", "u32", "u64", "long", "whole"],
        "int",
        "whole numbers are `{key} = \"int\"`",
    ),
    wk(
        "param",
        PARAM_TYPE_KEYS,
        &["number", "num", "numeric"],
        "int",
        "a number is `{key} = \"int\"` (whole numbers) or `{key} = \"float\"`",
    ),
    wk(
        "param",
        PARAM_TYPE_KEYS,
        &["double", "decimal", "real", "f32", "f64"],
        "float",
        "numbers with a fraction are `{key} = \"float\"`",
    ),
    wk(
        "param",
        PARAM_TYPE_KEYS,
        &["boolean", "flag", "switch"],
        "bool",
        "true or false is `{key} = \"bool\"`",
    ),
    wk(
        "param",
        PARAM_TYPE_KEYS,
        &["str", "text", "char", "path", "file", "url", "name"],
        "string",
        "text is `{key} = \"string\"`",
    ),
    wk(
        "param",
        &["type"],
        &[
            "array", "vec", "vector", "sequence", "seq", "strings", "tuple",
        ],
        "list",
        "a list is `type = \"list\"` (of strings, unless `items` names another type)",
    ),
    wk(
        "param",
        &["type"],
        &["enum", "choice", "select", "option", "options"],
        "string",
        "a param of a fixed set of values is `type = \"string\"` with the values in `choices`",
    ),
    // Stage kinds.
    wk(
        "stage",
        KIND,
        &[
            "shell", "script", "cmd", "run", "exec", "bash", "sh", "program", "process",
        ],
        "command",
        "a stage that runs a program is `kind = \"command\"` (or `kind = \"check\"` when its result passes or fails the work)",
    ),
    wk(
        "stage",
        KIND,
        &[
            "approval", "approve", "human", "manual", "confirm", "sign-off", "signoff", "wait",
        ],
        "gate",
        "a stage that waits for a person to approve is `kind = \"gate\"`",
    ),
    wk(
        "stage",
        KIND,
        &[
            "map",
            "fan-out",
            "fanout",
            "each",
            "for",
            "for-all",
            "forall",
            "for-every",
            "matrix",
        ],
        "for_each",
        "a stage whose body runs once per item of a list is `kind = \"for_each\"`",
    ),
    wk(
        "stage",
        KIND,
        &[
            "parallel",
            "concurrent",
            "sequence",
            "block",
            "steps",
            "stages",
            "fan-in",
        ],
        "group",
        "stages that run together as one are a `kind = \"group\"`; a body run once per item of a list is `kind = \"for_each\"`",
    ),
    wk(
        "stage",
        KIND,
        &[
            "while",
            "repeat",
            "retry",
            "iterate",
            "until",
            "ralph",
            "ralph-loop",
            "cycle",
        ],
        "loop",
        "a stage whose body runs again until a condition holds is `kind = \"loop\"`",
    ),
    wk(
        "stage",
        KIND,
        &[
            "workflow",
            "sub-workflow",
            "subworkflow",
            "call",
            "include",
            "flow",
            "nested",
        ],
        "subflow",
        "a stage that runs another workflow file is `kind = \"subflow\"`",
    ),
    wk(
        "stage",
        KIND,
        &[
            "test",
            "tests",
            "assert",
            "verify",
            "validate",
            "condition",
            "expect",
        ],
        "check",
        "a stage that passes or fails the work by a command or a condition is `kind = \"check\"`",
    ),
    wk(
        "stage",
        KIND,
        &[
            "llm",
            "ai",
            "prompt",
            "model",
            "task",
            "claude",
            "codex",
            "gemini",
            "qwen",
            "opencode",
            "openai",
            "anthropic",
        ],
        "agent",
        "a stage that prompts an agent is `kind = \"agent\"`, with the agent's name in `agent`",
    ),
    // Agent permissions.
    wk(
        "agent",
        &["permissions"],
        &[
            "write",
            "workspace-write",
            "write-files",
            "rw",
            "read-write",
            "edit-files",
            "accept-edits",
            "acceptedits",
            "auto-edit",
        ],
        "edit",
        "to let the agent write files in its working directory, use `permissions = \"edit\"`",
    ),
    wk(
        "agent",
        &["permissions"],
        &[
            "yolo",
            "all",
            "any",
            "bypass",
            "bypasspermissions",
            "bypass-permissions",
            "dangerous",
            "danger-full-access",
            "unrestricted",
            "unsafe",
            "admin",
            "root",
            "full-access",
        ],
        "full",
        "to let the agent do anything unattended, use `permissions = \"full\"`",
    ),
    wk(
        "agent",
        &["permissions"],
        &[
            "read",
            "ro",
            "none",
            "safe",
            "plan",
            "default",
            "sandbox",
            "restricted",
        ],
        "read-only",
        "`permissions = \"read-only\"` (the default) lets the agent read but change nothing",
    ),
    // How a schema reaches the model.
    wk(
        "agent",
        &["structured_output"],
        &["none", "no", "false", "disabled", "disable", "never"],
        "off",
        "to send no schema, use `structured_output = \"off\"`",
    ),
    wk(
        "agent",
        &["structured_output"],
        &["json", "schema", "strict"],
        "json_schema",
        "`structured_output = \"json_schema\"` holds the model to the stage's schema; `structured_output = \"json_object\"` asks only for a JSON object",
    ),
    wk(
        "agent",
        &["structured_output"],
        &["true", "yes", "on", "default", "enabled", "enable"],
        "auto",
        "`structured_output = \"auto\"` (the default) takes the best way the agent has",
    ),
    // Output extraction.
    wk(
        "output",
        &["extract"],
        &["yaml", "yml", "toml", "xml"],
        "json",
        "outputs are read as JSON, marker lines, a regex or plain text: ask for JSON and use `extract = \"json\"`",
    ),
    wk(
        "output",
        &["extract"],
        &["raw", "plain", "string", "none", "stdout", "all"],
        "text",
        "the output as plain text is `extract = \"text\"`",
    ),
    wk(
        "output",
        &["extract"],
        &[
            "fenced",
            "json-fenced",
            "json-block",
            "code-block",
            "codeblock",
            "markdown",
            "md",
        ],
        "fenced_json",
        "JSON in a ```json block of the text is `extract = \"fenced_json\"`",
    ),
    wk(
        "output",
        &["extract"],
        &["lines", "prefix", "line", "tags", "labels"],
        "markers",
        "lines such as `VERDICT: ...` are `extract = \"markers\"`, with the fields under `markers`",
    ),
    wk(
        "output",
        &["extract"],
        &["pattern", "re", "regular-expression", "grep"],
        "regex",
        "named groups of a regular expression are `extract = \"regex\"`, with the regex in `pattern`",
    ),
    // Fan-in.
    wk(
        "aggregate",
        &["mode"],
        &["max", "maximum", "top", "greatest"],
        "highest",
        "the result with the greatest `field` is `mode = \"highest\"`",
    ),
    wk(
        "aggregate",
        &["mode"],
        &["min", "minimum", "bottom", "least"],
        "lowest",
        "the result with the least `field` is `mode = \"lowest\"`",
    ),
    wk(
        "aggregate",
        &["mode"],
        &["every", "and", "each"],
        "all",
        "whether a boolean `field` holds for every result is `mode = \"all\"`",
    ),
    wk(
        "aggregate",
        &["mode"],
        &["some", "or", "one"],
        "any",
        "whether a boolean `field` holds for some result is `mode = \"any\"`",
    ),
    wk(
        "aggregate",
        &["mode"],
        &[
            "list", "gather", "merge", "concat", "array", "results", "join",
        ],
        "collect",
        "the list of every result is `mode = \"collect\"` (the default)",
    ),
    wk(
        "aggregate",
        &["mode"],
        &[
            "majority",
            "vote",
            "consensus",
            "average",
            "mean",
            "sum",
            "count",
        ],
        "collect",
        "there is no such mode: use `mode = \"collect\"` and compute it from `output.value` in a stage after",
    ),
    // Worktrees.
    wk(
        "worktree",
        &["cleanup"],
        &["keep", "no", "false", "none", "manual", "off"],
        "never",
        "to keep the worktree, use `cleanup = \"never\"`",
    ),
    wk(
        "worktree",
        &["cleanup"],
        &[
            "remove", "delete", "yes", "true", "auto", "on", "done", "on-exit",
        ],
        "always",
        "to remove the worktree however the work ends, use `cleanup = \"always\"`",
    ),
    wk(
        "worktree",
        &["cleanup"],
        &[
            "on-failure",
            "on-fail",
            "on-error",
            "failure",
            "keep-on-failure",
        ],
        "on_success",
        "`cleanup = \"on_success\"` (the default) removes the worktree only when the work succeeds, and keeps it to look at after a failure",
    ),
    // Command agents.
    wk(
        "agent",
        &["prompt_via"],
        &["pipe", "stdio", "standard-input", "input"],
        "stdin",
        "the prompt on standard input is `prompt_via = \"stdin\"` (the default)",
    ),
    wk(
        "agent",
        &["prompt_via"],
        &[
            "argument",
            "args",
            "argv",
            "positional",
            "command-line",
            "parameter",
            "param",
        ],
        "arg",
        "the prompt as the command's last argument is `prompt_via = \"arg\"`",
    ),
    wk(
        "agent",
        &["prompt_via"],
        &[
            "path",
            "tempfile",
            "temp-file",
            "tmpfile",
            "tmp-file",
            "files",
        ],
        "file",
        "the prompt in a file, whose path is the command's last argument, is `prompt_via = \"file\"`",
    ),
    // OpenAI APIs.
    wk(
        "agent",
        &["api"],
        &[
            "completions",
            "completion",
            "chat-completions",
            "chat-completion",
            "chatcompletions",
            "v1-chat-completions",
        ],
        "chat",
        "the Chat Completions API is `api = \"chat\"` (the default)",
    ),
    // Actions.
    wk(
        ACTION,
        &[],
        &["abort", "error", "halt", "die", "crash", "failure", "raise"],
        "fail",
        "to fail the stage (and, outside a loop, the run), use `fail`",
    ),
    wk(
        ACTION,
        &[],
        &["skip", "ignore", "next", "pass", "noop", "nothing"],
        "",
        "there is no such action: a stage is skipped by its `when` (and in a loop, `continue` moves on to the next iteration)",
    ),
    wk(
        ACTION,
        &[],
        &[
            "exit", "quit", "end", "stop", "finish", "done", "success", "succeed", "complete",
        ],
        "exit:success",
        "to end the run, name one of its exits: `exit:success`, `exit:failed` or one declared under `exits` (`break` leaves a loop)",
    ),
    wk(
        ACTION,
        &[],
        &["retry", "rerun", "again", "repeat", "loop", "restart"],
        "continue",
        "a stage that fails is tried again by its `retries`; in a loop, `continue` starts the next iteration",
    ),
    wk(
        ACTION,
        &[],
        &["accept", "allow", "yes", "approved", "pass-gate"],
        "approve",
        "to approve a gate nobody answered, use `approve`",
    ),
    wk(
        ACTION,
        &[],
        &["deny", "decline", "refuse", "no", "rejected"],
        "reject",
        "to reject a gate nobody answered, use `reject`",
    ),
];

/// Returns the well-known wrong value `value` of `table`.`key` (of any action-valued key
/// when `table` is [`ACTION`]).
pub fn well_known(table: &str, key: &str, value: &str) -> Option<&'static WellKnown> {
    let norm: String = value
        .trim()
        .chars()
        .map(|c| match c {
            '_' | '.' | ' ' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    WELL_KNOWN.iter().find(|w| {
        w.table == table
            && (table == ACTION || w.keys.contains(&key))
            && w.wrong.contains(&norm.as_str())
    })
}
