//! Permission policies: what an agent may do in an unattended run, decided request by
//! request, each decision with the rule that made it.
//!
//! A policy ([`Rules`]) is one of the named levels (`read-only`, `edit`, `commit`, `full`)
//! or a workflow's `[policy.NAME]`, which starts from a level and adds:
//! - `edit`: the files an agent may change (globs under the workspace), or none;
//! - `allow` and `deny`: commands by argv pattern (`git commit *`, `cargo test`);
//! - `network`: fetching from the network;
//! - `other`: every other action an agent asks for.
//!
//! A command line is split into its simple commands (`;`, `&&`, `||`, `|`, `&`, newlines),
//! `sh -c` and `bash -c` scripts are looked into, and a redirection's target is an edit: a
//! line is allowed only when every part of it is. A `deny` pattern wins over every `allow`.
//! What cannot be checked (command substitution, a quote left open) is denied unless the
//! policy allows every command.
//!
//! Pure but for [`confined`], which resolves symbolic links at run time; the checker only
//! parses patterns ([`Pattern::parse`]).

use std::fmt;
use std::path::{Component, Path, PathBuf};

/// The named levels, lowest first: the `permissions` an agent or stage names.
pub const LEVELS: &[&str] = &["read-only", "edit", "commit", "full"];

/// The git commands the `commit` level allows besides editing: staging, committing and
/// looking. `git push` is denied by name, so that no `allow` added to a policy extending
/// `commit` lets it through by accident: a policy that wants pushes says `allow = ["git push
/// *"]` and leaves `commit` out of its `extends`... or extends `full`.
pub const COMMIT_ALLOWS: &[&str] = &[
    "git status *",
    "git diff *",
    "git log *",
    "git show *",
    "git add *",
    "git commit *",
    "git rm *",
    "git mv *",
    "git restore *",
    "git rev-parse *",
    "git ls-files *",
    "git branch --show-current",
];

/// What the `commit` level denies by name.
pub const COMMIT_DENIES: &[&str] = &["git push *"];

/// A policy, ready to decide; serialized (patterns as their text) to travel with a call to
/// a worker.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rules {
    /// Its name (`edit`, or the workflow's `[policy.NAME]`), for messages.
    pub name: String,
    /// Where it is declared (`workflow.toml:12:1`), for messages; none for a level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The files an agent may change.
    pub edit: Edit,
    /// Commands allowed, by pattern.
    pub allow: Vec<Pattern>,
    /// Commands denied, by pattern: they win over `allow`.
    pub deny: Vec<Pattern>,
    /// Whether every command is allowed that no `deny` names (the `full` level).
    pub any_command: bool,
    /// Whether the agent may fetch from the network.
    pub network: bool,
    /// Whether the agent may do what no other rule covers.
    pub other: bool,
}

/// The files an agent may change.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Edit {
    /// None.
    Nothing,
    /// Any file in the workspace (but in its `.git`).
    Workspace,
    /// The files under the workspace that match one of these globs (relative to it).
    Paths(Vec<String>),
    /// Any file anywhere (the `full` level).
    Anywhere,
}

impl Default for Rules {
    /// The lowest level, `read-only`.
    fn default() -> Rules {
        Rules {
            name: "read-only".into(),
            origin: None,
            edit: Edit::Nothing,
            allow: Vec::new(),
            deny: Vec::new(),
            any_command: false,
            network: false,
            other: false,
        }
    }
}

impl Rules {
    /// A named level; `None` for a name that is not one of [`LEVELS`].
    pub fn level(name: &str) -> Option<Rules> {
        let base = Rules {
            name: name.to_owned(),
            ..Rules::default()
        };
        Some(match name {
            "read-only" => base,
            "edit" => Rules {
                edit: Edit::Workspace,
                ..base
            },
            "commit" => Rules {
                edit: Edit::Workspace,
                allow: patterns(COMMIT_ALLOWS),
                deny: patterns(COMMIT_DENIES),
                ..base
            },
            "full" => Rules {
                edit: Edit::Anywhere,
                any_command: true,
                network: true,
                other: true,
                ..base
            },
            _ => return None,
        })
    }

