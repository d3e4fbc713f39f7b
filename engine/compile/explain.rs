//! Describing a plan in words: what runs, in what order, under which conditions, and how
//! each loop ends.

use std::fmt::Write;

use super::{NodeId, Plan, Target};
use crate::model::{Action, Dur, StageBody};

/// Shows a duration as the file writes it ("72h"): a template as it renders with the params
/// in force (`{{ params.gate_timeout }}` with the default "72h" is "72h"), seconds written
/// as a number as seconds.
fn dur(plan: &Plan, d: &Dur) -> String {
    match d {
        Dur::Written(_, text) => text.clone(),
        Dur::Template(t) => match crate::params::resolve_duration(d, &plan.params) {
            Ok(_) => crate::params::render_params(t, &plan.params)
                .map_or_else(|_| t.clone(), |s| s.trim().to_string()),
            Err(_) => t.clone(),
        },
        Dur::Literal(d) => format!("{}s", d.as_secs()),
    }
}

fn target(plan: &Plan, t: &Target) -> String {
    match t {
        Target::Continue => "start the next iteration".into(),
        Target::Break => "leave the loop".into(),
        Target::Fail => "fail".into(),
        Target::Approve => "approve".into(),
        Target::Reject => "reject".into(),
        Target::Exit(e) => format!(
            "end the run with exit `{}` (code {})",
            plan.exits[*e].name, plan.exits[*e].code
        ),
        Target::Stage(s) => format!("go to `{}`", plan.node(*s).name),
    }
}

fn action(plan: &Plan, a: &Action) -> String {
    match a {
        Action::Exit(n) => match plan.exit(n) {
            Some(e) => target(plan, &Target::Exit(e)),
            None => format!("exit {n}"),
        },
        Action::Continue => "start the next iteration".into(),
        Action::Break => "leave the loop".into(),
        Action::Fail => "fail".into(),
        Action::Approve => "approve".into(),
        Action::Reject => "reject".into(),
        Action::Goto(s) => format!("go to `{s}`"),
    }
}

