/// Errors of loading or running a model, and of every actor kind (the agent calls it
/// `BackendError`): a custom kind returns it too.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The actor's config is wrong (what and how to fix it is said).
    #[error("invalid actor config: {0}")]
    InvalidConfig(String),
    /// The model (or the kind's state) could not be loaded.
    #[error("load failed: {0}")]
    Load(String),
    /// The task's payload is wrong: retrying it cannot help.
    #[error("bad task payload: {0}")]
    BadPayload(String),
    /// Running the task failed; it may succeed on a retry or elsewhere.
    #[error("{0}")]
    Task(String),
    /// The device ran out of memory: a smaller batch may fit.
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
}

impl ModelError {
    /// Retrying elsewhere cannot help: the input itself is wrong.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            ModelError::BadPayload(_) | ModelError::InvalidConfig(_)
        )
    }

    /// A task named a method the actor kind `kind` does not have (`known` are its methods).
    pub fn unknown_method(kind: &str, method: &str, known: &[&str]) -> Self {
        let known = if known.is_empty() {
            "it has only its default method".to_owned()
        } else {
            format!("its methods: {}", known.join(", "))
        };
        ModelError::BadPayload(format!(
            "actor kind `{kind}` has no method `{method}` ({known})"
        ))
    }

    /// A candle error, told apart as [`ModelError::OutOfMemory`] when the device ran out.
    pub fn from_candle(error: candle_core::Error) -> Self {
        if is_out_of_memory(&error) {
            ModelError::OutOfMemory(error.to_string())
        } else {
            ModelError::Task(error.to_string())
        }
    }
}

/// Whether a device operation failed for want of memory: the CUDA driver's
/// `CUDA_ERROR_OUT_OF_MEMORY`, or cuBLAS failing to allocate its workspace.
pub(crate) fn is_out_of_memory(error: &candle_core::Error) -> bool {
    let text = error.to_string().to_ascii_lowercase();
    text.contains("out of memory")
        || text.contains("out_of_memory")
        || text.contains("cublas_status_alloc_failed")
}

impl From<candle_core::Error> for ModelError {
    fn from(error: candle_core::Error) -> Self {
        ModelError::Task(error.to_string())
    }
}
