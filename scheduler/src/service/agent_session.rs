use std::pin::Pin;

use futures::{Stream, StreamExt};
use resident_proto::pb;
use resident_proto::pb::node_agent_service_server::NodeAgentService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use crate::auth::pki::certificate_names_node;
use crate::auth::{Action, audit, principal_of, require};
use crate::core::{LastHeard, SchedulerCommand, SchedulerHandle};

/// Serves the stream each agent dials out to.
pub struct AgentSessionService {
    pub scheduler: SchedulerHandle,
    /// Mutual TLS: the agent's client certificate must name the node id it registers.
    pub require_agent_certificate: bool,
}

type OutboundStream = Pin<Box<dyn Stream<Item = Result<pb::SchedulerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl NodeAgentService for AgentSessionService {
    type SessionStream = OutboundStream;

    #[instrument(skip_all)]
    async fn session(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let principal = principal_of(&request)?;
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        require(&principal, Action::AgentSession, "join", &peer)?;
        let certificate = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| c.to_vec()));
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.and_then(|m| m.body);
        let Some(pb::agent_message::Body::Register(register)) = first else {
            return Err(Status::invalid_argument(
                "the first agent message must be a registration",
            ));
        };
        let node = register.node_id.clone();
        if self.require_agent_certificate {
            check_agent_certificate(certificate.as_deref(), &node).map_err(|reason| {
                audit::refused(&principal, "join", &node, &reason);
                Status::permission_denied(reason)
            })?;
        }
        let (outbound, outbound_rx) = mpsc::unbounded_channel();
        let last_heard = LastHeard::now();
        let session = self
            .scheduler
            .call(|reply| SchedulerCommand::RegisterNode {
                register,
                credential: principal.name.clone(),
                outbound,
                last_heard: last_heard.clone(),
                reply,
            })
            .await
            .map_err(Status::from);
        let session = audit::outcome(&principal, "join", &node, session)?;
        let scheduler = self.scheduler.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = inbound.next().await {
                last_heard.heard();
                let Some(message) = message.body else {
                    continue;
                };
                if scheduler
                    .send(SchedulerCommand::AgentMessage { session, message })
                    .await
                    .is_err()
                {
                    return;
                }
            }
            audit::done(&principal, "leave", &node);
            let _ = scheduler
                .send(SchedulerCommand::AgentGone { session })
                .await;
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            outbound_rx,
        ))))
    }
}

/// With mutual TLS the node id is the certificate's identity: the agent's verified client
/// certificate must name it.
fn check_agent_certificate(certificate: Option<&[u8]>, node: &str) -> Result<(), String> {
    let Some(der) = certificate else {
        return Err(format!(
            "this scheduler requires agents to present a client certificate (mutual TLS); give node `{node}` one from `resident certs agent --node-id {node}` with --client-cert and --client-key"
        ));
    };
    if certificate_names_node(der, node) {
        Ok(())
    } else {
        Err(format!(
            "the agent's client certificate is not issued for node id `{node}`; with mutual TLS the node id is the certificate's name"
        ))
    }
}
