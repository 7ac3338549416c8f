//! Starting a scheduler: the loop plus both gRPC services on a pre-bound listener.

use std::sync::Arc;

use resident_proto::pb::node_agent_service_server::NodeAgentServiceServer;
use resident_proto::pb::scheduler_service_server::SchedulerServiceServer;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::core::{CoreConfig, SchedulerHandle, spawn_scheduler_loop};
use crate::error::SchedulerError;
use crate::service::{AgentSessionService, ClientApiService};
use crate::store::DurableStore;

pub struct SchedulerServer {
    pub handle: SchedulerHandle,
    pub local_addr: std::net::SocketAddr,
    pub task: tokio::task::JoinHandle<()>,
}

/// Serves the scheduler on `listener` until `cancel` fires.
pub fn start_scheduler(
    listener: TcpListener,
    config: CoreConfig,
    store: Arc<dyn DurableStore>,
    cancel: CancellationToken,
) -> Result<SchedulerServer, SchedulerError> {
    let local_addr = listener
        .local_addr()
        .map_err(|e| SchedulerError::Precondition(format!("listener has no address: {e}")))?;
    let (handle, loop_task) = spawn_scheduler_loop(config, store, cancel.clone())?;
    let agents = AgentSessionService {
        scheduler: handle.clone(),
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
        let served = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
            .add_service(
                NodeAgentServiceServer::new(agents)
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20),
            )
            .add_service(
                SchedulerServiceServer::new(clients)
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20),
            )
            .serve_with_incoming_shutdown(incoming, cancel.cancelled())
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "scheduler server stopped");
        }
        let _ = loop_task.await;
    });
    tracing::info!(%local_addr, "scheduler listening");
    Ok(SchedulerServer {
        handle,
        local_addr,
        task,
    })
}
