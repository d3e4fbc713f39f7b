//! Permission policies (`[policy.NAME]`): what an agent may do unattended, named by an
//! agent's or an agent stage's `permissions`, and their resolution into the
//! [`crate::permit::Rules`] that decide an agent's requests.
//!
//! A policy starts from what it `extends` (a level, `read-only` by default, or another
//! policy) and adds its own rules: `allow` and `deny` append to the lists it extends;
//! `edit`, `network` and `other` replace what it extends says.

use std::sync::Arc;

use super::Text;
use crate::permit::{Edit, LEVELS, Pattern, Rules};
use crate::source::{Span, Spanned};

/// A policy as written.
#[derive(Clone, Debug)]
pub struct Policy {
    pub name: Text,
    /// A level or another policy's name; `None`: `read-only`.
    pub extends: Option<Text>,
    pub edit: Option<Spanned<PolicyEdit>>,
    pub allow: Vec<Text>,
    pub deny: Vec<Text>,
    pub network: Option<Spanned<bool>>,
    pub other: Option<Spanned<bool>>,
    pub span: Span,
}

/// `edit` as written.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyEdit {
    /// `true` (the workspace) or `false` (nothing).
    Workspace(bool),
    /// Globs relative to the workspace.
    Paths(Vec<Text>),
    /// Neither a boolean nor strings (the checker says so).
    Wrong,
}

impl Policy {
    /// The keys it writes that add rules of their own to a level (`edit` paths, `allow`,
    /// `deny`, `network`, `other`), with their spans: what only a client that answers each
    /// request (an `acp` agent) can enforce, unless the result is a level after all.
    pub fn rule_keys(&self) -> Vec<(&'static str, Span)> {
        let mut out = Vec::new();
        if let Some(e) = self
            .edit
            .as_ref()
            .filter(|e| e.value != PolicyEdit::Workspace(true))
            && e.value != PolicyEdit::Workspace(false)
        {
            out.push(("edit", e.span));
        }
        if let Some(a) = self.allow.first() {
            out.push(("allow", a.span));
        }
        if let Some(d) = self.deny.first() {
            out.push(("deny", d.span));
        }
        if let Some(n) = &self.network {
            out.push(("network", n.span));
        }
        if let Some(o) = &self.other {
            out.push(("other", o.span));
        }
        out
    }
}

/// Why a name cannot be resolved into rules (the checker reports each; the executor never
/// sees one in a checked workflow).
#[derive(Clone, Debug, PartialEq)]
pub enum Unresolved {
    /// A name that is neither a level nor a policy: the name as written (a `permissions` or
    /// an `extends`).
    Unknown(String),
    /// Policies that extend each other: their names, in the order followed, the first again
    /// at the end.
    Cycle(Vec<String>),
    /// A pattern of `allow` or `deny` that does not parse, with why.
    Pattern(Text, String),
}

/// The chain of policies a name leads through, the named one first, and the level it
/// starts from.
pub fn chain<'p>(
    name: &str,
    policies: &'p [Policy],
) -> Result<(Vec<&'p Policy>, &'static str), Unresolved> {
    let mut out: Vec<&Policy> = Vec::new();
    let mut name = name;
    loop {
        if let Some(level) = LEVELS.iter().find(|l| **l == name) {
            return Ok((out, level));
        }
        let Some(p) = policies.iter().find(|p| p.name.value == name) else {
            return Err(Unresolved::Unknown(name.to_owned()));
        };
        if out.iter().any(|q| std::ptr::eq(*q, p)) {
            let mut names: Vec<String> = out
                .iter()
                .skip_while(|q| !std::ptr::eq(**q, p))
                .map(|q| q.name.value.clone())
                .collect();
            names.push(p.name.value.clone());
            return Err(Unresolved::Cycle(names));
        }
        out.push(p);
        name = p.extends.as_ref().map_or("read-only", |e| e.value.as_str());
    }
}

/// Resolves a `permissions` value (a level or a policy's name) into the rules that decide
/// by it; `locate` names where a policy is declared (`workflow.toml:12:1`).
pub fn resolve(
    name: &str,
    policies: &[Policy],
    locate: &dyn Fn(Span) -> String,
) -> Result<Rules, Unresolved> {
    let (chain, level) = chain(name, policies)?;
    let mut rules = Rules::level(level).unwrap_or_default();
    for p in chain.iter().rev() {
        if let Some(e) = &p.edit {
            rules.edit = match &e.value {
                PolicyEdit::Workspace(true) => Edit::Workspace,
                PolicyEdit::Workspace(false) | PolicyEdit::Wrong => Edit::Nothing,
                PolicyEdit::Paths(paths) => {
                    Edit::Paths(paths.iter().map(|p| p.value.clone()).collect())
                }
            };
        }
        for (texts, into) in [(&p.allow, &mut rules.allow), (&p.deny, &mut rules.deny)] {
            for t in texts {
                let pattern =
                    Pattern::parse(&t.value).map_err(|why| Unresolved::Pattern(t.clone(), why))?;
                into.push(pattern);
            }
        }
        if let Some(n) = &p.network {
            rules.network = n.value;
        }
        if let Some(o) = &p.other {
            rules.other = o.value;
        }
    }
    if let Some(first) = chain.first() {
        rules.name = first.name.value.clone();
        rules.origin = Some(locate(first.name.span));
    }
    Ok(rules)
}

