//! The web dashboard: a page and its script, built into the binary (no Node build step),
//! that poll `/v1/overview` once a second; and the login page that turns a token into a
//! session (`sessions.rs`) named by an HttpOnly cookie, so a browser can use the dashboard
//! when the cluster wants tokens without the token ever being stored in the browser.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Form, Json, Router};
use resident_proto::pb;
use serde::{Deserialize, Serialize};

use super::access::{HttpState, authorize, check_token, query_overview};
use super::metrics::{actor_state_name, job_state_name};
use super::sessions::{COOKIE, LOGIN_LIFETIME, cookie_session};
use crate::auth::audit;
use crate::core::Overview;
use crate::metrics::ClusterEvent;

const INDEX_HTML: &str = include_str!("assets/index.html");
const LOGIN_HTML: &str = include_str!("assets/login.html");
const DASHBOARD_JS: &str = include_str!("assets/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("assets/dashboard.css");

/// Events the overview carries.
const RECENT_EVENTS: usize = 50;

pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route("/", get(index))
        .route("/login", get(login_page).post(login))
        .route("/logout", get(logout))
        .route("/v1/overview", get(overview))
        .route(
            "/assets/dashboard.js",
            get(|| async { asset("text/javascript; charset=utf-8", DASHBOARD_JS) }),
        )
        .route(
            "/assets/dashboard.css",
            get(|| async { asset("text/css; charset=utf-8", DASHBOARD_CSS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn index(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if authorize(&state, &headers, "dashboard").is_err() {
        return Redirect::to("/login").into_response();
    }
    Html(INDEX_HTML).into_response()
}

fn login_form(message: &str) -> Html<String> {
    Html(LOGIN_HTML.replace("{{message}}", &escape_html(message)))
}

async fn login_page(State(state): State<HttpState>) -> Html<String> {
    let message = if state.auth.is_open() {
        "This cluster runs without tokens: the dashboard is open."
    } else {
        ""
    };
    login_form(message)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(state): State<HttpState>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    if let Err((status, why)) = check_token(&state, Some(token), "login") {
        return (status, login_form(why.trim())).into_response();
    }
    let session = state.sessions.start(token);
    let secure = if state.tls { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={session}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
        LOGIN_LIFETIME.as_secs()
    );
    let mut response = Redirect::to("/").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn logout(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(session) = cookie_session(&headers) {
        state.sessions.end(session);
    }
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("resident_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn overview(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&state, &headers, "overview") {
        return refused.into_response();
    }
    match query_overview(&state).await {
        Ok(overview) => {
            let mut events = state.scheduler.metrics().events.recent(RECENT_EVENTS);
            events.extend(audit::recent_refusals().recent(RECENT_EVENTS));
            events.sort_by_key(|e| std::cmp::Reverse(e.unix_ms));
            events.truncate(RECENT_EVENTS);
            Json(OverviewView::new(&overview, events)).into_response()
        }
        Err(refused) => refused.into_response(),
    }
}

/// `/v1/overview`: what the dashboard draws, as JSON.
#[derive(Debug, Serialize)]
pub(super) struct OverviewView {
    pub generated_unix_ms: u64,
    pub nodes: Vec<NodeView>,
    pub pools: Vec<PoolView>,
    pub jobs: Vec<JobView>,
    pub jobs_by_state: BTreeMap<String, u64>,
    pub demand_gpus: f64,
    pub events: Vec<ClusterEvent>,
}

#[derive(Debug, Serialize)]
pub(super) struct NodeView {
    pub node_id: String,
    pub hostname: String,
    pub state: &'static str,
    pub labels: BTreeMap<String, String>,
    pub cpu_cores: u32,
    pub ram_bytes: u64,
    pub last_heartbeat_ms_ago: u64,
    pub gpus: Vec<GpuView>,
    /// GPUs the node has that its agent could not open: shown, never placed on.
    pub unavailable_gpus: Vec<UnavailableGpuView>,
    /// Actors placed here, by GPU (CPU actors have no GPU).
    pub actors: Vec<PlacedActorView>,
}

#[derive(Debug, Serialize)]
pub(super) struct UnavailableGpuView {
    pub index: u32,
    pub reason: String,
}

#[derive(Debug, Serialize)]
pub(super) struct GpuView {
    pub index: u32,
    pub name: String,
    pub total_vram_bytes: u64,
    pub free_vram_bytes: u64,
    pub utilization_ratio: Option<f64>,
    pub simulated: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct PlacedActorView {
    pub actor_id: String,
    pub pool: String,
    pub state: String,
    pub gpu_indices: Vec<u32>,
    pub gpu_fraction: f64,
    pub vram_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct PoolView {
    pub name: String,
    pub kind: String,
    pub replicas: u32,
    pub ready_actors: u32,
    pub queued_tasks: u64,
    pub running_tasks: u64,
    pub unplaced_reason: String,
    /// GPU-hours and CPU core-hours its actors have held since this scheduler made it.
    pub gpu_hours: f64,
    pub cpu_core_hours: f64,
    pub actors: Vec<ActorView>,
}

#[derive(Debug, Serialize)]
pub(super) struct ActorView {
    pub actor_id: String,
    pub state: String,
    pub node_id: String,
    pub gpu_indices: Vec<u32>,
    pub model_loads: u64,
    pub restarts: u32,
    pub tasks_done: u64,
    pub in_flight: u32,
    pub error: String,
}

#[derive(Debug, Serialize)]
pub(super) struct JobView {
    pub job_id: String,
    pub name: String,
    pub pool: String,
    pub owner: String,
    pub state: String,
    pub submitted: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub queued: u64,
    pub running: u64,
    /// The client's total, 0 when it did not say.
    pub expected_tasks: u64,
    /// Finished tasks over the expected (else submitted) ones, 0 to 1.
    pub progress: f64,
    pub items_done: u64,
    /// Items done inside tasks still running (progress within a chunk).
    pub items_running: u64,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub elapsed_seconds: f64,
    /// Averages since the job started.
    pub items_per_second: f64,
    pub tasks_per_second: f64,
    /// At the average rate; absent when unknown.
    pub eta_seconds: Option<f64>,
    pub gpu_seconds: f64,
    pub cost_usd: f64,
    /// What the job says about itself (`AnnotateJob`): a sweep's status and leaderboard.
    pub summary: Option<serde_json::Value>,
}

impl OverviewView {
    pub fn new(overview: &Overview, events: Vec<ClusterEvent>) -> Self {
        let now = crate::metrics::unix_ms_now();
        let actors: Vec<(&str, &pb::ActorInfo)> = overview
            .pools
            .iter()
            .flat_map(|p| {
                let name = p.spec.as_ref().map_or("", |s| s.name.as_str());
                p.actors.iter().map(move |a| (name, a))
            })
            .collect();
        let nodes = overview
            .nodes
            .iter()
            .map(|node| NodeView::new(node, &actors))
            .collect();
        let pools = overview
            .pools
            .iter()
            .map(|pool| PoolView::new(pool, overview))
            .collect();
        Self {
            generated_unix_ms: now,
            nodes,
            pools,
            jobs: overview.jobs.iter().map(|j| JobView::new(j, now)).collect(),
            jobs_by_state: overview
                .jobs_by_state
                .iter()
                .map(|(state, count)| (job_state_name(*state), *count))
                .collect(),
            demand_gpus: overview.demand.demand_gpus,
            events,
        }
    }
}

impl NodeView {
    fn new(node: &pb::NodeInfo, actors: &[(&str, &pb::ActorInfo)]) -> Self {
        let state = match (node.alive, node.draining) {
            (false, _) => "dead",
            (true, true) => "draining",
            (true, false) => "alive",
        };
        Self {
            node_id: node.node_id.clone(),
            hostname: node.hostname.clone(),
            state,
            labels: node.labels.clone().into_iter().collect(),
            cpu_cores: node.cpu_cores,
            ram_bytes: node.ram_bytes,
            last_heartbeat_ms_ago: node.last_heartbeat_ms_ago,
            gpus: node
                .gpus
                .iter()
                .map(|g| GpuView {
                    index: g.index,
                    name: g.name.clone(),
                    total_vram_bytes: g.total_vram_bytes,
                    free_vram_bytes: g.free_vram_bytes,
                    utilization_ratio: g.utilization_ratio,
                    simulated: g.simulated,
                })
                .collect(),
            unavailable_gpus: node
                .unavailable_gpus
                .iter()
                .map(|g| UnavailableGpuView {
                    index: g.index,
                    reason: g.reason.clone(),
                })
                .collect(),
            actors: actors
                .iter()
                .filter(|(_, a)| a.node_id == node.node_id)
                .map(|(pool, a)| PlacedActorView {
                    actor_id: a.actor_id.clone(),
                    pool: (*pool).to_owned(),
                    state: actor_state_name(a.state),
                    gpu_indices: a.gpu_indices.clone(),
                    gpu_fraction: a.gpu_fraction,
                    vram_bytes: a.vram_bytes,
                })
                .collect(),
        }
    }
}

impl PoolView {
    fn new(pool: &pb::PoolStatus, overview: &Overview) -> Self {
        let spec = pool.spec.clone().unwrap_or_default();
        let demand = overview.demand.pools.iter().find(|d| d.pool == spec.name);
        Self {
            kind: spec.actor_kind.clone(),
            replicas: spec.replicas,
            ready_actors: pool.ready_actors,
            queued_tasks: demand.map_or(0, |d| d.queued_tasks),
            running_tasks: demand.map_or(0, |d| d.running_tasks),
            unplaced_reason: pool.unplaced_reason.clone(),
            gpu_hours: pool.usage.iter().map(|u| u.gpu_seconds).sum::<f64>() / 3600.0,
            cpu_core_hours: pool.usage.iter().map(|u| u.cpu_core_seconds).sum::<f64>() / 3600.0,
            actors: pool
                .actors
                .iter()
                .map(|a| ActorView {
                    actor_id: a.actor_id.clone(),
                    state: actor_state_name(a.state),
                    node_id: a.node_id.clone(),
                    gpu_indices: a.gpu_indices.clone(),
                    model_loads: a.model_loads,
                    restarts: a.restarts,
                    tasks_done: a.tasks_done,
                    in_flight: a.in_flight,
                    error: a.error.clone(),
                })
                .collect(),
            name: spec.name,
        }
    }
}

impl JobView {
    fn new(job: &pb::JobStatus, now_unix_ms: u64) -> Self {
        let state = pb::JobState::try_from(job.state).unwrap_or_default();
        let end = if job.finished_unix_ms > 0 {
            job.finished_unix_ms
        } else {
            now_unix_ms
        };
        let elapsed_seconds = end.saturating_sub(job.started_unix_ms) as f64 / 1000.0;
        let finished = job.succeeded + job.failed + job.cancelled;
        let total = job.expected_tasks.max(job.submitted);
        // Running tasks count by the share of their items done, at the job's average items
        // per task so far (none before a task succeeded).
        let running_tasks = match job.succeeded {
            0 => 0.0,
            succeeded => (job.items_running as f64 * succeeded as f64
                / job.items_done.max(1) as f64)
                .min(job.running as f64),
        };
        let progress = if total == 0 {
            0.0
        } else {
            ((finished as f64 + running_tasks) / total as f64).min(1.0)
        };
        let rate = |n: u64| {
            if elapsed_seconds > 0.0 {
                n as f64 / elapsed_seconds
            } else {
                0.0
            }
        };
        let tasks_per_second = rate(job.succeeded + job.failed);
        let running = state == pb::JobState::Running;
        let eta_seconds = (running && tasks_per_second > 0.0 && total > 0)
            .then(|| total.saturating_sub(finished) as f64 / tasks_per_second);
        Self {
            job_id: job.job_id.clone(),
            name: job.name.clone(),
            pool: job.pool.clone(),
            owner: job.owner.clone(),
            state: job_state_name(state),
            submitted: job.submitted,
            succeeded: job.succeeded,
            failed: job.failed,
            cancelled: job.cancelled,
            queued: job.queued,
            running: job.running,
            expected_tasks: job.expected_tasks,
            progress,
            items_done: job.items_done,
            items_running: job.items_running,
            started_unix_ms: job.started_unix_ms,
            finished_unix_ms: job.finished_unix_ms,
            elapsed_seconds,
            items_per_second: rate(job.items_done + job.items_running),
            tasks_per_second,
            eta_seconds,
            gpu_seconds: job.gpu_seconds,
            cost_usd: job.cost_usd,
            summary: serde_json::from_str(&job.summary_json).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_view_has_progress_rate_and_eta() {
        let job = pb::JobStatus {
            job_id: "j".into(),
            state: pb::JobState::Running as i32,
            submitted: 40,
            succeeded: 25,
            expected_tasks: 100,
            items_done: 2500,
            started_unix_ms: 1_000_000,
            ..Default::default()
        };
        let view = JobView::new(&job, 1_010_000);
        assert_eq!(view.state, "running");
        assert!((view.progress - 0.25).abs() < 1e-9);
        assert!((view.items_per_second - 250.0).abs() < 1e-9);
        assert!((view.eta_seconds.unwrap() - 30.0).abs() < 1e-9);
        let done = pb::JobStatus {
            state: pb::JobState::Succeeded as i32,
            finished_unix_ms: 1_005_000,
            ..job.clone()
        };
        assert_eq!(JobView::new(&done, 2_000_000).eta_seconds, None);
        assert!((JobView::new(&done, 2_000_000).elapsed_seconds - 5.0).abs() < 1e-9);
        // 4 tasks running, 250 of their items done: 2.5 tasks' worth at 100 items a task.
        let inside = pb::JobStatus {
            running: 4,
            items_running: 250,
            ..job
        };
        let view = JobView::new(&inside, 1_010_000);
        assert!((view.progress - 0.275).abs() < 1e-9, "{}", view.progress);
        assert!((view.items_per_second - 275.0).abs() < 1e-9);
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(escape_html("<b>&\""), "&lt;b&gt;&amp;&quot;");
    }
}
