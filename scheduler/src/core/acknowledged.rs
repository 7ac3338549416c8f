//! Calls that change state and are answered once the change is on disk, so that a failed
//! call changed nothing:
//! - while the store fails (or is far behind) they are refused before they change
//!   anything (UNAVAILABLE, saying why and that the scheduler recovers by itself);
//! - a change that cannot be undone (deleting a pool, cancelling a job) is written first
//!   and made in memory only once the write committed;
//! - a change that is made at once is undone if its write fails: a new pool is removed (its
//!   actors are placed only once it is saved, so no agent started one), a scale goes back
//!   to the replicas before, a new job is forgotten, a summary is restored.
//!
//! Follow-ups come back to the loop on a channel of their own ([`FollowUp`]).
//!
//! Memory is the truth the store follows: each undo writes the state it restores, after
//! the failed op in the writer's order, so the store ends where memory is once it heals.

use resident_proto::{JobId, PoolName, pb};

use super::model::{Core, FollowUp, Reply};
use super::{JobResults, JobStream};
use crate::auth::Principal;
use crate::error::SchedulerError;
use crate::store::{StoreOp, WriteOutcome};

impl Core {
    /// Runs `then` on the core once every store write queued so far has committed (`Ok`)
    /// or failed (`Err`, the error).
    pub(super) fn after_write(&self, then: impl FnOnce(&mut Core, WriteOutcome) + Send + 'static) {
        let back = self.follow_ups.clone();
        self.store.when_durable(move |written| {
            // The loop is gone: the reply inside `then` drops and its caller hears that the
            // scheduler stopped.
            let _ = back.send(FollowUp::AfterWrite {
                written,
                then: Box::new(then),
            });
        });
    }

