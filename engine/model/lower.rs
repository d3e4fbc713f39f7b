//! Builds the typed model from a syntax tree whose shape has been checked.
//!
//! Values of the wrong shape were already reported by [`super::shape`]; here they are skipped.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::*;
use crate::source::{FileId, Span, Spanned};
use crate::spec;
use crate::syntax::tree::{Table, Value, ValueKind};

/// Checks the shape of a parsed file and builds its model.
pub fn lower(file: FileId, root: &Table, diags: &mut Diagnostics) -> Workflow {
    lower_file(file, root, false, diags)
}

/// Like [`lower`], for a file pulled in by `include`: it needs no `name` (an include adds
/// its definitions to the including workflow, whose name is the run's).
pub fn lower_included(file: FileId, root: &Table, diags: &mut Diagnostics) -> Workflow {
    lower_file(file, root, true, diags)
}

fn lower_file(file: FileId, root: &Table, included: bool, diags: &mut Diagnostics) -> Workflow {
    let mut shape = Diagnostics::default();
    super::shape::check_table(root, &spec::WORKFLOW, &mut shape);
    // Not required by the spec, whose JSON Schema cannot tell an included file apart.
    if !included && root.get("name").is_none() {
        shape.push(
            Diagnostic::new(Code::MissingKey, None, "missing key `name` in workflow")
                .help_syntax(
                    "name the workflow at the top of the file, such as name = \"my-flow\" (only a file pulled in by `include` needs none)",
                    "name the workflow at the top of the file, such as name \"my-flow\" (only a file pulled in by `include` needs none)",
                )
                .adding_key(None, "name", "\"my-flow\""),
        );
    }
    for mut d in shape.into_sorted() {
        if d.span.is_none() {
            d.span = Some(Span::new(file, 0..0));
            d.label = Some("required at the top level".into());
        }
        diags.push(d);
    }
    let t = root;
    let file_span = Span::new(file, 0..0);
    let mut broken = Vec::new();
    for key in ["params", "agents", "resources", "exits"] {
        collect_broken(t, key, &mut broken);
    }
    collect_broken_stages(t, &mut broken);
    Workflow {
        broken,
        file,
        name: text(t, "name").unwrap_or_else(|| Spanned::new(String::new(), file_span)),
        version: text(t, "version"),
        description: text(t, "description"),
        extends: t.get("extends").and_then(|v| {
            if let Some(s) = v.as_str() {
                return Some(Extends {
                    workflow: Spanned::new(s.to_string(), v.span),
                    params: Vec::new(),
                    span: v.span,
                });
            }
            let et = v.as_table()?;
            Some(Extends {
                workflow: text(et, "workflow")?,
                params: map_values(et, "params"),
                span: v.span,
            })
        }),
        include: texts(t, "include"),
        prompt_path: texts(t, "prompt_path"),
        file_roots: texts(t, "file_roots"),
        secrets: texts(t, "secrets"),
        worktree: worktree(root),
        sources: named(t, "sources", source),
        max_concurrency: count(t, "max_concurrency"),
        budget: budget(t),
        params: named(t, "params", param),
        agents: named(t, "agents", agent),
        resources: named(t, "resources", resource),
        exits: named(t, "exits", exit),
        stages: named(t, "stages", stage),
        overrides: named(t, "overrides", override_),
        notify: named(t, "notify", notifier),
        policies: named(t, "policy", policy),
    }
}

/// Records names whose tables cannot be lowered (not a table, or without a valid `kind`/`type`).
fn collect_broken(t: &Table, key: &str, out: &mut Vec<String>) {
    let Some((m, _)) = table(t, key) else { return };
    for e in &m.entries {
        let ok = e.value.as_table().is_some_and(|x| match key {
            "agents" => x
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| AgentKind::parse(k).is_some()),
            "params" => {
                x.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|k| spec::PARAM_TYPES.contains(&k))
                    && item_type(x).is_some()
            }
            "resources" => count(x, "capacity").is_some(),
            "exits" => x.get("code").and_then(Value::as_int).is_some(),
            _ => true,
        });
        if !ok {
            out.push(e.key.clone());
        }
        if key == "agents" {
            if let Some(x) = e.value.as_table() {
                collect_mistyped(key, &e.key, x, out);
            }
        }
    }
}

