//! What a template can see: which stages have run where, and which may have been skipped.

use std::collections::{HashMap, HashSet};

use super::graph::route_targets;
use super::{Checked, StageId};
use crate::model::StageKind;

/// Where a template or expression is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// While a stage runs (its prompt, argv, condition).
    Stage(StageId),
    /// After an iteration of a loop's body (its `until` and `stuck` rule).
    BodyEnd(StageId),
    /// When a region starts (a for_each's `over`, a worktree's branch).
    Region(StageId),
}

impl Site {
    /// Returns the stage the site belongs to.
    pub fn stage(self) -> StageId {
        match self {
            Site::Stage(s) | Site::BodyEnd(s) | Site::Region(s) => s,
        }
    }
}

/// Tells whether a stage's output is ready at a site: whether it is among the stages before the site in
/// its body's graph or an enclosing one (or, for a loop or group, in its body), found
/// by searching back from the site only in the bodies where it can be, and only until it is
/// found. (Building the whole set for every read made a chain whose stages each read the one
/// before quadratic to check.)
pub fn is_upstream(c: &Checked<'_>, site: Site, target: StageId) -> bool {
    // The stages whose output stands for the target's: itself, and the loops and groups
    // around it as far as they nest in loops and groups (their latest outputs include their
    // bodies'; see `add_with_body`). At most one of them is in any one body.
    let mut stands_for = vec![target];
    let mut up = c.info(target).parent;
    while let Some(r) = up {
        if !matches!(
            c.info(r).stage.kind().value,
            StageKind::Loop | StageKind::Group
        ) {
            break;
        }
        stands_for.push(r);
        up = c.info(r).parent;
    }
    let mut cur = match site {
        Site::Stage(s) | Site::Region(s) => s,
        Site::BodyEnd(l) => {
            // After an iteration, the whole body has run.
            if stands_for.iter().any(|x| c.info(*x).parent == Some(l)) {
                return true;
            }
            l
        }
    };
    loop {
        let region = c.info(cur).parent;
        let wanted = stands_for.iter().find(|x| c.info(**x).parent == region);
        if let Some(&wanted) = wanted {
            if reaches_back(c, cur, wanted) {
                return true;
            }
        }
        match region {
            Some(r) => cur = r,
            None => return false,
        }
    }
}

/// Tells whether `wanted` comes before `from` in their body's graph (through needs and
/// routes), `from` itself excluded. What a search learns is kept for later questions about
/// the same stage ([`Checked::reaches`]): when every stage of a long chain reads the first
/// one, each search stops at the stage before it.
fn reaches_back(c: &Checked<'_>, from: StageId, wanted: StageId) -> bool {
    remembered_search(c, from, wanted).unwrap_or_else(|| plain_search(c, from, wanted))
}

/// The stages just before a stage in its body's graph: its needs and the stages whose route
/// goes to it.
fn before(c: &Checked<'_>, x: StageId) -> Vec<StageId> {
    c.search_steps.set(c.search_steps.get() + 1);
    let region = c.info(x).parent;
    let needs = c
        .info(x)
        .needs
        .iter()
        .filter(|n| c.info(**n).parent == region);
    let routed = c.routed_from.get(&x).into_iter().flatten();
    needs.chain(routed).copied().collect()
}

/// A depth-first search that records, for every stage it settles, whether `wanted` comes
/// before it. `None` when it meets a cycle (reported on its own), where what it would record
/// could be wrong: the caller then searches without records.
fn remembered_search(c: &Checked<'_>, from: StageId, wanted: StageId) -> Option<bool> {
    let mut all = c.reaches.borrow_mut();
    let known = all.entry(wanted).or_default();
    if let Some(&v) = known.get(&from) {
        return Some(v);
    }
    let mut open: HashSet<StageId> = HashSet::from([from]);
    let mut stack: Vec<(StageId, Vec<StageId>, usize)> = vec![(from, before(c, from), 0)];
    while let Some((x, preds, i)) = stack.last_mut() {
        let Some(&p) = preds.get(*i) else {
            // No stage before `x` leads to `wanted`.
            known.insert(*x, false);
            open.remove(x);
            stack.pop();
            continue;
        };
        *i += 1;
        if open.contains(&p) {
            return None;
        }
        if p == wanted || known.get(&p) == Some(&true) {
            // `wanted` comes before every stage on the stack.
            for (y, _, _) in &stack {
                known.insert(*y, true);
            }
            return Some(true);
        }
        if known.get(&p) == Some(&false) {
            continue;
        }
        open.insert(p);
        let next = before(c, p);
        stack.push((p, next, 0));
    }
    Some(false)
}

