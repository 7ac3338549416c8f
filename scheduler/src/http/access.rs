//! What every HTTP handler shares: the state ([`HttpState`]), the caller's token (bearer
//! header or login cookie) and the check that it may read, and the overview query. A leaf
//! below the handlers (`dashboard.rs`, `metrics.rs`, `mod.rs`'s `/v1/demand`).

use axum::http::{HeaderMap, StatusCode, header};

use super::sessions::{DashboardSessions, cookie_session};
use crate::auth::{Action, AuthGate, require};
use crate::core::{Overview, SchedulerCommand, SchedulerHandle};

/// The handlers' shared state.
#[derive(Clone)]
pub(super) struct HttpState {
    pub(super) scheduler: SchedulerHandle,
    pub(super) auth: AuthGate,
    /// Whether the port speaks TLS (the login cookie is then `Secure`).
    pub(super) tls: bool,
    /// Logged-in browsers (`sessions.rs`).
    pub(super) sessions: DashboardSessions,
}

/// A refusal: the status and the text that says why.
pub(super) type Refusal = (StatusCode, String);

/// The caller's token: the `Authorization: Bearer` header, else the token of the session
/// the login cookie names.
pub(super) fn request_token(state: &HttpState, headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned());
    bearer.or_else(|| state.sessions.token(cookie_session(headers)?))
}

/// The caller's token must be known and may read cluster state.
pub(super) fn authorize(state: &HttpState, headers: &HeaderMap, call: &str) -> Result<(), Refusal> {
    check_token(state, request_token(state, headers).as_deref(), call)
}

/// `token` must be known and may read cluster state.
pub(super) fn check_token(
    state: &HttpState,
    token: Option<&str>,
    call: &str,
) -> Result<(), Refusal> {
    let refused = |status: tonic::Status| {
        let code = match status.code() {
            tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            _ => StatusCode::FORBIDDEN,
        };
        let hint = if code == StatusCode::UNAUTHORIZED {
            " (over HTTP: send it as `Authorization: Bearer <token>`, or log in at /login)"
        } else {
            ""
        };
        (code, format!("{}{hint}\n", status.message()))
    };
    let principal = state.auth.authenticate(token).map_err(refused)?;
    require(&principal, Action::Read, call, "http").map_err(refused)?;
    Ok(())
}

/// The cluster overview, or 503 while the scheduler does not answer.
pub(super) async fn query_overview(state: &HttpState) -> Result<Overview, Refusal> {
    state
        .scheduler
        .call(|reply| SchedulerCommand::Overview { reply })
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")))
}
