//! Completion: keys, enum values, stage, agent and preset names, and inside templates and
//! expressions the stages in scope, their output fields, params, filters and tests.
//!
//! The place is read from the text (`cursor.rs`), which is often half-typed; the names come
//! from the last analysis of the workflow (the last one that parsed, while the text does
//! not) merged with those the text itself declares. Nothing is checked here: an answer
//! reads what is already known.

use std::path::Path;

use lsp_types::{
    CompletionItem, CompletionItemKind, CompletionList, CompletionResponse, CompletionTextEdit,
    Documentation, MarkupContent, MarkupKind, TextEdit,
};
use serde_json::Value;

use super::World;
use super::analysis::{Analysis, StageFact};
use super::cursor::{self, After, Code, Cursor, Names, Place, Shape};
use super::docs::uri_path;
use crate::check::vocabulary;
use crate::model::StageKind;
use crate::spec::{self, TableSpec, Ty};

pub(super) fn complete(
    world: &World,
    params: lsp_types::CompletionParams,
) -> Option<lsp_types::CompletionResponse> {
    let tdp = params.text_document_position;
    let path = uri_path(&tdp.text_document.uri)?;
    let text = world.text(&path)?;
    let at = world.offset(&path, tdp.position)?;
    let items = items(world, &path, &text, at);
    Some(CompletionResponse::List(CompletionList {
        is_incomplete: false,
        items,
    }))
}

/// A stage known by its id: from the analysis, or only from the text.
struct StageName<'a> {
    id: String,
    parent: Option<String>,
    fact: Option<&'a StageFact>,
}

/// What an answer reads.
struct Ctx<'a> {
    world: &'a World,
    text: &'a str,
    facts: Option<&'a Analysis>,
    stages: Vec<StageName<'a>>,
    /// Where each stage is in `stages` (the first of an id written twice).
    by_id: std::collections::HashMap<String, usize>,
    names: Names,
    kdl: bool,
    /// The stage the cursor is in (or whose prompt file this is).
    current: Option<String>,
    /// The ids of the stages around the cursor, outermost first, the current one last.
    around: Vec<String>,
}

/// The analysis whose names answer for a file: the current one when the workflow parses,
/// else the last one that did.
fn facts<'a>(world: &'a World, path: &Path) -> Option<&'a Analysis> {
    let a = world.analysis_for(path);
    if let Some(a) = a {
        if a.workflow.is_some() {
            return Some(a);
        }
        if let Some(g) = world.last_good.get(&a.root) {
            return Some(g);
        }
    }
    let mut good: Vec<&Analysis> = world
        .last_good
        .values()
        .filter(|g| g.involves(path))
        .collect();
    good.sort_by(|x, y| x.root.cmp(&y.root));
    good.into_iter().next().or(a)
}

