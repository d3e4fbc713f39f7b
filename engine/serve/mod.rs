//! `ralph-flow serve`: a live web monitor over the run store.
//!
//! One axum server, on a current-thread tokio runtime, serves server-rendered pages
//! (minijinja, autoescaped), a JSON API under `/api`, server-sent events and Prometheus
//! metrics. Everything it shows is read through the [`Store`] trait, so it works on any
//! store; the attempts' prompts and answers too where the store keeps them (PostgreSQL),
//! else from each run's `artifacts.jsonl` (`run::artifacts::records`).
//!
//! - [`auth`]: the access token (in the printed URL, then a cookie) and CSRF protection.
//! - [`host`]: the `Host` check in front of it (DNS-rebinding protection).
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
mod cache;
mod charts;
mod host;
pub mod layout;
mod metrics;
mod pages;
mod view;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use crate::store::OpenOptions;
use crate::store::{Location, Store, StoreError};

pub use auth::{MIN_TOKEN_LEN, WeakToken};

/// How the monitor is served.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where to listen, `HOST:PORT`: an IP address (`127.0.0.1:7700`, `[::1]:7700`) or a
    /// name (`localhost:7700`: every address it resolves to). Loopback unless `allow_remote`.
    pub addr: String,
    /// The store whose runs are shown (the state directory's SQLite file, or PostgreSQL).
    pub store: Location,
    /// Lets `addr` be an address other machines reach.
    pub allow_remote: bool,
    /// The access token; random when `None` (required with `allow_remote`). One given must
    /// pass [`WeakToken`]'s rules.
    pub token: Option<String>,
    /// Host names the monitor answers to besides loopback's, its addresses and `addr`'s name
    /// (`--allow-host`): what the `Host` check lets through.
    pub allowed_hosts: Vec<String>,
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
        "{name} resolves to {ip}, which is not a loopback address: the monitor shows every run's prompts and answers and can approve gates; pass --allow-remote (with a token in RALPH_FLOW_TOKEN) to serve other machines, or use localhost or 127.0.0.1"
    )]
    NameNotLoopback { name: String, ip: IpAddr },
    #[error(
        "--allow-remote needs an access token of your own of at least {MIN_TOKEN_LEN} characters in the RALPH_FLOW_TOKEN environment variable: make one with `export RALPH_FLOW_TOKEN=$(openssl rand -hex 16)`"
    )]
    NoToken,
    #[error(
        "the access token in RALPH_FLOW_TOKEN {weakness}: make a strong one with `export RALPH_FLOW_TOKEN=$(openssl rand -hex 16)`{}",
        random_hint(remote)
    )]
    WeakToken { weakness: WeakToken, remote: bool },
    #[error(
        "--addr {0:?} is not HOST:PORT: give an address or a name and a port (127.0.0.1:7700, localhost:7700, [::1]:7700)"
    )]
    Addr(String),
    #[error(
        "--allow-host {0:?} is not a host name: give the name alone, without scheme, port or path (--allow-host monitor.example.com)"
    )]
    AllowHost(String),
    #[error("cannot find the addresses of {addr} (check the name, or give an IP address)")]
    Resolve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
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

/// The end of a weak token's message: on loopback the monitor can make a token itself.
fn random_hint(remote: &bool) -> &'static str {
    if *remote {
        ""
    } else {
        ", or unset RALPH_FLOW_TOKEN and the monitor makes a random one"
    }
}

/// The shared state of the handlers.
pub(crate) struct Monitor {
    location: Location,
    /// The store, opened when it exists (a monitor may start before the first run).
    store: Mutex<Option<Box<dyn Store + Send>>>,
    token: auth::Token,
    /// The `Host` values answered.
    hosts: host::Hosts,
    /// Plans drawn, by workflow file, hash and params (plans do not change under a hash).
    drawings: Mutex<HashMap<String, Arc<layout::Drawing>>>,
    /// The monitor's copy of the runs it shows, brought up to date with what changed on each
    /// refresh ([`cache`]). Locked inside [`Monitor::with_store`]'s closure, never around it.
    copies: Mutex<cache::Copies>,
    /// Bumped when the store changes; the event streams wait on it.
    changed: tokio::sync::watch::Sender<u64>,
    pages: pages::Pages,
    /// The messages the monitor issued after an action (see [`Monitor::flash`]), newest last.
    flashes: Mutex<Flashes>,
}

