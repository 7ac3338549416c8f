//! Starting a scheduler: the loop plus both gRPC services on a pre-bound listener.

use std::sync::Arc;

use resident_proto::pb::node_agent_service_server::NodeAgentServiceServer;
use resident_proto::pb::scheduler_service_server::SchedulerServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;

use resident_proto::health::{
    HealthReporter, SCHEDULER_HEALTH_SERVICE, ServingStatus, health_service, set_health,
};
use resident_proto::panic_text;

use crate::auth::AuthGate;
use crate::connections::{GrpcLimits, grpc_incoming};
use crate::core::{CoreConfig, SchedulerHandle, spawn_scheduler_loop};
use crate::error::SchedulerError;
use crate::service::{AgentSessionService, ClientApiService};
use crate::store::DurableStore;

/// A running scheduler: its command handle, address and serving task.
pub struct SchedulerServer {
    /// The core's command handle.
    pub handle: SchedulerHandle,
    /// The address it listens on.
    pub local_addr: std::net::SocketAddr,
    /// `https://addr` when serving TLS, else `http://addr`.
    pub url: String,
    /// Ends when `cancel` fires (Ok) or when the core loop stops on its own (a panic:
    /// [`SchedulerError::CoreStopped`]; the server stops with it, so the process can exit
    /// non-zero instead of answering UNAVAILABLE forever).
    pub task: tokio::task::JoinHandle<Result<(), SchedulerError>>,
    /// `grpc.health.v1` statuses: [`SCHEDULER_HEALTH_SERVICE`] is SERVING while the core
    /// runs. Served on the API port; `serve_health_port` serves it on a plaintext port too.
    pub health: HealthReporter,
}

/// The scheduler's certificate chain and private key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate chain.
    pub cert_pem: Vec<u8>,
    /// The private key.
    pub key_pem: Vec<u8>,
}

/// How the port is protected: TLS or plaintext, tokens or open.
#[derive(Clone)]
pub struct ServerSecurity {
    /// The certificate to serve TLS with; `None`: plaintext.
    pub tls: Option<TlsIdentity>,
    /// CA (PEM) of agents' client certificates: with it, every agent session must present
    /// one naming its node id (mutual TLS). Clients need none.
    pub agent_ca_pem: Option<Vec<u8>>,
    /// Who may call: tokens and roles, or open.
    pub auth: AuthGate,
    /// The port's connection cap and handshake deadline.
    pub limits: GrpcLimits,
}

impl ServerSecurity {
    /// Plaintext, no tokens: loopback and in-process clusters.
    pub fn open() -> Self {
        Self {
            tls: None,
            agent_ca_pem: None,
            auth: AuthGate::open(),
            limits: GrpcLimits::default(),
        }
    }
}

fn tls_config(
    identity: &TlsIdentity,
    agent_ca_pem: Option<&[u8]>,
) -> Result<tonic::transport::ServerTlsConfig, SchedulerError> {
    // Both ring and aws-lc may be compiled in (the S3 client brings aws-lc); rustls then
    // needs a process default, and ring is the one tonic's client side uses too.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let text = String::from_utf8_lossy(&identity.key_pem);
    if !text.contains("PRIVATE KEY-----") {
        return Err(SchedulerError::Precondition(
            "the TLS key holds no PEM private key".into(),
        ));
    }
    let config = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(&identity.cert_pem, &identity.key_pem),
    );
    Ok(match agent_ca_pem {
        // Optional at the handshake, so clients without certificates still connect; the
        // agent session handler refuses agents without one.
        Some(ca) => config
            .client_ca_root(tonic::transport::Certificate::from_pem(ca))
            .client_auth_optional(true),
        None => config,
    })
}

