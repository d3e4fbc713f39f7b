//! Actions in their place: `continue` and `break` only in loops, `approve` and `reject` only
//! on a gate's timeout, exits that are declared, and stages only where an action may go to one
//! (route cases, and what a loop or gate does when it gives up), in the same body.

use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::Action;
use crate::source::Spanned;

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

/// The keys whose action runs a stage instead of giving up.
const GIVE_UP_KEYS: &[&str] = &["on_exhausted", "stuck.then", "on_timeout"];

/// Tells whether a key's action may name a stage: route cases and defaults, and what a loop
/// or a gate does when it gives up.
fn goes_to_stages(key: &str) -> bool {
    key == "cases" || key == "default" || GIVE_UP_KEYS.contains(&key)
}

/// Checks an action written on stage `at` (or at the top level for `None`).
pub(super) fn action_ok(
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
        // Only route cases and defaults (and what a loop or gate does when it gives up) go to
        // stages: elsewhere a bare word is a misspelt or invented action, not a stage to look
        // for; where stages may go, the word is neither a stage of the body nor an action.
        Action::Goto(target) if c.find(target).is_none() => {
            let allowed = Allowed::at(c, at, key);
            let (code, message, label) = if matches!(key, "cases" | "default") {
                (
                    Code::UnknownStage,
                    format!(
                        "there is no stage `{target}` beside this one, nor an action of that name"
                    ),
                    "unknown stage",
                )
            } else {
                (
                    Code::InvalidValue,
                    if allowed.stages.is_empty() {
                        format!("`{target}` is not an action `{key}` can take")
                    } else {
                        format!(
                            "`{target}` is neither an action `{key}` can take nor a stage beside {}",
                            allowed.beside
                        )
                    },
                    "not an action here",
                )
            };
            let mut d = Diagnostic::new(code, action.span, message).label(label);
            d.subject = Some(target.clone());
            let (hint, best) = allowed.hint(key, target);
            if let Some(best) = best {
                d = d.replacing(target, &best);
            }
            diags.push(crate::model::shape::help_hint(
                d,
                Some(crate::model::shape::with_list(hint, &allowed.list(key))),
            ));
        }
        Action::Goto(target) => {
            let Some(t) = c.find(target) else { return };
            {
                let here = at.and_then(|s| c.info(s).parent);
                if !goes_to_stages(key) {
                    diags.push(
                        Diagnostic::new(Code::ActionOutOfPlace, action.span, format!("`{key}` cannot go to a stage"))
                            .help("only route cases and what a loop or gate does when it gives up (`on_exhausted`, `stuck.then`, `on_timeout`) go to stages; use `continue`, `break`, `fail` or `exit:NAME`"),
                    );
                } else if GIVE_UP_KEYS.contains(&key)
                    && c.info(t).parent == here
                    && Some(t) != at
                    && c.info(t).stage.keys().route.is_none()
                    && c.info(t).stage.keys().then.is_none()
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
        }
        _ => {}
    }
}

/// What an action-valued key takes where it is written.
struct Allowed<'c> {
    /// The action words and `exit:NAME` of every exit.
    actions: Vec<String>,
    /// The stages it may go to: those beside the stage it is written on, when the key goes
    /// to stages.
    stages: Vec<&'c str>,
    /// What the stages stand beside: "this gate", "this loop", "this stage".
    beside: &'static str,
}

impl<'c> Allowed<'c> {
    fn at(c: &'c Checked<'_>, at: Option<StageId>, key: &str) -> Self {
        let mut actions: Vec<String> = Vec::new();
        if at.is_some_and(|s| c.enclosing_loop(s).is_some()) {
            actions.extend(["continue".into(), "break".into()]);
        }
        if key == "on_timeout" {
            actions.extend(["approve".into(), "reject".into()]);
        }
        actions.push("fail".into());
        actions.extend(exit_names(c).iter().map(|n| format!("exit:{n}")));
        let stages = match at {
            Some(at) if goes_to_stages(key) => c
                .body(c.info(at).parent)
                .iter()
                .filter(|s| **s != at)
                .map(|s| c.info(*s).stage.id.value.as_str())
                .collect(),
            _ => Vec::new(),
        };
        let beside = match at.map(|s| c.info(s).stage.kind().value) {
            Some(crate::model::StageKind::Gate) if key == "on_timeout" => "this gate",
            Some(crate::model::StageKind::Loop) if key != "cases" && key != "default" => {
                "this loop"
            }
            _ => "this stage",
        };
        Allowed {
            actions,
            stages,
            beside,
        }
    }

