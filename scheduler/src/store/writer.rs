//! The store's writer thread: group commit with acknowledgements, and a store that heals.
//!
//! The scheduler loop hands it ops in order and never waits: the queue is unbounded, and
//! what keeps it small is the core refusing new changes while the store is failing or far
//! behind ([`StoreWriter::refusal`]). Ops that queue up while one batch is being written go
//! into the next batch, which is one transaction and one fsync (redb commits with
//! `Durability::Immediate`). A caller that must not answer before its change is on disk
//! queues a callback behind its ops ([`StoreWriter::when_durable`]); the thread runs it once
//! the batch holding every op queued before it has committed, with the error if that
//! failed.
//!
//! After a failed batch the thread is *failing*: it keeps the unwritten ops, in order, and
//! every op queued after them; it answers every waiter at once with the error (what was
//! queued before it is not on disk); it reports the error through [`StoreWriter::health`];
//! and it tries again with a growing delay, each time first letting the store recover
//! ([`DurableStore::recover`]: redb is reopened, since it refuses everything after an I/O
//! error), then writing the kept ops in batches from the oldest. Each retry costs what is
//! unwritten, not what has failed so far. Once everything kept is written, the store is
//! healthy again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{DurableStore, StoreOp};
use crate::metrics::SchedulerMetrics;
use crate::policy::backoff::RetryBackoff;

/// What a waiting caller learns: `Err` carries the failed write's error text.
pub type WriteOutcome = Result<(), String>;

/// `None` while the store writes; the last error while it fails.
pub type StoreHealth = watch::Receiver<Option<String>>;

type Callback = Box<dyn FnOnce(WriteOutcome) + Send>;

// Ops are nearly every message: boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum WriterMessage {
    Op(StoreOp),
    WhenDurable(Callback),
}

/// Most ops in one transaction.
const MAX_BATCH_OPS: usize = 4096;
/// Ops queued and not yet written past which the core refuses new changes (backpressure to
/// callers: the disk is slower than the changes asked of it).
pub const MAX_UNWRITTEN_OPS: usize = 1 << 16;
/// Delays between tries while the store fails: 100 ms, doubling, at most 2 s, so a store
/// whose disk frees up writes again within about 2 s.
const RETRY_BACKOFF: RetryBackoff = RetryBackoff {
    base: Duration::from_millis(100),
    max: Duration::from_secs(2),
};
/// How long a flush waits between its tries.
const FLUSH_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Sends writes to the background thread that commits them in batches.
#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::Sender<WriterMessage>,
    /// Ops handed over and not yet committed.
    unwritten: Arc<AtomicUsize>,
    health: StoreHealth,
}

impl StoreWriter {
    /// Starts the writer thread; each batch's write time goes to `metrics`.
    pub fn spawn(store: Arc<dyn DurableStore>, metrics: SchedulerMetrics) -> Self {
        let (tx, rx) = mpsc::channel::<WriterMessage>();
        let (health_tx, health) = watch::channel(None);
        let unwritten = Arc::new(AtomicUsize::new(0));
        let thread = WriterThread {
            store,
            metrics,
            rx,
            health: health_tx,
            unwritten: unwritten.clone(),
            kept: VecDeque::new(),
            failures: 0,
            last_error: String::new(),
        };
        std::thread::Builder::new()
            .name("resident-store".into())
            .spawn(move || thread.run())
            .expect("spawn store writer thread");
        Self {
            tx,
            unwritten,
            health,
        }
    }

    /// Queues one change; it is written with the next batch. Never blocks.
    pub fn write(&self, op: StoreOp) {
        self.unwritten.fetch_add(1, Ordering::Relaxed);
        // The writer thread only stops when every sender is gone.
        let _ = self.tx.send(WriterMessage::Op(op));
    }

    /// Whether the store writes (`None`) or fails (the error), as it changes.
    pub fn health(&self) -> StoreHealth {
        self.health.clone()
    }

