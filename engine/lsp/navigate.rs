//! Go to definition, references and rename of stages.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lsp_types::{
    GotoDefinitionParams, GotoDefinitionResponse, Location, PrepareRenameResponse, Range,
    ReferenceParams, RenameParams, TextDocumentPositionParams, TextEdit, Uri, WorkspaceEdit,
};

use super::World;
use super::analysis::Analysis;
use super::docs::{path_uri, uri_path};
use super::refs::{FileRef, Form, Index, Item, Sym, find};
use crate::fs::normalize;

/// The analysis, the index and the offset for a position.
fn lookup<'w>(
    world: &'w World,
    pos: &TextDocumentPositionParams,
) -> Option<(PathBuf, usize, &'w Analysis)> {
    let path = uri_path(&pos.text_document.uri)?;
    let offset = world.offset(&path, pos.position)?;
    let a = world.analysis_for(&path)?;
    Some((path, offset, a))
}

pub(super) fn definition(
    world: &World,
    params: GotoDefinitionParams,
) -> Option<GotoDefinitionResponse> {
    let (path, offset, a) = lookup(world, &params.text_document_position_params)?;
    let index = a.index();
    let item = index.at(&path, offset)?;
    let (target, range) = match &item.sym {
        Sym::Stage(name) => {
            let s = a.stage(name)?;
            let file = a.sources.get(s.id_span.file);
            let r = name_range(a.sources.slice(s.id_span), s.id_span.start as usize, name);
            (normalize(&file.path), r)
        }
        Sym::Param(name) => {
            let wf = a.workflow.as_ref()?;
            let p = wf.params.iter().find(|p| p.name.value == *name)?;
            let r = name_range(
                a.sources.slice(p.name.span),
                p.name.span.start as usize,
                name,
            );
            (normalize(&a.sources.get(p.name.span.file).path), r)
        }
        Sym::Agent(name) => {
            let wf = a.workflow.as_ref()?;
            let g = wf.agents.iter().find(|g| g.name.value == *name)?;
            let r = name_range(
                a.sources.slice(g.name.span),
                g.name.span.start as usize,
                name,
            );
            (normalize(&a.sources.get(g.name.span.file).path), r)
        }
        Sym::File(f) => (file_target(world, a, &path, f)?, 0..0),
        _ => return None,
    };
    let loc = location(world, a, &target, range)?;
    Some(GotoDefinitionResponse::Scalar(loc))
}

/// The range of `name` in the text of a span starting at `start`.
fn name_range(raw: &str, start: usize, name: &str) -> std::ops::Range<usize> {
    match raw.find(name) {
        Some(at) => start + at..start + at + name.len(),
        None => start..start + raw.len(),
    }
}

/// The file a value names.
pub(super) fn file_target(
    world: &World,
    a: &Analysis,
    from: &Path,
    f: &FileRef,
) -> Option<PathBuf> {
    match f {
        FileRef::PromptFile(written) => {
            // The one the checker resolved for the stage whose table holds the value, else
            // any stage's of that name.
            let from_file = find(&a.sources, from);
            let named: Vec<&super::analysis::StageFact> = a
                .stages
                .iter()
                .filter(|s| {
                    s.prompt_file.as_ref().is_some_and(|p| {
                        p.ends_with(written) || p.file_name() == Path::new(written).file_name()
                    })
                })
                .collect();
            let own = named.iter().find(|s| Some(s.span.file) == from_file);
            own.or(named.first())
                .and_then(|s| s.prompt_file.as_ref())
                .map(|p| normalize(p))
        }
        FileRef::Schema(written) => {
            let dir = from.parent()?;
            let p = normalize(&dir.join(written));
            (find(&a.sources, &p).is_some() || world.text(&p).is_some()).then_some(p)
        }
        FileRef::Workflow(written) => super::refs::resolve_workflow(a, from, written),
    }
}

/// A location the editor can open: a built-in preset's file is written once into a cache
/// directory, and the location points there.
fn location(
    world: &World,
    a: &Analysis,
    path: &Path,
    range: std::ops::Range<usize>,
) -> Option<Location> {
    if crate::fs::is_builtin(path) {
        let text = crate::fs::builtin_file(path)?;
        let copy = builtin_copy(path, text)?;
        let lines = super::lines::LineIndex::new(text);
        let r = lines.range(text, range, world.encoding);
        return Some(Location {
            uri: path_uri(&copy)?,
            range: r,
        });
    }
    let r = match world.text(path) {
        Some(_) => world.range(path, range),
        None => {
            let text = find(&a.sources, path).map(|id| a.sources.get(id).text.clone())?;
            super::lines::LineIndex::new(&text).range(&text, range, world.encoding)
        }
    };
    Some(Location {
        uri: world.uri(path)?,
        range: r,
    })
}

/// Where a built-in file's copy lives: `<cache>/built-in/<version>/<path>`, written (read-only)
/// when it is missing or differs.
pub(crate) fn builtin_copy(path: &Path, text: &str) -> Option<PathBuf> {
    let rel = path.strip_prefix(crate::fs::BUILTIN_ROOT).ok()?;
    let copy = crate::preset::cache_dir()
        .join("built-in")
        .join(env!("CARGO_PKG_VERSION"))
        .join(rel);
    if std::fs::read_to_string(&copy).ok().as_deref() == Some(text) {
        return Some(copy);
    }
    std::fs::create_dir_all(copy.parent()?).ok()?;
    if let Ok(meta) = std::fs::metadata(&copy) {
        let mut perms = meta.permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        let _ = std::fs::set_permissions(&copy, perms);
    }
    let tmp = copy.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).ok()?;
    if let Ok(meta) = std::fs::metadata(&tmp) {
        let mut perms = meta.permissions();
        perms.set_readonly(true);
        let _ = std::fs::set_permissions(&tmp, perms);
    }
    std::fs::rename(&tmp, &copy).ok()?;
    Some(copy)
}

