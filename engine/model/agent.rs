//! Agents: their kinds, settings, permissions, and how a prompt and an output schema reach
//! them.

use super::{Count, Dur, Text};
use crate::source::{Span, Spanned};

/// The kind of backend an agent uses: one list, in the format's spec.
pub use crate::spec::AgentKind;

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
    /// What it may do: a level or a `[policy.NAME]`, as written.
    pub permissions: Option<Text>,
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

/// How a stage's output schema reaches an agent: what [`schema_delivery`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaDelivery {
    /// Sent natively, lowered to this dialect first (claude `--json-schema`, codex
    /// `--output-schema`, OpenAI's strict structured outputs).
    Lowered(crate::dialect::Dialect),
    /// Sent natively as the author wrote it (a local server's grammar modes).
    AsWritten,
    /// Written into the prompt.
    Prompt,
    /// Not sent: the prompt alone says what to answer.
    Not,
}

/// How a stage's output schema reaches an agent of a kind with a `structured_output` mode;
/// `openai_itself` says whether an `openai` agent's server is OpenAI's (its `base_url` is
/// unset or OpenAI's host): only there is the schema sent in strict mode. `None`: the kind has
/// no such mode (`json_object` or `guided_json` on a CLI agent).
pub fn schema_delivery(
    kind: AgentKind,
    mode: StructuredOutput,
    openai_itself: bool,
) -> Option<SchemaDelivery> {
    use crate::dialect::Dialect;
    use StructuredOutput as M;
    Some(match (kind, mode) {
        (_, M::Off) => SchemaDelivery::Not,
        (_, M::Prompt) => SchemaDelivery::Prompt,
        // The CLI's own schema flag (claude `--json-schema`, codex `--output-schema`); a CLI
        // without one (gemini) leaves the prompt as written under `auto`.
        (kind, M::Auto | M::JsonSchema) if kind.is_agent_cli() => {
            match (kind.cli_schema_dialect(), mode) {
                (Some(dialect), _) => SchemaDelivery::Lowered(dialect),
                (None, M::Auto) => SchemaDelivery::Not,
                (None, _) => return None,
            }
        }
        (kind, _) if kind.is_agent_cli() => return None,
        // An ACP agent has no schema mode of its own: the schema goes into the prompt.
        (AgentKind::Acp, M::Auto) => SchemaDelivery::Prompt,
        (AgentKind::Acp, _) => return None,
        (AgentKind::OpenAi, M::Auto | M::JsonSchema) if openai_itself => {
            SchemaDelivery::Lowered(Dialect::OpenAiStrict)
        }
        (AgentKind::OpenAi, _) => SchemaDelivery::AsWritten,
        // The Messages API has no schema mode: `auto` leaves the prompt as written, the
        // native modes write the schema into the prompt.
        (AgentKind::Anthropic, M::Auto) => SchemaDelivery::Not,
        (AgentKind::Anthropic, _) => SchemaDelivery::Prompt,
        // `command` and `replay` agents take no schema.
        _ => SchemaDelivery::Not,
    })
}

/// Whether an `openai` agent's `base_url` (rendered) is OpenAI's own API.
pub fn is_openai_itself(base_url: Option<&str>) -> bool {
    match base_url {
        None => true,
        Some(url) => {
            let rest = url
                .trim()
                .strip_prefix("https://")
                .or_else(|| url.trim().strip_prefix("http://"))
                .unwrap_or(url);
            let host = rest.split(['/', ':']).next().unwrap_or("");
            host.eq_ignore_ascii_case("api.openai.com")
        }
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
