//! Starting a scheduler: the loop plus both gRPC services on a pre-bound listener.

use std::sync::Arc;

use resident_proto::pb::node_agent_service_server::NodeAgentServiceServer;
use resident_proto::pb::scheduler_service_server::SchedulerServiceServer;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;

use crate::auth::AuthGate;
use crate::core::{CoreConfig, SchedulerHandle, spawn_scheduler_loop};
use crate::error::SchedulerError;
use crate::service::{AgentSessionService, ClientApiService};
use crate::store::DurableStore;

pub struct SchedulerServer {
    pub handle: SchedulerHandle,
    pub local_addr: std::net::SocketAddr,
    /// `https://addr` when serving TLS, else `http://addr`.
    pub url: String,
    pub task: tokio::task::JoinHandle<()>,
}

/// The scheduler's certificate chain and private key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// How the port is protected: TLS or plaintext, tokens or open.
#[derive(Clone)]
pub struct ServerSecurity {
    pub tls: Option<TlsIdentity>,
    /// CA (PEM) of agents' client certificates: with it, every agent session must present
    /// one naming its node id (mutual TLS). Clients need none.
    pub agent_ca_pem: Option<Vec<u8>>,
    pub auth: AuthGate,
}

impl ServerSecurity {
    /// Plaintext, no tokens: loopback and in-process clusters.
    pub fn open() -> Self {
        Self {
            tls: None,
            agent_ca_pem: None,
            auth: AuthGate::open(),
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
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)));
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
    let (handle, loop_task) = spawn_scheduler_loop(config, store, cancel.clone())?;
    let agents = AgentSessionService {
        scheduler: handle.clone(),
        require_agent_certificate: security.agent_ca_pem.is_some(),
    };
    let clients = ClientApiService {
        scheduler: handle.clone(),
        max_outstanding_per_job: 16_384,
    };
    let incoming = TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(stream)
    });
    let task = tokio::spawn(async move {
        let served = builder
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
            .serve_with_incoming_shutdown(incoming, cancel.cancelled())
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "scheduler server stopped");
        }
        let _ = loop_task.await;
    });
    let scheme = if security_tls { "https" } else { "http" };
    let url = format!("{scheme}://{local_addr}");
    tracing::info!(%url, "scheduler listening");
    Ok(SchedulerServer {
        handle,
        local_addr,
        url,
        task,
    })
}
