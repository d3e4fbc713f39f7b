//! `ralph-flow lsp`: the checker, live in the editor. A language server over stdio for
//! workflow files (TOML and KDL), the files they extend and include, and the prompt templates
//! and schemas they name.
//!
//! The core is synchronous, as rust-analyzer's `lsp-server` is built to be: one thread reads
//! messages, handles each at once, and before it answers a request (or once no message
//! waits) it re-checks the workflows an edit touched and publishes what changed. A check of
//! a shipped preset takes a few milliseconds (BENCHMARKS.md), so nothing runs in the
//! background and no answer is ever computed from a text older than the request.
//!
//! Files: `lines.rs` turns offsets into positions; `docs.rs` holds the open documents and the
//! file system the checker reads through them; `analysis.rs` loads and checks one workflow;
//! `publish.rs` turns its diagnostics into the protocol's. The features are one file each:
//! `completion.rs` (with `cursor.rs`, which reads from the text alone where a cursor stands:
//! table or node, key or value, template or expression), `hover.rs`, `navigate.rs`
//! (definition, references, rename, over the index of names in `refs.rs`),
//! `actions.rs` (code actions) and `symbols.rs` (the outline).

mod actions;
mod analysis;
mod completion;
mod cursor;
mod docs;
mod hover;
mod lines;
mod navigate;
mod publish;
mod refs;
mod symbols;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::Notification as _;
use lsp_types::request::Request as _;
use lsp_types::{Position, Range, Uri};
use serde_json::Value;

use analysis::Analysis;
use docs::{Doc, Docs, path_uri, uri_path};
use lines::{Encoding, LineIndex};

/// Serves the protocol over stdin and stdout until the client says `exit`; the process's
/// exit code.
pub fn run_stdio() -> i32 {
    let (connection, threads) = Connection::stdio();
    let served = serve(&connection);
    drop(connection);
    // The reader's error, if any, is what went wrong first (a message that is no LSP).
    let read = threads.join();
    match (served, read) {
        (Ok(()), _) => 0,
        (Err(_), Err(e)) => {
            eprintln!(
                "ralph-flow lsp: what the client sent is not a Language Server Protocol message ({e}); an editor starts `ralph-flow lsp` and speaks LSP to it (see README, Language server)"
            );
            1
        }
        (Err(e), Ok(())) => {
            eprintln!(
                "ralph-flow lsp: {e}; an editor starts `ralph-flow lsp` and speaks LSP over its stdin and stdout (see README, Language server)"
            );
            1
        }
    }
}

/// Serves one client over a connection: the handshake, then every message until `exit` (or
/// until the client goes away).
pub fn serve(connection: &Connection) -> Result<(), String> {
    let (id, params) = connection.initialize_start().map_err(|e| {
        if e.channel_is_disconnected() {
            "the client closed the connection before it sent `initialize`".to_string()
        } else {
            format!("the client did not start the protocol: {e}")
        }
    })?;
    let init: lsp_types::InitializeParams = serde_json::from_value(params).unwrap_or_default();
    let encoding = choose_encoding(&init);
    let result = serde_json::json!({
        "capabilities": capabilities(encoding),
        "serverInfo": {"name": "ralph-flow", "version": env!("CARGO_PKG_VERSION")},
    });
    connection
        .initialize_finish(id, result)
        .map_err(|e| format!("the client did not finish the handshake: {e}"))?;
    let mut server = Server {
        sender: connection.sender.clone(),
        world: World {
            docs: Docs::default(),
            analyses: HashMap::new(),
            last_good: HashMap::new(),
            encoding,
            workspace: workspace_roots(&init),
        },
        dirty: HashSet::new(),
        searched: HashSet::new(),
        parse_cache: crate::load::ParseCache::default(),
        published: HashMap::new(),
        shutting_down: false,
    };
    loop {
        let Ok(msg) = connection.receiver.recv() else {
            return Ok(());
        };
        if server.handle(msg) {
            return Ok(());
        }
        // Edits come in bursts: take every message that already waits before checking again.
        while let Ok(msg) = connection.receiver.try_recv() {
            if server.handle(msg) {
                return Ok(());
            }
        }
        // A panic while checking (a bug in the checker) is reported, not the end of the
        // server: the next edit checks again.
        if let Err(panic) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.refresh()))
        {
            server.log_panic("checking the workflows", &panic);
        }
    }
}

