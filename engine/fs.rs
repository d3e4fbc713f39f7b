//! Files as the static side reads them: the [`FileSystem`] the loader reads through (the
//! real one serves the presets built into the binary below [`BUILTIN_ROOT`]), the size limit,
//! and path helpers that never touch the disk.

use std::path::{Path, PathBuf};

use crate::source::{Sources, Span};

/// The largest workflow, prompt or schema file read (16 MiB); larger files are refused.
pub const MAX_FILE_BYTES: usize = 16 << 20;

/// Reads files for the loader; tests and fuzzers use an in-memory one.
pub trait FileSystem {
    /// Reads a whole file as UTF-8 text.
    fn read(&self, path: &Path) -> std::io::Result<String>;

    /// Tells whether a file exists (prompt and preset search).
    fn exists(&self, path: &Path) -> bool {
        self.read(path).is_ok()
    }

    /// The files directly in a directory (for listing presets); none when it cannot be read.
    fn list(&self, _dir: &Path) -> Vec<PathBuf> {
        Vec::new()
    }
}

/// The real file system, with the built-in presets under [`BUILTIN_ROOT`].
pub struct RealFs;

impl FileSystem for RealFs {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        if is_builtin(path) {
            return builtin_file(path).map(str::to_string).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such built-in file")
            });
        }
        // One byte more than the limit is enough to tell a file that is too large (and
        // `/dev/zero` cannot exhaust memory).
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)?
            .take(MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)?;
        if bytes.len() > MAX_FILE_BYTES {
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        String::from_utf8(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
    }

    fn exists(&self, path: &Path) -> bool {
        if is_builtin(path) {
            return builtin_file(path).is_some();
        }
        path.is_file()
    }

    fn list(&self, dir: &Path) -> Vec<PathBuf> {
        if is_builtin(dir) {
            return builtin_files()
                .iter()
                .map(|(p, _)| Path::new(BUILTIN_ROOT).join(p))
                .filter(|p| p.parent() == Some(dir))
                .collect();
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut out: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        out.sort();
        out
    }
}

/// Files held in memory: a worker's copy of the files a detached run's workflow was built
/// from (see `run::worker`), by absolute path; a path asked for is made absolute first
/// ([`normalize`], against the current directory, as the loader shows paths relative to
/// it). Paths below [`BUILTIN_ROOT`] that it does not hold are served from the binary, as
/// [`RealFs`] serves them.
#[derive(Default)]
pub struct MemFs {
    files: std::collections::HashMap<PathBuf, String>,
    /// Read a file it does not hold from the disk (see [`MemFs::over_disk`]).
    disk: bool,
}

impl MemFs {
    /// Holds these files (path, text); relative paths are taken from the current directory.
    pub fn new(files: impl IntoIterator<Item = (PathBuf, String)>) -> Self {
        MemFs {
            files: files.into_iter().map(|(p, t)| (normalize(&p), t)).collect(),
            disk: false,
        }
    }

    /// These files first, then the disk: a worker reads a run's files as stored with it,
    /// and a file that was not stored (a prompt file of a subflow prepared during the run)
    /// where the run's machine had it, as before files were stored.
    pub fn over_disk(files: impl IntoIterator<Item = (PathBuf, String)>) -> Self {
        MemFs {
            disk: true,
            ..MemFs::new(files)
        }
    }
}

impl FileSystem for MemFs {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        match self.files.get(&normalize(path)) {
            Some(text) => Ok(text.clone()),
            None if is_builtin(path) || self.disk => RealFs.read(path),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not among the workflow's files stored with the run",
            )),
        }
    }

    fn exists(&self, path: &Path) -> bool {
        self.files.contains_key(&normalize(path))
            || ((is_builtin(path) || self.disk) && RealFs.exists(path))
    }

    fn list(&self, dir: &Path) -> Vec<PathBuf> {
        let dir = normalize(dir);
        let mut out: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| p.parent() == Some(dir.as_path()))
            .cloned()
            .collect();
        if is_builtin(&dir) || self.disk {
            for p in RealFs.list(&dir) {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

mod builtin {
    include!(concat!(env!("OUT_DIR"), "/builtin.rs"));
}

/// Where the built-in presets appear to live: a directory no real file system has. Paths
/// below it are served from the binary.
pub const BUILTIN_ROOT: &str = "/<built-in>";

/// The text of a built-in file, given its full path below [`BUILTIN_ROOT`].
pub fn builtin_file(path: &Path) -> Option<&'static str> {
    let rel = path.strip_prefix(BUILTIN_ROOT).ok()?;
    let rel = rel.to_str()?;
    builtin::FILES
        .iter()
        .find(|(p, _)| *p == rel)
        .map(|(_, text)| *text)
}

/// Tells whether a path lies below [`BUILTIN_ROOT`].
pub fn is_builtin(path: &Path) -> bool {
    path.starts_with(BUILTIN_ROOT)
}

/// Every built-in file: its path below the preset root and its text.
pub fn builtin_files() -> &'static [(&'static str, &'static str)] {
    builtin::FILES
}

