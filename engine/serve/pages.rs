//! The HTML pages: server-rendered with minijinja (every value escaped), refreshed in place
//! by `assets/app.js` when the server's event stream says that the store changed: each part
//! of a page marked `data-live` is fetched again from `/live/...` and replaced only when it
//! differs (so a comment being typed in a gate's box stays while other parts change).

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use minijinja::value::Serde;
use minijinja::{Environment, context};
use serde::Deserialize;

use super::auth::{Authorized, csrf_ok};
use super::layout::{Drawing, svg};
use super::{Monitor, charts, view};
use crate::diag::error_chain;
use crate::store::{RunRecord, StoreError};

/// The page templates, compiled once.
pub(crate) struct Pages {
    env: Environment<'static>,
}

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("assets/base.html")),
    ("runs.html", include_str!("assets/runs.html")),
    ("runs_table.html", include_str!("assets/runs_table.html")),
    ("run.html", include_str!("assets/run.html")),
    ("run_parts.html", include_str!("assets/run_parts.html")),
    ("stage.html", include_str!("assets/stage.html")),
    ("stage_parts.html", include_str!("assets/stage_parts.html")),
];

/// The pages' template environment: the filters and every template, with the templates
/// that do not compile.
fn environment() -> (Environment<'static>, Vec<(&'static str, minijinja::Error)>) {
    let mut env = Environment::new();
    env.add_filter("time", |ms: i64| {
        crate::store::rfc3339(ms)
            .get(11..19)
            .unwrap_or_default()
            .to_string()
    });
    env.add_filter("urlencode", |s: &str| super::layout::url_part(s));
    let mut broken = Vec::new();
    for (name, source) in TEMPLATES {
        if let Err(e) = env.add_template(name, source) {
            broken.push((*name, e));
        }
    }
    (env, broken)
}

impl Pages {
    pub(crate) fn new() -> Pages {
        let (env, broken) = environment();
        for (name, e) in broken {
            // The templates are part of the binary; a test compiles each.
            tracing::error!("monitor template {name}: {e}");
        }
        Pages { env }
    }

    /// Renders a template; every secret masked.
    pub(crate) fn render(&self, name: &str, ctx: minijinja::Value) -> Response {
        match self.env.get_template(name).and_then(|t| t.render(ctx)) {
            Ok(html) => Html(crate::secrets::redact(&html).into_owned()).into_response(),
            Err(e) => failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot render {name}: {e}"),
            )
            .into_response(),
        }
    }
}

/// A request that cannot be served: its status and what to say (as plain text).
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    text: String,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{}\n", crate::secrets::redact(&self.text)),
        )
            .into_response()
    }
}

/// A plain-text error page.
pub(crate) fn failure(status: StatusCode, text: &str) -> Failure {
    Failure {
        status,
        text: text.to_string(),
    }
}

/// A store that cannot be read.
pub(crate) fn store_failure(e: &StoreError) -> Failure {
    failure(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("cannot read the run store: {}", error_chain(e)),
    )
}

/// Runs `f` on the blocking pool with the monitor (store reads and plan loading block).
pub(crate) async fn blocking<T: Send + 'static>(
    m: &Arc<Monitor>,
    f: impl FnOnce(&Monitor) -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    let m = m.clone();
    tokio::task::spawn_blocking(move || f(&m))
        .await
        .unwrap_or_else(|e| {
            Err(failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("the request failed: {e}"),
            ))
        })
}

fn no_run(id: &str) -> Failure {
    failure(StatusCode::NOT_FOUND, &format!("there is no run `{id}`"))
}

#[derive(Deserialize, Default)]
pub(crate) struct RunsQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    state: String,
}

fn filtered(runs: Vec<view::RunSummary>, q: &RunsQuery) -> Vec<view::RunSummary> {
    let needle = q.q.trim().to_lowercase();
    runs.into_iter()
        .filter(|r| q.state.is_empty() || r.state == q.state)
        .filter(|r| {
            needle.is_empty()
                || format!("{} {} {}", r.id, r.workflow, r.file)
                    .to_lowercase()
                    .contains(&needle)
        })
        .collect()
}

