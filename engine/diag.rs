//! Diagnostics: coded, spanned problems found while loading, checking or compiling a workflow.

use crate::source::{Sources, Span};

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

macro_rules! codes {
    ($($name:ident = $code:literal, $sev:ident, $summary:literal;)*) => {
        /// A stable diagnostic code; WORKFLOW-SPEC.md lists them all.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $($name,)* }

        impl Code {
            /// Every code, in order.
            pub const ALL: &'static [Code] = &[$(Code::$name,)*];

            /// Returns the code as written in output, such as `RF012`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$name => $code,)* }
            }

            /// Returns the severity this code has.
            pub fn severity(self) -> Severity {
                match self { $(Code::$name => Severity::$sev,)* }
            }

            /// Returns a one-line summary of what the code means.
            pub fn summary(self) -> &'static str {
                match self { $(Code::$name => $summary,)* }
            }
        }
    };
}

codes! {
    Syntax = "RF001", Error, "the file is not valid TOML or KDL";
    UnknownKey = "RF002", Error, "a key that the format does not define";
    WrongType = "RF003", Error, "a value of the wrong type";
    MissingKey = "RF004", Error, "a required key is missing";
    InvalidValue = "RF005", Error, "a value of the right type that is not allowed (a bad duration, action, name or number)";
    Duplicate = "RF006", Error, "the same id or key is defined twice";
    KeyNotForKind = "RF007", Error, "a key that does not apply to this kind of stage or agent";
    UnsupportedValue = "RF008", Error, "a null or date-time value, which workflows do not use";
    UnknownStage = "RF010", Error, "a reference to a stage that does not exist";
    UnknownAgent = "RF011", Error, "a reference to an agent that does not exist";
    UnknownParam = "RF012", Error, "a reference to a param that does not exist";
    UnknownResource = "RF013", Error, "a reference to a resource that does not exist";
    UnknownExit = "RF014", Error, "a reference to an exit that does not exist";
    MissingPromptFile = "RF015", Error, "a prompt file that cannot be read";
    MissingSchemaFile = "RF016", Error, "a JSON Schema file that cannot be read or is not JSON";
    MissingWorkflowFile = "RF017", Error, "an extended, included or subflow workflow file that cannot be read";
    ReservedName = "RF018", Error, "an id that is a reserved word";
    CrossRegionNeed = "RF019", Error, "a `needs` entry that reaches into another loop or fan-out body";
    Cycle = "RF020", Error, "a dependency cycle outside a loop region";
    Unreachable = "RF021", Warning, "a stage that can never run (a condition always false, or false on every iteration of its loop, the bound and params as in force; a need whose every route leaves)";
    UnboundedLoop = "RF022", Error, "a loop without a positive `max_iterations`";
    LoopNeverEndsEarly = "RF023", Warning, "a loop whose only way out is running out of iterations";
    ActionOutOfPlace = "RF024", Error, "an action that cannot be taken where it is written (`continue` outside a loop, `approve` outside a gate)";
    FileCycle = "RF025", Error, "workflow files that extend, include or call each other in a circle";
    SkipSpreads = "RF026", Warning, "a stage skipped whenever a stage it needs is skipped by its `when`, though it reads nothing of that stage (mark the need `optional`, or say so in a `when`)";
    TemplateSyntax = "RF030", Error, "a template that does not parse";
    UnknownVariable = "RF031", Error, "a template variable that names no param, loop variable, stage or helper";
    NotUpstream = "RF032", Error, "a stage's output used where that stage has not run yet";
    MaybeSkipped = "RF033", Warning, "a stage's output used where that stage may have been skipped";
    ExpressionSyntax = "RF034", Error, "a condition or expression that does not parse";
    LoopVarOutsideLoop = "RF035", Error, "a loop or item variable used outside its loop or fan-out";
    NotParamsOnly = "RF036", Error, "a templated limit that uses more than params";
    UnknownFilter = "RF037", Error, "a template filter or test that does not exist";
    InvalidSchema = "RF040", Error, "an output schema that is not a valid JSON Schema";
    UnknownField = "RF041", Error, "an output field that the stage's output schema does not define";
    RouteUncovered = "RF042", Warning, "a route that leaves some enum values without a case";
    NotAnArray = "RF043", Error, "a `for_each` over something whose schema is not an array";
    InvalidRegex = "RF044", Error, "an extraction pattern that is not a valid regular expression";
    GateNoTimeout = "RF050", Warning, "a gate without a timeout policy";
    ParamType = "RF051", Error, "a param value of the wrong type";
    ParamRequired = "RF052", Error, "a required param without a value";
    AgentIncomplete = "RF054", Error, "an agent missing what its kind needs";
    ReservedExitCode = "RF055", Warning, "an exit code that the engine itself uses";
    BadOverride = "RF056", Error, "an override of a stage or key that the base workflow does not have";
    UnknownPreset = "RF057", Error, "a preset or preset source that does not exist";
    PresetSource = "RF058", Error, "a git preset source that is not fetched, or whose cached copy does not match ralph-flow.lock";
    EmptyPromptDir = "RF059", Warning, "a prompt_path directory that does not exist or holds no files";
    SchemaRefused = "RF060", Error, "an output schema that an agent it goes to would refuse (claude's draft-07 validator, OpenAI's strict structured outputs)";
    ModeNotForAgent = "RF061", Error, "a `structured_output` mode that the agent's kind does not have";
    UsageUnreported = "RF062", Warning, "a `tokens` budget over an agent that does not report token usage (a `command` agent), or may not (an `openai` agent on a server other than OpenAI's)";
    GateUnanswerable = "RF063", Warning, "a gate whose timeout is zero: it takes `on_timeout` before anybody can answer";
    SharedBranch = "RF064", Warning, "a worktree branch that for_each items running at once all get (git checks a branch out in one worktree at a time)";
    CommandLineInOneItem = "RF065", Warning, "a whole command line written as one argv item (a program name with spaces)";
    ConstantLoopCondition = "RF066", Warning, "a loop's `until` or `stuck.on` that reads nothing the loop changes, so it is the same after every iteration";
    NotifierIncomplete = "RF067", Error, "a notifier missing what its kind needs (`url` or `url_env`; `argv`), with both `url` and `url_env`, or with an empty `argv` or `on`";
    NotifierValue = "RF068", Error, "a notifier value that cannot work: a URL that is not http(s), an `_env` key that names no environment variable, a header name that is not one, a template where a literal belongs";
    InlineSecret = "RF069", Warning, "a secret written inline in a notifier (a Slack webhook URL, a password or token in a URL) where its `_env` key belongs";
    // Permission policies (issue 32): RF075 and up.
    UnknownPolicy = "RF075", Error, "a `permissions` or a policy's `extends` that names neither a level (`read-only`, `edit`, `commit`, `full`) nor a policy of the workflow";
    PolicyCycle = "RF076", Error, "policies that extend each other in a cycle";
    PolicyValue = "RF077", Error, "a policy value that cannot work: a command pattern or an `edit` glob that does not parse, an `edit` path outside the workspace, an `edit` that is not `true`, `false` or a list of paths";
    UnusedPolicy = "RF078", Warning, "a policy that no agent or stage names in `permissions`";
    PolicyNotEnforceable = "RF079", Error, "permissions an agent's kind cannot enforce: rules of a policy (`allow`, `deny`, `edit` paths, `network`, `other`) or the `commit` level on an agent CLI, which knows only its own permission modes";
}

