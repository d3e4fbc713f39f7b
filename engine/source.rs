//! Source files and byte spans: every diagnostic points into one of these.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Identifies one file held by a [`Sources`] map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u32);

/// A byte range inside one source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    /// Builds a span from a byte range, clamping offsets that do not fit in 32 bits.
    pub fn new(file: FileId, range: std::ops::Range<usize>) -> Self {
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Span {
            file,
            start: clamp(range.start),
            end: clamp(range.end.max(range.start)),
        }
    }

    /// Returns the byte range of the span.
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }

    /// Returns the number of bytes covered.
    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }

    /// Tells whether the span covers no bytes.
    pub fn is_empty(self) -> bool {
        self.end == self.start
    }
}

/// A value together with the place in the source where it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

impl<T> Spanned<T> {
    /// Wraps a value with its span.
    pub fn new(value: T, span: Span) -> Self {
        Spanned { value, span }
    }
}

impl<T> std::ops::Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// One file read by the engine: a workflow, an included file, a prompt or a schema.
#[derive(Debug)]
pub struct SourceFile {
    pub path: PathBuf,
    pub text: Arc<str>,
}

impl SourceFile {
    /// Converts a byte offset into a one-based line and column (in characters).
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let mut start = offset;
        while !self.text.is_char_boundary(start) {
            start -= 1;
        }
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }
}

/// Holds every source file read while loading, checking and compiling a workflow.
#[derive(Debug, Default)]
pub struct Sources {
    files: Vec<SourceFile>,
}

impl Sources {
    /// Creates an empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a file and returns its id; adding the same path twice returns the first id.
    pub fn add(&mut self, path: impl Into<PathBuf>, text: impl Into<Arc<str>>) -> FileId {
        let path = path.into();
        if let Some(id) = self.find(&path) {
            return id;
        }
        let id = FileId(u32::try_from(self.files.len()).unwrap_or(u32::MAX));
        self.files.push(SourceFile {
            path,
            text: text.into(),
        });
        id
    }

    /// Finds the id of a file already added.
    pub fn find(&self, path: &Path) -> Option<FileId> {
        self.files
            .iter()
            .position(|f| f.path == path)
            .and_then(|i| u32::try_from(i).ok())
            .map(FileId)
    }

    /// Returns the file with the given id.
    ///
    /// Ids only come from [`Sources::add`], so the lookup cannot fail for ids of this map.
    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    /// Names where a span starts, as `path:line:column`.
    pub fn locate(&self, span: Span) -> String {
        let file = self.get(span.file);
        let (line, col) = file.line_col(span.start as usize);
        format!("{}:{line}:{col}", file.path.display())
    }

    /// Returns the text a span covers.
    pub fn slice(&self, span: Span) -> &str {
        let text = &self.get(span.file).text;
        text.get(span.range()).unwrap_or("")
    }

    /// Iterates over all files.
    pub fn iter(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| (FileId(i as u32), f))
    }
}