/// The last messages issued, by number and run; a run's page shows one only by its number
/// and only for that run, so no text from the address ever reaches the page's banner.
#[derive(Default)]
struct Flashes {
    next: u64,
    /// (number, run id, text).
    kept: std::collections::VecDeque<(u64, String, String)>,
}

/// How many issued messages are kept (each is shown by the redirect right after its action).
const FLASHES_KEPT: usize = 64;

impl Monitor {
    /// Keeps a message the monitor issued about a run (the outcome of an approval, a
    /// rejection, a cancel) and returns the key the redirect carries (`?msg=KEY`).
    pub(crate) fn flash(&self, run: &str, text: String) -> String {
        let mut f = self
            .flashes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.next += 1;
        let key = f.next;
        f.kept.push_back((key, run.to_string(), text));
        while f.kept.len() > FLASHES_KEPT {
            f.kept.pop_front();
        }
        key.to_string()
    }

    /// The message issued under a key for this run; `None` for any other text or run.
    pub(crate) fn flashed(&self, run: &str, key: &str) -> Option<String> {
        let key: u64 = key.parse().ok()?;
        let f = self
            .flashes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.kept
            .iter()
            .find(|(k, r, _)| *k == key && r == run)
            .map(|(_, _, t)| t.clone())
    }

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
            *guard = Some(self.location.open(&OpenOptions::default())?);
        }
        match guard.as_mut() {
            Some(store) => f(store.as_mut()).map(Some),
            None => Ok(None),
        }
    }

    /// One run with everything its page shows, through the monitor's copy of it (what
    /// changed since the last refresh is read); `None` when there is no such run.
    fn run_detail(
        &self,
        store: &mut dyn Store,
        id: &str,
    ) -> Result<Option<view::RunDetail>, StoreError> {
        let mut copies = self
            .copies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        view::run_from(store, &mut copies, id)
    }

    /// A page of a stage's instances and its run, through the monitor's copy of the run;
    /// `None` when there is no such run.
    fn stage_page(
        &self,
        store: &mut dyn Store,
        id: &str,
        node: &str,
        page: usize,
        state: &str,
    ) -> Result<Option<(crate::store::RunRecord, view::StagePage)>, StoreError> {
        let records = {
            let mut copies = self
                .copies
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some(run) = store.run(id)? else {
                copies.forget(id);
                return Ok(None);
            };
            let records = copies.refresh(store, id, run.started_at, cache::Kinds::All)?;
            (run, records)
        };
        let (run, records) = records;
        let page = view::stage(store, &run, &records, node, page, state)?;
        Ok(Some((run, page)))
    }

    /// A run's events, through the monitor's copy of it; `None` when there is no such run.
    fn run_events(
        &self,
        store: &mut dyn Store,
        id: &str,
    ) -> Result<Option<std::sync::Arc<cache::Records>>, StoreError> {
        let mut copies = self
            .copies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(run) = store.run(id)? else {
            copies.forget(id);
            return Ok(None);
        };
        copies
            .refresh(store, id, run.started_at, cache::Kinds::Events)
            .map(Some)
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
    let (addrs, name) = listen_addresses(&opts.addr)?;
    // A name alone: one with a scheme, a port or a path would never equal a `Host`.
    let not_a_name = |h: &&String| h.is_empty() || h.contains(|c: char| !host::name_character(c));
    if let Some(bad) = opts.allowed_hosts.iter().find(not_a_name) {
        return Err(ServeError::AllowHost(bad.to_string()));
    }
    if !opts.allow_remote
        && let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback())
    {
        return Err(match &name {
            Some(name) => ServeError::NameNotLoopback {
                name: name.clone(),
                ip: a.ip(),
            },
            None => ServeError::NotLoopback(*a),
        });
    }
    // A token given is used only when it is strong enough, with or without --allow-remote:
    // one set on purpose and silently replaced (or kept weak) would surprise either way.
    let token = match &opts.token {
        Some(t) => match auth::weakness(t) {
            Some(weakness) => {
                return Err(ServeError::WeakToken {
                    weakness,
                    remote: opts.allow_remote,
                });
            }
            None => auth::Token::new(t.clone()),
        },
        None if opts.allow_remote => return Err(ServeError::NoToken),
        None => auth::Token::random().map_err(ServeError::Random)?,
    };
    // The same secrets as a run's: the environment's well-known ones and every agent kind's
    // key variables now, each run's own (`api_key_env`, `secrets`) when its plan is loaded.
    crate::secrets::register_well_known();
    for kind in crate::model::AgentKind::ALL {
        for var in crate::backend::key_variables(*kind) {
            crate::secrets::register_env(var);
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(async move {
        let listeners = bind_all(&addrs).await?;
        let Some(&(_, local)) = listeners.first() else {
            return Err(ServeError::Addr(opts.addr.clone()));
        };
        let mut names: Vec<String> = opts
            .allowed_hosts
            .iter()
            .map(|h| host::normal_name(h))
            .chain(name.clone())
            .collect();
        names.sort();
        names.dedup();
        let hosts = host::Hosts {
            remote: opts.allow_remote,
            bound: listeners.iter().map(|(_, a)| a.ip()).collect(),
            port: local.port(),
            names,
        };
        let (changed, _) = tokio::sync::watch::channel(0u64);
        let monitor = Arc::new(Monitor {
            location: opts.store.clone(),
            store: Mutex::new(None),
            token,
            hosts,
            drawings: Mutex::new(HashMap::new()),
            copies: Mutex::new(cache::Copies::default()),
            changed,
            pages: pages::Pages::new(),
            flashes: Mutex::new(Flashes::default()),
        });
        // The URL names the monitor as `--addr` did (a name, or the address listened on).
        let host = match &name {
            Some(name) => name.clone(),
            None if local.ip().is_unspecified() => "127.0.0.1".to_string(),
            None => local.ip().to_string(),
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
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = stop.send(true);
        });
        let app = router(monitor);
        let servers = listeners.into_iter().map(|(listener, _)| {
            let mut stopped = stopped.clone();
            axum::serve(listener, app.clone())
                .with_graceful_shutdown(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .into_future()
        });
        futures_util::future::try_join_all(servers)
            .await
            .map(|_| ())
            .map_err(ServeError::Server)
    })
}

/// The addresses `--addr` names, and the name it gave (`None` for an IP address).
/// `localhost` is 127.0.0.1 and `::1` without asking the resolver, as browsers take it
/// (RFC 6761): a resolver that says otherwise cannot move the monitor off loopback.
fn listen_addresses(addr: &str) -> Result<(Vec<SocketAddr>, Option<String>), ServeError> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok((vec![a], None));
    }
    let bad = || ServeError::Addr(addr.to_string());
    let (name, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    // An IPv6 address without its brackets, or one that did not parse.
    if name.is_empty() || name.contains([':', '[', ']', '/']) {
        return Err(bad());
    }
    let name = host::normal_name(name);
    if name == "localhost" {
        let found = vec![
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
        ];
        return Ok((found, Some(name)));
    }
    use std::net::ToSocketAddrs as _;
    let resolve_error = |source| ServeError::Resolve {
        addr: addr.to_string(),
        source,
    };
    let mut found: Vec<SocketAddr> = (name.as_str(), port)
        .to_socket_addrs()
        .map_err(resolve_error)?
        .collect();
    found.sort();
    found.dedup();
    if found.is_empty() {
        return Err(resolve_error(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the name has no address",
        )));
    }
    Ok((found, Some(name)))
}

