//! `/metrics`: Prometheus text exposition of the store: runs by state, stages by state,
//! tokens and cost by agent, the calls that reported no usage by agent, gates waiting and
//! how long they have waited.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::Monitor;
use super::pages::{blocking, store_failure};
use crate::store::{AttemptState, RunStatus, Store, StoreError, Usage, now_ms};

/// Escapes a label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics text of a store.
pub(super) fn text(store: &mut dyn Store) -> Result<String, StoreError> {
    let mut runs: BTreeMap<&'static str, u64> = [
        "queued",
        "running",
        "waiting",
        "interrupted",
        "orphaned",
        "finished",
        "cancelled",
    ]
    .into_iter()
    .map(|s| (s, 0))
    .collect();
    let mut stages: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_agent: BTreeMap<String, Usage> = BTreeMap::new();
    let mut gates_waiting = 0u64;
    let mut gate_wait_ms = 0i64;
    let mut answered: BTreeMap<&'static str, u64> = BTreeMap::new();
    let now = now_ms();
    for run in store.runs(usize::MAX >> 1)? {
        let gates = store.pending_gates(&run.id)?;
        let lost = super::view::orphaned(store, &run)?;
        let state = if lost {
            "orphaned"
        } else if !gates.is_empty() && run.status != RunStatus::Finished {
            "waiting"
        } else {
            run.status.as_str()
        };
        *runs.entry(state).or_default() += 1;
        gates_waiting += gates.len() as u64;
        gate_wait_ms += gates
            .iter()
            .map(|g| (now - g.requested_at).max(0))
            .sum::<i64>();
        for n in store.nodes(&run.id)? {
            if !n.node.starts_with('@') {
                *stages.entry(n.state.as_str().to_string()).or_default() += 1;
            }
        }
        for a in store.attempts(&run.id, None)? {
            if a.state == AttemptState::Running && run.status == RunStatus::Running && !lost {
                *stages.entry("running".into()).or_default() += 1;
            }
            if let Some(agent) = &a.agent {
                by_agent.entry(agent.clone()).or_default().add(&a.usage);
            }
        }
        for e in store.events(&run.id, None)? {
            match e.kind.as_str() {
                "approved" => *answered.entry("approved").or_default() += 1,
                "rejected" => *answered.entry("rejected").or_default() += 1,
                _ => {}
            }
        }
    }
    let mut out = String::new();
    out.push_str("# HELP ralph_flow_runs Runs by state.\n# TYPE ralph_flow_runs gauge\n");
    for (s, n) in &runs {
        let _ = writeln!(out, "ralph_flow_runs{{state=\"{s}\"}} {n}");
    }
    out.push_str("# HELP ralph_flow_stages Stages by state (settled, and attempts running now).\n# TYPE ralph_flow_stages gauge\n");
    for (s, n) in &stages {
        let _ = writeln!(out, "ralph_flow_stages{{state=\"{}\"}} {n}", label(s));
    }
    out.push_str("# HELP ralph_flow_tokens_total Tokens used, by agent and direction, as reported (an agent none of whose calls reported usage has no sample; see ralph_flow_usage_unreported_calls_total).\n# TYPE ralph_flow_tokens_total counter\n");
    // An unknown is not a 0: an agent whose calls all reported no usage has no sample.
    for (agent, u) in by_agent.iter().filter(|(_, u)| !u.is_unknown()) {
        let a = label(agent);
        let _ = writeln!(
            out,
            "ralph_flow_tokens_total{{agent=\"{a}\",direction=\"input\"}} {}",
            u.input_tokens
        );
        let _ = writeln!(
            out,
            "ralph_flow_tokens_total{{agent=\"{a}\",direction=\"output\"}} {}",
            u.output_tokens
        );
    }
    out.push_str("# HELP ralph_flow_usage_unreported_calls_total Agent calls that reported no usage (their tokens are not in ralph_flow_tokens_total), by agent.\n# TYPE ralph_flow_usage_unreported_calls_total counter\n");
    for (agent, u) in &by_agent {
        let _ = writeln!(
            out,
            "ralph_flow_usage_unreported_calls_total{{agent=\"{}\"}} {}",
            label(agent),
            u.unreported
        );
    }
    out.push_str("# HELP ralph_flow_cost_usd_total Cost reported by the backends, by agent (an agent none of whose calls reported a cost has no sample).\n# TYPE ralph_flow_cost_usd_total counter\n");
    // Nor is a cost never reported a 0: codex's and openai's calls report none.
    for (agent, cost) in by_agent.iter().filter_map(|(a, u)| Some((a, u.cost_usd?))) {
        let _ = writeln!(
            out,
            "ralph_flow_cost_usd_total{{agent=\"{}\"}} {cost}",
            label(agent),
        );
    }
    let _ = writeln!(
        out,
        "# HELP ralph_flow_gates_waiting Gates waiting for a person.\n# TYPE ralph_flow_gates_waiting gauge\nralph_flow_gates_waiting {gates_waiting}"
    );
    let _ = writeln!(
        out,
        "# HELP ralph_flow_gate_wait_seconds How long the waiting gates have waited, summed.\n# TYPE ralph_flow_gate_wait_seconds gauge\nralph_flow_gate_wait_seconds {}",
        gate_wait_ms as f64 / 1000.0
    );
    out.push_str("# HELP ralph_flow_gate_answers_total Gates answered, by decision.\n# TYPE ralph_flow_gate_answers_total counter\n");
    for d in ["approved", "rejected"] {
        let _ = writeln!(
            out,
            "ralph_flow_gate_answers_total{{decision=\"{d}\"}} {}",
            answered.get(d).copied().unwrap_or(0)
        );
    }
    Ok(out)
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(m): State<Arc<Monitor>>) -> Response {
    match blocking(&m, |m| {
        m.with_store(text)
            .map(Option::unwrap_or_default)
            .map_err(|e| store_failure(&e))
    })
    .await
    {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::secrets::redact(&body).into_owned(),
        )
            .into_response(),
        Err(f) => f.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AttemptRecord, Location, OpenOptions, RunRecord, Write};

    /// Tokens and cost are samples only of what an agent reported: an agent that reports
    /// tokens but no cost (codex, openai) has no cost sample, not a 0.
    #[test]
    fn a_cost_no_call_reported_has_no_sample() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Location::StateDir(dir.path().to_path_buf())
            .open(&OpenOptions::default())
            .expect("open");
        s.create_run(&RunRecord {
            id: "r".into(),
            workflow: "w".into(),
            file: "w.toml".into(),
            workflow_hash: String::new(),
            params: serde_json::json!({}),
            status: RunStatus::Finished,
            exit: Some(("done".into(), 0)),
            started_at: 1,
            updated_at: 2,
            dir: "d".into(),
            options: serde_json::json!({}),
        })
        .expect("create");
        let attempt = |node: &str, agent: &str, cost_usd: Option<f64>| {
            Write::Attempt(AttemptRecord {
                run: "r".into(),
                scope: String::new(),
                node: node.into(),
                attempt: 1,
                state: AttemptState::Ok,
                agent: Some(agent.into()),
                dir: format!("d/{node}"),
                error: None,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 2,
                    cost_usd,
                    ..Usage::default()
                },
                started_at: 1,
                finished_at: Some(2),
            })
        };
        s.commit(&[
            attempt("a", "codex", None),
            attempt("b", "claude", Some(0.25)),
        ])
        .expect("commit");
        let text = text(s.as_mut()).expect("metrics");
        assert!(
            text.contains("ralph_flow_tokens_total{agent=\"codex\",direction=\"input\"} 10"),
            "{text}"
        );
        assert!(
            text.contains("ralph_flow_cost_usd_total{agent=\"claude\"} 0.25"),
            "{text}"
        );
        assert!(
            !text.contains("ralph_flow_cost_usd_total{agent=\"codex\""),
            "no 0 for a cost never reported: {text}"
        );
    }
}
