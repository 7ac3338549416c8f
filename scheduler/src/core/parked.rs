//! Tasks held back while their client does not read its results.
//!
//! A job's inputs are admitted within its byte buffer, but a small input may have a large
//! result: without a stop, every admitted task would run and its result would wait in the
//! scheduler, past any cap. So dispatch skips a task whose job's buffer is full of unread
//! results (`JobBuffer::results_full`) and parks it with its job, in order. A task waits
//! for the buffer to have room (`JobBuffer::wait_for_room`) and hands a
//! [`FollowUp::ResultsRoom`] back to the loop, which puts the parked tasks back at the head
//! of their pool's queue. The actors' credit goes to other jobs meanwhile; what the
//! scheduler holds for the job passes its cap by at most the results of tasks that were
//! already running.

use std::collections::VecDeque;

use resident_proto::{JobId, PoolName, TaskId};

use super::Core;
use super::model::FollowUp;
use crate::state::TaskState;

impl Core {
    /// Parks `task` if its job's client has a full buffer of results to read; `true` if it
    /// did (the task is not dispatched).
    pub(super) fn park_if_results_full(&mut self, task_id: TaskId) -> bool {
        let Some(job_id) = self.tasks.get(&task_id).map(|t| t.job.clone()) else {
            return false;
        };
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return false;
        };
        // Checked before anything is cloned: dispatch runs this for every task.
        let Some(buffer) = job.results.as_ref().map(|r| r.buffer()) else {
            return false;
        };
        if !buffer.results_full() {
            return false;
        }
        let buffer = buffer.clone();
        let first = job.parked.is_empty();
        job.parked.push_back(task_id);
        if first {
            tracing::debug!(job_id = %job_id, "results unread: holding the job's tasks back");
            let back = self.follow_ups.clone();
            tokio::spawn(async move {
                buffer.wait_for_room().await;
                let _ = back.send(FollowUp::ResultsRoom(job_id));
            });
        }
        true
    }

    /// The job's buffer has room: its parked tasks go back to the head of their pool's
    /// queue, oldest first, and dispatch runs.
    pub(super) fn unpark_tasks(&mut self, job_id: &JobId) {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return;
        };
        let parked = std::mem::take(&mut job.parked);
        let pool = PoolName::new(job.status.pool.clone());
        let tasks = &self.tasks;
        let Some(record) = self.pools.get_mut(&pool) else {
            return;
        };
        for task in parked.into_iter().rev() {
            let queued = tasks
                .get(&task)
                .is_some_and(|t| matches!(t.lifecycle.state(), TaskState::Queued));
            if queued {
                record.queue.push_front(task);
            }
        }
        self.dispatch_pool(&pool);
    }

    /// Takes the parked tasks of every job on `pool` (it is deleted, or every actor died).
    pub(super) fn take_parked_on(&mut self, pool: &PoolName) -> VecDeque<TaskId> {
        let mut taken = VecDeque::new();
        for job in self.jobs.values_mut() {
            if job.status.pool == pool.as_str() {
                taken.append(&mut job.parked);
            }
        }
        taken
    }
}
