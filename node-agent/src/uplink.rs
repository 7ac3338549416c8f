//! The agent's uplink, apart from what sends on it (the actor host, task progress) and what
//! forwards it (the session), so each of them depends on it and not on the others.

use resident_proto::pb;
use tokio::sync::mpsc;

/// Where actors send messages to the scheduler (reports, task outcomes): the agent's uplink,
/// which lives as long as the agent and is forwarded to whichever session is current.
pub type ToScheduler = mpsc::UnboundedSender<pb::AgentMessage>;