fn items(world: &World, path: &Path, text: &str, at: usize) -> Vec<CompletionItem> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let facts = facts(world, path);
    let (cursor, names) = match ext.as_str() {
        "toml" => (Some(cursor::toml(text, at)), cursor::toml_names(text)),
        "kdl" => (Some(cursor::kdl(text, at)), cursor::kdl_names(text)),
        _ => (None, Names::default()),
    };
    let mut stages: Vec<StageName> = Vec::new();
    if let Some(a) = facts {
        // In the order they are written (a body's stages inside their region).
        let mut order: Vec<&StageFact> = a.stages.iter().collect();
        order.sort_by_key(|s| (s.span.file.0, s.span.start, s.id_span.start));
        for s in order {
            stages.push(StageName {
                id: s.id.clone(),
                parent: s.parent.and_then(|p| a.stages.get(p)).map(|p| p.id.clone()),
                fact: Some(s),
            });
        }
    }
    let mut known: std::collections::HashSet<String> =
        stages.iter().map(|s| s.id.clone()).collect();
    for (id, parent) in &names.stages {
        if known.insert(id.clone()) {
            stages.push(StageName {
                id: id.clone(),
                parent: parent.clone(),
                fact: None,
            });
        }
    }
    let (current, around) = match &cursor {
        Some(c) => {
            let ids = cursor::stage_ids(&c.table);
            (ids.last().cloned(), ids)
        }
        None => {
            // A prompt file: the stage that reads it, and the stages around that one.
            let me = facts.and_then(|a| {
                a.stages.iter().find(|s| {
                    s.prompt_file
                        .as_deref()
                        .map(crate::fs::normalize)
                        .as_deref()
                        == Some(path)
                })
            });
            let mut around = Vec::new();
            if let (Some(a), Some(me)) = (facts, me) {
                let mut cur = Some(me);
                while let Some(s) = cur {
                    around.insert(0, s.id.clone());
                    cur = s.parent.and_then(|p| a.stages.get(p));
                }
            }
            (me.map(|s| s.id.clone()), around)
        }
    };
    let mut by_id = std::collections::HashMap::new();
    for (i, st) in stages.iter().enumerate() {
        by_id.entry(st.id.clone()).or_insert(i);
    }
    let ctx = Ctx {
        world,
        text,
        facts,
        stages,
        by_id,
        names,
        kdl: ext == "kdl",
        current,
        around,
    };
    let place = match &cursor {
        Some(c) => c.place.clone(),
        None => cursor::template(text, at),
    };
    let out = match &place {
        Place::Key { prefix, property } => match &cursor {
            Some(c) => keys(&ctx, c, prefix.clone(), *property),
            None => Vec::new(),
        },
        Place::Value {
            key,
            prefix,
            quoted,
        } => match &cursor {
            Some(c) => values(&ctx, c, key, prefix.clone(), *quoted),
            None => Vec::new(),
        },
        Place::Code(code) => code_items(&ctx, code),
        Place::Nothing => Vec::new(),
    };
    out.into_iter()
        .map(|o| {
            let range = world.range(path, o.range.clone());
            o.into_item(range)
        })
        .collect()
}

/// One answer before it becomes a protocol item.
struct Out {
    label: String,
    kind: CompletionItemKind,
    detail: Option<String>,
    doc: Option<String>,
    range: std::ops::Range<usize>,
    insert: String,
    sort: String,
}

impl Out {
    fn new(label: &str, kind: CompletionItemKind, range: std::ops::Range<usize>) -> Out {
        Out {
            label: label.to_string(),
            kind,
            detail: None,
            doc: None,
            range,
            insert: label.to_string(),
            sort: format!("5{label}"),
        }
    }

    fn detail(mut self, d: impl Into<String>) -> Out {
        let d = d.into();
        if !d.is_empty() {
            self.detail = Some(d);
        }
        self
    }

    fn doc(mut self, d: impl Into<String>) -> Out {
        self.doc = Some(d.into());
        self
    }

    fn insert(mut self, t: impl Into<String>) -> Out {
        self.insert = t.into();
        self
    }

    fn sort(mut self, s: impl Into<String>) -> Out {
        self.sort = s.into();
        self
    }

    fn into_item(self, range: lsp_types::Range) -> CompletionItem {
        CompletionItem {
            filter_text: Some(self.label.clone()),
            label: self.label,
            kind: Some(self.kind),
            detail: self.detail,
            documentation: self.doc.map(|value| {
                Documentation::MarkupContent(MarkupContent {
                    kind: MarkupKind::Markdown,
                    value,
                })
            }),
            sort_text: Some(self.sort),
            text_edit: Some(CompletionTextEdit::Edit(TextEdit {
                range,
                new_text: self.insert,
            })),
            ..Default::default()
        }
    }
}

/// The first sentence of a key's doc.
fn short(doc: &str) -> String {
    let end = doc
        .find(". ")
        .map_or(doc.len(), |i| i + 1)
        .min(doc.find(": ").map_or(doc.len(), |i| i));
    doc[..end].trim_end_matches('.').to_string()
}

fn is(t: &TableSpec, other: &'static TableSpec) -> bool {
    std::ptr::eq(t, other)
}

