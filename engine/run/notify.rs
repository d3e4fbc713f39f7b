//! Notifications: a waiting gate, and the run's end when asked, announced to the notifiers
//! the workflow (`[notify.NAME]`) and the user's config file declare: a webhook (JSON), a
//! Slack incoming webhook, an ntfy topic, or a command that reads the JSON on stdin.
//!
//! Delivery never blocks or fails the run: each announcement is a task of its own on the
//! runtime (the queue), tried again with exponential backoff on a connection error, a
//! timeout, a 5xx, 408 or 429 (honouring `Retry-After`), never on another 4xx. Each
//! delivery's outcome comes back to the executor, which records it as an event of the run
//! (`notified`, `notify-failed`), with the attempts and the last error. Everything sent goes
//! through the secrets masker. At the run's end, deliveries still under way get
//! [`GRACE`], then are abandoned with an event.
//!
//! A gate is announced once, when its request is made: a resume that finds the request in
//! the store does not announce it again, unless no delivery of it was recorded (its
//! executor was killed before one ended).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{Value as Json, json};
use tokio::sync::mpsc;

use crate::model::{Count, Dur, Notify, NotifyEvent, NotifyKind};

/// How long deliveries still under way at the run's end may go on before they are abandoned.
pub(super) const GRACE: Duration = Duration::from_secs(5);

/// The first wait between two attempts of a delivery; it doubles.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait a `Retry-After` is honoured for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The default number of retries of a delivery.
const DEFAULT_RETRIES: u32 = 5;

/// The default timeout of one attempt.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that gives the monitor's base URL when a notifier names none.
const MONITOR_URL_ENV: &str = "RALPH_FLOW_MONITOR_URL";

/// One notifier, its values resolved at the run's start.
#[derive(Debug)]
struct Target {
    name: String,
    /// Where it was declared, for messages: "" (the workflow) or " (user config)".
    origin: &'static str,
    kind: NotifyKind,
    url: String,
    headers: Vec<(String, String)>,
    argv: Vec<String>,
    on: Vec<NotifyEvent>,
    retries: u32,
    timeout: Duration,
    monitor_url: Option<String>,
}

impl Target {
    fn label(&self) -> String {
        format!("{} `{}`{}", self.kind.as_str(), self.name, self.origin)
    }
}

/// What is announced: the webhook's JSON without the link, which each notifier makes.
#[derive(Clone, Debug)]
pub(crate) struct Announcement {
    pub event: NotifyEvent,
    pub run: String,
    pub workflow: String,
    /// The gate's scope and name (`scope/name` qualified), for a gate.
    pub gate: Option<GateInfo>,
    /// The run's status: `waiting` for a gate, else the event's word.
    pub status: &'static str,
    /// The exit the run took: name, code, message.
    pub exit: Option<(String, i64, Option<String>)>,
}

/// A waiting gate, as announced.
#[derive(Clone, Debug)]
pub(crate) struct GateInfo {
    pub name: String,
    pub qualified: String,
    pub scope: String,
    pub message: String,
    pub files: Vec<String>,
    /// The lines that answer it.
    pub approve: String,
    pub reject: String,
}

impl Announcement {
    /// The scope and node its events are recorded at.
    fn place(&self) -> (String, String) {
        match &self.gate {
            Some(g) => (g.scope.clone(), g.name.clone()),
            None => (String::new(), String::new()),
        }
    }

    fn what(&self) -> String {
        match &self.gate {
            Some(g) => format!("gate `{}`", g.qualified),
            None => format!("the run's end ({})", self.event.as_str()),
        }
    }

    /// The webhook's JSON body (and a command's stdin), masked.
    fn json(&self, link: Option<&str>) -> Json {
        let mut body = json!({
            "event": self.event.as_str(),
            "run": self.run,
            "workflow": self.workflow,
            "gate": self.gate.as_ref().map(|g| json!({
                "name": g.qualified,
                "scope": g.scope,
                "message": g.message,
                "files": g.files,
            })),
            "monitor_url": link,
            "commands": self.gate.as_ref().map(|g| json!({
                "approve": g.approve,
                "reject": g.reject,
            })),
            "status": self.status,
            "exit": self.exit.as_ref().map(|(name, code, message)| json!({
                "name": name,
                "code": code,
                "message": message,
            })),
        });
        crate::secrets::redact_json(&mut body);
        body
    }