/// A breadth-first search back from `from`, without records.
fn plain_search(c: &Checked<'_>, from: StageId, wanted: StageId) -> bool {
    let mut seen: HashSet<StageId> = HashSet::from([from]);
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(x) = queue.pop_front() {
        for p in before(c, x) {
            if !seen.insert(p) {
                continue;
            }
            if p == wanted {
                return true;
            }
            queue.push_back(p);
        }
    }
    false
}

/// Tells whether a stage may be skipped in a run: it has a condition, is reached only by a
/// route or an escalation rule, sits in a body that may be skipped, or needs only stages that
/// may be skipped (and are not `optional`). Computed once for all stages by [`compute_skips`].
pub fn conditional(c: &Checked<'_>, id: StageId) -> bool {
    c.conditional.get(id.0).copied().unwrap_or(false)
}

/// Computes, for every stage, [`conditional`] and whether it may be skipped within its own
/// body (its condition, a route of its body or an escalation rule that alone starts it, or
/// needs that may all be skipped; what [`maybe_skipped_at`] asks of each stage it passes).
///
/// Both are least fixpoints, found by propagating from the stages that start skippable: a
/// stage joins when the last of its needs has joined (or, for `conditional`, when its region
/// has), so each need and each region edge is followed once, whatever the order in which the
/// stages are written. (A stage on a cycle joins only for a reason off the cycle; the cycle
/// is reported on its own.)
///
/// It also returns, for each stage that a route of its body goes to, the stages whose route
/// goes there (see [`Checked::routed_from`]).
pub fn compute_skips(c: &Checked<'_>) -> (Vec<bool>, Vec<bool>, HashMap<StageId, Vec<StageId>>) {
    let n = c.stages.len();
    let mut targets = vec![false; n];
    let mut local_targets = vec![false; n];
    let mut routed_from: HashMap<StageId, Vec<StageId>> = HashMap::new();
    for i in 0..n {
        // With the stages a misspelt route or give-up action meant (reported once, there).
        let meant = super::refs::meant_targets(c, StageId(i));
        for t in route_targets(c, StageId(i)).into_iter().chain(meant) {
            targets[t.0] = true;
            if c.info(t).parent == c.info(StageId(i)).parent {
                local_targets[t.0] = true;
                if t.0 != i {
                    routed_from.entry(t).or_default().push(StageId(i));
                }
            }
        }
    }
    // The stages that need each stage, in one flat array (`first[i]..first[i + 1]`).
    let mut first = vec![0usize; n + 1];
    for info in &c.stages {
        for x in &info.needs {
            first[x.0 + 1] += 1;
        }
    }
    for i in 0..n {
        first[i + 1] += first[i];
    }
    let mut next = first.clone();
    let mut dependents = vec![0usize; first[n]];
    for (i, info) in c.stages.iter().enumerate() {
        for x in &info.needs {
            dependents[next[x.0]] = i;
            next[x.0] += 1;
        }
    }
    let starts = |i: usize, routed: &[bool]| {
        c.stages[i].stage.keys().when.is_some() || routed[i] || is_escalated(c, StageId(i))
    };
    let propagate = |seed: Vec<bool>, through_regions: bool| {
        let mut set = seed;
        // How many of each stage's needs are not (yet) in the set.
        let mut missing: Vec<usize> = c.stages.iter().map(|s| s.needs.len()).collect();
        let mut queue: Vec<usize> = (0..n).filter(|&i| set[i]).collect();
        while let Some(i) = queue.pop() {
            // An optional stage's skip counts as done for the stages that need it.
            let spreads = !c.stages[i].stage.keys().is_optional();
            for &d in dependents[first[i]..first[i + 1]]
                .iter()
                .filter(|_| spreads)
            {
                missing[d] -= 1;
                if missing[d] == 0 && !set[d] {
                    set[d] = true;
                    queue.push(d);
                }
            }
            if through_regions {
                for ch in &c.stages[i].children {
                    if !set[ch.0] {
                        set[ch.0] = true;
                        queue.push(ch.0);
                    }
                }
            }
        }
        set
    };
    let conditional = propagate((0..n).map(|i| starts(i, &targets)).collect(), true);
    let skippable = propagate((0..n).map(|i| starts(i, &local_targets)).collect(), false);
    (conditional, skippable, routed_from)
}

