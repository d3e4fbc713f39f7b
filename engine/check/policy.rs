//! Permission policies (`[policy.NAME]`) and the `permissions` that name them: names that
//! are neither a level nor a policy (RF075), policies that extend each other (RF076),
//! values that cannot work (RF077), policies nobody names (RF078), and permissions an
//! agent's kind cannot enforce (RF079).

use std::collections::HashSet;

use super::Checked;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::policy::{Unresolved, chain, level_of, resolve};
use crate::model::{Agent, Policy, PolicyEdit, StageBody, Text};
use crate::permit::{LEVELS, Pattern};
use crate::source::Span;

/// Checks every policy and every `permissions` of the workflow.
pub(super) fn check(checked: &Checked<'_>, diags: &mut Diagnostics) {
    let wf = checked.workflow;
    let policies = &wf.policies;
    for p in policies {
        check_policy(p, policies, diags);
    }
    let mut used: HashSet<&str> = HashSet::new();
    /// Marks the policies a name leads to, through `extends`, as used (a cycle too).
    fn mark<'p>(name: &str, policies: &'p [Policy], used: &mut HashSet<&'p str>) {
        let mut name = name;
        while !LEVELS.contains(&name) {
            let Some(p) = policies.iter().find(|p| p.name.value == name) else {
                return;
            };
            if !used.insert(p.name.value.as_str()) {
                return;
            }
            name = p.extends.as_ref().map_or("read-only", |e| e.value.as_str());
        }
    }
    for a in &wf.agents {
        let Some(name) = &a.permissions else { continue };
        mark(&name.value, policies, &mut used);
        if known(name, policies, "agent", diags) {
            enforceable(a, name, policies, None, diags);
        }
    }
    for info in &checked.stages {
        let stage = info.stage;
        let Some(name) = &stage.keys().permissions else {
            continue;
        };
        if !matches!(stage.body, StageBody::Agent { .. }) {
            continue; // the shape check said the key is not for the kind
        }
        mark(&name.value, policies, &mut used);
        if known(name, policies, "stage", diags) {
            for (a, _) in checked.stage_agents(stage) {
                enforceable(a, name, policies, Some(&stage.id.value), diags);
            }
        }
    }
    for p in policies {
        // One named like a level is an error of its own (RF077).
        if !used.contains(p.name.value.as_str()) && !LEVELS.contains(&p.name.value.as_str()) {
            diags.push(
                Diagnostic::new(
                    Code::UnusedPolicy,
                    p.name.span,
                    format!("policy `{}` is named by no `permissions`", p.name.value),
                )
                .label("not used")
                .help_syntax(
                    format!(
                        "name it in an agent's or an agent stage's `permissions = \"{}\"`, or remove it",
                        p.name.value
                    ),
                    format!(
                        "name it in an agent's or an agent stage's `permissions \"{}\"`, or remove it",
                        p.name.value
                    ),
                ),
            );
        }
    }
}