/// The rules of a `permissions` value for the executor: resolved, shared, and `read-only`
/// for a name the checker would have refused (the least an agent may do).
pub fn resolve_shared(
    name: Option<&str>,
    policies: &[Policy],
    locate: &dyn Fn(Span) -> String,
) -> Arc<Rules> {
    Arc::new(resolve(name.unwrap_or("read-only"), policies, locate).unwrap_or_default())
}

/// Whether an agent of this kind takes `permissions` (the format's spec says which kinds).
pub fn takes_permissions(kind: super::AgentKind) -> bool {
    crate::spec::AGENT
        .field("permissions")
        .is_some_and(|f| f.kinds.contains(&kind.as_str()))
}

/// The sentence for a `permissions` value other tools use (`yolo`, `write`), in TOML and in
/// KDL, with the level it recommends.
pub fn well_known(value: &str) -> Option<(String, String, &'static str)> {
    let w = crate::spec::well_known("agent", "permissions", value)?;
    let (toml, kdl) = w.advice("permissions");
    Some((toml, kdl, w.right))
}

/// The level whose rules these are, when they are one's (whatever their name): what an
/// agent CLI, which knows its levels only, can be told.
pub fn level_of(rules: &Rules) -> Option<&'static str> {
    LEVELS.iter().copied().find(|l| {
        Rules::level(l).is_some_and(|lv| {
            Rules {
                name: rules.name.clone(),
                origin: rules.origin.clone(),
                ..lv
            } == *rules
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;

    fn t(s: &str) -> Text {
        Spanned::new(s.to_owned(), Span::new(FileId::default(), 0..0))
    }

    fn policy(name: &str, extends: Option<&str>) -> Policy {
        Policy {
            name: t(name),
            extends: extends.map(t),
            edit: None,
            allow: Vec::new(),
            deny: Vec::new(),
            network: None,
            other: None,
            span: Span::new(FileId::default(), 0..0),
        }
    }

    fn here(_: Span) -> String {
        "workflow.toml:3:9".into()
    }

    #[test]
    fn the_spec_lists_the_levels() {
        assert_eq!(crate::spec::PERMISSIONS, LEVELS);
        assert!(well_known("YOLO").is_some_and(|(_, _, right)| right == "full"));
    }

    #[test]
    fn lists_append_along_the_chain_and_switches_replace() {
        let base = Policy {
            allow: vec![t("cargo test *")],
            network: Some(Spanned::new(true, Span::default())),
            ..policy("base", Some("commit"))
        };
        let child = Policy {
            allow: vec![t("make")],
            deny: vec![t("git commit --amend *")],
            network: Some(Spanned::new(false, Span::default())),
            edit: Some(Spanned::new(
                PolicyEdit::Paths(vec![t("src/**")]),
                Span::default(),
            )),
            ..policy("child", Some("base"))
        };
        let rules = resolve("child", &[base, child], &here).expect("resolves");
        assert_eq!(rules.name, "child");
        assert_eq!(rules.origin.as_deref(), Some("workflow.toml:3:9"));
        let allow: Vec<_> = rules.allow.iter().map(|p| p.text.as_str()).collect();
        // The level's first, then each policy's, the extended one first.
        assert_eq!(&allow[allow.len() - 2..], ["cargo test *", "make"]);
        assert!(allow.contains(&"git commit *"));
        let deny: Vec<_> = rules.deny.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(deny, ["git push *", "git commit --amend *"]);
        assert!(
            !rules.network,
            "the child's `network = false` replaces the base's"
        );
        assert_eq!(rules.edit, Edit::Paths(vec!["src/**".into()]));
        assert_eq!(level_of(&rules), None);
    }

    #[test]
    fn a_policy_starts_from_read_only_and_may_be_a_level_after_all() {
        let p = policy("quiet", None);
        let rules = resolve("quiet", std::slice::from_ref(&p), &here).expect("resolves");
        assert_eq!(rules.name, "quiet");
        assert_eq!(level_of(&rules), Some("read-only"));
        let writer = Policy {
            edit: Some(Spanned::new(PolicyEdit::Workspace(true), Span::default())),
            ..policy("writer", None)
        };
        let rules = resolve("writer", &[writer], &here).expect("resolves");
        assert_eq!(level_of(&rules), Some("edit"));
        let level = resolve("commit", &[], &here).expect("a level");
        assert_eq!(level.origin, None);
        assert_eq!(level_of(&level), Some("commit"));
    }

    #[test]
    fn unknown_names_cycles_and_bad_patterns_are_refused() {
        assert_eq!(
            resolve("admin", &[], &here),
            Err(Unresolved::Unknown("admin".into()))
        );
        let a = policy("a", Some("b"));
        let b = policy("b", Some("c"));
        let c = policy("c", Some("b"));
        assert_eq!(
            resolve("a", &[a, b, c], &here),
            Err(Unresolved::Cycle(vec!["b".into(), "c".into(), "b".into()]))
        );
        let bad = Policy {
            allow: vec![t("git 'commit")],
            ..policy("bad", None)
        };
        assert!(matches!(
            resolve("bad", &[bad], &here),
            Err(Unresolved::Pattern(p, _)) if p.value == "git 'commit"
        ));
        assert_eq!(
            level_of(&resolve_shared(Some("nope"), &[], &here)),
            Some("read-only")
        );
    }
}