/// UTF-8 when the client offers it (no conversion), else the protocol's UTF-16.
fn choose_encoding(init: &lsp_types::InitializeParams) -> Encoding {
    let offered = init
        .capabilities
        .general
        .as_ref()
        .and_then(|g| g.position_encodings.as_ref());
    match offered {
        Some(list) if list.iter().any(|e| e.as_str() == "utf-8") => Encoding::Utf8,
        _ => Encoding::Utf16,
    }
}

fn workspace_roots(init: &lsp_types::InitializeParams) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = init
        .workspace_folders
        .iter()
        .flatten()
        .filter_map(|f| uri_path(&f.uri))
        .collect();
    #[allow(deprecated)]
    if let Some(root) = init.root_uri.as_ref().and_then(uri_path) {
        if !out.contains(&root) {
            out.push(root);
        }
    }
    out
}

fn capabilities(encoding: Encoding) -> Value {
    serde_json::json!({
        "positionEncoding": match encoding { Encoding::Utf8 => "utf-8", Encoding::Utf16 => "utf-16" },
        "textDocumentSync": {
            "openClose": true,
            "change": 2,
            "save": {"includeText": false},
        },
        "completionProvider": {
            "triggerCharacters": [".", "\"", "|", " ", "="],
            "resolveProvider": false,
        },
        "hoverProvider": true,
        "definitionProvider": true,
        "referencesProvider": true,
        "renameProvider": {"prepareProvider": true},
        "codeActionProvider": {"codeActionKinds": ["quickfix"]},
        "documentSymbolProvider": true,
    })
}

/// What the features read: the open documents and the latest analyses.
pub(crate) struct World {
    pub(crate) docs: Docs,
    /// One analysis per workflow file checked, by its path.
    pub(crate) analyses: HashMap<PathBuf, Analysis>,
    /// For a workflow whose text does not parse now: its last analysis that did, so that
    /// completion still knows its stages, params and schemas while the user types.
    pub(crate) last_good: HashMap<PathBuf, Analysis>,
    pub(crate) encoding: Encoding,
    /// The workspace folders, where workflows are looked for when a prompt file is opened
    /// alone.
    pub(crate) workspace: Vec<PathBuf>,
}

impl World {
    /// The analysis that best answers for a file: its own (a workflow file), else one that
    /// read it (a base, an include, a prompt file, a schema).
    pub(crate) fn analysis_for(&self, path: &Path) -> Option<&Analysis> {
        if let Some(a) = self.analyses.get(path) {
            if a.workflow.is_some() {
                return Some(a);
            }
        }
        let mut others: Vec<&Analysis> = self
            .analyses
            .values()
            .filter(|a| a.root != path && a.involves(path))
            .collect();
        others.sort_by(|a, b| a.root.cmp(&b.root));
        others
            .into_iter()
            .next()
            .or_else(|| self.analyses.get(path))
    }

    /// Every analysis that read a file.
    pub(crate) fn analyses_of<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = &'a Analysis> {
        self.analyses.values().filter(move |a| a.involves(path))
    }

    /// The text of a file: the editor's when it is open, else the disk's.
    pub(crate) fn text(&self, path: &Path) -> Option<std::sync::Arc<str>> {
        self.docs.text(path)
    }

    /// The byte offset of a position in a file.
    pub(crate) fn offset(&self, path: &Path, pos: Position) -> Option<usize> {
        match self.docs.get(path) {
            Some(d) => Some(d.lines.offset(&d.text, pos, self.encoding)),
            None => {
                let text = self.text(path)?;
                Some(LineIndex::new(&text).offset(&text, pos, self.encoding))
            }
        }
    }

    /// The range of a byte range of a file, as the editor holds it.
    pub(crate) fn range(&self, path: &Path, r: std::ops::Range<usize>) -> Range {
        match self.docs.get(path) {
            Some(d) => d.lines.range(&d.text, r, self.encoding),
            None => match self.text(path) {
                Some(text) => LineIndex::new(&text).range(&text, r, self.encoding),
                None => Range::default(),
            },
        }
    }

    /// Whether a request is about a TOML file that is no workflow and that no workflow
    /// reads (see [`looks_like_workflow`]).
    fn not_ours(&self, params: &Value) -> bool {
        let Some(path) = params
            .pointer("/textDocument/uri")
            .and_then(Value::as_str)
            .and_then(|u| u.parse::<Uri>().ok())
            .and_then(|u| uri_path(&u))
        else {
            return false;
        };
        let toml = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
        toml && self
            .docs
            .get(&path)
            .is_some_and(|d| !looks_like_workflow(&path, &d.text))
            && self.analyses_of(&path).next().is_none()
    }

    /// The URI to give the client for a file: the one it opened it by, or a `file:` URI.
    pub(crate) fn uri(&self, path: &Path) -> Option<Uri> {
        match self.docs.get(path) {
            Some(d) => Some(d.uri.clone()),
            None => path_uri(path),
        }
    }
}