    /// Answers a call whose change was made in memory once it is on disk: every store write
    /// queued so far is committed first (with whatever else is waiting: group commit). A
    /// refusal is answered at once; a failed write fails the call (the caller undoes what
    /// it made first, if anything).
    fn reply_when_durable<T: Send + 'static>(
        &self,
        reply: Reply<T>,
        result: Result<T, SchedulerError>,
    ) {
        match result {
            Err(error) => {
                let _ = reply.send(Err(error));
            }
            Ok(value) => self.store.when_durable(move |written| {
                let _ = reply.send(written.map(|()| value).map_err(SchedulerError::NotSaved));
            }),
        }
    }

    /// Runs the follow-ups that have come back, as the loop would (unit tests drive the
    /// core without its loop).
    #[cfg(test)]
    pub(super) fn run_follow_ups(&mut self) {
        let Some(mut rx) = self.follow_ups_rx.take() else {
            return;
        };
        while let Ok(done) = rx.try_recv() {
            done.run(self);
            self.after_commands();
        }
        self.follow_ups_rx = Some(rx);
    }

    /// `Some(reply)` if a change may go ahead; otherwise the call is refused at once,
    /// before it changed anything, because the store fails or is far behind.
    fn unless_store_refuses<T>(&self, reply: Reply<T>) -> Option<Reply<T>> {
        match self.store.refusal() {
            None => Some(reply),
            Some(refusal) => {
                let _ = reply.send(Err(SchedulerError::StoreUnavailable(refusal)));
                None
            }
        }
    }

    pub(super) fn open_job_durably(
        &mut self,
        header: pb::SubmitHeader,
        owner: String,
        results: JobResults,
        reply: Reply<JobStream>,
    ) {
        let Some(reply) = self.unless_store_refuses(reply) else {
            return;
        };
        let fresh = header.resume_job_id.is_empty();
        match self.open_job(header, owner, results) {
            Ok(stream) if fresh => self.after_write(move |core, written| match written {
                Ok(()) => {
                    let _ = reply.send(Ok(stream));
                }
                Err(error) => {
                    core.forget_unsaved_job(&stream.job);
                    let _ = reply.send(Err(SchedulerError::NotSaved(error)));
                }
            }),
            other => self.reply_when_durable(reply, other),
        }
    }

    pub(super) fn annotate_job_durably(
        &mut self,
        job: JobId,
        requester: &Principal,
        summary_json: String,
        reply: Reply<()>,
    ) {
        let Some(reply) = self.unless_store_refuses(reply) else {
            return;
        };
        let before = self.jobs.get(&job).map(|j| j.status.summary_json.clone());
        let after = summary_json.clone();
        if let Err(refused) = self.annotate_job(&job, requester, summary_json) {
            let _ = reply.send(Err(refused));
            return;
        }
        self.after_write(move |core, written| {
            if let Err(error) = written {
                core.restore_summary(&job, &after, before.unwrap_or_default());
                let _ = reply.send(Err(SchedulerError::NotSaved(error)));
            } else {
                let _ = reply.send(Ok(()));
            }
        });
    }

    pub(super) fn create_pool_durably(
        &mut self,
        spec: pb::PoolSpec,
        requester: &Principal,
        reply: Reply<pb::PoolStatus>,
    ) {
        let Some(reply) = self.unless_store_refuses(reply) else {
            return;
        };
        let name = PoolName::new(spec.name.clone());
        let fresh = !self.pools.contains_key(&name);
        let created = self.create_pool(spec, requester);
        if let Err(error) = &created {
            self.metrics
                .events
                .record("pool", name.as_str(), error.to_string());
        }
        if !fresh || created.is_err() {
            return self.reply_when_durable(reply, created);
        }
        self.after_write(move |core, written| match written {
            Ok(()) => {
                if let Some(pool) = core.pools.get_mut(&name) {
                    pool.saved = true;
                    core.replan_needed = true;
                    // Placed now, so that the answer says where its actors go, or why not.
                    core.after_commands();
                }
                let _ = reply.send(core.pool_status(&name));
            }
            Err(error) => {
                if core.pools.get(&name).is_some_and(|p| !p.saved) {
                    tracing::warn!(pool = %name, %error, "pool not saved; removing it");
                    let _ = core.delete_pool(&name);
                }
                let _ = reply.send(Err(SchedulerError::NotSaved(error)));
            }
        });
    }

    pub(super) fn scale_pool_durably(
        &mut self,
        pool: PoolName,
        replicas: u32,
        requester: &Principal,
        reply: Reply<pb::PoolStatus>,
    ) {
        let Some(reply) = self.unless_store_refuses(reply) else {
            return;
        };
        let before = self.pools.get(&pool).map(|p| p.spec.replicas);
        let scaled = self.scale_pool(&pool, replicas, requester);
        let (Ok(_), Some(before)) = (&scaled, before) else {
            return self.reply_when_durable(reply, scaled);
        };
        self.after_write(move |core, written| match written {
            Ok(()) => {
                let _ = reply.send(core.pool_status(&pool));
            }
            Err(error) => {
                let unchanged_since = core
                    .pools
                    .get(&pool)
                    .is_some_and(|p| p.spec.replicas == replicas);
                if unchanged_since && before != replicas {
                    core.set_replicas(&pool, before);
                }
                let _ = reply.send(Err(SchedulerError::NotSaved(error)));
            }
        });
    }

    /// Writes the deletion first and deletes in memory once it is on disk; if the write
    /// fails, the pool is written back and nothing happened.
    pub(super) fn delete_pool_durably(
        &mut self,
        pool: PoolName,
        if_unused: bool,
        requester: &Principal,
        reply: Reply<Option<String>>,
    ) {
        let Some(reply) = self.unless_store_refuses(reply) else {
            return;
        };
        match self.may_delete_pool(&pool, if_unused, requester) {
            Ok(None) => {}
            kept_or_refused => {
                let _ = reply.send(kept_or_refused);
                return;
            }
        }
        self.store.write(StoreOp::DeletePool(pool.clone()));
        self.after_write(move |core, written| {
            let still_there = core.pools.get(&pool).map(|p| p.spec.clone());
            let Some(spec) = still_there else {
                // Deleted meanwhile (its idle TTL ran out): what was asked is done.
                let _ = reply.send(written.map(|()| None).map_err(SchedulerError::NotSaved));
                return;
            };
            let in_use = if_unused.then(|| core.pool_in_use(&pool)).flatten();
            match (written, in_use) {
                (Ok(()), None) => {
                    let _ = reply.send(core.delete_pool(&pool).map(|()| None));
                    core.replan_needed = true;
                }
                // A job started on it while the deletion was written: it stays.
                (Ok(()), Some(why)) => {
                    core.store.write(StoreOp::PutPool(spec));
                    let _ = reply.send(Ok(Some(why)));
                }
                (Err(error), _) => {
                    core.store.write(StoreOp::PutPool(spec));
                    let _ = reply.send(Err(SchedulerError::NotSaved(error)));
                }
            }
        });
    }

    /// Writes the job as cancelled first and cancels its tasks once that is on disk; if the
    /// write fails, the job is written back as it is and runs on.
    pub(super) fn cancel_job_durably(
        &mut self,
        job: JobId,
        requester: &Principal,
        reply: Reply<pb::JobStatus>,
    ) {
        let Some(reply) = self.unless_store_refuses(reply) else {
            return;
        };
        let running = match self.may_cancel_job(&job, requester) {
            Ok(running) => running,
            Err(refused) => {
                let _ = reply.send(Err(refused));
                return;
            }
        };
        if !running {
            // Already finished: nothing to change, nothing to write.
            return self.reply_when_durable(reply, self.job_status(&job));
        }
        let mut cancelled = self.jobs[&job].snapshot();
        cancelled.state = pb::JobState::Cancelled as i32;
        cancelled.finished_unix_ms = crate::metrics::unix_ms_now();
        self.store.write(StoreOp::PutJob(cancelled));
        let why = format!("cancelled by {}", requester.name);
        self.after_write(move |core, written| match written {
            Ok(()) => {
                core.cancel_job_tasks(&job, &why);
                // Answered behind the end of its result stream, as a cancel made at once
                // would be.
                let status = core.job_status(&job);
                core.reply_when_durable(reply, status);
            }
            Err(error) => {
                if let Some(record) = core.jobs.get(&job) {
                    core.store.write(StoreOp::PutJob(record.snapshot()));
                }
                let _ = reply.send(Err(SchedulerError::NotSaved(error)));
            }
        });
    }

    /// Undoes a job opened by a call whose write failed: its client never got the stream,
    /// so it has no tasks.
    fn forget_unsaved_job(&mut self, job: &JobId) {
        let untouched = self
            .jobs
            .get(job)
            .is_some_and(|j| j.attachment == 1 && j.counts.submitted == 0);
        if untouched {
            self.jobs.remove(job);
            self.store.write(StoreOp::DeleteJob(job.clone()));
        }
    }

    /// Puts back the summary a failed annotation replaced, unless another changed it since.
    fn restore_summary(&mut self, job: &JobId, replaced_by: &str, previous: String) {
        let Some(record) = self.jobs.get_mut(job) else {
            return;
        };
        if record.status.summary_json == replaced_by {
            record.status.summary_json = previous;
            self.store.write(StoreOp::PutJob(record.snapshot()));
        }
    }
}
