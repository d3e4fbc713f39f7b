//! Subflows: another workflow run as one stage, in the same run.

use serde_json::json;

use super::exec::*;
use super::frame::*;
use super::now_ms;
use crate::backend::Usage;
use crate::compile::NodeId;
use crate::model::StageBody;

impl Exec<'_> {
    pub(super) async fn run_subflow(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let StageBody::Subflow {
            workflow: Some(wf),
            params,
        } = &st.body
        else {
            return self.fail_now(started, "a subflow needs `workflow`".into());
        };
        let path = crate::compile::subflow_path(self.sources, wf);
        let ctx = self.context(frame, &[]);
        let mut sets = Vec::new();
        for (k, _) in params {
            match self.render(&format!("{}/params/{}", node.name, k.value), &ctx) {
                Ok(v) => sets.push((k.value.clone(), v)),
                Err(e) => {
                    let why = crate::diag::error_chain(&e);
                    return self.fail_now(started, format!("param `{}`: {why}", k.value));
                }
            }
        }
        let prepared = match self.shared.subflow(&path, &sets) {
            Ok(p) => p,
            Err(e) => return self.fail_now(started, e.message()),
        };
        let prefix = format!("{}>", frame.child_scope(&node.name));
        let prefix = if self.prefix.is_empty() {
            prefix
        } else {
            format!("{}/{prefix}", self.prefix)
        };
        let child = match Exec::new(self.shared, &prepared.plan, &prepared.sources, prefix) {
            Ok(c) => c,
            Err(e) => return self.fail_now(started, e.message()),
        };
        let top = Frame {
            cwd: frame.cwd.clone(),
            ..Frame::default()
        };
        let end = child.run_body(&top).await;
        let end = match end {
            BodyEnd::Stopped if child.exit.get().is_none() => return Outcome::Stopped,
            BodyEnd::Waiting => return Outcome::Waiting,
            e => child.run_end(e),
        };
        let outputs = top.outputs.ran();
        let super::RunEnd::Exit {
            name,
            code,
            message,
        } = end
        else {
            return Outcome::Stopped;
        };
        let output = json!({"exit": name, "code": code, "outputs": outputs});
        if code == 0 {
            self.done(frame, n, started, output, Usage::default(), 1)
        } else {
            let msg = format!(
                "its workflow ended with `{name}` ({code}){}",
                message.map(|m| format!(": {m}")).unwrap_or_default()
            );
            Outcome::Settled(
                Settled::failed(output, msg, node.on_fail.clone(), started)
                    .spent(1, Usage::default()),
            )
        }
    }
}
