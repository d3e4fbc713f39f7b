//! Robustness: the mutation corpus of tests/robustness.rs (the shipped presets, the checker's
//! fixtures and the prompt files, truncated, mutated, replaced by random bytes, non-ASCII next
//! to reported places) driven through the server as an editor would: opened, then changed by
//! fuzzed edit sequences (incremental changes at random ranges, past the end, inside
//! multi-byte characters and surrogate pairs, empty edits, deleting everything, CRLF and lone
//! CR line ends, whole replacements), each followed by every request the server serves at
//! random positions. The server must answer every request (the client waits 60 s at most),
//! never with a caught panic (InternalError) nor a panic in its log, publish only ranges
//! inside the document as the client holds it, hold the same text as the client, and end
//! cleanly.
//!
//! The seed is fixed, so a failure reproduces; `RALPH_FLOW_LSP_FUZZ_CASES=N` runs N cases
//! (default 40) and `RALPH_FLOW_LSP_FUZZ_SEED=N` another sequence.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::client::{Client, project, repo};

/// A deterministic xorshift generator (tests/robustness.rs's), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// What the mutations insert (tests/robustness.rs's pieces, and line ends and astral
/// characters for the positions).
const PIECES: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "\"",
    "'",
    "[",
    "]",
    "{",
    "}",
    "=",
    "\n",
    "\r\n",
    "\r",
    "#",
    "\\",
    "stages.",
    "{{ stages.",
    "{{ params.",
    "| ",
    "kind = \"loop\"",
    "needs = [\"x\"]",
    "max_iterations = 0",
    "until = \"",
    "exit:",
    "continue",
    "\u{0}",
    "\u{feff}",
    "é",
    "🦀",
    "𝄞",
    "/-",
    "#true",
    "999999999999999999999",
    "-1",
    "1.5e308",
    "nan",
    "stage \"a\" {",
    ";",
    "extends = \"",
    "include = [\"",
    "prompt_file = \"",
];

/// Texts with non-ASCII characters where the checker reports (tests/robustness.rs's).
const NON_ASCII: &[(&str, &str)] = &[
    (
        "toml",
        "name = \"é\"\n[stages.é]\nkind = \"command\"\n[stages.é]\nkind = \"command\"\n",
    ),
    (
        "toml",
        "name = \"x\"\n[stages.a]\nkind = \"command\"\nargv = [\"é\\t{{ nöpe }}\", \"\"\"\nç \\\n  {% if é %}\"\"\"]\nargv = []\n",
    ),
    (
        "toml",
        "name = \"x\"\r\n[stages.a]\r\nkind = \"command\"\r\nargv = [\"\\u00e9{{ params.x\"]\r\n",
    ),
    (
        "kdl",
        "name \"x\"\nstage \"a\" kind=\"command\" {\n    argv \"é\\u{e9}{{ nöpe }}\" \"\"\"\n        ç {% if é %}\n        \"\"\"\n}\n",
    ),
    (
        "kdl",
        "name \"x\"\rstage \"é\" kind=true {\r    argv \"ç\r𝄞\"\n",
    ),
];

/// One file of the corpus: its extension (`toml`, `kdl` or `md.j2`), its text, and for a
/// prompt file its path in the project.
struct Seed {
    ext: String,
    text: String,
    at: Option<PathBuf>,
    /// A shipped preset or prompt file.
    shipped: bool,
}

fn seeds(project: &Path) -> Vec<Seed> {
    let mut out = Vec::new();
    let dirs = [
        project.join("workflows"),
        repo().join("tests/fixtures/check/valid"),
        repo().join("tests/fixtures/check/invalid"),
    ];
    for (n, dir) in dirs.into_iter().enumerate() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if let (Some(ext @ ("toml" | "kdl")), Ok(text)) = (
                p.extension().and_then(|x| x.to_str()),
                std::fs::read_to_string(&p),
            ) {
                out.push(Seed {
                    ext: ext.to_string(),
                    text,
                    at: None,
                    shipped: n == 0,
                });
            }
        }
    }
    let mut prompts = Vec::new();
    collect_prompts(&project.join("prompts"), &mut prompts);
    prompts.sort();
    for p in prompts {
        if let Ok(text) = std::fs::read_to_string(&p) {
            out.push(Seed {
                ext: "md.j2".to_string(),
                text,
                at: Some(p),
                shipped: true,
            });
        }
    }
    out
}

