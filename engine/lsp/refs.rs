//! What names what in a workflow's files: every stage, param and agent written (defined or
//! referred to), every key with the table it belongs to, every filter, test and helper in a
//! template, and every value that names a file, each with where it is written. Hover,
//! definition, references and rename read this index.
//!
//! The workflow's own files (the file, the files it extends and includes) are read again
//! through the syntax tree, walked with the spec so that each key's table is known; the
//! strings are mapped back to their literals (escapes and all) with
//! [`crate::syntax::strings::map_range`]. The prompt files its stages read are scanned as
//! templates.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::check::filters::{UseKind, code_regions, in_expression, in_template};
use crate::fs::normalize;
use crate::model::{Action, is_ident};
use crate::preset::{self, Reference};
use crate::source::{FileId, Sources, Span};
use crate::spec::{Field, TableSpec, Ty, WORKFLOW};
use crate::syntax::Format;
use crate::syntax::tree::{Table, Value, ValueKind};

use super::analysis::Analysis;
use super::docs::Overlay;

/// What a piece of text names.
#[derive(Clone, Debug)]
pub(crate) enum Sym {
    Stage(String),
    Param(String),
    Agent(String),
    Filter(String),
    Test(String),
    /// A helper called in a template (`read_file(...)`).
    Function(String),
    /// A key of a table.
    Key(&'static TableSpec, &'static Field),
    /// A value that names a file.
    File(FileRef),
}

impl PartialEq for Sym {
    fn eq(&self, other: &Sym) -> bool {
        use Sym::*;
        match (self, other) {
            (Stage(a), Stage(b))
            | (Param(a), Param(b))
            | (Agent(a), Agent(b))
            | (Filter(a), Filter(b))
            | (Test(a), Test(b))
            | (Function(a), Function(b)) => a == b,
            (Key(s, f), Key(t, g)) => std::ptr::eq(*s, *t) && std::ptr::eq(*f, *g),
            (File(a), File(b)) => a == b,
            _ => false,
        }
    }
}

/// A value that names a file, as written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum FileRef {
    PromptFile(String),
    Schema(String),
    /// `extends`, `include` or a subflow's `workflow`: a path or a preset.
    Workflow(String),
}

/// How a stage reference is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// A value or key that is the name alone.
    Plain,
    /// `stages.NAME` in a template or expression (a name with `-` cannot stand there).
    Dotted,
}

/// One name written somewhere.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    /// The file (normalized).
    pub(crate) path: PathBuf,
    /// Exactly the name, in bytes of the file.
    pub(crate) range: Range<usize>,
    pub(crate) sym: Sym,
    /// Where the thing is defined (a stage's id, a param's or an agent's name).
    pub(crate) def: bool,
    pub(crate) form: Form,
}

/// Every name written in a workflow's files.
pub(crate) struct Index {
    pub(crate) items: Vec<Item>,
}

impl Index {
    /// Builds the index of an analysis.
    pub(crate) fn of(a: &Analysis) -> Index {
        let mut b = Builder {
            src: &a.sources,
            items: Vec::new(),
            seen: HashSet::new(),
        };
        for id in own_files(a) {
            b.workflow_file(id);
        }
        let mut prompts: Vec<PathBuf> = a
            .stages
            .iter()
            .filter_map(|s| s.prompt_file.as_ref())
            .map(|p| normalize(p))
            .collect();
        prompts.sort();
        prompts.dedup();
        for p in prompts {
            if let Some(id) = find(&a.sources, &p) {
                let text = a.sources.get(id).text.clone();
                for (range, sym, form) in scan(&text, true) {
                    b.push(&p, range, sym, false, form);
                }
            }
        }
        Index { items: b.items }
    }

    /// The item written at an offset of a file: the narrowest that holds it.
    pub(crate) fn at(&self, path: &Path, offset: usize) -> Option<&Item> {
        self.items
            .iter()
            .filter(|i| i.path == path && i.range.start <= offset && offset <= i.range.end)
            .min_by_key(|i| (i.range.end - i.range.start, !i.def))
    }

    /// Every item that names a stage.
    pub(crate) fn stage_items<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Item> {
        self.items
            .iter()
            .filter(move |i| matches!(&i.sym, Sym::Stage(n) if n == name))
    }
}

/// The id of a file read by an analysis, by its normalized path.
pub(crate) fn find(src: &Sources, path: &Path) -> Option<FileId> {
    src.find(path).or_else(|| {
        src.iter()
            .find(|(_, f)| normalize(&f.path) == path)
            .map(|(id, _)| id)
    })
}

