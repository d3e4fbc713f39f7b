//! The template context: what prompts, commands and expressions see.

use std::collections::{BTreeMap, HashSet};

use minijinja::Value;

use super::exec::*;
use super::frame::*;
use crate::store::{NodeState, rfc3339};

impl Exec<'_> {
    /// Builds the template context of a frame, with extra variables.
    pub fn context(&self, frame: &Frame<'_>, extra: &[(&str, Value)]) -> Value {
        let chain = frame.chain();
        let mut stages: BTreeMap<String, BTreeMap<&'static str, Value>> = BTreeMap::new();
        let mut vars: BTreeMap<String, Value> = BTreeMap::new();
        let mut loops: BTreeMap<String, Value> = BTreeMap::new();
        for f in &chain {
            if let Some(last) = f.earlier.last() {
                let mut names: HashSet<&String> = HashSet::new();
                for it in f.earlier.iter() {
                    names.extend(it.keys());
                }
                for name in names {
                    let e = stages.entry(name.clone()).or_default();
                    e.insert("last", last.get(name).map(jv).unwrap_or(Value::from(())));
                    let hist: Vec<Value> = f
                        .earlier
                        .iter()
                        .filter_map(|m| m.get(name).map(jv))
                        .collect();
                    e.insert("history", Value::from(hist));
                }
            }
            for (name, v) in f.outputs.borrow().iter() {
                let e = stages.entry(name.clone()).or_default();
                e.insert("output", jv(&v.output));
                e.insert("status", Value::from(v.state.as_str()));
                e.insert("ran", Value::from(v.state != NodeState::Skipped));
                e.insert(
                    "feedback",
                    v.feedback.clone().map(Value::from).unwrap_or_default(),
                );
                e.insert("attempts", Value::from(v.attempts));
                e.insert("usage", jv(&v.usage));
            }
            for (k, v) in &f.vars {
                vars.insert(k.clone(), v.clone());
            }
            if let (Some(n), Some(settled)) = (f.region, &f.siblings) {
                let e = stages.entry(self.plan.node(n).name.clone()).or_default();
                e.insert("settled", jv(&*settled.borrow()));
            }
            if let Some((name, v)) = &f.loop_vars {
                loops.insert(name.clone(), v.clone());
            }
        }
        let mut run: BTreeMap<&str, Value> = BTreeMap::new();
        run.insert("id", Value::from(self.shared.run.id.clone()));
        run.insert("dir", Value::from(self.shared.run.dir.clone()));
        run.insert(
            "workflow",
            Value::from(self.plan.workflow.name.value.clone()),
        );
        run.insert(
            "started_at",
            Value::from(rfc3339(self.shared.run.started_at)),
        );
        run.insert("cwd", Value::from(frame.cwd.to_string_lossy().into_owned()));
        let mut ctx: BTreeMap<String, Value> = vars;
        ctx.insert("params".into(), self.params.clone());
        ctx.insert(
            "stages".into(),
            Value::from(
                stages
                    .into_iter()
                    .map(|(k, v)| (k, Value::from(v)))
                    .collect::<BTreeMap<_, _>>(),
            ),
        );
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

    /// Renders a compiled template of the plan (`STAGE/prompt`, ...).
    pub fn render(&self, name: &str, ctx: &Value) -> Result<String, String> {
        let t = self
            .env
            .get_template(name)
            .map_err(|e| format!("template `{name}`: {e}"))?;
        let text = t.render(ctx).map_err(|e| describe_error(&e))?;
        if !name.contains("/argv/") && super::helpers::spread_items(&text).is_some() {
            return Err(
                "`spread` makes one argument per item and works only as a whole argv item of a command or check"
                    .into(),
            );
        }
        Ok(text)
    }

    /// Evaluates an expression (`when`, `until`, `over`, ...).
    pub fn eval(&self, src: &str, ctx: &Value) -> Result<Value, String> {
        let expr = self
            .env
            .compile_expression(src)
            .map_err(|e| describe_error(&e))?;
        expr.eval(ctx)
            .map_err(|e| format!("`{src}`: {}", describe_error(&e)))
    }
}

/// Converts a serializable value for templates.
pub fn jv<T: serde::Serialize + ?Sized>(x: &T) -> Value {
    Value::from(minijinja::value::Serde(x))
}

/// A minijinja error with its cause chain, on one line.
pub fn describe_error(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}