fn runs_or_none(m: &Monitor) -> Result<Vec<view::RunSummary>, Failure> {
    m.with_store(view::runs)
        .map(Option::unwrap_or_default)
        .map_err(|e| store_failure(&e))
}

/// `/`: every run.
pub(crate) async fn runs(State(m): State<Arc<Monitor>>, Query(q): Query<RunsQuery>) -> Response {
    let runs = match blocking(&m, runs_or_none).await {
        Ok(r) => r,
        Err(f) => return f.into_response(),
    };
    let total = runs.len();
    let runs = filtered(runs, &q);
    m.pages.render(
        "runs.html",
        context! {
            runs => Serde(&runs), total, q => q.q, state => q.state,
            state_dir => m.location().to_string(),
            states => ["queued", "running", "waiting", "interrupted", "orphaned", "finished",
                       "cancelled"],
        },
    )
}

/// `/live/runs`: the runs table alone.
pub(crate) async fn runs_live(
    State(m): State<Arc<Monitor>>,
    Query(q): Query<RunsQuery>,
) -> Response {
    match blocking(&m, runs_or_none).await {
        Ok(runs) => {
            let total = runs.len();
            let runs = filtered(runs, &q);
            m.pages.render(
                "runs_table.html",
                context! { runs => Serde(&runs), total, fragment => true },
            )
        }
        Err(f) => f.into_response(),
    }
}

/// Where a run's workflow file is: as given to `run`, else relative to the project (the
/// state directory's parent).
fn workflow_path(m: &Monitor, file: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(file);
    if p.is_absolute() || p.exists() {
        return p.to_path_buf();
    }
    let Some(state_dir) = m.location().state_dir() else {
        return p.to_path_buf();
    };
    match state_dir.parent() {
        Some(project) if project.join(p).exists() => project.join(p),
        _ => p.to_path_buf(),
    }
}

impl Monitor {
    /// The run's plan, laid out (cached by file, hash and params). Loading it registers its
    /// agents' key variables as secrets.
    pub(crate) fn drawing(&self, run: &RunRecord) -> Arc<Drawing> {
        let key = format!("{}\0{}\0{}", run.file, run.workflow_hash, run.params);
        let cached = self
            .drawings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(d) = cached {
            return d;
        }
        let sets = run.param_sets();
        let path = workflow_path(self, &run.file);
        let drawing = match crate::prepare::prepare(&path, &sets) {
            Ok(prepared) => {
                crate::run::register_secrets(&prepared);
                let mut d = super::layout::draw(&prepared.plan);
                if prepared.hash != run.workflow_hash {
                    d.note = Some(format!(
                        "{} changed since this run started: the plan drawn is the file as it is now",
                        run.file
                    ));
                }
                d
            }
            Err(e) => Drawing {
                note: Some(format!(
                    "cannot draw the plan: {} does not load ({})",
                    path.display(),
                    e.render().lines().next().unwrap_or("errors")
                )),
                ..Drawing::default()
            },
        };
        let d = Arc::new(drawing);
        self.drawings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, d.clone());
        d
    }
}

/// A run and its drawing, read on the blocking pool.
async fn detail(m: &Arc<Monitor>, id: String) -> Result<(view::RunDetail, Arc<Drawing>), Failure> {
    blocking(m, move |m| {
        let detail = m
            .with_store(|s| m.run_detail(s, &id))
            .map_err(|e| store_failure(&e))?
            .flatten()
            .ok_or_else(|| no_run(&id))?;
        let drawing = m.drawing(&detail.record);
        Ok((detail, drawing))
    })
    .await
}

