//! The headless-browser harness (tests/browser) against a real page: a tiny HTML page served
//! from this test, driven through chromedriver and Chromium. Skips (visibly) without them.

mod browser;

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use serde_json::json;

use browser::Browser;

/// A button whose click writes into the span 200 ms later, and an input to fill.
const PAGE: &str = r#"<!doctype html>
<html>
<head><meta charset="utf-8"><title>harness</title></head>
<body>
  <h1>Browser harness</h1>
  <input id="name" value="old">
  <button id="go" onclick="setTimeout(function () {
      document.getElementById('out').textContent =
        'hello ' + document.getElementById('name').value;
    }, 200)">Go</button>
  <span id="out">waiting</span>
  <a id="next" href="/next" data-role="nav">next</a>
</body>
</html>
"#;

/// Serves `PAGE` for every request on 127.0.0.1 (one thread per connection, `Connection:
/// close`); gives the page's address and a count of the requests answered.
fn serve_page() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("cannot bind the page's server: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("no address for the page's server: {e}"));
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let count = Arc::clone(&count);
            std::thread::spawn(move || answer(stream, &count));
        }
    });
    (format!("http://{addr}/"), served)
}

/// Reads one request's head (Chromium may also open a connection it never uses: the read
/// times out) and answers with the page.
fn answer(mut stream: TcpStream, served: &AtomicUsize) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{PAGE}",
        PAGE.len()
    );
    if stream.write_all(response.as_bytes()).is_ok() {
        served.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn drives_a_real_page() {
    let started = Instant::now();
    let Some(browser) = Browser::start().await else {
        return;
    };
    eprintln!("browser started in {:?}", started.elapsed());
    let (url, served) = serve_page();

    browser.goto(&url).await;
    assert_eq!(browser.current_url().await, url);
    browser
        .wait_until("the server answered", Duration::from_secs(5), || {
            served.load(Ordering::SeqCst) > 0
        })
        .await;
    assert_eq!(browser.text("h1").await, "Browser harness");
    assert!(browser.exists("#go").await);
    assert!(!browser.exists("#missing").await);
    assert_eq!(
        browser.attr("#next", "data-role").await.as_deref(),
        Some("nav")
    );
    assert_eq!(browser.attr("#next", "title").await, None);

    browser.fill("#name", "ralph").await;
    browser.click("#go").await;
    // The span changes 200 ms after the click: not yet, then within the wait.
    assert_eq!(browser.text("#out").await, "waiting");
    browser
        .wait_for_text("#out", "hello ralph", Duration::from_secs(5))
        .await;
    browser
        .wait_until("the span says hello", Duration::from_secs(1), async || {
            browser.text("#out").await == "hello ralph"
        })
        .await;

    let value = browser
        .execute(
            "return document.querySelector(arguments[0]).value;",
            vec![json!("#name")],
        )
        .await;
    assert_eq!(value, json!("ralph"));
    let size = browser
        .execute("return [window.outerWidth, window.outerHeight];", vec![])
        .await;
    assert_eq!(size, json!([browser::WINDOW.0, browser::WINDOW.1]));

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("no temp dir: {e}"));
    let shot = dir.path().join("page.png");
    browser.screenshot_png(&shot).await;
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("cannot read the screenshot: {e}"));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {:?}",
        &png[..png.len().min(16)]
    );

    // A wait that times out says what it waited for, where, and what the page showed. (The
    // panic hook is silenced meanwhile: this binary has no other test that could miss it.)
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let timed_out = AssertUnwindSafe(browser.wait_until(
        "the span says goodbye",
        Duration::from_millis(300),
        async || browser.text("#out").await.contains("goodbye"),
    ))
    .catch_unwind()
    .await;
    std::panic::set_hook(hook);
    let Err(panic) = timed_out else {
        panic!("wait_until did not time out");
    };
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_else(|| "(not a String)".to_string());
    assert!(message.contains("the span says goodbye"), "{message}");
    assert!(message.contains(&url), "{message}");
    assert!(message.contains("hello ralph"), "{message}");

    browser.click("#next").await;
    browser
        .wait_until(
            "the link was followed",
            Duration::from_secs(5),
            async || browser.current_url().await.ends_with("/next"),
        )
        .await;

    let closing = Instant::now();
    drop(browser);
    eprintln!("browser closed in {:?}", closing.elapsed());
}