struct Server {
    sender: crossbeam_channel::Sender<Message>,
    world: World,
    /// Files changed since the last check: the analyses that read them are redone.
    dirty: HashSet<PathBuf>,
    /// Open files no analysis reads for which the workspace's workflows were searched: not
    /// searched again on each edit (only once they are opened again, or a file is saved).
    searched: HashSet<PathBuf>,
    /// The trees of the files workflows extend and include, parsed again only when their
    /// text changes.
    parse_cache: crate::load::ParseCache,
    /// What was last published for each open document.
    published: HashMap<PathBuf, Vec<lsp_types::Diagnostic>>,
    shutting_down: bool,
}

impl Server {
    /// Handles one message; `true` once the client said `exit`.
    fn handle(&mut self, msg: Message) -> bool {
        match msg {
            Message::Request(req) => {
                let id = req.id.clone();
                let method = req.method.clone();
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.request(req)));
                let response = match outcome {
                    Ok(r) => r,
                    Err(panic) => {
                        self.log_panic(&format!("`{method}`"), &panic);
                        Response::new_err(
                            id,
                            ErrorCode::InternalError as i32,
                            panic_message(&panic),
                        )
                    }
                };
                let _ = self.sender.send(response.into());
                false
            }
            Message::Notification(n) if n.method == lsp_types::notification::Exit::METHOD => true,
            Message::Notification(n) => {
                let method = n.method.clone();
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.notification(n)));
                if let Err(panic) = outcome {
                    self.log_panic(&format!("`{method}`"), &panic);
                }
                false
            }
            Message::Response(_) => false,
        }
    }

    /// Reports a caught panic to the client's log; the server goes on serving.
    fn log_panic(&self, what: &str, panic: &Box<dyn std::any::Any + Send>) {
        self.log(
            lsp_types::MessageType::ERROR,
            format!(
                "ralph-flow lsp: {what} failed (a bug: please report it with the file you \
                 were editing; the server goes on): {}",
                panic_message(panic)
            ),
        );
    }

    fn log(&self, typ: lsp_types::MessageType, message: String) {
        let params = lsp_types::LogMessageParams { typ, message };
        let _ = self.sender.send(
            Notification::new(
                lsp_types::notification::LogMessage::METHOD.to_string(),
                params,
            )
            .into(),
        );
    }

    fn request(&mut self, req: Request) -> Response {
        use lsp_types::request as r;
        if req.method == r::Shutdown::METHOD {
            self.shutting_down = true;
            return Response::new_ok(req.id, Value::Null);
        }
        if self.shutting_down {
            return Response::new_err(
                req.id,
                ErrorCode::InvalidRequest as i32,
                "the server is shutting down".to_string(),
            );
        }
        // Answers come from the text as it is now.
        self.refresh();
        let w = &self.world;
        let id = req.id.clone();
        if w.not_ours(&req.params) {
            // A TOML file that is no workflow (`Cargo.toml`): nothing to offer there.
            return Response::new_ok(id, Value::Null);
        }
        let result = match req.method.as_str() {
            r::Completion::METHOD => answer(&req, |p| completion::complete(w, p)),
            r::HoverRequest::METHOD => answer(&req, |p| hover::hover(w, p)),
            r::GotoDefinition::METHOD => answer(&req, |p| navigate::definition(w, p)),
            r::References::METHOD => answer(&req, |p| navigate::references(w, p)),
            r::PrepareRenameRequest::METHOD => {
                answer_or_refuse(&req, |p| navigate::prepare_rename(w, p))
            }
            r::Rename::METHOD => answer_or_refuse(&req, |p| navigate::rename(w, p)),
            r::CodeActionRequest::METHOD => answer(&req, |p| actions::code_actions(w, p)),
            r::DocumentSymbolRequest::METHOD => answer(&req, |p| symbols::document_symbols(w, p)),
            // Debug builds only (the tests'): a handler that panics, to show that a panic is
            // reported and the server keeps serving; and the text the server holds for a
            // document, to show that it applied the edits as the client did. A release build
            // (what users run) has neither.
            #[cfg(debug_assertions)]
            "ralph-flow/panic" => panic!("`ralph-flow/panic` panics, as asked"),
            #[cfg(debug_assertions)]
            "ralph-flow/text" => Ok(req
                .params
                .get("uri")
                .and_then(Value::as_str)
                .and_then(|u| u.parse::<Uri>().ok())
                .and_then(|u| uri_path(&u))
                .and_then(|p| w.docs.get(&p))
                .map_or(Value::Null, |d| Value::String(d.text.to_string()))),
            _ => Err((
                ErrorCode::MethodNotFound,
                format!("ralph-flow lsp does not serve `{}`", req.method),
            )),
        };
        match result {
            Ok(v) => Response::new_ok(id, v),
            Err((code, message)) => Response::new_err(id, code as i32, message),
        }
    }

    fn notification(&mut self, n: Notification) {
        use lsp_types::notification as notif;
        match n.method.as_str() {
            notif::DidOpenTextDocument::METHOD => {
                let Ok(p) =
                    serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(n.params)
                else {
                    return;
                };
                let Some(path) = uri_path(&p.text_document.uri) else {
                    return;
                };
                let doc = Doc::new(
                    p.text_document.uri,
                    p.text_document.text,
                    p.text_document.version,
                );
                self.world.docs.open.insert(path.clone(), doc);
                self.searched.remove(&path);
                self.dirty.insert(path);
            }
            notif::DidChangeTextDocument::METHOD => {
                let Ok(p) =
                    serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(n.params)
                else {
                    return;
                };
                let Some(path) = uri_path(&p.text_document.uri) else {
                    return;
                };
                let enc = self.world.encoding;
                let Some(doc) = self.world.docs.open.get_mut(&path) else {
                    return;
                };
                let mut text = doc.text.to_string();
                let mut lines = doc.lines.clone();
                let n = p.content_changes.len();
                for (i, change) in p.content_changes.into_iter().enumerate() {
                    match change.range {
                        None => {
                            text = change.text;
                        }
                        Some(range) => {
                            let a = lines.offset(&text, range.start, enc);
                            let b = lines.offset(&text, range.end, enc);
                            let (a, b) = (a.min(b), a.max(b));
                            text.replace_range(a..b, &change.text);
                        }
                    }
                    // The next change's positions are in the text this one made (the last
                    // one's index is made by `set`).
                    if i + 1 < n {
                        lines = LineIndex::new(&text);
                    }
                }
                doc.set(text, p.text_document.version);
                self.dirty.insert(path);
            }
            notif::DidCloseTextDocument::METHOD => {
                let Ok(p) =
                    serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(n.params)
                else {
                    return;
                };
                let Some(path) = uri_path(&p.text_document.uri) else {
                    return;
                };
                if let Some(doc) = self.world.docs.open.remove(&path) {
                    // A closed file shows nothing any more.
                    if self.published.remove(&path).is_some_and(|d| !d.is_empty()) {
                        self.publish(doc.uri, Vec::new(), None);
                    }
                }
                // Its analysis goes; the files it read are checked again, and a prompt file it
                // alone read (open on its own) looks for its workflow in the workspace again.
                if let Some(a) = self.world.analyses.remove(&path) {
                    for f in &a.files {
                        self.searched.remove(f);
                    }
                    self.dirty.extend(a.files.iter().cloned());
                }
                self.searched.remove(&path);
                self.dirty.insert(path);
            }
            notif::DidSaveTextDocument::METHOD | notif::DidChangeWatchedFiles::METHOD => {
                // A file changed on the disk (or was saved): everything may read it.
                let paths: Vec<PathBuf> = self.world.analyses.keys().cloned().collect();
                self.dirty.extend(paths);
                self.searched.clear();
            }
            _ => {}
        }
    }

    /// Re-checks every workflow a changed file touches, and publishes the diagnostics that
    /// changed.
    fn refresh(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.dirty);
        // The workflows to check: every open workflow file, and every analysis that read a
        // changed file.
        let mut roots: Vec<PathBuf> = self
            .world
            .analyses
            .values()
            .filter(|a| dirty.iter().any(|d| a.root == *d || a.involves(d)))
            .map(|a| a.root.clone())
            .collect();
        // An open part that a workflow includes is checked within it, not on its own.
        let parts = self.included();
        for p in self.world.docs.open.keys() {
            let pending = dirty.contains(p) || !self.world.analyses.contains_key(p);
            if pending
                && !parts.contains(p)
                && self
                    .world
                    .docs
                    .get(p)
                    .is_some_and(|d| looks_like_workflow(p, &d.text))
            {
                roots.push(p.clone());
            }
        }
        roots.sort();
        roots.dedup();
        // The files whose diagnostics may change: the changed ones, and every file an
        // analysis redone or dropped read (before and after). Only those are published.
        let mut touched = dirty;
        // The analyses replaced: freed only once the diagnostics are out (freeing the model
        // of a 10,000-stage workflow is 5% of its check).
        let mut retired = Vec::new();
        for root in roots {
            let still_there =
                self.world.docs.open.contains_key(&root) || self.world.analyses.contains_key(&root);
            if still_there {
                self.check_root(root, &mut touched, &mut retired);
            }
        }
        // A part that its workflow no longer includes is a workflow of its own again.
        let parts = self.included();
        let freed: Vec<PathBuf> = self
            .world
            .docs
            .open
            .iter()
            .filter(|(p, d)| {
                !self.world.analyses.contains_key(*p)
                    && !parts.contains(*p)
                    && looks_like_workflow(p, &d.text)
            })
            .map(|(p, _)| p.clone())
            .collect();
        for root in freed {
            self.check_root(root, &mut touched, &mut retired);
        }
        self.settle_roots(&mut touched);
        let analyses = &self.world.analyses;
        self.parse_cache
            .retain(|p| analyses.values().any(|a| a.involves(p)));
        self.world
            .last_good
            .retain(|root, _| analyses.contains_key(root));
        self.publish_all(&touched);
        drop(retired);
    }

    /// Every file some analysis pulls in by `include`.
    fn included(&self) -> HashSet<PathBuf> {
        self.world
            .analyses
            .values()
            .flat_map(|a| a.included.iter().cloned())
            .collect()
    }

    /// Checks one workflow again and keeps its analysis (the one it replaces goes to
    /// `retired`, or stays as the last that parsed while this text does not).
    fn check_root(
        &mut self,
        root: PathBuf,
        touched: &mut HashSet<PathBuf>,
        retired: &mut Vec<Analysis>,
    ) {
        let analysis = Analysis::run(root.clone(), &self.world.docs, &mut self.parse_cache);
        let parses = analysis.workflow.is_some();
        touched.extend(analysis.files.iter().cloned());
        if let Some(old) = self.world.analyses.insert(root.clone(), analysis) {
            touched.extend(old.files.iter().cloned());
            // The last text that parsed answers completion while the file does not.
            if !parses && old.workflow.is_some() {
                self.world.last_good.insert(root.clone(), old);
            } else {
                retired.push(old);
            }
        }
        if parses {
            retired.extend(self.world.last_good.remove(&root));
        }
    }

    /// Drops analyses that nobody needs: a file pulled in by `include` is a part of the
    /// workflows that include it, not a workflow of its own; a workflow found in the
    /// workspace stays only while an open file needs it. An open file that no analysis read
    /// (a prompt file opened alone) makes the server check the workspace's workflows, once.
    /// The files whose diagnostics may change go into `touched`. Linear in the open files
    /// and the files the analyses read.
    fn settle_roots(&mut self, touched: &mut HashSet<PathBuf>) {
        let included: HashSet<PathBuf> = self
            .world
            .analyses
            .values()
            .flat_map(|a| a.included.iter().cloned())
            .collect();
        let open: HashSet<&PathBuf> = self.world.docs.open.keys().collect();
        // Analyses of workflows that are not open stay only while they read an open file.
        self.world.analyses.retain(|root, a| {
            let keep = (!included.contains(root) || a.included.contains(root))
                && (open.contains(root) || a.files.iter().any(|f| open.contains(f)));
            if !keep {
                touched.extend(a.files.iter().cloned());
            }
            keep
        });
        let read: HashSet<&PathBuf> = self
            .world
            .analyses
            .values()
            .flat_map(|a| a.files.iter())
            .collect();
        let mut orphans: Vec<&PathBuf> = open
            .iter()
            .copied()
            .filter(|p| !is_workflow_file(p) || included.contains(*p))
            .filter(|p| !read.contains(p) && !self.searched.contains(*p))
            .collect();
        if orphans.is_empty() {
            return;
        }
        orphans.sort();
        let mut found = Vec::new();
        for candidate in self.workspace_workflows(&orphans) {
            if self.world.analyses.contains_key(&candidate) {
                continue;
            }
            let a = Analysis::run(candidate.clone(), &self.world.docs, &mut self.parse_cache);
            if orphans.iter().any(|o| a.involves(o)) {
                found.push((candidate, a));
            }
        }
        let orphans: Vec<PathBuf> = orphans.into_iter().cloned().collect();
        self.searched.extend(orphans);
        for (candidate, a) in found {
            touched.extend(a.files.iter().cloned());
            self.world.analyses.insert(candidate, a);
        }
    }

    /// Workflow files that may read the given files: those of the workspace folders (the
    /// folder itself and its `workflows/`), and of the directories above each file up to
    /// its workspace folder; at most 200.
    fn workspace_workflows(&self, near: &[&PathBuf]) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for root in &self.world.workspace {
            dirs.push(root.clone());
            dirs.push(root.join("workflows"));
        }
        for p in near {
            let mut cur = p.parent();
            let mut steps = 0;
            while let Some(d) = cur {
                if steps > 4 {
                    break;
                }
                dirs.push(d.to_path_buf());
                dirs.push(d.join("workflows"));
                if self.world.workspace.iter().any(|w| w == d) {
                    break;
                }
                cur = d.parent();
                steps += 1;
            }
        }
        dirs.sort();
        dirs.dedup();
        let mut out = Vec::new();
        for d in dirs {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            let mut found: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && is_workflow_file(p)
                        && std::fs::read_to_string(p).is_ok_and(|t| looks_like_workflow(p, &t))
                })
                .map(|p| crate::fs::normalize(&p))
                .collect();
            found.sort();
            out.extend(found);
            if out.len() >= 200 {
                out.truncate(200);
                break;
            }
        }
        out.dedup();
        out
    }

    /// Publishes, for every open document among `touched`, the diagnostics of the analyses
    /// that read it, where they differ from what was published last.
    fn publish_all(&mut self, touched: &HashSet<PathBuf>) {
        let mut open: Vec<PathBuf> = self
            .world
            .docs
            .open
            .keys()
            .filter(|p| touched.contains(*p))
            .cloned()
            .collect();
        open.sort();
        for path in open {
            let diags = publish::for_file(&self.world, &path);
            if self.published.get(&path) == Some(&diags) {
                continue;
            }
            let Some(doc) = self.world.docs.get(&path) else {
                continue;
            };
            let (uri, version) = (doc.uri.clone(), doc.version);
            self.published.insert(path, diags.clone());
            self.publish(uri, diags, Some(version));
        }
    }

    fn publish(&self, uri: Uri, diagnostics: Vec<lsp_types::Diagnostic>, version: Option<i32>) {
        let params = lsp_types::PublishDiagnosticsParams {
            uri,
            diagnostics,
            version,
        };
        let _ = self.sender.send(
            Notification::new(
                lsp_types::notification::PublishDiagnostics::METHOD.to_string(),
                params,
            )
            .into(),
        );
    }
}

