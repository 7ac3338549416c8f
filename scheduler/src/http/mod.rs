//! The scheduler's HTTP port (`--http-listen`): the dashboard at `/` (`dashboard.rs`),
//! `/metrics` in the Prometheus text format (`metrics.rs`), `/v1/overview` (the dashboard's
//! data) and `/v1/demand` (for autoscalers: KEDA's metrics-api trigger) as JSON, and
//! `/healthz`. It speaks TLS with the API port's certificate when that one does, and wants a
//! token when the auth file is on: `Authorization: Bearer <token>`, or the cookie the login
//! page sets; any role that may read.

mod access;
mod dashboard;
mod metrics;
mod serve;
mod sessions;

pub use serve::{DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, HttpLimits};

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::core::{Demand, SchedulerCommand, SchedulerHandle};
use crate::error::SchedulerError;
use crate::server::{ServerSecurity, TlsIdentity};
use access::{HttpState, Refusal, authorize};

/// Serves the HTTP port on `listener` until `cancel` fires, then drains it (`serve.rs`).
pub fn serve_http(
    listener: TcpListener,
    scheduler: SchedulerHandle,
    security: &ServerSecurity,
    limits: HttpLimits,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SchedulerError> {
    let tls = security.tls.as_ref().map(tls_acceptor).transpose()?;
    let state = HttpState {
        scheduler,
        auth: security.auth.clone(),
        tls: tls.is_some(),
        sessions: sessions::DashboardSessions::new(sessions::LOGIN_LIFETIME),
    };
    let router = axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/demand", get(demand))
        .merge(dashboard::routes())
        .with_state(state);
    Ok(tokio::spawn(serve::serve_connections(
        listener, router, tls, limits, cancel,
    )))
}

/// `ok`, or 503 with the error while the state store fails (every change is refused then).
async fn healthz(State(state): State<HttpState>) -> Response {
    match state.scheduler.store_health().borrow().as_ref() {
        None => "ok\n".into_response(),
        Some(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the state store cannot write: {error}\n"),
        )
            .into_response(),
    }
}

fn tls_acceptor(identity: &TlsIdentity) -> Result<tokio_rustls::TlsAcceptor, SchedulerError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        SchedulerError::Precondition(format!("HTTP port TLS: {what}: {e}"))
    };
    let certs = CertificateDer::pem_slice_iter(&identity.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("the certificate chain", &e))?;
    let key = PrivateKeyDer::from_pem_slice(&identity.key_pem).map_err(|e| bad("the key", &e))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("certificate and key", &e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[derive(serde::Deserialize)]
struct DemandQuery {
    /// `key=value,key=value`: count placed GPUs only on nodes with these labels.
    node_labels: Option<String>,
}

async fn query_demand(
    state: &HttpState,
    node_labels: BTreeMap<String, String>,
) -> Result<Demand, Refusal> {
    state
        .scheduler
        .call(|reply| SchedulerCommand::Demand { node_labels, reply })
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")))
}

async fn demand(
    State(state): State<HttpState>,
    headers: HeaderMap,
    Query(query): Query<DemandQuery>,
) -> Response {
    if let Err(refused) = authorize(&state, &headers, "demand") {
        return refused.into_response();
    }
    let node_labels = match parse_node_labels(query.node_labels.as_deref().unwrap_or("")) {
        Ok(labels) => labels,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    match query_demand(&state, node_labels).await {
        Ok(demand) => axum::Json(demand).into_response(),
        Err(refused) => refused.into_response(),
    }
}

fn parse_node_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(format!(
                "node_labels wants key=value pairs separated by commas, got `{pair}`\n"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_parse_and_bad_ones_say_what_is_wanted() {
        let labels = parse_node_labels("autoscaled=true, zone=a").unwrap();
        assert_eq!(labels["autoscaled"], "true");
        assert_eq!(labels["zone"], "a");
        assert!(parse_node_labels("").unwrap().is_empty());
        assert!(parse_node_labels("nope").unwrap_err().contains("key=value"));
    }
}
