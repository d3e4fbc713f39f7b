//! The JSON API under `/api`: the same data as the pages, for scripts. Documented in the
//! README's "Monitor" section.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::{Deserialize, Serialize};

use super::auth::{Authorized, csrf_ok};
use super::pages::{Failure, blocking, failure, store_failure};
use super::{Monitor, view};
use crate::diag::error_chain;

/// A JSON body, every secret masked.
pub(crate) fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_string(value) {
        Ok(text) => (
            [(header::CONTENT_TYPE, "application/json")],
            crate::secrets::redact(&text).into_owned(),
        )
            .into_response(),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()).into_response(),
    }
}

fn not_found(id: &str) -> Failure {
    failure(StatusCode::NOT_FOUND, &format!("there is no run `{id}`"))
}

/// `GET /api/runs`: every run, summarised, newest first.
pub(crate) async fn runs(State(m): State<Arc<Monitor>>) -> Response {
    match blocking(&m, |m| {
        m.with_store(view::runs)
            .map(Option::unwrap_or_default)
            .map_err(|e| store_failure(&e))
    })
    .await
    {
        Ok(runs) => json(&runs),
        Err(f) => f.into_response(),
    }
}

/// `GET /api/runs/ID`: a run with its settled stages, attempts, waiting gates, events and
/// the live state of each node.
pub(crate) async fn run(State(m): State<Arc<Monitor>>, Path(id): Path<String>) -> Response {
    match blocking(&m, move |m| {
        m.with_store(|s| m.run_detail(s, &id))
            .map_err(|e| store_failure(&e))?
            .flatten()
            .ok_or_else(|| not_found(&id))
    })
    .await
    {
        Ok(detail) => json(&detail),
        Err(f) => f.into_response(),
    }
}

#[derive(Deserialize, Default)]
pub(crate) struct EventsQuery {
    /// Skip this many events (the number already seen).
    #[serde(default)]
    since: usize,
}

/// The run's events, through the monitor's copy of the run (what changed since is read).
fn read_events(m: &Monitor, id: &str) -> Result<Arc<super::cache::Records>, Failure> {
    m.with_store(|s| m.run_events(s, id))
        .map_err(|e| store_failure(&e))?
        .flatten()
        .ok_or_else(|| not_found(id))
}

/// `GET /api/runs/ID/events[?since=N]`: the run's events in order.
pub(crate) async fn events(
    State(m): State<Arc<Monitor>>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
) -> Response {
    match blocking(&m, move |m| read_events(m, &id)).await {
        Ok(records) => json(&records.events.get(q.since..).unwrap_or_default()),
        Err(f) => f.into_response(),
    }
}

/// `GET /api/runs/ID/events/stream[?since=N]`: server-sent events, one `event` per run
/// event (its JSON as data, its index as id) as they happen; a reconnecting client resumes
/// after the last id it saw (`Last-Event-ID`).
pub(crate) async fn event_stream(
    State(m): State<Arc<Monitor>>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .map(|last| last + 1);
    let start = resume.unwrap_or(q.since);
    // The first read answers 404 for an unknown run, and is the stream's first batch.
    let first = {
        let id = id.clone();
        match blocking(&m, move |m| read_events(m, &id)).await {
            Ok(events) => events,
            Err(f) => return f.into_response(),
        }
    };
    let rx = m.changed.subscribe();
    let stream = futures_util::stream::unfold(
        (m, id, start, rx, Some(first)),
        |(m, id, mut sent, mut rx, mut read)| async move {
            loop {
                let events = match read.take() {
                    Some(events) => events,
                    None => {
                        rx.changed().await.ok()?;
                        let id = id.clone();
                        blocking(&m, move |m| read_events(m, &id)).await.ok()?
                    }
                };
                let events = &events.events;
                let new: Vec<SseEvent> = events
                    .iter()
                    .enumerate()
                    .skip(sent)
                    .map(|(i, e)| {
                        let data = serde_json::to_string(e).unwrap_or_default();
                        SseEvent::default()
                            .event("event")
                            .id(i.to_string())
                            .data(crate::secrets::redact(&data))
                    })
                    .collect();
                if !new.is_empty() {
                    sent = events.len();
                    let batch = futures_util::stream::iter(new.into_iter().map(Ok));
                    return Some((batch, (m, id, sent, rx, None)));
                }
            }
        },
    );
    use futures_util::StreamExt as _;
    sse(stream.flatten()).into_response()
}

fn sse<S: Stream<Item = Result<SseEvent, Infallible>> + Send + 'static>(
    stream: S,
) -> impl IntoResponse {
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `GET /api/changes`: server-sent events, a `change` each time the store changes (the
/// pages refresh on it).
pub(crate) async fn changes(State(m): State<Arc<Monitor>>) -> Response {
    let rx = m.changed.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let v = *rx.borrow_and_update();
        Some((
            Ok(SseEvent::default().event("change").data(v.to_string())),
            rx,
        ))
    });
    sse(stream).into_response()
}

/// `GET /api/runs/ID/artifacts`: the paths of the run's attempt records.
pub(crate) async fn artifacts(State(m): State<Arc<Monitor>>, Path(id): Path<String>) -> Response {
    match blocking(&m, move |m| records(m, &id)).await {
        Ok(records) => json(&records.keys().collect::<Vec<_>>()),
        Err(f) => f.into_response(),
    }
}

