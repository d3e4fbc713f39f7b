//! Reference checks: stages, agents, resources, exits and actions name things that exist and
//! fit where they are used; each kind of stage has what it needs.

use super::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Action, Count, Stage, StageBody, is_ident};
use crate::source::Spanned;

pub fn check(c: &mut Checked<'_>, diags: &mut Diagnostics) {
    let wf = c.workflow;
    if !wf.name.value.is_empty()
        && !wf
            .name
            .value
            .chars()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-' || ch == '_')
    {
        diags.push(
            Diagnostic::new(
                Code::InvalidValue,
                wf.name.span,
                format!(
                    "workflow name `{}` has characters other than a-z, 0-9, `-` and `_`",
                    wf.name.value
                ),
            )
            .help(
                "names are used in paths and run ids; use lowercase letters, digits, `-` and `_`",
            ),
        );
    }
    for e in &wf.exits {
        if let Some((_, what)) = crate::exit::ENGINE
            .iter()
            .find(|(code, _)| i64::from(*code) == e.code.value)
        {
            diags.push(
                Diagnostic::new(
                    Code::ReservedExitCode,
                    e.code.span,
                    format!(
                        "exit code {} is what ralph-flow itself returns for a {what}",
                        e.code.value
                    ),
                )
                .help("choose another code so the two can be told apart"),
            );
        }
        if !(0..=255).contains(&e.code.value) {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    e.code.span,
                    "exit codes are between 0 and 255",
                )
                .help("choose a code from 0 to 255"),
            );
        }
    }
    for a in &wf.agents {
        for fb in &a.fallbacks {
            agent_ref(c, fb, diags);
        }
        let missing = match a.kind.value {
            crate::model::AgentKind::Command if a.command.is_empty() => Some("command"),
            crate::model::AgentKind::Replay if a.file.is_none() => Some("file"),
            crate::model::AgentKind::OpenAi | crate::model::AgentKind::Anthropic
                if a.model.is_none() =>
            {
                Some("model")
            }
            _ => None,
        };
        let mistyped_key = |key: &str| {
            c.workflow
                .is_broken(&crate::model::lower::mistyped("agents", &a.name.value, key))
        };
        if let Some(key) = missing.filter(|key| !mistyped_key(key)) {
            diags.push(
                Diagnostic::new(
                    Code::AgentIncomplete,
                    a.kind.span,
                    format!(
                        "agent `{}` of kind `{}` needs `{key}`",
                        a.name.value,
                        a.kind.value.as_str()
                    ),
                )
                .help(format!("add `{key}` to the agent")),
            );
        }
    }
    for r in &wf.resources {
        if r.capacity.value == Count::Literal(0) {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    r.capacity.span,
                    "a resource's capacity must be at least 1",
                )
                .help_syntax("set capacity = 1 for a queue", "set capacity=1 for a queue"),
            );
        }
    }
    if let Some(b) = &wf.budget {
        action_ok(c, None, b.on_exceeded.as_ref(), "on_exceeded", diags);
    }
    for i in 0..c.stages.len() {
        stage(c, StageId(i), diags);
    }
}

fn agent_ref(c: &Checked<'_>, name: &Spanned<String>, diags: &mut Diagnostics) {
    if name.value.contains("{{") {
        return; // checked against param choices by the template check
    }
    if !c.workflow.agents.iter().any(|a| a.name.value == name.value) {
        diags.push(
            Diagnostic::unknown(
                Code::UnknownAgent,
                name.span,
                "agent",
                &name.value,
                c.workflow.agents.iter().map(|a| a.name.value.as_str()),
            )
            .help_or(agent_list(c)),
        );
    }
}

fn agent_list(c: &Checked<'_>) -> String {
    let names: Vec<&str> = c
        .workflow
        .agents
        .iter()
        .map(|a| a.name.value.as_str())
        .collect();
    if names.is_empty() {
        "define it under [agents.NAME]".into()
    } else {
        format!("the agents are: {}", names.join(", "))
    }
}

fn exit_names(c: &Checked<'_>) -> Vec<String> {
    let mut names: Vec<String> = c
        .workflow
        .exits
        .iter()
        .map(|e| e.name.value.clone())
        .collect();
    for (n, _) in crate::exit::IMPLICIT {
        if !names.iter().any(|x| x == n) {
            names.push((*n).to_string());
        }
    }
    names
}

/// Checks an action written on stage `at` (or at the top level for `None`).
/// The keys whose action runs a stage instead of giving up.
const GIVE_UP_KEYS: &[&str] = &["on_exhausted", "stuck.then", "on_timeout"];