pub(super) fn references(world: &World, params: ReferenceParams) -> Option<Vec<Location>> {
    let (path, offset, a) = lookup(world, &params.text_document_position)?;
    let index = a.index();
    let Sym::Stage(name) = &index.at(&path, offset)?.sym else {
        return None;
    };
    let mut out: Vec<Location> = index
        .stage_items(name)
        .filter(|i| params.context.include_declaration || !i.def)
        .filter_map(|i| location(world, a, &i.path, i.range.clone()))
        .collect();
    out.sort_by(|x, y| {
        (x.uri.as_str(), x.range.start.line, x.range.start.character).cmp(&(
            y.uri.as_str(),
            y.range.start.line,
            y.range.start.character,
        ))
    });
    out.dedup();
    Some(out)
}

/// Why a rename cannot be done.
pub(super) type Refusal = String;

pub(super) fn prepare_rename(
    world: &World,
    params: TextDocumentPositionParams,
) -> Result<Option<PrepareRenameResponse>, Refusal> {
    let Some((path, offset, a)) = lookup(world, &params) else {
        return Ok(None);
    };
    let index = a.index();
    let Some(item) = index.at(&path, offset) else {
        return Err(
            "only stages can be renamed: put the cursor on a stage's id or on a reference to it"
                .into(),
        );
    };
    let Sym::Stage(name) = &item.sym else {
        return Err(
            "only stages can be renamed: put the cursor on a stage's id or on a reference to it"
                .into(),
        );
    };
    missing(a, name)?;
    not_preset(index, name)?;
    Ok(Some(PrepareRenameResponse::Range(
        world.range(&path, item.range.clone()),
    )))
}

/// Refuses to rename a stage the checker does not know: a typo, or a workflow that does not
/// parse (its stages are unknown until it does).
fn missing(a: &Analysis, name: &str) -> Result<(), Refusal> {
    if a.stage(name).is_some() {
        return Ok(());
    }
    if a.workflow.is_none() {
        return Err(
            "the workflow does not load (see its errors): fix them first, then rename".into(),
        );
    }
    Err(format!(
        "there is no stage `{name}` to rename; fix the reference first"
    ))
}

/// Refuses a rename that would have to change a built-in or fetched preset's file.
fn not_preset(index: &Index, name: &str) -> Result<(), Refusal> {
    if let Some(i) = index.stage_items(name).find(|i| !editable(&i.path)) {
        let whose = if crate::fs::is_builtin(&i.path) {
            "a built-in preset"
        } else {
            "a preset fetched from a git source"
        };
        return Err(format!(
            "stage `{name}` is also named in `{}`, {whose}, which is not yours to change; rename it in a copy of the preset, or override it (`[overrides.{name}]`) instead",
            i.path.display()
        ));
    }
    Ok(())
}

/// Whether the user may edit a file: not a built-in preset's, not a fetched one's.
fn editable(path: &Path) -> bool {
    !crate::fs::is_builtin(path)
        && !path.starts_with(crate::preset::cache_dir())
        && !path.starts_with(crate::preset::git::checkouts_dir())
}

// `WorkspaceEdit::changes` is keyed by `Uri`, whose inner cell caches parse state and is
// not part of its hash or equality.
#[allow(clippy::mutable_key_type)]
pub(super) fn rename(
    world: &World,
    params: RenameParams,
) -> Result<Option<WorkspaceEdit>, Refusal> {
    let Some((path, offset, a)) = lookup(world, &params.text_document_position) else {
        return Ok(None);
    };
    let index = a.index();
    let Some(Item {
        sym: Sym::Stage(name),
        ..
    }) = index.at(&path, offset)
    else {
        return Err(
            "only stages can be renamed: put the cursor on a stage's id or on a reference to it"
                .into(),
        );
    };
    let new = params.new_name.trim();
    if !crate::model::is_ident(new) {
        return Err(format!(
            "`{new}` is not a valid stage id: start with a letter or `_`, then use letters, digits, `_` or `-`"
        ));
    }
    if crate::model::RESERVED.contains(&new) {
        return Err(format!(
            "`{new}` is a reserved word (actions and template names use it); choose another id"
        ));
    }
    missing(a, name)?;
    if new == name {
        return Ok(Some(WorkspaceEdit::default()));
    }
    if a.stage(new).is_some() {
        return Err(format!(
            "a stage `{new}` already exists; choose another id, or rename that stage first"
        ));
    }
    not_preset(index, name)?;
    if new.contains('-') && index.stage_items(name).any(|i| i.form == Form::Dotted) {
        return Err(format!(
            "templates read this stage as `stages.{name}`, where `stages.{new}` would read as a subtraction; use `_` instead of `-`"
        ));
    }
    let mut changes: HashMap<Uri, Vec<TextEdit>> = HashMap::new();
    for i in index.stage_items(name) {
        let Some(uri) = world.uri(&i.path) else {
            continue;
        };
        let range: Range = world.range(&i.path, i.range.clone());
        changes.entry(uri).or_default().push(TextEdit {
            range,
            new_text: new.to_string(),
        });
    }
    for edits in changes.values_mut() {
        edits.sort_by_key(|e| (e.range.start.line, e.range.start.character));
        edits.dedup();
    }
    Ok(Some(WorkspaceEdit {
        changes: Some(changes),
        ..WorkspaceEdit::default()
    }))
}