    /// A title of one line, ASCII (it goes in a header).
    fn title(&self) -> String {
        match self.event {
            NotifyEvent::Gate => format!(
                "{}: gate {} waits",
                self.workflow,
                self.gate.as_ref().map_or("", |g| g.qualified.as_str())
            ),
            NotifyEvent::Finished => format!("{}: run finished", self.workflow),
            NotifyEvent::Failed => format!("{}: run failed", self.workflow),
            NotifyEvent::Cancelled => format!("{}: run cancelled", self.workflow),
        }
    }

    /// The text a person reads (ntfy's body, Slack's fallback `text`), masked.
    fn text(&self) -> String {
        let mut out = match &self.gate {
            Some(g) => format!(
                "Run {} of {} waits on gate {}: {}",
                self.run,
                self.workflow,
                g.qualified,
                g.message.trim()
            ),
            None => format!("Run {} of {} {}", self.run, self.workflow, self.status),
        };
        if let Some((name, code, message)) = &self.exit {
            out.push_str(&format!(": exit {name} ({code})"));
            if let Some(m) = message {
                out.push_str(&format!(", {m}"));
            }
        }
        if let Some(g) = &self.gate {
            for f in &g.files {
                out.push_str(&format!("\nsee: {f}"));
            }
            out.push_str(&format!("\napprove: {}\nreject: {}", g.approve, g.reject));
        }
        crate::secrets::redact(&out).into_owned()
    }

    /// Slack's incoming-webhook body: `text` (the fallback of notifications) and `blocks`
    /// in mrkdwn, masked.
    fn slack(&self, link: Option<&str>) -> Json {
        let esc = |s: &str| slack_escape(&crate::secrets::redact(s));
        let mut main = match &self.gate {
            Some(g) => format!(
                "*{}*\nRun `{}` waits on gate `{}`: {}",
                esc(&self.title()),
                esc(&self.run),
                esc(&g.qualified),
                esc(g.message.trim())
            ),
            None => format!(
                "*{}*\nRun `{}` {}",
                esc(&self.title()),
                esc(&self.run),
                self.status
            ),
        };
        if let Some((name, code, message)) = &self.exit {
            main.push_str(&format!("\nexit `{}` ({code})", esc(name)));
            if let Some(m) = message {
                main.push_str(&format!(": {}", esc(m)));
            }
        }
        // The link last, whole: a long message is cut before it, not the link.
        let link = link
            .map(|l| format!("\n<{}|Open the run in the monitor>", esc(l)))
            .unwrap_or_default();
        let main = cut_chars(main, SLACK_SECTION_MAX - link.chars().count()) + &link;
        let section =
            |text: String| json!({"type": "section", "text": {"type": "mrkdwn", "text": text}});
        let mut blocks = vec![section(main)];
        if let Some(g) = &self.gate {
            if !g.files.is_empty() {
                let files: Vec<String> =
                    g.files.iter().map(|f| format!("• `{}`", esc(f))).collect();
                blocks.push(section(cut_chars(
                    format!("Files to look at:\n{}", files.join("\n")),
                    SLACK_SECTION_MAX,
                )));
            }
            blocks.push(section(cut_chars(
                format!("```{}\n{}```", esc(&g.approve), esc(&g.reject)),
                SLACK_SECTION_MAX,
            )));
        }
        json!({"text": self.text(), "blocks": blocks})
    }
}

/// The most characters Slack takes in a section block's text: a longer one makes the whole
/// message refused (400 `invalid_blocks`; Block Kit's reference, "Section block").
const SLACK_SECTION_MAX: usize = 3000;