impl Ctx<'_> {
    fn stage(&self, id: &str) -> Option<&StageName<'_>> {
        self.by_id.get(id).and_then(|&i| self.stages.get(i))
    }

    fn kind_of(&self, id: &str) -> Option<StageKind> {
        self.facts.and_then(|a| a.stage(id)).map(|f| f.kind)
    }

    /// The stages of the body that holds `id`, `id` left out. A stage not known yet is
    /// placed by the path the cursor is at.
    fn siblings(&self, id: Option<&str>) -> Vec<&StageName<'_>> {
        let parent = match id.and_then(|i| self.stage(i)) {
            Some(s) => s.parent.clone(),
            None => {
                let n = self.around.len();
                n.checked_sub(2).map(|i| self.around[i].clone())
            }
        };
        self.stages
            .iter()
            .filter(|s| s.parent == parent && Some(s.id.as_str()) != id)
            .collect()
    }

    /// The body stages of `id`.
    fn children(&self, id: &str) -> Vec<&StageName<'_>> {
        let mut out: Vec<&StageName<'_>> = match self.facts {
            Some(a) => a
                .stage(id)
                .map(|f| f.children.as_slice())
                .unwrap_or_default()
                .iter()
                .filter_map(|&i| a.stages.get(i))
                .filter_map(|c| self.stage(&c.id))
                .collect(),
            None => Vec::new(),
        };
        for s in &self.stages {
            if s.parent.as_deref() == Some(id) && !out.iter().any(|o| o.id == s.id) {
                out.push(s);
            }
        }
        out
    }

    fn agents(&self) -> Vec<(String, Option<String>)> {
        let mut out: Vec<(String, Option<String>)> =
            match self.facts.and_then(|a| a.workflow.as_ref()) {
                Some(w) => w
                    .agents
                    .iter()
                    .map(|a| {
                        let model = a.model.as_ref().map(|m| m.value.clone());
                        let detail = match model {
                            Some(m) => format!("{} agent, {m}", a.kind.value.as_str()),
                            None => format!("{} agent", a.kind.value.as_str()),
                        };
                        (a.name.value.clone(), Some(detail))
                    })
                    .collect(),
                None => Vec::new(),
            };
        for n in &self.names.agents {
            if !out.iter().any(|(a, _)| a == n) {
                out.push((n.clone(), None));
            }
        }
        out
    }

    /// The workflow's permission policies (`[policy.NAME]`).
    fn policies(&self) -> Vec<String> {
        self.facts
            .and_then(|a| a.workflow.as_ref())
            .map(|w| w.policies.iter().map(|p| p.name.value.clone()).collect())
            .unwrap_or_default()
    }

    fn exits(&self) -> Vec<(String, Option<String>)> {
        let mut out: Vec<(String, Option<String>)> =
            match self.facts.and_then(|a| a.workflow.as_ref()) {
                Some(w) => w
                    .exits
                    .iter()
                    .map(|e| {
                        (
                            e.name.value.clone(),
                            Some(format!("exit code {}", e.code.value)),
                        )
                    })
                    .collect(),
                None => Vec::new(),
            };
        for n in &self.names.exits {
            if !out.iter().any(|(a, _)| a == n) {
                out.push((n.clone(), None));
            }
        }
        out
    }

    /// The params: name, detail (type and default), description.
    fn params(&self) -> Vec<(String, String, Option<String>)> {
        let mut out: Vec<(String, String, Option<String>)> =
            match self.facts.and_then(|a| a.workflow.as_ref()) {
                Some(w) => w
                    .params
                    .iter()
                    .map(|p| {
                        let ty = p.ty.value.as_str();
                        let detail = match &p.default {
                            Some(d) => format!("{ty}, default {}", d.to_json()),
                            None => format!("{ty}, required"),
                        };
                        (
                            p.name.value.clone(),
                            detail,
                            p.description.as_ref().map(|d| d.value.clone()),
                        )
                    })
                    .collect(),
                None => Vec::new(),
            };
        for n in &self.names.params {
            if !out.iter().any(|(a, _, _)| a == n) {
                out.push((n.clone(), "param".to_string(), None));
            }
        }
        out
    }

    fn stage_detail(&self, s: &StageName<'_>) -> String {
        match s.fact {
            Some(f) => match (&f.agent, &f.description) {
                (Some(a), _) => format!("{} stage, agent {a}", f.kind.as_str()),
                (None, _) => format!("{} stage", f.kind.as_str()),
            },
            None => "stage".to_string(),
        }
    }

    fn stage_out(&self, s: &StageName<'_>, range: std::ops::Range<usize>, quote: bool) -> Out {
        let mut o = Out::new(&s.id, CompletionItemKind::MODULE, range)
            .detail(self.stage_detail(s))
            .insert(if quote {
                format!("\"{}\"", s.id)
            } else {
                s.id.clone()
            });
        if let Some(d) = s.fact.and_then(|f| f.description.clone()) {
            o = o.doc(d);
        }
        o
    }
}