    /// Ops handed over and not yet on disk.
    pub fn unwritten(&self) -> usize {
        self.unwritten.load(Ordering::Relaxed)
    }

    /// Why a call that changes state should be refused now, before it changes anything:
    /// the store is failing, or more than [`MAX_UNWRITTEN_OPS`] behind.
    pub fn refusal(&self) -> Option<String> {
        if let Some(error) = self.health.borrow().as_ref() {
            return Some(format!(
                "the state store cannot write ({error}), so the scheduler accepts no change; \
                 it keeps retrying and accepts changes again by itself once the disk of \
                 --state-dir takes writes (free space there); retry the call then"
            ));
        }
        let behind = self.unwritten();
        (behind > MAX_UNWRITTEN_OPS).then(|| {
            format!(
                "the state store is {behind} writes behind (the limit is {MAX_UNWRITTEN_OPS}): \
                 the disk of --state-dir is slower than the changes asked of it; retry in a \
                 few seconds"
            )
        })
    }

    /// Waits until every op queued before this call is on disk, trying again up to
    /// `attempts` times in all, a second apart. For shutdown: the write-behind ops (task
    /// outcomes, job counters) then do not die with the process.
    pub async fn flush(&self, attempts: u32) -> WriteOutcome {
        let mut outcome = Ok(());
        for attempt in 0..attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(FLUSH_RETRY_AFTER).await;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.when_durable(move |written| {
                let _ = tx.send(written);
            });
            outcome = rx
                .await
                .unwrap_or_else(|_| Err("the state store's writer stopped".into()));
            if outcome.is_ok() {
                break;
            }
        }
        outcome
    }

    /// Runs `then` on the writer thread once every op queued before this call is on disk
    /// (`Ok`), or at once with the error while the store is failing (`Err`).
    pub fn when_durable(&self, then: impl FnOnce(WriteOutcome) + Send + 'static) {
        if let Err(mpsc::SendError(WriterMessage::WhenDurable(then))) =
            self.tx.send(WriterMessage::WhenDurable(Box::new(then)))
        {
            then(Err("the state store's writer stopped".into()));
        }
    }
}

struct WriterThread {
    store: Arc<dyn DurableStore>,
    metrics: SchedulerMetrics,
    rx: mpsc::Receiver<WriterMessage>,
    health: watch::Sender<Option<String>>,
    unwritten: Arc<AtomicUsize>,
    /// Ops not on disk, oldest first, while failing (empty while healthy).
    kept: VecDeque<StoreOp>,
    /// Failed tries in a row.
    failures: u32,
    last_error: String,
}

impl WriterThread {
    fn run(mut self) {
        loop {
            let open = if self.kept.is_empty() {
                self.write_next_batch()
            } else {
                self.retry_after_backoff()
            };
            if !open {
                if !self.kept.is_empty() {
                    tracing::error!(
                        ops = self.kept.len(),
                        "the state store's writer stopped with writes that failed: they are \
                         lost (every acknowledged change was written before its answer; task \
                         outcomes are computed again when their job resumes)"
                    );
                }
                return;
            }
        }
    }

    /// Healthy: waits for work, writes one batch and answers its waiters. `false` once
    /// every sender is gone.
    fn write_next_batch(&mut self) -> bool {
        let Ok(first) = self.rx.recv() else {
            return false;
        };
        let mut batch = Vec::new();
        let mut callbacks: Vec<Callback> = Vec::new();
        let mut next = Some(first);
        while let Some(message) = next {
            match message {
                WriterMessage::Op(op) => batch.push(op),
                WriterMessage::WhenDurable(then) => callbacks.push(then),
            }
            if batch.len() >= MAX_BATCH_OPS {
                break;
            }
            next = self.rx.try_recv().ok();
        }
        let mut outcome = Ok(());
        if !batch.is_empty() {
            outcome = self.commit(&batch);
            if outcome.is_err() {
                self.kept.extend(batch);
            }
        }
        for then in callbacks {
            then(outcome.clone());
        }
        true
    }

