//! The documents the editor has open, their unsaved text, and the file system the checker
//! reads through while the server runs: open documents first, then the disk (and the presets
//! built into the binary).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lsp_types::Uri;

use super::lines::LineIndex;
use crate::fs::{FileSystem, RealFs, normalize};

/// One open document.
pub(crate) struct Doc {
    pub(crate) text: Arc<str>,
    pub(crate) version: i32,
    pub(crate) lines: LineIndex,
    /// The URI as the client wrote it (answers about the document use it).
    pub(crate) uri: Uri,
}

impl Doc {
    pub(crate) fn new(uri: Uri, text: String, version: i32) -> Doc {
        let lines = LineIndex::new(&text);
        Doc {
            text: text.into(),
            version,
            lines,
            uri,
        }
    }

    /// Replaces the whole text.
    pub(crate) fn set(&mut self, text: String, version: i32) {
        self.lines = LineIndex::new(&text);
        self.text = text.into();
        self.version = version;
    }
}

/// The open documents, by normalized path.
#[derive(Default)]
pub(crate) struct Docs {
    pub(crate) open: HashMap<PathBuf, Doc>,
}

impl Docs {
    pub(crate) fn get(&self, path: &Path) -> Option<&Doc> {
        self.open.get(path)
    }

    /// The text of a file: the open document's, or the file system's.
    pub(crate) fn text(&self, path: &Path) -> Option<Arc<str>> {
        match self.open.get(path) {
            Some(d) => Some(d.text.clone()),
            None => RealFs.read(path).ok().map(Arc::from),
        }
    }
}

/// The file system the checker reads while the server runs: what the editor holds first.
pub(crate) struct Overlay<'a> {
    pub(crate) docs: &'a Docs,
}

impl FileSystem for Overlay<'_> {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        match self.docs.open.get(&normalize(path)) {
            Some(d) => Ok(d.text.to_string()),
            None => RealFs.read(path),
        }
    }

    fn exists(&self, path: &Path) -> bool {
        self.docs.open.contains_key(&normalize(path)) || RealFs.exists(path)
    }

    fn list(&self, dir: &Path) -> Vec<PathBuf> {
        let dir = normalize(dir);
        let mut out = RealFs.list(&dir);
        for p in self.docs.open.keys() {
            if p.parent() == Some(dir.as_path()) && !out.contains(p) {
                out.push(p.clone());
            }
        }
        out.sort();
        out
    }
}

/// The path of a `file:` URI (percent-decoded); `None` for any other scheme.
pub(crate) fn uri_path(uri: &Uri) -> Option<PathBuf> {
    let s = uri.as_str();
    let rest = s.strip_prefix("file://")?;
    // `file://host/path`: only an empty host or `localhost` is this machine.
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let decoded = percent_encoding::percent_decode_str(rest)
        .decode_utf8()
        .ok()?;
    Some(normalize(Path::new(decoded.as_ref())))
}

/// The `file:` URI of an absolute path.
pub(crate) fn path_uri(path: &Path) -> Option<Uri> {
    use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
    /// What a path segment of a URI cannot hold as is (RFC 3986), `/` kept.
    const PATH: &AsciiSet = &CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'[')
        .add(b']')
        .add(b'\\')
        .add(b'^')
        .add(b'`')
        .add(b'{')
        .add(b'|')
        .add(b'}');
    let s = path.to_str()?;
    if !s.starts_with('/') {
        return None;
    }
    format!("file://{}", utf8_percent_encode(s, PATH))
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_uris_round_trip() {
        for p in ["/tmp/a b/w.toml", "/x/é#?%[1].kdl", "/plain/p.md.j2"] {
            let uri = path_uri(Path::new(p)).unwrap_or_else(|| panic!("no uri for {p}"));
            assert!(uri.as_str().starts_with("file:///"), "{}", uri.as_str());
            assert_eq!(uri_path(&uri).as_deref(), Some(Path::new(p)));
        }
        let other: Uri = "untitled:Untitled-1"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(uri_path(&other), None);
    }
}
