/// Errors of one actor kind, loading a model or running a task: the models' own error,
/// so that a model's error (out of device memory included) reaches the task's outcome as it
/// was raised. Custom kinds return it too (`resident_sdk::actor::BackendError`).
pub use resident_models::ModelError as BackendError;

/// Errors of the agent process.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid --simulate-gpus spec `{spec}`: {reason}")]
    GpuSpec { spec: String, reason: String },
    #[error("invalid label `{0}`: expected key=value")]
    Label(String),
    #[error(transparent)]
    SchedulerUrl(#[from] resident_proto::connect::ConnectError),
    #[error("cannot reach scheduler")]
    Connect(#[from] tonic::transport::Error),
    #[error("scheduler refused the session: {0}")]
    Refused(#[from] tonic::Status),
    #[error("scheduler closed the session")]
    SessionClosed,
    #[error("the scheduler did not answer the registration within {0:?}")]
    RegisterTimeout(std::time::Duration),
}
