//! How a CLI agent's program is called: its arguments (the permission flags of each CLI, a
//! `command`'s prompt placeholder) and its input, and the files of earlier attempts.

use super::{CliBackend, Flavor};
use crate::backend::{AgentCall, CallError};
use crate::dialect::Lowered;
use crate::model::{Permissions, PromptVia, SchemaDelivery};

/// How a program is called: its argv and stdin, and the schema it is sent by flag, lowered
/// to its dialect (what maps its answer back to the author's schema).
#[derive(Debug)]
pub(super) struct Invocation {
    pub(super) argv: Vec<String>,
    pub(super) stdin: Option<Vec<u8>>,
    pub(super) lowered: Option<Lowered>,
    /// The prompt's file, for a `command` agent that reads it from one.
    pub(super) prompt_file: Option<PromptFile>,
}

/// A prompt written to a file for the program (`prompt_via = "file"`, `prompt.txt` in the
/// call's directory): it stays there once the program has read it, so it is masked like
/// every other artifact when this is dropped, once the program is done, however the call
/// ends (an error, a timeout, the run stopped).
#[derive(Debug)]
pub(super) struct PromptFile(std::path::PathBuf);

impl Drop for PromptFile {
    fn drop(&mut self) {
        crate::secrets::redact_file(&self.0);
    }
}

impl CliBackend {
    /// The argv and the stdin of a call.
    pub(super) fn invocation(&self, call: &AgentCall) -> Result<Invocation, CallError> {
        let lowered = self.lowered(call)?;
        let (argv, stdin) = self.argv_and_stdin(call, lowered.as_ref().map(|l| &l.schema))?;
        let prompt_file = matches!(self.flavor, Flavor::Command(PromptVia::File))
            .then(|| PromptFile(call.dir.join(PROMPT_FILE)));
        Ok(Invocation {
            argv,
            stdin,
            lowered,
            prompt_file,
        })
    }

    /// The argv and the stdin of a call, given the schema sent by flag (if any).
    fn argv_and_stdin(
        &self,
        call: &AgentCall,
        native: Option<&serde_json::Value>,
    ) -> Result<(Vec<String>, Option<Vec<u8>>), CallError> {
        let model = call.model.as_ref().or(self.config.model.as_ref());
        let user: Vec<String> = self.config.args.iter().chain(&call.args).cloned().collect();
        let extra = user.clone().into_iter();
        let prompt = Some(match (&call.schema, self.delivery()) {
            (Some(schema), SchemaDelivery::Prompt) => {
                crate::backend::prompt_with_schema(&call.prompt, schema).into_bytes()
            }
            _ => call.prompt.clone().into_bytes(),
        });
        let mut argv = vec![self.program.clone()];
        let permissions = self.config.permissions;
        // The agent's own `args` may set the permission flags; then they win.
        let unless_set = |flags: &[&str], ours: &[&str]| -> Vec<String> {
            if user.iter().any(|a| {
                flags
                    .iter()
                    .any(|f| a == f || a.starts_with(&format!("{f}=")))
            }) {
                Vec::new()
            } else {
                ours.iter().map(|s| s.to_string()).collect()
            }
        };
        match self.flavor {
            Flavor::Claude => {
                argv.extend(["-p", "--output-format", "json"].map(String::from));
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                if let Some(schema) = native {
                    argv.extend(["--json-schema".into(), schema.to_string()]);
                }
                argv.extend(unless_set(
                    &[
                        "--permission-mode",
                        "--dangerously-skip-permissions",
                        "--allow-dangerously-skip-permissions",
                    ],
                    &["--permission-mode", claude_permission_mode(permissions)],
                ));
                argv.extend(extra);
                Ok((argv, prompt))
            }
            Flavor::Codex => {
                // ralph-flow chooses the cwd, and `permissions` is the trust decision:
                // outside a git repository codex otherwise exits ("Not inside a trusted
                // directory and --skip-git-repo-check was not specified").
                argv.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
                argv.extend(unless_set(
                    &[
                        "--sandbox",
                        "-s",
                        "--full-auto",
                        "--dangerously-bypass-approvals-and-sandbox",
                        "--yolo",
                    ],
                    &["--sandbox", codex_sandbox(permissions)],
                ));
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                if let Some(schema) = native {
                    let path = call.dir.join("output-schema.json");
                    std::fs::write(&path, schema.to_string())
                        .map_err(|e| write_failed(&path, e))?;
                    argv.extend(["--output-schema".into(), path.display().to_string()]);
                }
                argv.extend(extra);
                // `-`: the prompt is on stdin.
                argv.push("-".into());
                Ok((argv, prompt))
            }
            Flavor::Gemini => {
                // Without a TTY on stdin, gemini runs headless with stdin as the prompt.
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                argv.extend(unless_set(
                    &["--approval-mode", "--yolo", "-y"],
                    &["--approval-mode", gemini_approval_mode(permissions)],
                ));
                argv.extend(extra);
                argv.extend(["--output-format", "json"].map(String::from));
                Ok((argv, prompt))
            }
            Flavor::Command(via) => {
                let mut argv: Vec<String> =
                    self.config.command.iter().cloned().chain(extra).collect();
                match via {
                    PromptVia::Stdin => Ok((argv, prompt)),
                    PromptVia::File => {
                        let path = call.dir.join(PROMPT_FILE);
                        std::fs::write(&path, prompt.as_deref().unwrap_or_default())
                            .map_err(|e| write_failed(&path, e))?;
                        place(&mut argv, "{prompt_file}", &path.display().to_string());
                        Ok((argv, None))
                    }
                    PromptVia::Arg => {
                        let text = String::from_utf8_lossy(prompt.as_deref().unwrap_or_default());
                        place(&mut argv, "{prompt}", &text);
                        Ok((argv, None))
                    }
                }
            }
        }
    }
}

