//! `ralph-flow lsp` as an editor sees it: the release binary started as a subprocess and
//! driven over stdio (lsp-server's framing), the time measured in the client from sending an
//! edit (`didChange`) to receiving the diagnostics it caused (`publishDiagnostics`), and from
//! sending a request to receiving its answer. The results are written down in BENCHMARKS.md
//! ("Language server"); the targets are 20 ms for a shipped preset, 200 ms for a workflow of
//! 10,000 stages, 10 ms for a completion, and memory flat across 1,000 edits.
//!
//! Each edit alternates between adding an unknown key at the end of the file and taking it
//! out again, so that every edit changes the diagnostics and the server publishes them (it
//! sends only what changed).
//!
//! `cargo bench --bench lsp` (release); `RALPH_FLOW_LSP_BIN=PATH` measures another build of
//! the binary. Under `cargo test --all-targets` it runs a few edits of each case, on a
//! smaller chain, as a smoke test.

use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use lsp_server::{Message, Notification, Request, RequestId};
use serde_json::{Value, json};

/// How long the server may take before the benchmark says it hangs.
const PATIENCE: Duration = Duration::from_secs(120);

struct Server {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    incoming: Receiver<Message>,
    next_id: i32,
    versions: std::collections::HashMap<String, i32>,
}

impl Server {
    fn start(workspace: &Path) -> Server {
        // Another build of the binary (an older commit's, to compare) when asked.
        let exe = std::env::var("RALPH_FLOW_LSP_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ralph-flow").to_string());
        let mut child = Command::new(exe)
            .arg("lsp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ralph-flow lsp starts");
        let stdin = BufWriter::new(child.stdin.take().expect("stdin"));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, incoming) = channel();
        std::thread::spawn(move || {
            while let Ok(Some(msg)) = Message::read(&mut stdout) {
                if tx.send(msg).is_err() {
                    break;
                }
            }
        });
        let mut s = Server {
            child,
            stdin,
            incoming,
            next_id: 0,
            versions: Default::default(),
        };
        let root = uri(workspace);
        let answer = s.request(
            "initialize",
            json!({
                "processId": null,
                "rootUri": root,
                "workspaceFolders": [{"uri": root, "name": "w"}],
                "capabilities": {},
            }),
        );
        assert!(answer.get("capabilities").is_some(), "{answer}");
        s.notify("initialized", json!({}));
        s
    }

    fn send(&mut self, msg: Message) {
        msg.write(&mut self.stdin).expect("the server reads");
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(Message::Notification(Notification::new(
            method.to_string(),
            params,
        )));
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = RequestId::from(self.next_id);
        self.send(Message::Request(Request::new(
            id.clone(),
            method.to_string(),
            params,
        )));
        loop {
            match self.incoming.recv_timeout(PATIENCE) {
                Ok(Message::Response(r)) if r.id == id => {
                    // An error answer is no answer to time.
                    return r.response_result.unwrap_or_else(|e| {
                        panic!("`{method}` failed: {} ({})", e.message, e.code)
                    });
                }
                Ok(_) => {}
                Err(e) => panic!("no answer to `{method}`: {e}"),
            }
        }
    }

    /// Waits for the diagnostics of a document at a version; their number.
    fn published(&mut self, uri: &str, version: i32) -> usize {
        loop {
            match self.incoming.recv_timeout(PATIENCE) {
                Ok(Message::Notification(n))
                    if n.method == "textDocument/publishDiagnostics"
                        && n.params["uri"] == uri
                        && n.params["version"] == version =>
                {
                    return n.params["diagnostics"].as_array().map_or(0, Vec::len);
                }
                Ok(_) => {}
                Err(e) => panic!("no diagnostics for {uri} version {version}: {e}"),
            }
        }
    }

    fn open(&mut self, path: &Path, text: &str) -> String {
        let u = uri(path);
        self.versions.insert(u.clone(), 1);
        let lang = if path.extension().is_some_and(|e| e == "kdl") {
            "kdl"
        } else {
            "toml"
        };
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": u, "languageId": lang, "version": 1, "text": text}}),
        );
        u
    }

    /// Sends one incremental change; the document's new version.
    fn change(&mut self, uri: &str, range: Value, text: &str) -> i32 {
        let v = self.versions.entry(uri.to_string()).or_insert(1);
        *v += 1;
        let version = *v;
        self.notify(
            "textDocument/didChange",
            json!({
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [{"range": range, "text": text}],
            }),
        );
        version
    }

    /// The server's resident memory, in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// The CPU time the server used so far (user and system; the kernel counts it in ticks
    /// of 10 ms), which the load of other processes on the machine does not change.
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("/proc/PID/stat");
        // The fields after the command's name, which is in parentheses.
        let rest = stat.rsplit(')').next().unwrap_or("");
        let fields: Vec<u64> = rest
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // utime and stime are the 14th and 15th fields of the line, 12th and 13th here.
        let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
        Duration::from_millis(ticks * 10)
    }

    fn stop(mut self) {
        let _ = self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
        let status = self.child.wait().expect("the server ends");
        assert!(status.success(), "the server ended with {status}");
    }
}