/// "did you mean `X`?", when a candidate is close to `name` (see [`crate::suggest::closest`]).
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    crate::suggest::closest(name, candidates).map(|best| format!("did you mean `{best}`?"))
}

/// The candidate closest to `name`, when it is close enough to be a likely typo (see
/// [`crate::suggest::closest`]).
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    crate::suggest::closest(name, candidates)
}

/// One problem found in a workflow, pointing at where it was written.
#[derive(Clone, Debug)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub span: Option<Span>,
    pub label: Option<String>,
    pub help: Option<String>,
    /// Secondary places that explain the problem, such as the first definition of a duplicate.
    pub related: Vec<(Span, String)>,
    /// The name an unknown-reference diagnostic is about (see [`Diagnostic::unknown`]).
    pub subject: Option<String>,
    /// The advice written in KDL, for when the file the diagnostic points into is KDL
    /// (`help` is then written in TOML); see [`Diagnostic::help_syntax`].
    pub help_kdl: Option<String>,
    /// The change that the advice describes, when it is one an editor can make (see
    /// [`Fix`]); `ralph-flow lsp` offers it as a code action.
    pub fix: Option<Box<Fix>>,
}

/// A change to the text that does what a diagnostic's advice says, for editors to offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    /// Write `new` in place of the name `old`: at `at` when the span of the name is known,
    /// else where `old` is written (as a whole name) within the diagnostic's span.
    Replace {
        at: Option<Span>,
        old: String,
        new: String,
    },
    /// Add the required key `key` with a placeholder `value` (written alike in TOML and
    /// KDL: a quoted string or a number) to the table written at `table`, or to the one the
    /// diagnostic points at when `None` (an empty span at the start of a file: its top level).
    AddKey {
        table: Option<Span>,
        key: String,
        value: String,
    },
}