/// Every part of the run page that refreshes, rendered. The templates get only what they
/// read (`run.gates` of the run's records, not its nodes and attempts, which the charts have
/// drawn already): each value given is converted for them on every refresh.
fn parts(m: &Monitor, run: &view::RunDetail, drawing: &Drawing) -> minijinja::Value {
    let events: Vec<&crate::store::Event> = run.events().iter().rev().take(200).collect();
    context! {
        run => context! { gates => minijinja::Value::from(Serde(&run.gates)) },
        s => minijinja::Value::from(Serde(&run.summary)),
        graph => minijinja::Value::from_safe_string(svg(drawing, Some(&run.summary.id), &run.live)),
        note => drawing.note.clone(),
        timeline => minijinja::Value::from_safe_string(charts::timeline(run)),
        usage => minijinja::Value::from_safe_string(charts::usage(run)),
        events => minijinja::Value::from(Serde(&events)),
        event_count => run.events().len(),
        csrf => m.token.csrf(),
    }
}

#[derive(Deserialize, Default)]
pub(crate) struct RunQuery {
    #[serde(default)]
    msg: Option<String>,
}

/// `/runs/ID`: one run, live.
pub(crate) async fn run(
    State(m): State<Arc<Monitor>>,
    Path(id): Path<String>,
    Query(q): Query<RunQuery>,
) -> Response {
    // Only a message the monitor issued itself, about this run: the address's text never
    // reaches the page.
    let msg = q.msg.as_deref().and_then(|k| m.flashed(&id, k));
    let (run, drawing) = match detail(&m, id).await {
        Ok(d) => d,
        Err(f) => return f.into_response(),
    };
    let ctx = parts(&m, &run, &drawing);
    m.pages.render("run.html", context! { msg => msg, ..ctx })
}

/// The parts of the run page that refresh.
const PARTS: &[&str] = &["summary", "gates", "graph", "timeline", "usage", "events"];

/// `/live/runs/ID`: every refreshing part of the run page, rendered, as a JSON object by
/// part name (one read of the store for all of them).
pub(crate) async fn run_live(State(m): State<Arc<Monitor>>, Path(id): Path<String>) -> Response {
    let (run, drawing) = match detail(&m, id).await {
        Ok(d) => d,
        Err(f) => return f.into_response(),
    };
    let ctx = parts(&m, &run, &drawing);
    let Ok(template) = m.pages.env.get_template("run_parts.html") else {
        return failure(StatusCode::INTERNAL_SERVER_ERROR, "no run_parts.html").into_response();
    };
    let mut out = serde_json::Map::new();
    for part in PARTS {
        match template.render(context! { part => *part, ..ctx.clone() }) {
            Ok(html) => {
                out.insert((*part).to_string(), serde_json::Value::String(html));
            }
            Err(e) => {
                return failure(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot render {part}: {e}"),
                )
                .into_response();
            }
        }
    }
    super::api::json(&out)
}

#[derive(Deserialize)]
pub(crate) struct StageQuery {
    node: String,
    /// The page, from 1.
    #[serde(default)]
    page: Option<String>,
    /// Only instances in this state (one of [`view::INSTANCE_STATES`]).
    #[serde(default)]
    state: String,
}

/// A link of the stage page's state filter.
#[derive(serde::Serialize)]
struct StateLink {
    state: &'static str,
    label: &'static str,
    count: usize,
    href: String,
    on: bool,
}

/// The stage page's address with these page and state (`/runs/ID/stage?node=N&state=S&page=P`).
fn stage_href(id: &str, node: &str, state: &str, page: usize) -> String {
    let mut href = format!(
        "/runs/{}/stage?node={}",
        super::layout::url_part(id),
        super::layout::url_part(node)
    );
    if !state.is_empty() {
        href.push_str(&format!("&state={}", super::layout::url_part(state)));
    }
    if page > 1 {
        href.push_str(&format!("&page={page}"));
    }
    href
}

/// A stage page's query checked: its page number and state, or what is wrong.
fn stage_query(q: &StageQuery) -> Result<usize, Failure> {
    if !q.state.is_empty() && !view::INSTANCE_STATES.contains(&q.state.as_str()) {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            &format!(
                "unknown state `{}`: filter by one of {}, or leave state out for every instance",
                q.state,
                view::INSTANCE_STATES.join(", ")
            ),
        ));
    }
    match q.page.as_deref().map(str::trim) {
        None | Some("") => Ok(1),
        Some(p) => p.parse::<usize>().ok().filter(|p| *p >= 1).ok_or_else(|| {
            failure(
                StatusCode::BAD_REQUEST,
                &format!("page `{p}` is not a page number: give 1 or more"),
            )
        }),
    }
}

