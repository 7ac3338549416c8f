//! A store for unit tests whose writes fail on demand.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use resident_proto::{JobId, NodeId, pb};

use super::{DurableStore, MemoryStore, StoreError, StoreOp, StoredOutcome};

/// Fails its first `failures` batches, then writes to memory, taking a millisecond a
/// batch as an fsync would; counts the batches, the ops they held and the recoveries.
#[derive(Default)]
pub(crate) struct FlakyStore {
    pub failures: AtomicU32,
    pub batches: AtomicU32,
    pub ops_tried: AtomicUsize,
    pub recoveries: AtomicU32,
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
    ) -> Result<Vec<(resident_proto::ActorId, super::StoredPlacement)>, StoreError> {
        self.inner.load_placements()
    }
    fn load_pool_usage(&self) -> Result<Vec<super::StoredUsage>, StoreError> {
        self.inner.load_pool_usage()
    }
    fn recover(&self) -> Result<(), StoreError> {
        self.recoveries.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn apply(&self, batch: &[StoreOp]) -> Result<(), StoreError> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.ops_tried.fetch_add(batch.len(), Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1));
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(StoreError::Backend(
                "No space left on device (disk full)".into(),
            ));
        }
        self.inner.apply(batch)
    }
}

impl FlakyStore {
    /// Every write fails (`true`) until set back (`false`).
    pub fn set_failing(&self, failing: bool) {
        let failures = if failing { u32::MAX } else { 0 };
        self.failures.store(failures, Ordering::SeqCst);
    }
}