/// HTTP/2 receive window of one stream: what a client may send ahead of what the scheduler
/// has read (hyper's default).
const STREAM_WINDOW_BYTES: u32 = 1 << 20;
/// HTTP/2 receive window of one connection, across its streams. A job stream that is read
/// no further (its byte buffer is full) holds its stream window of it for as long as it
/// stalls; the window has room for eight such, so one client's stalled job does not stall
/// its other calls on the same connection (a `CancelJob`, a status). It bounds what the
/// scheduler buffers per connection beyond the jobs' own buffers.
const CONNECTION_WINDOW_BYTES: u32 = 8 * STREAM_WINDOW_BYTES;

/// Serves the scheduler on `listener` until `cancel` fires.
pub fn start_scheduler(
    listener: TcpListener,
    config: CoreConfig,
    store: Arc<dyn DurableStore>,
    security: ServerSecurity,
    cancel: CancellationToken,
) -> Result<SchedulerServer, SchedulerError> {
    let local_addr = listener
        .local_addr()
        .map_err(|e| SchedulerError::Precondition(format!("listener has no address: {e}")))?;
    let security_tls = security.tls.is_some();
    let mut builder = server_builder(&security)?;
    let (handle, loop_task) = spawn_scheduler_loop(config, store, cancel.clone())?;
    let budget = handle.buffer_budget().clone();
    let agents = AgentSessionService {
        scheduler: handle.clone(),
        require_agent_certificate: security.agent_ca_pem.is_some(),
    };
    let clients = ClientApiService {
        scheduler: handle.clone(),
        max_outstanding_per_job: 16_384,
        budget,
    };
    let incoming = grpc_incoming(listener, security.limits);
    let health = HealthReporter::new();
    set_health(&health, SCHEDULER_HEALTH_SERVICE, ServingStatus::Serving);
    tokio::spawn(report_store_health(
        health.clone(),
        handle.store_health(),
        cancel.clone(),
    ));
    let health_on_stop = health.clone();
    let task = tokio::spawn(async move {
        let serve = builder
            // Unauthenticated on purpose: probes carry no token, and the answer is one word.
            .add_service(health_service(&health_on_stop))
            .add_service(InterceptedService::new(
                NodeAgentServiceServer::new(agents)
                    .max_decoding_message_size(resident_proto::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(resident_proto::MAX_MESSAGE_BYTES),
                security.auth.clone(),
            ))
            .add_service(InterceptedService::new(
                SchedulerServiceServer::new(clients)
                    .max_decoding_message_size(resident_proto::MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(resident_proto::MAX_MESSAGE_BYTES),
                security.auth,
            ))
            .serve_with_incoming_shutdown(incoming, cancel.clone().cancelled_owned());
        serve_until_stopped(serve, loop_task, cancel, health_on_stop).await
    });
    let scheme = if security_tls { "https" } else { "http" };
    let url = format!("{scheme}://{local_addr}");
    tracing::info!(%url, "scheduler listening");
    Ok(SchedulerServer {
        handle,
        local_addr,
        url,
        task,
        health,
    })
}

/// The server with its HTTP/2 settings and, when `security` has a certificate, TLS.
fn server_builder(security: &ServerSecurity) -> Result<tonic::transport::Server, SchedulerError> {
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .initial_stream_window_size(Some(STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(CONNECTION_WINDOW_BYTES));
    if security.agent_ca_pem.is_some() && security.tls.is_none() {
        return Err(SchedulerError::Precondition(
            "agent client certificates need TLS: give the scheduler a certificate and key too"
                .into(),
        ));
    }
    if let Some(identity) = &security.tls {
        let config = tls_config(identity, security.agent_ca_pem.as_deref())?;
        builder = builder.tls_config(config).map_err(|e| {
            SchedulerError::Precondition(format!(
                "cannot serve TLS with this certificate and key: {e}"
            ))
        })?;
    }
    Ok(builder)
}

/// Runs the gRPC server until it stops or the core's loop ends. A loop that ends without
/// `cancel` (a panic, a return) takes the server down with it, NOT_SERVING first, so
/// nothing is left answering without a core behind it.
async fn serve_until_stopped(
    serve: impl Future<Output = Result<(), tonic::transport::Error>>,
    mut loop_task: tokio::task::JoinHandle<()>,
    cancel: CancellationToken,
    health: HealthReporter,
) -> Result<(), SchedulerError> {
    tokio::pin!(serve);
    tokio::select! {
        served = &mut serve => {
            if let Err(error) = served {
                tracing::error!(%error, "scheduler server stopped");
            }
            let _ = loop_task.await;
            Ok(())
        }
        ended = &mut loop_task => {
            if cancel.is_cancelled() {
                let _ = serve.await;
                return Ok(());
            }
            let why = match ended {
                Ok(()) => "its loop returned".to_owned(),
                Err(error) if error.is_panic() => {
                    format!("it panicked: {}", panic_text(error.into_panic().as_ref()))
                }
                Err(error) => error.to_string(),
            };
            tracing::error!(%why, "the scheduler's core stopped; stopping the server");
            health
                .set_service_status(SCHEDULER_HEALTH_SERVICE, ServingStatus::NotServing)
                .await;
            health.set_service_status("", ServingStatus::NotServing).await;
            cancel.cancel();
            let _ = serve.await;
            Err(SchedulerError::CoreStopped(why))
        }
    }
}

/// NOT_SERVING while the state store fails (the scheduler then refuses every change), and
/// SERVING again once it writes.
async fn report_store_health(
    health: HealthReporter,
    mut store: crate::store::StoreHealth,
    cancel: CancellationToken,
) {
    let mut reported = ServingStatus::Serving;
    loop {
        tokio::select! {
            changed = store.changed() => if changed.is_err() { return },
            () = cancel.cancelled() => return,
        }
        // Each failed retry sends its error again: only a change of status is reported.
        let status = match store.borrow_and_update().as_ref() {
            Some(error) if reported == ServingStatus::Serving => {
                tracing::warn!(%error, "health: NOT_SERVING while the state store fails");
                ServingStatus::NotServing
            }
            Some(_) => continue,
            None if reported == ServingStatus::Serving => continue,
            None => {
                tracing::info!("health: SERVING, the state store writes again");
                ServingStatus::Serving
            }
        };
        reported = status;
        health
            .set_service_status(SCHEDULER_HEALTH_SERVICE, status)
            .await;
        health.set_service_status("", status).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::SchedulerCommand;
    use crate::store::MemoryStore;

    /// A core that stops on its own stops the server too, with an error the binary turns
    /// into a non-zero exit; before, the port kept answering UNAVAILABLE forever.
    #[tokio::test]
    async fn a_core_that_panics_stops_the_server_with_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = start_scheduler(
            listener,
            CoreConfig::default(),
            Arc::new(MemoryStore::default()),
            ServerSecurity::open(),
            CancellationToken::new(),
        )
        .unwrap();
        let addr = server.local_addr;
        server
            .handle
            .send(SchedulerCommand::PanicForTest)
            .await
            .unwrap();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), server.task)
            .await
            .expect("the server stops")
            .expect("the server task itself does not panic");
        match ended {
            Err(SchedulerError::CoreStopped(why)) => {
                assert!(why.contains("panicked on purpose"), "{why}")
            }
            other => panic!("expected CoreStopped, got {other:?}"),
        }
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the port is closed"
        );
    }

    /// A cancelled server ends cleanly.
    #[tokio::test]
    async fn a_cancelled_server_ends_ok() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cancel = CancellationToken::new();
        let server = start_scheduler(
            listener,
            CoreConfig::default(),
            Arc::new(MemoryStore::default()),
            ServerSecurity::open(),
            cancel.clone(),
        )
        .unwrap();
        cancel.cancel();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), server.task)
            .await
            .expect("the server stops")
            .unwrap();
        assert!(ended.is_ok(), "{ended:?}");
    }
}
