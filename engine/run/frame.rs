//! The executor's state types: frames (one execution of a body), what templates see of a
//! settled stage, how a node settles and how a body ends.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

use minijinja::Value;
use serde_json::Value as Json;
use tokio::sync::Semaphore;

use crate::backend::Usage;
use crate::compile::NodeId;
use crate::compile::Target;
use crate::store::NodeState;

/// A frame: one execution of a body (the top level, a loop iteration, a for_each item, a
/// group), with what its templates see.
#[derive(Default)]
pub(crate) struct Frame<'a> {
    pub parent: Option<&'a Frame<'a>>,
    pub region: Option<NodeId>,
    /// Where in the run (`""`, `attempts#2`, `tickets#T-1/attempts#1`).
    pub scope: String,
    pub cwd: PathBuf,
    /// Variables this frame adds (loop variables, the item).
    pub vars: Vec<(String, Value)>,
    /// For a loop iteration: the loop's name and its variables (for `loops.ID`).
    pub loop_vars: Option<(String, Value)>,
    /// For a loop iteration: what templates see of earlier iterations, by stage
    /// (`stages.ID.last`, `stages.ID.history`), built once per iteration.
    pub earlier: Arc<HashMap<String, Value>>,
    /// For a loop iteration: the key under which the loop's usage is summed, and its budget.
    pub usage_key: Option<(String, NodeId)>,
    /// What ran in this frame (and the latest outputs of loops and groups inside it).
    /// Shared with the template contexts made in this frame, which read it when a template
    /// asks for a stage (see [`super::context`]).
    pub outputs: Arc<Outputs>,
    /// A group's concurrency limit.
    pub limit: Option<Rc<Semaphore>>,
    /// For a for_each item: the items of the same fan-out that have settled so far
    /// (`stages.FOR_EACH.settled`), shared by every item.
    pub siblings: Option<Arc<Mutex<Vec<Value>>>>,
}

impl Frame<'_> {
    pub(super) fn chain(&self) -> Vec<&Frame<'_>> {
        let mut out = vec![self];
        let mut cur = self.parent;
        while let Some(f) = cur {
            out.push(f);
            cur = f.parent;
        }
        out.reverse();
        out
    }

    pub(super) fn child_scope(&self, part: &str) -> String {
        if self.scope.is_empty() {
            part.to_string()
        } else {
            format!("{}/{part}", self.scope)
        }
    }
}

/// An output longer than this, as compact JSON text, is not kept in its stage's view once
/// its commit is done: the view reads it back from the store when asked for.
pub(crate) const KEEP_BYTES: usize = 1024;

/// What templates see of a settled stage. Kept small (48 bytes): a run holds one for each
/// stage that settled in a frame that is still running (the top level's: every stage).
#[derive(Clone, Debug)]
pub(crate) struct View {
    output: Kept,
    pub feedback: Option<Box<str>>,
    /// `None` for a usage of nothing ([`Usage::is_empty`]: most stages, whose usage is in
    /// their attempts' or that call no agent), which then takes no room.
    usage: Option<Box<Usage>>,
    attempts: u32,
    pub state: NodeState,
}

/// A view's output.
#[derive(Clone, Debug)]
enum Kept {
    /// As compact JSON text, read back when asked for ([`View::output`]): a
    /// `serde_json::Value` tree costs several allocations a node (about 300 bytes for
    /// `{"text": "ok"}`), and most outputs are never read again by the run that made them.
    Text(Box<str>),
    /// A long output whose commit is done, read from the store when asked for: a run of
    /// thousands of stages with long outputs would otherwise hold every one of them.
    Stored(Arc<StoredAt>),
}

/// Where the store keeps a long output: its node's key in the run.
#[derive(Debug)]
struct StoredAt {
    scope: Box<str>,
    node: Box<str>,
    reader: Arc<super::memory::OutputReader>,
}

impl View {
    pub(super) fn new(
        output: &Json,
        state: NodeState,
        feedback: Option<&str>,
        attempts: u32,
        usage: Usage,
    ) -> View {
        View {
            output: Kept::Text(
                serde_json::to_string(output)
                    .unwrap_or_else(|_| String::from("null"))
                    .into_boxed_str(),
            ),
            state,
            feedback: feedback.map(Into::into),
            attempts,
            usage: (!usage.is_empty()).then(|| Box::new(usage)),
        }
    }

    /// Tells whether the output is long enough to be left to the store once committed.
    pub(super) fn is_long(&self) -> bool {
        matches!(&self.output, Kept::Text(t) if t.len() > KEEP_BYTES)
    }

