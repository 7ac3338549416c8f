//! Jobs and tasks: per-pool queues, credit-based dispatch, outcomes, retries, cancellation.
//!
//! A task is in exactly one of: a pool queue (Queued), the retry heap (Backoff) or an
//! actor's in-flight set (Running). Its result is sent to the client once, when the task
//! record is removed; outcomes for an older dispatch are ignored.

use std::time::Instant;

use resident_proto::{ActorId, JobId, NodeId, PoolName, TaskId, pb};

use super::records::{JobRecord, TaskPhase, TaskRecord};
use super::{Core, JobResults};
use crate::error::SchedulerError;
use crate::state::ActorState;
use crate::store::{StoreOp, StoredOutcome};

impl Core {
    pub(super) fn open_job(
        &mut self,
        header: pb::SubmitHeader,
        results: JobResults,
    ) -> Result<JobId, SchedulerError> {
        let pool = PoolName::new(header.pool.clone());
        self.pool_record(&pool)?;
        let job = JobId::generate();
        let status = pb::JobStatus {
            job_id: job.to_string(),
            pool: header.pool,
            name: header.job_name,
            state: pb::JobState::Running as i32,
            ..Default::default()
        };
        let _ = results.send(pb::SubmitResponse {
            body: Some(pb::submit_response::Body::Accepted(pb::JobAccepted {
                job_id: job.to_string(),
            })),
        });
        self.store.write(StoreOp::PutJob(status.clone()));
        tracing::info!(job_id = %job, pool = %pool, "job opened");
        self.jobs.insert(
            job.clone(),
            JobRecord {
                status,
                results: Some(results),
                input_closed: false,
            },
        );
        Ok(job)
    }