impl CliBackend {
    /// How a stage's output schema reaches this agent.
    pub(super) fn delivery(&self) -> SchemaDelivery {
        crate::model::schema_delivery(self.config.kind, self.config.structured_output, false)
            .unwrap_or(SchemaDelivery::Not)
    }

    /// The schema sent natively (by flag), lowered to the CLI's dialect; `None` when the
    /// stage has none or it does not go by flag. A schema the dialect cannot express is a
    /// configuration error (the checker reports it before a run).
    fn lowered(&self, call: &AgentCall) -> Result<Option<Lowered>, CallError> {
        let (Some(schema), SchemaDelivery::Lowered(dialect)) = (&call.schema, self.delivery())
        else {
            return Ok(None);
        };
        crate::dialect::lower(schema, dialect)
            .map(Some)
            .map_err(|refusals| CallError::Refused {
                message: crate::dialect::refusals_text(&refusals),
            })
    }
}

/// `claude --permission-mode` for a permissions setting. In `-p` mode `default` denies
/// every tool use that would ask (writes, most commands) and reports it in
/// `permission_denials`; `acceptEdits` allows file edits; `bypassPermissions` allows all
/// (as root only with `IS_SANDBOX=1`).
fn claude_permission_mode(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "default",
        Permissions::Edit => "acceptEdits",
        Permissions::Full => "bypassPermissions",
    }
}

/// `codex exec --sandbox` for a permissions setting (`exec` never asks for approval: what
/// the sandbox forbids fails).
fn codex_sandbox(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "read-only",
        Permissions::Edit => "workspace-write",
        Permissions::Full => "danger-full-access",
    }
}

/// `gemini --approval-mode` for a permissions setting. Headless `default` does not offer
/// the model its write and shell tools at all.
fn gemini_approval_mode(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "default",
        Permissions::Edit => "auto_edit",
        Permissions::Full => "yolo",
    }
}

/// Moves an existing output file aside (`stdout` to the first free `stdout.N`), so that a
/// retried call in the same directory starts a fresh one.
pub(super) fn set_aside(path: &std::path::Path) {
    if !path.exists() {
        return;
    }
    for n in 1.. {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        let target = std::path::PathBuf::from(name);
        if !target.exists() {
            if let Err(e) = std::fs::rename(path, &target) {
                tracing::warn!("cannot move {} aside: {e}", path.display());
            }
            return;
        }
    }
}

/// The file of a call's directory that holds the prompt of a `command` agent with
/// `prompt_via = "file"`.
const PROMPT_FILE: &str = "prompt.txt";

