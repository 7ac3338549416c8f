//! What can stop a sweep, one enum for the sweep's modules (a leaf: each of them names it).

use resident_sdk::SdkError;

use super::config::SweepConfigError;

/// Why a sweep stopped.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The sweep's TOML was refused.
    #[error(transparent)]
    Config(#[from] SweepConfigError),
    /// The data file is missing, unreadable or too small.
    #[error("sweep data: {0}")]
    Data(String),
    /// The output directory cannot be written (or holds another run's lock).
    #[error("sweep output: {0}")]
    Output(String),
    /// The output directory holds another sweep (what differs is said).
    #[error("{0}")]
    Mismatch(String),
    /// The model could not be pinned or loaded.
    #[error("model did not load: {0}")]
    Model(String),
    /// The cluster failed the sweep's job.
    #[error("cluster: {0}")]
    Cluster(String),
    /// A call to the cluster failed.
    #[error("cluster: {0}")]
    Sdk(#[from] SdkError),
}