/// Workflow files are TOML or KDL.
pub(crate) fn is_workflow_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("toml") || e.eq_ignore_ascii_case("kdl"))
}

/// Whether a file is a workflow that the server checks on its own: a KDL file, or a TOML
/// file in a `workflows` directory or that says it is one (the presets' `#:schema` line, or
/// a top-level `stages`, `agents`, `extends`, `include` or `overrides`). Editors attach a
/// server by language, so other TOML files reach it too (`Cargo.toml`, `pyproject.toml`):
/// they get no diagnostics. A file that a workflow includes or extends is checked within it
/// whatever it holds.
pub(crate) fn looks_like_workflow(path: &Path, text: &str) -> bool {
    let Some(ext) = path.extension().and_then(|e| e.to_str()) else {
        return false;
    };
    if ext.eq_ignore_ascii_case("kdl") {
        return true;
    }
    if !ext.eq_ignore_ascii_case("toml") {
        return false;
    }
    if path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == "workflows")
    {
        return true;
    }
    const KEYS: &[&str] = &["stages", "agents", "extends", "include", "overrides"];
    let names_key = |key: &str| {
        KEYS.iter().any(|k| {
            key.strip_prefix(k).is_some_and(|r| {
                let r = r.trim_start();
                r.starts_with('=') || r.starts_with('.') || r.starts_with(']')
            })
        })
    };
    // Bare keys count before the first table header only (they are top-level there).
    let mut top = true;
    text.lines().any(|line| {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix("#:schema") {
            return rest.contains("workflow");
        }
        if line.starts_with('[') {
            top = false;
            return names_key(line.trim_start_matches('[').trim_start());
        }
        top && names_key(line)
    })
}