/// Listens on every address, on one port: with port 0 the first address picks it and the
/// others take the same (tried again with another port, a few times, when that one is taken
/// on another address). An address this machine does not have (`::1` without IPv6) is
/// skipped while another is bound; one that is taken is an error, since a browser sent to
/// the name could reach whoever holds it, token and all.
async fn bind_all(
    addrs: &[SocketAddr],
) -> Result<Vec<(tokio::net::TcpListener, SocketAddr)>, ServeError> {
    let mut tries = if addrs.len() > 1 && addrs.iter().all(|a| a.port() == 0) {
        5
    } else {
        1
    };
    loop {
        tries -= 1;
        match bind_once(addrs).await {
            Err(ServeError::Bind { source, .. })
                if tries > 0 && source.kind() == std::io::ErrorKind::AddrInUse => {}
            other => return other,
        }
    }
}

async fn bind_once(
    addrs: &[SocketAddr],
) -> Result<Vec<(tokio::net::TcpListener, SocketAddr)>, ServeError> {
    let mut bound = Vec::new();
    let mut port = None;
    let mut missing = None;
    for &wanted in addrs {
        let addr = port.map_or(wanted, |p| SocketAddr::new(wanted.ip(), p));
        let bind_error = |source| ServeError::Bind { addr, source };
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                let local = listener.local_addr().map_err(bind_error)?;
                port.get_or_insert(local.port());
                bound.push((listener, local));
            }
            Err(e)
                if addrs.len() > 1
                    && (e.kind() == std::io::ErrorKind::AddrNotAvailable
                        || e.raw_os_error() == Some(nix::errno::Errno::EAFNOSUPPORT as i32)) =>
            {
                missing.get_or_insert(bind_error(e));
            }
            Err(e) => return Err(bind_error(e)),
        }
    }
    match missing {
        Some(e) if bound.is_empty() => Err(e),
        _ => Ok(bound),
    }
}

