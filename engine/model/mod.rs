//! The workflow model shared by both syntaxes: what a file says, with names not yet resolved.

pub mod jsonschema;
pub mod lower;
pub mod shape;

use std::time::Duration;

use crate::source::{FileId, Span, Spanned};
use crate::syntax::tree::Value;

/// A template or expression string, with where it was written.
pub type Text = Spanned<String>;

/// A workflow file as written, after its shape was checked.
#[derive(Clone, Debug)]
pub struct Workflow {
    pub file: FileId,
    pub name: Text,
    pub version: Option<Text>,
    pub description: Option<Text>,
    pub extends: Option<Extends>,
    pub include: Vec<Text>,
    /// Directories searched for prompt files, extending files' first.
    pub prompt_path: Vec<Text>,
    /// Directories outside the workspace that template helpers may read.
    pub file_roots: Vec<Text>,
    /// The git worktree the whole run works in, if any.
    pub worktree: Option<Worktree>,
    /// Git repositories of presets declared by this file (not merged across files).
    pub sources: Vec<Source>,
    pub max_concurrency: Option<Spanned<Count>>,
    pub budget: Option<Budget>,
    pub params: Vec<Param>,
    pub agents: Vec<Agent>,
    pub resources: Vec<Resource>,
    pub exits: Vec<Exit>,
    pub stages: Vec<Stage>,
    pub overrides: Vec<Override>,
    /// Names of params, agents, resources, exits and stages that are defined but could not be
    /// lowered (an error was reported there); references to them are not reported again.
    pub broken: Vec<String>,
}

impl Workflow {
    /// An empty workflow, held while the real one is still borrowed (see
    /// `compile::compile_parts`).
    pub fn placeholder() -> Workflow {
        Workflow {
            file: crate::source::FileId::default(),
            name: Spanned {
                value: String::new(),
                span: crate::source::Span::default(),
            },
            version: None,
            description: None,
            extends: None,
            include: Vec::new(),
            prompt_path: Vec::new(),
            file_roots: Vec::new(),
            worktree: None,
            sources: Vec::new(),
            max_concurrency: None,
            budget: None,
            params: Vec::new(),
            agents: Vec::new(),
            resources: Vec::new(),
            exits: Vec::new(),
            stages: Vec::new(),
            overrides: Vec::new(),
            broken: Vec::new(),
        }
    }

    /// Tells whether a name was defined with an error already reported.
    pub fn is_broken(&self, name: &str) -> bool {
        self.broken.iter().any(|b| b == name)
    }
}

/// A definition with a name: params, agents, resources, exits and stages.
pub trait Named {
    /// Returns the name (a stage's id).
    fn name(&self) -> &Text;
}

macro_rules! named {
    ($($t:ty => $field:ident),*) => {
        $(impl Named for $t {
            fn name(&self) -> &Text {
                &self.$field
            }
        })*
    };
}

named!(Param => name, Agent => name, Resource => name, Exit => name, Stage => id, Source => name);

/// The base workflow a file extends.
#[derive(Clone, Debug)]
pub struct Extends {
    pub workflow: Text,
    pub params: Vec<(Text, Value)>,
    pub span: Span,
}

/// A git repository of presets, pinned to a revision.
#[derive(Clone, Debug)]
pub struct Source {
    pub name: Text,
    pub git: Text,
    pub rev: Text,
    pub path: Option<Text>,
    pub span: Span,
}

/// A number written literally or as a template over params.
#[derive(Clone, Debug, PartialEq)]
pub enum Count {
    Literal(u64),
    Template(String),
}

/// A duration written literally (seconds, or a string such as "72h", kept as written so
/// that `explain` can show it the way the file does) or as a template over params.
#[derive(Clone, Debug, PartialEq)]
pub enum Dur {
    Literal(Duration),
    Written(Duration, String),
    Template(String),
}

/// Token and cost limits.
#[derive(Clone, Debug)]
pub struct Budget {
    pub tokens: Option<Spanned<Count>>,
    pub cost_usd: Option<Spanned<f64>>,
    pub on_exceeded: Option<Spanned<Action>>,
    pub span: Span,
}

/// The type of a param.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    String,
    Int,
    Float,
    Bool,
    List,
}

impl ParamType {
    /// Returns the name as written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Int => "int",
            ParamType::Float => "float",
            ParamType::Bool => "bool",
            ParamType::List => "list",
        }
    }
}

