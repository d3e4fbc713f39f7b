//! Record and replay: every backend exchange written to a JSON Lines file, and a backend
//! that answers from such a file, deterministically and with no agent at all.
//!
//! A recording is keyed by where the call was made (scope, stage, attempt); several calls of
//! one attempt (a retry after a rate limit, a fallback) are replayed in the order recorded.

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
///
/// The recording is read once when it is opened (every line must be an exchange), but only
/// an index is kept: where each exchange's line is and a hash of its place. A call reads its
/// answer's line again, so that a run of thousands of stages does not hold every answer.
pub struct ReplayBackend {
    index: Mutex<Index>,
    file: std::fs::File,
    path: PathBuf,
}

/// Where the exchanges of a recording are, sorted by the hash of their place (scope,
/// stage, attempt) and, within one place, in the order recorded.
struct Index {
    lines: Vec<Line>,
    /// Whether each line of `lines` has been replayed.
    used: Vec<bool>,
}

/// One exchange's line in the file.
#[derive(Clone, Copy)]
struct Line {
    place: u64,
    offset: u64,
    len: u32,
    /// The line's number (from 1), for messages.
    number: u32,
}

/// The hash of a place; equal hashes are told apart by reading the line.
fn place_hash(scope: &str, stage: &str, attempt: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (scope, stage, attempt).hash(&mut h);
    h.finish()
}

impl ReplayBackend {
    /// Reads a recording.
    pub fn open(path: &Path) -> Result<Self, ReplayError> {
        use std::io::BufRead;
        let read_error = |source| ReplayError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let mut reader = std::io::BufReader::new(&file);
        let mut lines = Vec::new();
        let mut buf = String::new();
        let mut offset = 0u64;
        let mut number = 0u32;
        loop {
            buf.clear();
            let n = reader.read_line(&mut buf).map_err(read_error)?;
            if n == 0 {
                break;
            }
            number = number.saturating_add(1);
            let at = offset;
            offset += n as u64;
            if buf.trim().is_empty() {
                continue;
            }
            let ex: Exchange =
                serde_json::from_str(&buf).map_err(|source| ReplayError::Exchange {
                    path: path.to_path_buf(),
                    line: number as usize,
                    source,
                })?;
            let len = u32::try_from(n).map_err(|_| {
                read_error(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("line {number} is longer than 4 GiB"),
                ))
            })?;
            lines.push(Line {
                place: place_hash(&ex.scope, &ex.stage, ex.attempt),
                offset: at,
                len,
                number,
            });
        }
        // Stable: the calls of one place keep the order they were recorded in.
        lines.sort_by_key(|l| l.place);
        lines.shrink_to_fit();
        let used = vec![false; lines.len()];
        Ok(ReplayBackend {
            index: Mutex::new(Index { lines, used }),
            file,
            path: path.to_path_buf(),
        })
    }

    /// Takes the first answer recorded for a place that has not been replayed yet.
    fn take(&self, scope: &str, stage: &str, attempt: u32) -> Result<Option<Exchange>, CallError> {
        let mut index = self.index.lock().map_err(|_| CallError::Failed {
            message: "the recording is unusable after a panic".into(),
        })?;
        let place = place_hash(scope, stage, attempt);
        let first = index.lines.partition_point(|l| l.place < place);
        let mut i = first;
        while i < index.lines.len() && index.lines[i].place == place {
            if !index.used[i] {
                let line = index.lines[i];
                let ex = self.read(line)?;
                if ex.scope == scope && ex.stage == stage && ex.attempt == attempt {
                    index.used[i] = true;
                    return Ok(Some(ex));
                }
            }
            i += 1;
        }
        Ok(None)
    }

    /// Reads one exchange again.
    fn read(&self, line: Line) -> Result<Exchange, CallError> {
        use std::os::unix::fs::FileExt as _;
        let changed = |why: String| CallError::Failed {
            message: format!(
                "{}:{}: the recording changed while the run replayed it ({why}); \
                 replay it from the start",
                self.path.display(),
                line.number
            ),
        };
        let mut buf = vec![0; line.len as usize];
        self.file
            .read_exact_at(&mut buf, line.offset)
            .map_err(|e| changed(e.to_string()))?;
        serde_json::from_slice(&buf).map_err(|e| changed(e.to_string()))
    }
}

