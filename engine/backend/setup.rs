//! Setting an agent up: whether it can run on this machine at all, and its backend.

use std::path::{Path, PathBuf};

use super::{AgentConfig, Backend, acp, cli, http, replay};
use crate::model::AgentKind as K;

/// Why an agent cannot run on this machine; the message says what to install or set.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error(
        "`{program}` is not installed (not found on PATH); install it with `npm install -g \
         {package}`, or point `{variable}` (or the agent's `program`) at it"
    )]
    NotInstalled {
        program: String,
        /// The npm package of the CLI.
        package: &'static str,
        /// The variable that names the program (`RALPH_FLOW_CLAUDE`...).
        variable: &'static str,
    },
    #[error("a command agent needs a `command`")]
    NoCommand,
    #[error(
        "its command `{program}` is not installed (not found on PATH, nor as a path from {})",
        cwd.display()
    )]
    CommandNotInstalled { program: String, cwd: PathBuf },
    #[error("an acp agent needs a `command`: the program that speaks ACP and its arguments")]
    NoAcpCommand,
    #[error(
        "its ACP program `{program}` is not installed (not found on PATH, nor as a path from \
         {}); install the agent (`npm install -g @agentclientprotocol/claude-agent-acp` for \
         claude-agent-acp), or fix the agent's `command`",
        cwd.display()
    )]
    AcpNotInstalled { program: String, cwd: PathBuf },
    #[error(transparent)]
    Http(#[from] http::SetupError),
    #[error("its recording {} does not exist", .0.display())]
    NoRecording(PathBuf),
}

/// Why an agent's settings cannot make a backend.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Cli(#[from] cli::BuildError),
    #[error(transparent)]
    Http(#[from] http::SetupError),
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
}

/// Tells whether an agent can be called at all on this machine, before a run starts: its
/// program is installed, its API key variable is set, its recording exists. `cwd` is where
/// relative program paths start.
pub fn preflight(config: &AgentConfig, cwd: &Path) -> Result<(), PreflightError> {
    match config.kind {
        kind if kind.is_agent_cli() => {
            if let (Some(program), Some(default)) = (cli::program(config), cli::program_of(kind)) {
                if find_program(&program, cwd).is_none() {
                    return Err(PreflightError::NotInstalled {
                        program,
                        package: default.package,
                        variable: default.variable,
                    });
                }
            }
        }
        K::Command => {
            let Some(program) = config.command.first() else {
                return Err(PreflightError::NoCommand);
            };
            if find_program(program, cwd).is_none() {
                return Err(PreflightError::CommandNotInstalled {
                    program: program.clone(),
                    cwd: cwd.to_path_buf(),
                });
            }
        }
        K::Acp => {
            let Some(program) = config.command.first() else {
                return Err(PreflightError::NoAcpCommand);
            };
            if find_program(program, cwd).is_none() {
                return Err(PreflightError::AcpNotInstalled {
                    program: program.clone(),
                    cwd: cwd.to_path_buf(),
                });
            }
        }
        K::OpenAi | K::Anthropic => http::preflight(config)?,
        K::Replay => {
            if let Some(f) = &config.file {
                if !f.is_file() {
                    return Err(PreflightError::NoRecording(f.clone()));
                }
            }
        }
        // Every agent CLI is handled above.
        _ => {}
    }
    Ok(())
}

/// The environment variables the agents of a kind read their key from (the CLIs read them
/// themselves; the HTTP kinds' defaults), registered as secrets before a run. Empty for
/// `command` and `replay`.
pub fn key_variables(kind: K) -> &'static [&'static str] {
    match kind {
        K::OpenAi => &["OPENAI_API_KEY"],
        K::Anthropic => &["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"],
        _ => cli::key_variables(kind),
    }
}

/// Finds a program as `Command` would: a name on PATH, or a path (relative to `cwd`).
pub fn find_program(program: &str, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = cwd.join(program);
        return executable(&path).then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// Builds the backend of an agent.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, BuildError> {
    Ok(match config.kind {
        K::OpenAi | K::Anthropic => http::build(config)?,
        K::Replay => replay::build(config)?,
        K::Acp => acp::build(config)?,
        // `command` and every agent CLI.
        _ => cli::build(config)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_same_as_before() {
        let config = AgentConfig {
            name: "a".into(),
            kind: K::Claude,
            program: Some("./surely-not-here".into()),
            ..AgentConfig::default()
        };
        let e = preflight(&config, Path::new("/")).expect_err("not installed");
        assert_eq!(
            e.to_string(),
            "`./surely-not-here` is not installed (not found on PATH); install it with `npm \
             install -g @anthropic-ai/claude-code`, or point `RALPH_FLOW_CLAUDE` (or the \
             agent's `program`) at it"
        );
        let config = AgentConfig {
            kind: K::Command,
            command: vec!["nope-7f3a".into()],
            ..AgentConfig::default()
        };
        let e = preflight(&config, Path::new("/tmp")).expect_err("not installed");
        assert_eq!(
            e.to_string(),
            "its command `nope-7f3a` is not installed (not found on PATH, nor as a path from /tmp)"
        );
        let config = AgentConfig {
            kind: K::OpenAi,
            api_key_env: Some("RF_TEST_SURELY_UNSET_KEY_9c1d".into()),
            ..AgentConfig::default()
        };
        let e = preflight(&config, Path::new("/")).expect_err("no key");
        assert_eq!(
            e.to_string(),
            "the API key variable `RF_TEST_SURELY_UNSET_KEY_9c1d` is not set; export it, or \
             name another variable with `api_key_env`"
        );
        let config = AgentConfig {
            kind: K::Replay,
            ..AgentConfig::default()
        };
        let e = build(&config).err().expect("no file");
        assert_eq!(e.to_string(), "an agent of kind replay needs `file`");
    }
}
