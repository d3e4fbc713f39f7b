//! What ralph-flow serves as the ACP client: permission requests decided by the call's
//! policy, and files read and written through the client, confined to the workspace (and,
//! for reading, the directories the template helpers read).

use std::path::{Path, PathBuf};

use agent_client_protocol_schema::v1::{
    PermissionOption, PermissionOptionKind, ReadTextFileRequest, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome, ToolKind,
    WriteTextFileRequest,
};
use serde_json::Value;

use super::rpc::code;
use crate::backend::Activity;
use crate::permit::{Action, Decision, Rules};

/// The most bytes a `fs/read_text_file` answer holds (a huge file or a device cannot fill
/// the pipe or the memory); the rest is left out with a note.
const MAX_READ: u64 = 4 << 20;

/// What the client knows of a tool call from the agent's updates, for the permission
/// request that names it by id alone (or with part of its fields).
#[derive(Clone, Debug, Default)]
pub(super) struct ToolSeen {
    pub(super) title: String,
    pub(super) kind: Option<ToolKind>,
    pub(super) raw_input: Option<Value>,
    pub(super) paths: Vec<PathBuf>,
    /// Its last status reported (`pending`, `in_progress`, ...), `""` before any.
    pub(super) status: String,
}

/// The answer to a permission request and what to report of it.
pub(super) struct Answer {
    /// The JSON-RPC result.
    pub(super) result: Value,
    /// What was asked, for people.
    pub(super) asked: String,
    pub(super) decision: Decision,
}

/// Decides a `session/request_permission` by the policy, `workspace` being the call's
/// working directory (canonical). `seen` is what earlier updates said of the tool call.
/// After a cancel, every request is answered `cancelled`.
pub(super) fn permission(
    req: &RequestPermissionRequest,
    seen: Option<&ToolSeen>,
    policy: &Rules,
    workspace: &Path,
) -> Answer {
    let (action, asked) = action(req, seen);
    let decision = policy.decide(&action, workspace);
    let wanted: &[PermissionOptionKind] = if decision.allowed {
        &[
            PermissionOptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways,
        ]
    } else {
        &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ]
    };
    let outcome = pick(&req.options, wanted).map_or(RequestPermissionOutcome::Cancelled, |o| {
        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(o.option_id.clone()))
    });
    Answer {
        result: to_value(&RequestPermissionResponse::new(outcome)),
        asked,
        decision,
    }
}

/// The answer to a permission request once the turn is being cancelled.
pub(super) fn cancelled() -> Value {
    to_value(&RequestPermissionResponse::new(
        RequestPermissionOutcome::Cancelled,
    ))
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The first offered option of the first kind wanted that is offered.
fn pick<'a>(
    options: &'a [PermissionOption],
    wanted: &[PermissionOptionKind],
) -> Option<&'a PermissionOption> {
    wanted
        .iter()
        .find_map(|k| options.iter().find(|o| o.kind == *k))
}

/// The action a permission request asks for, and what it asks, for people.
pub(super) fn action(req: &RequestPermissionRequest, seen: Option<&ToolSeen>) -> (Action, String) {
    let fields = &req.tool_call.fields;
    let title = fields
        .title
        .clone()
        .filter(|t| !t.is_empty())
        .or_else(|| seen.map(|s| s.title.clone()).filter(|t| !t.is_empty()))
        .unwrap_or_else(|| req.tool_call.tool_call_id.to_string());
    let kind = fields
        .kind
        .or_else(|| seen.and_then(|s| s.kind))
        .unwrap_or(ToolKind::Other);
    let raw = fields
        .raw_input
        .as_ref()
        .filter(|r| r.as_object().is_some_and(|m| !m.is_empty()))
        .or_else(|| seen.and_then(|s| s.raw_input.as_ref()));
    match kind {
        ToolKind::Edit | ToolKind::Delete | ToolKind::Move => {
            let mut paths: Vec<PathBuf> = fields
                .locations
                .iter()
                .flatten()
                .map(|l| l.path.clone())
                .collect();
            if paths.is_empty() {
                paths = raw.map(input_paths).unwrap_or_default();
            }
            if paths.is_empty() {
                paths = seen.map(|s| s.paths.clone()).unwrap_or_default();
            }
            (Action::Edit(paths), title)
        }
        ToolKind::Execute => {
            let command = raw.and_then(command_of).unwrap_or_else(|| title.clone());
            (Action::Execute(command.clone()), command)
        }
        ToolKind::Fetch => {
            let what = raw
                .and_then(|r| {
                    ["url", "query", "prompt"]
                        .iter()
                        .find_map(|k| r.get(*k)?.as_str())
                })
                .map_or_else(|| title.clone(), str::to_string);
            (Action::Fetch(what), title)
        }
        ToolKind::Read | ToolKind::Search | ToolKind::Think => (Action::Read, title),
        _ => (Action::Other(title.clone()), title),
    }
}