/// A typed input of the workflow.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: Text,
    pub ty: Spanned<ParamType>,
    /// For a list: the type of its items (strings when not said).
    pub items: ParamType,
    pub default: Option<Value>,
    pub description: Option<Text>,
    pub choices: Vec<Value>,
    pub span: Span,
}

/// The kind of backend an agent uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AgentKind {
    Claude,
    Codex,
    Gemini,
    OpenAi,
    Anthropic,
    #[default]
    Command,
    Replay,
}

impl AgentKind {
    /// Parses the name written in files.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "claude" => AgentKind::Claude,
            "codex" => AgentKind::Codex,
            "gemini" => AgentKind::Gemini,
            "openai" => AgentKind::OpenAi,
            "anthropic" => AgentKind::Anthropic,
            "command" => AgentKind::Command,
            "replay" => AgentKind::Replay,
            _ => return None,
        })
    }

    /// Returns the name as written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Claude => "claude",
            AgentKind::Codex => "codex",
            AgentKind::Gemini => "gemini",
            AgentKind::OpenAi => "openai",
            AgentKind::Anthropic => "anthropic",
            AgentKind::Command => "command",
            AgentKind::Replay => "replay",
        }
    }
}

/// A named backend configuration.
#[derive(Clone, Debug)]
pub struct Agent {
    pub name: Text,
    pub kind: Spanned<AgentKind>,
    pub model: Option<Text>,
    pub args: Vec<Text>,
    pub env: Vec<(Text, Text)>,
    pub timeout: Option<Spanned<Dur>>,
    pub idle_timeout: Option<Spanned<Dur>>,
    pub context_window: Option<Spanned<Count>>,
    pub fallbacks: Vec<Text>,
    pub command: Vec<Text>,
    pub prompt_via: Option<Spanned<PromptVia>>,
    pub base_url: Option<Text>,
    pub api_key_env: Option<Text>,
    pub api: Option<Spanned<OpenAiApi>>,
    pub max_tokens: Option<Spanned<Count>>,
    pub file: Option<Text>,
    pub permissions: Option<Spanned<Permissions>>,
    pub structured_output: Option<Spanned<StructuredOutput>>,
    pub span: Span,
}

/// What a CLI agent may do in an unattended run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Permissions {
    /// Read files and answer; every write is denied (the default).
    #[default]
    ReadOnly,
    /// Also write files in the working directory.
    Edit,
    /// No restriction: commands and writes anywhere.
    Full,
}

impl Permissions {
    /// Parses the name written in files.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "read-only" => Permissions::ReadOnly,
            "edit" => Permissions::Edit,
            "full" => Permissions::Full,
            _ => return None,
        })
    }

    /// Returns the name as written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            Permissions::ReadOnly => "read-only",
            Permissions::Edit => "edit",
            Permissions::Full => "full",
        }
    }
}

/// How a stage's output schema reaches the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StructuredOutput {
    /// The backend's native mode where it has one, stepping down to the next mode once per
    /// run when a server rejects it.
    #[default]
    Auto,
    /// OpenAI's `response_format: {type: json_schema}` (claude `--json-schema`, codex
    /// `--output-schema`).
    JsonSchema,
    /// `response_format: {type: json_object, schema}` (llama-cpp-python, llama.cpp).
    JsonObject,
    /// vLLM's `guided_json` request field.
    GuidedJson,
    /// The schema is written into the prompt; nothing constrains the server.
    Prompt,
    /// Nothing is sent or added: the prompt alone says what to answer.
    Off,
}

impl StructuredOutput {
    /// Parses the name written in files.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "auto" => StructuredOutput::Auto,
            "json_schema" => StructuredOutput::JsonSchema,
            "json_object" => StructuredOutput::JsonObject,
            "guided_json" => StructuredOutput::GuidedJson,
            "prompt" => StructuredOutput::Prompt,
            "off" => StructuredOutput::Off,
            _ => return None,
        })
    }

    /// Returns the name as written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            StructuredOutput::Auto => "auto",
            StructuredOutput::JsonSchema => "json_schema",
            StructuredOutput::JsonObject => "json_object",
            StructuredOutput::GuidedJson => "guided_json",
            StructuredOutput::Prompt => "prompt",
            StructuredOutput::Off => "off",
        }
    }

    /// Whether the server itself constrains the answer in this mode.
    pub fn is_native(self) -> bool {
        matches!(
            self,
            StructuredOutput::JsonSchema
                | StructuredOutput::JsonObject
                | StructuredOutput::GuidedJson
        )
    }
}