// ------------------------------------------------------------------------------------ keys

fn keys(ctx: &Ctx<'_>, c: &Cursor, range: std::ops::Range<usize>, property: bool) -> Vec<Out> {
    let Shape::Table(t) = cursor::shape(&c.table) else {
        return Vec::new();
    };
    let kind: Option<String> = c.kind.clone().or_else(|| {
        if is(t, &spec::STAGE) {
            ctx.current
                .as_deref()
                .and_then(|id| ctx.kind_of(id))
                .map(|k| k.as_str().to_string())
        } else {
            None
        }
    });
    let mut out = Vec::new();
    for f in t.fields {
        if let Some(k) = &kind {
            if !f.kinds.is_empty() && !f.kinds.contains(&k.as_str()) {
                continue;
            }
        }
        let (label, repeats) = match &f.ty {
            Ty::Named(_, singular) | Ty::Tables(_, singular) if ctx.kdl => (*singular, true),
            Ty::Tables(..) => (f.key, true),
            _ => (f.key, false),
        };
        if property
            && matches!(
                f.ty,
                Ty::Named(..) | Ty::Tables(..) | Ty::Table(_) | Ty::Map(_) | Ty::List(_)
            )
        {
            continue;
        }
        if !repeats && c.written.iter().any(|w| w == f.key) {
            continue;
        }
        let insert = if !ctx.kdl {
            format!("{} = ", f.key)
        } else if property {
            format!("{label}=")
        } else {
            format!("{label} ")
        };
        out.push(
            Out::new(label, CompletionItemKind::PROPERTY, range.clone())
                .detail(short(f.doc))
                .doc(f.doc)
                .insert(insert)
                .sort(format!("{}{label}", if f.required { 0 } else { 1 })),
        );
    }
    out
}

// ---------------------------------------------------------------------------------- values

/// The action words: `continue`, `break` and `fail` everywhere, `approve` and `reject` for a
/// gate's timeout.
fn action_words(key: &str) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![
        (
            "continue",
            "go on with the next iteration (in a loop), else the next stage",
        ),
        ("break", "end the enclosing loop as done"),
        ("fail", "the run fails"),
    ];
    if key == "on_timeout" {
        out.push(("approve", "approve the gate"));
        out.push(("reject", "reject the gate"));
    }
    out
}