type Failure = (ErrorCode, String);

/// Decodes a request's params, calls the feature, and encodes its answer.
fn answer<P, R>(req: &Request, f: impl FnOnce(P) -> Option<R>) -> Result<Value, Failure>
where
    P: serde::de::DeserializeOwned,
    R: serde::Serialize,
{
    let params: P = serde_json::from_value(req.params.clone()).map_err(|e| {
        (
            ErrorCode::InvalidParams,
            format!("invalid params for `{}`: {e}", req.method),
        )
    })?;
    match f(params) {
        Some(r) => serde_json::to_value(r).map_err(|e| (ErrorCode::InternalError, e.to_string())),
        None => Ok(Value::Null),
    }
}

/// [`answer`], for a feature that may refuse with a message for the user (a rename to a
/// taken name): the refusal is answered as `RequestFailed`, which editors show.
fn answer_or_refuse<P, R>(
    req: &Request,
    f: impl FnOnce(P) -> Result<Option<R>, String>,
) -> Result<Value, Failure>
where
    P: serde::de::DeserializeOwned,
    R: serde::Serialize,
{
    let mut refused = None;
    let out = answer(req, |p| match f(p) {
        Ok(r) => r,
        Err(why) => {
            refused = Some(why);
            None
        }
    })?;
    match refused {
        Some(why) => Err((ErrorCode::RequestFailed, why)),
        None => Ok(out),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::looks_like_workflow;
    use std::path::Path;

    #[test]
    fn workflows_are_told_from_other_toml_files() {
        let yes = [
            (
                "/p/flow.toml",
                "name = \"x\"\n[stages.a]\nkind = \"command\"\n",
            ),
            ("/p/flow.toml", "extends = \"spider\"\n"),
            ("/p/flow.toml", "#:schema ../schemas/workflow.schema.json\n"),
            ("/p/flow.toml", "name = \"x\"\nstages.a.kind = \"agent\"\n"),
            ("/p/flow.toml", "[[stages]]\n"),
            ("/p/workflows/empty.toml", ""),
            ("/p/anything.kdl", "package {}"),
        ];
        for (path, text) in yes {
            assert!(
                looks_like_workflow(Path::new(path), text),
                "{path}: {text:?}"
            );
        }
        let no = [
            (
                "/p/Cargo.toml",
                "[package]\nname = \"x\"\n[dependencies]\nstages = \"1\"\n",
            ),
            ("/p/pyproject.toml", "[tool.stages_x]\n"),
            ("/p/README.md", "[stages.a]"),
            ("/p/flow.toml", "stagesx = 1\n"),
        ];
        for (path, text) in no {
            assert!(
                !looks_like_workflow(Path::new(path), text),
                "{path}: {text:?}"
            );
        }
    }
}