/// A named resource with a capacity.
#[derive(Clone, Debug)]
pub struct Resource {
    pub name: Text,
    pub capacity: Spanned<Count>,
    pub order: Vec<Text>,
    pub span: Span,
}

/// A named outcome of a run.
#[derive(Clone, Debug)]
pub struct Exit {
    pub name: Text,
    pub code: Spanned<i64>,
    pub message: Option<Text>,
    pub span: Span,
}

/// What happens when a route case, a failure, a rejection or a limit is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ends the current iteration of the enclosing loop; the next one starts.
    Continue,
    /// Ends the enclosing loop successfully.
    Break,
    /// Fails the stage (and, outside a loop, the run).
    Fail,
    /// Gate timeouts only: approves.
    Approve,
    /// Gate timeouts only: rejects.
    Reject,
    /// Ends the whole run with a named exit.
    Exit(String),
    /// Runs the named stage next.
    Goto(String),
}

impl Action {
    /// Parses an action as written in files.
    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "continue" => Action::Continue,
            "break" => Action::Break,
            "fail" => Action::Fail,
            "approve" => Action::Approve,
            "reject" => Action::Reject,
            _ => match s.strip_prefix("exit:") {
                Some(name) if is_ident(name) => Action::Exit(name.to_string()),
                Some(_) => return None,
                None if is_ident(s) => Action::Goto(s.to_string()),
                None => return None,
            },
        })
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Continue => f.write_str("continue"),
            Action::Break => f.write_str("break"),
            Action::Fail => f.write_str("fail"),
            Action::Approve => f.write_str("approve"),
            Action::Reject => f.write_str("reject"),
            Action::Exit(name) => write!(f, "exit:{name}"),
            Action::Goto(stage) => f.write_str(stage),
        }
    }
}

impl Stage {
    /// The stages this one runs instead of giving up: a loop's `on_exhausted` and
    /// `stuck.then`, a gate's `on_timeout`, when they name a stage (with the key's name).
    pub fn give_up_targets(&self) -> Vec<(&'static str, &Spanned<Action>)> {
        let mut out = Vec::new();
        match &self.body {
            StageBody::Loop {
                on_exhausted,
                stuck,
                ..
            } => {
                out.extend(on_exhausted.iter().map(|a| ("exhausted", a)));
                out.extend(
                    stuck
                        .iter()
                        .filter_map(|s| s.then.as_ref())
                        .map(|a| ("stuck", a)),
                );
            }
            StageBody::Gate { on_timeout, .. } => {
                out.extend(on_timeout.iter().map(|a| ("timeout", a)));
            }
            _ => {}
        }
        out.retain(|(_, a)| matches!(a.value, Action::Goto(_)));
        out
    }
}

/// Words that cannot be used as ids, because actions or template names use them.
pub const RESERVED: &[&str] = &[
    "continue",
    "break",
    "fail",
    "approve",
    "reject",
    "exit",
    "params",
    "stages",
    "loops",
    "run",
    "iteration",
    "max_iterations",
    "feedback",
    "history",
    "attempt",
    "output",
    "item",
    "index",
    "loop",
    "true",
    "false",
    "none",
];

/// Tells whether a string is a valid id: a letter or `_`, then letters, digits, `_` or `-`.
pub fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The kind of a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageKind {
    Agent,
    Command,
    Gate,
    Check,
    Subflow,
    Loop,
    ForEach,
    Group,
}

impl StageKind {
    /// Parses the name written in files.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "agent" => StageKind::Agent,
            "command" => StageKind::Command,
            "gate" => StageKind::Gate,
            "check" => StageKind::Check,
            "subflow" => StageKind::Subflow,
            "loop" => StageKind::Loop,
            "for_each" => StageKind::ForEach,
            "group" => StageKind::Group,
            _ => return None,
        })
    }

    /// Returns the name as written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::Agent => "agent",
            StageKind::Command => "command",
            StageKind::Gate => "gate",
            StageKind::Check => "check",
            StageKind::Subflow => "subflow",
            StageKind::Loop => "loop",
            StageKind::ForEach => "for_each",
            StageKind::Group => "group",
        }
    }

    /// Tells whether the kind has a body of stages.
    pub fn is_region(self) -> bool {
        matches!(
            self,
            StageKind::Loop | StageKind::ForEach | StageKind::Group
        )
    }
}