fn collect_prompts(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_prompts(&p, out);
        } else if p.to_string_lossy().ends_with(".j2") {
            out.push(p);
        }
    }
}

/// A text of the corpus made from a seed: as is, truncated, mutated, or random bytes.
fn variant(rng: &mut Rng, text: &str) -> String {
    match rng.below(5) {
        0 => text.to_string(),
        1 => {
            let bytes = text.as_bytes();
            let cut = rng.below(bytes.len() + 1);
            String::from_utf8_lossy(&bytes[..cut]).into_owned()
        }
        2 => {
            let len = rng.below(400);
            let bytes: Vec<u8> = (0..len).map(|_| (rng.next() & 0xff) as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        _ => mutated(rng, text),
    }
}

/// tests/robustness.rs's mutation: a few deletions, insertions and swaps of characters.
fn mutated(rng: &mut Rng, text: &str) -> String {
    let mut t: Vec<char> = text.chars().collect();
    for _ in 0..1 + rng.below(4) {
        if t.is_empty() {
            break;
        }
        let at = rng.below(t.len());
        match rng.below(3) {
            0 => {
                let end = (at + rng.below(20)).min(t.len());
                t.drain(at..end);
            }
            1 => {
                let piece = rng.pick(PIECES);
                for (i, c) in piece.chars().enumerate() {
                    t.insert((at + i).min(t.len()), c);
                }
            }
            _ => {
                let other = rng.below(t.len());
                t.swap(at, other);
            }
        }
    }
    t.into_iter().collect()
}

/// The document as the client holds it, with the protocol's rules: lines end at `\n`,
/// `\r\n` or a lone `\r`; columns count UTF-16 units (or bytes); a column past a line's end
/// is its end, a line past the text's end is the text's end, and a column inside a
/// character (half of a surrogate pair) is where that character starts (the server's
/// documented clamping, written out again here).
struct Model {
    text: String,
    utf8: bool,
}

impl Model {
    /// The byte ranges of each line's text, without its line end.
    fn lines(&self) -> Vec<(usize, usize)> {
        let b = self.text.as_bytes();
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'\n' => {
                    out.push((start, i));
                    start = i + 1;
                }
                b'\r' if b.get(i + 1) == Some(&b'\n') => {
                    out.push((start, i));
                    i += 1;
                    start = i + 1;
                }
                b'\r' => {
                    out.push((start, i));
                    start = i + 1;
                }
                _ => {}
            }
            i += 1;
        }
        out.push((start, b.len()));
        out
    }

    fn width(&self, c: char) -> usize {
        if self.utf8 {
            c.len_utf8()
        } else {
            c.len_utf16()
        }
    }

    /// Each line's length in the negotiated units.
    fn lengths(&self) -> Vec<usize> {
        self.lines()
            .iter()
            .map(|&(a, b)| self.text[a..b].chars().map(|c| self.width(c)).sum())
            .collect()
    }

    fn offset(&self, line: usize, character: usize) -> usize {
        let lines = self.lines();
        let Some(&(a, b)) = lines.get(line) else {
            return self.text.len();
        };
        let mut units = 0;
        for (i, c) in self.text[a..b].char_indices() {
            let w = self.width(c);
            if units + w > character {
                return a + i;
            }
            units += w;
        }
        b
    }

    /// A random position: often inside the text, sometimes past a line's end or the text's,
    /// sometimes inside a character.
    fn position(&self, rng: &mut Rng) -> (usize, usize) {
        let lengths = self.lengths();
        let line = if rng.chance(10) {
            lengths.len() + rng.below(3)
        } else {
            rng.below(lengths.len())
        };
        let len = lengths.get(line).copied().unwrap_or(0);
        let character = if rng.chance(10) {
            len + 1 + rng.below(5)
        } else {
            rng.below(len + 1)
        };
        (line, character)
    }

    fn apply(&mut self, start: (usize, usize), end: (usize, usize), new: &str) {
        let a = self.offset(start.0, start.1);
        let b = self.offset(end.0, end.1);
        let (a, b) = (a.min(b), a.max(b));
        self.text.replace_range(a..b, new);
    }
}

fn pos(p: (usize, usize)) -> Value {
    json!({"line": p.0, "character": p.1})
}