/// A file being edited: a line with an unknown key added at its top, and taken out again.
struct Editing {
    uri: String,
    line: &'static str,
    added: bool,
}

impl Editing {
    fn new(uri: String, kdl: bool) -> Editing {
        Editing {
            uri,
            line: if kdl {
                "bench_unknown_key 1\n"
            } else {
                "bench_unknown_key = 1\n"
            },
            added: false,
        }
    }

    /// Adds the line, or takes it out; the time until its diagnostics arrive, and how many
    /// there are.
    fn edit(&mut self, s: &mut Server) -> (Duration, usize) {
        let start = Instant::now();
        let (end, text) = if self.added { (1, "") } else { (0, self.line) };
        let range = json!({"start": {"line": 0, "character": 0},
                           "end": {"line": end, "character": 0}});
        let version = s.change(&self.uri, range, text);
        let n = s.published(&self.uri, version);
        self.added = !self.added;
        (start.elapsed(), n)
    }
}

fn uri(path: &Path) -> String {
    let mut out = String::from("file://");
    for b in path.to_string_lossy().bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a directory");
    for e in std::fs::read_dir(from).expect("a directory").flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).expect("a copy");
        }
    }
}

/// A chain of `n` agent stages, each needing the one before (benches/side_by_side's chain).
fn chain(n: usize) -> String {
    let mut s = String::from("name = \"bench\"\n\n[agents.bot]\nkind = \"claude\"\n");
    for i in 0..n {
        s.push_str(&format!(
            "\n[stages.s{i}]\nkind = \"agent\"\nagent = \"bot\"\nprompt = \"step {i}\"\n"
        ));
        if i > 0 {
            s.push_str(&format!("needs = [\"s{}\"]\n", i - 1));
        }
    }
    s
}

