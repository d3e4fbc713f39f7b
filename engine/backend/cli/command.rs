//! A `command` agent: any program, with the prompt on stdin, in a file or in an argument;
//! its stdout is the answer.

use super::classify::{classify, retry_hint};
use super::invocation::{Launch, PromptFile, Request, write_failed};
use super::output::output_tail;
use super::{CliAgent, Program};
use crate::backend::process::ProcOutput;
use crate::backend::{AgentReply, CallError};
use crate::model::PromptVia;

/// The `command` agent: it runs its `command`, reports neither tokens nor cost, and has no
/// key of its own.
pub(super) struct Command;

impl CliAgent for Command {
    fn program(&self) -> Option<Program> {
        None
    }

    fn launch(&self, request: &Request<'_>) -> Result<Launch, CallError> {
        let config = request.config;
        let mut argv: Vec<String> = config
            .command
            .iter()
            .chain(&request.user_args)
            .cloned()
            .collect();
        let prompt = &request.prompt;
        match config.prompt_via {
            PromptVia::Stdin => Ok(Launch::stdin(argv, prompt)),
            PromptVia::File => {
                let path = request.call.dir.join(PROMPT_FILE);
                std::fs::write(&path, prompt).map_err(|e| write_failed(&path, e))?;
                place(&mut argv, "{prompt_file}", &path.display().to_string());
                Ok(Launch {
                    argv,
                    stdin: None,
                    prompt_file: Some(PromptFile(path)),
                })
            }
            PromptVia::Arg => {
                let text = String::from_utf8_lossy(prompt);
                place(&mut argv, "{prompt}", &text);
                Ok(Launch {
                    argv,
                    stdin: None,
                    prompt_file: None,
                })
            }
        }
    }

    fn parse(&self, out: &ProcOutput) -> Result<AgentReply, CallError> {
        parse(out)
    }
}

/// The file of a call's directory that holds the prompt of a `command` agent with
/// `prompt_via = "file"`.
const PROMPT_FILE: &str = "prompt.txt";

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

fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
    // A program that exits non-zero (or is killed) gave no answer: that attempt failed,
    // unless what it printed says it was rate-limited or overloaded.
    let how = match (out.code, out.signal) {
        (Some(0), _) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.stdout_cut > 0 {
                // Only the end of a very long answer was kept: say so, with the true count.
                text = format!("[... {} bytes cut ...]\n{text}", out.stdout_cut);
            }
            // Any program: it reports no token usage, which is unknown, not 0.
            return Ok(AgentReply {
                text,
                usage: crate::backend::Usage::unreported_call(),
                ..AgentReply::default()
            });
        }
        (_, Some(signal)) => format!("was killed by signal {signal}"),
        (code, None) => format!("exited with code {}", code.unwrap_or(-1)),
    };
    let said = output_tail(out);
    Err(classify(&said, retry_hint(&said), || CallError::Failed {
        message: format!("the agent's program {how}: {said}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced_or_the_value_appended() {
        let mut argv = vec!["tool".to_string(), "--in={prompt}".into()];
        place(&mut argv, "{prompt}", "hi");
        assert_eq!(argv, ["tool", "--in=hi"]);
        let mut argv = vec!["tool".to_string(), "-x".into()];
        place(&mut argv, "{prompt}", "hi");
        assert_eq!(argv, ["tool", "-x", "hi"]);
    }
}