fn records(m: &Monitor, id: &str) -> Result<std::collections::BTreeMap<String, String>, Failure> {
    // From the store where it keeps them (any machine), else the run's `artifacts.jsonl`.
    m.with_store(|s| {
        Ok(s.run(id)?
            .map(|run| crate::run::artifacts::records(&*s, &run, "")))
    })
    .map_err(|e| store_failure(&e))?
    .flatten()
    .ok_or_else(|| not_found(id))?
    .map_err(|e| {
        failure(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("cannot read the run's records: {}", error_chain(&e)),
        )
    })
}

/// `GET /api/runs/ID/artifacts/PATH`: one record's text.
pub(crate) async fn artifact(
    State(m): State<Arc<Monitor>>,
    Path((id, path)): Path<(String, String)>,
) -> Response {
    match blocking(&m, move |m| records(m, &id)).await {
        Ok(records) => match records.get(&path) {
            Some(text) => (
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                crate::secrets::redact(text).into_owned(),
            )
                .into_response(),
            None => failure(StatusCode::NOT_FOUND, &format!("no record `{path}`")).into_response(),
        },
        Err(f) => f.into_response(),
    }
}

#[derive(Deserialize)]
pub(crate) struct AnswerBody {
    /// The gate, `SCOPE/GATE` or a bare id.
    gate: String,
    approve: bool,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

/// `POST /api/runs/ID/gates/answer` with `{"gate", "approve", "comment"}`: what `approve`
/// and `reject` do. With the cookie (a browser), it needs the page's `X-CSRF-Token`.
pub(crate) async fn answer(
    State(m): State<Arc<Monitor>>,
    Extension(how): Extension<Authorized>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<AnswerBody>,
) -> Response {
    if let Some(refused) = csrf_refused(&m, how, &headers) {
        return refused;
    }
    let result = blocking(&m, move |m| {
        let by = body.by.clone().unwrap_or_else(super::pages::by);
        Ok(m.with_store(|s| {
            Ok(crate::run::answer::answer(
                s,
                &id,
                &body.gate,
                body.approve,
                body.comment.clone(),
                &by,
            ))
        }))
    })
    .await;
    match result {
        Ok(Ok(Some(Ok(a)))) => {
            m.touch();
            json(&serde_json::json!({
                "answered": a.gate.qualified(),
                "approval": a.approval,
                "run_running": a.run_running,
                // What happens to the run now (`picks_up`, `requeued`, `queued`, `resume`),
                // and the monitor's and `approve`'s words for it.
                "next": a.next,
                "next_text": a.next.text(&a.approval.run),
            }))
        }
        Ok(Ok(Some(Err(e)))) => {
            let status = match e {
                crate::run::answer::AnswerError::NoRun(_) => StatusCode::NOT_FOUND,
                crate::run::answer::AnswerError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::CONFLICT,
            };
            failure(status, &error_chain(&e)).into_response()
        }
        Ok(Ok(None)) => failure(StatusCode::NOT_FOUND, "there is no run store yet").into_response(),
        Ok(Err(e)) => store_failure(&e).into_response(),
        Err(f) => f.into_response(),
    }
}

/// The refusal of a write that a browser sent without the pages' `X-CSRF-Token` (a script
/// with the bearer token needs none); `None` when it may go on.
fn csrf_refused(m: &Monitor, how: Authorized, headers: &HeaderMap) -> Option<Response> {
    let given = headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
    (!csrf_ok(m, how, given)).then(|| {
        failure(
            StatusCode::FORBIDDEN,
            "refused: send the X-CSRF-Token of the pages, or authorize with Authorization: Bearer",
        )
        .into_response()
    })
}

#[derive(Deserialize)]
pub(crate) struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

/// `POST /api/runs/ID/cancel` with `{"reason", "by"}` (both optional): what `ralph-flow
/// cancel` does. With the cookie (a browser), it needs the page's `X-CSRF-Token`, as an
/// answer does. 409 for a run that ended or was cancelled already.
pub(crate) async fn cancel(
    State(m): State<Arc<Monitor>>,
    Extension(how): Extension<Authorized>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<CancelBody>,
) -> Response {
    use crate::run::cancel::CancelError;
    if let Some(refused) = csrf_refused(&m, how, &headers) {
        return refused;
    }
    let result = blocking(&m, move |m| {
        let by = body.by.clone().unwrap_or_else(super::pages::by);
        Ok(m.with_store(|s| Ok(crate::run::cancel::cancel(s, &id, body.reason.clone(), &by))))
    })
    .await;
    match result {
        Ok(Ok(Some(Ok(c)))) => {
            m.touch();
            json(&serde_json::json!({
                "cancelled": c.run,
                "was": c.was,
                "cancellation": c.cancellation,
                // What happens to the run now, in `cancel`'s words.
                "next_text": c.next(),
            }))
        }
        Ok(Ok(Some(Err(e)))) => {
            let status = match e {
                CancelError::NoRun(_) => StatusCode::NOT_FOUND,
                CancelError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
                CancelError::Refused(_) => StatusCode::CONFLICT,
            };
            failure(status, &error_chain(&e)).into_response()
        }
        Ok(Ok(None)) => failure(StatusCode::NOT_FOUND, "there is no run store yet").into_response(),
        Ok(Err(e)) => store_failure(&e).into_response(),
        Err(f) => f.into_response(),
    }
}