/// Shows a path relative to the current directory when it lies below it.
pub fn relative(path: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    path.strip_prefix(&cwd)
        .map_or_else(|_| path.to_path_buf(), Path::to_path_buf)
}

/// Makes a path absolute and removes `.` and `..` parts, without touching the file system.
pub fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = PathBuf::new();
    for part in abs.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Directory against which a path written at `span` is resolved: the directory of its file.
pub fn base_dir(sources: &Sources, span: Span) -> PathBuf {
    sources
        .get(span.file)
        .path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// A file or directory that could not be read, written or made: what was being done, and
/// where. The one I/O error of every layer (the store, presets, worktrees, the run's files).
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {}", path.display())]
pub struct IoFailure {
    pub what: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl IoFailure {
    /// `what` is what was being done, as a verb: "write", "create" (the message says
    /// "cannot {what}", so a `what` that says "cannot" or "could not" itself doubles it).
    pub fn new(what: &'static str, path: impl AsRef<Path>, source: std::io::Error) -> Self {
        debug_assert!(
            !what.starts_with("cannot") && !what.starts_with("could not"),
            "IoFailure's `what` says \"cannot\" itself: {what:?}"
        );
        IoFailure {
            what,
            path: path.as_ref().to_path_buf(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_files_come_first_and_the_disk_only_when_asked() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let on_disk = dir.path().join("prompt.md");
        let stored = dir.path().join("w.toml");
        std::fs::write(&on_disk, "from the disk").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&stored, "the disk's copy").unwrap_or_else(|e| panic!("{e}"));
        let files = || [(stored.clone(), "the stored copy".to_string())];
        let strict = MemFs::new(files());
        assert_eq!(
            strict.read(&stored).ok().as_deref(),
            Some("the stored copy")
        );
        assert!(strict.read(&on_disk).is_err());
        assert!(!strict.exists(&on_disk));
        let over = MemFs::over_disk(files());
        assert_eq!(over.read(&stored).ok().as_deref(), Some("the stored copy"));
        assert_eq!(over.read(&on_disk).ok().as_deref(), Some("from the disk"));
        assert!(over.exists(&on_disk));
        let listed = over.list(dir.path());
        assert_eq!(
            listed.iter().filter(|p| **p == stored).count(),
            1,
            "{listed:?}"
        );
        assert!(listed.contains(&on_disk));
    }

    #[test]
    fn builtin_presets_are_embedded() {
        let spider = builtin_file(Path::new("/<built-in>/workflows/spider.toml"));
        assert!(spider.is_some_and(|t| t.contains("name = \"spider\"")));
        assert!(builtin_file(Path::new("/<built-in>/prompts/spider/specify.md.j2")).is_some());
        assert!(builtin_file(Path::new("/<built-in>/workflows/nope.toml")).is_none());
        assert!(builtin_file(Path::new("workflows/spider.toml")).is_none());
    }
}
