//! Workflow references resolved to paths (a path as written, a preset through the search
//! roots, `SOURCE:NAME` through a declared git source), and a git source's cached copy
//! verified against its lockfile.

use std::path::{Path, PathBuf};

use super::Loader;
use crate::diag::{Code, Diagnostic};
use crate::fs::{normalize, relative};
use crate::preset::{self, DeclaredSource, MissingSource, Reference, lock};
use crate::source::{Span, Spanned};

impl Loader<'_> {
    /// Resolves a workflow reference written in a file that declares `sources`: a path
    /// relative to that file, or a preset. Reports what cannot be resolved.
    pub fn resolve(&mut self, r: &Spanned<String>, sources: &[DeclaredSource]) -> Option<PathBuf> {
        let dir = crate::fs::base_dir(self.sources, r.span);
        match preset::parse_reference(&r.value) {
            Reference::Path(p) => Some(dir.join(p)),
            Reference::Invalid => {
                self.diags.push(
                    Diagnostic::new(
                        Code::UnknownPreset,
                        r.span,
                        format!(
                            "`{}` is neither a workflow file nor a preset name",
                            r.value
                        ),
                    )
                    .label("not a path nor a preset")
                    .help("a path ends in `.toml` or `.kdl`; a preset is `NAME` or `SOURCE:NAME` (letters, digits, `-`, `_`)"),
                );
                None
            }
            Reference::Preset { source: None, name } => {
                if let Some((path, _)) = preset::find(self.fs, &self.roots, name) {
                    return Some(path);
                }
                let names = preset::all_names(self.fs, &self.roots);
                self.diags.push(
                    Diagnostic::new(
                        Code::UnknownPreset,
                        r.span,
                        format!("there is no preset `{name}`"),
                    )
                    .label("unknown preset")
                    .suggest(name, names.iter().map(String::as_str))
                    .help_or(format!(
                        "`ralph-flow presets` lists them ({}); a path must end in `.toml` or `.kdl`",
                        names.join(", ")
                    )),
                );
                None
            }
            Reference::Preset {
                source: Some(src),
                name,
            } => {
                let (root, _) = self.git_root(src, sources, r.span)?;
                if let Some(path) = preset::find_in(self.fs, &root, name) {
                    return Some(path);
                }
                let names: Vec<String> = preset::list_in(self.fs, &root)
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect();
                self.diags.push(
                    Diagnostic::new(
                        Code::UnknownPreset,
                        r.span,
                        format!("source `{src}` has no preset `{name}`"),
                    )
                    .label("unknown preset")
                    .suggest(name, names.iter().map(String::as_str))
                    .help_or(format!(
                        "its presets: {}",
                        if names.is_empty() {
                            "none (it holds no workflows/NAME.toml)".to_string()
                        } else {
                            names.join(", ")
                        }
                    )),
                );
                None
            }
        }
    }

    /// The preset directory of a declared git source and its lockfile entry, verified
    /// against each other; what is wrong is reported as diagnostics.
    pub fn source_root(&mut self, d: &DeclaredSource) -> Option<(PathBuf, lock::Locked)> {
        let name = d.source.name.value.clone();
        self.git_root(&name, std::slice::from_ref(d), d.source.name.span)
    }

    /// The preset directory of a git source and its lockfile entry, once its cached copy
    /// matches the lockfile.
    /// `sources` are those the naming file sees: its own, then its bases' (each with the
    /// directory of the file that declares it, where its lockfile is).
    fn git_root(
        &mut self,
        name: &str,
        sources: &[DeclaredSource],
        at: Span,
    ) -> Option<(PathBuf, lock::Locked)> {
        let Some(declared) = sources
            .iter()
            .find(|s| s.source.name.value == name)
            .cloned()
        else {
            self.diags.push(
                Diagnostic::new(
                    Code::UnknownPreset,
                    at,
                    format!("this file declares no source `{name}`"),
                )
                .label("unknown source")
                .suggest(name, sources.iter().map(|s| s.source.name.value.as_str()))
                .help_or_syntax(
                    format!(
                        "declare it in this file: [sources.{name}] with `git` (a URL or a path) and `rev` (a tag, branch or commit)"
                    ),
                    format!(
                        "declare it in this file: source \"{name}\" git=\"URL or path\" rev=\"tag, branch or commit\""
                    ),
                ),
            );
            return None;
        };
        let (src, dir) = (declared.source, declared.decl_dir);
        let dir = dir.as_path();
        if let Some(p) = &src.path {
            let rel = Path::new(&p.value);
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                self.diags.push(
                    Diagnostic::new(
                        Code::InvalidValue,
                        p.span,
                        format!("`{}` leaves the repository", p.value),
                    )
                    .help("`path` is a directory inside the repository, such as `presets`"),
                );
                return None;
            }
        }
        let lock_path = lock::path_in(dir);
        let lock = if self.fs.exists(&lock_path) {
            let file = self.read(&lock_path, Some(src.span), Code::PresetSource, "lockfile")?;
            match lock::LockFile::parse(&self.sources.get(file).text) {
                Ok(l) => l,
                // Said where the lockfile has it, both entries shown.
                Err(lock::LockError::Duplicate(d)) => {
                    self.diags.push(
                        Diagnostic::new(
                            Code::PresetSource,
                            Span::new(file, d.at.clone()),
                            d.what(),
                        )
                        .label("pinned again here")
                        .related(Span::new(file, d.first.clone()), "first pinned here")
                        .help(lock::Duplicate::ADVICE),
                    );
                    return None;
                }
                Err(e) => {
                    self.diags.push(
                        Diagnostic::new(
                            Code::PresetSource,
                            src.span,
                            format!("{} is not valid: {e}", relative(&lock_path).display()),
                        )
                        .help("fix it, or delete it and run `ralph-flow presets fetch` to pin every source again"),
                    );
                    return None;
                }
            }
        } else {
            lock::LockFile::default()
        };
        let entry = lock.find(&src.git.value, &src.rev.value).cloned();
        // Not in the lockfile, or not in the cache: what `presets fetch` and `run` fetch.
        let mut not_fetched = |locked: Option<lock::Locked>, message: String, label| {
            self.missing.push(MissingSource {
                declared: DeclaredSource {
                    decl_dir: dir.to_path_buf(),
                    source: src.clone(),
                },
                locked,
            });
            self.diags.push(
                Diagnostic::new(Code::PresetSource, src.span, message)
                    .label(label)
                    .help("run `ralph-flow presets fetch WORKFLOW` to fetch it and pin it in ralph-flow.lock (`ralph-flow run` does this by itself)"),
            );
        };
        let Some(entry) = entry else {
            let message = format!(
                "source `{name}` (`{}` at `{}`) is not fetched yet",
                src.git.value, src.rev.value
            );
            not_fetched(None, message, "not in ralph-flow.lock");
            return None;
        };
        let checkout = preset::git::checkout_dir(&entry.commit);
        if !checkout.is_dir() {
            let message = format!(
                "source `{name}` is pinned to commit {} but the cache ({}) has no copy of it",
                entry.commit,
                preset::cache_dir().display()
            );
            not_fetched(Some(entry), message, "not in the cache");
            return None;
        }
        let verdict = match self.verified.iter().find(|(d, _)| *d == checkout) {
            Some((_, v)) => v.clone(),
            None => {
                let v = match preset::tree_hash(&checkout) {
                    Ok(h) if h == entry.hash => None,
                    Ok(h) => Some(format!(
                        "the cached copy of source `{name}` ({}) does not match ralph-flow.lock: its content hash is {h}, the lockfile says {}",
                        checkout.display(),
                        entry.hash
                    )),
                    Err(e) => Some(format!(
                        "cannot read the cached copy of source `{name}` ({}): {e}",
                        checkout.display()
                    )),
                };
                self.verified.push((checkout.clone(), v.clone()));
                v
            }
        };
        if let Some(message) = verdict {
            self.diags.push(
                Diagnostic::new(Code::PresetSource, src.span, message)
                    .label("verification failed")
                    .help(format!(
                        "the cache or the lockfile was changed by hand: delete {} and run `ralph-flow presets fetch WORKFLOW`; to pin a new commit, `ralph-flow presets update WORKFLOW`",
                        checkout.display()
                    )),
            );
            return None;
        }
        let root = match &src.path {
            Some(p) => normalize(&checkout.join(&p.value)),
            None => checkout,
        };
        Some((root, entry))
    }
}
