//! `ralph-flow serve`: a live web monitor over the run store.
//!
//! One axum server, on a current-thread tokio runtime, serves server-rendered pages
//! (minijinja, autoescaped), a JSON API under `/api`, server-sent events and Prometheus
//! metrics. Everything it shows is read through the [`Store`] trait, so it works on any
//! store; the attempts' prompts and answers come from each run's `artifacts.jsonl`.
//!
//! - [`auth`]: the access token (in the printed URL, then a cookie) and CSRF protection.
//! - [`view`]: what the store says about runs and stages, shaped for pages and the API.
//! - [`layout`]: the plan drawn as SVG, laid out here (no Graphviz), coloured by live state.
//! - [`pages`], [`api`], [`metrics`]: the handlers.
//!
//! Every body it sends goes through [`crate::secrets::redact`], the masker the runs use,
//! with the same secrets registered (the environment's well-known ones, every agent kind's
//! key variables, and each run's `api_key_env` and `secrets` once its plan is loaded), so no
//! key reaches a page.

mod api;
mod auth;
mod charts;
pub mod layout;
mod metrics;
mod pages;
mod view;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use crate::store::sqlite::Durability;
use crate::store::{Location, Store, StoreError};

/// How the monitor is served.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where to listen. Loopback unless `allow_remote`.
    pub addr: SocketAddr,
    /// The store whose runs are shown (the state directory's SQLite file, or PostgreSQL).
    pub store: Location,
    /// Lets `addr` be an address other machines reach.
    pub allow_remote: bool,
    /// The access token; random when `None` (required with `allow_remote`).
    pub token: Option<String>,
    /// How often the store is asked whether something changed.
    pub poll: Duration,
}

/// Why the monitor cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "{0} is not a loopback address: the monitor shows every run's prompts and answers and can approve gates; pass --allow-remote (with a token in RALPH_FLOW_TOKEN) to serve other machines"
    )]
    NotLoopback(SocketAddr),
    #[error(
        "--allow-remote needs an access token of at least 16 characters in the RALPH_FLOW_TOKEN environment variable"
    )]
    NoToken,
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make an access token")]
    Random(#[source] getrandom::Error),
    #[error("cannot start the server's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("the server stopped")]
    Server(#[source] std::io::Error),
}

/// The shared state of the handlers.
pub(crate) struct Monitor {
    location: Location,
    /// The store, opened when it exists (a monitor may start before the first run).
    store: Mutex<Option<Box<dyn Store + Send>>>,
    token: auth::Token,
    /// Plans drawn, by workflow file, hash and params (plans do not change under a hash).
    drawings: Mutex<HashMap<String, Arc<layout::Drawing>>>,
    /// Bumped when the store changes; the event streams wait on it.
    changed: tokio::sync::watch::Sender<u64>,
    pages: pages::Pages,
}

impl Monitor {
    /// Runs `f` with the store, opening it first if needed. `None` when there is no store
    /// yet (no run has started in this state directory).
    pub(crate) fn with_store<T>(
        &self,
        f: impl FnOnce(&mut dyn Store) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let mut guard = self
            .store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.is_none() {
            if !self.location.exists() {
                return Ok(None);
            }
            *guard = Some(self.location.open(Durability::Normal)?);
        }
        match guard.as_mut() {
            Some(store) => f(store.as_mut()).map(Some),
            None => Ok(None),
        }
    }

    /// Tells the event streams that something changed (after an answer given here: the
    /// store does not count this process's own commits as changes).
    pub(crate) fn touch(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// The store shown.
    pub(crate) fn location(&self) -> &Location {
        &self.location
    }
}

/// Serves the monitor until Ctrl-C. `ready` is called with the URL to open (with its token)
/// once the server listens.
pub fn serve(opts: Options, ready: impl FnOnce(&str)) -> Result<(), ServeError> {
    let token = match (&opts.token, opts.allow_remote) {
        (Some(t), _) if t.len() >= 16 => auth::Token::new(t.clone()),
        (_, true) => return Err(ServeError::NoToken),
        (Some(_), false) | (None, false) => auth::Token::random().map_err(ServeError::Random)?,
    };
    if !opts.allow_remote && !opts.addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(opts.addr));
    }
    // The same secrets as a run's: the environment's well-known ones and every agent kind's
    // key variables now, each run's own (`api_key_env`, `secrets`) when its plan is loaded.
    crate::secrets::register_well_known();
    for kind in crate::spec::AGENT_KINDS {
        for var in crate::secrets::agent_key_variables(kind) {
            crate::secrets::register_env(var);
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: opts.addr,
                source,
            })?;
        let local = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: opts.addr,
            source,
        })?;
        let (changed, _) = tokio::sync::watch::channel(0u64);
        let monitor = Arc::new(Monitor {
            location: opts.store.clone(),
            store: Mutex::new(None),
            token,
            drawings: Mutex::new(HashMap::new()),
            changed,
            pages: pages::Pages::new(),
        });
        let host = if local.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            local.ip().to_string()
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        ready(&format!(
            "http://{host}:{}/?token={}",
            local.port(),
            monitor.token.secret()
        ));
        tokio::spawn(watch_store(monitor.clone(), opts.poll));
        axum::serve(listener, router(monitor))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(ServeError::Server)
    })
}

/// Every route, behind the token check.
fn router(monitor: Arc<Monitor>) -> Router {
    Router::new()
        .route("/", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/runs/{id}/stage", get(pages::stage))
        .route("/runs/{id}/answer", post(pages::answer))
        .route("/live/runs", get(pages::runs_live))
        .route("/live/runs/{id}", get(pages::run_live))
        .route("/assets/{name}", get(pages::asset))
        .route("/api/runs", get(api::runs))
        .route("/api/runs/{id}", get(api::run))
        .route("/api/runs/{id}/events", get(api::events))
        .route("/api/runs/{id}/events/stream", get(api::event_stream))
        .route("/api/runs/{id}/artifacts", get(api::artifacts))
        .route("/api/runs/{id}/artifacts/{*path}", get(api::artifact))
        .route("/api/runs/{id}/gates/answer", post(api::answer))
        .route("/api/changes", get(api::changes))
        .route("/metrics", get(metrics::metrics))
        .layer(axum::middleware::from_fn_with_state(
            monitor.clone(),
            auth::guard,
        ))
        .with_state(monitor)
}

/// Polls the store for changes made by other processes and wakes the event streams.
async fn watch_store(monitor: Arc<Monitor>, poll: Duration) {
    let mut last = None;
    loop {
        let m = monitor.clone();
        let now = tokio::task::spawn_blocking(move || m.with_store(|s| s.changes()))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        if now.is_some() && now != last {
            last = now;
            monitor.touch();
        }
        tokio::time::sleep(poll).await;
    }
}
