//! What can stop a corpus job: one error for every part of the pipeline (a leaf).

use resident_sdk::SdkError;

/// Why a corpus job stopped; each says what was wrong and, where there is one, what to do.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The input cannot be listed or read.
    #[error("input: {0}")]
    Input(String),
    /// The output cannot be written (or holds another run's lock).
    #[error("output: {0}")]
    Output(String),
    /// A record is malformed and the job was told to fail on one.
    #[error(
        "bad record at {file}:{line}: {reason} (use --on-bad-record skip to skip such records)"
    )]
    BadRecord {
        /// The input file.
        file: String,
        /// Its line, from 1.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The output holds another job's work (another input, model or settings): what
    /// differs.
    #[error("{0}")]
    Mismatch(String),
    /// The model could not be pinned or loaded.
    #[error("model did not load: {0}")]
    Model(String),
    /// A chunk size whose results would not fit in one message.
    #[error("{0}")]
    ChunkSize(String),
    /// A chunk failed every attempt.
    #[error("chunk {index} failed: {error}")]
    ChunkFailed {
        /// The chunk's index.
        index: u64,
        /// Its last attempt's error.
        error: String,
    },
    /// A call to the cluster failed.
    #[error(transparent)]
    Cluster(#[from] SdkError),
}
