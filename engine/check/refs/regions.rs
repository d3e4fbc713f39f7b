//! for_each and group stages: a body of stages, a concurrency of at least 1, a result that is a
//! stage of the body, and a for_each's item name.

use super::stage::require;
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Count, ForEachBody, Stage, is_ident};
use crate::source::Spanned;

/// Checks a for_each stage.
pub(super) fn for_each(c: &Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let Some(ForEachBody {
        over,
        result,
        stages,
        max_concurrency,
        as_name,
        ..
    }) = s.body.as_for_each()
    else {
        return;
    };
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

pub(super) fn region_common(
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
                s.kind().span,
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