impl Diagnostic {
    /// Creates a diagnostic with the code's own severity.
    pub fn new(code: Code, span: impl Into<Option<Span>>, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: code.severity(),
            message: message.into(),
            span: span.into(),
            label: None,
            help: None,
            related: Vec::new(),
            subject: None,
            help_kdl: None,
            fix: None,
        }
    }

    /// Reports a reference to a `what` (stage, agent, param, ...) named `name` that is not
    /// defined, suggesting the closest of `candidates`.
    pub fn unknown<'a>(
        code: Code,
        span: Span,
        what: &str,
        name: &str,
        candidates: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let mut d = Diagnostic::new(code, span, format!("there is no {what} `{name}`"))
            .label(format!("unknown {what}"))
            .suggest(name, candidates);
        d.subject = Some(name.to_string());
        d
    }

    /// Sets the label shown under the snippet.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Sets the advice on what to do.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds a "did you mean" hint when a close candidate exists, and the replacement as the
    /// diagnostic's [`Fix`].
    pub fn suggest<'a>(self, name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Self {
        match crate::suggest::closest(name, candidates) {
            Some(best) => self
                .help(format!("did you mean `{best}`?"))
                .replacing(name, best),
            None => self,
        }
    }

    /// Sets the fix that writes `new` in place of the name `old` (found within the
    /// diagnostic's span).
    pub fn replacing(mut self, old: &str, new: &str) -> Self {
        self.fix = Some(Box::new(Fix::Replace {
            at: None,
            old: old.to_string(),
            new: new.to_string(),
        }));
        self
    }

    /// Sets the fix that adds a missing key to a table (see [`Fix::AddKey`]).
    pub fn adding_key(mut self, table: Option<Span>, key: &str, value: impl Into<String>) -> Self {
        self.fix = Some(Box::new(Fix::AddKey {
            table,
            key: key.to_string(),
            value: value.into(),
        }));
        self
    }

    /// Sets advice that shows a snippet of a workflow file, written once in each syntax; the
    /// one of the file the diagnostic points into is kept (see [`Diagnostic::fit_syntax`]).
    pub fn help_syntax(mut self, toml: impl Into<String>, kdl: impl Into<String>) -> Self {
        self.help = Some(toml.into());
        self.help_kdl = Some(kdl.into());
        self
    }

    /// Like [`Diagnostic::help_syntax`], unless a more specific advice is already there.
    pub fn help_or_syntax(self, toml: impl Into<String>, kdl: impl Into<String>) -> Self {
        if self.help.is_some() {
            self
        } else {
            self.help_syntax(toml, kdl)
        }
    }

    /// Keeps the advice written in the syntax of the file the diagnostic points into.
    pub fn fit_syntax(&mut self, sources: &Sources) {
        let Some(kdl) = self.help_kdl.take() else {
            return;
        };
        let is_kdl = self.span.is_some_and(|s| {
            sources
                .get(s.file)
                .path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("kdl"))
        });
        if is_kdl {
            self.help = Some(kdl);
        }
    }

    /// Sets the advice unless a more specific one (such as a suggestion) is already there.
    pub fn help_or(self, help: impl Into<String>) -> Self {
        if self.help.is_some() {
            self
        } else {
            self.help(help)
        }
    }

    /// Lowers the diagnostic to a warning.
    pub fn severity_warning(mut self) -> Self {
        self.severity = Severity::Warning;
        self
    }

    /// Adds a secondary place.
    pub fn related(mut self, span: Span, label: impl Into<String>) -> Self {
        self.related.push((span, label.into()));
        self
    }

    /// Tells whether this diagnostic is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Collects diagnostics while a stage of the pipeline runs.
