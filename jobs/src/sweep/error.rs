//! What can stop a sweep, one enum for the sweep's modules (a leaf: each of them names it).

use resident_sdk::SdkError;

use super::config::SweepConfigError;

/// Why a sweep stopped.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Config(#[from] SweepConfigError),
    #[error("sweep data: {0}")]
    Data(String),
    #[error("sweep output: {0}")]
    Output(String),
    #[error("{0}")]
    Mismatch(String),
    #[error("model did not load: {0}")]
    Model(String),
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("cluster: {0}")]
    Sdk(#[from] SdkError),
}