/// A step of the workflow.
#[derive(Clone, Debug)]
pub struct Stage {
    pub id: Text,
    pub kind: Spanned<StageKind>,
    pub span: Span,
    pub description: Option<Text>,
    pub needs: Vec<Text>,
    pub when: Option<Text>,
    pub route: Option<Route>,
    pub on_fail: Option<Spanned<Action>>,
    pub on_error: Option<Spanned<Action>>,
    pub then: Option<Spanned<Action>>,
    pub feedback: Option<Text>,
    pub timeout: Option<Spanned<Dur>>,
    pub idle_timeout: Option<Spanned<Dur>>,
    pub retries: Option<Spanned<Count>>,
    pub resource: Option<Text>,
    pub priority: Option<Text>,
    pub budget: Option<Budget>,
    pub output: Option<OutputSpec>,
    pub body: StageBody,
}

/// The keys of a stage that depend on its kind.
#[derive(Clone, Debug)]
pub enum StageBody {
    Agent {
        agent: Option<Text>,
        prompt: Option<Text>,
        prompt_file: Option<Text>,
    },
    Command(CommandSpec),
    Check {
        command: Option<CommandSpec>,
        pass_codes: Vec<Spanned<i64>>,
        expect: Option<Text>,
    },
    Gate {
        message: Option<Text>,
        show: Vec<Text>,
        on_timeout: Option<Spanned<Action>>,
        on_reject: Option<Spanned<Action>>,
    },
    Subflow {
        workflow: Option<Text>,
        params: Vec<(Text, Text)>,
    },
    Loop {
        max_iterations: Option<Spanned<Count>>,
        until: Option<Text>,
        on_exhausted: Option<Spanned<Action>>,
        stuck: Option<Stuck>,
        escalation: Vec<Escalation>,
        worktree: Option<Worktree>,
        stages: Vec<Stage>,
    },
    ForEach {
        over: Option<Text>,
        as_name: Option<Text>,
        key: Option<Text>,
        max_concurrency: Option<Spanned<Count>>,
        aggregate: Option<Aggregate>,
        result: Option<Text>,
        worktree: Option<Worktree>,
        stages: Vec<Stage>,
    },
    Group {
        max_concurrency: Option<Spanned<Count>>,
        aggregate: Option<Aggregate>,
        result: Option<Text>,
        stages: Vec<Stage>,
    },
}

impl Stage {
    /// Returns the body stages of a loop, for_each or group.
    pub fn children(&self) -> &[Stage] {
        match &self.body {
            StageBody::Loop { stages, .. }
            | StageBody::ForEach { stages, .. }
            | StageBody::Group { stages, .. } => stages,
            _ => &[],
        }
    }

    /// Returns the body stages mutably.
    pub fn children_mut(&mut self) -> Option<&mut Vec<Stage>> {
        match &mut self.body {
            StageBody::Loop { stages, .. }
            | StageBody::ForEach { stages, .. }
            | StageBody::Group { stages, .. } => Some(stages),
            _ => None,
        }
    }
}

/// A command to run: never through a shell.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    pub argv: Vec<Text>,
    pub cwd: Option<Text>,
    pub env: Vec<(Text, Text)>,
    pub stdin: Option<Text>,
    pub ok_codes: Vec<Spanned<i64>>,
}