fn values(
    ctx: &Ctx<'_>,
    c: &Cursor,
    key: &str,
    range: std::ops::Range<usize>,
    quoted: bool,
) -> Vec<Out> {
    let shape = cursor::shape(&c.table);
    let Some(ty) = cursor::value_ty(&c.table, key) else {
        return Vec::new();
    };
    let q = |s: &str| {
        if quoted {
            s.to_string()
        } else {
            format!("\"{s}\"")
        }
    };
    let mut out = Vec::new();
    let table = match shape {
        Shape::Table(t) => Some(t),
        _ => None,
    };
    let stage_table = table.is_some_and(|t| is(t, &spec::STAGE));
    let me = ctx.current.as_deref();
    // A route's field: a dotted path into the stage's output.
    if table.is_some_and(|t| is(t, &spec::ROUTE)) && key == "on" {
        let typed = ctx.text.get(range.clone()).unwrap_or("");
        let (path, last) = typed.rsplit_once('.').unwrap_or(("", typed));
        let path: Vec<&str> = path.split('.').filter(|p| !p.is_empty()).collect();
        let r = range.end - last.len()..range.end;
        let schema = me
            .and_then(|id| ctx.stage(id))
            .and_then(|s| s.fact)
            .and_then(|f| f.schema.as_deref());
        return schema_fields(schema, &path, r);
    }
    if stage_table && key == "needs" {
        for s in ctx.siblings(me) {
            out.push(ctx.stage_out(s, range.clone(), !quoted));
        }
        return out;
    }
    if (stage_table && key == "result")
        || (table.is_some_and(|t| is(t, &spec::ESCALATION)) && key == "run")
    {
        if let Some(me) = me {
            for s in ctx.children(me) {
                out.push(ctx.stage_out(s, range.clone(), !quoted));
            }
        }
        return out;
    }
    if ((stage_table || table.is_some_and(|t| is(t, &spec::OVERRIDE))) && key == "agent")
        || (table.is_some_and(|t| is(t, &spec::AGENT)) && key == "fallbacks")
    {
        let this = c
            .table
            .get(1)
            .filter(|_| c.table.first().is_some_and(|f| f == "agents"));
        for (name, detail) in ctx.agents() {
            if Some(&name) == this {
                continue;
            }
            out.push(
                Out::new(&name, CompletionItemKind::CLASS, range.clone())
                    .detail(detail.unwrap_or_else(|| "agent".to_string()))
                    .insert(q(&name)),
            );
        }
        return out;
    }
    if (table.is_some_and(|t| is(t, &spec::WORKFLOW)) && matches!(key, "extends" | "include"))
        || (table.is_some_and(|t| is(t, &spec::EXTENDS)) && key == "workflow")
    {
        let fs = super::docs::Overlay {
            docs: &ctx.world.docs,
        };
        for name in crate::preset::all_names(&fs, &crate::preset::search_roots()) {
            out.push(
                Out::new(&name, CompletionItemKind::MODULE, range.clone())
                    .detail("preset")
                    .insert(q(&name)),
            );
        }
        return out;
    }
    // Permission policies (issue 32): a level, or one of the workflow's policies.
    if ((stage_table || table.is_some_and(|t| is(t, &spec::AGENT))) && key == "permissions")
        || (table.is_some_and(|t| is(t, &spec::POLICY)) && key == "extends")
    {
        for (i, level) in spec::PERMISSIONS.iter().enumerate() {
            out.push(
                Out::new(level, CompletionItemKind::ENUM_MEMBER, range.clone())
                    .detail("level")
                    .insert(q(level))
                    .sort(format!("0{i}")),
            );
        }
        for name in ctx.policies() {
            out.push(
                Out::new(&name, CompletionItemKind::CLASS, range.clone())
                    .detail("policy")
                    .insert(q(&name))
                    .sort(format!("1{name}")),
            );
        }
        return out;
    }
    match ty {
        Ty::Enum(vals) => {
            for (i, v) in vals.iter().enumerate() {
                out.push(
                    Out::new(v, CompletionItemKind::ENUM_MEMBER, range.clone())
                        .insert(q(v))
                        .sort(format!("{i:03}")),
                );
            }
        }
        Ty::Action => {
            for (w, d) in action_words(key) {
                out.push(
                    Out::new(w, CompletionItemKind::KEYWORD, range.clone())
                        .detail(d)
                        .insert(q(w))
                        .sort(format!("0{w}")),
                );
            }
            for (name, detail) in ctx.exits() {
                let label = format!("exit:{name}");
                out.push(
                    Out::new(&label, CompletionItemKind::EVENT, range.clone())
                        .detail(detail.unwrap_or_else(|| "exit".to_string()))
                        .insert(q(&label))
                        .sort(format!("1{label}")),
                );
            }
            // A stage beside the one the key is on.
            if me.is_some() {
                for s in ctx.siblings(me) {
                    out.push(
                        ctx.stage_out(s, range.clone(), !quoted)
                            .sort(format!("2{}", s.id)),
                    );
                }
            }
        }
        _ => {}
    }
    out
}

