/// Errors of one actor kind, loading a model or running a task: the models' own error,
/// so that a model's error (out of device memory included) reaches the task's outcome as it
/// was raised. Custom kinds return it too (`resident_sdk::actor::BackendError`).
pub use resident_models::ModelError as BackendError;

/// Errors of the agent process.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// `--simulate-gpus` does not parse.
    #[error("invalid --simulate-gpus spec `{spec}`: {reason}")]
    GpuSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A fault-injection variable (`RESIDENT_FAULT_*`) does not parse.
    #[error("invalid fault injection: {0}")]
    FaultInjection(String),
    /// A `--label` is not `key=value`.
    #[error("invalid label `{0}`: expected key=value")]
    Label(String),
    /// The scheduler URL (or its TLS settings) is unusable.
    #[error(transparent)]
    SchedulerUrl(#[from] resident_proto::connect::ConnectError),
    /// The scheduler could not be reached.
    #[error("cannot reach scheduler")]
    Connect(#[from] tonic::transport::Error),
    /// The scheduler refused the session (a bad token, a node id taken).
    #[error("scheduler refused the session: {0}")]
    Refused(#[from] tonic::Status),
    /// The scheduler ended the session.
    #[error("scheduler closed the session")]
    SessionClosed,
    /// GPUs failed as `--restart-after-gpu-failure` says: the agent drained and stopped, to
    /// be started again (why, and what to check).
    #[error("{0}")]
    RestartForFailedGpus(String),
    /// The registration went unanswered for this long.
    #[error("the scheduler did not answer the registration within {0:?}")]
    RegisterTimeout(std::time::Duration),
}
