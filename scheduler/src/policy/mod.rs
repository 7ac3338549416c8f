//! Small pure policies.

pub mod backoff;
pub mod reconcile;
