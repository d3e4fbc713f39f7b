//! Quoting for commands shown to people (progress lines, the commands that answer a gate):
//! what can be pasted into a POSIX shell as it is. Nothing is ever run through a shell.

/// One word, quoted when the shell would read it otherwise.
pub fn quote(word: &str) -> String {
    match shlex::try_quote(word) {
        Ok(q) => q.into_owned(),
        // A NUL byte cannot be passed to a program at all: show it escaped.
        Err(_) => shlex::try_quote(&word.replace('\0', "\\0"))
            .map(|q| q.into_owned())
            .unwrap_or_default(),
    }
}

/// Words joined with spaces, each quoted when needed.
pub fn join(words: &[String]) -> String {
    words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_only_when_needed() {
        assert_eq!(quote("approve_spec"), "approve_spec");
        assert_eq!(quote("tickets#T-1/approve"), "'tickets#T-1/approve'");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote(""), "''");
        assert_eq!(join(&["echo".into(), "it's".into()]), "echo \"it's\"");
    }
}