    /// Whether the policy lets an agent change files at all.
    pub fn edits(&self) -> bool {
        self.edit != Edit::Nothing
    }

    /// Whether it lets an agent run some command.
    pub fn runs_commands(&self) -> bool {
        self.any_command || !self.allow.is_empty()
    }

    /// Decides one action of an agent working in `workspace` (a canonical path).
    pub fn decide(&self, action: &Action, workspace: &Path) -> Decision {
        match action {
            Action::Read => self.allowed("reading is always allowed"),
            Action::Edit(paths) => self.decide_edits(paths, workspace),
            Action::Execute(line) => self.decide_command(line, workspace),
            Action::Fetch(what) => {
                if self.network {
                    self.allowed("`network` is allowed")
                } else {
                    self.denied(format!("`network` is not allowed (fetching {what})"))
                }
            }
            Action::Other(what) => {
                if self.other {
                    self.allowed("`other` is allowed")
                } else {
                    self.denied(format!(
                        "`other` is not allowed ({what} is not an edit, a command or a fetch)"
                    ))
                }
            }
        }
    }

    fn allowed(&self, rule: impl Into<String>) -> Decision {
        Decision {
            allowed: true,
            rule: rule.into(),
            policy: self.name.clone(),
        }
    }

    fn denied(&self, rule: impl Into<String>) -> Decision {
        Decision {
            allowed: false,
            rule: rule.into(),
            policy: self.name.clone(),
        }
    }

    fn decide_edits(&self, paths: &[PathBuf], workspace: &Path) -> Decision {
        if paths.is_empty() {
            // An edit that names no file: the kind of action is all there is to go by.
            return match self.edit {
                Edit::Nothing => self.denied("`edit` is not allowed"),
                Edit::Anywhere | Edit::Workspace => self.allowed("`edit` is allowed"),
                Edit::Paths(_) => {
                    self.denied("`edit` names paths, and the agent did not say which file")
                }
            };
        }
        let mut last = None;
        for p in paths {
            let d = self.decide_edit(p, workspace);
            if !d.allowed {
                return d;
            }
            last = Some(d);
        }
        last.unwrap_or_else(|| self.denied("no file"))
    }

