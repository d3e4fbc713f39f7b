//! `ralph-flow.lock`: the git presets a directory's workflows use, each pinned to a commit
//! and a content hash. Written by ralph-flow (`presets fetch`, `presets update`, `run`);
//! meant to be committed, so that every member of a team runs the same preset.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::PresetError;
pub use super::error::{Duplicate, LockError};

/// The lockfile's name; it sits beside the workflow files that declare the sources.
pub const LOCK_NAME: &str = "ralph-flow.lock";

/// The lockfile format's version.
pub const VERSION: u32 = 1;

/// A parsed lockfile.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LockFile {
    pub version: u32,
    #[serde(default, rename = "source")]
    pub sources: Vec<Locked>,
}

/// One pinned source: the repository and revision as the workflow writes them, the commit the
/// revision resolved to, and the hash of that commit's files.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Locked {
    pub name: String,
    pub git: String,
    pub rev: String,
    pub commit: String,
    pub hash: String,
}

/// A lockfile as read, each entry with where it is in the text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Read {
    version: u32,
    #[serde(default, rename = "source")]
    sources: Vec<toml::Spanned<Locked>>,
}

impl LockFile {
    /// Parses a lockfile's text.
    pub fn parse(text: &str) -> Result<LockFile, LockError> {
        let read: Read = toml::from_str(text).map_err(LockError::Syntax)?;
        if read.version != VERSION {
            return Err(LockError::Version(read.version));
        }
        for s in read.sources.iter().map(toml::Spanned::as_ref) {
            if s.commit.len() != 40 || !s.commit.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(LockError::NotACommit {
                    name: s.name.clone(),
                    commit: s.commit.clone(),
                });
            }
        }
        // One entry per repository and revision: of two, `find` would take the first and the
        // other would be silently ignored (a merge that kept both sides, an edit by hand).
        for (i, entry) in read.sources.iter().enumerate() {
            let e = entry.as_ref();
            if let Some(first) = read.sources[..i]
                .iter()
                .find(|f| f.as_ref().git == e.git && f.as_ref().rev == e.rev)
            {
                return Err(LockError::Duplicate(Box::new(Duplicate::new(
                    text,
                    entry.span(),
                    first.span(),
                    e,
                ))));
            }
        }
        Ok(LockFile {
            version: read.version,
            sources: read
                .sources
                .into_iter()
                .map(toml::Spanned::into_inner)
                .collect(),
        })
    }

    /// The entry for a repository and revision.
    pub fn find(&self, git: &str, rev: &str) -> Option<&Locked> {
        self.sources.iter().find(|s| s.git == git && s.rev == rev)
    }

    /// Adds an entry, replacing the one of the same repository and revision.
    pub fn upsert(&mut self, entry: Locked) {
        self.sources
            .retain(|s| !(s.git == entry.git && s.rev == entry.rev));
        self.sources.push(entry);
        self.sources
            .sort_by(|a, b| (&a.name, &a.git, &a.rev).cmp(&(&b.name, &b.git, &b.rev)));
    }

    /// Removes the entries of a repository (every revision); returns whether any was there.
    pub fn remove(&mut self, git: &str) -> bool {
        let before = self.sources.len();
        self.sources.retain(|s| s.git != git);
        self.sources.len() != before
    }

    /// The file's text.
    pub fn render(&self) -> Result<String, LockError> {
        let body = toml::to_string(self).map_err(LockError::Render)?;
        Ok(format!(
            "# ralph-flow.lock: the git presets of the workflows in this directory, pinned to a\n\
             # commit and a content hash. Written by ralph-flow; commit it with your workflows.\n\
             {body}"
        ))
    }
}

/// The lockfile of a directory.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(LOCK_NAME)
}

/// Reads the lockfile of a directory; a missing one is empty.
pub fn read(dir: &Path) -> Result<LockFile, PresetError> {
    let path = path_in(dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => LockFile::parse(&text).map_err(|source| PresetError::Lockfile {
            path: crate::fs::relative(&path),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LockFile {
            version: VERSION,
            sources: Vec::new(),
        }),
        Err(source) => Err(PresetError::Io(crate::fs::IoFailure::new(
            "read", path, source,
        ))),
    }
}

/// Writes the lockfile of a directory atomically (a temporary file renamed over it).
pub fn write(dir: &Path, lock: &LockFile) -> Result<(), PresetError> {
    let path = path_in(dir);
    let text = lock.render().map_err(|source| PresetError::Lockfile {
        path: crate::fs::relative(&path),
        source,
    })?;
    let tmp = dir.join(format!(".{LOCK_NAME}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            PresetError::Io(crate::fs::IoFailure::new("write", path, source))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, rev: &str) -> Locked {
        Locked {
            name: name.into(),
            git: "../presets".into(),
            rev: rev.into(),
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            hash: "sha256:00".into(),
        }
    }

    #[test]
    fn round_trips_and_replaces_by_repository_and_revision() {
        let mut lock = LockFile {
            version: VERSION,
            sources: vec![],
        };
        lock.upsert(entry("team", "v1"));
        lock.upsert(entry("team", "v2"));
        let mut newer = entry("team", "v1");
        newer.hash = "sha256:11".into();
        lock.upsert(newer.clone());
        assert_eq!(lock.sources.len(), 2);
        let back = LockFile::parse(&lock.render().expect("renders")).expect("parses");
        assert_eq!(back, lock);
        assert_eq!(back.find("../presets", "v1"), Some(&newer));
        assert!(back.find("../presets", "v3").is_none());
    }

    #[test]
    fn refuses_a_source_pinned_twice_naming_the_line() {
        let mut lock = LockFile {
            version: VERSION,
            sources: vec![entry("team", "v1"), entry("other", "v2")],
        };
        let text = lock.render().expect("renders");
        assert!(LockFile::parse(&text).is_ok());
        // The same repository and revision again (as a merge that kept both sides leaves it).
        let mut twice = entry("team", "v1");
        twice.commit = "89abcdef0123456789abcdef0123456789abcdef".into();
        lock.sources.push(twice);
        let text = lock.render().expect("renders");
        let third = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim() == "[[source]]")
            .map(|(i, _)| i + 1)
            .nth(2)
            .expect("three entries");
        let first = text
            .lines()
            .position(|l| l.trim() == "[[source]]")
            .expect("an entry")
            + 1;
        let e = LockFile::parse(&text).expect_err("a source pinned twice");
        let msg = e.to_string();
        assert!(msg.contains(&format!("line {third}")), "{msg}");
        assert!(msg.contains(&format!("line {first}")), "{msg}");
        assert!(
            msg.contains("`team`") && msg.contains("`../presets`") && msg.contains("`v1`"),
            "{msg}"
        );
        assert!(msg.contains("presets fetch"), "{msg}");
    }

    #[test]
    fn refuses_bad_versions_and_commits() {
        assert!(LockFile::parse("version = 2").is_err());
        let bad = "version = 1\n[[source]]\nname='a'\ngit='x'\nrev='v'\ncommit='abc'\nhash='h'\n";
        assert!(LockFile::parse(bad).is_err_and(|e| e.to_string().contains("40-digit")));
        assert!(LockFile::parse("version = 1\nsurprise = 1").is_err());
    }
}