/// Every route, behind the `Host` check and the token check.
fn router(monitor: Arc<Monitor>) -> Router {
    Router::new()
        .route("/", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/runs/{id}/stage", get(pages::stage))
        .route("/runs/{id}/answer", post(pages::answer))
        .route("/runs/{id}/cancel", post(pages::cancel))
        .route("/live/runs", get(pages::runs_live))
        .route("/live/runs/{id}", get(pages::run_live))
        .route("/live/runs/{id}/stage", get(pages::stage_live))
        .route("/assets/{name}", get(pages::asset))
        .route("/api/runs", get(api::runs))
        .route("/api/runs/{id}", get(api::run))
        .route("/api/runs/{id}/events", get(api::events))
        .route("/api/runs/{id}/events/stream", get(api::event_stream))
        .route("/api/runs/{id}/artifacts", get(api::artifacts))
        .route("/api/runs/{id}/artifacts/{*path}", get(api::artifact))
        .route("/api/runs/{id}/gates/answer", post(api::answer))
        .route("/api/runs/{id}/cancel", post(api::cancel))
        .route("/api/changes", get(api::changes))
        .route("/metrics", get(metrics::metrics))
        .layer(axum::middleware::from_fn_with_state(
            monitor.clone(),
            auth::guard,
        ))
        // Outermost, so that a request for another host is refused before anything else.
        .layer(axum::middleware::from_fn_with_state(
            monitor.clone(),
            host::guard,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_takes_an_address_or_a_name_and_a_port() {
        let (addrs, name) = listen_addresses("127.0.0.1:7700").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            addrs,
            ["127.0.0.1:7700".parse().unwrap_or_else(|e| panic!("{e}"))]
        );
        assert_eq!(name, None);
        let (addrs, _) = listen_addresses("[::1]:0").unwrap_or_else(|e| panic!("{e}"));
        assert!(addrs[0].ip().is_loopback());
        // `localhost` is loopback without the resolver, in any case, with a trailing dot.
        let (addrs, name) = listen_addresses("LocalHost.:0").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(name.as_deref(), Some("localhost"));
        assert_eq!(addrs.len(), 2);
        assert!(addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 0));
        for bad in [
            "localhost",
            "::1:7700",
            ":7700",
            "localhost:http",
            "a/b:1",
            "[::1:7700",
        ] {
            assert!(
                matches!(listen_addresses(bad), Err(ServeError::Addr(_))),
                "{bad}"
            );
        }
    }
}
