//! What the CLI backends' unit tests share: the real CLIs' captured output
//! (tests/fakes/captures, see tests/realcli) and a backend of each kind.

use std::time::Duration;

use serde_json::Value;

use super::{CliBackend, agent};
use crate::backend::process::{Ended, ProcOutput};
use crate::backend::{AgentCall, AgentConfig};
use crate::model::{AgentKind, Permissions};

/// The output of a captured run of a real CLI: `capture!("claude", "ok")`.
macro_rules! capture {
    ($cli:literal, $case:literal) => {
        $crate::backend::cli::test_support::captured(
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fakes/captures/",
                $cli,
                "/",
                $case,
                ".stdout"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fakes/captures/",
                $cli,
                "/",
                $case,
                ".stderr"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fakes/captures/",
                $cli,
                "/",
                $case,
                ".exit"
            )),
        )
    };
}

pub(super) fn captured(stdout: &str, stderr: &str, exit: &str) -> ProcOutput {
    ProcOutput {
        code: Some(exit.trim().parse().expect("an exit code")),
        signal: None,
        stdout: stdout.as_bytes().to_vec(),
        stderr: stderr.as_bytes().to_vec(),
        ended: Ended::Exited,
        elapsed: Duration::from_secs(1),
        stdout_cut: 0,
        stderr_cut: 0,
    }
}

pub(super) const REPLY: &str = "MOCK-REPLY-4F7: the mock model says hello.";

pub(super) fn backend(kind: AgentKind, permissions: Permissions) -> CliBackend {
    let config = AgentConfig {
        name: "a".into(),
        kind,
        permissions,
        ..AgentConfig::default()
    };
    CliBackend {
        config,
        agent: agent(kind).expect("an agent CLI"),
        program: kind.as_str().into(),
    }
}

pub(super) fn call_in(dir: &std::path::Path, schema: Option<Value>) -> AgentCall {
    AgentCall {
        stage: "s".into(),
        scope: String::new(),
        attempt: 1,
        prompt: "p".into(),
        model: None,
        args: Vec::new(),
        env: Vec::new(),
        cwd: dir.to_path_buf(),
        dir: dir.to_path_buf(),
        timeout: None,
        idle_timeout: None,
        schema,
        max_tokens: None,
        watch: None,
        policy: None,
        roots: Default::default(),
    }
}

pub(super) fn argv_of(kind: AgentKind, permissions: Permissions) -> Vec<String> {
    let dir = tempfile::tempdir().expect("a temp dir");
    backend(kind, permissions)
        .invocation(&call_in(dir.path(), None))
        .expect("an invocation")
        .argv
}
