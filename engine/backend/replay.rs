//! Record and replay: every backend exchange written to a JSON Lines file, and a backend
//! that answers from such a file, deterministically and with no agent at all.
//!
//! A recording is keyed by where the call was made (scope, stage, attempt); several calls of
//! one attempt (a retry after a rate limit, a fallback) are replayed in the order recorded.

use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{AgentCall, AgentConfig, AgentReply, Backend, CallError, CallFuture, Capabilities};

/// One exchange of a recording.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Exchange {
    pub scope: String,
    pub stage: String,
    pub attempt: u32,
    /// The agent that was called.
    pub agent: String,
    /// The prompt's length (the prompt itself is in the run's artifacts).
    pub prompt_bytes: usize,
    /// The SHA-256 of the prompt (hex), so that a replay can tell a prompt that changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_sha256: Option<String>,
    #[serde(flatten)]
    pub result: Answer,
}

/// What the backend answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    Reply(AgentReply),
    Error(CallError),
}

type Key = (String, String, u32);

/// Why a recording cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("an agent of kind replay needs `file`")]
    NoFile,
    #[error("cannot read the recording {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: not an exchange of a recording", path.display())]
    Exchange {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Why a recording cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot create {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the recording {}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The SHA-256 of a prompt, in hex.
fn prompt_hash(prompt: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(prompt.as_bytes()))
}

/// Answers calls from a recording.
pub struct ReplayBackend {
    answers: Mutex<HashMap<Key, VecDeque<Recorded>>>,
    file: String,
}

/// A recorded answer with what the prompt was.
struct Recorded {
    answer: Answer,
    prompt_bytes: usize,
    prompt_sha256: Option<String>,
}

impl ReplayBackend {
    /// Reads a recording.
    pub fn open(path: &Path) -> Result<Self, ReplayError> {
        use std::io::BufRead;
        let read_error = |source| ReplayError::Read {
            path: path.to_path_buf(),
            source,
        };
        // A line at a time: a long recording is not held whole beside what it holds.
        let file = std::io::BufReader::new(std::fs::File::open(path).map_err(read_error)?);
        let mut answers: HashMap<Key, VecDeque<Recorded>> = HashMap::new();
        for (i, line) in file.lines().enumerate() {
            let line = line.map_err(read_error)?;
            if line.trim().is_empty() {
                continue;
            }
            let ex: Exchange =
                serde_json::from_str(&line).map_err(|source| ReplayError::Exchange {
                    path: path.to_path_buf(),
                    line: i + 1,
                    source,
                })?;
            answers
                .entry((ex.scope, ex.stage, ex.attempt))
                // Most places were called once (a queue would keep room for four).
                .or_insert_with(|| VecDeque::with_capacity(1))
                .push_back(Recorded {
                    answer: ex.result,
                    prompt_bytes: ex.prompt_bytes,
                    prompt_sha256: ex.prompt_sha256,
                });
        }
        answers.shrink_to_fit();
        Ok(ReplayBackend {
            answers: Mutex::new(answers),
            file: path.display().to_string(),
        })
    }
}

impl Backend for ReplayBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            json_schema: false,
            cost: true,
            usage: true,
        }
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(async move {
            let key = (call.scope.clone(), call.stage.clone(), call.attempt);
            let answer = self
                .answers
                .lock()
                .map_err(|_| CallError::Failed {
                    message: "the recording is unusable after a panic".into(),
                })?
                .get_mut(&key)
                .and_then(VecDeque::pop_front);
            let changed = answer.as_ref().is_some_and(|a| match &a.prompt_sha256 {
                Some(hash) => *hash != prompt_hash(&call.prompt),
                None => a.prompt_bytes != call.prompt.len(),
            });
            match answer.map(|a| a.answer) {
                Some(Answer::Reply(mut r)) => {
                    if changed {
                        r.warnings.push(format!(
                            "the prompt of stage `{}` differs from the one recorded in {} \
                             (other params, or a changed prompt file); the recorded answer is \
                             replayed anyway",
                            call.stage, self.file
                        ));
                    }
                    Ok(r)
                }
                Some(Answer::Error(e)) => Err(e),
                None => Err(CallError::Failed {
                    message: format!(
                        "the recording {} has no answer for stage `{}`{} attempt {}; record the run again with --record",
                        self.file,
                        call.stage,
                        if call.scope.is_empty() {
                            String::new()
                        } else {
                            format!(" in `{}`", call.scope)
                        },
                        call.attempt
                    ),
                }),
            }
        })
    }
}

/// Appends every exchange of the backends it wraps to a file.
pub struct Recorder {
    file: Mutex<std::fs::File>,
}

impl Recorder {
    /// Creates a recording: a new (truncated) file, or, to go on with a resumed run's,
    /// the end of an existing one.
    pub fn create(path: &Path, append: bool) -> Result<Self, RecordError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| RecordError::Directory {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|source| RecordError::File {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Recorder {
            file: Mutex::new(file),
        })
    }

    /// Wraps a backend so that its exchanges are recorded under an agent's name.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn Backend>, agent: &str) -> Recording {
        Recording {
            inner,
            recorder: self.clone(),
            agent: agent.to_string(),
        }
    }

    fn append(&self, ex: &Exchange) {
        let Ok(line) = serde_json::to_string(ex) else {
            return;
        };
        let line = crate::secrets::redact(&line);
        if let Ok(mut f) = self.file.lock() {
            if let Err(e) = writeln!(f, "{line}").and_then(|()| f.flush()) {
                tracing::warn!("cannot write to the recording: {e}");
            }
        }
    }
}

/// A backend whose exchanges are recorded.
pub struct Recording {
    inner: Arc<dyn Backend>,
    recorder: Arc<Recorder>,
    agent: String,
}

impl Backend for Recording {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(async move {
            let result = self.inner.call(call).await;
            self.recorder.append(&Exchange {
                scope: call.scope.clone(),
                stage: call.stage.clone(),
                attempt: call.attempt,
                agent: self.agent.clone(),
                prompt_bytes: call.prompt.len(),
                prompt_sha256: Some(prompt_hash(&call.prompt)),
                result: match &result {
                    Ok(r) => Answer::Reply(r.clone()),
                    Err(e) => Answer::Error(e.clone()),
                },
            });
            result
        })
    }
}

/// Builds the backend of a `replay` agent.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, ReplayError> {
    let file = config.file.as_ref().ok_or(ReplayError::NoFile)?;
    Ok(Box::new(ReplayBackend::open(file)?))
}
