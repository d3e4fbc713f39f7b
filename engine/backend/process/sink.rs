//! One output stream as it is captured: appended to its file (up to [`FILE_CAP`]) and kept in
//! memory (its last [`MEMORY_CAP`] bytes).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::limit::LimitHit;
use super::{FILE_CAP, MEMORY_CAP};

/// One output stream: its file (created when the first byte arrives, so a silent program
/// costs no file) and the part kept in memory.
pub(super) struct Sink {
    file: Option<std::fs::File>,
    path: Option<PathBuf>,
    pub(super) kept: Vec<u8>,
    /// Bytes dropped from the front of `kept`.
    pub(super) dropped: u64,
    /// Bytes written to the file.
    written: u64,
    /// Bytes not written because the file reached [`FILE_CAP`].
    unwritten: u64,
    /// The file could not be opened or written because a limit of the machine was reached
    /// (open files, disk space, file size): the program is stopped and the run with it.
    pub(super) hit: Option<LimitHit>,
}

impl Sink {
    pub(super) fn new(path: Option<&Path>) -> Self {
        Sink {
            file: None,
            path: path.map(Path::to_path_buf),
            kept: Vec::new(),
            dropped: 0,
            written: 0,
            unwritten: 0,
            hit: None,
        }
    }

    /// Appends a chunk to the file and to memory, dropping the oldest bytes beyond the cap
    /// (a quarter of the cap at a time, so that trimming stays cheap).
    pub(super) fn push(&mut self, chunk: &[u8]) {
        if self.file.is_none() {
            if let Some(p) = self.path.take() {
                // Its directory is made with its first byte (a silent program makes none).
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    let _ = std::fs::create_dir_all(dir);
                }
                // A file left by a run that stopped in this attempt (a crash, a limit of the
                // machine) is replaced: a resume runs the attempt again from its start.
                match std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(&p)
                {
                    Ok(f) => {
                        self.file = Some(f);
                        self.path = Some(p);
                    }
                    Err(e) => match LimitHit::of(|| format!("cannot open {}", p.display()), e) {
                        Ok(hit) => self.hit = Some(hit),
                        Err(e) => {
                            tracing::warn!("cannot open {}: {e}; not writing it", p.display())
                        }
                    },
                }
            }
        }
        let room = usize::try_from(FILE_CAP.saturating_sub(self.written)).unwrap_or(usize::MAX);
        let (to_file, over) = chunk.split_at(chunk.len().min(room));
        self.written += to_file.len() as u64;
        self.unwritten += over.len() as u64;
        if let (Some(file), false) = (&mut self.file, to_file.is_empty()) {
            if let Err(e) = file.write_all(to_file) {
                let path = self.path.as_deref().unwrap_or(Path::new(""));
                match LimitHit::of(|| format!("cannot write {}", path.display()), e) {
                    Ok(hit) => self.hit = Some(hit),
                    Err(e) => tracing::warn!(
                        "cannot write to {}: {e}; not writing it further",
                        path.display()
                    ),
                }
                self.file = None;
                self.path = None;
            }
        }
        self.kept.extend_from_slice(chunk);
        if self.kept.len() > MEMORY_CAP {
            let excess = self.kept.len() - MEMORY_CAP * 3 / 4;
            self.kept.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    /// Ends the file with a line saying how much did not fit in it.
    pub(super) fn finish(&mut self) {
        if self.unwritten == 0 {
            return;
        }
        if let Some(file) = &mut self.file {
            let _ = write!(
                file,
                "\n[ralph-flow: this file keeps the first {} bytes of the stream; {} more bytes were not written]\n",
                self.written, self.unwritten
            );
        }
    }
}