    fn decide_edit(&self, path: &Path, workspace: &Path) -> Decision {
        let shown = path.display();
        if self.edit == Edit::Anywhere {
            return self.allowed("`edit` is allowed anywhere");
        }
        if self.edit == Edit::Nothing {
            return self.denied(format!("`edit` is not allowed (writing {shown})"));
        }
        let Some(inside) = confined(path, workspace) else {
            return self.denied(format!("{shown} is outside the workspace"));
        };
        if inside.components().next() == Some(Component::Normal(".git".as_ref())) {
            return self.denied(format!(
                "{shown} is in the repository's .git; only git commands may change it"
            ));
        }
        match &self.edit {
            Edit::Paths(globs) => {
                let rel = inside.to_string_lossy();
                match globs.iter().find(|g| glob_matches(g, &rel)) {
                    Some(g) => self.allowed(format!("edit `{g}`")),
                    None => self.denied(format!(
                        "{rel} matches none of `edit`'s paths ({})",
                        globs
                            .iter()
                            .map(|g| format!("`{g}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                }
            }
            _ => self.allowed("`edit` is allowed in the workspace"),
        }
    }

    fn decide_command(&self, line: &str, workspace: &Path) -> Decision {
        let parsed = match split_commands(line) {
            Ok(p) => p,
            Err(why) => {
                return if self.any_command && self.deny.is_empty() {
                    self.allowed("every command is allowed")
                } else {
                    self.denied(format!("the command cannot be checked: {why}"))
                };
            }
        };
        let mut last = None;
        for simple in &parsed {
            for target in &simple.writes {
                let d = self.decide_edit(Path::new(target), workspace);
                if !d.allowed {
                    return self.denied(format!("redirection to {target}: {}", d.rule));
                }
            }
            let d = self.decide_argv(&simple.argv, workspace);
            if !d.allowed {
                return d;
            }
            last = Some(d);
        }
        last.unwrap_or_else(|| self.allowed("an empty command"))
    }

    fn decide_argv(&self, argv: &[String], workspace: &Path) -> Decision {
        if argv.is_empty() {
            return self.allowed("an empty command");
        }
        // `sh -c SCRIPT`: the script is what runs.
        if let [sh, flag, script, ..] = argv
            && is_shell(sh)
            && flag == "-c"
        {
            return self.decide_command(script, workspace);
        }
        let shown = crate::shell::join_shown(argv, 200);
        if let Some(p) = self.deny.iter().find(|p| p.matches(argv)) {
            return self.denied(format!("deny `{}` ({shown})", p.text));
        }
        if let Some(p) = self.allow.iter().find(|p| p.matches(argv)) {
            return self.allowed(format!("allow `{}`", p.text));
        }
        if self.any_command {
            return self.allowed("every command is allowed");
        }
        if argv[0] == "cd" {
            return self.allowed("`cd` changes nothing");
        }
        if self.allow.is_empty() {
            self.denied(format!("no command is allowed ({shown})"))
        } else {
            self.denied(format!("`{shown}` matches no `allow` pattern"))
        }
    }
}

fn patterns(texts: &[&str]) -> Vec<Pattern> {
    texts
        .iter()
        .filter_map(|t| Pattern::parse(t).ok())
        .collect()
}

fn is_shell(program: &str) -> bool {
    let name = program.rsplit('/').next().unwrap_or(program);
    matches!(name, "sh" | "bash" | "zsh" | "dash")
}

/// A glob over a workspace-relative path: `*` stays in one directory, `**` crosses them.
fn glob_matches(glob: &str, path: &str) -> bool {
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    glob::Pattern::new(glob).is_ok_and(|g| g.matches_with(path, options))
        // `src` names the directory and what is in it.
        || glob::Pattern::new(&format!("{}/**", glob.trim_end_matches('/')))
            .is_ok_and(|g| g.matches_with(path, options))
}

/// What an agent asks to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Read files, search, think: always allowed (what an agent reads through the client
    /// is confined on its own).
    Read,
    /// Change, create, delete or move these files.
    Edit(Vec<PathBuf>),
    /// Run this command line.
    Execute(String),
    /// Fetch from the network (a URL or a query).
    Fetch(String),
    /// Anything else, described.
    Other(String),
}

/// A decision, with the rule that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The rule, said for people: ``deny `git push *` (git push origin main)``.
    pub rule: String,
    /// The policy's name.
    pub policy: String,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} by policy `{}`: {}",
            if self.allowed { "allowed" } else { "denied" },
            self.policy,
            self.rule
        )
    }
}

/// A command pattern: words matched one by one against an argv, each a glob (`*`, `?`,
/// `[...]`) over one word; a last word `*` alone matches any number of further words, none
/// included. `git commit *` matches `git commit` and `git commit -m "x y"`; `cargo test`
/// matches only `cargo test`.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    /// As written.
    pub text: String,
    /// Each word's glob, compiled once.
    words: Vec<glob::Pattern>,
    rest: bool,
}

impl serde::Serialize for Pattern {
    /// As written.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for Pattern {
    /// As written, parsed again.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Pattern, D::Error> {
        let text = String::deserialize(d)?;
        Pattern::parse(&text)
            .map_err(|why| serde::de::Error::custom(format!("command pattern `{text}`: {why}")))
    }
}

