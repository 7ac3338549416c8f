//! Byte budgets for what the scheduler holds on a client's behalf: task payloads it has
//! accepted and not finished, and results it has not yet handed to the client.
//!
//! Each job has a [`JobBuffer`] capped at `max_job_bytes`; all jobs together are capped at
//! `max_total_bytes` ([`BufferBudget`]). Bytes are held by [`BufferCharge`] guards that travel
//! with what they pay for (a task's record, a result waiting in the job's stream) and give
//! the bytes back when dropped, however the thing they pay for ends: finished, cancelled,
//! ignored, or dropped with the stream of a client that left.
//!
//! The job's task forwarder waits in [`JobBuffer::admit`] before it takes the next task off
//! the client's stream, so a client that does not read its results stops being read from
//! (gRPC flow control carries that to it) and slows only itself.
//!
//! Results are charged as they are queued for the client ([`JobBuffer::charge_result`]).
//! Inputs admitted earlier may still be queued when the buffer fills with results, so the
//! core dispatches no task of a job whose buffer is full of unread results
//! ([`JobBuffer::results_full`]) until the client reads ([`JobBuffer::wait_for_room`]): a
//! client that does not read stops its actors' credit, and what the scheduler holds for it
//! passes its cap by at most the results of the tasks already running.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// Scheduler-wide: the cap on all buffered bytes, and the bytes held now.
#[derive(Debug)]
pub struct BufferBudget {
    max_total_bytes: u64,
    max_job_bytes: u64,
    total_bytes: AtomicU64,
    freed: Notify,
}

/// A new job refused: the scheduler already buffers its limit for running jobs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the scheduler buffers {} for running jobs, its limit (--max-buffered-bytes {max}); retry \
     when running jobs have read their results, or raise the limit",
    human_bytes(*.buffered)
)]
pub struct BufferFull {
    /// Bytes buffered now.
    pub buffered: u64,
    /// `--max-buffered-bytes`.
    pub max: u64,
}

impl BufferBudget {
    pub fn new(max_total_bytes: u64, max_job_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            max_total_bytes: max_total_bytes.max(1),
            max_job_bytes: max_job_bytes.max(1),
            total_bytes: AtomicU64::new(0),
            freed: Notify::new(),
        })
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Relaxed)
    }

    /// `--max-buffered-bytes`.
    pub fn max_total_bytes(&self) -> u64 {
        self.max_total_bytes
    }

    /// Whether a new job may start: refused while every buffered byte is taken.
    pub fn check_new_job(&self) -> Result<(), BufferFull> {
        let total = self.total_bytes();
        if total >= self.max_total_bytes {
            return Err(BufferFull {
                buffered: total,
                max: self.max_total_bytes,
            });
        }
        Ok(())
    }

    /// A fresh buffer for one job.
    pub fn job_buffer(self: &Arc<Self>) -> Arc<JobBuffer> {
        Arc::new(JobBuffer {
            budget: self.clone(),
            bytes: AtomicU64::new(0),
            result_bytes: AtomicU64::new(0),
            freed: Notify::new(),
        })
    }
}

/// One job's buffered bytes.
#[derive(Debug)]
pub struct JobBuffer {
    budget: Arc<BufferBudget>,
    bytes: AtomicU64,
    /// Of `bytes`, those of results waiting for the client.
    result_bytes: AtomicU64,
    freed: Notify,
}

impl JobBuffer {
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Whether `bytes` more fit: within the job's cap and the scheduler's. A job holding
    /// nothing may take one item larger than its own cap, so it cannot wait forever, but
    /// only within the scheduler's (or when nothing at all is held).
    fn fits(&self, bytes: u64) -> bool {
        let total = self.budget.total_bytes();
        let within_total = total + bytes <= self.budget.max_total_bytes;
        if self.bytes() == 0 {
            return within_total || total == 0;
        }
        self.bytes() + bytes <= self.budget.max_job_bytes && within_total
    }

    /// Holds `bytes` if the scheduler's cap has room for them, else `None` (for what may
    /// be dropped and computed again: outcomes held for a detached client).
    pub fn charge_within_total(self: &Arc<Self>, bytes: u64) -> Option<BufferCharge> {
        (self.budget.total_bytes() + bytes <= self.budget.max_total_bytes)
            .then(|| self.charge(bytes))
    }

    /// Waits until `bytes` fit, then holds them.
    pub async fn admit(self: &Arc<Self>, bytes: u64) -> BufferCharge {
        self.wait_until(|buffer| buffer.fits(bytes)).await;
        self.charge(bytes)
    }

    /// Waits until `ready` holds, checking again whenever bytes come back to this job or to
    /// any job.
    async fn wait_until(&self, ready: impl Fn(&Self) -> bool) {
        loop {
            // Registered before the check, so a release between the two is not missed.
            let job_freed = self.freed.notified();
            let any_freed = self.budget.freed.notified();
            if ready(self) {
                return;
            }
            tokio::select! {
                () = job_freed => {}
                () = any_freed => {}
            }
        }
    }

