//! Text bound for a terminal: what an agent or a program wrote is shown, never obeyed.

/// A text safe to print on a terminal or in a log: control characters (ESC, BEL, a
/// carriage return that would overwrite the line, C1 controls...) are shown escaped
/// (`\u{1b}`), so that nothing an agent or a program wrote can move the cursor, set the
/// title or hide text. Newlines and tabs stay.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}