    /// A well-known wrong action's sentence (when what it recommends is allowed here), else
    /// "did you mean" over the actions and stages allowed here, with the name it suggests
    /// (when that is a whole action or stage, not a pattern such as `exit:NAME`).
    fn hint(&self, key: &str, wrong: &str) -> (Option<(String, String)>, Option<String>) {
        if let Some(w) = crate::model::well_known(crate::model::ACTION, key, wrong) {
            let right = w.right.split(':').next().unwrap_or(w.right);
            if right.is_empty()
                || self
                    .actions
                    .iter()
                    .any(|a| a.split(':').next() == Some(right))
            {
                return (Some(w.advice(key)), None);
            }
        }
        let candidates = self
            .actions
            .iter()
            .map(String::as_str)
            .chain(self.stages.iter().copied());
        match crate::diag::closest(wrong, candidates) {
            Some(best) => {
                let hint = format!("did you mean `{best}`?");
                let whole = (!best.contains("NAME")).then(|| best.to_string());
                (Some((hint.clone(), hint)), whole)
            }
            None => (None, None),
        }
    }

    /// "`KEY` here takes one of: ..., or a stage beside this gate: ...".
    fn list(&self, key: &str) -> String {
        /// The most stage ids listed.
        const MOST: usize = 12;
        let actions = self
            .actions
            .iter()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut out = format!("`{key}` here takes one of: {actions}");
        if !self.stages.is_empty() {
            let mut stages: Vec<String> = self
                .stages
                .iter()
                .take(MOST)
                .map(|s| format!("`{s}`"))
                .collect();
            if self.stages.len() > MOST {
                stages.push(format!("and {} more", self.stages.len() - MOST));
            }
            out.push_str(&format!(
                ", or a stage beside {}: {}",
                self.beside,
                stages.join(", ")
            ));
        }
        out
    }
}

