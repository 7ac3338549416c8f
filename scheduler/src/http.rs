//! The scheduler's HTTP port (`--http-listen`): `/metrics` in the Prometheus text format,
//! `/v1/demand` as JSON for autoscalers (KEDA's metrics-api trigger), and `/healthz`. It
//! speaks TLS with the API port's certificate when that one does, and wants a token
//! (`Authorization: Bearer`, any role that may read) when the auth file is on.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Action, AuthGate, require};
use crate::core::{Demand, SchedulerCommand, SchedulerHandle};
use crate::error::SchedulerError;
use crate::server::{ServerSecurity, TlsIdentity};

#[derive(Clone)]
struct HttpState {
    scheduler: SchedulerHandle,
    auth: AuthGate,
}

/// Serves the HTTP port on `listener` until `cancel` fires.
pub fn serve_http(
    listener: TcpListener,
    scheduler: SchedulerHandle,
    security: &ServerSecurity,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SchedulerError> {
    let tls = security.tls.as_ref().map(tls_acceptor).transpose()?;
    let state = HttpState {
        scheduler,
        auth: security.auth.clone(),
    };
    let router = axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/v1/demand", get(demand))
        .with_state(state);
    Ok(tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = cancel.cancelled() => return,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "HTTP port: accept failed");
                    continue;
                }
            };
            let service = TowerToHyperService::new(router.clone());
            let tls = tls.clone();
            tokio::spawn(async move {
                let builder = auto::Builder::new(TokioExecutor::new());
                let served = match tls {
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => {
                            builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await
                        }
                        Err(error) => {
                            tracing::debug!(%peer, %error, "HTTP port: TLS handshake failed");
                            return;
                        }
                    },
                    None => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                };
                if let Err(error) = served {
                    tracing::debug!(%peer, %error, "HTTP connection ended with an error");
                }
            });
        }
    }))
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

/// A refusal: the status and the text that says why.
type Refusal = (StatusCode, String);

/// The caller's token must be known and may read cluster state.
fn authorize(state: &HttpState, headers: &HeaderMap, call: &str) -> Result<(), Refusal> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let refused = |status: tonic::Status| {
        let code = match status.code() {
            tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            _ => StatusCode::FORBIDDEN,
        };
        let hint = if code == StatusCode::UNAUTHORIZED {
            " (over HTTP: send it as `Authorization: Bearer <token>`)"
        } else {
            ""
        };
        (code, format!("{}{hint}\n", status.message()))
    };
    let principal = state.auth.authenticate(token).map_err(refused)?;
    require(&principal, Action::Read, call, "http").map_err(refused)?;
    Ok(())
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

async fn metrics(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&state, &headers, "metrics") {
        return refused.into_response();
    }
    match query_demand(&state, BTreeMap::new()).await {
        Ok(demand) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            encode_demand(&demand),
        )
            .into_response(),
        Err(refused) => refused.into_response(),
    }
}

type Labels = Vec<(String, String)>;

/// The demand as Prometheus metrics.
fn encode_demand(demand: &Demand) -> String {
    let mut registry = Registry::default();
    let nodes = Family::<Labels, Gauge>::default();
    let queue = Family::<Labels, Gauge>::default();
    let running = Family::<Labels, Gauge>::default();
    let unplaced = Family::<Labels, Gauge>::default();
    let unplaced_gpus = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let demand_gpus = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    registry.register("resident_nodes", "Nodes by state", nodes.clone());
    registry.register(
        "resident_pool_queue_depth",
        "Tasks waiting for an actor, per pool",
        queue.clone(),
    );
    registry.register(
        "resident_pool_running_tasks",
        "Tasks handed to actors and not answered yet, per pool",
        running.clone(),
    );
    registry.register(
        "resident_pool_unplaced_actors",
        "Actors no node can host now, per pool",
        unplaced.clone(),
    );
    registry.register(
        "resident_pool_unplaced_gpus",
        "GPUs the unplaced actors ask for, per pool",
        unplaced_gpus.clone(),
    );
    registry.register(
        "resident_demand_gpus",
        "GPUs held or wanted by pools with work (the autoscaling signal)",
        demand_gpus.clone(),
    );
    for (state, count) in [
        ("alive", demand.nodes_alive),
        ("draining", demand.nodes_draining),
        ("dead", demand.nodes_dead),
    ] {
        nodes
            .get_or_create(&vec![("state".into(), state.into())])
            .set(count as i64);
    }
    for pool in &demand.pools {
        let labels = vec![("pool".to_owned(), pool.pool.clone())];
        queue.get_or_create(&labels).set(pool.queued_tasks as i64);
        running
            .get_or_create(&labels)
            .set(pool.running_tasks as i64);
        unplaced
            .get_or_create(&labels)
            .set(pool.unplaced_actors as i64);
        unplaced_gpus.get_or_create(&labels).set(pool.unplaced_gpus);
    }
    demand_gpus.set(demand.demand_gpus);
    let mut text = String::new();
    encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::PoolDemand;

    #[test]
    fn node_labels_parse_and_bad_ones_say_what_is_wanted() {
        let labels = parse_node_labels("autoscaled=true, zone=a").unwrap();
        assert_eq!(labels["autoscaled"], "true");
        assert_eq!(labels["zone"], "a");
        assert!(parse_node_labels("").unwrap().is_empty());
        assert!(parse_node_labels("nope").unwrap_err().contains("key=value"));
    }

    #[test]
    fn demand_encodes_as_prometheus_metrics() {
        let demand = Demand {
            queued_tasks: 7,
            demand_gpus: 2.5,
            nodes_alive: 2,
            pools: vec![PoolDemand {
                pool: "embed-x".into(),
                queued_tasks: 7,
                unplaced_actors: 1,
                unplaced_gpus: 0.5,
                ..PoolDemand::default()
            }],
            ..Demand::default()
        };
        let text = encode_demand(&demand);
        assert!(
            text.contains("resident_pool_queue_depth{pool=\"embed-x\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("resident_pool_unplaced_gpus{pool=\"embed-x\"} 0.5"),
            "{text}"
        );
        assert!(text.contains("resident_demand_gpus 2.5"), "{text}");
        assert!(text.contains("resident_nodes{state=\"alive\"} 2"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
