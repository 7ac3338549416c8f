//! The audit log: who joined, left, changed pools and jobs, and every refused call, as
//! structured `tracing` events under one target (`RESIDENT_LOG=resident::audit=info` selects
//! them; `--log-json` makes them machine-readable).

use std::net::SocketAddr;
use std::sync::OnceLock;

use super::Principal;
use crate::metrics::EventLog;

/// The `tracing` target of audit events (refusals, token changes): route it apart with
/// `RESIDENT_LOG=resident::audit=info`.
pub const TARGET: &str = "resident::audit";

/// Recent refusals, for the dashboard. Process-wide, like the audit log itself.
pub fn recent_refusals() -> &'static EventLog {
    static REFUSALS: OnceLock<EventLog> = OnceLock::new();
    REFUSALS.get_or_init(EventLog::default)
}

/// A call without a valid token.
pub fn refused_unauthenticated(peer: Option<SocketAddr>, reason: &str) {
    let peer = peer.map(|p| p.to_string()).unwrap_or_default();
    recent_refusals().record("auth", &peer, format!("unauthenticated: {reason}"));
    tracing::warn!(target: TARGET, principal = "", peer, reason, "refused");
}

/// A call by a known principal that was not allowed.
pub fn refused(principal: &Principal, action: &str, subject: &str, reason: &str) {
    recent_refusals().record(
        "auth",
        subject,
        format!("{action} by {} refused: {reason}", principal.name),
    );
    tracing::warn!(
        target: TARGET,
        principal = %principal.name,
        role = %principal.role,
        action,
        subject,
        reason,
        "refused"
    );
}

/// A change to the cluster that was carried out.
pub fn done(principal: &Principal, action: &str, subject: &str) {
    tracing::info!(
        target: TARGET,
        principal = %principal.name,
        role = %principal.role,
        action,
        subject,
        "done"
    );
}

/// Logs the outcome of a change: `done`, or `refused` with the status the caller got.
pub fn outcome<T>(
    principal: &Principal,
    action: &str,
    subject: &str,
    result: Result<T, tonic::Status>,
) -> Result<T, tonic::Status> {
    match &result {
        Ok(_) => done(principal, action, subject),
        Err(status) => refused(principal, action, subject, status.message()),
    }
    result
}