/// A file of the call that could not be written: a limit of the machine (too many open
/// files, a full disk, the file size limit) stops the run as resumable
/// ([`CallError::Limit`]); anything else fails the call.
fn write_failed(path: &std::path::Path, e: std::io::Error) -> CallError {
    let what = || format!("cannot write {}", path.display());
    match crate::backend::process::LimitHit::of(what, e) {
        Ok(hit) => hit.into(),
        Err(e) => CallError::Failed {
            message: format!("{}: {e}", what()),
        },
    }
}

/// Replaces a placeholder in the arguments after the program, or appends the value when
/// none holds it.
fn place(argv: &mut Vec<String>, placeholder: &str, value: &str) {
    let mut placed = false;
    for arg in argv.iter_mut().skip(1) {
        if arg.contains(placeholder) {
            *arg = arg.replace(placeholder, value);
            placed = true;
        }
    }
    if !placed {
        argv.push(value.to_string());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::backend::cli::test_support::{argv_of, backend, call_in};
    use crate::model::AgentKind;

    #[test]
    fn placeholders_are_replaced_or_the_value_appended() {
        let mut argv = vec!["tool".to_string(), "--in={prompt}".into()];
        place(&mut argv, "{prompt}", "hi");
        assert_eq!(argv, ["tool", "--in=hi"]);
        let mut argv = vec!["tool".to_string(), "-x".into()];
        place(&mut argv, "{prompt}", "hi");
        assert_eq!(argv, ["tool", "-x", "hi"]);
    }

    #[test]
    fn permissions_map_to_each_clis_flags() {
        use AgentKind::*;
        use Permissions::*;
        let has = |argv: &[String], pair: [&str; 2]| {
            argv.windows(2).any(|w| w[0] == pair[0] && w[1] == pair[1])
        };
        assert!(has(
            &argv_of(Claude, ReadOnly),
            ["--permission-mode", "default"]
        ));
        assert!(has(
            &argv_of(Claude, Edit),
            ["--permission-mode", "acceptEdits"]
        ));
        assert!(has(
            &argv_of(Claude, Full),
            ["--permission-mode", "bypassPermissions"]
        ));
        assert!(has(&argv_of(Codex, ReadOnly), ["--sandbox", "read-only"]));
        assert!(has(&argv_of(Codex, Edit), ["--sandbox", "workspace-write"]));
        assert!(has(
            &argv_of(Codex, Full),
            ["--sandbox", "danger-full-access"]
        ));
        assert!(has(
            &argv_of(Gemini, ReadOnly),
            ["--approval-mode", "default"]
        ));
        assert!(has(
            &argv_of(Gemini, Edit),
            ["--approval-mode", "auto_edit"]
        ));
        assert!(has(&argv_of(Gemini, Full), ["--approval-mode", "yolo"]));
        // The agent's own flags win.
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut b = backend(Codex, Edit);
        b.config.args = vec!["--sandbox".into(), "read-only".into()];
        let argv = b.invocation(&call_in(dir.path(), None)).expect("argv").argv;
        assert_eq!(argv.iter().filter(|a| *a == "--sandbox").count(), 1);
    }

    #[test]
    fn codex_gets_the_output_schema_in_a_file_lowered_to_strict_mode() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let schema = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": ["a"],
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        });
        let b = backend(AgentKind::Codex, Permissions::ReadOnly);
        let argv = b
            .invocation(&call_in(dir.path(), Some(schema.clone())))
            .expect("argv")
            .argv;
        let at = argv
            .iter()
            .position(|a| a == "--output-schema")
            .expect("the flag");
        let written = std::fs::read_to_string(&argv[at + 1]).expect("the schema file");
        assert_eq!(
            serde_json::from_str::<Value>(&written).expect("JSON"),
            serde_json::json!({
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": ["integer", "null"]}},
                "required": ["a", "b"],
                "additionalProperties": false,
            })
        );
        assert_eq!(argv.last().map(String::as_str), Some("-"));
        // A schema strict mode cannot express is the agent's refusal, never sent.
        let map = serde_json::json!({"type": "object", "properties": {"m": {"type": "object"}}});
        let err = b
            .invocation(&call_in(dir.path(), Some(map)))
            .expect_err("refused");
        assert!(matches!(err, CallError::Refused { .. }), "{err:?}");
    }

    #[test]
    fn claude_gets_a_draft_7_schema_and_prompt_mode_puts_it_in_the_prompt() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let schema = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"a": {"type": "string"}},
        });
        let mut b = backend(AgentKind::Claude, Permissions::ReadOnly);
        let Invocation { argv, stdin, .. } = b
            .invocation(&call_in(dir.path(), Some(schema.clone())))
            .expect("argv");
        let at = argv
            .iter()
            .position(|a| a == "--json-schema")
            .expect("the flag");
        assert_eq!(
            serde_json::from_str::<Value>(&argv[at + 1]).expect("JSON"),
            serde_json::json!({"type": "object", "properties": {"a": {"type": "string"}}})
        );
        assert!(!String::from_utf8_lossy(&stdin.expect("a prompt")).contains("JSON Schema"));
        // `prompt`: no flag, the schema as written at the end of the prompt.
        for kind in [AgentKind::Claude, AgentKind::Codex, AgentKind::Gemini] {
            b = backend(kind, Permissions::ReadOnly);
            b.config.structured_output = crate::model::StructuredOutput::Prompt;
            let Invocation { argv, stdin, .. } = b
                .invocation(&call_in(dir.path(), Some(schema.clone())))
                .expect("argv");
            assert!(
                !argv
                    .iter()
                    .any(|a| a == "--json-schema" || a == "--output-schema"),
                "{argv:?}"
            );
            let prompt = String::from_utf8(stdin.expect("a prompt")).expect("UTF-8");
            assert!(prompt.contains("2020-12"), "{prompt}");
        }
        // `off`, and gemini's `auto`: neither flag nor prompt.
        for (kind, mode) in [
            (AgentKind::Claude, crate::model::StructuredOutput::Off),
            (AgentKind::Gemini, crate::model::StructuredOutput::Auto),
        ] {
            b = backend(kind, Permissions::ReadOnly);
            b.config.structured_output = mode;
            let Invocation { argv, stdin, .. } = b
                .invocation(&call_in(dir.path(), Some(schema.clone())))
                .expect("argv");
            assert!(!argv.iter().any(|a| a == "--json-schema"), "{argv:?}");
            let prompt = String::from_utf8(stdin.expect("a prompt")).expect("UTF-8");
            assert!(!prompt.contains("2020-12"), "{prompt}");
        }
    }

    #[test]
    fn a_call_file_that_meets_a_limit_of_the_machine_is_the_limit_not_a_failure() {
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false});
        let b = backend(AgentKind::Codex, Permissions::ReadOnly);
        // Writing /dev/full fails as a full disk does (ENOSPC).
        let full = tempfile::tempdir().expect("a temp dir");
        std::os::unix::fs::symlink("/dev/full", full.path().join("output-schema.json"))
            .expect("a link");
        let err = b
            .invocation(&call_in(full.path(), Some(schema.clone())))
            .expect_err("no space");
        let CallError::Limit { limit, message } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*limit, crate::backend::process::Limit::DiskSpace);
        assert!(message.starts_with("cannot write "), "{message}");
        assert!(message.contains("output-schema.json"), "{message}");
        // Any other failure to write it fails the call.
        let other = tempfile::tempdir().expect("a temp dir");
        std::fs::create_dir(other.path().join("output-schema.json")).expect("a directory");
        let err = b
            .invocation(&call_in(other.path(), Some(schema)))
            .expect_err("a directory");
        assert!(matches!(err, CallError::Failed { .. }), "{err:?}");
    }

    #[test]
    fn earlier_output_is_set_aside() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let out = dir.path().join("stdout");
        std::fs::write(&out, "first").expect("written");
        set_aside(&out);
        std::fs::write(&out, "second").expect("written");
        set_aside(&out);
        assert!(!out.exists());
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).expect("read");
        assert_eq!(read("stdout.1"), "first");
        assert_eq!(read("stdout.2"), "second");
        set_aside(&dir.path().join("stderr"));
    }
}