impl Pattern {
    /// Parses a pattern, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let mut words = shlex::split(text).ok_or_else(|| {
            "a quote is not closed; write the pattern as words, quoted as in a shell".to_owned()
        })?;
        if words.is_empty() {
            return Err("the pattern is empty; write the command's words, `git commit *`".into());
        }
        let rest = words.last().is_some_and(|w| w == "*") && words.len() > 1;
        if rest {
            words.pop();
        }
        let words = words
            .iter()
            .map(|w| glob::Pattern::new(w).map_err(|e| format!("`{w}` is not a valid glob: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(Pattern {
            text: text.to_owned(),
            words,
            rest,
        })
    }

    /// Whether an argv matches.
    pub fn matches(&self, argv: &[String]) -> bool {
        if argv.len() < self.words.len() || (!self.rest && argv.len() != self.words.len()) {
            return false;
        }
        let program = argv[0].rsplit('/').next().unwrap_or(&argv[0]);
        self.words.iter().enumerate().all(|(i, w)| {
            let word = if i == 0 { program } else { argv[i].as_str() };
            w.matches(word)
        })
    }
}

/// One simple command of a command line: its words (assignments before it left out) and
/// the files its redirections write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Simple {
    pub argv: Vec<String>,
    pub writes: Vec<String>,
}

/// Splits a command line into its simple commands, as a POSIX shell would read it: quotes,
/// backslashes, `;`, `&&`, `||`, `|`, `&`, newlines, `#` comments, redirections. Refuses
/// what it cannot see through: command substitution, process substitution, here-documents,
/// an unclosed quote.
pub fn split_commands(line: &str) -> Result<Vec<Simple>, String> {
    let mut out = Vec::new();
    let mut cur = Simple::default();
    let mut word = String::new();
    let mut in_word = false;
    // The next word is a redirection's target.
    let mut redirect: Option<bool> = None;
    let mut chars = line.chars().peekable();

    fn end_word(
        cur: &mut Simple,
        word: &mut String,
        in_word: &mut bool,
        redirect: &mut Option<bool>,
    ) {
        if !*in_word {
            return;
        }
        let w = std::mem::take(word);
        *in_word = false;
        match redirect.take() {
            Some(true) => cur.writes.push(w),
            Some(false) => {}
            None => {
                // `NAME=value` before the command is an assignment, not the program.
                let assignment = cur.argv.is_empty()
                    && w.split_once('=').is_some_and(|(n, _)| {
                        !n.is_empty()
                            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                            && !n.starts_with(|c: char| c.is_ascii_digit())
                    });
                if !assignment {
                    cur.argv.push(w);
                }
            }
        }
    }
    fn end_command(out: &mut Vec<Simple>, cur: &mut Simple) {
        let c = std::mem::take(cur);
        if !c.argv.is_empty() || !c.writes.is_empty() {
            out.push(c);
        }
    }

    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(ch) => word.push(ch),
                        None => return Err("a single quote is not closed".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(ch @ ('"' | '\\' | '$' | '`')) => word.push(ch),
                            Some('\n') => {}
                            Some(ch) => {
                                word.push('\\');
                                word.push(ch);
                            }
                            None => return Err("a double quote is not closed".into()),
                        },
                        Some('`') => return Err("it has a command substitution (`...`)".into()),
                        Some('$') if chars.peek() == Some(&'(') => {
                            return Err("it has a command substitution ($(...))".into());
                        }
                        Some(ch) => word.push(ch),
                        None => return Err("a double quote is not closed".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(ch) => {
                    in_word = true;
                    word.push(ch);
                }
                None => {}
            },
            '`' => return Err("it has a command substitution (`...`)".into()),
            '$' if chars.peek() == Some(&'(') => {
                return Err("it has a command substitution ($(...))".into());
            }
            '#' if !in_word => {
                // A comment, to the end of the line.
                for ch in chars.by_ref() {
                    if ch == '\n' {
                        break;
                    }
                }
                end_word(&mut cur, &mut word, &mut in_word, &mut redirect);
                end_command(&mut out, &mut cur);
            }
            ' ' | '\t' => end_word(&mut cur, &mut word, &mut in_word, &mut redirect),
            ';' | '\n' | '&' | '|' => {
                end_word(&mut cur, &mut word, &mut in_word, &mut redirect);
                if c == '&' && chars.peek() == Some(&'>') {
                    // `&>FILE`: both outputs to a file.
                    chars.next();
                    if chars.peek() == Some(&'>') {
                        chars.next();
                    }
                    redirect = Some(true);
                    continue;
                }
                if (c == '&' || c == '|') && chars.peek() == Some(&c) {
                    chars.next();
                }
                if redirect.is_some() {
                    return Err("a redirection has no target".into());
                }
                end_command(&mut out, &mut cur);
            }
            '>' | '<' => {
                // A file descriptor number right before it belongs to the redirection.
                if in_word && word.chars().all(|ch| ch.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                } else {
                    end_word(&mut cur, &mut word, &mut in_word, &mut redirect);
                }
                if c == '<' && chars.peek() == Some(&'(') || c == '>' && chars.peek() == Some(&'(')
                {
                    return Err("it has a process substitution".into());
                }
                if c == '<' && chars.peek() == Some(&'<') {
                    return Err("it has a here-document".into());
                }
                if chars.peek() == Some(&'>') || chars.peek() == Some(&'|') {
                    chars.next();
                }
                if chars.peek() == Some(&'&') {
                    // `2>&1`, `>&2`: a duplication, no file.
                    chars.next();
                    let mut fd = String::new();
                    while let Some(&d) = chars.peek() {
                        if d.is_ascii_digit() || d == '-' {
                            fd.push(d);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    if fd.is_empty() {
                        redirect = Some(c == '>');
                    }
                    continue;
                }
                redirect = Some(c == '>');
            }
            '(' | ')' | '{' | '}' if !in_word => {
                // Subshells and groups: what is inside is still commands of the line.
                end_word(&mut cur, &mut word, &mut in_word, &mut redirect);
                end_command(&mut out, &mut cur);
            }
            ch => {
                in_word = true;
                word.push(ch);
            }
        }
    }
    end_word(&mut cur, &mut word, &mut in_word, &mut redirect);
    if redirect.is_some() {
        return Err("a redirection has no target".into());
    }
    end_command(&mut out, &mut cur);
    // `/dev/null` and the standard streams are not files anyone keeps.
    for s in &mut out {
        s.writes
            .retain(|w| !matches!(w.as_str(), "/dev/null" | "/dev/stdout" | "/dev/stderr"));
    }
    Ok(out)
}

