//! The Resident scheduler: node registry, pure placement, actor lifecycle and task dispatch.

pub mod placement;
