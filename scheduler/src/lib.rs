//! The Resident scheduler: node registry, pure placement, actor lifecycle and task dispatch.

pub mod placement;
pub mod policy;
pub mod state;
pub mod store;