/// Tells whether a key's action may name a stage: route cases and defaults, and what a loop
/// or a gate does when it gives up.
fn goes_to_stages(key: &str) -> bool {
    key == "cases" || key == "default" || GIVE_UP_KEYS.contains(&key)
}

fn action_ok(
    c: &Checked<'_>,
    at: Option<StageId>,
    action: Option<&Spanned<Action>>,
    key: &str,
    diags: &mut Diagnostics,
) {
    let Some(action) = action else { return };
    let in_loop = at.is_some_and(|s| c.enclosing_loop(s).is_some());
    match &action.value {
        Action::Continue | Action::Break if !in_loop => diags.push(
            Diagnostic::new(
                Code::ActionOutOfPlace,
                action.span,
                format!("`{}` is only possible inside a loop", action.value),
            )
            .help("use `fail` or `exit:NAME` outside loops"),
        ),
        Action::Approve | Action::Reject if key != "on_timeout" => diags.push(
            Diagnostic::new(
                Code::ActionOutOfPlace,
                action.span,
                format!("`{}` is only possible as a gate's on_timeout", action.value),
            )
            .help("use `continue`, `break`, `fail`, `exit:NAME` or a stage id"),
        ),
        Action::Exit(name) => {
            let names = exit_names(c);
            if !names.iter().any(|n| n == name) {
                diags.push(
                    Diagnostic::unknown(
                        Code::UnknownExit,
                        action.span,
                        "exit",
                        name,
                        names.iter().map(String::as_str),
                    )
                    .help_or_syntax(
                        format!("declare it under [exits.{name}] with its code"),
                        format!("declare it with exit \"{name}\" code=N"),
                    ),
                );
            }
        }
        // Only route cases and defaults go to stages: elsewhere a bare word is a misspelt
        // or invented action, not a stage to look for.
        Action::Goto(target) if !goes_to_stages(key) && c.find(target).is_none() => {
            let mut actions = Vec::new();
            if in_loop {
                actions.extend(["continue", "break"]);
            }
            if key == "on_timeout" {
                actions.extend(["approve", "reject"]);
            }
            actions.push("fail");
            let exits = exit_names(c)
                .iter()
                .map(|n| format!("exit:{n}"))
                .collect::<Vec<_>>();
            let list = actions
                .iter()
                .map(|a| format!("`{a}`"))
                .chain(exits.iter().map(|e| format!("`{e}`")))
                .collect::<Vec<_>>()
                .join(", ");
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    action.span,
                    format!("`{target}` is not an action `{key}` can take"),
                )
                .label("not an action")
                .suggest(
                    target,
                    actions
                        .iter()
                        .copied()
                        .chain(exits.iter().map(String::as_str)),
                )
                .help_or(format!("`{key}` here takes one of: {list}")),
            );
        }
        Action::Goto(target) => match c.find(target) {
            None => diags.push(Diagnostic::unknown(
                Code::UnknownStage,
                action.span,
                "stage",
                target,
                c.by_id.keys().copied(),
            )),
            Some(t) => {
                let here = at.and_then(|s| c.info(s).parent);
                if !goes_to_stages(key) {
                    diags.push(
                        Diagnostic::new(Code::ActionOutOfPlace, action.span, format!("`{key}` cannot go to a stage"))
                            .help("only route cases and what a loop or gate does when it gives up (`on_exhausted`, `stuck.then`, `on_timeout`) go to stages; use `continue`, `break`, `fail` or `exit:NAME`"),
                    );
                } else if GIVE_UP_KEYS.contains(&key)
                    && c.info(t).parent == here
                    && Some(t) != at
                    && c.info(t).stage.route.is_none()
                    && c.info(t).stage.then.is_none()
                {
                    diags.push(
                        Diagnostic::new(
                            Code::ActionOutOfPlace,
                            action.span,
                            format!("stage `{target}` runs when this gives up, but does not say how the run goes on"),
                        )
                        .label("gives up to this stage")
                        .help_or_syntax(
                            format!("add then = \"exit:NAME\" (or \"fail\") to [stages.{target}], or a route"),
                            format!("add then=\"exit:NAME\" (or \"fail\") to stage \"{target}\", or a route"),
                        ),
                    );
                } else if c.info(t).parent != here {
                    let (what, help) = if GIVE_UP_KEYS.contains(&key) {
                        (
                            "this stage",
                            "the stage run on giving up stands beside the loop or gate (in the same body), not inside it",
                        )
                    } else {
                        (
                            "this route",
                            "a route goes to a stage of the same body; to leave a loop, use `break` or `exit:NAME`",
                        )
                    };
                    diags.push(
                        Diagnostic::new(
                            Code::CrossRegionNeed,
                            action.span,
                            format!("stage `{target}` is in another body than {what}"),
                        )
                        .help(help),
                    );
                } else if Some(t) == at {
                    diags.push(
                        Diagnostic::new(
                            Code::Cycle,
                            action.span,
                            format!("stage `{target}` routes to itself"),
                        )
                        .help("to run it again, put it in a loop and use `continue`"),
                    );
                }
            }
        },
        _ => {}
    }
}

