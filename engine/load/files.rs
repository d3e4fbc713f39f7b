//! Reading the workflow's files into the source map (16 MiB at most), prompt files looked up
//! along the prompt search path, and a fetched preset kept to the files of its own checkout.

use std::path::{Path, PathBuf};

use super::Loader;
use crate::diag::{Code, Diagnostic};
use crate::fs::{MAX_FILE_BYTES, normalize, relative};
use crate::preset;
use crate::source::{FileId, Span, Spanned};

impl Loader<'_> {
    /// The file a stage's `prompt_file` names: the first of `RALPH_FLOW_PROMPT_PATH`'s
    /// directories, then the workflow's `prompt_path`, that has it; else the file relative to
    /// the file that names it.
    pub fn prompt_file(&self, prompt_path: &[Spanned<String>], pf: &Spanned<String>) -> PathBuf {
        let name = Path::new(&pf.value);
        if name.is_absolute() {
            return name.to_path_buf();
        }
        let dirs: Vec<PathBuf> = self
            .prompt_dirs
            .iter()
            .cloned()
            .chain(prompt_path.iter().filter_map(|d| {
                let dir = normalize(&crate::fs::base_dir(self.sources, d.span).join(&d.value));
                match self.checkout_of(d.span) {
                    // A fetched preset's search directory must be its own.
                    Some(root) => dir.starts_with(&root).then_some(dir),
                    None => {
                        self.trusted_dirs.borrow_mut().push(dir.clone());
                        Some(dir)
                    }
                }
            }))
            .collect();
        for dir in dirs {
            let candidate = normalize(&dir.join(name));
            if self.fs.exists(&candidate) {
                return candidate;
            }
        }
        crate::fs::base_dir(self.sources, pf.span).join(name)
    }

    /// Reads a file into the source map, reporting a read failure at `from` with `code`.
    pub fn read(
        &mut self,
        path: &Path,
        from: Option<Span>,
        code: Code,
        what: &str,
    ) -> Option<FileId> {
        let shown = relative(&normalize(path));
        let path = shown.as_path();
        if let Some(why) = from.and_then(|f| self.escapes_checkout(f, path)) {
            self.diags.push(
                Diagnostic::new(code, from, format!("{what} `{}` {why}", path.display()))
                    .label("named by a preset fetched from a git source")
                    .help("a fetched preset may read only the files of its own repository (and prompts the workflows using it provide); fix the preset, or ask its owners to"),
            );
            return None;
        }
        if let Some(id) = self.sources.find(path) {
            return Some(id);
        }
        match self.fs.read(path) {
            Ok(text) if text.len() > MAX_FILE_BYTES => {
                self.diags.push(
                    Diagnostic::new(
                        code,
                        from,
                        format!("{what} `{}` is larger than 16 MiB", path.display()),
                    )
                    .help("split it into smaller files"),
                );
                None
            }
            Ok(text) => Some(self.sources.add(path, text)),
            Err(err) => {
                self.diags.push(
                    Diagnostic::new(
                        code,
                        from,
                        format!("cannot read {what} `{}`: {err}", path.display()),
                    )
                    .label("this file")
                    .help("check the path; it is relative to the file that names it"),
                );
                None
            }
        }
    }

    /// The checkout of a fetched git source that the file of a span lies in, if it does.
    fn checkout_of(&self, span: Span) -> Option<PathBuf> {
        let file = normalize(&std::path::absolute(&self.sources.get(span.file).path).ok()?);
        let checkouts = normalize(&std::path::absolute(preset::git::checkouts_dir()).ok()?);
        let commit = file.strip_prefix(&checkouts).ok()?.components().next()?;
        Some(checkouts.join(commit))
    }

    /// Why a file named by a fetched preset may not be read: it lies outside the preset's
    /// checkout (by an absolute path, by `..`, or through a symbolic link), and is neither a
    /// built-in preset file nor in a prompt directory that a workflow of the user names.
    fn escapes_checkout(&self, from: Span, path: &Path) -> Option<String> {
        let root = self.checkout_of(from)?;
        if crate::fs::is_builtin(path) {
            return None;
        }
        let absolute = normalize(&std::path::absolute(path).ok()?);
        let trusted = self
            .prompt_dirs
            .iter()
            .chain(self.trusted_dirs.borrow().iter())
            .filter_map(|d| std::path::absolute(d).ok())
            .any(|d| absolute.starts_with(normalize(&d)));
        if trusted {
            return None;
        }
        if !absolute.starts_with(&root) {
            return Some("lies outside the preset's checkout".into());
        }
        // Inside by its name; a symbolic link may still lead out.
        match (absolute.canonicalize(), root.canonicalize()) {
            (Ok(real), Ok(root)) if !real.starts_with(&root) => Some(format!(
                "is a symbolic link that leads outside the preset's checkout (to {})",
                real.display()
            )),
            _ => None,
        }
    }
}
