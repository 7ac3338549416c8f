//! Small pure policies.

pub mod backoff;
