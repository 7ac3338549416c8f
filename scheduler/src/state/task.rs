//! The task state machine. [`TaskLifecycle::apply`] is the only way a task's state changes,
//! and it moves the task between its job's counters in the same step, so the counters always
//! add up to the number of submitted tasks.
//!
//! ```text
//!            Dispatch                         Succeed
//!   Queued ────────────▶ Running{actor, n} ─────────▶ Done(Succeeded)
//!     ▲ ▲                  │  │  │
//!     │ └──── Lose ────────┘  │  └─ Fail{retry_at: Some(t)} ─▶ BackingOff{until: t} ─┐
//!     │      (node or actor   │                                                      │
//!     │       gone)           └─ Fail{retry_at: None} ─▶ Done(Failed)                │
//!     └─────────────────────────────── Release (t reached) ──────────────────────────┘
//!
//!   Queued ── AnsweredEarlier ──▶ Done(Succeeded)   (an agent held its output across a restart)
//!   Queued / BackingOff ── Fail{None} ──▶ Done(Failed)      (pool deleted, bad payload)
//!   Queued / BackingOff ── Cancel ──▶ Done(Cancelled)
//!   Running ── Cancel ──▶ Cancelling{actor, n} ── Settle / Lose ──▶ Done(Cancelled)
//! ```
//!
//! Done is terminal. Job counters: Queued and BackingOff count as `queued`, Running as
//! `running`, Cancelling and Done(Cancelled) as `cancelled`, Done(Succeeded) as `succeeded`,
//! Done(Failed) as `failed`. A cancelling task still holds its actor's credit until the
//! actor answers (Settle) or is lost.

use std::fmt;

use resident_proto::{ActorId, pb};
use tokio::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// In its pool's queue.
    Queued,
    /// Failed; waits until `until` before going back to the queue.
    BackingOff {
        until: Instant,
    },
    /// Sent to `actor` as dispatch number `dispatch` (1 for the first).
    Running {
        actor: ActorId,
        dispatch: u32,
    },
    /// Cancelled while running: the actor's answer is dropped when it comes.
    Cancelling {
        actor: ActorId,
        dispatch: u32,
    },
    Done(TaskEnd),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskEnd {
    Succeeded,
    Failed,
    Cancelled,
}

impl TaskEnd {
    /// How a task that ran to an outcome ended: succeeded or failed.
    pub fn of_outcome(ok: bool) -> Self {
        if ok { Self::Succeeded } else { Self::Failed }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// Credit was free on a ready actor.
    Dispatch { actor: ActorId, dispatch: u32 },
    /// The actor returned an output.
    Succeed,
    /// The actor (or the scheduler) failed it: retry at `retry_at`, or never.
    Fail { retry_at: Option<Instant> },
    /// The backoff is over.
    Release,
    /// The actor or its node is gone while the task ran.
    Lose,
    /// The job was cancelled (by the user or because its client went away).
    Cancel,
    /// A cancelling task's actor answered; the answer is dropped.
    Settle,
    /// An output for the task arrived from a dispatch made before the scheduler restarted
    /// (the agent held it): the queued task is done without running again.
    AnsweredEarlier,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTaskTransition {
    pub from: TaskState,
    pub event: TaskEvent,
}

impl fmt::Display for InvalidTaskTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task cannot take {:?} while {:?}", self.event, self.from)
    }
}

/// The next state, or why the event does not apply.
pub fn transition(from: &TaskState, event: TaskEvent) -> Result<TaskState, InvalidTaskTransition> {
    use TaskEvent as E;
    use TaskState as S;
    let to = match (from, &event) {
        (S::Queued, E::Dispatch { actor, dispatch }) => S::Running {
            actor: actor.clone(),
            dispatch: *dispatch,
        },
        (S::Running { .. }, E::Succeed) | (S::Queued, E::AnsweredEarlier) => {
            S::Done(TaskEnd::Succeeded)
        }
        (S::Running { .. } | S::Queued | S::BackingOff { .. }, E::Fail { retry_at: None }) => {
            S::Done(TaskEnd::Failed)
        }
        (S::Running { .. }, E::Fail { retry_at: Some(at) }) => S::BackingOff { until: *at },
        (S::BackingOff { .. }, E::Release) => S::Queued,
        (S::Running { .. }, E::Lose) => S::Queued,
        (S::Queued | S::BackingOff { .. }, E::Cancel) => S::Done(TaskEnd::Cancelled),
        (S::Running { actor, dispatch }, E::Cancel) => S::Cancelling {
            actor: actor.clone(),
            dispatch: *dispatch,
        },
        (S::Cancelling { .. }, E::Settle | E::Lose) => S::Done(TaskEnd::Cancelled),
        _ => {
            return Err(InvalidTaskTransition {
                from: from.clone(),
                event,
            });
        }
    };
    Ok(to)
}

/// A job's task counters; each submitted task is in exactly one of the other five.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCounts {
    pub submitted: u64,
    pub queued: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
}

