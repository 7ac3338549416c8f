//! gRPC handlers: each converts, hands the work to the scheduler loop and maps errors.

mod agent_session;
mod client_api;
mod listing;

pub use agent_session::AgentSessionService;
pub use client_api::ClientApiService;