    pub(super) fn submit_task(&mut self, job_id: &JobId, input: pb::TaskInput) {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return;
        };
        if job.status.state != pb::JobState::Running as i32 {
            return;
        }
        job.status.submitted += 1;
        let pool = PoolName::new(job.status.pool.clone());
        let task = TaskId(self.next_task);
        self.next_task += 1;
        let record = TaskRecord {
            job: job_id.clone(),
            seq: input.seq,
            pool: pool.clone(),
            payload: input.payload,
            phase: TaskPhase::Queued,
            actor: None,
            dispatch: 0,
            failures: 0,
            node_losses: 0,
            submitted_at: Instant::now(),
            started_at: None,
            last_error: String::new(),
            cancelled: false,
        };
        let empty = record.payload.is_empty();
        job.status.queued += 1;
        self.tasks.insert(task, record);
        if empty {
            self.fail_task(task, "invalid argument: task payload is empty".into());
            return;
        }
        match self.pools.get_mut(&pool).filter(|p| !p.deleting) {
            Some(record) => record.queue.push_back(task),
            None => {
                self.fail_task(task, format!("pool `{pool}` was deleted"));
                return;
            }
        }
        self.dispatch_pool(&pool);
    }

    pub(super) fn close_job_input(&mut self, job: &JobId) {
        if let Some(record) = self.jobs.get_mut(job) {
            record.input_closed = true;
        }
        self.maybe_finish_job(job);
    }

    /// Hands queued tasks to ready actors that have credit, the freest actor first.
    pub(super) fn dispatch_pool(&mut self, pool_name: &PoolName) {
        let Some(pool) = self.pools.get_mut(pool_name) else {
            return;
        };
        let credit = pool.in_flight_per_actor as usize;
        while !pool.queue.is_empty() {
            let best = pool
                .actors
                .iter()
                .filter_map(|id| {
                    let actor = &self.actors[id];
                    let free = credit.saturating_sub(actor.in_flight.len());
                    (actor.state == ActorState::Ready && free > 0).then_some((free, id))
                })
                .max_by_key(|(free, _)| *free);
            let Some((_, actor_id)) = best else { return };
            let task_id = pool.queue.pop_front().expect("not empty");
            let Some(task) = self.tasks.get_mut(&task_id) else {
                continue;
            };
            if task.phase != TaskPhase::Queued {
                continue;
            }
            let actor = self.actors.get_mut(actor_id).expect("pool actor");
            let node_id = &actor
                .assignment
                .as_ref()
                .expect("ready actors are placed")
                .node;
            task.phase = TaskPhase::Running;
            task.actor = Some(actor_id.clone());
            task.dispatch += 1;
            task.started_at = Some(Instant::now());
            actor.in_flight.insert(task_id);
            let message = pb::RunTask {
                task_id: task_id.0,
                dispatch: task.dispatch,
                actor_id: actor_id.to_string(),
                payload: task.payload.clone(),
            };
            self.nodes[node_id].send(pb::scheduler_message::Body::RunTask(message));
            if let Some(job) = self.jobs.get_mut(&task.job) {
                job.status.queued -= 1;
                job.status.running += 1;
            }
        }
    }

    pub(super) fn task_outcome(&mut self, node_id: &NodeId, outcome: pb::TaskOutcome) {
        let task_id = TaskId(outcome.task_id);
        let actor_id = ActorId::new(outcome.actor_id);
        let current = self.tasks.get(&task_id).is_some_and(|t| {
            t.phase == TaskPhase::Running
                && t.dispatch == outcome.dispatch
                && t.actor.as_ref() == Some(&actor_id)
        });
        let on_node = self
            .actors
            .get(&actor_id)
            .is_some_and(|a| a.assignment.as_ref().is_some_and(|p| &p.node == node_id));
        if !current || !on_node {
            tracing::debug!(task_id = %task_id, "ignoring stale task outcome");
            return;
        }
        let actor = self.actors.get_mut(&actor_id).expect("checked");
        actor.in_flight.remove(&task_id);
        actor.tasks_done += 1;
        let pool = actor.pool.clone();
        if self.tasks[&task_id].cancelled {
            self.tasks.remove(&task_id);
        } else {
            match outcome.result {
                Some(pb::task_outcome::Result::Output(output)) => {
                    self.mark_running_as_queued(task_id);
                    self.finish_task(task_id, Ok(output), outcome.run_micros);
                }
                Some(pb::task_outcome::Result::Error(error)) => {
                    self.retry_or_fail(task_id, error, outcome.permanent)
                }
                None => self.retry_or_fail(task_id, "agent sent an empty outcome".into(), false),
            }
        }
        if self.actors[&actor_id].state == ActorState::Draining
            && self.actors[&actor_id].in_flight.is_empty()
        {
            self.finish_drain(&actor_id);
        }
        self.dispatch_pool(&pool);
    }

    fn retry_or_fail(&mut self, task_id: TaskId, error: String, permanent: bool) {
        let max_attempts = {
            let task = &self.tasks[&task_id];
            self.pools
                .get(&task.pool)
                .map_or(1, |p| p.max_task_attempts)
        };
        let task = self.tasks.get_mut(&task_id).expect("exists");
        task.actor = None;
        task.failures += 1;
        task.last_error = error;
        if permanent {
            let error = std::mem::take(&mut task.last_error);
            self.mark_running_as_queued(task_id);
            self.fail_task(task_id, error);
            return;
        }
        if task.failures >= max_attempts {
            let error = format!(
                "failed after {} attempts: {}",
                task.failures, task.last_error
            );
            self.mark_running_as_queued(task_id);
            self.fail_task(task_id, error);
            return;
        }
        let delay = self.config.retry_backoff.delay(task.failures);
        task.phase = TaskPhase::Backoff;
        tracing::debug!(task_id = %task_id, failures = task.failures, ?delay, "task failed; retrying");
        self.mark_running_as_queued(task_id);
        self.retries
            .push(std::cmp::Reverse((Instant::now() + delay, task_id)));
    }

    fn mark_running_as_queued(&mut self, task_id: TaskId) {
        if let Some(job) = self.jobs.get_mut(&self.tasks[&task_id].job) {
            job.status.running -= 1;
            job.status.queued += 1;
        }
    }

    /// A task whose actor or node was lost goes back to the front of its queue.
    pub(super) fn requeue_lost_task(&mut self, task_id: TaskId, why: &str) {
        let Some(task) = self.tasks.get_mut(&task_id) else {
            return;
        };
        task.actor = None;
        if task.cancelled {
            self.tasks.remove(&task_id);
            return;
        }
        task.node_losses += 1;
        task.phase = TaskPhase::Queued;
        let losses = task.node_losses;
        let pool = task.pool.clone();
        self.mark_running_as_queued(task_id);
        if losses > self.config.max_node_losses_per_task {
            self.fail_task(task_id, format!("lost {losses} times, last because {why}"));
            return;
        }
        match self.pools.get_mut(&pool) {
            Some(record) => record.queue.push_front(task_id),
            None => self.fail_task(task_id, format!("pool `{pool}` was deleted")),
        }
    }

    pub(super) fn release_due_retries(&mut self, now: Instant) {
        let mut touched = Vec::new();
        while let Some(std::cmp::Reverse((due, task_id))) = self.retries.peek().copied() {
            if due > now {
                break;
            }
            self.retries.pop();
            let Some(task) = self.tasks.get_mut(&task_id) else {
                continue;
            };
            if task.phase != TaskPhase::Backoff {
                continue;
            }
            task.phase = TaskPhase::Queued;
            if let Some(pool) = self.pools.get_mut(&task.pool) {
                pool.queue.push_back(task_id);
                touched.push(task.pool.clone());
            }
        }
        touched.dedup();
        for pool in touched {
            self.dispatch_pool(&pool);
        }
    }

    /// Fails a task that is not running (queued, backing off or just submitted).
    pub(super) fn fail_task(&mut self, task_id: TaskId, error: String) {
        self.finish_task(task_id, Err(error), 0);
    }

    /// Removes the task and sends its one result; the job counts it as queued by now.
    fn finish_task(
        &mut self,
        task_id: TaskId,
        result: Result<prost::bytes::Bytes, String>,
        run_micros: u64,
    ) {
        let Some(task) = self.tasks.remove(&task_id) else {
            return;
        };
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return;
        };
        job.status.queued -= 1;
        let attempts = task.dispatch;
        let queue_micros = task.started_at.map_or(0, |started| {
            started.duration_since(task.submitted_at).as_micros() as u64
        });
        let actor_id = task
            .actor
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let node_id = task
            .actor
            .as_ref()
            .and_then(|a| self.actors.get(a))
            .and_then(|a| a.assignment.as_ref())
            .map(|a| a.node.to_string())
            .unwrap_or_default();
        let stored = StoredOutcome {
            ok: result.is_ok(),
            attempts,
            error: result.as_ref().err().cloned(),
            output_bytes: result.as_ref().map_or(0, |o| o.len() as u64),
        };
        let result = match result {
            Ok(output) => {
                job.status.succeeded += 1;
                pb::task_result::Result::Output(output)
            }
            Err(error) => {
                job.status.failed += 1;
                pb::task_result::Result::Error(error)
            }
        };
        if let Some(results) = &job.results {
            let message = pb::TaskResult {
                seq: task.seq,
                result: Some(result),
                attempts,
                actor_id,
                node_id,
                queue_micros,
                run_micros,
            };
            let _ = results.send(pb::SubmitResponse {
                body: Some(pb::submit_response::Body::Result(message)),
            });
        }
        self.store.write(StoreOp::PutOutcome {
            job: task.job.clone(),
            seq: task.seq,
            outcome: stored,
        });
        self.maybe_finish_job(&task.job);
    }

    fn maybe_finish_job(&mut self, job_id: &JobId) {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return;
        };
        if !job.input_closed
            || job.outstanding() > 0
            || job.status.state != pb::JobState::Running as i32
        {
            return;
        }
        job.status.state = if job.status.failed > 0 {
            pb::JobState::Failed
        } else {
            pb::JobState::Succeeded
        } as i32;
        job.results = None;
        tracing::info!(job_id = %job_id, succeeded = job.status.succeeded, failed = job.status.failed, "job finished");
        self.store.write(StoreOp::PutJob(job.status.clone()));
    }

    /// Cancels every task of the job that has not finished; nothing else is disturbed.
    pub(super) fn cancel_job_tasks(&mut self, job_id: &JobId, why: &str) {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return;
        };
        if job.status.state != pb::JobState::Running as i32 {
            return;
        }
        job.status.state = pb::JobState::Cancelled as i32;
        job.status.cancelled += job.status.queued + job.status.running;
        job.status.queued = 0;
        job.status.running = 0;
        job.results = None;
        let pool = PoolName::new(job.status.pool.clone());
        self.store.write(StoreOp::PutJob(job.status.clone()));
        let mine: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| &t.job == job_id)
            .map(|(id, _)| *id)
            .collect();
        for task_id in mine {
            let task = self.tasks.get_mut(&task_id).expect("listed");
            match (task.phase, task.actor.clone()) {
                (TaskPhase::Running, Some(actor)) => {
                    task.cancelled = true;
                    let node = self.actors[&actor]
                        .assignment
                        .as_ref()
                        .map(|a| a.node.clone());
                    if let Some(node) = node.and_then(|n| self.nodes.get(&n)) {
                        node.send(pb::scheduler_message::Body::CancelTask(pb::CancelTask {
                            task_id: task_id.0,
                            actor_id: actor.to_string(),
                        }));
                    }
                }
                _ => {
                    self.tasks.remove(&task_id);
                }
            }
        }
        if let Some(record) = self.pools.get_mut(&pool) {
            let tasks = &self.tasks;
            record.queue.retain(|t| tasks.contains_key(t));
        }
        tracing::info!(job_id = %job_id, reason = why, "job cancelled");
    }
}