/// The command line of an `execute` tool call's input: `command` as a string, or an argv.
fn command_of(raw: &Value) -> Option<String> {
    match raw.get("command")? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Array(words) => {
            let words: Vec<&str> = words.iter().filter_map(Value::as_str).collect();
            (!words.is_empty())
                .then(|| shlex::try_join(words.iter().copied()).unwrap_or_else(|_| words.join(" ")))
        }
        _ => None,
    }
}

/// The files a tool call's input names, under the keys the agents use (claude and qwen
/// `file_path`, opencode `filePath`, moves' `source`/`destination`...).
pub(super) fn input_paths(raw: &Value) -> Vec<PathBuf> {
    const KEYS: &[&str] = &[
        "file_path",
        "filePath",
        "path",
        "abs_path",
        "absolute_path",
        "notebook_path",
        "source",
        "destination",
        "old_path",
        "new_path",
    ];
    KEYS.iter()
        .filter_map(|k| raw.get(*k)?.as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// Where the client serves files from: the workspace (read and write) and the other
/// directories it reads (canonical).
pub(super) struct Files<'a> {
    pub(super) workspace: &'a Path,
    pub(super) roots: &'a [PathBuf],
}

/// A `fs/read_text_file` answer: the text, from `line` (1-based) for `limit` lines.
pub(super) fn read(files: &Files<'_>, req: &ReadTextFileRequest) -> Result<Value, (i64, String)> {
    let path = absolute(&req.path, files.workspace);
    let real = match path.canonicalize() {
        Ok(r) => r,
        // A file that does not exist (yet) where the agent may read reads as empty: gemini
        // reads a file before it writes it, and fails the write on any error answer.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let inside = std::iter::once(files.workspace)
                .chain(files.roots.iter().map(PathBuf::as_path))
                .any(|root| crate::permit::confined(&path, root).is_some());
            return if inside {
                Ok(serde_json::json!({ "content": "" }))
            } else {
                Err((
                    code::NOT_FOUND,
                    format!("Resource not found: {} does not exist", path.display()),
                ))
            };
        }
        Err(e) => {
            return Err((
                code::INTERNAL,
                format!("cannot read {}: {e}", path.display()),
            ));
        }
    };
    if !(real.starts_with(files.workspace) || files.roots.iter().any(|r| real.starts_with(r))) {
        return Err((
            code::INTERNAL,
            format!(
                "ralph-flow serves files only inside the workspace {} and the workflow's \
                 `file_roots`: {} is outside them",
                files.workspace.display(),
                real.display()
            ),
        ));
    }
    let text = read_bounded(&real).map_err(|e| {
        (
            code::INTERNAL,
            format!("cannot read {}: {e}", real.display()),
        )
    })?;
    let text = lines(&text, req.line, req.limit);
    Ok(serde_json::json!({ "content": text }))
}

fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_READ)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The lines of a text from `line` (1-based), at most `limit` of them.
fn lines(text: &str, line: Option<u32>, limit: Option<u32>) -> String {
    if line.is_none() && limit.is_none() {
        return text.to_string();
    }
    let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

/// A path the agent sent: absolute as the protocol asks, else taken from the workspace.
fn absolute(path: &Path, workspace: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        workspace.join(path)
    }
}

