//! Small pure policies.

pub mod backoff;
pub mod field_limits;
pub mod reconcile;