/// Tells whether a stage may be skipped for a reason of its own: its `when`, a route or
/// escalation rule that alone starts it.
pub fn skips_on_its_own(c: &Checked<'_>, id: StageId) -> bool {
    c.info(id).stage.keys().when.is_some() || c.routed_from.contains_key(&id) || is_escalated(c, id)
}

/// Tells whether a stage is skipped only because every stage it needs may be skipped (none
/// of them optional): a skip that spreads to it.
pub fn skips_with_needs(c: &Checked<'_>, id: StageId) -> bool {
    c.skippable.get(id.0).copied().unwrap_or(false)
        && !c.info(id).needs.is_empty()
        && !skips_on_its_own(c, id)
}

/// Tells whether an escalation rule of the enclosing loop runs this stage.
pub fn is_escalated(c: &Checked<'_>, id: StageId) -> bool {
    let Some(parent) = c.info(id).parent else {
        return false;
    };
    match c.info(parent).stage.body.as_loop() {
        Some(l) => {
            let name = &c.info(id).stage.id.value;
            l.escalation
                .iter()
                .any(|r| r.run.iter().any(|t| t.value == *name))
        }
        _ => false,
    }
}

/// Tells whether two stages share an enclosing loop (so one can read the other's history).
pub fn share_loop(c: &Checked<'_>, a: StageId, b: StageId) -> bool {
    let la: Vec<StageId> = c
        .ancestors(a)
        .into_iter()
        .filter(|x| c.info(*x).stage.kind().value == StageKind::Loop)
        .collect();
    let lb = c.ancestors(b);
    la.iter().any(|l| lb.contains(l))
        || (c.info(a).stage.kind().value == StageKind::Loop && lb.contains(&a))
}

/// Tells whether a stage may have been skipped when a site reads it: it may be skipped for a
/// reason inside the regions around the site (its condition, a route or escalation that
/// alone starts it, needs that may all be skipped, or such a reason of a region between it
/// and the site). A loop's own `when` does not make its body's outputs uncertain inside it.
pub fn maybe_skipped_at(c: &Checked<'_>, target: StageId, site: Site) -> bool {
    let mut around = c.ancestors(site.stage());
    if matches!(site, Site::BodyEnd(_) | Site::Region(_)) {
        around.push(site.stage());
    }
    let mut x = Some(target);
    while let Some(id) = x {
        if around.contains(&id) {
            return false;
        }
        if c.skippable.get(id.0).copied().unwrap_or(false) {
            return true;
        }
        x = c.info(id).parent;
    }
    false
}

/// Tells whether a stage can run only after `target` ran: it is `target`, every stage it
/// needs runs only after `target` ran (a stage whose needs were all skipped is skipped), or
/// its enclosing region does.
///
/// What one question learns is kept for later ones about the same target
/// ([`Checked::only_after`]): when every stage of a long chain reads the first one, each
/// answer takes a step. A cycle (reported on its own) is answered without the records.
pub fn runs_only_after(c: &Checked<'_>, at: StageId, target: StageId) -> bool {
    let mut all = c.only_after.borrow_mut();
    let known = all.entry(target).or_default();
    remembered_after(c, at, target, known).unwrap_or_else(|| plain_after(c, at, target))
}