/// The workflow's own files: the file, and the files it extends and includes (not its
/// subflows, whose stages are theirs).
fn own_files(a: &Analysis) -> Vec<FileId> {
    let mut out = Vec::new();
    let Some(root) = find(&a.sources, &a.root) else {
        return out;
    };
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        if out.contains(&id) {
            continue;
        }
        out.push(id);
        let file = a.sources.get(id);
        let path = normalize(&file.path);
        let table = parse(id, &file.text, &path);
        let mut named: Vec<String> = Vec::new();
        match table.get("extends").map(|v| &v.kind) {
            Some(ValueKind::Str(s)) => named.push(s.clone()),
            Some(ValueKind::Table(t)) => {
                if let Some(s) = t.get("workflow").and_then(Value::as_str) {
                    named.push(s.to_string());
                }
            }
            _ => {}
        }
        match table.get("include").map(|v| &v.kind) {
            Some(ValueKind::Str(s)) => named.push(s.clone()),
            Some(ValueKind::Array(items)) => {
                named.extend(items.iter().filter_map(Value::as_str).map(str::to_string));
            }
            _ => {}
        }
        for n in named {
            if let Some(p) = resolve_workflow(a, &path, &n) {
                if let Some(other) = find(&a.sources, &p) {
                    todo.push(other);
                }
            }
        }
    }
    out
}

/// The file a workflow reference written in `from` names: a path relative to it, a preset
/// of the search roots, or a git preset's cached copy (among the files the checker read).
pub(crate) fn resolve_workflow(a: &Analysis, from: &Path, written: &str) -> Option<PathBuf> {
    let dir = from.parent().unwrap_or(Path::new("/"));
    match preset::parse_reference(written) {
        Reference::Path(p) => Some(normalize(&dir.join(p))),
        Reference::Invalid => None,
        Reference::Preset { source, name } => {
            let read: Vec<PathBuf> = a
                .sources
                .iter()
                .map(|(_, f)| normalize(&f.path))
                .filter(|p| {
                    super::is_workflow_file(p)
                        && p.file_stem().and_then(|s| s.to_str()) == Some(name)
                        && p != from
                })
                .collect();
            if source.is_some() {
                return read.into_iter().next();
            }
            let docs = super::docs::Docs::default();
            let fs = Overlay { docs: &docs };
            match preset::find(&fs, &preset::search_roots(), name) {
                Some((p, _)) => Some(normalize(&p)),
                None => read.into_iter().next(),
            }
        }
    }
}

fn parse(id: FileId, text: &str, path: &Path) -> Table {
    let mut diags = crate::diag::Diagnostics::default();
    crate::syntax::parse(id, text, Format::from_path(path), &mut diags)
}

struct Builder<'a> {
    src: &'a Sources,
    items: Vec<Item>,
    seen: HashSet<(PathBuf, usize, usize)>,
}

/// Where a value is: its file and how strings there are written.
#[derive(Clone, Copy)]
struct Here<'p> {
    path: &'p Path,
    id: FileId,
    kdl: bool,
}