/// Keys whose presence later checks require (a stage's `prompt`, a loop's `max_iterations`,
/// an agent's `command`, ...) or that give a loop a way out.
const PRESENCE_KEYS: &[&str] = &[
    "prompt",
    "prompt_file",
    "agent",
    "argv",
    "expect",
    "message",
    "workflow",
    "max_iterations",
    "until",
    "stuck",
    "over",
    "command",
    "file",
    "model",
    "timeout",
    "on_timeout",
];

/// The name under which [`Workflow::broken`] records that the table `owner`.`name` (such as
/// `stages`.`plan`) has `key` with a value of the wrong type, already reported by the shape
/// check: such a key counts as present, so that checks do not also report it missing.
pub fn mistyped(owner: &str, name: &str, key: &str) -> String {
    format!("{owner}.{name}.{key}")
}

fn collect_mistyped(owner: &str, name: &str, t: &Table, out: &mut Vec<String>) {
    for key in PRESENCE_KEYS {
        let Some(v) = t.get(key) else { continue };
        let lowers = match *key {
            "max_iterations" => count(t, key).is_some(),
            "argv" | "command" => {
                !texts(t, key).is_empty() || v.as_array().is_some_and(<[Value]>::is_empty)
            }
            "stuck" => v.as_table().is_some_and(|s| text(s, "on").is_some()),
            "timeout" => duration(t, key).is_some(),
            "on_timeout" => action(t, key).is_some(),
            _ => v.as_str().is_some(),
        };
        if !lowers {
            out.push(mistyped(owner, name, key));
        }
    }
}

fn collect_broken_stages(t: &Table, out: &mut Vec<String>) {
    let Some((m, _)) = table(t, "stages") else {
        return;
    };
    for e in &m.entries {
        match e.value.as_table() {
            Some(x)
                if x.get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| StageKind::parse(k).is_some()) =>
            {
                collect_mistyped("stages", &e.key, x, out);
                // An extraction mode that is not one: what the output holds is not known.
                let extract = table(x, "output").and_then(|(o, _)| o.get("extract"));
                if extract.is_some_and(|v| v.as_str().and_then(ExtractMode::parse).is_none()) {
                    out.push(mistyped("stages", &e.key, "output.extract"));
                }
                collect_broken_stages(x, out);
            }
            // Not lowered, and neither are its body's stages: uses of them are not reported
            // as uses of stages that do not exist.
            Some(x) => {
                out.push(e.key.clone());
                all_stage_ids(x, out);
            }
            None => out.push(e.key.clone()),
        }
    }
}

/// Records the ids of every stage in a body, at any depth.
fn all_stage_ids(t: &Table, out: &mut Vec<String>) {
    let Some((m, _)) = table(t, "stages") else {
        return;
    };
    for e in &m.entries {
        out.push(e.key.clone());
        if let Some(x) = e.value.as_table() {
            all_stage_ids(x, out);
        }
    }
}

/// The type of a list param's items (`string` when not given); `None` for one that is not
/// an item type, already reported by the shape check.
fn item_type(t: &Table) -> Option<ParamType> {
    Some(match t.get("items").map(Value::as_str) {
        None => ParamType::String,
        Some(Some("string")) => ParamType::String,
        Some(Some("int")) => ParamType::Int,
        Some(Some("float")) => ParamType::Float,
        Some(Some("bool")) => ParamType::Bool,
        Some(_) => return None,
    })
}

fn text(t: &Table, key: &str) -> Option<Text> {
    let v = t.get(key)?;
    Some(Spanned::new(v.as_str()?.to_string(), v.span))
}

