//! Writes a workflow syntax tree back out as TOML or KDL v2 text.
//!
//! Both writers are the inverse of the readers in [`super::toml`] and [`super::kdl`]: the text
//! they produce parses back to the same tree (spans aside), in the same key order with the one
//! TOML exception below.
//!
//! TOML: keyed collections (`stages`, `agents`, `params`, ...) become `[stages.review]`
//! sections, nested bodies `[stages.loop.stages.driver]`, arrays of tables `[[...]]` and short
//! tables inline (`budget = { tokens = 1000 }`). TOML puts a table's plain keys before its
//! sections, so a table that comes before a plain key is written inline, or as dotted keys
//! (`output.extract = "json"`) when it is long. The one change of order: in a table with fixed
//! keys (the top level, a stage), a keyed collection that comes before plain keys moves after
//! them, so that it can still be written as sections (the order of its items is kept).
//!
//! KDL: the mapping of [`super::kdl`], driven by the spec. A scalar key is `key value`; a
//! `Ty::List` is a node with arguments (`needs "a" "b"`; one item is a node with one argument,
//! which the reader always takes as an array of one, so one-element lists are lossless); a
//! `Ty::Table` or `Ty::Map` is a node with properties and children; a `Ty::Named` collection is
//! one `singular "id" { ... }` node per item, among the parent's nodes; a `Ty::Tables` array is
//! repeated `singular { ... }` nodes; everything else is generic: a table is a node with
//! children, an array of two or more scalars a node with arguments, any other array a node
//! with `-` children, a scalar a node with one argument. The leading short scalars of a table
//! (numbers, booleans, one-line strings of at most 40 characters, but not the sentences
//! `description`, `message` and `prompt`) become properties (`stage "review" kind="agent"
//! { ... }`); strings are quoted; text of several lines is a multi-line string (raw when it
//! holds quotes or backslashes); a blank line stands around each stage and each group of a
//! collection's items. An array of tables whose singular
//! is its own key (`escalation`) is written as repeated nodes of that name. An empty array is
//! a bare node (`default`), an empty table a node with empty braces (`default {}`).
//!
//! What does not round-trip exactly:
//! - KDL: a plain scalar written for a `Ty::List` key (`needs = "plan"`) reads back as an
//!   array of one (`["plan"]`), unless it is among the leading properties of its node (never at
//!   the top level, which has no node). Lowering treats both the same.
//! - KDL, rarer: a generic table whose child nodes are all named `-` reads back as an array;
//!   and in trees that fail the shape check anyway, an unknown key named like a collection's
//!   singular (`stage` at the top level) reads back as an item of that collection, and an
//!   array (other than one of two or more scalars) under a `Ty::Table` or `Ty::Map` key does
//!   not read back.
//! - Both: NaN and infinite floats, which neither reader accepts.
//!
//! Files: `toml.rs` is the TOML writer (its sections and keys), `toml_layout.rs` decides what
//! becomes a section, what stays inline and how keys and values are written; `kdl.rs` is the
//! KDL writer, `kdl_quote.rs` its quoting of what the `kdl` crate would write unreadably.
//! `tests.rs` round-trips workflows through both writers.

mod kdl;
mod kdl_quote;
mod toml;
mod toml_layout;

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

pub use self::kdl::to_kdl;
pub use self::toml::{to_toml, to_toml_with_schema};