/// The path relative to `workspace` (canonical) when `path` (absolute, or relative to the
/// workspace) lies inside it, following the symbolic links of the part that exists; `None`
/// when it leads out, by `..`, by being absolute elsewhere or through a link.
pub fn confined(path: &Path, workspace: &Path) -> Option<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        workspace.join(path)
    };
    // Lexically first: `a/../b` is `b`; `..` above the root leads out.
    let mut lexical = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                if !lexical.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    // Then through the links of the longest part that exists.
    let mut existing = lexical.as_path();
    let mut rest = Vec::new();
    let real = loop {
        match existing.canonicalize() {
            Ok(r) => break r,
            Err(_) => {
                rest.push(existing.file_name()?.to_owned());
                existing = existing.parent()?;
            }
        }
    };
    let mut real = real;
    for part in rest.iter().rev() {
        real.push(part);
    }
    real.strip_prefix(workspace).ok().map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().canonicalize().expect("canonical");
        (d, p)
    }

    fn run(rules: &Rules, line: &str, ws: &Path) -> Decision {
        rules.decide(&Action::Execute(line.into()), ws)
    }

    #[test]
    fn commit_allows_committing_and_denies_pushing_by_its_rule() {
        let (_d, ws) = ws();
        let r = Rules::level("commit").expect("level");
        let ok = run(&r, "git add -A && git commit -m 'fix: the loop'", &ws);
        assert!(ok.allowed, "{ok}");
        assert_eq!(ok.rule, "allow `git commit *`");
        let push = run(&r, "git push origin main", &ws);
        assert!(!push.allowed);
        assert_eq!(push.rule, "deny `git push *` (git push origin main)");
        assert_eq!(
            push.to_string(),
            "denied by policy `commit`: deny `git push *` (git push origin main)"
        );
        // Hidden behind an allowed command, in a script, after an assignment.
        for line in [
            "git commit -m x; git push",
            "git status | git push -f",
            "sh -c 'git add . && git push --force'",
            "GIT_TRACE=1 /usr/bin/git push",
        ] {
            let d = run(&r, line, &ws);
            assert!(!d.allowed, "{line}: {d}");
            assert!(d.rule.starts_with("deny `git push *`"), "{line}: {d}");
        }
        assert!(!run(&r, "rm -rf target", &ws).allowed);
    }

    #[test]
    fn what_cannot_be_read_is_denied_unless_everything_is_allowed() {
        let (_d, ws) = ws();
        let r = Rules::level("commit").expect("level");
        let d = run(&r, "git commit -m \"$(curl evil)\"", &ws);
        assert!(!d.allowed);
        assert!(d.rule.contains("command substitution"), "{d}");
        assert!(!run(&r, "git commit -m 'open", &ws).allowed);
        let full = Rules::level("full").expect("level");
        assert!(run(&full, "echo `date`", &ws).allowed);
    }

    #[test]
    fn redirections_are_edits() {
        let (_d, ws) = ws();
        let mut r = Rules::level("edit").expect("level");
        r.allow.push(Pattern::parse("echo *").expect("pattern"));
        assert!(run(&r, "echo hi > notes.txt 2>&1", &ws).allowed);
        assert!(run(&r, "echo hi 2>/dev/null", &ws).allowed);
        let out = run(&r, "echo hi >> /etc/motd", &ws);
        assert!(!out.allowed);
        assert!(out.rule.contains("outside the workspace"), "{out}");
        let ro = Rules {
            allow: r.allow.clone(),
            ..Rules::level("read-only").expect("level")
        };
        assert!(!run(&ro, "echo hi > notes.txt", &ws).allowed);
    }

    #[test]
    fn patterns_match_word_by_word() {
        let p = |s: &str| Pattern::parse(s).expect("pattern");
        let argv = |s: &str| shlex::split(s).expect("argv");
        assert!(p("cargo test").matches(&argv("cargo test")));
        assert!(!p("cargo test").matches(&argv("cargo test --all")));
        assert!(p("cargo test *").matches(&argv("cargo test")));
        assert!(p("cargo test *").matches(&argv("cargo test -p 'a b'")));
        assert!(p("git commit -m *").matches(&argv("git commit -m 'x'")));
        assert!(p("npm run test:*").matches(&argv("npm run test:unit")));
        assert!(!p("git *").matches(&argv("gitk")));
        assert!(p("git *").matches(&argv("/usr/bin/git status")));
        assert!(Pattern::parse("").is_err());
        assert!(Pattern::parse("git 'commit").is_err());
        assert!(Pattern::parse("git [commit").is_err());
    }

    #[test]
    fn edits_stay_in_the_workspace_and_out_of_git() {
        let (_d, ws) = ws();
        std::fs::create_dir_all(ws.join("src")).expect("mkdir");
        std::fs::create_dir_all(ws.join(".git")).expect("mkdir");
        let r = Rules::level("edit").expect("level");
        let edit = |p: &str| r.decide(&Action::Edit(vec![PathBuf::from(p)]), &ws);
        assert!(edit("src/main.rs").allowed);
        assert!(edit(&ws.join("new/dir/file.rs").to_string_lossy()).allowed);
        assert!(!edit("../elsewhere.txt").allowed);
        assert!(!edit("/etc/passwd").allowed);
        assert!(!edit("src/../../x").allowed);
        let git = edit(".git/config");
        assert!(!git.allowed);
        assert!(git.rule.contains(".git"), "{git}");
        // Through a symbolic link that leads out.
        let outside = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(outside.path(), ws.join("out")).expect("symlink");
        assert!(!edit("out/file.txt").allowed);

        let paths = Rules {
            edit: Edit::Paths(vec!["src".into(), "tests/**/*.rs".into()]),
            ..r.clone()
        };
        let edit = |p: &str| paths.decide(&Action::Edit(vec![PathBuf::from(p)]), &ws);
        assert!(edit("src/lib.rs").allowed);
        assert!(edit("tests/a/b.rs").allowed);
        let no = edit("README.md");
        assert!(!no.allowed);
        assert!(no.rule.contains("matches none of `edit`'s paths"), "{no}");

        let ro = Rules::level("read-only").expect("level");
        assert!(!ro.decide(&Action::Edit(vec!["a".into()]), &ws).allowed);
        assert!(ro.decide(&Action::Read, &ws).allowed);
    }

    #[test]
    fn network_and_other_follow_their_switches() {
        let (_d, ws) = ws();
        let e = Rules::level("edit").expect("level");
        assert!(!e.decide(&Action::Fetch("https://x".into()), &ws).allowed);
        assert!(!e.decide(&Action::Other("mcp tool".into()), &ws).allowed);
        let f = Rules::level("full").expect("level");
        assert!(f.decide(&Action::Fetch("https://x".into()), &ws).allowed);
        assert!(f.decide(&Action::Other("mcp tool".into()), &ws).allowed);
        assert!(f.decide(&Action::Edit(vec!["/tmp/x".into()]), &ws).allowed);
        assert!(Rules::level("admin").is_none());
    }

    #[test]
    fn a_policy_travels_as_json_with_its_patterns_as_written() {
        let (_d, ws) = ws();
        let mut r = Rules::level("commit").expect("level");
        r.name = "wiggum".into();
        r.origin = Some("workflow.toml:3:9".into());
        r.edit = Edit::Paths(vec!["src/**".into()]);
        let json = serde_json::to_value(&r).expect("serializes");
        assert_eq!(json["edit"], serde_json::json!({ "paths": ["src/**"] }));
        assert_eq!(json["deny"], serde_json::json!(["git push *"]));
        let back: Rules = serde_json::from_value(json).expect("deserializes");
        assert_eq!(back, r);
        let push = run(&back, "git push origin main", &ws);
        assert_eq!(push.rule, "deny `git push *` (git push origin main)");
        // A level without an origin writes none.
        let level = serde_json::to_value(Rules::level("edit").expect("level")).expect("json");
        assert!(level.get("origin").is_none(), "{level}");
        assert_eq!(level["edit"], "workspace");
        // A pattern that does not parse is refused with why.
        let mut bad = serde_json::to_value(&r).expect("json");
        bad["allow"] = serde_json::json!(["git 'commit"]);
        let e = serde_json::from_value::<Rules>(bad).expect_err("refused");
        assert!(
            e.to_string().contains("command pattern `git 'commit`"),
            "{e}"
        );
    }

    #[test]
    fn command_lines_split_as_a_shell_reads_them() {
        let s =
            split_commands("A=1 make -j2 && cat <in.txt | tee out.log >/dev/null; echo 'a;b' # c")
                .expect("split");
        let argvs: Vec<_> = s.iter().map(|c| c.argv.join(" ")).collect();
        assert_eq!(argvs, ["make -j2", "cat", "tee out.log", "echo a;b"]);
        assert_eq!(s[2].writes, Vec::<String>::new());
        let s = split_commands("cmd 2>err.txt 1>>out.txt").expect("split");
        assert_eq!(s[0].writes, ["err.txt", "out.txt"]);
        assert!(split_commands("diff <(ls a) <(ls b)").is_err());
        assert!(split_commands("cat <<EOF").is_err());
        assert!(split_commands("echo >").is_err());
        assert_eq!(
            split_commands("(cd sub && git status)")
                .expect("split")
                .len(),
            2
        );
    }
}