#[derive(Debug, Default)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    /// Records one diagnostic.
    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.items.push(diagnostic);
    }

    /// Tells whether any error was recorded.
    pub fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    /// Returns the number of errors.
    pub fn error_count(&self) -> usize {
        self.items.iter().filter(|d| d.is_error()).count()
    }

    /// Returns all diagnostics, sorted by file and position, without exact duplicates.
    pub fn into_sorted(mut self) -> Vec<Diagnostic> {
        self.items
            .sort_by_key(|d| (d.span.map(|s| (s.file, s.start, s.end)), d.code));
        self.items
            .dedup_by(|a, b| a.code == b.code && a.span == b.span && a.message == b.message);
        self.items
    }

    /// Iterates over the diagnostics recorded so far.
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }

    /// Moves all diagnostics from another collection into this one.
    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }
}

/// Renders diagnostics with miette, with source snippets, as the CLI shows them.
pub fn render(sources: &Sources, diagnostics: &[Diagnostic], color: bool) -> String {
    use miette::{
        GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteDiagnostic, NamedSource,
    };
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(100)
        .with_links(false);
    let mut out = String::new();
    for d in diagnostics {
        let mut d = d.clone();
        d.fit_syntax(sources);
        let severity = match d.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        };
        let mut md = MietteDiagnostic::new(d.message.clone())
            .with_code(d.code.as_str())
            .with_severity(severity);
        if let Some(help) = &d.help {
            md = md.with_help(help.clone());
        }
        let report = match d.span {
            Some(span) => {
                let file = sources.get(span.file);
                md.message = format!("{}: {}", sources.locate(span), d.message);
                md = md.with_label(LabeledSpan::new_primary_with_span(
                    d.label.clone(),
                    span.range(),
                ));
                for (rel, label) in &d.related {
                    if rel.file == span.file {
                        md = md.and_label(LabeledSpan::new_with_span(
                            Some(label.clone()),
                            rel.range(),
                        ));
                    }
                }
                let src = NamedSource::new(file.path.display().to_string(), file.text.to_string());
                miette::Report::new(md).with_source_code(src)
            }
            None => miette::Report::new(md),
        };
        let _ = handler.render_report(&mut out, report.as_ref());
        out.push('\n');
    }
    out
}

/// Renders diagnostics as one line each: `file:line:col: severity[CODE]: message`.
pub fn render_short(sources: &Sources, diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    for d in diagnostics {
        let mut d = d.clone();
        d.fit_syntax(sources);
        let sev = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        if let Some(span) = d.span {
            out.push_str(&format!("{}: ", sources.locate(span)));
        }
        out.push_str(&format!("{sev}[{}]: {}", d.code.as_str(), d.message));
        if let Some(help) = &d.help {
            out.push_str(&format!(" ({help})"));
        }
        out.push('\n');
    }
    out
}

/// An error with its causes, outermost first: `cannot fetch x: connection refused`. Errors
/// keep what caused them as their `source` and say only their own part; the whole message
/// is built here, once, where it is shown or stored.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        // A cause already said by the error above it is not said twice.
        if !message.ends_with(&part) {
            message.push_str(": ");
            message.push_str(&part);
        }
        source = e.source();
    }
    message
}

/// Puts "a" or "an" before a word.
pub fn article(word: &str) -> String {
    let an = word.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {word}", if an { "an" } else { "a" })
}

#[cfg(test)]
mod chain_tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("cannot fetch {0}")]
        Fetch(String, #[source] std::io::Error),
        #[error("stage `a`: {0}")]
        Said(#[source] std::io::Error),
    }

    #[test]
    fn causes_are_joined_once() {
        let io = || std::io::Error::other("connection refused");
        let e = Outer::Fetch("x".into(), io());
        assert_eq!(error_chain(&e), "cannot fetch x: connection refused");
        let e = Outer::Said(io());
        assert_eq!(error_chain(&e), "stage `a`: connection refused");
    }
}
