use std::pin::Pin;

use futures::{Stream, StreamExt};
use resident_proto::pb;
use resident_proto::pb::node_agent_service_server::NodeAgentService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use crate::auth::{Action, audit, principal_of, require};
use crate::core::{SchedulerCommand, SchedulerHandle};

/// Serves the stream each agent dials out to.
pub struct AgentSessionService {
    pub scheduler: SchedulerHandle,
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
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.and_then(|m| m.body);
        let Some(pb::agent_message::Body::Register(register)) = first else {
            return Err(Status::invalid_argument(
                "the first agent message must be a registration",
            ));
        };
        let node = register.node_id.clone();
        let (outbound, outbound_rx) = mpsc::unbounded_channel();
        let session = self
            .scheduler
            .call(|reply| SchedulerCommand::RegisterNode {
                register,
                credential: principal.name.clone(),
                outbound,
                reply,
            })
            .await
            .map_err(Status::from);
        let session = audit::outcome(&principal, "join", &node, session)?;
        let scheduler = self.scheduler.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = inbound.next().await {
                let Some(message) = message.body else {
                    continue;
                };
                if scheduler
                    .send(SchedulerCommand::AgentMessage { session, message })
                    .is_err()
                {
                    return;
                }
            }
            audit::done(&principal, "leave", &node);
            let _ = scheduler.send(SchedulerCommand::AgentGone { session });
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            outbound_rx,
        ))))
    }
}
