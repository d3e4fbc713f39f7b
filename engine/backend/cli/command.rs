//! A `command` agent: any program; its stdout is the answer.

use super::classify::{classify, retry_hint};
use super::output::output_tail;
use crate::backend::process::ProcOutput;
use crate::backend::{AgentReply, CallError};

pub(super) fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
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
