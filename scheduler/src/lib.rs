//! The Resident scheduler: node registry, pure placement, actor lifecycle and task dispatch.
//!
//! Its public face is what the `resident` binary, the SDK's local mode, the benchmarks and
//! the tests use: [`server::start_scheduler`] with a [`core::CoreConfig`] and a
//! [`store`], the HTTP port ([`http::serve_http`]), auth files and certificates
//! ([`auth`]), and the loop's command handle for in-process benchmarks
//! ([`core::spawn_scheduler_loop`]). Placement, policy, the state machines, budgets, metrics
//! and the gRPC services are internal. The modules form no cycle (`module_map` checks it).

#![warn(missing_docs)]

pub mod auth;
mod budget;
pub mod connections;
pub mod core;
mod error;
pub mod http;
mod metrics;
#[cfg(test)]
mod module_map;
mod placement;
mod policy;
pub mod server;
mod service;
mod state;
pub mod store;

pub use error::SchedulerError;
