//! The filters and tests a text uses: each must exist, and `spread` stands only as a whole
//! argv item.

use super::Text;
use super::scan::map;
use crate::check::filters::{self, Use, UseKind};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::source::Sources;

thread_local! {
    /// Set while a command's argv item is checked: the only place `spread` may stand.
    pub(super) static ARGV_ITEM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `spread` makes one argument per item, so it must be a whole argv item by itself.
pub(super) fn spread_in_place(src: &Sources, text: &Text<'_>, u: &Use, diags: &mut Diagnostics) {
    static WHOLE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^\s*\{\{[^{}]*\|\s*spread\s*\}\}\s*$").expect("the pattern is valid")
    });
    let message = if !ARGV_ITEM.with(std::cell::Cell::get) {
        "`spread` gives one argument per item, so it only works in a command's argv"
    } else if !WHOLE.is_match(text.source) {
        "`spread` must be the whole argv item"
    } else {
        return;
    };
    diags.push(
        Diagnostic::new(Code::InvalidValue, map(src, text, u.range.clone()), message)
            .label("spreads a list")
            .help("write the list as an argv item of its own: \"{{ params.paths | spread }}\"; elsewhere, use `join(' ')` for one text"),
    );
}

/// Reports a filter or test that the run's environment does not have (minijinja finds out
/// only when it renders, in the middle of a run).
pub(super) fn filter_or_test(src: &Sources, text: &Text<'_>, u: &Use, diags: &mut Diagnostics) {
    let Some(name) = text.source.get(u.range.clone()) else {
        return;
    };
    if filters::exists(u.kind, name) {
        return;
    }
    let word = u.kind.word();
    let mut d = Diagnostic::new(
        Code::UnknownFilter,
        map(src, text, u.range.clone()),
        format!("there is no {word} `{name}`"),
    )
    .label(format!("unknown {word}"));
    let other = match u.kind {
        UseKind::Filter => UseKind::Test,
        UseKind::Test => UseKind::Filter,
    };
    d = if filters::exists(other, name) {
        d.help(match u.kind {
            UseKind::Filter => format!("`{name}` is a test: write `is {name}`"),
            UseKind::Test => format!("`{name}` is a filter: write `| {name}`"),
        })
    } else {
        d.suggest(name, filters::known(u.kind)).help_or(format!(
            "templates have minijinja's built-in {word}s: https://docs.rs/minijinja/latest/minijinja/{word}s/index.html"
        ))
    };
    diags.push(d);
}
