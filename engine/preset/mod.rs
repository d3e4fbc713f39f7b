//! Presets: workflows shared by name.
//!
//! A workflow names another one (in `extends`, `include` or a subflow's `workflow`) either by
//! a path, which ends in `.toml` or `.kdl`, or by a preset reference:
//! - `NAME` is looked up in the preset directories ([`search_roots`]): the ones listed in
//!   `RALPH_FLOW_PRESET_PATH`, then the user's (`~/.config/ralph-flow/presets`), then the
//!   presets built into the binary;
//! - `SOURCE:NAME` is looked up in a git repository the naming file declares under
//!   `[sources.SOURCE]`, pinned by `ralph-flow.lock` beside that file and fetched into the
//!   cache ([`git`]).
//!
//! A preset directory holds `workflows/NAME.toml` (or `.kdl`), or `NAME.toml` at its top, with
//! its prompts and schemas wherever its files say (the built-in ones: `prompts/NAME/` and
//! `schemas/`).

mod error;
pub mod git;
pub mod lock;

pub use error::{LockError, PresetError};

use std::path::{Path, PathBuf};

use crate::diag::{Code, Diagnostic};
use crate::fs::{BUILTIN_ROOT, FileSystem};
use crate::model::Source;

/// A git source declared by a loaded file.
#[derive(Clone, Debug)]
pub struct DeclaredSource {
    /// The directory of the file that declares it: where its lockfile is, and what a `git`
    /// path is relative to.
    pub decl_dir: PathBuf,
    pub source: Source,
}

impl DeclaredSource {
    /// The repository to fetch: `git` as written, resolved against the declaring directory.
    pub fn url(&self) -> String {
        git::resolve_url(&self.source.git.value, &self.decl_dir)
    }

    /// What tells sources apart: one lockfile, one repository, one revision.
    pub fn key(&self) -> (PathBuf, String, String) {
        (
            self.decl_dir.clone(),
            self.source.git.value.clone(),
            self.source.rev.value.clone(),
        )
    }
}

/// A git source that a loaded file names but that is not in the cache (or not locked yet):
/// what `presets fetch` and `run` fetch before loading again.
#[derive(Clone, Debug)]
pub struct MissingSource {
    pub declared: DeclaredSource,
    /// The lockfile's entry, when the source is pinned but not in the cache.
    pub locked: Option<lock::Locked>,
}

/// How a workflow reference is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference<'a> {
    /// A file, relative to the file that names it.
    Path(&'a str),
    /// A preset by name, from a declared source or from the preset directories.
    Preset {
        source: Option<&'a str>,
        name: &'a str,
    },
    /// Neither a path (no `.toml`/`.kdl` ending) nor a valid preset name.
    Invalid,
}

/// Reads a workflow reference: a path ends in `.toml` or `.kdl`; anything else is a preset
/// name (`spider`) or a preset of a source (`team:spider`).
pub fn parse_reference(s: &str) -> Reference<'_> {
    if s.ends_with(".toml") || s.ends_with(".kdl") {
        return Reference::Path(s);
    }
    let (source, name) = match s.split_once(':') {
        Some((src, name)) => (Some(src), name),
        None => (None, s),
    };
    if !is_name(name) || source.is_some_and(|s| !is_name(s)) {
        return Reference::Invalid;
    }
    Reference::Preset { source, name }
}

/// Tells whether a preset or source name is valid: letters, digits, `-`, `_` and `.`, not
/// starting with `.`.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Where a preset directory comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Named by `RALPH_FLOW_PRESET_PATH` or the user's preset directory.
    Installed,
    /// Built into the binary.
    Builtin,
    /// A git source: its name, URL and the commit it is pinned to.
    Git {
        source: String,
        git: String,
        commit: String,
    },
}

/// A directory of presets.
#[derive(Clone, Debug)]
pub struct Root {
    pub dir: PathBuf,
    pub origin: Origin,
}

/// The preset directories searched for a bare preset name, first match wins: each directory
/// of `RALPH_FLOW_PRESET_PATH` (`:`-separated), the user's preset directory, the built-in
/// presets.
pub fn search_roots() -> Vec<Root> {
    let mut roots = Vec::new();
    if let Some(path) = std::env::var_os("RALPH_FLOW_PRESET_PATH") {
        for dir in std::env::split_paths(&path) {
            if !dir.as_os_str().is_empty() {
                roots.push(Root {
                    dir: crate::fs::normalize(&dir),
                    origin: Origin::Installed,
                });
            }
        }
    }
    if let Some(dir) = user_presets_dir() {
        roots.push(Root {
            dir,
            origin: Origin::Installed,
        });
    }
    roots.push(Root {
        dir: PathBuf::from(BUILTIN_ROOT),
        origin: Origin::Builtin,
    });
    roots
}