impl JobCounts {
    fn bucket(&mut self, state: &TaskState) -> &mut u64 {
        match state {
            TaskState::Queued | TaskState::BackingOff { .. } => &mut self.queued,
            TaskState::Running { .. } => &mut self.running,
            TaskState::Cancelling { .. } | TaskState::Done(TaskEnd::Cancelled) => {
                &mut self.cancelled
            }
            TaskState::Done(TaskEnd::Succeeded) => &mut self.succeeded,
            TaskState::Done(TaskEnd::Failed) => &mut self.failed,
        }
    }

    /// Tasks not finished yet.
    pub fn outstanding(&self) -> u64 {
        self.queued + self.running
    }

    pub fn from_status(status: &pb::JobStatus) -> Self {
        Self {
            submitted: status.submitted,
            queued: status.queued,
            running: status.running,
            succeeded: status.succeeded,
            failed: status.failed,
            cancelled: status.cancelled,
        }
    }

    /// Writes the counters into a job status.
    pub fn fill(&self, status: &mut pb::JobStatus) {
        status.submitted = self.submitted;
        status.queued = self.queued;
        status.running = self.running;
        status.succeeded = self.succeeded;
        status.failed = self.failed;
        status.cancelled = self.cancelled;
    }
}

/// One task's state and how many times it was sent to an actor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLifecycle {
    state: TaskState,
    dispatches: u32,
}

impl TaskLifecycle {
    /// A newly submitted task: queued, and counted as submitted and queued.
    pub fn submitted(counts: &mut JobCounts) -> Self {
        counts.submitted += 1;
        counts.queued += 1;
        Self {
            state: TaskState::Queued,
            dispatches: 0,
        }
    }

    /// A task its client sent again after a restart, though it was recorded as finished
    /// (`earlier`; the client never got that result): it leaves that counter for `queued`,
    /// and `submitted` stays as it was.
    pub fn resubmitted(counts: &mut JobCounts, earlier: TaskEnd) -> Self {
        let bucket = counts.bucket(&TaskState::Done(earlier));
        *bucket = bucket.saturating_sub(1);
        counts.queued += 1;
        Self {
            state: TaskState::Queued,
            dispatches: 0,
        }
    }

    pub fn state(&self) -> &TaskState {
        &self.state
    }

    /// Times sent to an actor so far.
    pub fn dispatches(&self) -> u32 {
        self.dispatches
    }

    /// The actor the task runs on (or is being cancelled on).
    pub fn actor(&self) -> Option<&ActorId> {
        match &self.state {
            TaskState::Running { actor, .. } | TaskState::Cancelling { actor, .. } => Some(actor),
            _ => None,
        }
    }

    /// Whether an answer from `actor` for dispatch `dispatch` is the one awaited (anything
    /// else is late: an older dispatch, or an actor the task was taken from).
    pub fn awaits(&self, actor: &ActorId, dispatch: u32) -> bool {
        self.actor() == Some(actor)
            && matches!(
                &self.state,
                TaskState::Running { dispatch: d, .. } | TaskState::Cancelling { dispatch: d, .. }
                    if *d == dispatch
            )
    }