// ------------------------------------------------------------------------------------ code

fn code_items(ctx: &Ctx<'_>, code: &Code) -> Vec<Out> {
    let r = code.prefix.clone();
    match code.after {
        After::Filter => {
            let mut names: Vec<&str> = vocabulary::FILTERS.to_vec();
            names.push("spread");
            names.sort();
            return names
                .into_iter()
                .map(|n| Out::new(n, CompletionItemKind::FUNCTION, r.clone()).detail("filter"))
                .collect();
        }
        After::Test => {
            return vocabulary::TESTS
                .iter()
                .map(|n| Out::new(n, CompletionItemKind::FUNCTION, r.clone()).detail("test"))
                .collect();
        }
        After::Plain => {}
    }
    let chain: Vec<&str> = code.chain.iter().map(String::as_str).collect();
    match chain.as_slice() {
        [] => roots(ctx, code, r),
        ["stages"] => {
            // Upstream stages first: those declared before the current one.
            let pos = ctx
                .current
                .as_deref()
                .and_then(|c| ctx.stages.iter().position(|s| s.id == c));
            ctx.stages
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let rank = match pos {
                        Some(p) if i < p => 0,
                        Some(p) if i == p => 2,
                        _ => 1,
                    };
                    ctx.stage_out(s, r.clone(), false)
                        .sort(format!("{rank}{i:05}"))
                })
                .collect()
        }
        ["stages", _] => vocabulary::STAGE_ATTRS
            .iter()
            .map(|a| Out::new(a, CompletionItemKind::FIELD, r.clone()).detail(stage_attr_doc(a)))
            .collect(),
        ["stages", id, "output", rest @ ..] => match ctx.stage(id).and_then(|s| s.fact) {
            Some(f) => schema_fields(f.schema.as_deref(), rest, r),
            None => Vec::new(),
        },
        ["output", rest @ ..] if code.locals.iter().all(|l| l != "output") => {
            match ctx
                .current
                .as_deref()
                .and_then(|id| ctx.stage(id))
                .and_then(|s| s.fact)
            {
                Some(f) => schema_fields(f.schema.as_deref(), rest, r),
                None => Vec::new(),
            }
        }
        ["params"] => ctx
            .params()
            .into_iter()
            .map(|(name, detail, desc)| {
                let o = Out::new(&name, CompletionItemKind::VARIABLE, r.clone()).detail(detail);
                match desc {
                    Some(d) => o.doc(d),
                    None => o,
                }
            })
            .collect(),
        ["run"] => vocabulary::RUN_ATTRS
            .iter()
            .map(|a| Out::new(a, CompletionItemKind::FIELD, r.clone()).detail("run"))
            .collect(),
        ["loops"] => loops(ctx)
            .into_iter()
            .map(|l| Out::new(&l, CompletionItemKind::MODULE, r.clone()).detail("loop"))
            .collect(),
        [first, rest @ ..]
            if !matches!(*first, "stages" | "params" | "run" | "loops" | "output") =>
        {
            item_fields(ctx, first, rest, r)
        }
        ["loops", _] => vocabulary::LOOP_VARS
            .iter()
            .map(|a| Out::new(a, CompletionItemKind::FIELD, r.clone()).detail("loop variable"))
            .collect(),
        _ => Vec::new(),
    }
}