impl Backend for ReplayBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cost: true,
            usage: true,
        }
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(async move {
            let answer = self.take(&call.scope, &call.stage, call.attempt)?;
            let changed = answer.as_ref().is_some_and(|a| match &a.prompt_sha256 {
                Some(hash) => *hash != prompt_hash(&call.prompt),
                None => a.prompt_bytes != call.prompt.len(),
            });
            match answer.map(|a| a.result) {
                Some(Answer::Reply(mut r)) => {
                    if changed {
                        r.warnings.push(format!(
                            "the prompt of stage `{}` differs from the one recorded in {} \
                             (other params, or a changed prompt file); the recorded answer is \
                             replayed anyway",
                            call.stage,
                            self.path.display()
                        ));
                    }
                    Ok(r)
                }
                Some(Answer::Error(e)) => Err(e),
                None => Err(CallError::Failed {
                    message: format!(
                        "the recording {} has no answer for stage `{}`{} attempt {}; record the run again with --record",
                        self.path.display(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(scope: &str, stage: &str, attempt: u32, prompt: &str) -> AgentCall {
        AgentCall {
            stage: stage.into(),
            scope: scope.into(),
            attempt,
            prompt: prompt.into(),
            model: None,
            args: vec![],
            env: vec![],
            cwd: PathBuf::from("."),
            dir: PathBuf::from("."),
            timeout: None,
            idle_timeout: None,
            schema: None,
            max_tokens: None,
            watch: None,
            policy: None,
            roots: Default::default(),
        }
    }

    fn line(scope: &str, stage: &str, attempt: u32, text: &str) -> String {
        serde_json::to_string(&Exchange {
            scope: scope.into(),
            stage: stage.into(),
            attempt,
            agent: "bot".into(),
            prompt_bytes: 2,
            prompt_sha256: Some(prompt_hash("hi")),
            result: Answer::Reply(AgentReply {
                text: text.into(),
                raw: text.into(),
                ..AgentReply::default()
            }),
        })
        .expect("test setup")
    }

    fn answer(backend: &ReplayBackend, c: &AgentCall) -> Result<AgentReply, CallError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("test setup")
            .block_on(backend.call(c))
    }

    #[test]
    fn answers_each_place_in_the_order_recorded_and_reads_lines_again() {
        let dir = tempfile::tempdir().expect("test setup");
        let path = dir.path().join("r.jsonl");
        let text = [
            line("", "a", 1, "a1 first"),
            String::new(),
            line("loop#1", "a", 1, "in the loop"),
            line("", "b", 1, "b1"),
            line("", "a", 1, "a1 second"),
            line("", "a", 2, "a2"),
        ]
        .join("\n");
        std::fs::write(&path, text + "\n").expect("test setup");
        let backend = ReplayBackend::open(&path).expect("test setup");
        assert_eq!(backend.index.lock().expect("test setup").lines.len(), 5);
        let text_of = |scope, stage, attempt| {
            answer(&backend, &call(scope, stage, attempt, "hi")).map(|r| r.text)
        };
        assert_eq!(text_of("", "a", 2).expect("test setup"), "a2");
        assert_eq!(text_of("", "a", 1).expect("test setup"), "a1 first");
        assert_eq!(
            text_of("loop#1", "a", 1).expect("test setup"),
            "in the loop"
        );
        assert_eq!(text_of("", "a", 1).expect("test setup"), "a1 second");
        assert_eq!(text_of("", "b", 1).expect("test setup"), "b1");
        let none = text_of("", "a", 1).expect_err("an error").to_string();
        assert!(
            none.contains("has no answer for stage `a` attempt 1"),
            "{none}"
        );
        let changed = answer(
            &ReplayBackend::open(&path).expect("test setup"),
            &call("", "b", 1, "other"),
        )
        .expect("test setup");
        assert!(changed.warnings[0].contains("differs from the one recorded"));
    }

    #[test]
    fn a_recording_changed_under_the_run_is_an_error_not_a_wrong_answer() {
        let dir = tempfile::tempdir().expect("test setup");
        let path = dir.path().join("r.jsonl");
        std::fs::write(
            &path,
            line("", "a", 1, "first") + "\n" + &line("", "b", 1, "b") + "\n",
        )
        .expect("test setup");
        let backend = ReplayBackend::open(&path).expect("test setup");
        // The same length, other bytes: what a rewrite in place leaves.
        let old = std::fs::read_to_string(&path).expect("test setup");
        std::fs::write(&path, old.replacen("\"stage\":\"b\"", "\"stage\":\"c\"", 1))
            .expect("test setup");
        assert_eq!(
            answer(&backend, &call("", "a", 1, "hi"))
                .expect("test setup")
                .text,
            "first"
        );
        let e = answer(&backend, &call("", "b", 1, "hi"))
            .expect_err("an error")
            .to_string();
        assert!(e.contains("has no answer for stage `b`"), "{e}");
        std::fs::write(&path, "{}").expect("test setup");
        let e = answer(&backend, &call("", "b", 1, "hi"))
            .expect_err("an error")
            .to_string();
        assert!(
            e.contains(":2: the recording changed while the run replayed it"),
            "{e}"
        );
    }

    #[test]
    fn a_line_that_is_not_an_exchange_is_named_when_opened() {
        let dir = tempfile::tempdir().expect("test setup");
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, line("", "a", 1, "x") + "\n\nnot json\n").expect("test setup");
        let e = ReplayBackend::open(&path)
            .err()
            .expect("an error")
            .to_string();
        assert!(
            e.ends_with("r.jsonl:3: not an exchange of a recording"),
            "{e}"
        );
    }
}