fn texts(t: &Table, key: &str) -> Vec<Text> {
    match t.get(key) {
        Some(Value {
            kind: ValueKind::Array(items),
            ..
        }) => {
            // Sized up front: `filter_map` would start at room for four (160 bytes for the
            // usual one `needs`, on every stage of a long chain).
            let mut out = Vec::with_capacity(items.len());
            out.extend(
                items
                    .iter()
                    .filter_map(|v| Some(Spanned::new(v.as_str()?.to_string(), v.span))),
            );
            out
        }
        Some(v) => v
            .as_str()
            .map(|s| vec![Spanned::new(s.to_string(), v.span)])
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

fn ints(t: &Table, key: &str) -> Vec<Spanned<i64>> {
    match t.get(key) {
        Some(Value {
            kind: ValueKind::Array(items),
            ..
        }) => items
            .iter()
            .filter_map(|v| Some(Spanned::new(v.as_int()?, v.span)))
            .collect(),
        Some(v) => v
            .as_int()
            .map(|i| vec![Spanned::new(i, v.span)])
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

fn count(t: &Table, key: &str) -> Option<Spanned<Count>> {
    let v = t.get(key)?;
    let c = match &v.kind {
        ValueKind::Int(n) => Count::Literal(u64::try_from(*n).ok()?),
        ValueKind::Str(s) if s.contains("{{") => Count::Template(s.clone()),
        _ => return None,
    };
    Some(Spanned::new(c, v.span))
}

fn duration(t: &Table, key: &str) -> Option<Spanned<Dur>> {
    let v = t.get(key)?;
    let d = match &v.kind {
        ValueKind::Int(n) => Dur::Literal(std::time::Duration::from_secs(u64::try_from(*n).ok()?)),
        ValueKind::Str(s) if s.contains("{{") => Dur::Template(s.clone()),
        ValueKind::Str(s) => Dur::Written(parse_duration(s)?, s.trim().to_string()),
        _ => return None,
    };
    Some(Spanned::new(d, v.span))
}

fn boolean(t: &Table, key: &str) -> Option<Spanned<bool>> {
    t.get(key)
        .and_then(|v| Some(Spanned::new(v.as_bool()?, v.span)))
}

fn action(t: &Table, key: &str) -> Option<Spanned<Action>> {
    let v = t.get(key)?;
    Some(Spanned::new(Action::parse(v.as_str()?)?, v.span))
}

fn float(t: &Table, key: &str) -> Option<Spanned<f64>> {
    let v = t.get(key)?;
    let f = match v.kind {
        ValueKind::Int(i) => i as f64,
        ValueKind::Float(f) => f,
        _ => return None,
    };
    Some(Spanned::new(f, v.span))
}

fn table<'a>(t: &'a Table, key: &str) -> Option<(&'a Table, Span)> {
    let v = t.get(key)?;
    Some((v.as_table()?, v.span))
}

fn map_texts(t: &Table, key: &str) -> Vec<(Text, Text)> {
    let Some((m, _)) = table(t, key) else {
        return Vec::new();
    };
    m.entries
        .iter()
        .filter_map(|e| {
            Some((
                Spanned::new(e.key.clone(), e.key_span),
                Spanned::new(e.value.as_str()?.to_string(), e.value.span),
            ))
        })
        .collect()
}

fn map_values(t: &Table, key: &str) -> Vec<(Text, Value)> {
    let Some((m, _)) = table(t, key) else {
        return Vec::new();
    };
    m.entries
        .iter()
        .map(|e| (Spanned::new(e.key.clone(), e.key_span), e.value.clone()))
        .collect()
}

fn named<T>(t: &Table, key: &str, build: fn(Text, &Table, Span) -> Option<T>) -> Vec<T> {
    let Some((m, _)) = table(t, key) else {
        return Vec::new();
    };
    // Sized up front: a workflow of 10,000 stages would otherwise keep a vector grown to
    // 16,384 of them (and hold both while it grows).
    let mut out = Vec::with_capacity(m.entries.len());
    out.extend(m.entries.iter().filter_map(|e| {
        build(
            Spanned::new(e.key.clone(), e.key_span),
            e.value.as_table()?,
            e.value.span,
        )
    }));
    out
}

fn budget(t: &Table) -> Option<Budget> {
    let (b, span) = table(t, "budget")?;
    Some(Budget {
        tokens: count(b, "tokens"),
        cost_usd: float(b, "cost_usd"),
        on_exceeded: action(b, "on_exceeded"),
        span,
    })
}

fn param(name: Text, t: &Table, span: Span) -> Option<Param> {
    let ty_text = text(t, "type")?;
    let ty = match ty_text.value.as_str() {
        "string" => ParamType::String,
        "int" => ParamType::Int,
        "float" => ParamType::Float,
        "bool" => ParamType::Bool,
        "list" => ParamType::List,
        _ => return None,
    };
    let items = item_type(t)?;
    Some(Param {
        name,
        ty: Spanned::new(ty, ty_text.span),
        items,
        default: t.get("default").cloned(),
        description: text(t, "description"),
        choices: t
            .get("choices")
            .and_then(Value::as_array)
            .map(<[Value]>::to_vec)
            .unwrap_or_default(),
        span,
    })
}

fn agent(name: Text, t: &Table, span: Span) -> Option<Agent> {
    let kind_text = text(t, "kind")?;
    let kind = AgentKind::parse(&kind_text)?;
    Some(Agent {
        name,
        kind: Spanned::new(kind, kind_text.span),
        model: text(t, "model"),
        args: texts(t, "args"),
        env: map_texts(t, "env"),
        timeout: duration(t, "timeout"),
        idle_timeout: duration(t, "idle_timeout"),
        context_window: count(t, "context_window"),
        fallbacks: texts(t, "fallbacks"),
        command: texts(t, "command"),
        prompt_via: text(t, "prompt_via")
            .and_then(|v| Some(Spanned::new(PromptVia::parse(&v.value)?, v.span))),
        base_url: text(t, "base_url"),
        api_key_env: text(t, "api_key_env"),
        api: text(t, "api").and_then(|v| Some(Spanned::new(OpenAiApi::parse(&v.value)?, v.span))),
        max_tokens: count(t, "max_tokens"),
        file: text(t, "file"),
        permissions: text(t, "permissions"),
        structured_output: text(t, "structured_output")
            .and_then(|m| Some(Spanned::new(StructuredOutput::parse(&m.value)?, m.span))),
        span,
    })
}

fn resource(name: Text, t: &Table, span: Span) -> Option<Resource> {
    Some(Resource {
        name,
        capacity: count(t, "capacity")?,
        order: texts(t, "order"),
        span,
    })
}

/// Checks the shape of the user's config file and lowers its notifiers.
pub fn lower_user_config(root: &Table, diags: &mut Diagnostics) -> Vec<Notify> {
    super::shape::check_table(root, &spec::USER_CONFIG, diags);
    named(root, "notify", notifier)
}

/// A notifier (`[notify.NAME]`), also of the user's config file.
pub fn notifier(name: Text, t: &Table, span: Span) -> Option<Notify> {
    let kind = text(t, "kind")?;
    let on = t.get("on").map(|v| {
        let items: Vec<&Value> = match &v.kind {
            ValueKind::Array(items) => items.iter().collect(),
            _ => vec![v],
        };
        items
            .into_iter()
            .filter_map(|i| Some(Spanned::new(NotifyEvent::parse(i.as_str()?)?, i.span)))
            .collect()
    });
    Some(Notify {
        kind: Spanned::new(NotifyKind::parse(&kind.value)?, kind.span),
        name,
        url: text(t, "url"),
        url_env: text(t, "url_env"),
        headers_env: map_texts(t, "headers_env"),
        argv: t.get("argv").map(|_| texts(t, "argv")),
        argv_span: t.get("argv").map(|v| v.span),
        on,
        retries: count(t, "retries"),
        timeout: duration(t, "timeout"),
        monitor_url: text(t, "monitor_url"),
        span,
    })
}

/// A permission policy (`[policy.NAME]`).
fn policy(name: Text, t: &Table, span: Span) -> Option<Policy> {
    let edit = t.get("edit").map(|v| {
        let e = match &v.kind {
            ValueKind::Bool(b) => PolicyEdit::Workspace(*b),
            ValueKind::Str(_) | ValueKind::Array(_) => {
                let items: Vec<&Value> = match &v.kind {
                    ValueKind::Array(items) => items.iter().collect(),
                    _ => vec![v],
                };
                let paths: Option<Vec<Text>> = items
                    .into_iter()
                    .map(|i| Some(Spanned::new(i.as_str()?.to_string(), i.span)))
                    .collect();
                paths.map_or(PolicyEdit::Wrong, PolicyEdit::Paths)
            }
            _ => PolicyEdit::Wrong,
        };
        Spanned::new(e, v.span)
    });
    Some(Policy {
        name,
        extends: text(t, "extends"),
        edit,
        allow: texts(t, "allow"),
        deny: texts(t, "deny"),
        network: boolean(t, "network"),
        other: boolean(t, "other"),
        span,
    })
}

fn source(name: Text, t: &Table, span: Span) -> Option<Source> {
    Some(Source {
        name,
        git: text(t, "git")?,
        rev: text(t, "rev")?,
        path: text(t, "path"),
        span,
    })
}

fn exit(name: Text, t: &Table, span: Span) -> Option<Exit> {
    let v = t.get("code")?;
    Some(Exit {
        name,
        code: Spanned::new(v.as_int()?, v.span),
        message: text(t, "message"),
        span,
    })
}

fn command(t: &Table) -> Option<CommandSpec> {
    t.get("argv")?;
    Some(CommandSpec {
        argv: texts(t, "argv"),
        cwd: text(t, "cwd"),
        env: map_texts(t, "env"),
        stdin: text(t, "stdin"),
        ok_codes: ints(t, "ok_codes"),
    })
}

fn stage(id: Text, t: &Table, span: Span) -> Option<Stage> {
    let kind_text = text(t, "kind")?;
    let kind = StageKind::parse(&kind_text)?;
    let body = match kind {
        StageKind::Agent => StageBody::Agent {
            agent: text(t, "agent"),
            prompt: text(t, "prompt"),
            prompt_file: text(t, "prompt_file"),
        },
        StageKind::Command => StageBody::Command(Box::new(command(t).unwrap_or(CommandSpec {
            argv: Vec::new(),
            cwd: None,
            env: Vec::new(),
            stdin: None,
            ok_codes: Vec::new(),
        }))),
        StageKind::Check => StageBody::Check {
            command: command(t).map(Box::new),
            pass_codes: ints(t, "pass_codes"),
            expect: text(t, "expect"),
        },
        StageKind::Gate => StageBody::Gate {
            message: text(t, "message"),
            show: texts(t, "show"),
            on_timeout: action(t, "on_timeout"),
            on_reject: action(t, "on_reject"),
        },
        StageKind::Subflow => StageBody::Subflow {
            workflow: text(t, "workflow"),
            params: map_texts(t, "params"),
        },
        StageKind::Loop => StageBody::Loop(Box::new(LoopBody {
            max_iterations: count(t, "max_iterations"),
            until: text(t, "until"),
            on_exhausted: action(t, "on_exhausted"),
            stuck: table(t, "stuck").and_then(|(s, span)| {
                Some(Box::new(Stuck {
                    on: text(s, "on")?,
                    repeats: count(s, "repeats"),
                    then: action(s, "then"),
                    span,
                }))
            }),
            escalation: escalations(t),
            worktree: worktree(t).map(Box::new),
            stages: named(t, "stages", stage),
        })),
        StageKind::ForEach => StageBody::ForEach(Box::new(ForEachBody {
            over: text(t, "over"),
            as_name: text(t, "as"),
            key: text(t, "key"),
            max_concurrency: count(t, "max_concurrency"),
            aggregate: aggregate(t).map(Box::new),
            result: text(t, "result"),
            worktree: worktree(t).map(Box::new),
            stages: named(t, "stages", stage),
        })),
        StageKind::Group => StageBody::Group {
            max_concurrency: count(t, "max_concurrency"),
            aggregate: aggregate(t).map(Box::new),
            result: text(t, "result"),
            stages: named(t, "stages", stage),
        },
    };
    let keys = StageKeys {
        description: text(t, "description"),
        when: text(t, "when"),
        labels: texts(t, "labels"),
        route: table(t, "route").and_then(|(r, span)| {
            let cases = table(r, "cases")
                .map(|(c, _)| {
                    c.entries
                        .iter()
                        .filter_map(|e| {
                            let a = Action::parse(e.value.as_str()?)?;
                            Some((
                                Spanned::new(e.key.clone(), e.key_span),
                                Spanned::new(a, e.value.span),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(Box::new(Route {
                on: text(r, "on")?,
                cases,
                default: action(r, "default"),
                span,
            }))
        }),
        on_fail: action(t, "on_fail"),
        on_error: action(t, "on_error"),
        then: action(t, "then"),
        optional: boolean(t, "optional"),
        feedback: text(t, "feedback"),
        timeout: duration(t, "timeout"),
        idle_timeout: duration(t, "idle_timeout"),
        retries: count(t, "retries"),
        resource: text(t, "resource"),
        priority: text(t, "priority"),
        budget: budget(t).map(Box::new),
        output: table(t, "output").map(|(o, span)| Box::new(output(o, span))),
        permissions: text(t, "permissions"),
    };
    Some(Stage::new(
        id,
        kind_text.span,
        span,
        texts(t, "needs"),
        body,
        keys,
    ))
}

fn output(o: &Table, span: Span) -> OutputSpec {
    let schema = o.get("schema").map(|v| match v.as_str() {
        Some(s) => SchemaRef::File(Spanned::new(s.to_string(), v.span)),
        None => SchemaRef::Inline(Spanned::new(v.to_json(), v.span)),
    });
    OutputSpec {
        extract: text(o, "extract")
            .and_then(|v| Some(Spanned::new(ExtractMode::parse(&v.value)?, v.span))),
        schema,
        pattern: text(o, "pattern"),
        markers: named(o, "markers", |name, m, span| {
            Some(Marker {
                name,
                prefix: text(m, "prefix"),
                pattern: text(m, "pattern"),
                many: m.get("many").and_then(Value::as_bool).unwrap_or(false),
                values: texts(m, "values"),
                span,
            })
        }),
        files: texts(o, "files"),
        span,
    }
}

fn escalations(t: &Table) -> Vec<Escalation> {
    let one = |v: &Value| {
        let e = v.as_table()?;
        Some(Escalation {
            when: text(e, "when")?,
            run: texts(e, "run"),
            description: text(e, "description"),
            span: v.span,
        })
    };
    match t.get("escalation") {
        Some(Value {
            kind: ValueKind::Array(items),
            ..
        }) => items.iter().filter_map(one).collect(),
        Some(v) => one(v).into_iter().collect(),
        None => Vec::new(),
    }
}

fn aggregate(t: &Table) -> Option<Aggregate> {
    let (a, span) = table(t, "aggregate")?;
    Some(Aggregate {
        mode: text(a, "mode")
            .and_then(|v| Some(Spanned::new(AggregateMode::parse(&v.value)?, v.span)))?,
        field: text(a, "field"),
        order: texts(a, "order"),
        span,
    })
}

fn worktree(t: &Table) -> Option<Worktree> {
    let (w, span) = table(t, "worktree")?;
    Some(Worktree {
        branch: text(w, "branch")?,
        base: text(w, "base"),
        cleanup: text(w, "cleanup")
            .and_then(|v| Some(Spanned::new(Cleanup::parse(&v.value)?, v.span))),
        span,
    })
}

fn override_(stage: Text, t: &Table, span: Span) -> Option<Override> {
    Some(Override {
        stage,
        prompt: text(t, "prompt"),
        prompt_file: text(t, "prompt_file"),
        agent: text(t, "agent"),
        timeout: duration(t, "timeout"),
        idle_timeout: duration(t, "idle_timeout"),
        retries: count(t, "retries"),
        max_iterations: count(t, "max_iterations"),
        max_concurrency: count(t, "max_concurrency"),
        when: text(t, "when"),
        optional: boolean(t, "optional"),
        budget: budget(t),
        span,
    })
}

/// Reports a value that is not valid for a param of the given type.
pub fn param_value_error(
    value: &Value,
    ty: ParamType,
    items: ParamType,
    name: &str,
) -> Option<Diagnostic> {
    let scalar = |v: &Value, ty: ParamType| match ty {
        ParamType::String => v.as_str().is_some(),
        ParamType::Int => v.as_int().is_some(),
        ParamType::Float => matches!(v.kind, ValueKind::Int(_) | ValueKind::Float(_)),
        ParamType::Bool => v.as_bool().is_some(),
        ParamType::List => false,
    };
    let item_word = |t: ParamType| match t {
        ParamType::Int => "whole numbers",
        ParamType::Float => "numbers",
        ParamType::Bool => "booleans",
        _ => "strings",
    };
    if ty == ParamType::List {
        let Some(array) = value.as_array() else {
            return Some(
                Diagnostic::new(
                    Code::ParamType,
                    value.span,
                    format!(
                        "param `{name}` is a list of {}, but this value is {}",
                        item_word(items),
                        value.type_name()
                    ),
                )
                .label("expected a list"),
            );
        };
        let wrong = array.iter().find(|v| !scalar(v, items))?;
        let hint = match wrong.kind {
            ValueKind::Int(_) => Some("int"),
            ValueKind::Float(_) => Some("float"),
            ValueKind::Bool(_) => Some("bool"),
            _ => None,
        };
        let mut d = Diagnostic::new(
            Code::ParamType,
            wrong.span,
            format!(
                "param `{name}` is a list of {}, but this item is {}",
                item_word(items),
                wrong.type_name()
            ),
        )
        .label(format!("expected one of the list's {}", item_word(items)));
        if let (Some(h), true) = (hint, items == ParamType::String) {
            d = d.help(format!(
                "for a list of {}, add `items = \"{h}\"` to the param",
                item_word(match h {
                    "int" => ParamType::Int,
                    "float" => ParamType::Float,
                    _ => ParamType::Bool,
                })
            ));
        }
        return Some(d);
    }
    (!scalar(value, ty)).then(|| {
        Diagnostic::new(
            Code::ParamType,
            value.span,
            format!(
                "param `{name}` is of type {}, but this value is {}",
                ty.as_str(),
                value.type_name()
            ),
        )
        .label(format!("expected {}", ty.as_str()))
    })
}