fn stage_attr_doc(a: &str) -> &'static str {
    match a {
        "output" => "the stage's output (its schema's fields)",
        "history" => "every iteration's outputs (a loop)",
        "last" => "the output of the last iteration it ran in",
        "status" => "how it settled: done, failed, skipped, ...",
        "ran" => "whether it ran (false when skipped)",
        "feedback" => "what it handed to the next iteration",
        "attempts" => "how many attempts it took",
        "usage" => "its tokens and cost",
        "settled" => "whether it has settled",
        _ => "stage attribute",
    }
}

/// The loops around the cursor (the current stage included), innermost last.
fn loops(ctx: &Ctx<'_>) -> Vec<String> {
    ctx.around
        .iter()
        .filter(|id| ctx.kind_of(id) == Some(StageKind::Loop))
        .cloned()
        .collect()
}

/// The item variables of the for_each stages around the cursor.
/// The item variables of the for_each stages around the cursor, with the list each goes
/// over (`over`, as written).
fn items_in_scope(ctx: &Ctx<'_>) -> Vec<(String, Option<String>)> {
    let Some(w) = ctx.facts.and_then(|a| a.workflow.as_ref()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for id in &ctx.around {
        if ctx.current.as_deref() == Some(id.as_str())
            && ctx.kind_of(id) == Some(StageKind::ForEach)
        {
            // The for_each's own keys (`over`) do not see its item.
            continue;
        }
        if let Some(f) = find_stage(&w.stages, id).and_then(|s| s.body.as_for_each()) {
            out.push((
                f.as_name
                    .as_ref()
                    .map_or("item".to_string(), |n| n.value.clone()),
                f.over.as_ref().map(|o| o.value.clone()),
            ));
        }
    }
    out
}

fn find_stage<'w>(stages: &'w [crate::model::Stage], id: &str) -> Option<&'w crate::model::Stage> {
    for s in stages {
        if s.id.value == id {
            return Some(s);
        }
        if let Some(f) = find_stage(s.children(), id) {
            return Some(f);
        }
    }
    None
}

fn roots(ctx: &Ctx<'_>, code: &Code, r: std::ops::Range<usize>) -> Vec<Out> {
    let mut out = vec![
        Out::new("params", CompletionItemKind::VARIABLE, r.clone()).detail("the workflow's params"),
        Out::new("stages", CompletionItemKind::VARIABLE, r.clone())
            .detail("the stages' outputs and state"),
        Out::new("run", CompletionItemKind::VARIABLE, r.clone()).detail("this run: id, dir, ..."),
    ];
    let in_params_only = code.key.as_deref().is_some_and(|k| {
        matches!(
            k,
            "model" | "max_iterations" | "timeout" | "idle_timeout" | "retries"
        )
    });
    if in_params_only {
        out.retain(|o| o.label != "stages");
        return out;
    }
    if ctx.current.is_some() {
        out.push(
            Out::new("attempt", CompletionItemKind::VARIABLE, r.clone())
                .detail("this stage's attempt number"),
        );
    }
    if code
        .key
        .as_deref()
        .is_some_and(|k| matches!(k, "feedback" | "files" | "expect"))
    {
        out.push(
            Out::new("output", CompletionItemKind::VARIABLE, r.clone())
                .detail("this stage's output"),
        );
    }
    let loops = loops(ctx);
    if !loops.is_empty() {
        for v in vocabulary::LOOP_VARS {
            out.push(Out::new(v, CompletionItemKind::VARIABLE, r.clone()).detail("loop variable"));
        }
        out.push(
            Out::new("loops", CompletionItemKind::VARIABLE, r.clone())
                .detail("the enclosing loops by id"),
        );
    }
    let items = items_in_scope(ctx);
    if !items.is_empty() {
        out.push(
            Out::new("index", CompletionItemKind::VARIABLE, r.clone()).detail("the item's index"),
        );
    }
    for (i, _) in items {
        out.push(Out::new(&i, CompletionItemKind::VARIABLE, r.clone()).detail("for_each item"));
    }
    for l in &code.locals {
        if !out.iter().any(|o| o.label == *l) {
            out.push(
                Out::new(l, CompletionItemKind::VARIABLE, r.clone()).detail("set in this template"),
            );
        }
    }
    for h in vocabulary::HELPERS {
        out.push(
            Out::new(h, CompletionItemKind::FUNCTION, r.clone())
                .detail("helper function")
                .sort(format!("8{h}")),
        );
    }
    out
}