/// `s` cut to at most `max` characters, ending with `…` when it was cut.
fn cut_chars(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        return s;
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Escapes the three characters Slack's mrkdwn gives a meaning to (Slack's "Formatting text
/// for app surfaces": `&`, `<`, `>`).
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A header value: printable ASCII on one line (anything else becomes `?`).
fn header_value(s: &str) -> String {
    crate::secrets::redact(s)
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// An outcome as an event: scope, node, kind (`notified`, `notify-failed`), message.
pub(crate) type Outcome = (String, String, &'static str, String);

/// The kinds of the events that record a delivery's outcome.
pub(crate) const DELIVERED: &str = "notified";
pub(crate) const FAILED: &str = "notify-failed";

/// Whether an event's kind records a delivery's outcome.
pub(crate) fn is_delivery(kind: &str) -> bool {
    kind == DELIVERED || kind == FAILED
}

/// How one delivery ended.
#[derive(Debug)]
struct Delivered {
    target: String,
    announcement: String,
    place: (String, String),
    attempts: u32,
    /// `None`: delivered; else the last error.
    error: Option<String>,
}

/// The progress of a delivery under way, for the event that says it was abandoned.
#[derive(Debug, Default)]
struct Progress {
    attempts: u32,
    last_error: Option<String>,
    /// Between two attempts (the backoff).
    waiting: bool,
    done: bool,
}

/// A delivery under way.
struct Under {
    target: String,
    announcement: String,
    place: (String, String),
    progress: Arc<Mutex<Progress>>,
    task: tokio::task::JoinHandle<()>,
}

/// The run's notifiers and the deliveries under way.
pub(crate) struct Notifier {
    targets: Vec<Arc<Target>>,
    client: Option<reqwest::Client>,
    cwd: std::path::PathBuf,
    sender: mpsc::UnboundedSender<Delivered>,
    results: tokio::sync::Mutex<mpsc::UnboundedReceiver<Delivered>>,
    under: std::cell::RefCell<Vec<Under>>,
}

/// A warning about a notifier found at the run's start (a variable not set).
pub(crate) type Warning = String;

impl Notifier {
    /// The notifiers of the workflow and of the user's config, their variables read now
    /// and their secrets registered with the masker. A notifier whose URL variable is not
    /// set is left out, with a warning.
    pub(crate) fn new(
        workflow: &[Notify],
        user: &[Notify],
        cwd: &std::path::Path,
    ) -> (Option<Notifier>, Vec<Warning>) {
        let mut warnings = Vec::new();
        let mut targets = Vec::new();
        let all = workflow
            .iter()
            .map(|n| (n, ""))
            .chain(user.iter().map(|n| (n, " (user config)")));
        for (n, origin) in all {
            match target(n, origin) {
                Ok((t, mut notes)) => {
                    warnings.append(&mut notes);
                    targets.push(Arc::new(t));
                }
                Err(why) => warnings.push(why),
            }
        }
        if targets.is_empty() {
            return (None, warnings);
        }
        let client = if targets.iter().any(|t| t.kind != NotifyKind::Command) {
            match reqwest::Client::builder()
                .user_agent(concat!("ralph-flow/", env!("CARGO_PKG_VERSION")))
                .build()
            {
                Ok(c) => Some(c),
                Err(e) => {
                    warnings.push(format!(
                        "notifications over HTTP cannot be sent: {}",
                        crate::diag::error_chain(&e)
                    ));
                    None
                }
            }
        } else {
            None
        };
        let (sender, results) = mpsc::unbounded_channel();
        (
            Some(Notifier {
                targets,
                client,
                cwd: cwd.to_path_buf(),
                sender,
                results: tokio::sync::Mutex::new(results),
                under: std::cell::RefCell::default(),
            }),
            warnings,
        )
    }

    /// Whether some notifier announces `event`.
    pub(crate) fn wants(&self, event: NotifyEvent) -> bool {
        self.targets.iter().any(|t| t.on.contains(&event))
    }

    /// Starts delivering an announcement to every notifier that announces its event; never
    /// waits.
    pub(crate) fn announce(&self, a: &Announcement) {
        for t in self.targets.iter().filter(|t| t.on.contains(&a.event)) {
            let progress = Arc::new(Mutex::new(Progress::default()));
            let job = Job {
                target: t.clone(),
                announcement: a.clone(),
                client: self.client.clone(),
                cwd: self.cwd.clone(),
                progress: progress.clone(),
            };
            let sender = self.sender.clone();
            let place = a.place();
            let (label, what) = (t.label(), a.what());
            let (label2, what2, place2) = (label.clone(), what.clone(), place.clone());
            let task = tokio::spawn(async move {
                let (attempts, error) = job.deliver().await;
                let _ = sender.send(Delivered {
                    target: label2,
                    announcement: what2,
                    place: place2,
                    attempts,
                    error,
                });
            });
            let mut under = self.under.borrow_mut();
            under.retain(|u| !u.task.is_finished());
            under.push(Under {
                target: label,
                announcement: what,
                place,
                progress,
                task,
            });
        }
    }

    /// Waits for the next delivery's outcome and returns its event: (scope, node, kind,
    /// message).
    pub(crate) async fn next_outcome(&self) -> Option<Outcome> {
        let d = self.results.lock().await.recv().await?;
        Some(outcome_event(d))
    }

    /// The outcomes that came back already, as events.
    pub(crate) fn outcomes_now(&self) -> Vec<Outcome> {
        let Ok(mut rx) = self.results.try_lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while let Ok(d) = rx.try_recv() {
            out.push(outcome_event(d));
        }
        out
    }

    /// At the run's end: waits up to `grace` for the deliveries under way, returning their
    /// outcomes as events, then abandons those still under way (an event each).
    pub(crate) async fn drain(&self, grace: Duration) -> Vec<Outcome> {
        let deadline = tokio::time::Instant::now() + grace;
        let mut out = self.outcomes_now();
        loop {
            let pending = self
                .under
                .borrow()
                .iter()
                .filter(|u| !u.progress.lock().map(|p| p.done).unwrap_or(true))
                .count();
            if pending == 0 {
                break;
            }
            let mut rx = self.results.lock().await;
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(d)) => out.push(outcome_event(d)),
                Ok(None) | Err(_) => break,
            }
        }
        out.extend(self.outcomes_now());
        for u in self.under.borrow_mut().drain(..) {
            let (done, attempts, last, waiting) = match u.progress.lock() {
                Ok(p) => (p.done, p.attempts, p.last_error.clone(), p.waiting),
                Err(_) => (true, 0, None, false),
            };
            if done {
                continue;
            }
            u.task.abort();
            out.push((
                u.place.0,
                u.place.1,
                FAILED,
                format!(
                    "{} did not announce {}: abandoned {} after the run's end, {}{}",
                    u.target,
                    u.announcement,
                    crate::text::duration(grace),
                    if waiting {
                        format!(
                            "waiting to try again after {attempts} attempt{}",
                            if attempts == 1 { "" } else { "s" }
                        )
                    } else {
                        format!("in its attempt {attempts} (no answer yet)")
                    },
                    last.map(|e| format!("; the last error: {e}"))
                        .unwrap_or_default(),
                ),
            ));
        }
        out
    }
}

fn outcome_event(d: Delivered) -> Outcome {
    let s = if d.attempts == 1 { "" } else { "s" };
    match d.error {
        None => (
            d.place.0,
            d.place.1,
            DELIVERED,
            format!(
                "{} announced {} ({} attempt{s})",
                d.target, d.announcement, d.attempts
            ),
        ),
        Some(e) => (
            d.place.0,
            d.place.1,
            FAILED,
            format!(
                "{} could not announce {} after {} attempt{s}: {e}",
                d.target, d.announcement, d.attempts
            ),
        ),
    }
}

/// Resolves a notifier: its URL and headers from the environment (their values registered
/// as secrets), its defaults. `Err`: it cannot deliver anything (a warning).
fn target(n: &Notify, origin: &'static str) -> Result<(Target, Vec<Warning>), Warning> {
    use crate::secrets::{MIN_LEN, Registered, register_env};
    let label = format!("notifier `{}`{origin}", n.name.value);
    let mut notes = Vec::new();
    let url = match (&n.url, &n.url_env) {
        (Some(u), _) => u.value.clone(),
        (None, Some(var)) => {
            let registered = register_env(&var.value);
            match std::env::var(&var.value) {
                Ok(v) if !v.trim().is_empty() => {
                    if registered == Registered::Short {
                        notes.push(format!("the value of {} (the URL of {label}) is shorter than {MIN_LEN} characters: it is not masked", var.value));
                    }
                    v.trim().to_string()
                }
                _ => {
                    return Err(format!(
                        "{label} announces nothing: its `url_env` names {}, which is not set; set it to the URL",
                        var.value
                    ));
                }
            }
        }
        (None, None) => String::new(),
    };
    let mut headers = Vec::new();
    for (name, var) in &n.headers_env {
        let _ = register_env(&var.value);
        match std::env::var(&var.value) {
            Ok(v) => headers.push((name.value.clone(), v)),
            Err(_) => notes.push(format!(
                "{label} sends no `{}` header: {} is not set",
                name.value, var.value
            )),
        }
    }
    let retries = match n.retries.as_ref().map(|r| &r.value) {
        Some(Count::Literal(r)) => u32::try_from(*r).unwrap_or(u32::MAX).min(100),
        _ => DEFAULT_RETRIES,
    };
    let timeout = match n.timeout.as_ref().map(|t| &t.value) {
        Some(Dur::Literal(d) | Dur::Written(d, _)) => (*d).max(Duration::from_millis(1)),
        _ => DEFAULT_TIMEOUT,
    };
    let on = match &n.on {
        Some(on) => on.iter().map(|e| e.value).collect(),
        None => vec![NotifyEvent::Gate],
    };
    let monitor_url = n
        .monitor_url
        .as_ref()
        .map(|m| m.value.clone())
        .or_else(|| std::env::var(MONITOR_URL_ENV).ok())
        .map(|m| m.trim().trim_end_matches('/').to_string())
        .filter(|m| !m.is_empty());
    Ok((
        Target {
            name: n.name.value.clone(),
            origin,
            kind: n.kind.value,
            url,
            headers,
            argv: n
                .argv
                .as_ref()
                .map(|a| a.iter().map(|x| x.value.clone()).collect())
                .unwrap_or_default(),
            on,
            retries,
            timeout,
            monitor_url,
        },
        notes,
    ))
}

/// One announcement to one notifier.
struct Job {
    target: Arc<Target>,
    announcement: Announcement,
    client: Option<reqwest::Client>,
    cwd: std::path::PathBuf,
    progress: Arc<Mutex<Progress>>,
}

/// How one attempt failed.
struct Failure {
    message: String,
    /// Worth another attempt (a connection error, a timeout, 5xx, 408, 429).
    retry: bool,
    /// How long the receiver asked to wait (`Retry-After`).
    after: Option<Duration>,
}

impl Job {
    /// Delivers with retries; returns the attempts made and the last error, if it failed.
    async fn deliver(self) -> (u32, Option<String>) {
        let mut attempts = 0;
        let result = loop {
            attempts += 1;
            if let Ok(mut p) = self.progress.lock() {
                p.attempts = attempts;
                p.waiting = false;
            }
            let failure = match self.attempt().await {
                Ok(()) => break None,
                Err(f) => f,
            };
            let message = crate::secrets::redact(&failure.message).into_owned();
            if let Ok(mut p) = self.progress.lock() {
                p.attempts = attempts;
                p.last_error = Some(message.clone());
                p.waiting = true;
            }
            if !failure.retry {
                break Some(format!("{message} (not retried)"));
            }
            if attempts > self.target.retries {
                break Some(message);
            }
            let wait = failure
                .after
                .map(|a| a.min(MAX_RETRY_AFTER))
                .unwrap_or_else(|| super::policy::backoff_delay(FIRST_BACKOFF, attempts));
            tokio::time::sleep(wait).await;
        };
        if let Ok(mut p) = self.progress.lock() {
            p.attempts = attempts;
            p.done = true;
        }
        (attempts, result)
    }

    fn link(&self) -> Option<String> {
        self.target.monitor_url.as_ref().map(|base| {
            format!(
                "{base}/runs/{}",
                percent_encoding::utf8_percent_encode(
                    &self.announcement.run,
                    percent_encoding::NON_ALPHANUMERIC
                )
            )
        })
    }

    async fn attempt(&self) -> Result<(), Failure> {
        let t = &self.target;
        let link = self.link();
        let a = &self.announcement;
        match t.kind {
            NotifyKind::Command => self.run_command(a.json(link.as_deref())).await,
            NotifyKind::Webhook => {
                let body = a.json(link.as_deref());
                self.post(|r| r.json(&body)).await
            }
            NotifyKind::Slack => {
                let body = a.slack(link.as_deref());
                self.post(|r| r.json(&body)).await
            }
            NotifyKind::Ntfy => {
                let (tags, priority) = match a.event {
                    NotifyEvent::Gate => ("hourglass_flowing_sand", "high"),
                    NotifyEvent::Finished => ("white_check_mark", "default"),
                    NotifyEvent::Failed => ("x", "high"),
                    NotifyEvent::Cancelled => ("stop_sign", "default"),
                };
                let text = a.text();
                let title = header_value(&a.title());
                let link = link.map(|l| header_value(&l));
                self.post(|mut r| {
                    r = r
                        .header("Title", title.clone())
                        .header("Tags", tags)
                        .header("Priority", priority)
                        .header("Content-Type", "text/plain; charset=utf-8");
                    if let Some(l) = &link {
                        r = r
                            .header("Click", l.clone())
                            .header("Actions", format!("view, Open run, {l}"));
                    }
                    r.body(text.clone())
                })
                .await
            }
        }
    }

    /// POSTs to the notifier's URL.
    async fn post(
        &self,
        build: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<(), Failure> {
        let t = &self.target;
        let Some(client) = &self.client else {
            return Err(Failure {
                message: "no HTTP client could be made".into(),
                retry: false,
                after: None,
            });
        };
        let mut req = client.post(&t.url).timeout(t.timeout);
        for (name, value) in &t.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let resp = match build(req).send().await {
            Ok(r) => r,
            Err(e) => {
                let message = if e.is_timeout() {
                    format!("no answer within {}", crate::text::duration(t.timeout))
                } else if e.is_builder() {
                    return Err(Failure {
                        message: format!(
                            "the request cannot be made: {}",
                            crate::diag::error_chain(&e)
                        ),
                        retry: false,
                        after: None,
                    });
                } else {
                    format!(
                        "cannot reach the receiver: {}",
                        crate::diag::error_chain(&e)
                    )
                };
                return Err(Failure {
                    message,
                    retry: true,
                    after: None,
                });
            }
        };
        let status = resp.status();
        let after = crate::backend::http::retry_after(resp.headers(), SystemTime::now());
        // The body says why (Slack answers `no_service`, `invalid_payload`...); a timeout
        // while reading it is no answer.
        let body = match tokio::time::timeout(t.timeout, resp.text()).await {
            Ok(Ok(b)) => b,
            Ok(Err(_)) | Err(_) => String::new(),
        };
        if status.is_success() {
            return Ok(());
        }
        let code = status.as_u16();
        let mut body: String = body.trim().chars().take(300).collect();
        body = body.replace(['\n', '\r'], " ");
        let receiver = match t.kind {
            NotifyKind::Slack => "Slack",
            NotifyKind::Ntfy => "ntfy",
            _ => "the receiver",
        };
        Err(Failure {
            message: format!(
                "{receiver} answered {code}{}",
                if body.is_empty() {
                    String::new()
                } else {
                    format!(" {body}")
                }
            ),
            retry: status.is_server_error() || code == 408 || code == 429,
            after,
        })
    }

    /// Runs a command notifier: the JSON on stdin, the run, event and gate in its
    /// environment; a non-zero exit or a timeout is tried again.
    async fn run_command(&self, body: Json) -> Result<(), Failure> {
        use tokio::io::AsyncWriteExt;
        let t = &self.target;
        let a = &self.announcement;
        let Some((program, args)) = t.argv.split_first() else {
            return Err(Failure {
                message: "its argv is empty".into(),
                retry: false,
                after: None,
            });
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(&self.cwd)
            // Not `RALPH_FLOW_RUN`: that tags the run's own programs, which are stopped when
            // its body ends; a notifier goes on for its grace.
            .env("RALPH_FLOW_RUN_ID", &a.run)
            .env("RALPH_FLOW_EVENT", a.event.as_str())
            .env("RALPH_FLOW_WORKFLOW", &a.workflow)
            .env(
                "RALPH_FLOW_GATE",
                a.gate.as_ref().map_or("", |g| g.qualified.as_str()),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            // Its own process group: a Ctrl-C at the terminal stops the run, not the
            // announcement under way.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| Failure {
            message: format!("cannot start {}: {e}", crate::shell::quote(program)),
            retry: false,
            after: None,
        })?;
        let input = serde_json::to_vec(&body).unwrap_or_default();
        let run = async move {
            if let Some(mut stdin) = child.stdin.take() {
                // A program that does not read its stdin is no failure.
                let _ = stdin.write_all(&input).await;
                drop(stdin);
            }
            child.wait_with_output().await
        };
        match tokio::time::timeout(t.timeout, run).await {
            Err(_) => Err(Failure {
                message: format!(
                    "{} did not end within {}",
                    crate::shell::quote(program),
                    crate::text::duration(t.timeout)
                ),
                retry: true,
                after: None,
            }),
            Ok(Err(e)) => Err(Failure {
                message: format!(
                    "{} could not be waited for: {e}",
                    crate::shell::quote(program)
                ),
                retry: true,
                after: None,
            }),
            Ok(Ok(out)) if out.status.success() => Ok(()),
            Ok(Ok(out)) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                Err(Failure {
                    message: format!(
                        "{} exited with {}{}",
                        crate::shell::quote(program),
                        out.status
                            .code()
                            .map_or_else(|| "a signal".to_string(), |c| format!("code {c}")),
                        if tail.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", tail.join(" | "))
                        }
                    ),
                    retry: true,
                    after: None,
                })
            }
        }
    }
}

/// The event a run's end announces, if any: a run that took an exit of code 0 finished,
/// of another code failed; a cancelled one was cancelled; one that waits or was
/// interrupted is not over.
pub(crate) fn end_event(end: &super::RunEnd) -> Option<NotifyEvent> {
    match end {
        super::RunEnd::Exit { code: 0, .. } => Some(NotifyEvent::Finished),
        super::RunEnd::Exit { .. } => Some(NotifyEvent::Failed),
        super::RunEnd::Cancelled(_) => Some(NotifyEvent::Cancelled),
        super::RunEnd::Waiting(_) | super::RunEnd::Interrupted => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_text_escapes_what_mrkdwn_reads() {
        assert_eq!(slack_escape("a<b>&c"), "a&lt;b&gt;&amp;c");
    }

    #[test]
    fn header_values_are_one_line_of_ascii() {
        assert_eq!(header_value("gate é\nx"), "gate ??x");
    }

    #[test]
    fn a_slack_section_is_cut_to_what_slack_takes() {
        assert_eq!(cut_chars("abc".into(), 3), "abc");
        assert_eq!(cut_chars("abcd".into(), 3), "ab…");
        assert_eq!(cut_chars("ééé".into(), 2), "é…");
    }
}
