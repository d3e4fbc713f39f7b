//! Output checks: schemas load and are valid, patterns compile, routes and fan-outs agree
//! with the schemas. Also records each stage's output schema for the template check.
//!
//! Here: the walk over the stages. `output_schema.rs` makes a stage's schema from its
//! `output` (`validate.rs` checks a written schema, pointing into its file with
//! `json_locate.rs`; `markers.rs` checks patterns and markers and the fields they make);
//! `schema.rs` holds the built-in outputs' schemas and follows field paths through a schema;
//! `routes.rs` checks routes against enums, `fanout.rs` for_each over arrays and aggregates.

pub(super) mod dialects;
mod fanout;
mod json_locate;
mod markers;
mod output_schema;
mod routes;
mod schema;
mod validate;

pub use crate::model::walk_schema;
pub use schema::command_schema;

use std::sync::Arc;

use serde_json::Value as Json;

use super::{Checked, StageId};
use crate::diag::Diagnostics;
use crate::load::Loader;
use crate::model::StageKind;
use output_schema::output_schema;
use schema::builtin_schema;

pub fn check(c: &mut Checked<'_>, loader: &mut Loader<'_>, diags: &mut Diagnostics) {
    // A built-in schema is made once per kind and shared by the stages of that kind.
    let mut builtins: Vec<(StageKind, Option<Arc<Json>>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for i in 0..c.stages.len() {
        let id = StageId(i);
        let s = c.info(id).stage;
        // An extraction mode that is not one was reported: what the output holds, and which
        // keys go with the mode meant, are not known.
        // (Asked only of a stage with an `output`: the name is made for the question.)
        let unknown = || {
            c.workflow.is_broken(&crate::model::lower::mistyped(
                "stages",
                &s.id.value,
                "output.extract",
            ))
        };
        let schema = match &s.keys().output {
            Some(o) if unknown() => {
                let mut found = Diagnostics::default();
                let _ = output_schema(c, s, o, loader, &mut seen, &mut found);
                for d in found.into_sorted() {
                    if d.code != crate::diag::Code::KeyNotForKind {
                        diags.push(d);
                    }
                }
                None
            }
            Some(o) => output_schema(c, s, o, loader, &mut seen, diags).map(Arc::new),
            None => {
                let kind = s.kind().value;
                match builtins.iter().find(|(k, _)| *k == kind) {
                    Some((_, b)) => b.clone(),
                    None => {
                        let b = builtin_schema(kind).map(Arc::new);
                        builtins.push((kind, b.clone()));
                        b
                    }
                }
            }
        };
        if let Some(schema) = schema {
            c.schemas.insert(id, schema);
        }
    }
    for i in 0..c.stages.len() {
        let id = StageId(i);
        routes::route(c, id, diags);
        fanout::aggregate(c, id, diags);
    }
}
