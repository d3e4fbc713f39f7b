//! "Did you mean" suggestions for misspelt names.

/// Returns the candidate closest to `name`, when it is close enough to be a likely typo.
///
/// Besides typos, a name that is a whole word of exactly one candidate (`approve` for
/// `approve_plan`, `plan` for `write_plan`: words are separated by `_` or `-`), or that has
/// exactly one candidate as a whole word (`claude` for `claude-code`), suggests it.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let candidates: Vec<&'a str> = candidates.into_iter().filter(|c| *c != name).collect();
    let limit = (name.chars().count() / 3).max(1);
    let typo = candidates
        .iter()
        .map(|c| (distance(name, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, c)| (*d, *c))
        .map(|(_, c)| c);
    if typo.is_some() || name.len() < 3 {
        return typo;
    }
    let mut words = candidates
        .iter()
        .copied()
        .filter(|c| has_word(c, name) || (c.len() >= 3 && has_word(name, c)));
    match (words.next(), words.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

/// Tells whether `word` is a whole `_`/`-`-separated part (or run of parts) of `name`.
fn has_word(name: &str, word: &str) -> bool {
    let is_sep = |c: Option<char>| c.is_none_or(|c| c == '_' || c == '-');
    name.match_indices(word).any(|(i, _)| {
        is_sep(name[..i].chars().next_back()) && is_sep(name[i + word.len()..].chars().next())
    })
}

/// Computes the edit distance between two strings, by characters, where swapping two
/// neighbouring characters counts as one edit (optimal string alignment).
pub fn distance(a: &str, b: &str) -> usize {
    strsim::osa_distance(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_close_names_only() {
        assert_eq!(closest("reviewr", ["reviewer", "driver"]), Some("reviewer"));
        assert_eq!(closest("xyz", ["reviewer", "driver"]), None);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("biuld", "build"), 1);
        assert_eq!(closest("biuld", ["build", "test"]), Some("build"));
        assert_eq!(
            closest("approve", ["approve_plan", "build"]),
            Some("approve_plan")
        );
        assert_eq!(closest("plan", ["write_plan", "build"]), Some("write_plan"));
        assert_eq!(closest("plan", ["plan_a", "plan_b"]), None);
        assert_eq!(closest("app", ["approve_plan"]), None);
        // A candidate that is a whole word of the name.
        assert_eq!(
            closest("claude-code", ["claude", "codex", "command"]),
            Some("claude")
        );
        assert_eq!(
            closest("fenced", ["json", "fenced_json"]),
            Some("fenced_json")
        );
        assert_eq!(closest("build_fast", ["build", "fast"]), None);
        assert_eq!(closest("on_done", ["on", "done_x"]), None);
    }
}