/// [`runs_only_after`], recording each stage's answer; `None` on a cycle. Its walk keeps
/// its own stack: a chain of 100,000 stages, read from its last, is as deep.
fn remembered_after(
    c: &Checked<'_>,
    at: StageId,
    target: StageId,
    known: &mut HashMap<StageId, bool>,
) -> Option<bool> {
    /// A stage whose answer waits for its region's (after its needs gave none).
    const ASK_REGION: usize = usize::MAX - 1;
    /// A stage waiting for its region's answer.
    const WAIT_REGION: usize = usize::MAX;
    enum Next {
        Known(bool),
        Ask,
    }
    let mut open: HashSet<StageId> = HashSet::new();
    // Each stage being answered, with the index of its next need (or a sentinel above).
    let mut stack: Vec<(StageId, usize)> = Vec::new();
    let mut returned: Option<bool> = None;
    // What is known of a stage, or that it must be asked; `None` on a cycle.
    let lookup = |x: StageId, known: &HashMap<StageId, bool>, open: &HashSet<StageId>| {
        if x == target {
            return Some(Next::Known(true));
        }
        if let Some(&v) = known.get(&x) {
            return Some(Next::Known(v));
        }
        if open.contains(&x) {
            return None;
        }
        Some(Next::Ask)
    };
    match lookup(at, known, &open)? {
        Next::Known(v) => return Some(v),
        Next::Ask => {
            open.insert(at);
            stack.push((at, 0));
        }
    }
    'frames: while let Some(&mut (x, ref mut k)) = stack.last_mut() {
        c.search_steps.set(c.search_steps.get() + 1);
        let info = c.info(x);
        let mut answer: Option<bool> = None;
        match returned.take() {
            Some(v) if *k == WAIT_REGION => answer = Some(v),
            Some(true) => *k += 1,
            Some(false) => *k = ASK_REGION,
            None => {}
        }
        // Asking its needs, or all of them answered yes.
        if answer.is_none() && !info.needs.is_empty() && *k <= info.needs.len() {
            while *k < info.needs.len() {
                let n = info.needs[*k];
                if c.info(n).stage.keys().is_optional() {
                    // Skipped, it counts as done: `x` may run without it.
                    *k = ASK_REGION;
                    break;
                }
                match lookup(n, known, &open)? {
                    Next::Known(true) => *k += 1,
                    Next::Known(false) => {
                        *k = ASK_REGION;
                        break;
                    }
                    Next::Ask => {
                        open.insert(n);
                        stack.push((n, 0));
                        continue 'frames;
                    }
                }
            }
            if *k == info.needs.len() {
                answer = Some(true);
            }
        }
        if answer.is_none() && *k != WAIT_REGION {
            // No needs, or one that does not run only after the target: the region decides.
            match info.parent {
                None => answer = Some(false),
                Some(p) => match lookup(p, known, &open)? {
                    Next::Known(v) => answer = Some(v),
                    Next::Ask => {
                        *k = WAIT_REGION;
                        open.insert(p);
                        stack.push((p, 0));
                        continue 'frames;
                    }
                },
            }
        }
        let Some(v) = answer else { continue };
        open.remove(&x);
        known.insert(x, v);
        stack.pop();
        returned = Some(v);
    }
    returned
}