    /// Holds `bytes` now, over the cap if need be.
    pub fn charge(self: &Arc<Self>, bytes: u64) -> BufferCharge {
        self.hold(bytes, false)
    }

    fn hold(self: &Arc<Self>, bytes: u64, result: bool) -> BufferCharge {
        if result {
            self.result_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.budget.total_bytes.fetch_add(bytes, Ordering::Relaxed);
        BufferCharge {
            buffer: self.clone(),
            bytes,
            result,
        }
    }

    /// Holds `bytes` of a result queued for the client, over the cap if need be (it is
    /// computed already; [`JobBuffer::results_full`] keeps more from being computed).
    pub fn charge_result(self: &Arc<Self>, bytes: u64) -> BufferCharge {
        self.hold(bytes, true)
    }

    /// Whether the job's tasks should wait before they run: the client has results to
    /// read, and the job's buffer or the scheduler's is full. Without unread results the
    /// job's tasks always run: only its client's reading would free the buffer.
    pub fn results_full(&self) -> bool {
        let unread = self.result_bytes.load(Ordering::Relaxed) > 0;
        unread
            && (self.bytes() >= self.budget.max_job_bytes
                || self.budget.total_bytes() >= self.budget.max_total_bytes)
    }

    /// Waits until [`JobBuffer::results_full`] no longer holds.
    pub async fn wait_for_room(&self) {
        self.wait_until(|buffer| !buffer.results_full()).await;
    }
}

/// Bytes held for one thing; given back when dropped.
#[derive(Debug)]
pub struct BufferCharge {
    buffer: Arc<JobBuffer>,
    bytes: u64,
    /// For a result waiting for the client.
    result: bool,
}

impl BufferCharge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for BufferCharge {
    fn drop(&mut self) {
        if self.result {
            self.buffer
                .result_bytes
                .fetch_sub(self.bytes, Ordering::Relaxed);
        }
        self.buffer.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        let budget = &self.buffer.budget;
        budget.total_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        self.buffer.freed.notify_waiters();
        budget.freed.notify_waiters();
    }
}

fn human_bytes(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    format!("{:.1} MiB", bytes as f64 / MIB)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_job_waits_at_its_cap_and_goes_on_when_bytes_come_back() {
        let budget = BufferBudget::new(1 << 30, 100);
        let job = budget.job_buffer();
        let first = job.admit(60).await;
        let second = job.admit(40).await;
        assert_eq!(job.bytes(), 100);
        let waiting = tokio::spawn({
            let job = job.clone();
            async move { job.admit(10).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "admitted past the job's cap");
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("admitted once bytes came back")
            .unwrap();
        assert_eq!(job.bytes(), 50);
        assert_eq!(budget.total_bytes(), 50);
        drop((second, third));
        assert_eq!(budget.total_bytes(), 0);
    }

    #[tokio::test]
    async fn an_empty_job_takes_one_item_larger_than_its_cap() {
        let budget = BufferBudget::new(1 << 30, 100);
        let job = budget.job_buffer();
        let big = job.admit(1_000).await;
        assert_eq!(big.bytes(), 1_000);
    }

    #[tokio::test]
    async fn a_first_item_waits_for_room_in_the_scheduler_wide_cap() {
        let budget = BufferBudget::new(150, 100);
        let other = budget.job_buffer();
        let held = other.admit(100).await;
        let job = budget.job_buffer();
        let waiting = tokio::spawn({
            let job = job.clone();
            async move { job.admit(80).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a first item past the total waits");
        drop(held);
        let first = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("admitted once the total has room")
            .unwrap();
        assert_eq!(budget.total_bytes(), 80);
        assert!(job.charge_within_total(100).is_none());
        assert!(job.charge_within_total(70).is_some());
        drop(first);
    }

    #[tokio::test]
    async fn one_stalled_job_does_not_stop_another_and_the_total_refuses_new_jobs() {
        let budget = BufferBudget::new(150, 100);
        let stalled = budget.job_buffer();
        let _held = stalled.admit(100).await;
        let other = budget.job_buffer();
        let _ok = tokio::time::timeout(Duration::from_secs(1), other.admit(50))
            .await
            .expect("another job is admitted");
        let refused = budget.check_new_job().unwrap_err().to_string();
        assert!(refused.contains("--max-buffered-bytes 150"), "{refused}");
    }

    #[test]
    fn a_forced_charge_counts_and_comes_back() {
        let budget = BufferBudget::new(10, 10);
        let job = budget.job_buffer();
        let over = job.charge(50);
        assert_eq!(budget.total_bytes(), 50);
        drop(over);
        assert_eq!((job.bytes(), budget.total_bytes()), (0, 0));
    }
}
