//! A whole command line written as one argv item: `argv = ["cargo test --workspace"]` runs a
//! program named `cargo test --workspace`, which does not exist (nothing goes through a
//! shell).

use crate::check::Checked;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{StageBody, Text};

pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    for info in &c.stages {
        let s = info.stage;
        let cmd = match &s.body {
            StageBody::Command(cmd) => cmd,
            StageBody::Check {
                command: Some(cmd), ..
            } => cmd,
            _ => continue,
        };
        one(&cmd.argv, "argv", diags);
    }
    for a in &c.workflow.agents {
        one(&a.command, "command", diags);
    }
}

/// Reports the first item of `argv` (the key `key`) when it is a command line.
fn one(argv: &[Text], key: &str, diags: &mut Diagnostics) {
    let Some(first) = argv.first() else {
        return;
    };
    let program = first.value.trim();
    // A template may render to anything; a path (`./my script.sh`) names a file, spaces and
    // all.
    if program.contains("{{")
        || program.contains("{%")
        || program.contains(['/', '\\'])
        || !program.contains(char::is_whitespace)
    {
        return;
    }
    let rest = &argv[1..];
    let words = (!has_shell_syntax(program))
        .then(|| shlex::split(program))
        .flatten();
    let name = program.split_whitespace().next().unwrap_or(program);
    let d = Diagnostic::new(
        Code::CommandLineInOneItem,
        first.span,
        format!(
            "`{program}` is a whole command line in one {key} item: it runs a program named `{program}`, which does not exist (nothing goes through a shell)"
        ),
    )
    .label(format!("the program would be `{program}`, not `{name}`"));
    let d = match words {
        Some(words) => {
            let items: Vec<String> = words
                .iter()
                .map(|w| quote(w))
                .chain(rest.iter().map(|t| quote(&t.value)))
                .collect();
            d.help_syntax(
                format!("write one item per argument: {key} = [{}]", items.join(", ")),
                format!("write one item per argument: {key} {}", items.join(" ")),
            )
        }
        None if rest.is_empty() => d.help_syntax(
            format!(
                "write one item per argument, or, for the shell syntax it uses, run it through a shell: {key} = [\"sh\", \"-c\", {}]",
                quote(program)
            ),
            format!(
                "write one item per argument, or, for the shell syntax it uses, run it through a shell: {key} \"sh\" \"-c\" {}",
                quote(program)
            ),
        ),
        None => d.help(
            "write one item per argument, or, for the shell syntax it uses, run the whole line through a shell: `sh`, `-c`, the line, then its arguments (`$0`, `$1`, ...)",
        ),
    };
    diags.push(d);
}

/// Whether a command line needs a shell: pipes, redirections, several commands, variables,
/// globs, or a variable assignment before the program.
fn has_shell_syntax(line: &str) -> bool {
    line.contains([
        '|', '&', ';', '<', '>', '(', ')', '$', '`', '*', '?', '~', '\n',
    ]) || line
        .split_whitespace()
        .next()
        .is_some_and(|w| w.contains('='))
}

/// A string as a quoted TOML or KDL string.
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_syntax_is_told_from_plain_words() {
        assert!(!has_shell_syntax("cargo test --workspace"));
        assert!(has_shell_syntax("cargo test | tee log"));
        assert!(has_shell_syntax("RUST_LOG=debug cargo test"));
        assert!(has_shell_syntax("make && make install"));
    }
}
