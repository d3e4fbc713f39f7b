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

/// Words joined with spaces, each quoted when needed, cut after `max` bytes as quoted with an
/// ellipsis and the words' whole size: `printf '%s' xxx… (42 arguments, 4096043 bytes in
/// all)`. A `--set` of 100 KiB used forty times in an argv is not echoed as 4 MB.
pub fn join_shown(words: &[String], max: usize) -> String {
    let mut shown = String::new();
    for (i, word) in words.iter().enumerate() {
        if i > 0 {
            shown.push(' ');
        }
        // A long word is cut before it is quoted (quoting 100 KiB to show 400 bytes of it
        // is waste); the cut is marked below.
        let room = max.saturating_sub(shown.len()) + 1;
        let mut end = word.len().min(room);
        while !word.is_char_boundary(end) {
            end -= 1;
        }
        shown.push_str(&quote(&word[..end]));
        if shown.len() > max || end < word.len() {
            let mut cut = shown.len().min(max);
            while !shown.is_char_boundary(cut) {
                cut -= 1;
            }
            shown.truncate(cut);
            let bytes = words.iter().map(String::len).sum::<usize>() + words.len() - 1;
            return format!("{shown}… ({} arguments, {bytes} bytes in all)", words.len());
        }
    }
    shown
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
        assert_eq!(
            join_shown(&["echo".into(), "it's".into()], 400),
            "echo \"it's\""
        );
    }

    #[test]
    fn a_long_command_is_shown_cut_with_its_whole_size() {
        const MAX: usize = 400;
        let short = vec!["echo".to_string(), "a b".to_string()];
        assert_eq!(join_shown(&short, MAX), "echo 'a b'");
        let big = "x".repeat(100 * 1024);
        let mut argv = vec!["printf".to_string(), "%s".to_string()];
        argv.extend(std::iter::repeat_n(big, 40));
        let shown = join_shown(&argv, MAX);
        assert!(shown.len() < MAX + 100, "{} bytes shown", shown.len());
        assert!(shown.starts_with("printf '%s' xxx"), "{shown}");
        let total = 6 + 2 + 40 * 100 * 1024 + 41;
        assert!(
            shown.ends_with(&format!("… (42 arguments, {total} bytes in all)")),
            "{shown}"
        );
        // Cut inside a multi-byte character: at the boundary before it.
        let wide = vec!["é".repeat(MAX)];
        assert!(join_shown(&wide, MAX).contains('…'));
    }
}
