//! What an actor's model loop is handed for each task, and how a task's answer leaves it.
//! A leaf: the actor thread (`actor_thread.rs`) and the serving of a backend that takes
//! tasks while it runs (`fed_tasks.rs`) both build on it.

use resident_proto::{panic_text, pb};

use crate::backends::{BackendError, Prepared, TaskSize};

/// What the model loop receives for one task.
pub(super) struct Work {
    pub task: pb::RunTask,
    pub span: tracing::Span,
    pub input: Input,
}

impl Work {
    /// A task of the default method, neither prepared nor cancelled: the kind a backend
    /// that takes tasks while it runs is handed.
    pub fn is_plain(&self) -> bool {
        matches!(self.input, Input::Raw) && self.task.method.is_empty()
    }
}

/// A task's input as the preparation thread hands it over.
pub(super) enum Input {
    Raw,
    Prepared(Result<Prepared, TaskError>),
    Cancelled,
}

/// A task's error as reported to the scheduler.
#[derive(Clone)]
pub(super) struct TaskError {
    pub message: String,
    pub permanent: bool,
    /// The kind's code panicked: the actor stops after reporting it, to be restarted with
    /// a fresh model.
    pub panicked: bool,
}

impl TaskError {
    pub fn transient(message: String) -> Self {
        Self {
            message,
            permanent: false,
            panicked: false,
        }
    }

    pub fn permanent(message: String) -> Self {
        Self {
            message,
            permanent: true,
            panicked: false,
        }
    }

    pub fn panic(stage: &str, panic: &(dyn std::any::Any + Send)) -> Self {
        Self {
            message: format!("{stage} panicked: {}", panic_text(panic)),
            permanent: false,
            panicked: true,
        }
    }
}

impl From<BackendError> for TaskError {
    fn from(error: BackendError) -> Self {
        Self {
            permanent: error.is_permanent(),
            message: error.to_string(),
            panicked: false,
        }
    }
}

/// How a task ran, for its outcome and the actor's counters.
pub(super) struct Ran {
    /// From the task's start to its answer.
    pub run_micros: u64,
    /// The actor's busy time this answer adds (less than `run_micros` when tasks ran
    /// together).
    pub busy_micros: u64,
    pub size: TaskSize,
}

/// Where an actor's task answers go: the scheduler, and the actor's counters.
pub(super) trait TaskAnswers: Sync {
    /// Sends `task`'s outcome and counts it; `false` once the agent's uplink is gone.
    fn send_outcome(&self, task: pb::RunTask, result: Result<Vec<u8>, TaskError>, ran: Ran)
    -> bool;

    /// The actor's progress reporter.
    fn progress(&self) -> &crate::backends::TaskProgress;
}