    /// Leaves a long output to the store, where its node (`scope`, `node`) is committed: the
    /// view drops its text and reads it back when asked for.
    pub(super) fn leave_to_store(
        &mut self,
        scope: &str,
        node: &str,
        reader: &Arc<super::memory::OutputReader>,
    ) {
        if self.is_long() {
            self.output = Kept::Stored(Arc::new(StoredAt {
                scope: scope.into(),
                node: node.into(),
                reader: reader.clone(),
            }));
        }
    }

    /// The output. One the store keeps is read back; if that read fails, this is `null`
    /// and the failure is kept by the reader: the run stops at its next commit, and nothing
    /// decided since is committed (see `Shared::flush`).
    pub(super) fn output(&self) -> Json {
        match &self.output {
            Kept::Text(t) => serde_json::from_str(t).unwrap_or(Json::Null),
            Kept::Stored(at) => at.reader.read(&at.scope, &at.node),
        }
    }

    /// The output, or the failure to read it back from the store.
    pub(super) fn try_output(&self) -> Result<Json, crate::store::StoreError> {
        match &self.output {
            Kept::Text(t) => Ok(serde_json::from_str(t).unwrap_or(Json::Null)),
            Kept::Stored(at) => at.reader.try_read(&at.scope, &at.node),
        }
    }

    /// `stages.ID` as templates see it: `output`, `status`, `ran`, `feedback`, `attempts`,
    /// `usage`. Made each time a template asks (most stages' views are never asked for).
    pub(super) fn value(&self) -> Value {
        let mut e: BTreeMap<&'static str, Value> = BTreeMap::new();
        e.insert("output", super::context::to_value(&self.output()));
        e.insert("status", Value::from(self.state.as_str()));
        e.insert("ran", Value::from(self.state != NodeState::Skipped));
        e.insert(
            "feedback",
            self.feedback
                .as_deref()
                .map(Value::from)
                .unwrap_or_default(),
        );
        e.insert("attempts", Value::from(self.attempts));
        e.insert(
            "usage",
            super::context::to_value(self.usage.as_deref().unwrap_or(&Usage::default())),
        );
        Value::from(e)
    }
}

/// A node settled by an earlier executor of the run, as a resume keeps it until the node
/// settles again from it: the output as compact JSON text, read back when asked for.
#[derive(Debug)]
pub(crate) struct Resumed {
    output: Box<str>,
    pub action: Option<Box<str>>,
    pub feedback: Option<Box<str>>,
    pub usage: Usage,
    pub started_at: i64,
    pub attempts: u32,
    pub state: NodeState,
}

impl Resumed {
    pub(super) fn new(rec: crate::store::NodeRecord) -> Resumed {
        Resumed {
            output: serde_json::to_string(&rec.output)
                .unwrap_or_else(|_| String::from("null"))
                .into_boxed_str(),
            action: rec.action.map(Into::into),
            feedback: rec.feedback.map(Into::into),
            usage: rec.usage,
            started_at: rec.started_at,
            attempts: rec.attempts,
            state: rec.state,
        }
    }

    /// The output.
    pub(super) fn output(&self) -> Json {
        serde_json::from_str(&self.output).unwrap_or(Json::Null)
    }
}

/// The outputs of a frame by stage id. The executor is single-threaded; the lock is there
/// because template values must be `Send + Sync`, and it is never contended.
#[derive(Debug, Default)]
pub(crate) struct Outputs(Mutex<BTreeMap<String, View>>);

impl Outputs {
    pub(super) fn new(map: BTreeMap<String, View>) -> Arc<Outputs> {
        Arc::new(Outputs(Mutex::new(map)))
    }

    /// The map, to read or change (the lock is never contended: one thread).
    pub(super) fn borrow(&self) -> MutexGuard<'_, BTreeMap<String, View>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The outputs of the stages that ran (not skipped), by id: what a run or a subflow
    /// gives back.
    pub(super) fn ran(&self) -> serde_json::Map<String, Json> {
        self.borrow()
            .iter()
            .filter(|(_, v)| v.state != NodeState::Skipped)
            .map(|(k, v)| (k.clone(), v.output()))
            .collect()
    }

    /// Takes the map, leaving it empty.
    pub(super) fn take(&self) -> BTreeMap<String, View> {
        std::mem::take(&mut *self.borrow())
    }
}

/// How a node settled, or why it did not.
#[derive(Debug)]
pub(crate) enum Outcome {
    Settled(Settled),
    /// A gate waits for an answer (and the run does not keep polling).
    Waiting,
    /// The run is stopping (Ctrl-C, an exit elsewhere).
    Stopped,
}

#[derive(Debug)]
pub(crate) struct Settled {
    pub state: NodeState,
    pub output: Json,
    pub action: Option<Target>,
    pub feedback: Option<String>,
    /// Why it failed, for the run's message.
    pub message: Option<String>,
    pub attempts: u32,
    pub usage: Usage,
    pub started_at: i64,
    /// It came from the store (a resume); it is not written again.
    pub resumed: bool,
    /// It failed for reasons outside the work (an agent that could not be reached, a
    /// timeout, a program that could not start): its `on_error` is taken, and its message
    /// is never handed to an agent as feedback.
    pub infra: bool,
}