/// The run and one page of a stage's instances, read on the blocking pool through the
/// monitor's copy of the run.
async fn stage_page(
    m: &Arc<Monitor>,
    id: String,
    q: &StageQuery,
) -> Result<(RunRecord, view::StagePage), Failure> {
    let page = stage_query(q)?;
    let (node, state) = (q.node.clone(), q.state.clone());
    blocking(m, move |m| {
        m.with_store(|s| m.stage_page(s, &id, &node, page, &state))
            .map_err(|e| store_failure(&e))?
            .flatten()
            .ok_or_else(|| no_run(&id))
    })
    .await
}

/// What the stage page's template reads: the run, the stage, its page of instances, the
/// state filter's links and the pager's.
fn stage_context(run: &RunRecord, q: &StageQuery, page: &view::StagePage) -> minijinja::Value {
    let mut states = vec![StateLink {
        state: "",
        label: "all",
        count: page.total,
        href: stage_href(&run.id, &q.node, "", 1),
        on: page.state.is_empty(),
    }];
    for (state, count) in &page.counts {
        states.push(StateLink {
            state,
            label: state,
            count: *count,
            href: stage_href(&run.id, &q.node, state, 1),
            on: page.state == *state,
        });
    }
    let link = |p: usize| stage_href(&run.id, &q.node, &page.state, p);
    context! {
        run => minijinja::Value::from(Serde(run)),
        node => q.node.clone(),
        page => minijinja::Value::from(Serde(page)),
        states => minijinja::Value::from(Serde(&states)),
        prev => (page.page > 1).then(|| link(page.page - 1)),
        next => (page.page < page.pages).then(|| link(page.page + 1)),
        live_url => format!("/live{}", stage_href(&run.id, &q.node, &page.state, page.page)),
    }
}

/// `/runs/ID/stage?node=STAGE[&state=STATE][&page=N]`: a page of the stage's instances (its
/// loop iterations, its fan-out items; [`view::PAGE_SIZE`] a page) with every attempt, live.
pub(crate) async fn stage(
    State(m): State<Arc<Monitor>>,
    Path(id): Path<String>,
    Query(q): Query<StageQuery>,
) -> Response {
    match stage_page(&m, id, &q).await {
        Ok((run, page)) => m.pages.render("stage.html", stage_context(&run, &q, &page)),
        Err(f) => f.into_response(),
    }
}

/// `/live/runs/ID/stage?node=...`: the refreshing part of the stage page, as a JSON object
/// by part name (as `/live/runs/ID` answers for the run page).
pub(crate) async fn stage_live(
    State(m): State<Arc<Monitor>>,
    Path(id): Path<String>,
    Query(q): Query<StageQuery>,
) -> Response {
    let (run, page) = match stage_page(&m, id, &q).await {
        Ok(found) => found,
        Err(f) => return f.into_response(),
    };
    let ctx = stage_context(&run, &q, &page);
    match m
        .pages
        .env
        .get_template("stage_parts.html")
        .and_then(|t| t.render(context! { part => "stage", ..ctx }))
    {
        Ok(html) => super::api::json(&serde_json::json!({ "stage": html })),
        Err(e) => failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot render the stage: {e}"),
        )
        .into_response(),
    }
}

#[derive(Deserialize)]
pub(crate) struct AnswerForm {
    gate: String,
    decision: String,
    #[serde(default)]
    comment: String,
    #[serde(default)]
    csrf: String,
}

