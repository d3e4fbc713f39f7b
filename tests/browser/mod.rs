//! A headless Chromium for integration tests, driven over WebDriver (chromedriver + fantoccini).
//!
//! A test file says `mod browser;` and then, inside a tokio runtime:
//!
//! ```ignore
//! let Some(browser) = browser::Browser::start().await else { return }; // SKIPPED: printed
//! browser.goto(&url).await;
//! browser.fill("#name", "ralph").await;
//! browser.click("button").await;
//! browser.wait_for_text("#out", "hello ralph", Duration::from_secs(5)).await;
//! ```
//!
//! Without Debian's `chromium` and `chromium-driver` the start prints `SKIPPED: ...` and gives
//! `None`, unless `RALPH_FLOW_REQUIRE_BROWSER=1` (as CI sets it), when it panics instead. Every
//! helper panics with a message that names what it was doing: these are test helpers.
#![allow(dead_code)]

use std::fs::File;
use std::future::Future;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// The flags Chromium needs here: headless as root in a container whose network is closed
/// (without the background-networking ones it keeps trying to reach Google and misbehaves).
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
];

/// The window's outer size, as the flag above sets it. Headless Chromium still takes room for
/// its (invisible) tabs and toolbar from it: the page's viewport is 1280x757 (Chromium 156).
pub(crate) const WINDOW: (u32, u32) = (1280, 900);

/// How long chromedriver may take to answer `/status` after it was spawned.
const DRIVER_READY: Duration = Duration::from_secs(20);

/// How long a page load or a script may take before WebDriver gives up on it.
const PAGE_LOAD_MS: u64 = 30_000;

/// The environment variable that turns a missing browser from a skip into a failure.
const REQUIRE: &str = "RALPH_FLOW_REQUIRE_BROWSER";

/// A headless Chromium behind its own chromedriver, for one test. Dropping it ends the WebDriver
/// session (which quits the browser), kills chromedriver and removes the temporary profile.
pub(crate) struct Browser {
    client: Client,
    session_id: String,
    /// The browser's own process, as chromedriver reported it (killed if the session's end fails).
    browser_pid: Option<u32>,
    /// Declared last: dropped after the client, it kills chromedriver, then removes the profile.
    driver: Driver,
}