/// Tells whether a stage has `key` with a value of the wrong type (reported once, by the shape
/// check): the key counts as present.
fn mistyped(c: &Checked<'_>, stage: &Stage, key: &str) -> bool {
    c.workflow.is_broken(&crate::model::lower::mistyped(
        "stages",
        &stage.id.value,
        key,
    ))
}

fn require(c: &Checked<'_>, stage: &Stage, key: &str, present: bool, diags: &mut Diagnostics) {
    if !present && !mistyped(c, stage, key) {
        let code = if key == "max_iterations" {
            Code::UnboundedLoop
        } else {
            Code::MissingKey
        };
        let mut d = Diagnostic::new(
            code,
            stage.kind.span,
            format!(
                "{} stage needs `{key}`",
                crate::diag::article(stage.kind.value.as_str())
            ),
        )
        .label(format!("stage `{}` has no `{key}`", stage.id.value));
        d = match key {
            "max_iterations" => d.help_syntax(
                "every loop is bounded: add max_iterations = N",
                "every loop is bounded: add max_iterations=N",
            ),
            "prompt" => d.help_syntax(
                "add `prompt = \"...\"` or `prompt_file = \"prompts/....md.j2\"`",
                "add `prompt \"...\"` or `prompt_file \"prompts/....md.j2\"`",
            ),
            _ => d.help(format!("add `{key}`")),
        };
        diags.push(d);
    }
}