impl Builder<'_> {
    fn push(&mut self, path: &Path, range: Range<usize>, sym: Sym, def: bool, form: Form) {
        if self
            .seen
            .insert((path.to_path_buf(), range.start, range.end))
        {
            self.items.push(Item {
                path: path.to_path_buf(),
                range,
                sym,
                def,
                form,
            });
        }
    }

    fn workflow_file(&mut self, id: FileId) {
        let file = self.src.get(id);
        let path = normalize(&file.path);
        let text = file.text.clone();
        let table = parse(id, &text, &path);
        let here = Here {
            path: &path,
            id,
            kdl: Format::from_path(&path) == Format::Kdl,
        };
        self.table(here, &table, &WORKFLOW);
        if !here.kdl {
            // `[stages.a.stages.b]`: every header names its stages again.
            for (range, name) in toml_header_stages(&text) {
                self.push(&path, range, Sym::Stage(name), false, Form::Plain);
            }
        }
    }

    /// The range of a name inside a span that holds it (quoted or not).
    fn name_in(&self, span: Span, name: &str) -> Option<Range<usize>> {
        let raw = self.src.slice(span);
        let at = raw.find(name)?;
        let start = span.start as usize + at;
        Some(start..start + name.len())
    }

    fn table(&mut self, here: Here<'_>, t: &Table, spec: &'static TableSpec) {
        for e in &t.entries {
            let Some(field) = spec.field(&e.key) else {
                continue;
            };
            if let Some(r) = self.name_in(e.key_span, &e.key) {
                self.push(here.path, r, Sym::Key(spec, field), false, Form::Plain);
            }
            self.value(here, spec, field, &field.ty, &e.value);
        }
    }

    fn value(
        &mut self,
        here: Here<'_>,
        spec: &'static TableSpec,
        field: &'static Field,
        ty: &'static Ty,
        v: &Value,
    ) {
        match (ty, &v.kind) {
            (Ty::Named(item, _), ValueKind::Table(t)) => {
                for sub in &t.entries {
                    let sym = match item.name {
                        "stage" | "override" => Some(Sym::Stage(sub.key.clone())),
                        "param" => Some(Sym::Param(sub.key.clone())),
                        "agent" => Some(Sym::Agent(sub.key.clone())),
                        _ => None,
                    };
                    if let (Some(sym), Some(r)) = (sym, self.name_in(sub.key_span, &sub.key)) {
                        let def = item.name != "override";
                        self.push(here.path, r, sym, def, Form::Plain);
                    }
                    if let ValueKind::Table(st) = &sub.value.kind {
                        self.table(here, st, item);
                    }
                }
            }
            (Ty::Table(s) | Ty::StrOrTable(s), ValueKind::Table(t)) => self.table(here, t, s),
            (Ty::Tables(s, _), ValueKind::Array(items)) => {
                for i in items {
                    if let ValueKind::Table(t) = &i.kind {
                        self.table(here, t, s);
                    }
                }
            }
            (Ty::Tables(s, _), ValueKind::Table(t)) => self.table(here, t, s),
            (Ty::Map(inner), ValueKind::Table(t)) => {
                for e in &t.entries {
                    self.value(here, spec, field, inner, &e.value);
                }
            }
            (Ty::List(inner), ValueKind::Array(items)) => {
                for i in items {
                    self.value(here, spec, field, inner, i);
                }
            }
            (Ty::List(inner), _) => self.value(here, spec, field, inner, v),
            (_, ValueKind::Str(s)) => self.string(here, spec, field, ty, v.span, s),
            _ => {}
        }
    }

    /// Maps a range of a decoded string to the file.
    fn map(&self, here: Here<'_>, span: Span, s: &str, r: Range<usize>) -> Option<Range<usize>> {
        let raw = self.src.slice(span);
        let start = span.start as usize;
        if let Some(m) = crate::syntax::strings::map_range(raw, here.kdl, s, r.clone()) {
            return Some(start + m.start..start + m.end);
        }
        // Words written bare (KDL) are the text itself.
        let at = raw.find(s)?;
        Some(start + at + r.start..start + at + r.end)
    }

    fn string(
        &mut self,
        here: Here<'_>,
        spec: &'static TableSpec,
        field: &'static Field,
        ty: &'static Ty,
        span: Span,
        s: &str,
    ) {
        debug_assert_eq!(span.file, here.id);
        let whole = 0..s.len();
        let named = match (spec.name, field.key) {
            ("stage", "needs") | ("escalation", "run") | ("stage", "result") if is_ident(s) => {
                Some(Sym::Stage(s.to_string()))
            }
            ("stage" | "override", "agent") | ("agent", "fallbacks") if is_ident(s) => {
                Some(Sym::Agent(s.to_string()))
            }
            ("stage" | "override", "prompt_file") => {
                Some(Sym::File(FileRef::PromptFile(s.to_string())))
            }
            ("output", "schema") => Some(Sym::File(FileRef::Schema(s.to_string()))),
            ("workflow", "extends" | "include") | ("extends" | "stage", "workflow") => {
                Some(Sym::File(FileRef::Workflow(s.to_string())))
            }
            _ => None,
        };
        if let Some(sym) = named {
            if let Some(r) = self.map(here, span, s, whole.clone()) {
                self.push(here.path, r, sym, false, Form::Plain);
            }
            return;
        }
        let template = match ty {
            Ty::Action => {
                if let Some(Action::Goto(name)) = Action::parse(s) {
                    if let Some(r) = self.map(here, span, s, whole) {
                        self.push(here.path, r, Sym::Stage(name), false, Form::Plain);
                    }
                }
                return;
            }
            Ty::Template | Ty::Count | Ty::Duration => true,
            Ty::Expr => false,
            _ => return,
        };
        for (r, sym, form) in scan(s, template) {
            if let Some(r) = self.map(here, span, s, r) {
                self.push(here.path, r, sym, false, form);
            }
        }
    }
}

