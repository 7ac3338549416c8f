//! Actor and task lifecycle state, and the counters that go with it.

pub mod actor;
pub mod task;
pub mod work;

pub use actor::{ActorEvent, ActorState, Restarts, transition};
pub use task::{JobCounts, TaskEnd, TaskEvent, TaskLifecycle, TaskState};
pub use work::ActorWork;