    /// Applies `event`, moving the task between `counts` buckets; on error nothing changes.
    pub fn apply(
        &mut self,
        event: TaskEvent,
        counts: &mut JobCounts,
    ) -> Result<&TaskState, InvalidTaskTransition> {
        let to = transition(&self.state, event)?;
        *counts.bucket(&self.state) -= 1;
        *counts.bucket(&to) += 1;
        if let TaskState::Running { dispatch, .. } = &to {
            self.dispatches = *dispatch;
        }
        self.state = to;
        Ok(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn actor(name: &str) -> ActorId {
        ActorId::new(name)
    }

    fn dispatch(task: &TaskLifecycle, name: &str) -> TaskEvent {
        TaskEvent::Dispatch {
            actor: actor(name),
            dispatch: task.dispatches() + 1,
        }
    }

    fn sums_to_submitted(counts: &JobCounts) -> bool {
        counts.queued + counts.running + counts.succeeded + counts.failed + counts.cancelled
            == counts.submitted
    }

    #[test]
    fn a_retried_task_counts_once_and_numbers_its_dispatches() {
        let mut counts = JobCounts::default();
        let mut task = TaskLifecycle::submitted(&mut counts);
        task.apply(dispatch(&task, "a"), &mut counts).unwrap();
        assert_eq!(counts.running, 1);
        assert!(task.awaits(&actor("a"), 1));
        let at = Instant::now() + Duration::from_secs(1);
        task.apply(TaskEvent::Fail { retry_at: Some(at) }, &mut counts)
            .unwrap();
        assert_eq!(task.state(), &TaskState::BackingOff { until: at });
        assert_eq!((counts.queued, counts.running), (1, 0));
        task.apply(TaskEvent::Release, &mut counts).unwrap();
        task.apply(dispatch(&task, "b"), &mut counts).unwrap();
        assert!(task.awaits(&actor("b"), 2));
        assert!(!task.awaits(&actor("a"), 1), "the first dispatch is stale");
        task.apply(TaskEvent::Succeed, &mut counts).unwrap();
        assert_eq!(task.state(), &TaskState::Done(TaskEnd::Succeeded));
        assert_eq!((counts.succeeded, counts.submitted), (1, 1));
        assert!(sums_to_submitted(&counts));
    }

    #[test]
    fn a_task_sent_again_after_a_restart_counts_once() {
        // Before the restart: two tasks, one finished (its result never reached the client).
        let mut counts = JobCounts::default();
        let mut done = TaskLifecycle::submitted(&mut counts);
        done.apply(dispatch(&done, "a"), &mut counts).unwrap();
        done.apply(TaskEvent::Succeed, &mut counts).unwrap();
        // The client sends it again: it runs again and is counted once.
        let mut again = TaskLifecycle::resubmitted(&mut counts, TaskEnd::Succeeded);
        assert_eq!(
            (counts.submitted, counts.queued, counts.succeeded),
            (1, 1, 0)
        );
        again.apply(dispatch(&again, "b"), &mut counts).unwrap();
        again.apply(TaskEvent::Succeed, &mut counts).unwrap();
        assert_eq!((counts.submitted, counts.succeeded), (1, 1));
        assert!(sums_to_submitted(&counts));
        // A queued task answered by an output held across the restart.
        let mut held = TaskLifecycle::submitted(&mut counts);
        held.apply(TaskEvent::AnsweredEarlier, &mut counts).unwrap();
        assert_eq!(held.state(), &TaskState::Done(TaskEnd::Succeeded));
        assert_eq!((counts.submitted, counts.succeeded), (2, 2));
        assert!(sums_to_submitted(&counts));
        assert!(
            held.apply(TaskEvent::AnsweredEarlier, &mut counts).is_err(),
            "only a queued task takes an earlier answer"
        );
    }

    #[test]
    fn a_lost_task_goes_back_to_the_queue() {
        let mut counts = JobCounts::default();
        let mut task = TaskLifecycle::submitted(&mut counts);
        task.apply(dispatch(&task, "a"), &mut counts).unwrap();
        task.apply(TaskEvent::Lose, &mut counts).unwrap();
        assert_eq!(task.state(), &TaskState::Queued);
        assert_eq!((counts.queued, counts.running), (1, 0));
        assert_eq!(task.actor(), None);
    }

    #[test]
    fn cancelling_holds_the_actor_until_it_answers() {
        let mut counts = JobCounts::default();
        let mut running = TaskLifecycle::submitted(&mut counts);
        let mut queued = TaskLifecycle::submitted(&mut counts);
        running.apply(dispatch(&running, "a"), &mut counts).unwrap();
        running.apply(TaskEvent::Cancel, &mut counts).unwrap();
        queued.apply(TaskEvent::Cancel, &mut counts).unwrap();
        assert_eq!(queued.state(), &TaskState::Done(TaskEnd::Cancelled));
        assert_eq!(running.actor(), Some(&actor("a")));
        assert!(running.awaits(&actor("a"), 1));
        assert_eq!((counts.cancelled, counts.outstanding()), (2, 0));
        running.apply(TaskEvent::Settle, &mut counts).unwrap();
        assert_eq!(running.state(), &TaskState::Done(TaskEnd::Cancelled));
        assert_eq!(counts.cancelled, 2);
        assert!(sums_to_submitted(&counts));
    }

    #[test]
    fn invalid_events_change_nothing() {
        let mut counts = JobCounts::default();
        let mut task = TaskLifecycle::submitted(&mut counts);
        let before = (task.clone(), counts);
        for event in [
            TaskEvent::Succeed,
            TaskEvent::Release,
            TaskEvent::Settle,
            TaskEvent::Lose,
        ] {
            assert!(task.apply(event, &mut counts).is_err());
        }
        assert_eq!((task.clone(), counts), before);
        task.apply(TaskEvent::Fail { retry_at: None }, &mut counts)
            .unwrap();
        let done = (task.clone(), counts);
        assert!(task.apply(TaskEvent::Cancel, &mut counts).is_err());
        assert!(task.apply(dispatch(&task, "a"), &mut counts).is_err());
        assert_eq!((task, counts), done, "Done is terminal");
    }

    #[test]
    fn every_event_sequence_keeps_the_counters_whole() {
        // Drive many tasks through every event in a fixed pseudo-random order.
        let events = |n: u64, task: &TaskLifecycle| match n % 7 {
            0 => dispatch(task, "a"),
            1 => TaskEvent::Succeed,
            2 => TaskEvent::Fail {
                retry_at: n.is_multiple_of(2).then(Instant::now),
            },
            3 => TaskEvent::Release,
            4 => TaskEvent::Lose,
            5 => TaskEvent::Cancel,
            _ => TaskEvent::Settle,
        };
        let mut counts = JobCounts::default();
        let mut tasks: Vec<TaskLifecycle> = (0..50)
            .map(|_| TaskLifecycle::submitted(&mut counts))
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..5_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let task = &mut tasks[(seed % 50) as usize];
            let event = events(seed >> 8, task);
            let _ = task.apply(event, &mut counts);
            assert!(sums_to_submitted(&counts), "{counts:?}");
        }
    }
}
