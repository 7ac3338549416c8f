//! Actor lifecycle state.

pub mod actor;
pub mod task;

pub use actor::{ActorEvent, ActorState, InvalidTransition, Restarts, transition};
pub use task::{InvalidTaskTransition, JobCounts, TaskEnd, TaskEvent, TaskLifecycle, TaskState};