/// The stage a route or give-up action of stage `id` meant, when it names no stage but is
/// close to one of the stages it may go to (`reprot` for `report`): the other checks take
/// it as going there, so that the misspelling is the only error reported (not also that
/// `report` reads outputs of stages it does not come after).
pub(in crate::check) fn meant_targets(c: &Checked<'_>, id: StageId) -> Vec<StageId> {
    let stage = c.info(id).stage;
    let routes = stage.keys().route.iter().flat_map(|r| {
        r.cases
            .iter()
            .map(|(_, a)| ("cases", a))
            .chain(r.default.iter().map(|a| ("default", a)))
    });
    let give_ups = stage.give_up_targets().into_iter().map(|(k, a)| {
        (
            match k {
                "exhausted" => "on_exhausted",
                "stuck" => "stuck.then",
                _ => "on_timeout",
            },
            a,
        )
    });
    routes
        .chain(give_ups)
        .filter_map(|(key, a)| match &a.value {
            Action::Goto(t) if c.find(t).is_none() => {
                let allowed = Allowed::at(c, Some(id), key);
                let candidates = allowed
                    .actions
                    .iter()
                    .map(String::as_str)
                    .chain(allowed.stages.iter().copied());
                let best = crate::suggest::closest(t, candidates)?;
                allowed
                    .stages
                    .contains(&best)
                    .then(|| c.find(best))
                    .flatten()
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::diag::{Code, Diagnostic, Diagnostics};
    use crate::fs::MemFs;
    use crate::load::Loader;
    use crate::source::Sources;

    /// Loads and checks one TOML workflow as `ralph-flow check` does.
    fn check(text: &str) -> Vec<Diagnostic> {
        let path = std::path::PathBuf::from("/flows/wf.toml");
        let fs = MemFs::new([(path.clone(), text.to_string())]);
        let mut sources = Sources::new();
        let mut diags = Diagnostics::default();
        let mut loader = Loader::new(&fs, &mut sources, &mut diags);
        if let Some(wf) = loader.load(&path, None) {
            let mut found = Diagnostics::default();
            let _ = crate::check::check(&wf, &mut loader, &[], false, &mut found);
            diags.extend(found);
        }
        diags.into_sorted()
    }

    const LOOP: &str = r#"
name = "t"

[exits.stuck]
code = 2

[stages.rounds]
kind = "loop"
max_iterations = 3
until = "stages.step.output.exit_code == 0"
on_exhausted = "ON_EXHAUSTED"

[stages.rounds.stages.step]
kind = "command"
argv = ["./step.sh"]

[stages.report]
kind = "command"
argv = ["echo", "{{ stages.step.output.stdout }}"]
then = "exit:stuck"

[stages.wait]
kind = "gate"
needs = ["rounds"]
message = "Go on?"
timeout = "1h"
on_timeout = "ON_TIMEOUT"
"#;

    fn with(on_exhausted: &str, on_timeout: &str) -> Vec<Diagnostic> {
        check(
            &LOOP
                .replace("ON_EXHAUSTED", on_exhausted)
                .replace("ON_TIMEOUT", on_timeout),
        )
    }

    #[test]
    fn the_fixture_checks_cleanly() {
        assert!(with("report", "approve").is_empty());
    }

    /// A mistyped action is one diagnostic: no "has not run" for the stage the loop meant to
    /// give up to, whatever the mistake.
    #[test]
    fn a_mistyped_action_reports_once() {
        for (on_exhausted, on_timeout, code, help) in [
            (
                "reprot",
                "approve",
                Code::InvalidValue,
                "did you mean `report`?",
            ),
            (
                "report",
                "skip",
                Code::InvalidValue,
                "there is no such action",
            ),
            (
                "report",
                "aprove",
                Code::InvalidValue,
                "did you mean `approve`?",
            ),
            (
                "report",
                "exit:stuk",
                Code::UnknownExit,
                "did you mean `stuck`?",
            ),
            ("report", "reject now", Code::InvalidValue, "an action is"),
        ] {
            let diags = with(on_exhausted, on_timeout);
            assert_eq!(
                diags.len(),
                1,
                "{on_exhausted} / {on_timeout}: {:?}",
                diags.iter().map(|d| &d.message).collect::<Vec<_>>()
            );
            assert_eq!(diags[0].code, code, "{on_timeout}");
            let text = diags[0].help.as_deref().unwrap_or_default();
            assert!(text.contains(help), "{on_exhausted} / {on_timeout}: {text}");
        }
    }

    /// What a gate's `on_timeout` may take is listed, with the stages beside it.
    #[test]
    fn a_word_that_is_no_action_lists_what_is_allowed() {
        let diags = with("report", "later");
        assert_eq!(diags.len(), 1);
        assert_eq!(
            diags[0].message,
            "`later` is neither an action `on_timeout` can take nor a stage beside this gate"
        );
        assert_eq!(
            diags[0].help.as_deref(),
            Some(
                "`on_timeout` here takes one of: `approve`, `reject`, `fail`, `exit:stuck`, \
                 `exit:success`, `exit:failed`, or a stage beside this gate: `rounds`, `report`"
            )
        );
    }

    /// A stage of a kind that is not one is one diagnostic: its keys are not said not to
    /// apply, and uses of its body's stages are not said to name no stage.
    #[test]
    fn a_mistyped_kind_reports_once() {
        let diags = check(
            &LOOP
                .replace("kind = \"loop\"", "kind = \"looop\"")
                .replace("on_timeout = \"ON_TIMEOUT\"", "on_timeout = \"approve\""),
        );
        assert_eq!(
            diags.len(),
            1,
            "{:?}",
            diags.iter().map(|d| &d.message).collect::<Vec<_>>()
        );
        assert_eq!(diags[0].help.as_deref(), Some("did you mean `loop`?"));
    }
}