/// `POST /runs/ID/answer`: the gate form's Approve and Reject buttons.
pub(crate) async fn answer(
    State(m): State<Arc<Monitor>>,
    Extension(how): Extension<Authorized>,
    Path(id): Path<String>,
    Form(form): Form<AnswerForm>,
) -> Response {
    if let Some(refused) = form_csrf_refused(&m, how, &form.csrf, "answer") {
        return refused;
    }
    let approved = match form.decision.as_str() {
        "approve" => true,
        "reject" => false,
        other => {
            return failure(
                StatusCode::BAD_REQUEST,
                &format!("unknown decision `{other}`: approve or reject"),
            )
            .into_response();
        }
    };
    let comment = Some(form.comment.clone());
    let gate = form.gate.clone();
    let run = id.clone();
    act_and_redirect(
        &m,
        &id,
        "Not answered",
        move |s| crate::run::answer::answer(s, &run, &gate, approved, comment, &by()),
        move |a| {
            format!(
                "{} gate {}; {}",
                if approved { "Approved" } else { "Rejected" },
                a.gate.qualified(),
                a.next.text(&a.approval.run)
            )
        },
    )
    .await
}

/// Does `act` on the store off the async threads and redirects back to the run page `id`
/// with a message: `done`'s text when it worked (and the pages told of the change), else
/// `refused` and why.
async fn act_and_redirect<T: Send + 'static, E: std::error::Error + Send + 'static>(
    m: &Arc<Monitor>,
    id: &str,
    refused: &str,
    act: impl FnOnce(&mut dyn crate::store::Store) -> Result<T, E> + Send + 'static,
    done: impl FnOnce(T) -> String,
) -> Response {
    let result = blocking(m, move |m| Ok(m.with_store(|s| Ok(act(s))))).await;
    let msg = match result {
        Ok(Ok(Some(Ok(t)))) => {
            m.touch();
            done(t)
        }
        Ok(Ok(Some(Err(e)))) => format!("{refused}: {}", error_chain(&e)),
        Ok(Ok(None)) => format!("{refused}: there is no run store yet"),
        Ok(Err(e)) => format!("{refused}: {}", error_chain(&e)),
        Err(f) => return f.into_response(),
    };
    let location = format!(
        "/runs/{}?msg={}",
        super::layout::url_part(id),
        m.flash(id, msg)
    );
    Redirect::to(&location).into_response()
}

/// The refusal of a form posted without the page's CSRF token (`verb`: what to do again
/// once the page is reloaded); `None` when it may go on.
fn form_csrf_refused(m: &Monitor, how: Authorized, csrf: &str, verb: &str) -> Option<Response> {
    (!csrf_ok(m, how, Some(csrf))).then(|| {
        failure(
            StatusCode::FORBIDDEN,
            &format!(
                "refused: the form's CSRF token is missing or wrong; reload the page and {verb} \
                 again"
            ),
        )
        .into_response()
    })
}

#[derive(Deserialize)]
pub(crate) struct CancelForm {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    csrf: String,
}

/// `POST /runs/ID/cancel`: the run page's Cancel run button, behind the same CSRF rule as
/// the gates' buttons.
pub(crate) async fn cancel(
    State(m): State<Arc<Monitor>>,
    Extension(how): Extension<Authorized>,
    Path(id): Path<String>,
    Form(form): Form<CancelForm>,
) -> Response {
    if let Some(refused) = form_csrf_refused(&m, how, &form.csrf, "cancel") {
        return refused;
    }
    let run = id.clone();
    let reason = Some(form.reason);
    act_and_redirect(
        &m,
        &id,
        "Not cancelled",
        move |s| crate::run::cancel::cancel(s, &run, reason, &by()),
        |c| format!("Cancelled run {}; {}", c.run, c.next()),
    )
    .await
}

/// Who answers from the monitor: `USER@monitor`.
pub(crate) fn by() -> String {
    format!("{}@monitor", crate::run::answer::who_answers())
}

/// `/assets/NAME`: the style sheet and the script, from the binary.
pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "style.css" => (include_str!("assets/style.css"), "text/css; charset=utf-8"),
        "plan.css" => (include_str!("assets/plan.css"), "text/css; charset=utf-8"),
        "app.js" => (
            include_str!("assets/app.js"),
            "text/javascript; charset=utf-8",
        ),
        _ => return failure(StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    let mut resp = body.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_compiles() {
        let (_, broken) = environment();
        assert!(broken.is_empty(), "{broken:?}");
    }
}
