//! How a program is called: what the runner hands an agent CLI to build its argv and stdin
//! from, what it builds, and the files of earlier attempts.

use crate::backend::{AgentCall, AgentConfig, CallError};
use crate::dialect::Lowered;

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

/// What an agent CLI makes of a call: the argv, the stdin, and the prompt's file if it
/// wrote one.
#[derive(Debug)]
pub(super) struct Launch {
    pub(super) argv: Vec<String>,
    pub(super) stdin: Option<Vec<u8>>,
    pub(super) prompt_file: Option<PromptFile>,
}

impl Launch {
    /// A program that reads the prompt on stdin.
    pub(super) fn stdin(argv: Vec<String>, prompt: &[u8]) -> Self {
        Launch {
            argv,
            stdin: Some(prompt.to_vec()),
            prompt_file: None,
        }
    }
}

/// A call, as an agent CLI builds its invocation from it.
pub(super) struct Request<'a> {
    /// The program (empty for a `command` agent).
    pub(super) program: &'a str,
    pub(super) config: &'a AgentConfig,
    pub(super) call: &'a AgentCall,
    /// The stage's model, else the agent's.
    pub(super) model: Option<&'a String>,
    /// The agent's `args`, then the stage's.
    pub(super) user_args: Vec<String>,
    /// The output schema to send by flag, lowered to the CLI's dialect.
    pub(super) native: Option<&'a serde_json::Value>,
    /// The prompt (with the schema in it when it goes in the prompt).
    pub(super) prompt: Vec<u8>,
}

impl Request<'_> {
    /// `ours` unless the agent's own `args` set one of `flags` (as `--flag` or
    /// `--flag=...`): then theirs win.
    pub(super) fn unless_set(&self, flags: &[&str], ours: &[&str]) -> Vec<String> {
        if self.user_args.iter().any(|a| {
            flags
                .iter()
                .any(|f| a == f || a.starts_with(&format!("{f}=")))
        }) {
            Vec::new()
        } else {
            ours.iter().map(|s| s.to_string()).collect()
        }
    }
}

/// A prompt written to a file for the program (`prompt_via = "file"`, `prompt.txt` in the
/// call's directory): it stays there once the program has read it, so it is masked like
/// every other artifact when this is dropped, once the program is done, however the call
/// ends (an error, a timeout, the run stopped).
#[derive(Debug)]
pub(super) struct PromptFile(pub(super) std::path::PathBuf);

impl Drop for PromptFile {
    fn drop(&mut self) {
        crate::secrets::redact_file(&self.0);
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

/// A file of the call that could not be written: a limit of the machine (too many open
/// files, a full disk, the file size limit) stops the run as resumable
/// ([`CallError::Limit`]); anything else fails the call.
pub(super) fn write_failed(path: &std::path::Path, e: std::io::Error) -> CallError {
    let what = || format!("cannot write {}", path.display());
    match crate::backend::process::LimitHit::of(what, e) {
        Ok(hit) => hit.into(),
        Err(e) => CallError::Failed {
            message: format!("{}: {e}", what()),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::backend::cli::test_support::{argv_of, backend, call_in};
    use crate::model::{AgentKind, Permissions};

    #[test]
    fn a_stage_of_its_own_permissions_gives_the_cli_its_level() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let b = backend(AgentKind::Claude, Permissions::ReadOnly);
        let mode = |b: &crate::backend::cli::CliBackend, call: &crate::backend::AgentCall| {
            let argv = b.invocation(call).expect("argv").argv;
            let i = argv
                .iter()
                .position(|a| a == "--permission-mode")
                .expect("a mode");
            argv[i + 1].clone()
        };
        let mut call = call_in(dir.path(), None);
        assert!(b.for_stage(&call).is_none(), "no policy of its own");
        // A policy that comes down to `edit` (its name is the workflow's).
        let mut careful = crate::permit::Rules::level("edit").expect("level");
        careful.name = "careful".into();
        call.policy = Some(std::sync::Arc::new(careful));
        let staged = b.for_stage(&call).expect("another level");
        assert_eq!(staged.config.permissions, Permissions::Edit);
        assert_eq!(staged.config.policy.name, "careful");
        assert_eq!(mode(&staged, &call), "acceptEdits");
        assert_eq!(mode(&b, &call), "default", "the agent's own is unchanged");
        // The same level as the agent's: the agent's backend as it is.
        call.policy = Some(std::sync::Arc::new(
            crate::permit::Rules::level("read-only").expect("level"),
        ));
        assert!(b.for_stage(&call).is_none());
        // Rules no level has (the checker refuses them for a CLI): read-only.
        let mut rules = crate::permit::Rules::level("commit").expect("level");
        rules.name = "wiggum".into();
        call.policy = Some(std::sync::Arc::new(rules));
        let b = backend(AgentKind::Claude, Permissions::Full);
        let staged = b.for_stage(&call).expect("another level");
        assert_eq!(staged.config.permissions, Permissions::ReadOnly);
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