/// Sends each request `reps` times and prints a row of its answer's shape and times.
fn timed_requests(s: &mut Server, requests: &[(&str, &str, Value)], reps: usize) {
    println!("| request | answer | median | max | server CPU per request |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for (what, method, params) in requests {
        let mut times = Vec::new();
        let mut answer = Value::Null;
        let cpu = s.cpu();
        for _ in 0..reps {
            let t = Instant::now();
            answer = s.request(method, params.clone());
            times.push(t.elapsed());
        }
        let cpu = (s.cpu() - cpu) / reps as u32;
        let max = *times.iter().max().expect("a time");
        let shape = match &answer {
            Value::Null => "null".to_string(),
            Value::Array(a) => format!("{} items", a.len()),
            Value::Object(o) if o.contains_key("items") => {
                format!("{} items", o["items"].as_array().map_or(0, Vec::len))
            }
            _ => "an answer".to_string(),
        };
        println!(
            "| {what} | {shape} | {} | {} | {} |",
            ms(median(times)),
            ms(max),
            ms(cpu)
        );
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Edits a file `reps` times; the first (open) time, the median and the max of the edits,
/// and the server's CPU time per edit.
fn edits(s: &mut Server, path: &Path, reps: usize) -> (Duration, Duration, Duration, Duration) {
    let text = std::fs::read_to_string(path).expect("the file");
    let kdl = path.extension().is_some_and(|e| e == "kdl");
    let t = Instant::now();
    let u = s.open(path, &text);
    let clean = s.published(&u, 1);
    let open = t.elapsed();
    assert_eq!(clean, 0, "{} checks clean", path.display());
    let mut e = Editing::new(u, kdl);
    let mut times = Vec::new();
    let cpu = s.cpu();
    for i in 0..reps {
        let (d, n) = e.edit(s);
        assert_eq!(n > 0, i % 2 == 0, "edit {i} of {}", path.display());
        times.push(d);
    }
    let cpu = (s.cpu() - cpu) / reps as u32;
    let max = *times.iter().max().expect("a time");
    (open, median(times), max, cpu)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let reps = if full { 101 } else { 3 };
    let chain_len = if full { 10_000 } else { 500 };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("a temporary directory");
    for sub in ["workflows", "prompts", "schemas"] {
        copy_dir(&repo.join(sub), &dir.path().join(sub));
    }
    let mut presets: Vec<PathBuf> = std::fs::read_dir(dir.path().join("workflows"))
        .expect("workflows/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml" || e == "kdl"))
        .collect();
    presets.sort();

    println!("Diagnostics after an edit (didChange to publishDiagnostics), {reps} edits each:\n");
    println!("| file | open | edit median | edit max | server CPU per edit |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for p in &presets {
        // A server per preset: each measures its own file, with nothing else open.
        let mut s = Server::start(dir.path());
        let (open, med, max, cpu) = edits(&mut s, p, reps);
        println!(
            "| {} | {} | {} | {} | {} |",
            p.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
            ms(open),
            ms(med),
            ms(max),
            ms(cpu)
        );
        s.stop();
    }
    // A workflow that extends the largest preset (council.kdl, the slowest to parse), the
    // child edited: the base's text does not change, so it needs no parsing again.
    let child = dir.path().join("workflows/extends-council.toml");
    std::fs::write(&child, "name = \"my-council\"\nextends = \"council.kdl\"\n")
        .expect("the child workflow");
    let mut s = Server::start(dir.path());
    let (open, med, max, cpu) = edits(&mut s, &child, reps);
    println!(
        "| a workflow extending council.kdl, edited | {} | {} | {} | {} |",
        ms(open),
        ms(med),
        ms(max),
        ms(cpu)
    );
    s.stop();

    let chain_path = dir.path().join("workflows/chain.toml");
    std::fs::write(&chain_path, chain(chain_len)).expect("the chain");
    let mut s = Server::start(dir.path());
    let (open, med, max, cpu) = edits(&mut s, &chain_path, reps.min(41));
    println!(
        "| chain of {chain_len} agent stages | {} | {} | {} | {} |",
        ms(open),
        ms(med),
        ms(max),
        ms(cpu)
    );
    // Requests on the chain, once its edits are settled (its text is the file's again).
    let chain_text = std::fs::read_to_string(&chain_path).expect("the chain");
    let cu = s.open(&chain_path, &chain_text);
    let last = format!("needs = [\"s{}\"]", chain_len - 2);
    let (nl, nc) = position(&chain_text, &last, "needs = [\"s".len());
    let on_need = json!({"line": nl, "character": nc});
    let chain_requests: [(&str, &str, Value); 4] = [
        (
            "completion of a need (every other stage)",
            "textDocument/completion",
            json!({"textDocument": {"uri": cu}, "position": on_need}),
        ),
        (
            "hover on a need",
            "textDocument/hover",
            json!({"textDocument": {"uri": cu}, "position": on_need}),
        ),
        (
            "definition of a need",
            "textDocument/definition",
            json!({"textDocument": {"uri": cu}, "position": on_need}),
        ),
        (
            "document symbols",
            "textDocument/documentSymbol",
            json!({"textDocument": {"uri": cu}}),
        ),
    ];
    println!(
        "\nRequests on the chain of {chain_len}, {} each:\n",
        reps.min(11)
    );
    timed_requests(&mut s, &chain_requests, reps.min(11));
    println!();
    s.stop();

    // Every preset and prompt file open at once, one preset edited: the other files'
    // diagnostics do not change, and should cost nothing.
    let mut s = Server::start(dir.path());
    let mut all: Vec<PathBuf> = presets.clone();
    prompt_files(&dir.path().join("prompts"), &mut all);
    let mut opened = 0;
    for p in &all {
        let text = std::fs::read_to_string(p).expect("a file");
        let u = s.open(p, &text);
        if presets.contains(p) {
            s.published(&u, 1);
        }
        opened += 1;
    }
    let spider = dir.path().join("workflows/spider.toml");
    // A request answered only once every open file is checked: the edits start from a
    // settled server.
    let _ = s.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": uri(&spider)}}),
    );
    let mut e = Editing::new(uri(&spider), false);
    let mut times = Vec::new();
    let cpu = s.cpu();
    for _ in 0..reps {
        times.push(e.edit(&mut s).0);
    }
    let cpu = (s.cpu() - cpu) / reps as u32;
    let max = *times.iter().max().expect("a time");
    println!(
        "| spider.toml with {opened} files open | | {} | {} | {} |",
        ms(median(times)),
        ms(max),
        ms(cpu)
    );
    s.stop();

    // Requests with no edit waiting: the round trip of the answer alone.
    let spider = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&spider).expect("spider.toml");
    let mut s = Server::start(dir.path());
    let u = s.open(&spider, &text);
    s.published(&u, 1);
    let (line, col) = position(&text, "{{ stages.", "{{ stages.".len());
    let pos = json!({"line": line, "character": col});
    let (hl, hc) = position(&text, "needs = [\"", "needs = [\"".len() + 1);
    let on_ref = json!({"line": hl, "character": hc});
    let requests: [(&str, &str, Value); 4] = [
        (
            "completion in `{{ stages. }}`",
            "textDocument/completion",
            json!({"textDocument": {"uri": u}, "position": pos}),
        ),
        (
            "hover on a need",
            "textDocument/hover",
            json!({"textDocument": {"uri": u}, "position": on_ref}),
        ),
        (
            "definition of a need",
            "textDocument/definition",
            json!({"textDocument": {"uri": u}, "position": on_ref}),
        ),
        (
            "document symbols",
            "textDocument/documentSymbol",
            json!({"textDocument": {"uri": u}}),
        ),
    ];
    println!("\nRequests on spider.toml, {reps} each (request to answer):\n");
    timed_requests(&mut s, &requests, reps);
    // A completion typed right after an edit: the re-check comes first.
    let mut times = Vec::new();
    let at_end = pos.clone();
    for _ in 0..reps {
        let t = Instant::now();
        let range = json!({"start": at_end, "end": at_end});
        s.change(&u, range, " ");
        let _ = s.request(
            "textDocument/completion",
            json!({"textDocument": {"uri": u}, "position": pos}),
        );
        times.push(t.elapsed());
        // Taken out again (not timed).
        let (l, c) = (line, col);
        let typed =
            json!({"start": {"line": l, "character": c}, "end": {"line": l, "character": c + 1}});
        s.change(&u, typed, "");
    }
    let max = *times.iter().max().expect("a time");
    println!(
        "| completion right after an edit | | {} | {} |",
        ms(median(times)),
        ms(max)
    );
    s.stop();

    // Memory across 1,000 edits of the largest preset.
    let council = dir.path().join("workflows/council.kdl");
    let text = std::fs::read_to_string(&council).expect("council.kdl");
    let mut s = Server::start(dir.path());
    let u = s.open(&council, &text);
    s.published(&u, 1);
    let mut e = Editing::new(u, true);
    let edits_n = if full { 1000 } else { 10 };
    for _ in 0..10 {
        e.edit(&mut s);
    }
    let before = s.rss_kib();
    let mut marks = Vec::new();
    for i in 0..edits_n {
        e.edit(&mut s);
        if (i + 1) % (edits_n / 4).max(1) == 0 {
            marks.push(s.rss_kib());
        }
    }
    let after = s.rss_kib();
    println!(
        "\nMemory of the server (VmRSS) editing council.kdl: {before} KiB after 10 edits, then \
         {} KiB every {} edits, {after} KiB after {edits_n} more.",
        marks
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        (edits_n / 4).max(1)
    );
    s.stop();
}

fn prompt_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a directory")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            prompt_files(&p, out);
        } else if p.to_string_lossy().ends_with(".j2") {
            out.push(p);
        }
    }
}

/// The line and UTF-16 column of `needle` in `text`, plus `delta` bytes.
fn position(text: &str, needle: &str, delta: usize) -> (usize, usize) {
    let at = text.find(needle).expect("the needle") + delta;
    let before = &text[..at];
    let line = before.matches('\n').count();
    let col = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .encode_utf16()
        .count();
    (line, col)
}
