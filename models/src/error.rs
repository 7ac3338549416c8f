/// Errors of loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid actor config: {0}")]
    InvalidConfig(String),
    #[error("load failed: {0}")]
    Load(String),
    #[error("bad task payload: {0}")]
    BadPayload(String),
    #[error("{0}")]
    Task(String),
}

impl From<candle_core::Error> for ModelError {
    fn from(error: candle_core::Error) -> Self {
        ModelError::Task(error.to_string())
    }
}