    /// Failing: waits out the backoff (keeping new ops, failing new waiters at once), then
    /// lets the store recover and writes what is kept. `false` once every sender is gone
    /// (after one last try).
    fn retry_after_backoff(&mut self) -> bool {
        let retry_at = Instant::now() + RETRY_BACKOFF.delay(self.failures);
        let mut open = true;
        loop {
            let left = retry_at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.rx.recv_timeout(left) {
                Ok(WriterMessage::Op(op)) => self.kept.push_back(op),
                Ok(WriterMessage::WhenDurable(then)) => then(Err(self.last_error.clone())),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if let Err(error) = self.store.recover() {
            self.failed(error.to_string());
            return open;
        }
        while !self.kept.is_empty() {
            let count = self.kept.len().min(MAX_BATCH_OPS);
            let chunk: Vec<StoreOp> = self.kept.drain(..count).collect();
            if self.commit(&chunk).is_err() {
                for op in chunk.into_iter().rev() {
                    self.kept.push_front(op);
                }
                return open;
            }
        }
        tracing::info!(
            failures = self.failures,
            "the state store writes again; the scheduler accepts changes"
        );
        self.failures = 0;
        self.health.send_replace(None);
        self.publish_backlog();
        open
    }

    /// Writes `batch`; on failure the thread is failing (the caller keeps the ops).
    fn commit(&mut self, batch: &[StoreOp]) -> Result<(), String> {
        let started = std::time::Instant::now();
        let written = self.store.apply(batch);
        self.metrics.store_write(started.elapsed(), written.is_ok());
        match written {
            Ok(()) => {
                self.unwritten.fetch_sub(batch.len(), Ordering::Relaxed);
                self.publish_backlog();
                Ok(())
            }
            Err(error) => {
                self.failed(error.to_string());
                Err(self.last_error.clone())
            }
        }
    }

    fn failed(&mut self, error: String) {
        self.failures = self.failures.saturating_add(1);
        tracing::error!(
            %error,
            unwritten = self.unwritten.load(Ordering::Relaxed),
            failures = self.failures,
            "state store write failed; the scheduler refuses changes and retries"
        );
        self.health.send_replace(Some(error.clone()));
        self.last_error = error;
        self.publish_backlog();
    }

    fn publish_backlog(&self) {
        let unwritten = self.unwritten.load(Ordering::Relaxed);
        self.metrics.store_backlog(unwritten, self.failures > 0);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use resident_proto::pb;

    use super::*;
    use crate::store::MemoryStore;
    use crate::store::testing::FlakyStore;

    fn pool(name: &str) -> StoreOp {
        StoreOp::PutPool(pb::PoolSpec {
            name: name.into(),
            ..Default::default()
        })
    }

    fn wait(writer: &StoreWriter) -> WriteOutcome {
        let (tx, rx) = mpsc::channel();
        writer.when_durable(move |outcome| tx.send(outcome).unwrap());
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    #[test]
    fn an_acknowledgement_waits_for_every_op_queued_before_it() {
        let store = Arc::new(FlakyStore::default());
        let writer = StoreWriter::spawn(store.clone(), SchedulerMetrics::default());
        for i in 0..10_000 {
            writer.write(pool(&format!("p{i}")));
        }
        assert_eq!(wait(&writer), Ok(()));
        assert_eq!(store.load_pools().unwrap().len(), 10_000);
        // Group commit: ops that queue during one write share the next (the 10,000 are
        // queued far faster than 1,000 writes take).
        let batches = store.batches.load(Ordering::SeqCst);
        assert!(batches < 1_000, "{batches} batches for 10,000 ops");
    }

    /// Polls `done` for up to 10 s.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_failing_store_refuses_and_answers_at_once_then_heals_by_itself() {
        let store = Arc::new(FlakyStore::default());
        store.failures.store(u32::MAX, Ordering::SeqCst);
        let writer = StoreWriter::spawn(store.clone(), SchedulerMetrics::default());
        assert_eq!(writer.refusal(), None);
        writer.write(pool("a"));
        let failed = wait(&writer).unwrap_err();
        assert!(failed.contains("disk full"), "{failed}");
        assert!(
            writer.health().borrow().is_some(),
            "health says the store fails"
        );
        let refusal = writer.refusal().expect("changes are refused while failing");
        assert!(
            refusal.contains("disk full") && refusal.contains("retry"),
            "{refusal}"
        );
        // While failing, a waiter hears at once (not after the next try), and ops are kept.
        writer.write(pool("b"));
        let asked = std::time::Instant::now();
        assert!(wait(&writer).is_err());
        assert!(
            asked.elapsed() < Duration::from_millis(50),
            "{:?}",
            asked.elapsed()
        );
        assert!(store.load_pools().unwrap().is_empty());
        // The disk frees up: the writer recovers the store and writes what it kept, in
        // order, with no one asking.
        store.failures.store(0, Ordering::SeqCst);
        eventually("the store heals", || writer.health().borrow().is_none());
        assert!(store.recoveries.load(Ordering::SeqCst) >= 1);
        assert_eq!(writer.refusal(), None);
        assert_eq!(writer.unwritten(), 0);
        writer.write(pool("c"));
        assert_eq!(wait(&writer), Ok(()));
        let names: Vec<String> = store
            .load_pools()
            .unwrap()
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn each_retry_costs_what_is_unwritten_not_what_failed_before() {
        let store = Arc::new(FlakyStore::default());
        store.failures.store(5, Ordering::SeqCst);
        let writer = StoreWriter::spawn(store.clone(), SchedulerMetrics::default());
        for i in 0..20_000 {
            writer.write(pool(&format!("p{i}")));
        }
        eventually("every op is written", || {
            store.load_pools().unwrap().len() == 20_000
        });
        // Five failed tries cost at most one batch each; the rest is written once.
        let tried = store.ops_tried.load(Ordering::SeqCst);
        assert!(
            tried <= 20_000 + 5 * MAX_BATCH_OPS,
            "{tried} ops tried for 20,000 with 5 failures"
        );
    }

    #[test]
    fn a_failed_batch_gets_one_last_try_when_the_writer_closes() {
        let store = Arc::new(FlakyStore::default());
        // Failing until the waiter has heard (the writer may take the op alone first and
        // the waiter with its retry), then recovered: the writer's close is what writes.
        store.failures.store(u32::MAX, Ordering::SeqCst);
        let writer = StoreWriter::spawn(store.clone(), SchedulerMetrics::default());
        writer.write(pool("a"));
        assert!(wait(&writer).is_err(), "the first batch fails");
        store.failures.store(0, Ordering::SeqCst);
        drop(writer);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.load_pools().unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the failed batch was dropped when the writer closed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[tokio::test]
    async fn a_flush_tries_a_failed_batch_again() {
        let store = Arc::new(FlakyStore::default());
        store.failures.store(1, Ordering::SeqCst);
        let writer = StoreWriter::spawn(store.clone(), SchedulerMetrics::default());
        writer.write(pool("a"));
        assert_eq!(writer.flush(3).await, Ok(()));
        assert_eq!(store.load_pools().unwrap().len(), 1);
        store.failures.store(u32::MAX, Ordering::SeqCst);
        writer.write(pool("b"));
        let failed = writer.flush(2).await.unwrap_err();
        assert!(failed.contains("disk full"), "{failed}");
    }

    #[test]
    fn a_waiter_with_nothing_queued_is_answered_at_once() {
        let writer = StoreWriter::spawn(
            Arc::new(MemoryStore::default()),
            SchedulerMetrics::default(),
        );
        assert_eq!(wait(&writer), Ok(()));
    }
}