fn stage(c: &mut Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let parent = c.info(id).parent;
    // needs
    let mut resolved = Vec::new();
    for need in &s.needs {
        match c.find(&need.value) {
            None => diags.push(Diagnostic::unknown(
                Code::UnknownStage,
                need.span,
                "stage",
                &need.value,
                c.body(parent)
                    .iter()
                    .map(|b| c.info(*b).stage.id.value.as_str()),
            )),
            Some(n) if n == id => diags.push(
                Diagnostic::new(
                    Code::Cycle,
                    need.span,
                    format!("stage `{}` needs itself", need.value),
                )
                .help("remove it from needs"),
            ),
            Some(n) if c.info(n).parent != parent => {
                let where_ = match c.info(n).parent {
                    Some(p) => format!("in the body of `{}`", c.info(p).stage.id.value),
                    None => "at the top level".to_string(),
                };
                diags.push(
                    Diagnostic::new(Code::CrossRegionNeed, need.span, format!("stage `{}` is {where_}, not in the same body as `{}`", need.value, s.id.value))
                        .help("needs name stages of the same body; a body's stages already run after everything its loop or fan-out needs"),
                );
            }
            Some(n) => resolved.push(n),
        }
    }
    c.stages[id.0].needs = resolved;
    if let Some(r) = &s.resource {
        if !c.workflow.resources.iter().any(|x| x.name.value == r.value) {
            diags.push(
                Diagnostic::unknown(
                    Code::UnknownResource,
                    r.span,
                    "resource",
                    &r.value,
                    c.workflow.resources.iter().map(|x| x.name.value.as_str()),
                )
                .help_or(format!(
                    "declare it under [resources.{}] with a capacity",
                    r.value
                )),
            );
        }
    }
    if s.priority.is_some() && s.resource.is_none() {
        if let Some(p) = &s.priority {
            diags.push(
                Diagnostic::new(
                    Code::KeyNotForKind,
                    p.span,
                    "`priority` has no effect without `resource`",
                )
                .help_syntax(
                    "add `resource = \"NAME\"` or remove priority",
                    "add `resource \"NAME\"` or remove priority",
                ),
            );
        }
    }
    action_ok(c, Some(id), s.on_fail.as_ref(), "on_fail", diags);
    action_ok(c, Some(id), s.on_error.as_ref(), "on_error", diags);
    action_ok(c, Some(id), s.then.as_ref(), "then", diags);
    if let Some(b) = &s.budget {
        action_ok(c, Some(id), b.on_exceeded.as_ref(), "on_exceeded", diags);
    }
    if let Some(route) = &s.route {
        for (_, a) in &route.cases {
            action_ok(c, Some(id), Some(a), "cases", diags);
        }
        action_ok(c, Some(id), route.default.as_ref(), "default", diags);
    }
    match &s.body {
        StageBody::Agent {
            agent,
            prompt,
            prompt_file,
        } => {
            require(c, s, "agent", agent.is_some(), diags);
            require(
                c,
                s,
                "prompt",
                prompt.is_some() || prompt_file.is_some() || mistyped(c, s, "prompt_file"),
                diags,
            );
            if let (Some(p), Some(_)) = (prompt, prompt_file) {
                diags.push(
                    Diagnostic::new(
                        Code::Duplicate,
                        p.span,
                        "a stage has either `prompt` or `prompt_file`, not both",
                    )
                    .help("keep one of them"),
                );
            }
            if let Some(a) = agent {
                agent_ref(c, a, diags);
            }
        }
        StageBody::Command(cmd) => require(c, s, "argv", !cmd.argv.is_empty(), diags),
        StageBody::Check {
            command, expect, ..
        } => {
            if command.is_none() && expect.is_none() && !mistyped(c, s, "expect") {
                diags.push(
                    Diagnostic::new(
                        Code::MissingKey,
                        s.kind.span,
                        "a check stage needs `argv`, `expect` or both",
                    )
                    .help_syntax(
                        "add argv = [...] to run a command, or expect = \"...\" to test outputs",
                        "add argv \"...\" to run a command, or expect \"...\" to test outputs",
                    ),
                );
            }
            if let Some(cmd) = command {
                require(c, s, "argv", !cmd.argv.is_empty(), diags);
            }
        }
        StageBody::Gate {
            message,
            on_timeout,
            on_reject,
            ..
        } => {
            require(c, s, "message", message.is_some(), diags);
            action_ok(c, Some(id), on_timeout.as_ref(), "on_timeout", diags);
            action_ok(c, Some(id), on_reject.as_ref(), "on_reject", diags);
            if s.timeout.is_none() || on_timeout.is_none() {
                let what = match (s.timeout.is_some(), on_timeout.is_some()) {
                    (false, false) => "neither `timeout` nor `on_timeout`",
                    (false, true) => "`on_timeout` but no `timeout`",
                    _ => "`timeout` but no `on_timeout`",
                };
                diags.push(
                    Diagnostic::new(Code::GateNoTimeout, s.kind.span, format!("gate `{}` has {what}: it may wait forever", s.id.value))
                        .help_syntax(
                            "add timeout = \"24h\" and on_timeout = \"reject\" (or approve, fail, exit:NAME)",
                            "add timeout \"24h\" and on_timeout \"reject\" (or approve, fail, exit:NAME)",
                        ),
                );
            }
        }
        // A preset reference that could not be resolved was reported by the loader, which
        // dropped it and marked the stage broken.
        StageBody::Subflow { workflow, .. } => require(
            c,
            s,
            "workflow",
            workflow.is_some() || c.workflow.is_broken(&s.id.value),
            diags,
        ),
        StageBody::Loop {
            max_iterations,
            on_exhausted,
            stuck,
            escalation,
            until,
            stages,
            ..
        } => {
            require(c, s, "max_iterations", max_iterations.is_some(), diags);
            if let Some(m) = max_iterations {
                // A template counts too, when the params in force resolve it to 0.
                if crate::params::resolve_count(&m.value, &c.params).is_ok_and(|n| n == 0) {
                    diags.push(
                        Diagnostic::new(
                            Code::UnboundedLoop,
                            m.span,
                            "max_iterations must be at least 1",
                        )
                        .help("set max_iterations to the most attempts you accept"),
                    );
                }
            }
            action_ok(c, Some(id), on_exhausted.as_ref(), "on_exhausted", diags);
            if let Some(st) = stuck {
                action_ok(c, Some(id), st.then.as_ref(), "stuck.then", diags);
                if st
                    .repeats
                    .as_ref()
                    .is_some_and(|r| matches!(r.value, Count::Literal(0 | 1)))
                {
                    if let Some(r) = &st.repeats {
                        diags.push(
                            Diagnostic::new(
                                Code::InvalidValue,
                                r.span,
                                "stuck.repeats must be at least 2",
                            )
                            .help("2 means: the same findings twice in a row"),
                        );
                    }
                }
            }
            for rule in escalation {
                for target in &rule.run {
                    match c.find(&target.value) {
                        Some(t) if c.info(t).parent == Some(id) => {}
                        Some(_) => diags.push(
                            Diagnostic::new(
                                Code::CrossRegionNeed,
                                target.span,
                                format!(
                                    "stage `{}` is not in the body of loop `{}`",
                                    target.value, s.id.value
                                ),
                            )
                            .help("escalation rules run stages of their own loop's body"),
                        ),
                        None => diags.push(Diagnostic::unknown(
                            Code::UnknownStage,
                            target.span,
                            "stage",
                            &target.value,
                            stages.iter().map(|b| b.id.value.as_str()),
                        )),
                    }
                }
            }
            let leaves = until.is_some()
                || stuck.is_some()
                || mistyped(c, s, "until")
                || mistyped(c, s, "stuck")
                || body_leaves(stages);
            if !leaves {
                diags.push(
                    Diagnostic::new(Code::LoopNeverEndsEarly, s.kind.span, format!("loop `{}` can only end by running out of iterations", s.id.value))
                        .help_syntax(
                            "add `until = \"...\"`, a `stuck` rule, or a route to `break` or `exit:NAME`",
                            "add `until \"...\"`, a `stuck` rule, or a route to `break` or `exit:NAME`",
                        ),
                );
            }
            if stages.is_empty() {
                diags.push(
                    Diagnostic::new(
                        Code::MissingKey,
                        s.kind.span,
                        format!("loop `{}` has no stages", s.id.value),
                    )
                    .help("add stages to its body"),
                );
            }
        }
        StageBody::ForEach {
            over,
            result,
            stages,
            max_concurrency,
            as_name,
            ..
        } => {
            require(c, s, "over", over.is_some(), diags);
            region_common(
                c,
                id,
                result.as_ref(),
                max_concurrency.as_ref(),
                stages,
                diags,
            );
            if let Some(a) = as_name {
                if !is_ident(&a.value)
                    || crate::model::RESERVED.contains(&a.value.as_str()) && a.value != "item"
                {
                    diags.push(
                        Diagnostic::new(
                            Code::InvalidValue,
                            a.span,
                            format!("`{}` cannot be a variable name", a.value),
                        )
                        .help("use a plain name such as `ticket`"),
                    );
                }
            }
        }
        StageBody::Group {
            result,
            stages,
            max_concurrency,
            ..
        } => {
            region_common(
                c,
                id,
                result.as_ref(),
                max_concurrency.as_ref(),
                stages,
                diags,
            );
        }
    }
}