/// A random text to type.
fn typed(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => String::new(),
        1 => {
            let len = rng.below(12);
            let bytes: Vec<u8> = (0..len).map(|_| (rng.next() & 0xff) as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        _ => {
            let mut s = String::new();
            for _ in 0..1 + rng.below(3) {
                s.push_str(rng.pick(PIECES));
            }
            s
        }
    }
}

/// The server, a document open in it, and the text the client holds at each version.
struct Session<'a> {
    c: &'a mut Client,
    uri: String,
    model: Model,
    version: i32,
    /// Each line's length at each version, for the diagnostics published for it.
    lengths: HashMap<i32, Vec<usize>>,
    requests: usize,
}

impl Session<'_> {
    /// One fuzzed edit, as one `didChange` (one to three changes, or the whole text).
    fn edit(&mut self, rng: &mut Rng, seed_text: &str) {
        let mut changes = Vec::new();
        match rng.below(10) {
            0 => {
                let text = if rng.chance(50) {
                    mutated(rng, seed_text)
                } else {
                    variant(rng, seed_text)
                };
                self.model.text = text.clone();
                changes.push(json!({"text": text}));
            }
            1 => {
                // Everything deleted.
                let end = (self.model.lines().len() + 3, 0);
                self.model.apply((0, 0), end, "");
                changes.push(json!({"range": {"start": pos((0, 0)), "end": pos(end)}, "text": ""}));
            }
            2 => {
                // An empty edit.
                let p = self.model.position(rng);
                self.model.apply(p, p, "");
                changes.push(json!({"range": {"start": pos(p), "end": pos(p)}, "text": ""}));
            }
            _ => {
                for _ in 0..1 + rng.below(3) {
                    let a = self.model.position(rng);
                    let b = if rng.chance(50) {
                        a
                    } else if rng.chance(20) {
                        // Any order: a client may send an end before the start.
                        self.model.position(rng)
                    } else {
                        (a.0 + rng.below(2), rng.below(40))
                    };
                    let (start, end) = if rng.chance(90) && b < a {
                        (b, a)
                    } else {
                        (a, b)
                    };
                    let text = typed(rng);
                    self.model.apply(start, end, &text);
                    changes.push(
                        json!({"range": {"start": pos(start), "end": pos(end)}, "text": text}),
                    );
                }
            }
        }
        self.c.change(&self.uri, Value::Array(changes));
        self.version += 1;
        self.lengths.insert(self.version, self.model.lengths());
    }

    /// Every request the server serves, at random positions.
    fn ask(&mut self, rng: &mut Rng) {
        let doc = json!({"uri": self.uri});
        let p = pos(self.model.position(rng));
        let q = pos(self.model.position(rng));
        let requests = [
            (
                "textDocument/completion",
                json!({"textDocument": doc, "position": p}),
            ),
            (
                "textDocument/hover",
                json!({"textDocument": doc, "position": p}),
            ),
            (
                "textDocument/definition",
                json!({"textDocument": doc, "position": p}),
            ),
            (
                "textDocument/references",
                json!({"textDocument": doc, "position": p, "context": {"includeDeclaration": true}}),
            ),
            (
                "textDocument/prepareRename",
                json!({"textDocument": doc, "position": p}),
            ),
            (
                "textDocument/rename",
                json!({"textDocument": doc, "position": p, "newName": "renamed"}),
            ),
            (
                "textDocument/codeAction",
                json!({"textDocument": doc, "range": {"start": p, "end": q},
                       "context": {"diagnostics": []}}),
            ),
            ("textDocument/documentSymbol", json!({"textDocument": doc})),
        ];
        for (method, params) in requests {
            match self.c.try_request(method, params.clone()) {
                Ok(_) => self.requests += 1,
                // A rename may be refused (nothing to rename there, a name taken), with a
                // sentence: RequestFailed. Any other error (a caught panic, bad params, a
                // method not served) is a bug.
                Err(e) if method.contains("ename") && e.ends_with("(-32803)") => {
                    self.requests += 1;
                }
                Err(e) => panic!(
                    "`{method}` failed: {e}\nparams: {params}\ntext: {:?}",
                    self.model.text
                ),
            }
        }
    }

    /// The server holds the client's text (debug builds serve `ralph-flow/text`).
    fn same_text(&mut self) {
        if cfg!(debug_assertions) {
            let held = self.c.request("ralph-flow/text", json!({"uri": self.uri}));
            assert_eq!(
                held.as_str(),
                Some(self.model.text.as_str()),
                "the server applied the edits otherwise than the protocol says"
            );
        }
    }
}