/// [`runs_only_after`] without records, its walk bounded for cycles.
fn plain_after(c: &Checked<'_>, at: StageId, target: StageId) -> bool {
    fn go(c: &Checked<'_>, at: StageId, target: StageId, depth: usize) -> bool {
        if at == target {
            return true;
        }
        if depth > c.stages.len() {
            return false; // a cycle, reported on its own
        }
        let info = c.info(at);
        (!info.needs.is_empty()
            && info
                .needs
                .iter()
                .all(|n| !c.info(*n).stage.keys().is_optional() && go(c, *n, target, depth + 1)))
            || info.parent.is_some_and(|p| go(c, p, target, depth + 1))
    }
    go(c, at, target, 0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use petgraph::visit::{Bfs, Reversed};

    use super::*;
    use crate::check::graph::body_graph;

    /// Returns every stage whose output is ready at a site.
    pub(super) fn upstream(c: &Checked<'_>, site: Site) -> BTreeSet<StageId> {
        let mut out = BTreeSet::new();
        let mut cur = match site {
            Site::Stage(s) | Site::Region(s) => s,
            Site::BodyEnd(l) => {
                for child in &c.info(l).children {
                    add_with_body(c, *child, &mut out);
                }
                l
            }
        };
        loop {
            let region = c.info(cur).parent;
            let g = body_graph(c, region);
            if let Some(start) = g.node_indices().find(|n| g[*n] == cur) {
                let rev = Reversed(&g);
                let mut bfs = Bfs::new(rev, start);
                while let Some(n) = bfs.next(rev) {
                    if n != start {
                        add_with_body(c, g[n], &mut out);
                    }
                }
            }
            match region {
                Some(r) => cur = r,
                None => break,
            }
        }
        out
    }

    /// Adds a stage and, for loops and groups, the stages of its body (their latest outputs).
    fn add_with_body(c: &Checked<'_>, id: StageId, out: &mut BTreeSet<StageId>) {
        out.insert(id);
        if matches!(
            c.info(id).stage.kind().value,
            StageKind::Loop | StageKind::Group
        ) {
            for child in &c.info(id).children {
                add_with_body(c, *child, out);
            }
        }
    }

    /// Every workflow of the project that checks without errors: the presets and the valid
    /// fixtures.
    fn workflows() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        for dir in ["workflows", "tests/fixtures/check/valid"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if matches!(p.extension().and_then(|x| x.to_str()), Some("toml" | "kdl")) {
                    out.push(p);
                }
            }
        }
        out.sort();
        out
    }

    /// Loads and checks a workflow as `ralph-flow check` does, and hands the checked
    /// workflow to `f`; `None` when it does not load or has errors.
    fn with_checked<R>(
        fs: &dyn crate::fs::FileSystem,
        path: &Path,
        f: impl FnOnce(&Checked<'_>) -> R,
    ) -> Option<R> {
        let mut sources = crate::source::Sources::new();
        let mut diags = crate::diag::Diagnostics::default();
        let mut loader = crate::load::Loader::new(fs, &mut sources, &mut diags);
        let wf = loader.load(path, None)?;
        let mut found = crate::diag::Diagnostics::default();
        let c = crate::check::check(&wf, &mut loader, &[], false, &mut found)?;
        Some(f(&c))
    }

    /// [`with_checked`] of a workflow's text, which must check.
    fn with_checked_text<R>(text: &str, f: impl FnOnce(&Checked<'_>) -> R) -> R {
        let path = std::env::temp_dir().join("ralph-flow-scope-test.toml");
        let fs = crate::fs::MemFs::new([(path.clone(), text.to_string())]);
        with_checked(&fs, &path, f).expect("the workflow checks")
    }

    /// Checks a workflow held in memory and returns how many stages the searches for
    /// template reads visited.
    fn search_steps(text: &str) -> u64 {
        with_checked_text(text, |c| c.search_steps.get())
    }

    /// A stage reached from a skippable one through two needs (a diamond) may be skipped: the
    /// old walk shared one list of visited stages across needs and said it could not.
    #[test]
    fn a_diamond_after_a_condition_may_be_skipped() {
        let text = "name = \"diamond\"\n\
            [stages.a]\nkind = \"command\"\nargv = [\"true\"]\nwhen = \"params.go\"\n\
            [stages.b]\nkind = \"command\"\nargv = [\"true\"]\nneeds = [\"a\"]\n\
            [stages.c]\nkind = \"command\"\nargv = [\"true\"]\nneeds = [\"a\"]\n\
            [stages.d]\nkind = \"command\"\nargv = [\"true\"]\nneeds = [\"b\", \"c\"]\n\
            [stages.e]\nkind = \"command\"\nargv = [\"true\"]\n\
            [params.go]\ntype = \"bool\"\ndefault = true\n";
        with_checked_text(text, |c| {
            let id = |name: &str| c.find(name).expect("a stage");
            for (name, may) in [
                ("a", true),
                ("b", true),
                ("c", true),
                ("d", true),
                ("e", false),
            ] {
                assert_eq!(c.skippable[id(name).0], may, "skippable `{name}`");
                assert_eq!(c.conditional[id(name).0], may, "conditional `{name}`");
            }
        });
    }

    /// A chain whose stages each read the stage before and the first one, written in order
    /// or in reverse.
    fn chain_of_reads(n: usize, reversed: bool) -> String {
        let mut text = String::from("name = \"reads\"\n");
        let mut order: Vec<usize> = (0..n).collect();
        if reversed {
            order.reverse();
        }
        for i in order {
            text.push_str(&format!("[stages.s{i}]\nkind = \"command\"\n"));
            if i == 0 {
                text.push_str("argv = [\"true\"]\n");
            } else {
                text.push_str(&format!(
                    "argv = [\"echo\", \"{{{{ stages.s{}.output }}}}\", \"{{{{ stages.s0.output }}}}\"]\nneeds = [\"s{}\"]\n",
                    i - 1,
                    i - 1
                ));
            }
        }
        text
    }

    /// The work of checking reads grows with their number, not with the square of the chain
    /// (searching the whole chain back for every read made 2,000 stages take 87 s).
    #[test]
    fn checking_reads_along_a_chain_is_linear() {
        for reversed in [false, true] {
            let small = search_steps(&chain_of_reads(500, reversed));
            let large = search_steps(&chain_of_reads(2000, reversed));
            assert!(small > 0, "nothing was searched");
            assert!(
                large <= 5 * small,
                "reversed: {reversed}; 500 stages: {small} steps, 2,000 stages: {large} steps"
            );
        }
    }

    /// The search that stops where it finds the stage answers as the whole set did, and the
    /// remembered answers of `runs_only_after` as the walk without records, for every site and
    /// every pair of stages of every workflow of the project.
    #[test]
    fn remembered_answers_agree_with_the_plain_ones() {
        let mut compared = 0usize;
        for path in workflows() {
            compared +=
                with_checked(&crate::fs::RealFs, &path, |c| compare_answers(c, &path)).unwrap_or(0);
        }
        assert!(compared > 1000, "only {compared} pairs compared");
    }

    /// Compares, in one checked workflow, the remembered answers with the plain ones and the
    /// search with the whole upstream set; returns how many upstream pairs it compared.
    fn compare_answers(c: &Checked<'_>, path: &Path) -> usize {
        let mut compared = 0;
        let n = c.stages.len();
        for s in (0..n).map(StageId) {
            for t in (0..n).map(StageId) {
                assert_eq!(
                    runs_only_after(c, s, t),
                    plain_after(c, s, t),
                    "{}: does `{}` run only after `{}`?",
                    path.display(),
                    c.info(s).stage.id.value,
                    c.info(t).stage.id.value
                );
            }
            let mut sites = vec![Site::Stage(s), Site::Region(s)];
            if c.info(s).stage.kind().value == StageKind::Loop {
                sites.push(Site::BodyEnd(s));
            }
            for site in sites {
                let set = upstream(c, site);
                for t in (0..n).map(StageId) {
                    assert_eq!(
                        is_upstream(c, site, t),
                        set.contains(&t),
                        "{}: {site:?} and stage `{}`",
                        path.display(),
                        c.info(t).stage.id.value
                    );
                    compared += 1;
                }
            }
        }
        compared
    }
}