/// The chromedriver process and the temporary directory holding the profile and its log.
struct Driver {
    child: Child,
    port: u16,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// The last `max` bytes of chromedriver's (and Chromium's) output, for a failure message.
    fn log_tail(&self, max: usize) -> String {
        let log = std::fs::read(&self.log).unwrap_or_default();
        let log = String::from_utf8_lossy(&log[log.len().saturating_sub(max)..]).into_owned();
        if log.trim().is_empty() {
            "(chromedriver printed nothing)".to_string()
        } else {
            log
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Synchronous on purpose: a drop cannot await, and the runtime may be shutting down.
        let ended = delete_session(self.driver.port, &self.session_id);
        if !ended && let Some(pid) = self.browser_pid.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// `DELETE /session/{id}` over a plain socket; chromedriver answers once Chromium has quit.
fn delete_session(port: u16, session_id: &str) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let request = format!(
        "DELETE /session/{session_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    // chromedriver keeps the connection open after its answer: read only the status line.
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    while !answer.contains(&b'\n') {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    answer.starts_with(b"HTTP/1.1 200")
}

/// Gives up on a missing browser: a visible skip, or a panic under `RALPH_FLOW_REQUIRE_BROWSER=1`.
fn skip(why: &str) -> Option<Browser> {
    let message = format!("SKIPPED: {why} (install Debian's chromium and chromium-driver)");
    if std::env::var(REQUIRE).is_ok_and(|v| v == "1") {
        panic!("{message} [{REQUIRE}=1]");
    }
    let _ = writeln!(std::io::stderr(), "{message}");
    None
}

/// The first of `names` that is an executable file on PATH.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Chromium itself: Debian's real binary rather than its /usr/bin shell wrapper (which sources
/// /etc/chromium.d and adds flags of its own), else whatever Chromium or Chrome is on PATH.
fn find_chromium() -> Option<PathBuf> {
    let debian = Path::new("/usr/lib/chromium/chromium");
    if is_executable(debian) {
        return Some(debian.to_path_buf());
    }
    on_path(&[
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ])
}

/// A port that was free a moment ago on 127.0.0.1 (chromedriver binds it next).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("browser: cannot bind a loopback port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("browser: no local address for a loopback port: {e}"))
        .port()
}

/// Spawns chromedriver on a free port and waits until `/status` says it is ready. `None` when
/// it exited first (another process took the port in between), so the caller tries again.
async fn spawn_driver(chromedriver: &Path) -> Option<Driver> {
    let dir = tempfile::Builder::new()
        .prefix("ralph-flow-browser-")
        .tempdir()
        .unwrap_or_else(|e| panic!("browser: cannot make a temp dir: {e}"));
    let log = dir.path().join("chromedriver.log");
    let out = File::create(&log)
        .unwrap_or_else(|e| panic!("browser: cannot create {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("browser: cannot share {}: {e}", log.display()));
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("browser: cannot start {}: {e}", chromedriver.display()));
    let mut driver = Driver {
        child,
        port,
        log,
        dir,
    };
    let status = format!("http://127.0.0.1:{port}/status");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_else(|e| panic!("browser: cannot build an HTTP client: {e}"));
    let deadline = Instant::now() + DRIVER_READY;
    loop {
        if let Ok(Some(exit)) = driver.child.try_wait() {
            let _ = writeln!(
                std::io::stderr(),
                "browser: chromedriver on port {port} exited ({exit}) before it was ready:\n{}",
                driver.log_tail(2000)
            );
            return None;
        }
        if let Ok(answer) = http.get(&status).send().await
            && let Ok(body) = answer.json::<Value>().await
            && body["value"]["ready"] == json!(true)
        {
            return Some(driver);
        }
        if Instant::now() > deadline {
            panic!(
                "browser: chromedriver did not answer {status} within {DRIVER_READY:?}:\n{}",
                driver.log_tail(4000)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What [`Browser::wait_until`] polls: a closure that returns `bool` (`|| flag.load(..)`), or an
/// async one whose future does (`async || browser.exists("#done").await`). `M` only tells the
/// two apart ([`PlainClosure`] or [`AsyncClosure`]); callers never name it.
pub(crate) trait Condition<M> {
    /// Evaluates the condition once.
    fn check(&mut self) -> impl Future<Output = bool>;
}

/// Marks a [`Condition`] that is a plain closure returning `bool`.
pub(crate) enum PlainClosure {}

/// Marks a [`Condition`] that is an async closure returning `bool`.
pub(crate) enum AsyncClosure {}

impl<F: FnMut() -> bool> Condition<PlainClosure> for F {
    fn check(&mut self) -> impl Future<Output = bool> {
        std::future::ready(self())
    }
}

impl<F: AsyncFnMut() -> bool> Condition<AsyncClosure> for F {
    fn check(&mut self) -> impl Future<Output = bool> {
        self()
    }
}

impl Browser {
    /// Starts chromedriver on a free loopback port and opens a session in a headless Chromium
    /// (the flags above, a new empty profile, a 1280x900 window). `None`, after printing
    /// `SKIPPED: ...` to stderr, when chromedriver or Chromium is not installed; panics instead
    /// under `RALPH_FLOW_REQUIRE_BROWSER=1`, and always when they are there but fail to start.
    pub(crate) async fn start() -> Option<Browser> {
        let Some(chromedriver) = on_path(&["chromedriver"]) else {
            return skip("no chromedriver on PATH");
        };
        let Some(chromium) = find_chromium() else {
            return skip("no chromium (nor chromium-browser, google-chrome) on PATH");
        };
        let mut driver = None;
        for _attempt in 0..3 {
            driver = spawn_driver(&chromedriver).await;
            if driver.is_some() {
                break;
            }
        }
        let Some(driver) = driver else {
            panic!("browser: chromedriver exited before it was ready, three times (see above)");
        };

        let profile = driver.dir.path().join("profile");
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|f| f.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
            "timeouts": { "implicit": 0, "pageLoad": PAGE_LOAD_MS, "script": PAGE_LOAD_MS },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("json!({{..}}) is an object")
        };
        let url = format!("http://127.0.0.1:{}", driver.port);
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "browser: no session from chromedriver at {url} for {}: {e}\n{}",
                    chromium.display(),
                    driver.log_tail(4000)
                )
            });
        let (session_id, browser_pid) = match client.session_creation_response() {
            Some(created) => (
                created.session_id().to_string(),
                created
                    .capabilities()
                    .and_then(|c| c.get("goog:processID"))
                    .and_then(Value::as_u64)
                    .and_then(|p| u32::try_from(p).ok()),
            ),
            None => panic!("browser: chromedriver at {url} opened a session without an id"),
        };
        Some(Browser {
            client,
            session_id,
            browser_pid,
            driver,
        })
    }

    /// The fantoccini client, for anything the helpers here do not cover.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Opens `url` and waits for its load event.
    pub(crate) async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("browser: cannot open {url}: {e}"));
    }

    /// The address of the page shown now.
    pub(crate) async fn current_url(&self) -> String {
        self.client
            .current_url()
            .await
            .unwrap_or_else(|e| panic!("browser: no current URL: {e}"))
            .to_string()
    }

    /// The element that `css` matches first; panics, naming the page, when none does.
    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element,
            Err(e) => {
                let url = self.client.current_url().await.map(|u| u.to_string());
                let url = url.unwrap_or_else(|_| "?".to_string());
                panic!("browser: nothing matches `{css}` on {url}: {e}")
            }
        }
    }