fn region_common(
    c: &Checked<'_>,
    id: StageId,
    result: Option<&Spanned<String>>,
    max_concurrency: Option<&Spanned<Count>>,
    stages: &[Stage],
    diags: &mut Diagnostics,
) {
    let s = c.info(id).stage;
    if stages.is_empty() {
        diags.push(
            Diagnostic::new(
                Code::MissingKey,
                s.kind.span,
                format!("`{}` has no stages", s.id.value),
            )
            .help("add stages to its body"),
        );
    }
    if let Some(m) = max_concurrency {
        if m.value == Count::Literal(0) {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    m.span,
                    "max_concurrency must be at least 1",
                )
                .help("1 runs one at a time"),
            );
        }
    }
    if let Some(r) = result {
        if !stages.iter().any(|b| b.id.value == r.value) {
            diags.push(
                Diagnostic::new(
                    Code::UnknownStage,
                    r.span,
                    format!("`{}` is not a stage of this body", r.value),
                )
                .suggest(&r.value, stages.iter().map(|b| b.id.value.as_str())),
            );
        }
    }
}

fn body_leaves(stages: &[Stage]) -> bool {
    stages.iter().any(|s| {
        let leaves = |a: &Action| matches!(a, Action::Break | Action::Exit(_));
        s.route.as_ref().is_some_and(|r| {
            r.cases.iter().any(|(_, a)| leaves(&a.value))
                || r.default.as_ref().is_some_and(|a| leaves(&a.value))
        }) || s.on_fail.as_ref().is_some_and(|a| leaves(&a.value))
            || s.on_error.as_ref().is_some_and(|a| leaves(&a.value))
            || match &s.body {
                StageBody::Gate {
                    on_reject,
                    on_timeout,
                    ..
                } => {
                    on_reject.as_ref().is_some_and(|a| leaves(&a.value))
                        || on_timeout.as_ref().is_some_and(|a| leaves(&a.value))
                }
                StageBody::Group { stages, .. } => body_leaves(stages),
                _ => false,
            }
    })
}