/// The names a template (or an expression) reads: `stages.X` (and `stages["X"]`),
/// `params.X`, filters, tests and helpers, each with its range in `text`.
pub(crate) fn scan(text: &str, template: bool) -> Vec<(Range<usize>, Sym, Form)> {
    let mut out = Vec::new();
    if template {
        for code in code_regions(text) {
            names_in_code(text, code, &mut out);
        }
    } else {
        names_in_code(text, 0..text.len(), &mut out);
    }
    let uses = if template {
        in_template(text)
    } else {
        in_expression(text)
    };
    for u in uses {
        let Some(name) = text.get(u.range.clone()) else {
            continue;
        };
        let sym = match u.kind {
            UseKind::Filter => Sym::Filter(name.to_string()),
            UseKind::Test => Sym::Test(name.to_string()),
        };
        out.push((u.range, sym, Form::Plain));
    }
    out
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `stages.X`, `stages["X"]`, `params.X` and helper calls in code.
fn names_in_code(text: &str, code: Range<usize>, out: &mut Vec<(Range<usize>, Sym, Form)>) {
    let b = text.as_bytes();
    let mut i = code.start;
    let mut prev = 0u8;
    while i < code.end {
        let c = b[i];
        if c == b'"' || c == b'\'' {
            let mut j = i + 1;
            while j < code.end && b[j] != c {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            prev = c;
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == b'_') {
            if !c.is_ascii_whitespace() {
                prev = c;
            }
            i += 1;
            continue;
        }
        let s = i;
        while i < code.end && is_word(b[i]) {
            i += 1;
        }
        let word = &text[s..i];
        let after_dot = prev == b'.';
        prev = b'a';
        if after_dot {
            // A loop's `history` entries hold `outputs.ID`, by the body's stage ids.
            if word == "outputs" {
                if let Some((r, Form::Dotted)) = member(text, i, code.end) {
                    let name = text[r.clone()].to_string();
                    i = r.end;
                    out.push((r, Sym::Stage(name), Form::Dotted));
                }
            }
            continue;
        }
        // `earlier_runs("ID")` names a stage in a string.
        if word == "earlier_runs" {
            let rest = &text[i..code.end];
            let open = rest.len() - rest.trim_start().len();
            if rest[open..].starts_with('(') {
                let arg = &rest[open + 1..];
                let ws = arg.len() - arg.trim_start().len();
                let at = i + open + 1 + ws;
                if let Some(&q) = b.get(at).filter(|q| **q == b'"' || **q == b'\'') {
                    if let Some(len) = text.get(at + 1..code.end).and_then(|t| t.find(q as char)) {
                        let r = at + 1..at + 1 + len;
                        if is_ident(&text[r.clone()]) {
                            out.push((s..i, Sym::Function(word.to_string()), Form::Plain));
                            out.push((
                                r.clone(),
                                Sym::Stage(text[r.clone()].to_string()),
                                Form::Plain,
                            ));
                            i = r.end + 1;
                            continue;
                        }
                    }
                }
            }
        }
        let root = match word {
            "stages" => Some(true),
            "params" => Some(false),
            _ => None,
        };
        match root {
            Some(is_stage) => {
                let Some((r, form)) = member(text, i, code.end) else {
                    continue;
                };
                let name = text[r.clone()].to_string();
                let sym = if is_stage {
                    Sym::Stage(name)
                } else {
                    Sym::Param(name)
                };
                i = r.end;
                out.push((r, sym, form));
            }
            None => {
                let rest = text[i..code.end].trim_start();
                if rest.starts_with('(') && super::hover::is_function(word) {
                    out.push((s..i, Sym::Function(word.to_string()), Form::Plain));
                }
            }
        }
    }
}

/// The member read after a name ending at `at`: `.X` or `["X"]` / `['X']`.
fn member(text: &str, at: usize, end: usize) -> Option<(Range<usize>, Form)> {
    let b = text.as_bytes();
    match b.get(at) {
        Some(b'.') => {
            let s = at + 1;
            let mut e = s;
            while e < end && is_word(b[e]) {
                e += 1;
            }
            (e > s).then_some((s..e, Form::Dotted))
        }
        Some(b'[') => {
            let q = *b.get(at + 1)?;
            if q != b'"' && q != b'\'' {
                return None;
            }
            let s = at + 2;
            let len = text.get(s..end)?.find(q as char)?;
            let name = &text[s..s + len];
            (is_ident(name) && b.get(s + len + 1) == Some(&b']'))
                .then_some((s..s + len, Form::Plain))
        }
        _ => None,
    }
}

/// The stage ids named by TOML table headers (`[stages.a.stages.b]`, `[overrides.a]`),
/// with their ranges.
fn toml_header_stages(text: &str) -> Vec<(Range<usize>, String)> {
    let mut out = Vec::new();
    // The header lines as the TOML lexer finds them (a `[stages.x]` line inside a multi-line
    // string is text, not a header).
    for (at, _) in super::symbols::toml_headers(text) {
        let line = text[at..].split_inclusive('\n').next().unwrap_or_default();
        let lead = line.len() - line.trim_start().len();
        let mut segs: Vec<(Range<usize>, String)> = Vec::new();
        let b = line.as_bytes();
        let mut i = lead;
        while i < b.len() && b[i] == b'[' {
            i += 1;
        }
        loop {
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            let Some(&c) = b.get(i) else { break };
            if c == b'"' || c == b'\'' {
                let Some(len) = line[i + 1..].find(c as char) else {
                    break;
                };
                segs.push((i + 1..i + 1 + len, line[i + 1..i + 1 + len].to_string()));
                i += len + 2;
            } else if is_word(c) || c == b'-' {
                let s = i;
                while i < b.len() && (is_word(b[i]) || b[i] == b'-') {
                    i += 1;
                }
                segs.push((s..i, line[s..i].to_string()));
            } else {
                break;
            }
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            if b.get(i) == Some(&b'.') {
                i += 1;
            } else {
                break;
            }
        }
        // stages.A(.stages.B)* or overrides.A
        let mut k = 0;
        while k + 1 < segs.len() {
            let ok = match segs[k].1.as_str() {
                "stages" => true,
                "overrides" => k == 0,
                _ => false,
            };
            if !ok {
                break;
            }
            let (r, name) = &segs[k + 1];
            out.push((at + r.start..at + r.end, name.clone()));
            if segs[k].1 == "overrides" {
                break;
            }
            k += 2;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str, template: bool) -> Vec<(String, Sym)> {
        scan(text, template)
            .into_iter()
            .map(|(r, sym, _)| (text[r].to_string(), sym))
            .collect()
    }

    #[test]
    fn templates_name_stages_params_filters_and_tests() {
        let got = names(
            "x stages.no {{ stages.plan.output.a | length }} {% if params.p is defined %}{{ stages['spec'].ran }}{% endif %} {# stages.c #}",
            true,
        );
        assert_eq!(
            got,
            vec![
                ("plan".to_string(), Sym::Stage("plan".into())),
                ("p".to_string(), Sym::Param("p".into())),
                ("spec".to_string(), Sym::Stage("spec".into())),
                ("length".to_string(), Sym::Filter("length".into())),
                ("defined".to_string(), Sym::Test("defined".into())),
            ]
        );
        let got = names("stages.a.output.x == 'stages.b' and x.stages.c", false);
        assert_eq!(got, vec![("a".to_string(), Sym::Stage("a".into()))]);
        let got = names(
            "{% for h in stages.l.output.history %}{{ h.outputs.r.x }}{% endfor %}{{ earlier_runs('e', 2) }}",
            true,
        );
        assert_eq!(
            got,
            vec![
                ("l".to_string(), Sym::Stage("l".into())),
                ("r".to_string(), Sym::Stage("r".into())),
                (
                    "earlier_runs".to_string(),
                    Sym::Function("earlier_runs".into())
                ),
                ("e".to_string(), Sym::Stage("e".into())),
            ]
        );
    }

    #[test]
    fn headers_name_nested_stages_and_overrides() {
        let text = "[stages.a]\nx = 1\n[stages.a.stages.\"b\"]\n[ overrides.c ]\n[stages.a.output]\n[agents.d]\n";
        let got: Vec<(String, String)> = toml_header_stages(text)
            .into_iter()
            .map(|(r, n)| (text[r].to_string(), n))
            .collect();
        let want = [("a", "a"), ("a", "a"), ("b", "b"), ("c", "c"), ("a", "a")];
        assert_eq!(
            got,
            want.iter()
                .map(|(x, y)| (x.to_string(), y.to_string()))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn odd_input_does_not_panic() {
        for s in [
            "{{",
            "{{ stages.",
            "{{ stages[",
            "{{ stages['",
            "{% stages[\"a\" %}",
            "{#",
            "{",
        ] {
            let _ = scan(s, true);
            let _ = scan(s, false);
        }
        for s in ["[", "[\"", "[stages.", "[stages.'a"] {
            let _ = toml_header_stages(s);
        }
    }
}
