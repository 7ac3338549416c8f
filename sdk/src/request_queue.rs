//! The request side of one job stream: tasks wait here until the connection takes them.
//!
//! It is bounded twice: by count (the job's window) and by payload bytes. The byte bound
//! keeps a client's memory small when its tasks are large and the scheduler reads them
//! slowly (or not at all, while the job's buffer is full): without it, a window of 1,024
//! tasks of 1 MiB each would wait here, a gigabyte, and all of it would have to be sent
//! before the stream could end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use resident_proto::pb;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// Payload bytes that may wait in one stream's queue; one task more may always go in, so
/// a task larger than this still goes, alone.
pub(crate) const MAX_QUEUED_BYTES: u64 = 16 << 20;

/// The sending half, kept by the job's driver.
pub(crate) struct RequestQueue {
    tx: mpsc::Sender<pb::SubmitRequest>,
    queued: Arc<QueuedBytes>,
    max_bytes: u64,
}

#[derive(Default)]
struct QueuedBytes {
    bytes: AtomicU64,
    taken: Notify,
}

impl RequestQueue {
    /// A queue for at most `max_tasks` tasks and about [`MAX_QUEUED_BYTES`], and the
    /// stream the connection reads it from.
    pub(crate) fn new(
        max_tasks: usize,
    ) -> (Self, impl Stream<Item = pb::SubmitRequest> + Send + 'static) {
        Self::with_max_bytes(max_tasks, MAX_QUEUED_BYTES)
    }

    fn with_max_bytes(
        max_tasks: usize,
        max_bytes: u64,
    ) -> (Self, impl Stream<Item = pb::SubmitRequest> + Send + 'static) {
        let (tx, rx) = mpsc::channel(max_tasks.max(1));
        let queued = Arc::new(QueuedBytes::default());
        let taken = queued.clone();
        let requests = ReceiverStream::new(rx).map(move |request| {
            taken
                .bytes
                .fetch_sub(payload_bytes(&request), Ordering::Relaxed);
            taken.taken.notify_waiters();
            request
        });
        let queue = Self {
            tx,
            queued,
            max_bytes,
        };
        (queue, requests)
    }

    /// Whether one more task may go in now.
    pub(crate) fn has_room(&self) -> bool {
        self.tx.capacity() > 0 && self.queued.bytes.load(Ordering::Relaxed) < self.max_bytes
    }

    /// Queues `request`; call only when [`RequestQueue::has_room`].
    pub(crate) fn push(&self, request: pb::SubmitRequest) {
        // Counted before it is queued: the connection may take it (and subtract) at once.
        let bytes = payload_bytes(&request);
        self.queued.bytes.fetch_add(bytes, Ordering::Relaxed);
        if self.tx.try_send(request).is_err() {
            self.queued.bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Resolves once one more task may go in (or the connection is gone).
    pub(crate) async fn room(&self) {
        loop {
            let taken = self.queued.taken.notified();
            if self.has_room() || self.tx.is_closed() {
                return;
            }
            if self.tx.capacity() == 0 {
                if let Ok(permit) = self.tx.reserve().await {
                    drop(permit);
                }
            } else {
                taken.await;
            }
        }
    }
}

fn payload_bytes(request: &pb::SubmitRequest) -> u64 {
    match &request.body {
        Some(pb::submit_request::Body::Task(task)) => task.payload.len() as u64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn task(bytes: usize) -> pb::SubmitRequest {
        pb::SubmitRequest {
            body: Some(pb::submit_request::Body::Task(pb::TaskInput {
                payload: vec![0; bytes].into(),
                ..Default::default()
            })),
        }
    }

    #[tokio::test]
    async fn the_queue_is_bounded_by_bytes_as_well_as_by_count() {
        let (queue, mut requests) = RequestQueue::with_max_bytes(100, 1_000);
        queue.push(task(600));
        assert!(queue.has_room(), "600 of 1,000 bytes");
        queue.push(task(600));
        assert!(!queue.has_room(), "1,200 of 1,000 bytes: full");
        let waiting = tokio::spawn(async move {
            queue.room().await;
            queue
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "room while full");
        requests.next().await.expect("a request");
        let queue = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room once a task was taken")
            .unwrap();
        assert!(queue.has_room());
    }

    #[tokio::test]
    async fn a_task_larger_than_the_bound_goes_alone() {
        let (queue, mut requests) = RequestQueue::with_max_bytes(100, 1_000);
        assert!(queue.has_room());
        queue.push(task(5_000));
        assert!(!queue.has_room());
        requests.next().await.expect("the large task");
        assert!(queue.has_room());
    }

    #[tokio::test]
    async fn the_queue_is_bounded_by_count() {
        let (queue, _requests) = RequestQueue::with_max_bytes(2, 1_000_000);
        queue.push(task(1));
        queue.push(task(1));
        assert!(!queue.has_room(), "two of two tasks");
    }
}