/// What a `fs/write_text_file` did: the decision, and the file written (relative to the
/// workspace) when it was.
pub(super) struct Written {
    pub(super) result: Result<Value, (i64, String)>,
    pub(super) decision: Decision,
    pub(super) path: String,
}

/// Serves a `fs/write_text_file`: only inside the workspace (never in its `.git`), and only
/// when the policy allows the edit.
pub(super) fn write(files: &Files<'_>, req: &WriteTextFileRequest, policy: &Rules) -> Written {
    let path = absolute(&req.path, files.workspace);
    let shown = path.display().to_string();
    let refused = |rule: String| Decision {
        allowed: false,
        rule,
        policy: policy.name.clone(),
    };
    let Some(inside) = crate::permit::confined(&path, files.workspace) else {
        let decision = refused(format!(
            "{shown} is outside the workspace; ralph-flow writes files only inside it"
        ));
        return Written {
            result: Err((code::INTERNAL, decision.to_string())),
            decision,
            path: shown,
        };
    };
    let rel = inside.display().to_string();
    if inside.components().next() == Some(std::path::Component::Normal(".git".as_ref())) {
        let decision = refused(format!(
            "{rel} is in the repository's .git; only git commands may change it"
        ));
        return Written {
            result: Err((code::INTERNAL, decision.to_string())),
            decision,
            path: rel,
        };
    }
    let decision = policy.decide(&Action::Edit(vec![path.clone()]), files.workspace);
    if !decision.allowed {
        return Written {
            result: Err((code::INTERNAL, decision.to_string())),
            decision,
            path: rel,
        };
    }
    let target = files.workspace.join(&inside);
    let done = target
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&target, &req.content));
    Written {
        result: done
            .map(|()| Value::Null)
            .map_err(|e| (code::INTERNAL, format!("cannot write {rel}: {e}"))),
        decision,
        path: rel,
    }
}

