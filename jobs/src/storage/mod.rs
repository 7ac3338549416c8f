//! Where a job reads and writes: `resident-storage`'s locations and S3 client, plus the
//! lease that keeps two runs from writing one S3 output.

pub mod lease;

pub use resident_storage::*;