/// Checks every notification received so far: no panic in the log, and every published
/// range inside the document at the version it was published for.
fn check_notifications(c: &mut Client, uri: &str, lengths: &HashMap<i32, Vec<usize>>) -> usize {
    let mut checked = 0;
    for n in std::mem::take(&mut c.notifications) {
        match n.method.as_str() {
            "window/logMessage" | "window/showMessage" => {
                assert_ne!(n.params["type"], 1, "an error in the log: {}", n.params);
            }
            "textDocument/publishDiagnostics" if n.params["uri"] == uri => {
                let Some(v) = n.params["version"].as_i64() else {
                    continue;
                };
                let lines = lengths
                    .get(&(v as i32))
                    .unwrap_or_else(|| panic!("diagnostics for an unknown version {v}"));
                let diags = n.params["diagnostics"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for d in &diags {
                    let mut ranges = vec![&d["range"]];
                    for r in d["relatedInformation"].as_array().into_iter().flatten() {
                        if r["location"]["uri"] == uri {
                            ranges.push(&r["location"]["range"]);
                        }
                    }
                    for r in ranges {
                        let at = |p: &Value| {
                            let line = p["line"].as_u64().unwrap_or(u64::MAX) as usize;
                            let ch = p["character"].as_u64().unwrap_or(u64::MAX) as usize;
                            assert!(
                                line < lines.len() && ch <= lines[line],
                                "a diagnostic out of the document (version {v}, {} lines, \
                                 line lengths {:?}): {d}",
                                lines.len(),
                                lines.get(line)
                            );
                            (line, ch)
                        };
                        let (s, e) = (at(&r["start"]), at(&r["end"]));
                        assert!(s <= e, "a range that ends before it starts: {d}");
                        checked += 1;
                    }
                }
            }
            _ => {}
        }
    }
    checked
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `cases` fuzzed cases through one server; the number of requests answered and of
/// ranges checked.
fn fuzz(capabilities: Value, utf8: bool, cases: u64, seed: u64) -> (usize, usize) {
    let dir = project();
    let corpus = seeds(dir.path());
    assert!(corpus.len() > 50, "the corpus is missing: {}", corpus.len());
    let mut rng = Rng(seed.max(1));
    let mut c = Client::start_with(dir.path(), capabilities);
    let (mut requests, mut ranges) = (0, 0);
    for i in 0..cases {
        let (text, path) = if i % 9 == 8 {
            let (ext, text) = NON_ASCII[rng.below(NON_ASCII.len())];
            let path = dir.path().join(format!("workflows/fuzz{i}.{ext}"));
            (text.to_string(), path)
        } else {
            // The shipped presets and prompt files come up more often than the fixtures.
            let seed = if rng.chance(40) {
                let shipped: Vec<&Seed> = corpus.iter().filter(|s| s.shipped).collect();
                shipped[rng.below(shipped.len())]
            } else {
                &corpus[rng.below(corpus.len())]
            };
            let path = seed
                .at
                .clone()
                .unwrap_or_else(|| dir.path().join(format!("workflows/fuzz{i}.{}", seed.ext)));
            (variant(&mut rng, &seed.text), path)
        };
        let u = c.open(&path, &text);
        let mut s = Session {
            c: &mut c,
            uri: u.clone(),
            model: Model {
                text: text.clone(),
                utf8,
            },
            version: 1,
            lengths: HashMap::new(),
            requests: 0,
        };
        s.lengths.insert(1, s.model.lengths());
        s.ask(&mut rng);
        for _ in 0..2 + rng.below(6) {
            s.edit(&mut rng, &text);
            s.ask(&mut rng);
        }
        s.same_text();
        requests += s.requests;
        let lengths = std::mem::take(&mut s.lengths);
        c.sync();
        ranges += check_notifications(&mut c, &u, &lengths);
        c.notify("textDocument/didClose", json!({"textDocument": {"uri": u}}));
    }
    c.sync();
    check_notifications(&mut c, "", &HashMap::new());
    c.shutdown();
    (requests, ranges)
}

#[test]
fn fuzzed_edits_of_the_mutation_corpus_never_break_the_server() {
    let cases = env_number("RALPH_FLOW_LSP_FUZZ_CASES", 40);
    let seed = env_number("RALPH_FLOW_LSP_FUZZ_SEED", 0x9e37_79b9_7f4a_7c15);
    let (requests, ranges) = fuzz(json!({}), false, cases, seed);
    // The test tests something: requests were answered and diagnostics checked.
    assert!(requests >= cases as usize * 8, "{requests} requests");
    assert!(ranges > cases as usize, "only {ranges} ranges checked");
}

#[test]
fn fuzzed_edits_in_utf8_positions_never_break_the_server() {
    let cases = env_number("RALPH_FLOW_LSP_FUZZ_CASES", 40) / 2;
    let seed = env_number("RALPH_FLOW_LSP_FUZZ_SEED", 0x9e37_79b9_7f4a_7c15) ^ 0x5555;
    let (requests, ranges) = fuzz(
        json!({"general": {"positionEncodings": ["utf-8", "utf-16"]}}),
        true,
        cases,
        seed,
    );
    assert!(requests >= cases as usize * 8, "{requests} requests");
    assert!(ranges > cases as usize / 2, "only {ranges} ranges checked");
}

/// The server takes UTF-8 positions when the client offers them.
#[test]
fn a_client_that_offers_utf8_gets_utf8_positions() {
    let dir = project();
    let mut c = Client::start_with(
        dir.path(),
        json!({"general": {"positionEncodings": ["utf-8"]}}),
    );
    let path = dir.path().join("workflows/w.toml");
    // `nöpe` after `é𝄞`: 7 bytes, 3 UTF-16 units.
    let text = "name = \"x\"\n[stages.a]\nkind = \"command\"\nargv = [\"é𝄞{{ nöpe }}\"]\n";
    let u = c.open(&path, text);
    let diags = c.diagnostics(&u);
    let d = diags
        .iter()
        .find(|d| d["range"]["start"]["line"] == 3)
        .unwrap_or_else(|| panic!("no diagnostic on the argv line: {diags:#?}"));
    let col = d["range"]["start"]["character"].as_u64().unwrap_or(0) as usize;
    let line = "argv = [\"é𝄞{{ nöpe }}\"]";
    // minijinja stops at `ö` (no identifier character for it): its column in bytes, 19
    // (in UTF-16 units it would be 16).
    assert_eq!(Some(col), line.find('ö'), "{d}");
    assert_eq!(col, 19);
    // An edit in bytes: `𝄞` (4 bytes) deleted by its byte range.
    let at = line.find('𝄞').unwrap_or(0);
    c.change(
        &u,
        json!([{"range": {"start": {"line": 3, "character": at},
                          "end": {"line": 3, "character": at + 4}}, "text": ""}]),
    );
    if cfg!(debug_assertions) {
        let held = c.request("ralph-flow/text", json!({"uri": u}));
        assert_eq!(held.as_str(), Some(text.replacen('𝄞', "", 1).as_str()));
    }
    c.shutdown();
}

/// A panic in a handler is reported in the client's log and answered as an error, and the
/// server goes on serving. `ralph-flow/panic` exists in debug builds only.
#[cfg(debug_assertions)]
#[test]
fn a_panic_is_logged_and_the_server_keeps_serving() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    assert_eq!(c.codes(&u), Vec::<String>::new());
    let err = c
        .try_request("ralph-flow/panic", json!({}))
        .expect_err("the panic is an error answer");
    assert!(err.ends_with("(-32603)"), "{err}");
    let logged: Vec<&Value> = c
        .notifications
        .iter()
        .filter(|n| n.method == "window/logMessage" && n.params["type"] == 1)
        .map(|n| &n.params)
        .collect();
    assert_eq!(logged.len(), 1, "{logged:#?}");
    let message = logged[0]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("`ralph-flow/panic` failed") && message.contains("panics, as asked"),
        "{message}"
    );
    // Still serving: requests are answered and edits checked.
    let doc = json!({"textDocument": {"uri": u}});
    assert!(c.try_request("textDocument/documentSymbol", doc).is_ok());
    let broken = text.replacen("needs = [\"specify\"]", "needs = [\"specfy\"]", 1);
    c.replace(&u, &broken);
    assert!(c.codes(&u).contains(&"RF010".to_string()));
    c.shutdown();
}