/// The activity of a permission decision.
pub(super) fn reported(asked: String, decision: Decision) -> Activity {
    Activity::Permission { asked, decision }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(v: Value) -> RequestPermissionRequest {
        serde_json::from_value(v).expect("a permission request")
    }

    /// claude-agent-acp 0.101.0's request for `git push` (captures/acp/claude/edit_commit_push).
    fn claude_push() -> RequestPermissionRequest {
        request(
            json!({"sessionId": "s", "toolCall": {"toolCallId": "toolu_2", "name": "Bash", "status": "pending", "rawInput": {"command": "git push origin HEAD", "description": "git push origin HEAD"}, "title": "git push origin HEAD", "kind": "execute", "content": []}, "options": [{"optionId": "allow-once", "name": "Yes", "kind": "allow_once"}, {"optionId": "allow-with-updates", "name": "Yes, and don't ask again", "kind": "allow_always"}, {"optionId": "reject", "name": "No", "kind": "reject_once"}]}),
        )
    }

    #[test]
    fn a_push_is_rejected_by_the_commit_level_with_its_rule() {
        let policy = Rules::level("commit").expect("a level");
        let a = permission(&claude_push(), None, &policy, Path::new("/w"));
        assert_eq!(
            a.result,
            json!({"outcome": {"outcome": "selected", "optionId": "reject"}})
        );
        assert!(!a.decision.allowed);
        assert_eq!(a.asked, "git push origin HEAD");
        assert_eq!(
            a.decision.to_string(),
            "denied by policy `commit`: deny `git push *` (git push origin HEAD)"
        );
    }

    #[test]
    fn a_commit_is_allowed_once() {
        let mut req = claude_push();
        req.tool_call.fields.raw_input =
            Some(json!({"command": "git add -A && git commit -q -m 'add notes'"}));
        let policy = Rules::level("commit").expect("a level");
        let a = permission(&req, None, &policy, Path::new("/w"));
        assert_eq!(
            a.result,
            json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}})
        );
        assert!(a.decision.allowed, "{}", a.decision);
    }

    #[test]
    fn gemini_names_its_command_in_the_title_only() {
        // gemini 0.x's request: no rawInput, the command as the title.
        let req = request(
            json!({"sessionId": "s", "options": [{"optionId": "proceed_always", "name": "Allow for this session", "kind": "allow_always"}, {"optionId": "cancel", "name": "Reject", "kind": "reject_once"}], "toolCall": {"toolCallId": "run_shell_command_1", "status": "pending", "title": "git push origin HEAD", "content": [], "locations": [], "kind": "execute"}}),
        );
        let (action, asked) = action(&req, None);
        assert_eq!(action, Action::Execute("git push origin HEAD".into()));
        assert_eq!(asked, "git push origin HEAD");
        // Allowed, it takes the `allow_always` offered when there is no `allow_once`.
        let a = permission(
            &req,
            None,
            &Rules::level("full").expect("a level"),
            Path::new("/w"),
        );
        assert_eq!(
            a.result,
            json!({"outcome": {"outcome": "selected", "optionId": "proceed_always"}})
        );
    }

    #[test]
    fn no_fitting_option_is_a_cancel() {
        let req = request(
            json!({"sessionId": "s", "options": [{"optionId": "yes", "name": "Yes", "kind": "allow_once"}], "toolCall": {"toolCallId": "t", "title": "rm -rf /", "kind": "execute"}}),
        );
        let a = permission(&req, None, &Rules::default(), Path::new("/w"));
        assert_eq!(a.result, json!({"outcome": {"outcome": "cancelled"}}));
        assert_eq!(cancelled(), json!({"outcome": {"outcome": "cancelled"}}));
    }

    #[test]
    fn edits_name_their_files_from_the_locations_the_input_or_earlier_updates() {
        let req = request(
            json!({"sessionId": "s", "options": [], "toolCall": {"toolCallId": "t", "title": "Write notes.txt", "kind": "edit", "locations": [{"path": "/w/notes.txt"}]}}),
        );
        assert_eq!(
            action(&req, None).0,
            Action::Edit(vec!["/w/notes.txt".into()])
        );
        let req = request(
            json!({"sessionId": "s", "options": [], "toolCall": {"toolCallId": "t", "kind": "edit", "rawInput": {"filePath": "/w/a.rs"}}}),
        );
        assert_eq!(action(&req, None).0, Action::Edit(vec!["/w/a.rs".into()]));
        let req =
            request(json!({"sessionId": "s", "options": [], "toolCall": {"toolCallId": "t"}}));
        let seen = ToolSeen {
            title: "Move a to b".into(),
            kind: Some(ToolKind::Move),
            raw_input: Some(json!({"source": "/w/a", "destination": "/w/b"})),
            paths: Vec::new(),
            status: String::new(),
        };
        let (a, asked) = action(&req, Some(&seen));
        assert_eq!(a, Action::Edit(vec!["/w/a".into(), "/w/b".into()]));
        assert_eq!(asked, "Move a to b");
        let req = request(
            json!({"sessionId": "s", "options": [], "toolCall": {"toolCallId": "t", "title": "Search the web", "kind": "fetch", "rawInput": {"url": "https://example.com"}}}),
        );
        assert_eq!(
            action(&req, None).0,
            Action::Fetch("https://example.com".into())
        );
        let req = request(
            json!({"sessionId": "s", "options": [], "toolCall": {"toolCallId": "t", "title": "Exit plan mode", "kind": "switch_mode"}}),
        );
        assert_eq!(action(&req, None).0, Action::Other("Exit plan mode".into()));
    }

    fn files_in(dir: &Path) -> (PathBuf, PathBuf) {
        let ws = dir.join("ws");
        let other = dir.join("other");
        std::fs::create_dir_all(ws.join(".git")).expect("ws");
        std::fs::create_dir_all(&other).expect("other");
        (
            ws.canonicalize().expect("ws"),
            other.canonicalize().expect("other"),
        )
    }

    #[test]
    fn reads_are_confined_and_honour_line_and_limit() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (ws, other) = files_in(tmp.path());
        std::fs::write(ws.join("a.txt"), "one\ntwo\nthree\n").expect("a");
        std::fs::write(other.join("secret"), "s").expect("secret");
        let files = Files {
            workspace: &ws,
            roots: &[],
        };
        let mut req = ReadTextFileRequest::new("s", ws.join("a.txt"));
        assert_eq!(
            read(&files, &req),
            Ok(json!({"content": "one\ntwo\nthree\n"}))
        );
        req.line = Some(2);
        req.limit = Some(1);
        assert_eq!(read(&files, &req), Ok(json!({"content": "two\n"})));
        let out = read(&files, &ReadTextFileRequest::new("s", other.join("secret")));
        let (code, message) = out.expect_err("outside");
        assert_eq!(code, code::INTERNAL);
        assert!(message.contains("is outside them"), "{message}");
        let through = ws.join("link");
        std::os::unix::fs::symlink(other.join("secret"), &through).expect("link");
        assert!(read(&files, &ReadTextFileRequest::new("s", through)).is_err());
        let roots = [other.clone()];
        let files = Files {
            workspace: &ws,
            roots: &roots,
        };
        assert_eq!(
            read(&files, &ReadTextFileRequest::new("s", other.join("secret"))),
            Ok(json!({"content": "s"}))
        );
        // A missing file reads as empty where the agent may read (gemini reads before it
        // writes), and is not found elsewhere.
        assert_eq!(
            read(&files, &ReadTextFileRequest::new("s", ws.join("new/nope"))),
            Ok(json!({"content": ""}))
        );
        let (code, _) = read(
            &files,
            &ReadTextFileRequest::new("s", tmp.path().join("nope")),
        )
        .expect_err("missing");
        assert_eq!(code, code::NOT_FOUND);
    }

    #[test]
    fn writes_are_confined_decided_and_done() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (ws, other) = files_in(tmp.path());
        let files = Files {
            workspace: &ws,
            roots: &[],
        };
        let edit = Rules::level("edit").expect("edit");
        let w = write(
            &files,
            &WriteTextFileRequest::new("s", ws.join("src/new.txt"), "hi"),
            &edit,
        );
        assert_eq!(w.result, Ok(Value::Null));
        assert_eq!(w.path, "src/new.txt");
        assert_eq!(
            std::fs::read_to_string(ws.join("src/new.txt"))
                .ok()
                .as_deref(),
            Some("hi")
        );
        // Outside, even under `full`.
        let full = Rules::level("full").expect("full");
        let w = write(
            &files,
            &WriteTextFileRequest::new("s", other.join("x"), "no"),
            &full,
        );
        assert!(!w.decision.allowed);
        assert!(
            w.decision.rule.contains("outside the workspace"),
            "{}",
            w.decision.rule
        );
        assert!(!other.join("x").exists());
        let w = write(
            &files,
            &WriteTextFileRequest::new("s", ws.join("../other/y"), "no"),
            &full,
        );
        assert!(w.result.is_err());
        assert!(!other.join("y").exists());
        let w = write(
            &files,
            &WriteTextFileRequest::new("s", ws.join(".git/config"), "no"),
            &full,
        );
        assert!(w.decision.rule.contains(".git"), "{}", w.decision.rule);
        // Read-only: refused by the policy, with its rule.
        let w = write(
            &files,
            &WriteTextFileRequest::new("s", ws.join("b.txt"), "no"),
            &Rules::default(),
        );
        assert_eq!(
            w.result.as_ref().err().map(|e| e.1.as_str()),
            Some(
                "denied by policy `read-only`: `edit` is not allowed (writing ".to_string()
                    + &ws.join("b.txt").display().to_string()
                    + ")"
            )
            .as_deref()
        );
        assert!(!ws.join("b.txt").exists());
    }
}