/// The properties of an output schema at a path of fields.
fn schema_fields(schema: Option<&Value>, path: &[&str], r: std::ops::Range<usize>) -> Vec<Out> {
    let Some(root) = schema else {
        return Vec::new();
    };
    match schema_at(root, root, path) {
        Some(node) => fields_of(root, node, r),
        None => Vec::new(),
    }
}

/// The schema node at a path of fields below `node`.
fn schema_at<'a>(root: &'a Value, node: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut node = node;
    for seg in path {
        let props = properties(root, node, 0);
        node = props.into_iter().find(|(k, _)| k.as_str() == *seg)?.1;
    }
    Some(node)
}

/// The fields of an item variable's value (`phase.` in a for_each `as = "phase"` over
/// `stages.plan.output.phases`): the properties of the items of the list it goes over.
fn item_fields(ctx: &Ctx<'_>, name: &str, rest: &[&str], r: std::ops::Range<usize>) -> Vec<Out> {
    let Some((_, Some(over))) = items_in_scope(ctx).into_iter().find(|(n, _)| n == name) else {
        return Vec::new();
    };
    let over: Vec<&str> = over.trim().split('.').map(str::trim).collect();
    let ["stages", id, "output", path @ ..] = over.as_slice() else {
        return Vec::new();
    };
    let Some(root) = ctx
        .stage(id)
        .and_then(|s| s.fact)
        .and_then(|f| f.schema.as_deref())
    else {
        return Vec::new();
    };
    let Some(list) = schema_at(root, root, path) else {
        return Vec::new();
    };
    let Some(item) = resolve(root, list).get("items") else {
        return Vec::new();
    };
    match schema_at(root, item, rest) {
        Some(node) => fields_of(root, node, r),
        None => Vec::new(),
    }
}

/// The properties of a schema node, as completion items.
fn fields_of(root: &Value, node: &Value, r: std::ops::Range<usize>) -> Vec<Out> {
    let required: Vec<&str> = resolve(root, node)
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    properties(root, node, 0)
        .into_iter()
        .enumerate()
        .map(|(i, (name, v))| {
            let v = resolve(root, v);
            let ty = match v.get("type") {
                Some(Value::String(t)) => t.clone(),
                Some(Value::Array(ts)) => ts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" | "),
                _ => "any".to_string(),
            };
            let desc = v.get("description").and_then(Value::as_str);
            let detail = match desc {
                Some(d) => d.to_string(),
                None => ty.clone(),
            };
            let req = if required.contains(&name.as_str()) {
                "required"
            } else {
                "optional"
            };
            Out::new(&name, CompletionItemKind::FIELD, r.clone())
                .detail(detail)
                .doc(format!("`{ty}`, {req}"))
                .sort(format!("{i:03}"))
        })
        .collect()
}

/// A schema node with a local `$ref` followed.
fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    let mut node = node;
    for _ in 0..8 {
        match node
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
        {
            Some(pointer) => match root.pointer(pointer) {
                Some(n) => node = n,
                None => return node,
            },
            None => return node,
        }
    }
    node
}

/// The properties of a schema node, those of its `allOf` / `anyOf` / `oneOf` branches
/// included, first one of a name wins.
fn properties<'a>(root: &'a Value, node: &'a Value, depth: usize) -> Vec<(String, &'a Value)> {
    let node = resolve(root, node);
    let mut out: Vec<(String, &Value)> = Vec::new();
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            out.push((k.clone(), v));
        }
    }
    if depth < 4 {
        for key in ["allOf", "anyOf", "oneOf"] {
            for branch in node
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for (k, v) in properties(root, branch, depth + 1) {
                    if !out.iter().any(|(o, _)| *o == k) {
                        out.push((k, v));
                    }
                }
            }
        }
    }
    out
}