/// `$VAR` when set and not empty, else `$HOME/home_sub`.
fn xdg_dir(var: &str, home_sub: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(home_sub))
        })
}

/// The user's preset directory: `$XDG_CONFIG_HOME/ralph-flow/presets`, else
/// `~/.config/ralph-flow/presets`.
pub fn user_presets_dir() -> Option<PathBuf> {
    Some(
        xdg_dir("XDG_CONFIG_HOME", ".config")?
            .join("ralph-flow")
            .join("presets"),
    )
}

/// The user's config file: `$XDG_CONFIG_HOME/ralph-flow/config.toml`, else
/// `~/.config/ralph-flow/config.toml`.
pub fn user_config_file() -> Option<PathBuf> {
    Some(
        xdg_dir("XDG_CONFIG_HOME", ".config")?
            .join("ralph-flow")
            .join("config.toml"),
    )
}

/// The cache of fetched git presets: `$RALPH_FLOW_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/ralph-flow`, else `~/.cache/ralph-flow`, else `.ralph-flow/cache`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RALPH_FLOW_CACHE_DIR").filter(|v| !v.is_empty()) {
        return crate::fs::normalize(Path::new(&dir));
    }
    xdg_dir("XDG_CACHE_HOME", ".cache")
        .map(|d| d.join("ralph-flow"))
        .unwrap_or_else(|| crate::fs::normalize(Path::new(".ralph-flow/cache")))
}

/// The candidate files of preset `name` in a preset directory, in the order they are tried.
fn candidates(dir: &Path, name: &str) -> [PathBuf; 4] {
    [
        dir.join("workflows").join(format!("{name}.toml")),
        dir.join("workflows").join(format!("{name}.kdl")),
        dir.join(format!("{name}.toml")),
        dir.join(format!("{name}.kdl")),
    ]
}

/// Finds preset `name` in a preset directory.
pub fn find_in(fs: &dyn FileSystem, dir: &Path, name: &str) -> Option<PathBuf> {
    candidates(dir, name).into_iter().find(|p| fs.exists(p))
}

/// Finds preset `name` in the search roots; returns its file and the root it came from.
pub fn find(fs: &dyn FileSystem, roots: &[Root], name: &str) -> Option<(PathBuf, Root)> {
    roots
        .iter()
        .find_map(|r| find_in(fs, &r.dir, name).map(|p| (p, r.clone())))
}