impl Settled {
    pub(super) fn new(state: NodeState, output: Json, started_at: i64) -> Self {
        Settled {
            state,
            output,
            action: None,
            feedback: None,
            message: None,
            attempts: 0,
            usage: Usage::default(),
            started_at,
            resumed: false,
            infra: false,
        }
    }

    /// A failure for reasons outside the work: no feedback, the given action.
    pub(super) fn error(
        state: NodeState,
        message: String,
        action: Target,
        started_at: i64,
    ) -> Self {
        let mut s = Settled::new(state, Json::Null, started_at);
        s.message = Some(message);
        s.action = Some(action);
        s.infra = true;
        s
    }

    /// A stage that produced its output.
    pub(super) fn done(output: Json, started_at: i64) -> Self {
        Settled::new(NodeState::Done, output, started_at)
    }

    /// A failure that is a verdict on the work: its message is also the feedback the next
    /// iteration gets, and `action` follows.
    pub(super) fn failed(output: Json, message: String, action: Target, started_at: i64) -> Self {
        Settled::new(NodeState::Failed, output, started_at)
            .with_verdict(message)
            .with_action(action)
    }

    /// Takes an action.
    pub(super) fn with_action(mut self, action: Target) -> Self {
        self.action = Some(action);
        self
    }

    /// Says why, as the message and as the feedback.
    pub(super) fn with_verdict(mut self, message: String) -> Self {
        self.feedback = Some(message.clone());
        self.message = Some(message);
        self
    }

    /// Gives the next iteration this feedback.
    pub(super) fn with_feedback(mut self, feedback: Option<String>) -> Self {
        self.feedback = feedback;
        self
    }

    /// Counts the attempts and the usage.
    pub(super) fn spent(mut self, attempts: u32, usage: Usage) -> Self {
        self.attempts = attempts;
        self.usage = usage;
        self
    }
}

/// How a body ended.
#[derive(Debug)]
pub(crate) enum BodyEnd {
    Completed,
    Continue(Option<String>),
    Break,
    Exit(usize),
    Failed {
        node: String,
        message: String,
        feedback: Option<String>,
        /// The failure's cause lies outside the work (see [`Settled::infra`]).
        infra: bool,
    },
    Waiting,
    Stopped,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run holds a view for every settled stage of its running frames: 10,000 of them in
    /// a long chain. (The usage, 48 bytes, is boxed, and left out when there is none.)
    #[test]
    fn a_view_stays_small() {
        assert!(
            std::mem::size_of::<View>() <= 48,
            "{}",
            std::mem::size_of::<View>()
        );
    }

    #[test]
    fn a_views_usage_takes_room_only_when_there_is_one() {
        let view = |usage: Usage| View::new(&Json::Null, NodeState::Done, None, 1, usage);
        let input = |v: &View| {
            v.value()
                .get_attr("usage")
                .and_then(|u| u.get_attr("input_tokens"))
                .expect("usage.input_tokens")
        };
        let used = view(Usage {
            input_tokens: 3,
            ..Usage::default()
        });
        assert!(used.usage.is_some());
        assert_eq!(input(&used), Value::from(3));
        let unknown = view(Usage::unreported_call());
        assert_eq!(unknown.usage.as_deref(), Some(&Usage::unreported_call()));
        let none = view(Usage::default());
        assert!(none.usage.is_none());
        assert_eq!(
            input(&none),
            Value::from(0),
            "templates see a usage of nothing"
        );
    }

    #[test]
    fn only_long_outputs_are_left_to_the_store() {
        // Never opened: leaving an output to the store reads nothing.
        let dir = tempfile::tempdir().expect("tempdir");
        let reader = Arc::new(crate::run::memory::OutputReader::new(
            Arc::new(Mutex::new(crate::run::memory::MemoryStore::later(
                crate::store::Location::StateDir(dir.path().to_path_buf()),
            ))),
            "r".into(),
        ));
        let view = |text: String| {
            View::new(
                &serde_json::json!({ "text": text }),
                NodeState::Done,
                None,
                1,
                Usage::default(),
            )
        };
        let mut short = view("ok".into());
        short.leave_to_store("", "short", &reader);
        assert!(matches!(short.output, Kept::Text(_)));
        assert_eq!(short.output(), serde_json::json!({"text": "ok"}));
        let mut long = view("x".repeat(KEEP_BYTES));
        assert!(long.is_long());
        long.leave_to_store("", "long", &reader);
        assert!(matches!(long.output, Kept::Stored(_)));
        assert!(!long.is_long());
        assert_eq!(reader.reads(), 0);
    }
}
