//! A gate whose timeout is zero: it takes `on_timeout` the moment it opens, before anybody
//! can answer it.

use crate::check::Checked;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Dur, StageBody};

pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    for info in &c.stages {
        let s = info.stage;
        let StageBody::Gate { on_timeout, .. } = &s.body else {
            continue;
        };
        let Some(timeout) = &s.keys().timeout else {
            continue;
        };
        if !crate::params::resolve_duration(&timeout.value, &c.params).is_ok_and(|d| d.is_zero()) {
            continue;
        }
        let how = match &timeout.value {
            Dur::Template(t) => format!("`timeout` (`{t}`) is 0 with the params in force"),
            _ => "`timeout` is 0".to_string(),
        };
        let then = match on_timeout {
            Some(a) => format!("its `on_timeout` (`{}`) is taken", a.value),
            None => "it times out".to_string(),
        };
        let mut d = Diagnostic::new(
            Code::GateUnanswerable,
            timeout.span,
            format!(
                "gate `{}` can never be answered: {how}, so {then} the moment it opens",
                s.id.value
            ),
        )
        .label("no time to answer");
        if let Some(a) = on_timeout {
            d = d.related(a.span, "taken at once");
        }
        let help = match on_timeout.as_ref().map(|a| &a.value) {
            Some(crate::model::Action::Approve) => {
                "give people time to answer, such as timeout = \"24h\"; to go on without asking anybody, remove the gate"
            }
            _ => {
                "give people time to answer, such as timeout = \"24h\"; or remove the gate and take the action directly"
            }
        };
        let help_kdl = help.replace("timeout = \"24h\"", "timeout=\"24h\"");
        diags.push(d.help_syntax(help, help_kdl));
    }
}
