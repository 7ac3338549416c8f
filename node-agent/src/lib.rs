//! The Resident node agent: finds GPUs, dials out to the scheduler, hosts resident actors.

#![warn(missing_docs)]

pub mod backends;
#[cfg(feature = "cli")]
pub mod command;
/// The agent's errors.
pub mod error;
pub mod gpu;
pub mod host;
pub mod model_cache;
pub mod observe;
pub mod session;
mod uplink;

pub use error::{AgentError, BackendError};
pub use session::{AgentConfig, parse_labels, run_agent};