/// The levels and the workflow's policies, for messages: `read-only`, `edit`, ... `wiggum`.
fn names(policies: &[Policy]) -> String {
    LEVELS
        .iter()
        .copied()
        .chain(policies.iter().map(|p| p.name.value.as_str()))
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a `permissions` names a level or a policy; says so when not (its own chain's
/// problems are the policy's, reported there).
fn known(name: &Text, policies: &[Policy], owner: &str, diags: &mut Diagnostics) -> bool {
    let n = name.value.as_str();
    if LEVELS.contains(&n) || policies.iter().any(|p| p.name.value == n) {
        return true;
    }
    let candidates = LEVELS
        .iter()
        .copied()
        .chain(policies.iter().map(|p| p.name.value.as_str()));
    let mut d = Diagnostic::new(
        Code::UnknownPolicy,
        name.span,
        format!("`permissions` of {owner} names `{n}`, which is neither a level nor a policy"),
    )
    .label("unknown permissions");
    d = match crate::model::policy::well_known(n) {
        Some((toml, kdl, right)) => d.help_syntax(toml, kdl).replacing(n, right),
        None => match crate::diag::closest(n, candidates) {
            Some(best) => d
                .help(format!(
                    "did you mean `{best}`? The levels and this workflow's policies are {}",
                    names(policies)
                ))
                .replacing(n, best),
            None => d.help_syntax(
                format!(
                    "name a level or a policy: {}; or declare [policy.{n}]",
                    names(policies)
                ),
                format!(
                    "name a level or a policy: {}; or declare policy \"{n}\" {{ ... }}",
                    names(policies)
                ),
            ),
        },
    };
    diags.push(d);
    false
}

fn check_policy(p: &Policy, policies: &[Policy], diags: &mut Diagnostics) {
    let name = &p.name.value;
    if LEVELS.contains(&name.as_str()) {
        diags.push(
            Diagnostic::new(
                Code::PolicyValue,
                p.name.span,
                format!("policy `{name}` has the name of a level"),
            )
            .label("a level's name")
            .help(format!(
                "give it a name of its own; to start from the level, write extends = \"{name}\""
            )),
        );
    }
    if let Some(e) = &p.extends {
        let target = e.value.as_str();
        if !LEVELS.contains(&target) && !policies.iter().any(|q| q.name.value == target) {
            let candidates = LEVELS
                .iter()
                .copied()
                .chain(policies.iter().map(|q| q.name.value.as_str()))
                .filter(|c| c != name);
            let d = Diagnostic::new(
                Code::UnknownPolicy,
                e.span,
                format!(
                    "policy `{name}` extends `{target}`, which is neither a level nor a policy"
                ),
            )
            .label("unknown level or policy");
            let d = match crate::diag::closest(target, candidates) {
                Some(best) => d
                    .help(format!(
                        "did you mean `{best}`? The levels and this workflow's policies are {}",
                        names(policies)
                    ))
                    .replacing(target, best),
                None => d.help(format!(
                    "extend a level or another policy: {}",
                    names(policies)
                )),
            };
            diags.push(d);
        } else if let Err(Unresolved::Cycle(names)) = chain(name, policies) {
            // Reported once, at the first of the cycle's policies as declared.
            let first = policies
                .iter()
                .find(|q| names.contains(&q.name.value))
                .is_some_and(|q| std::ptr::eq(q, p));
            if first {
                diags.push(
                    Diagnostic::new(
                        Code::PolicyCycle,
                        e.span,
                        format!(
                            "policies extend each other in a cycle: {}",
                            names
                                .iter()
                                .map(|n| format!("`{n}`"))
                                .collect::<Vec<_>>()
                                .join(" extends ")
                        ),
                    )
                    .label("extends a policy that extends it back")
                    .help("one of them must extend a level (`read-only`, `edit`, `commit`, `full`) or a policy outside the cycle"),
                );
            }
        }
    }
    for t in p.allow.iter().chain(&p.deny) {
        if let Err(why) = Pattern::parse(&t.value) {
            diags.push(
                Diagnostic::new(
                    Code::PolicyValue,
                    t.span,
                    format!("command pattern `{}` of policy `{name}`: {why}", t.value),
                )
                .label("not a command pattern")
                .help("a pattern is a command's words, each a glob (`*`, `?`, `[...]`), a last `*` for any further words: `git commit *`, `cargo test`"),
            );
        }
    }
    if let Some(e) = &p.edit {
        match &e.value {
            PolicyEdit::Wrong => diags.push(
                Diagnostic::new(
                    Code::PolicyValue,
                    e.span,
                    format!("`edit` of policy `{name}` is not `true`, `false` or a list of paths"),
                )
                .label("neither a boolean nor paths")
                .help_syntax(
                    "write edit = true (any file of the workspace), edit = false, or globs relative to the workspace, edit = [\"src/**\", \"tests\"]",
                    "write edit #true (any file of the workspace), edit #false, or globs relative to the workspace, edit \"src/**\" \"tests\"",
                ),
            ),
            PolicyEdit::Paths(paths) => {
                for path in paths {
                    edit_path(name, path, diags);
                }
            }
            PolicyEdit::Workspace(_) => {}
        }
    }
}

/// An `edit` glob: one that parses, relative to the workspace and inside it.
fn edit_path(name: &str, path: &Text, diags: &mut Diagnostics) {
    let g = path.value.as_str();
    let problem = if g.trim().is_empty() {
        Some("is empty".to_owned())
    } else if g.starts_with('/') || g.starts_with('~') {
        Some("is not relative to the workspace".to_owned())
    } else if g.split('/').any(|part| part == "..") {
        Some("leads out of the workspace with `..`".to_owned())
    } else {
        glob::Pattern::new(g)
            .err()
            .map(|e| format!("is not a valid glob: {e}"))
    };
    if let Some(problem) = problem {
        diags.push(
            Diagnostic::new(
                Code::PolicyValue,
                path.span,
                format!("`edit` path `{g}` of policy `{name}` {problem}"),
            )
            .label("not a path the agent can be given")
            .help("write globs relative to the workspace, inside it: `src/**`, `tests/*.rs`, `docs` (a directory names what is in it)"),
        );
    }
}

/// A `permissions` (of the agent, or of a stage that calls it) that the agent's kind can
/// enforce: any for a client that answers each request; for an agent CLI, only a level its
/// own flags express.
fn enforceable(
    a: &Agent,
    name: &Text,
    policies: &[Policy],
    stage: Option<&str>,
    diags: &mut Diagnostics,
) {
    let kind = a.kind.value;
    if !crate::model::policy::takes_permissions(kind) {
        // Only a stage's `permissions` gets here (the shape check refuses the agent's).
        diags.push(
            Diagnostic::new(
                Code::PolicyNotEnforceable,
                name.span,
                format!(
                    "stage `{}`'s `permissions` cannot be enforced: agent `{}` is of kind `{}`, which takes no permissions",
                    stage.unwrap_or_default(),
                    a.name.value,
                    kind.as_str()
                ),
            )
            .label("nothing enforces it")
            .related(a.kind.span, "the agent's kind")
            .help("remove the stage's `permissions`, or give the stage an agent that runs tools under permissions (an agent CLI, or an `acp` agent for a policy's own rules)"),
        );
        return;
    }
    if !kind.is_agent_cli() {
        return; // a client that answers each request enforces any policy
    }
    let Ok(rules) = resolve(&name.value, policies, &|_| String::new()) else {
        return; // the policy's own error
    };
    let level = level_of(&rules);
    let whose = match stage {
        Some(s) => format!("stage `{s}`'s `permissions`"),
        None => "its `permissions`".to_owned(),
    };
    let agent = &a.name.value;
    let kind_name = kind.as_str();
    let alternatives = "use an `acp` agent, whose permission requests ralph-flow answers by the policy, or a level the CLI enforces: `read-only`, `edit` (no commits) or `full` (anything, `git push` too)";
    match level {
        Some("commit") => {
            let mut d = Diagnostic::new(
                Code::PolicyNotEnforceable,
                name.span,
                format!(
                    "agent `{agent}` (kind `{kind_name}`) cannot enforce the `commit` level of {whose}: the {kind_name} CLI is not told to allow commits and deny pushes"
                ),
            )
            .label("not enforceable by an agent CLI")
            .help(alternatives);
            if stage.is_some() {
                d = d.related(a.kind.span, "the agent's kind");
            }
            diags.push(d);
        }
        Some(_) => {}
        None => {
            let Ok((chain, base)) = chain(&name.value, policies) else {
                return;
            };
            let rules_written: Vec<(&Policy, &'static str, Span)> = chain
                .iter()
                .flat_map(|p| p.rule_keys().into_iter().map(move |(k, s)| (*p, k, s)))
                .collect();
            let said = if rules_written.is_empty() {
                "the rules it comes down to".to_owned()
            } else {
                rules_written
                    .iter()
                    .map(|(p, k, _)| format!("`{k}` of policy `{}`", p.name.value))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut d = Diagnostic::new(
                Code::PolicyNotEnforceable,
                name.span,
                format!(
                    "agent `{agent}` (kind `{kind_name}`) cannot enforce policy `{}` of {whose}: the {kind_name} CLI knows only its own permission modes, not {said} (over the `{base}` level)",
                    name.value
                ),
            )
            .label("not enforceable by an agent CLI")
            .help(alternatives);
            for (p, k, s) in rules_written.iter().take(3) {
                d = d.related(*s, format!("`{k}` of policy `{}`", p.name.value));
            }
            diags.push(d);
        }
    }
}