/// Describes the plan in words.
pub fn explain(plan: &Plan) -> String {
    let wf = &plan.workflow;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Workflow `{}`{}",
        wf.name.value,
        wf.version
            .as_ref()
            .map(|v| format!(" version {}", v.value))
            .unwrap_or_default()
    );
    if let Some(d) = &wf.description {
        let _ = writeln!(out, "{}", d.value.trim());
    }
    if !wf.params.is_empty() {
        let _ = writeln!(out, "\nParams:");
        for p in &wf.params {
            let value = plan
                .params
                .get(&p.name.value)
                .map_or("required, no value".to_string(), |v| format!("= {v}"));
            let _ = writeln!(
                out,
                "  {} ({}) {value}{}",
                p.name.value,
                p.ty.value.as_str(),
                p.description
                    .as_ref()
                    .map(|d| format!(" — {}", d.value))
                    .unwrap_or_default()
            );
        }
    }
    if let Some(w) = &wf.worktree {
        let _ = writeln!(
            out,
            "\nThe whole run works in its own git worktree, on branch `{}` (from `{}`); it is removed {}.",
            w.branch.value,
            w.base.as_ref().map_or("HEAD", |b| b.value.as_str()),
            match w.cleanup.as_ref().map(|c| c.value).unwrap_or_default() {
                crate::model::Cleanup::Always => "when the run ends",
                crate::model::Cleanup::Never => "never",
                crate::model::Cleanup::OnSuccess => "when the run succeeds",
            }
        );
    }
    if !wf.agents.is_empty() {
        let _ = writeln!(out, "\nAgents:");
        for a in &wf.agents {
            let model = a
                .model
                .as_ref()
                .map(|m| format!(", model {}", m.value))
                .unwrap_or_default();
            let fb = if a.fallbacks.is_empty() {
                String::new()
            } else {
                format!(
                    ", falls back to {}",
                    a.fallbacks
                        .iter()
                        .map(|f| f.value.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let _ = writeln!(
                out,
                "  {}: {}{model}{fb}",
                a.name.value,
                a.kind.value.as_str()
            );
        }
    }
    let _ = writeln!(out, "\nSteps:");
    body(plan, None, 1, &mut out);
    let _ = writeln!(out, "\nExits:");
    for e in &plan.exits {
        let _ = writeln!(
            out,
            "  {} → code {}{}",
            e.name,
            e.code,
            e.message
                .as_ref()
                .map(|m| format!(": {}", m.trim()))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "  (ralph-flow itself: {})",
        crate::exit::engine_codes_text()
    );
    out
}

fn body(plan: &Plan, region: Option<NodeId>, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    for (n, id) in plan.body(region).order.iter().enumerate() {
        let node = plan.node(*id);
        let s = plan.stage(*id);
        let what = match &s.body {
            StageBody::Agent {
                agent, prompt_file, ..
            } => format!(
                "the agent {} runs with {}",
                agent
                    .as_ref()
                    .map_or("?".into(), |a| format!("`{}`", a.value)),
                prompt_file
                    .as_ref()
                    .map_or("an inline prompt".into(), |p| format!(
                        "the prompt {}",
                        p.value
                    ))
            ),
            StageBody::Command(c) => format!("runs `{}`", c.display()),
            StageBody::Check {
                command, expect, ..
            } => {
                let mut parts = Vec::new();
                if let Some(c) = command {
                    parts.push(format!("`{}` must pass", c.display()));
                }
                if let Some(e) = expect {
                    parts.push(format!("`{}` must hold", e.value));
                }
                format!("checks that {}", parts.join(" and "))
            }
            StageBody::Gate {
                on_timeout,
                on_reject,
                ..
            } => {
                let t = match (&s.keys().timeout, on_timeout) {
                    (Some(t), Some(a)) => format!(
                        "; after {} without an answer: {}",
                        dur(plan, &t.value),
                        action(plan, &a.value)
                    ),
                    _ => "; it waits without a time limit".into(),
                };
                let r = on_reject
                    .as_ref()
                    .map_or_else(|| target(plan, &node.on_fail), |a| action(plan, &a.value));
                format!("waits for a person to approve (`ralph-flow approve`){t}; on reject: {r}")
            }
            StageBody::Subflow { workflow, .. } => format!(
                "runs the workflow {}",
                workflow.as_ref().map_or("", |w| w.value.as_str())
            ),
            StageBody::Loop(l) => {
                let crate::model::LoopBody {
                    max_iterations,
                    until,
                    stuck,
                    on_exhausted,
                    escalation,
                    ..
                } = &**l;
                let mut t = format!(
                    "repeats its body at most {} times",
                    max_iterations
                        .as_ref()
                        .map_or("?".into(), |m| plan.count_text(&m.value))
                );
                if let Some(u) = until {
                    let _ = write!(t, "; it ends when `{}` holds after an iteration", u.value);
                }
                if let Some(st) = stuck {
                    let _ = write!(
                        t,
                        "; it is stuck when `{}` is the same {} times in a row, and then: {}",
                        st.on.value,
                        st.repeats
                            .as_ref()
                            .map_or("2".into(), |r| plan.count_text(&r.value)),
                        st.then
                            .as_ref()
                            .map_or("fail".into(), |a| action(plan, &a.value))
                    );
                }
                let _ = write!(
                    t,
                    "; when the iterations run out: {}",
                    on_exhausted
                        .as_ref()
                        .map_or("fail".into(), |a| action(plan, &a.value))
                );
                for r in escalation {
                    let _ = write!(
                        t,
                        "; when `{}`, it also runs {}",
                        r.when.value,
                        r.run
                            .iter()
                            .map(|x| format!("`{}`", x.value))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                t
            }
            StageBody::ForEach(f) => {
                let crate::model::ForEachBody {
                    over,
                    as_name,
                    max_concurrency,
                    aggregate,
                    ..
                } = &**f;
                let mut t = format!(
                    "runs its body for each `{}` in `{}`",
                    as_name.as_ref().map_or("item", |a| a.value.as_str()),
                    over.as_ref().map_or("", |o| o.value.as_str())
                );
                if let Some(m) = max_concurrency {
                    let _ = write!(t, ", {} at a time", plan.count_text(&m.value));
                }
                if let Some(a) = aggregate {
                    let _ = write!(
                        t,
                        ", and combines the results by `{}`{}",
                        a.mode.value,
                        a.field
                            .as_ref()
                            .map(|f| format!(" of `{}`", f.value))
                            .unwrap_or_default()
                    );
                }
                t
            }
            StageBody::Group { aggregate, .. } => {
                let mut t = "runs its members in parallel".to_string();
                if let Some(a) = aggregate {
                    let _ = write!(
                        t,
                        " and combines the results by `{}`{}",
                        a.mode.value,
                        a.field
                            .as_ref()
                            .map(|f| format!(" of `{}`", f.value))
                            .unwrap_or_default()
                    );
                }
                t
            }
        };
        let mut line = format!("{pad}{}. `{}` {what}", n + 1, node.name);
        if !node.needs.is_empty() {
            let _ = write!(
                line,
                ", after {}",
                node.needs
                    .iter()
                    .map(|x| format!("`{}`", plan.node(*x).name))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if let Some(w) = &s.keys().when {
            let _ = write!(line, ", only when `{}`", w.value);
        }
        if node.skips_with_needs {
            let names: Vec<String> = node
                .needs
                .iter()
                .map(|x| format!("`{}`", plan.node(*x).name))
                .collect();
            let _ = match names.as_slice() {
                [one] => write!(line, ", skipped whenever {one} is skipped"),
                [a, b] => write!(line, ", skipped whenever {a} and {b} are both skipped"),
                [rest @ .., last] => write!(
                    line,
                    ", skipped whenever {} and {last} are all skipped",
                    rest.join(", ")
                ),
                [] => Ok(()),
            };
        }
        if s.keys().is_optional() {
            let _ = write!(
                line,
                ", optional (when skipped, what needs it runs as if it had run)"
            );
        }
        if let Some(r) = &s.keys().resource {
            let _ = write!(line, ", holding `{}`", r.value);
        }
        line.push('.');
        let _ = writeln!(out, "{line}");
        if let Some(r) = &s.keys().route {
            for (value, t) in node.routes() {
                let _ = writeln!(
                    out,
                    "{pad}   when {} is `{value}`: {}",
                    r.on.value,
                    target(plan, t)
                );
            }
            let _ = writeln!(
                out,
                "{pad}   any other value: {}",
                node.route_default()
                    .map_or("fail".into(), |t| target(plan, t))
            );
        }
        if s.keys().on_fail.is_some() {
            let _ = writeln!(out, "{pad}   if it fails: {}", target(plan, &node.on_fail));
        }
        if let Some(t) = &node.then {
            let _ = writeln!(out, "{pad}   then: {}", target(plan, t));
        }
        if s.keys().on_error.is_some() {
            let _ = writeln!(
                out,
                "{pad}   if it cannot run (agent unreachable, timeout): {}",
                target(plan, &node.on_error)
            );
        }
        if node.body.is_some() {
            body(plan, Some(*id), depth + 1, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::diag::Diagnostics;
    use crate::fs::FileSystem;
    use crate::load::Loader;
    use crate::source::Sources;

    struct One(&'static str);

    impl FileSystem for One {
        fn read(&self, _: &Path) -> std::io::Result<String> {
            Ok(self.0.to_string())
        }
    }

    #[test]
    fn durations_show_as_written() {
        let fs = One(
            "name = \"d\"\n[stages.ok]\nkind = \"gate\"\nmessage = \"Go?\"\ntimeout = \"72h\"\non_timeout = \"reject\"\n",
        );
        let mut sources = Sources::new();
        let mut diags = Diagnostics::default();
        let mut loader = Loader::new(&fs, &mut sources, &mut diags);
        let wf = loader.load(Path::new("/w.toml"), None).expect("loads");
        let mut cd = Diagnostics::default();
        let checked = crate::check::check(&wf, &mut loader, &[], false, &mut cd).expect("checks");
        let text = super::explain(&crate::compile::compile(&checked));
        assert!(text.contains("after 72h without an answer"), "{text}");
    }

    #[test]
    fn templated_durations_show_as_the_params_write_them() {
        let fs = One(
            "name = \"d\"\n[params.wait]\ntype = \"string\"\ndefault = \"72h\"\n\
             [params.secs]\ntype = \"int\"\ndefault = 90\n\
             [stages.ok]\nkind = \"gate\"\nmessage = \"Go?\"\ntimeout = \"{{ params.wait }}\"\non_timeout = \"reject\"\n\
             [stages.more]\nkind = \"gate\"\nneeds = [\"ok\"]\nmessage = \"Go?\"\ntimeout = \"{{ params.secs }}s\"\non_timeout = \"reject\"\n",
        );
        let mut sources = Sources::new();
        let mut diags = Diagnostics::default();
        let mut loader = Loader::new(&fs, &mut sources, &mut diags);
        let wf = loader.load(Path::new("/w.toml"), None).expect("loads");
        let mut cd = Diagnostics::default();
        let sets = [("wait".to_string(), "1h30m".to_string())];
        for (sets, shown) in [
            (&[][..], "after 72h without"),
            (&sets[..], "after 1h30m without"),
        ] {
            let checked =
                crate::check::check(&wf, &mut loader, sets, false, &mut cd).expect("checks");
            let text = super::explain(&crate::compile::compile(&checked));
            assert!(text.contains(shown), "{text}");
            assert!(text.contains("after 90s without"), "{text}");
            assert!(
                !text.contains("259200s") && !text.contains("5400s"),
                "{text}"
            );
        }
    }
}