    /// Does `act` on the first element that `css` matches, finding it again when the page
    /// replaced it in between (a live part is rendered again whenever the store changes, so
    /// an element found a moment ago may be gone): at most 10 times, then panics with `what`.
    async fn on_element<T>(
        &self,
        css: &str,
        what: &str,
        act: impl AsyncFn(fantoccini::elements::Element) -> Result<T, fantoccini::error::CmdError>,
    ) -> T {
        let mut tries = 0;
        loop {
            match act(self.find(css).await).await {
                Ok(v) => return v,
                Err(e) if tries < 10 && e.to_string().contains("stale element") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("browser: {what} `{css}`: {e}"),
            }
        }
    }

    /// The visible text of the first element that `css` matches (panics when none does).
    pub(crate) async fn text(&self, css: &str) -> String {
        self.on_element(css, "no text for", async |e| e.text().await)
            .await
    }

    /// Clicks the first element that `css` matches (panics when none does or it is not
    /// clickable, e.g. hidden or covered).
    pub(crate) async fn click(&self, css: &str) {
        self.on_element(css, "cannot click", async |e| e.click().await)
            .await;
    }

    /// Clears the first input or textarea that `css` matches and types `text` into it.
    pub(crate) async fn fill(&self, css: &str, text: &str) {
        self.on_element(css, "cannot type into", async |e| {
            e.clear().await?;
            e.send_keys(text).await
        })
        .await;
    }

    /// The attribute `name` of the first element that `css` matches; `None` when it has none.
    pub(crate) async fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.on_element(css, &format!("cannot read `{name}` of"), async |e| {
            e.attr(name).await
        })
        .await
    }

    /// Whether any element matches `css` now (no waiting).
    pub(crate) async fn exists(&self, css: &str) -> bool {
        !self
            .client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("browser: cannot look for `{css}`: {e}"))
            .is_empty()
    }

    /// Runs `js` as a function body in the page (`arguments[0]` .. are `args`) and gives back
    /// what it returns, as JSON.
    pub(crate) async fn execute(&self, js: &str, args: Vec<Value>) -> Value {
        self.client
            .execute(js, args)
            .await
            .unwrap_or_else(|e| panic!("browser: script failed: {e}\n{js}"))
    }

    /// Writes a PNG screenshot of the window to `path`.
    pub(crate) async fn screenshot_png(&self, path: impl AsRef<Path>) {
        let path = path.as_ref();
        let png = self
            .client
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("browser: no screenshot: {e}"));
        std::fs::write(path, png)
            .unwrap_or_else(|e| panic!("browser: cannot write {}: {e}", path.display()));
    }

    /// Polls `condition` every 100 ms until it holds. On `timeout`, panics with `desc`, the
    /// page's URL and the start of its text. `condition` is a closure returning `bool` or an
    /// async closure (`async || browser.exists("#x").await`).
    pub(crate) async fn wait_until<M>(
        &self,
        desc: &str,
        timeout: Duration,
        mut condition: impl Condition<M>,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            if condition.check().await {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "browser: timed out after {timeout:?} waiting until {desc}\n{}",
                    self.describe().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the first element that `css` matches contains `needle` in its visible text.
    pub(crate) async fn wait_for_text(&self, css: &str, needle: &str, timeout: Duration) {
        let desc = format!("`{css}` shows {needle:?}");
        self.wait_until(&desc, timeout, async || {
            let Ok(element) = self.client.find(Locator::Css(css)).await else {
                return false;
            };
            element.text().await.is_ok_and(|t| t.contains(needle))
        })
        .await;
    }

    /// The page's URL and the start of its visible text, for a failure message.
    async fn describe(&self) -> String {
        let url = match self.client.current_url().await {
            Ok(url) => url.to_string(),
            Err(e) => format!("(no URL: {e})"),
        };
        let text = match self
            .client
            .execute(
                "return document.body ? document.body.innerText : '';",
                vec![],
            )
            .await
        {
            Ok(Value::String(text)) => text,
            Ok(other) => other.to_string(),
            Err(e) => format!("(no text: {e})"),
        };
        let excerpt: String = text.chars().take(1500).collect();
        let more = if excerpt.len() < text.len() {
            "\n[...]"
        } else {
            ""
        };
        // When the page last fetched its live parts (app.js), and what the server gives
        // for the same parts now: tells a server that serves stale data from a page that
        // missed an update.
        let live = self
            .client
            .execute(
                "var r = document.body && document.body.dataset.refreshed; \
                 var urls = Array.prototype.map.call(document.querySelectorAll('[data-live]'), \
                   function (e) { return e.dataset.live; }); \
                 var ago = r ? (Date.now() - Number(r)) + ' ms ago' : 'never'; \
                 if (!urls.length) return 'no live parts'; \
                 return fetch(urls[0], {credentials: 'same-origin', cache: 'no-store'}) \
                   .then(function (x) { return x.text(); }) \
                   .then(function (t) { return 'last refreshed ' + ago + '; ' + urls[0] + \
                     ' now:\\n' + t.slice(0, 3000); });",
                vec![],
            )
            .await
            .map_or_else(
                |e| format!("(no live parts: {e})"),
                |v| match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
            );
        format!("page: {url}\ntext:\n{excerpt}{more}\n{live}")
    }
}
