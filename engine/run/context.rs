//! The template context: what prompts, commands and expressions see.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectRepr};

use super::exec::*;
use super::frame::*;
use crate::store::rfc3339;
use serde_json::Value as Json;

impl Exec<'_> {
    /// Builds the template context of a frame, with extra variables. Its cost does not grow
    /// with the run: `stages` reads the frames' outputs when a template asks for a stage
    /// ([`Stages`]), so only the variables of the frames in the chain are copied.
    pub(super) fn context(&self, frame: &Frame<'_>, extra: &[(&str, Value)]) -> Value {
        let chain = frame.chain();
        let mut vars: BTreeMap<String, Value> = BTreeMap::new();
        let mut loops: BTreeMap<String, Value> = BTreeMap::new();
        let mut parts = Vec::with_capacity(chain.len());
        for f in &chain {
            parts.push(Part {
                outputs: f.outputs.clone(),
                earlier: f.earlier.clone(),
                settled: match (f.region, &f.siblings) {
                    (Some(n), Some(s)) => Some((self.plan.node(n).name.clone(), s.clone())),
                    _ => None,
                },
            });
            for (k, v) in &f.vars {
                vars.insert(k.clone(), v.clone());
            }
            if let Some((name, v)) = &f.loop_vars {
                loops.insert(name.clone(), v.clone());
            }
        }
        let copied = (parts.len() + vars.len() + loops.len()) as u64;
        self.shared.count(|w| {
            w.contexts += 1;
            w.context_items += copied;
        });
        let stages = Value::from_object(Stages { parts });
        let consts = self.shared.run_consts.get_or_init(|| {
            [
                ("id", Value::from(self.shared.run.id.clone())),
                ("dir", Value::from(self.shared.run.dir.clone())),
                (
                    "workflow",
                    Value::from(self.plan.workflow.name.value.clone()),
                ),
                (
                    "started_at",
                    Value::from(rfc3339(self.shared.run.started_at)),
                ),
                (
                    "root",
                    Value::from(self.shared.opts.cwd.to_string_lossy().into_owned()),
                ),
            ]
        });
        let mut run: BTreeMap<&str, Value> = consts.iter().cloned().collect();
        run.insert("cwd", Value::from(frame.cwd.to_string_lossy().into_owned()));
        let mut ctx: BTreeMap<String, Value> = vars;
        ctx.insert("params".into(), self.params.clone());
        ctx.insert("stages".into(), stages);
        ctx.insert("loops".into(), Value::from(loops));
        for (k, v) in extra {
            if *k == "stage_dir" {
                run.insert("stage_dir", v.clone());
            } else {
                ctx.insert((*k).to_string(), v.clone());
            }
        }
        ctx.insert("run".into(), Value::from(run));
        Value::from(ctx)
    }

    /// Tells whether the plan has a template (`STAGE/feedback`, ...).
    pub(super) fn has_template(&self, name: &str) -> bool {
        self.plan.templates.contains_key(name)
    }

    /// Renders a template of the plan (`STAGE/prompt`, ...).
    pub(super) fn render(&self, name: &str, ctx: &Value) -> Result<String, TemplateError> {
        let src = self
            .plan
            .templates
            .get(name)
            .ok_or_else(|| TemplateError::Missing(name.to_string()))?;
        // Text with no template syntax renders as itself (minijinja would drop one newline
        // at the end, so such text goes through it): no parse, no render.
        let text = if src.contains('{') || src.ends_with('\n') {
            self.env.render_named_str(name, src, ctx)?
        } else {
            src.to_string()
        };
        if !name.contains("/argv/") && crate::template::spread_items(&text).is_some() {
            return Err(TemplateError::SpreadOutsideArgv);
        }
        Ok(text)
    }

    /// Evaluates an expression (`when`, `until`, `over`, ...).
    pub(super) fn eval(&self, src: &str, ctx: &Value) -> Result<Value, TemplateError> {
        let expr = self.env.compile_expression(src)?;
        expr.eval(ctx).map_err(|error| TemplateError::Eval {
            expr: src.to_string(),
            error,
        })
    }
}

/// Converts a serializable value for templates.
pub(super) fn to_value<T: serde::Serialize + ?Sized>(x: &T) -> Value {
    Value::from(minijinja::value::Serde(x))
}

/// What one frame of the chain adds to `stages`.
#[derive(Debug)]
struct Part {
    outputs: Arc<Outputs>,
    earlier: Arc<HashMap<String, Value>>,
    /// A for_each item's region and the items settled so far (`stages.FOR_EACH.settled`).
    settled: Option<(String, Arc<Mutex<Vec<Value>>>)>,
}

/// `stages` in templates: a map from stage id to what templates see of it, read from the
/// frames of the chain when a template asks (the innermost frame's keys win). Looking up a
/// stage costs the depth of the chain, whatever the number of stages that have settled.
#[derive(Debug)]
struct Stages {
    /// Outermost first.
    parts: Vec<Part>,
}

impl Stages {
    fn entry(&self, name: &str) -> Option<Value> {
        let mut found: Vec<Value> = Vec::new();
        for p in &self.parts {
            if let Some(e) = p.earlier.get(name) {
                found.push(e.clone());
            }
            if let Some(v) = p.outputs.borrow().get(name) {
                found.push(v.value());
            }
            if let Some((region, settled)) = &p.settled {
                if region == name {
                    let list = settled
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    let mut e: BTreeMap<&str, Value> = BTreeMap::new();
                    e.insert("settled", Value::from(list));
                    found.push(Value::from(e));
                }
            }
        }
        if found.len() <= 1 {
            return found.pop();
        }
        // Parts of the same stage from several frames (a loop's earlier iterations and the
        // current one): one map, the inner frames' keys winning.
        let mut merged: BTreeMap<String, Value> = BTreeMap::new();
        for part in found {
            if let Ok(keys) = part.try_iter() {
                for k in keys {
                    if let (Some(name), Ok(v)) = (k.as_str(), part.get_item(&k)) {
                        merged.insert(name.to_string(), v);
                    }
                }
            }
        }
        Some(Value::from(merged))
    }
}

impl Object for Stages {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.entry(key.as_str()?)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let mut names: BTreeSet<String> = BTreeSet::new();
        for p in &self.parts {
            names.extend(p.earlier.keys().cloned());
            names.extend(p.outputs.borrow().keys().cloned());
            if let Some((region, _)) = &p.settled {
                names.insert(region.clone());
            }
        }
        Enumerator::Values(names.into_iter().map(Value::from).collect())
    }
}

/// `stages.ID.last` and `stages.ID.history` of a loop iteration, from the outputs of the
/// iterations before it (oldest first), by stage.
pub(crate) fn earlier_view(
    history: &BTreeMap<String, Vec<Value>>,
    last: Option<&BTreeMap<String, Json>>,
) -> HashMap<String, Value> {
    let mut out = HashMap::with_capacity(history.len());
    for (name, hist) in history {
        let mut e: BTreeMap<&str, Value> = BTreeMap::new();
        e.insert(
            "last",
            last.and_then(|l| l.get(name))
                .map(to_value)
                .unwrap_or(Value::from(())),
        );
        e.insert("history", Value::from(hist.clone()));
        out.insert(name.clone(), Value::from(e));
    }
    out
}