impl CommandSpec {
    /// Shows the argv as written, separated by spaces (for people, not for a shell).
    pub fn display(&self) -> String {
        self.argv
            .iter()
            .map(|a| a.value.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Routing on a field of a stage's output.
#[derive(Clone, Debug)]
pub struct Route {
    pub on: Text,
    pub cases: Vec<(Text, Spanned<Action>)>,
    pub default: Option<Spanned<Action>>,
    pub span: Span,
}

keywords! {
    /// How an answer becomes an output (`output.extract`).
    pub enum ExtractMode {
        Text = "text",
        Json = "json",
        FencedJson = "fenced_json",
        Markers = "markers",
        Regex = "regex",
    }
}

keywords! {
    /// How a fan-out's results are combined (`aggregate.mode`).
    pub enum AggregateMode {
        Collect = "collect",
        All = "all",
        Any = "any",
        Worst = "worst",
        Best = "best",
        Highest = "highest",
        Lowest = "lowest",
    }
}

keywords! {
    /// When a worktree is removed (`worktree.cleanup`).
    #[derive(Default)]
    pub enum Cleanup {
        #[default]
        OnSuccess = "on_success",
        Always = "always",
        Never = "never",
    }
}

keywords! {
    /// How a `command` agent gets the prompt (`prompt_via`).
    #[derive(Default)]
    pub enum PromptVia {
        #[default]
        Stdin = "stdin",
        File = "file",
        Arg = "arg",
    }
}

keywords! {
    /// Which OpenAI API an `openai` agent calls (`api`).
    #[derive(Default)]
    pub enum OpenAiApi {
        #[default]
        Chat = "chat",
        Responses = "responses",
    }
}

/// How output is extracted and validated.
#[derive(Clone, Debug)]
pub struct OutputSpec {
    pub extract: Option<Spanned<ExtractMode>>,
    pub schema: Option<SchemaRef>,
    pub pattern: Option<Text>,
    pub markers: Vec<Marker>,
    pub files: Vec<Text>,
    pub span: Span,
}

/// Where an output schema comes from.
#[derive(Clone, Debug)]
pub enum SchemaRef {
    File(Text),
    Inline(Spanned<serde_json::Value>),
}

/// A field read from marker lines.
#[derive(Clone, Debug)]
pub struct Marker {
    pub name: Text,
    pub prefix: Option<Text>,
    pub pattern: Option<Text>,
    pub many: bool,
    pub values: Vec<Text>,
    pub span: Span,
}

/// Stuck detection of a loop.
#[derive(Clone, Debug)]
pub struct Stuck {
    pub on: Text,
    pub repeats: Option<Spanned<Count>>,
    pub then: Option<Spanned<Action>>,
    pub span: Span,
}

/// An escalation rule of a loop.
#[derive(Clone, Debug)]
pub struct Escalation {
    pub when: Text,
    pub run: Vec<Text>,
    pub description: Option<Text>,
    pub span: Span,
}

/// How fan-out results are combined.
#[derive(Clone, Debug)]
pub struct Aggregate {
    pub mode: Spanned<AggregateMode>,
    pub field: Option<Text>,
    pub order: Vec<Text>,
    pub span: Span,
}

/// An isolated git worktree.
#[derive(Clone, Debug)]
pub struct Worktree {
    pub branch: Text,
    pub base: Option<Text>,
    pub cleanup: Option<Spanned<Cleanup>>,
    pub span: Span,
}

/// Changes to a stage of an extended workflow.
#[derive(Clone, Debug)]
pub struct Override {
    pub stage: Text,
    pub prompt: Option<Text>,
    pub prompt_file: Option<Text>,
    pub agent: Option<Text>,
    pub timeout: Option<Spanned<Dur>>,
    pub idle_timeout: Option<Spanned<Dur>>,
    pub retries: Option<Spanned<Count>>,
    pub max_iterations: Option<Spanned<Count>>,
    pub max_concurrency: Option<Spanned<Count>>,
    pub when: Option<Text>,
    pub budget: Option<Budget>,
    pub span: Span,
}

/// Parses a duration such as `90`, `90s`, `10m`, `2h`, `1d` or `1h30m`.
/// The longest duration a workflow may write (366 days): longer ones are refused by the
/// checker, so that no deadline computed from one can overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            return finish_ms(total, n, chars.next().is_none());
        } else {
            match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return None,
            }
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    if !num.is_empty() {
        return None;
    }
    Some(Duration::from_secs(total))
}

fn finish_ms(total_secs: u64, ms: u64, at_end: bool) -> Option<Duration> {
    at_end.then(|| Duration::from_secs(total_secs) + Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_enums_name_what_the_spec_accepts() {
        use crate::spec;
        assert_eq!(ExtractMode::NAMES, spec::EXTRACT_MODES);
        assert_eq!(AggregateMode::NAMES, spec::AGGREGATE_MODES);
        assert_eq!(Cleanup::NAMES, spec::CLEANUPS);
        assert_eq!(PromptVia::NAMES, spec::PROMPT_VIA);
        assert_eq!(OpenAiApi::NAMES, spec::OPENAI_APIS);
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2x"), None);
        assert_eq!(parse_duration("m"), None);
        assert_eq!(parse_duration("5m3"), None);
    }

    #[test]
    fn actions_parse() {
        assert_eq!(
            Action::parse("exit:stuck"),
            Some(Action::Exit("stuck".into()))
        );
        assert_eq!(Action::parse("fix_a"), Some(Action::Goto("fix_a".into())));
        assert_eq!(Action::parse("exit:"), None);
        assert_eq!(Action::parse("a b"), None);
    }
}
