//! The store's writer thread: group commit with acknowledgements.
//!
//! The scheduler loop hands it ops in order and never waits. Ops that queue up while one
//! batch is being written go into the next batch, which is one transaction and one fsync
//! (redb commits with `Durability::Immediate`). A caller that must not answer before its
//! change is on disk queues a callback behind its ops ([`StoreWriter::when_durable`]); the
//! thread runs it once the batch holding every op queued before it has committed, with the
//! error if that batch failed. Ops of a failed batch are kept and written again with the
//! next batch, so the store catches up with memory once the disk recovers.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use super::{DurableStore, StoreOp};
use crate::metrics::SchedulerMetrics;

/// What a waiting caller learns: `Err` carries the failed write's error text.
pub type WriteOutcome = Result<(), String>;

type Callback = Box<dyn FnOnce(WriteOutcome) + Send>;

// Ops are nearly every message: boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum WriterMessage {
    Op(StoreOp),
    WhenDurable(Callback),
}

/// Most ops in one transaction.
const MAX_BATCH_OPS: usize = 4096;
/// Messages queued for the writer before the loop waits on it (disk backpressure).
const QUEUE_CAPACITY: usize = 1 << 16;
/// How soon a failed batch is written again when nothing new arrives.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Sends writes to the background thread that commits them in batches.
#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::SyncSender<WriterMessage>,
}

impl StoreWriter {
    /// Starts the writer thread; each batch's write time goes to `metrics`.
    pub fn spawn(store: Arc<dyn DurableStore>, metrics: SchedulerMetrics) -> Self {
        let (tx, rx) = mpsc::sync_channel::<WriterMessage>(QUEUE_CAPACITY);
        std::thread::Builder::new()
            .name("resident-store".into())
            .spawn(move || run_writer(store.as_ref(), &metrics, &rx))
            .expect("spawn store writer thread");
        Self { tx }
    }

    /// Queues one change; it is written with the next batch.
    pub fn write(&self, op: StoreOp) {
        // The writer thread only stops when every sender is gone.
        let _ = self.tx.send(WriterMessage::Op(op));
    }

    /// Waits until every op queued before this call is on disk, trying a failed batch
    /// again up to `attempts` times in all, `RETRY_AFTER` apart. For shutdown: the
    /// write-behind ops (task outcomes, job counters) then do not die with the process.
    pub async fn flush(&self, attempts: u32) -> WriteOutcome {
        let mut outcome = Ok(());
        for attempt in 0..attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(RETRY_AFTER).await;
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
    /// (`Ok`), or once the batch holding one of them failed (`Err`, with the error).
    pub fn when_durable(&self, then: impl FnOnce(WriteOutcome) + Send + 'static) {
        if let Err(mpsc::SendError(WriterMessage::WhenDurable(then))) =
            self.tx.send(WriterMessage::WhenDurable(Box::new(then)))
        {
            then(Err("the state store's writer stopped".into()));
        }
    }
}

fn run_writer(
    store: &dyn DurableStore,
    metrics: &SchedulerMetrics,
    rx: &mpsc::Receiver<WriterMessage>,
) {
    // Ops of a failed batch, written again first.
    let mut unwritten: Vec<StoreOp> = Vec::new();
    loop {
        // Every sender is gone: the failed batch gets one last try.
        let mut closing = false;
        let first = if unwritten.is_empty() {
            match rx.recv() {
                Ok(message) => Some(message),
                Err(mpsc::RecvError) => return,
            }
        } else {
            match rx.recv_timeout(RETRY_AFTER) {
                Ok(message) => Some(message),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    closing = true;
                    None
                }
            }
        };
        let mut batch = std::mem::take(&mut unwritten);
        let mut callbacks: Vec<Callback> = Vec::new();
        let mut next = first;
        while let Some(message) = next {
            match message {
                WriterMessage::Op(op) => batch.push(op),
                WriterMessage::WhenDurable(then) => callbacks.push(then),
            }
            if batch.len() >= MAX_BATCH_OPS {
                break;
            }
            next = rx.try_recv().ok();
        }
        let outcome = if batch.is_empty() {
            Ok(())
        } else {
            let started = std::time::Instant::now();
            let written = store.apply(&batch);
            metrics.store_write(started.elapsed(), written.is_ok());
            written.map_err(|error| {
                tracing::error!(%error, ops = batch.len(), "state store write failed; retrying");
                unwritten = batch;
                error.to_string()
            })
        };
        for then in callbacks {
            then(outcome.clone());
        }
        if closing {
            if !unwritten.is_empty() {
                tracing::error!(
                    ops = unwritten.len(),
                    "the state store's writer stopped with writes that failed: they are lost \
                     (every acknowledged change was written before its answer; task outcomes \
                     are computed again when their job resumes)"
                );
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use resident_proto::{JobId, NodeId, pb};

    use super::*;
    use crate::store::{MemoryStore, StoreError, StoredOutcome};

    /// Fails its first `failures` batches, then writes to memory, taking a millisecond a
    /// batch as an fsync would; counts the batches.
    #[derive(Default)]
    struct FlakyStore {
        failures: AtomicU32,
        batches: AtomicU32,
        inner: MemoryStore,
    }

    impl DurableStore for FlakyStore {
        fn load_pools(&self) -> Result<Vec<pb::PoolSpec>, StoreError> {
            self.inner.load_pools()
        }
        fn load_jobs(&self) -> Result<Vec<pb::JobStatus>, StoreError> {
            self.inner.load_jobs()
        }
        fn outcomes(&self, job: &JobId) -> Result<Vec<(u64, StoredOutcome)>, StoreError> {
            self.inner.outcomes(job)
        }
        fn load_nodes(&self) -> Result<Vec<NodeId>, StoreError> {
            self.inner.load_nodes()
        }
        fn load_placements(
            &self,
        ) -> Result<Vec<(resident_proto::ActorId, crate::store::StoredPlacement)>, StoreError>
        {
            self.inner.load_placements()
        }
        fn apply(&self, batch: &[StoreOp]) -> Result<(), StoreError> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            let failing = self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                return Err(StoreError::Backend("disk full".into()));
            }
            self.inner.apply(batch)
        }
    }

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

    #[test]
    fn a_failed_write_fails_its_waiters_and_is_written_again() {
        let store = Arc::new(FlakyStore::default());
        // Every batch fails until the disk "recovers": the waiter's batch fails whether
        // the writer took the op alone first or together with the waiter.
        store.failures.store(u32::MAX, Ordering::SeqCst);
        let writer = StoreWriter::spawn(store.clone(), SchedulerMetrics::default());
        writer.write(pool("a"));
        let failed = wait(&writer).unwrap_err();
        assert!(failed.contains("disk full"), "{failed}");
        assert!(store.load_pools().unwrap().is_empty());
        store.failures.store(0, Ordering::SeqCst);
        // The next batch (or the retry timer) writes the kept op.
        writer.write(pool("b"));
        assert_eq!(wait(&writer), Ok(()));
        let names: Vec<String> = store
            .load_pools()
            .unwrap()
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
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
