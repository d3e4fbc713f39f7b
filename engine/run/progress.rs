//! What a run shows while it works: a live tree of running stages on a terminal, plain
//! lines otherwise. Everything goes to stderr; stdout is left for results.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::backend::Usage;
use crate::store::{Known, NodeState};
use crate::text::duration;

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A live display of running stages with elapsed time, attempt and tokens.
    Tty,
    /// One line per event.
    Plain,
    /// Nothing.
    Quiet,
}

/// The progress display of a run.
pub struct Progress {
    mode: Mode,
    start: Instant,
    multi: Option<MultiProgress>,
    /// The running stages' bars, with the message each started with.
    bars: RefCell<HashMap<String, (ProgressBar, String)>>,
}

fn key(scope: &str, stage: &str) -> String {
    if scope.is_empty() {
        stage.to_string()
    } else {
        format!("{scope}/{stage}")
    }
}

fn depth(scope: &str) -> usize {
    if scope.is_empty() {
        0
    } else {
        scope.matches('/').count() + 1
    }
}

/// The first line of a message, cut to `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    let line = text.trim().lines().next().unwrap_or("");
    match line.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    }
}

/// Shows a token count shortly: `950`, `12.4k`, `1.2M`.
pub fn short_tokens(n: u64) -> String {
    if n < 1000 {
        n.to_string()
    } else if n < 1_000_000 {
        format!("{:.1}k", n as f64 / 1000.0)
    } else {
        format!("{:.1}M", n as f64 / 1_000_000.0)
    }
}

/// A usage's tokens in a line ([`Known`], [`short_tokens`]): ` · 13.5k tokens`; ` · ≥ 13.5k
/// tokens` when some calls reported no usage; ` · tokens unknown` when none reported any;
/// nothing when no token was counted.
pub fn tokens_note(u: &Usage) -> String {
    match u.known() {
        Known::Exact(0) => String::new(),
        Known::Unknown => String::from(" · tokens unknown"),
        known => format!(" · {} tokens", known.map(short_tokens)),
    }
}

impl Progress {
    /// Creates a display.
    pub fn new(mode: Mode) -> Self {
        let multi = (mode == Mode::Tty)
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8)));
        Progress {
            mode,
            start: Instant::now(),
            multi,
            bars: RefCell::new(HashMap::new()),
        }
    }

    fn line(&self, text: &str) {
        let text = crate::secrets::redact(text);
        let text = crate::text::printable(&text);
        let text = text.as_ref();
        match (&self.multi, self.mode) {
            (Some(m), _) => {
                let _ = m.println(text);
            }
            (None, Mode::Plain) => {
                eprintln!("[{:>7}] {text}", duration(self.start.elapsed()));
            }
            _ => {}
        }
    }

    /// A stage started an attempt.
    pub fn started(&self, scope: &str, stage: &str, attempt: u32, what: &str) {
        let k = key(scope, stage);
        match &self.multi {
            Some(m) => {
                let bar = m.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar.enable_steady_tick(Duration::from_millis(125));
                let indent = "  ".repeat(depth(scope));
                let at = if scope.is_empty() {
                    String::new()
                } else {
                    format!(" [{scope}]")
                };
                let message = format!("{indent}{stage}{at} {what} · attempt {attempt}");
                let message = crate::secrets::redact(&message);
                let message = crate::text::printable(&message).into_owned();
                bar.set_message(message.clone());
                if let Some((old, _)) = self.bars.borrow_mut().insert(k, (bar, message)) {
                    old.finish_and_clear();
                }
            }
            None => {
                let more = if attempt > 1 {
                    format!(" (attempt {attempt})")
                } else {
                    String::new()
                };
                self.line(&format!("▶ {k} {what}{more}"));
            }
        }
    }

    /// A stage settled.
    pub fn settled(
        &self,
        scope: &str,
        stage: &str,
        state: NodeState,
        elapsed: Duration,
        usage: &Usage,
        why: Option<&str>,
    ) {
        let k = key(scope, stage);
        if let Some((bar, _)) = self.bars.borrow_mut().remove(&k) {
            bar.finish_and_clear();
        }
        let mark = match state {
            NodeState::Done => "✓",
            NodeState::Skipped => "·",
            NodeState::Failed | NodeState::TimedOut => "✗",
        };
        let mut text = format!("{mark} {k} {}", state.as_str());
        if state != NodeState::Skipped {
            text.push_str(&format!(" in {}", duration(elapsed)));
        }
        text.push_str(&tokens_note(usage));
        if let Some(c) = usage.cost_usd {
            text.push_str(&format!(" · ${c:.4}"));
        }
        if let Some(why) = why.filter(|_| mark == "✗") {
            text.push_str(": ");
            text.push_str(&one_line(why, 240));
        }
        self.line(&text);
    }

    /// What a running stage's agent is doing now (a tool call, a plan step): on a terminal,
    /// after the stage's line; otherwise a line of its own.
    pub fn doing(&self, scope: &str, stage: &str, what: &str) {
        let k = key(scope, stage);
        let what = one_line(&crate::secrets::redact(what), 120);
        let what = crate::text::printable(&what).into_owned();
        match &self.multi {
            Some(_) => {
                if let Some((bar, base)) = self.bars.borrow().get(&k) {
                    bar.set_message(format!("{base} · {what}"));
                }
            }
            None => self.line(&format!("  {k}: {what}")),
        }
    }

    /// Something worth a line: a retry, a rate limit, a gate waiting, an iteration.
    pub fn note(&self, text: &str) {
        self.line(text);
    }

    /// Ends the display.
    pub fn finish(&self) {
        for (_, (bar, _)) in self.bars.borrow_mut().drain() {
            bar.finish_and_clear();
        }
        if let Some(m) = &self.multi {
            let _ = m.clear();
        }
    }
}
