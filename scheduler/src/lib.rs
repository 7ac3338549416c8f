//! The Resident scheduler: node registry, pure placement, actor lifecycle and task dispatch.

pub mod auth;
pub mod budget;
pub mod core;
pub mod error;
pub mod http;
pub mod metrics;
pub mod placement;
pub mod policy;
pub mod server;
pub mod service;
pub mod state;
pub mod store;

pub use error::SchedulerError;
