/// Errors of one actor kind: loading a model or running a chunk.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("invalid actor config: {0}")]
    InvalidConfig(String),
    #[error("load failed: {0}")]
    Load(String),
    #[error("bad task payload: {0}")]
    BadPayload(String),
    #[error("{0}")]
    Task(String),
}

impl BackendError {
    /// Retrying elsewhere cannot help: the input itself is wrong.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            BackendError::BadPayload(_) | BackendError::InvalidConfig(_)
        )
    }
}

impl BackendError {
    /// A task named a method the kind does not have.
    pub fn unknown_method(kind: &str, method: &str, known: &[&str]) -> Self {
        let known = if known.is_empty() {
            "it has only its default method".to_owned()
        } else {
            format!("its methods: {}", known.join(", "))
        };
        BackendError::BadPayload(format!(
            "actor kind `{kind}` has no method `{method}` ({known})"
        ))
    }
}

impl From<resident_models::ModelError> for BackendError {
    fn from(error: resident_models::ModelError) -> Self {
        use resident_models::ModelError as M;
        match error {
            M::InvalidConfig(message) => BackendError::InvalidConfig(message),
            M::Load(message) => BackendError::Load(message),
            M::BadPayload(message) => BackendError::BadPayload(message),
            M::Task(message) => BackendError::Task(message),
            M::OutOfMemory(message) => {
                BackendError::Task(format!("out of device memory: {message}"))
            }
        }
    }
}

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
