//! What can stop a corpus job: one error for every part of the pipeline (a leaf).

use resident_sdk::SdkError;

/// Why a corpus job stopped; each says what was wrong and, where there is one, what to do.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("input: {0}")]
    Input(String),
    #[error("output: {0}")]
    Output(String),
    #[error(
        "bad record at {file}:{line}: {reason} (use --on-bad-record skip to skip such records)"
    )]
    BadRecord {
        file: String,
        line: u64,
        reason: String,
    },
    #[error("{0}")]
    Mismatch(String),
    #[error("model did not load: {0}")]
    Model(String),
    /// A chunk size whose results would not fit in one message.
    #[error("{0}")]
    ChunkSize(String),
    #[error("chunk {index} failed: {error}")]
    ChunkFailed { index: u64, error: String },
    #[error(transparent)]
    Cluster(#[from] SdkError),
}
