//! `echo`: returns its payload. The no-op actor of the benchmarks, with knobs that make it
//! slow, failing, panicking or hanging on purpose for fault tests: `{"delay_ms": 5,
//! "fail_prefix": "FAIL", "panic_prefix": "PANIC", "hang_prefix": "HANG", "load_delay_ms":
//! 100, "fail_load": false, "repeat": 1}`.

use std::time::Duration;

use serde::Deserialize;

use super::{ActorKind, BackendError, LoadContext, ModelBackend};

/// The `echo` kind: answers each payload with itself, after an optional delay; its config
/// can make it fail, panic or hang on chosen payloads, for tests of what the runtime does
/// then.
pub struct EchoKind;

/// The `echo` kind's pool config (JSON).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoConfig {
    /// Each task sleeps this long before answering.
    #[serde(default)]
    pub delay_ms: u64,
    /// Payloads starting with this fail with an error.
    #[serde(default)]
    pub fail_prefix: Option<String>,
    /// Payloads starting with this panic the actor thread (as a broken model would).
    #[serde(default)]
    pub panic_prefix: Option<String>,
    /// Payloads starting with this never return (as a hung kernel would): the thread sleeps
    /// until the process ends, whatever it is told.
    #[serde(default)]
    pub hang_prefix: Option<String>,
    /// Loading sleeps this long first, as a model load would take.
    #[serde(default)]
    pub load_delay_ms: u64,
    /// Loading fails (every actor of the pool dies at start).
    #[serde(default)]
    pub fail_load: bool,
    /// The output is the payload this many times over (0 or 1: once), for results larger
    /// than any payload may be.
    #[serde(default)]
    pub repeat: usize,
}

struct Echo {
    config: EchoConfig,
}

impl ActorKind for EchoKind {
    fn name(&self) -> &str {
        "echo"
    }

    fn load(&self, context: &LoadContext) -> Result<Box<dyn ModelBackend>, BackendError> {
        let config: EchoConfig = context.parse_config()?;
        if config.load_delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(config.load_delay_ms));
        }
        if config.fail_load {
            return Err(BackendError::Load(
                "echo was configured to fail loading".into(),
            ));
        }
        Ok(Box::new(Echo { config }))
    }
}

impl ModelBackend for Echo {
    fn run_chunk(&mut self, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
        if self.config.delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.config.delay_ms));
        }
        if let Some(prefix) = &self.config.fail_prefix
            && payload.starts_with(prefix.as_bytes())
        {
            return Err(BackendError::Task(format!(
                "payload starts with `{prefix}`"
            )));
        }
        if let Some(prefix) = &self.config.panic_prefix
            && payload.starts_with(prefix.as_bytes())
        {
            panic!("payload starts with `{prefix}`");
        }
        if let Some(prefix) = &self.config.hang_prefix
            && payload.starts_with(prefix.as_bytes())
        {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        // Sized before it is allocated: an allocation that fails aborts the agent.
        let repeat = self.config.repeat.max(1);
        let bytes = payload.len().saturating_mul(repeat);
        if bytes > resident_proto::MAX_RESULT_BYTES {
            return Err(BackendError::BadPayload(format!(
                "{} (echo's `repeat` is {repeat})",
                resident_proto::oversized_result_error(bytes)
            )));
        }
        Ok(payload.repeat(repeat))
    }
}