/// The presets of one directory: names and files, sorted by name; a name with both a `.toml`
/// and a `.kdl` file is listed once, with the file [`find_in`] picks.
pub fn list_in(fs: &dyn FileSystem, dir: &Path) -> Vec<(String, PathBuf)> {
    let mut names: Vec<String> = Vec::new();
    for sub in [dir.join("workflows"), dir.to_path_buf()] {
        for file in fs.list(&sub) {
            let Some(fname) = file.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            let stem = fname
                .strip_suffix(".toml")
                .or_else(|| fname.strip_suffix(".kdl"));
            if let Some(stem) = stem.filter(|s| is_name(s)) {
                names.push(stem.to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| find_in(fs, dir, &n).map(|p| (n, p)))
        .collect()
}

/// Every preset name of the search roots (for suggestions).
pub fn all_names(fs: &dyn FileSystem, roots: &[Root]) -> Vec<String> {
    let mut out: Vec<String> = roots
        .iter()
        .flat_map(|r| list_in(fs, &r.dir).into_iter().map(|(n, _)| n))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A SHA-256 over every file below `dir` (paths and contents, in path order), written
/// `sha256:HEX`: the content hash the lockfile records. A symbolic link that leads outside
/// `dir` is an error: what it points to could change after pinning without the hash
/// seeing it.
pub fn tree_hash(dir: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    let root = dir.canonicalize()?;
    let mut h = Sha256::new();
    for rel in files {
        let full = dir.join(&rel);
        let meta = std::fs::symlink_metadata(&full)?;
        h.update(rel.as_bytes());
        h.update([0]);
        if meta.file_type().is_symlink() {
            if let Ok(real) = full.canonicalize() {
                if !real.starts_with(&root) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "`{rel}` is a symbolic link that leads outside the repository (to {}); a preset repository may link only to its own files",
                            real.display()
                        ),
                    ));
                }
            }
            h.update(b"link:");
            h.update(std::fs::read_link(&full)?.to_string_lossy().as_bytes());
        } else {
            let bytes = std::fs::read(&full)?;
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(&bytes);
        }
        h.update([0]);
    }
    Ok(format!("sha256:{:x}", h.finalize()))
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let ty = entry.file_type()?;
        if ty.is_dir() {
            walk(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// What fetching did for one source.
#[derive(Clone, Debug)]
pub struct Synced {
    pub name: String,
    pub git: String,
    pub rev: String,
    pub commit: String,
    /// The lockfile that pins it.
    pub lock: PathBuf,
    /// `pinned` (newly locked), `fetched` (the locked commit, fetched again) or `updated`
    /// (pinned anew by `update`).
    pub action: &'static str,
}

/// Pins a commit in the lockfile of `dir`, keeping the other entries.
pub fn pin(
    dir: &Path,
    name: &str,
    git: &str,
    rev: &str,
    f: &git::Fetched,
) -> Result<(), PresetError> {
    let mut l = lock::read(dir)?;
    l.upsert(lock::Locked {
        name: name.to_string(),
        git: git.to_string(),
        rev: rev.to_string(),
        commit: f.commit.clone(),
        hash: f.hash.clone(),
    });
    lock::write(dir, &l)
}

/// Fetches one source into the cache. With `locked`, its pinned commit, whose content must
/// still hash to what the lockfile says; without, what its `rev` names now, pinned in the
/// lockfile of the file that declares it. Errors point at the source's declaration.
pub fn fetch_one(
    d: &DeclaredSource,
    locked: Option<&lock::Locked>,
    new_action: &'static str,
) -> Result<Synced, Box<Diagnostic>> {
    let s = &d.source;
    let url = d.url();
    let error = |message: String| {
        Box::new(
            Diagnostic::new(Code::PresetSource, s.span, message)
                .help("check the source's `git` and `rev`, and that git can reach it"),
        )
    };
    let f = git::fetch(&url, &s.rev.value, locked.map(|l| l.commit.as_str()))
        .map_err(|e| error(crate::diag::error_chain(&e)))?;
    let action = match locked {
        Some(l) if f.hash != l.hash => {
            return Err(error(format!(
                "commit {} of {url} has the content hash {}, but {} says {}: the lockfile was edited, or the repository's history rewritten; check it, then `ralph-flow presets update`",
                l.commit,
                f.hash,
                lock::path_in(&d.decl_dir).display(),
                l.hash
            )));
        }
        Some(_) => "fetched",
        // The lockfile of a fetched preset is part of its content: it cannot be written.
        None if d.decl_dir.starts_with(git::checkouts_dir()) => {
            return Err(error(format!(
                "a fetched preset ({}) declares the source `{}` but pins it in no ralph-flow.lock of its own; its authors must commit one (`ralph-flow presets fetch` in their repository)",
                d.decl_dir.display(),
                s.name.value
            )));
        }
        None => {
            pin(&d.decl_dir, &s.name.value, &s.git.value, &s.rev.value, &f)
                .map_err(|e| error(crate::diag::error_chain(&e)))?;
            new_action
        }
    };
    Ok(Synced {
        name: s.name.value.clone(),
        git: s.git.value.clone(),
        rev: s.rev.value.clone(),
        commit: f.commit,
        lock: lock::path_in(&d.decl_dir),
        action,
    })
}

/// Fetches what a load found missing (each source once), pinning new sources. One round:
/// the presets fetched may name sources of their own, found by loading again.
pub fn fetch_missing(missing: &[MissingSource]) -> Result<Vec<Synced>, Box<Diagnostic>> {
    let mut seen = Vec::new();
    let mut done = Vec::new();
    for m in missing {
        let key = m.declared.key();
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        done.push(fetch_one(&m.declared, m.locked.as_ref(), "pinned")?);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_paths_or_names() {
        assert_eq!(parse_reference("base.toml"), Reference::Path("base.toml"));
        assert_eq!(parse_reference("../w/x.kdl"), Reference::Path("../w/x.kdl"));
        assert_eq!(
            parse_reference("spider"),
            Reference::Preset {
                source: None,
                name: "spider"
            }
        );
        assert_eq!(
            parse_reference("team:wiggum-review"),
            Reference::Preset {
                source: Some("team"),
                name: "wiggum-review"
            }
        );
        assert_eq!(parse_reference("a/b"), Reference::Invalid);
        assert_eq!(parse_reference("team:"), Reference::Invalid);
        assert_eq!(parse_reference(""), Reference::Invalid);
    }
}
