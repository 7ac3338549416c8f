//! Where the scheduler sends one job's results: [`JobResults`], each message charged to the
//! job's byte buffer until the client reads it. A leaf below the records that hold it.

use std::sync::Arc;

use resident_proto::pb;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::budget::{BufferCharge, JobBuffer};

/// One message on its way to a job's client, holding its bytes in the job's buffer until
/// the client reads it.
#[derive(Debug)]
pub struct JobResultMessage {
    /// A result, the job's end, or the error that ends the stream.
    pub message: Result<pb::SubmitResponse, tonic::Status>,
    /// Its bytes in the job's buffer, given back when it is read.
    pub charge: Option<BufferCharge>,
}

/// Where the scheduler sends one job's results. The channel has no count bound: what it
/// holds is bounded in bytes by the job's buffer, since every message is charged to it and
/// the job's task forwarder takes no new task while the buffer is full.
///
/// When the core lets go of the last copy (the job finished or was cancelled, or another
/// stream took it over), the token that [`JobResults::new`] returns fires: the task forwarder then
/// reads no more of the client's tasks.
#[derive(Clone, Debug)]
pub struct JobResults {
    tx: mpsc::UnboundedSender<JobResultMessage>,
    buffer: Arc<JobBuffer>,
    _release_on_drop: Arc<DropGuard>,
}

impl JobResults {
    /// The sender, the client's receiver, and the token that fires once the core holds
    /// no copy of the sender.
    pub fn new(
        buffer: Arc<JobBuffer>,
    ) -> (
        Self,
        mpsc::UnboundedReceiver<JobResultMessage>,
        CancellationToken,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let released = CancellationToken::new();
        let results = Self {
            tx,
            buffer,
            _release_on_drop: Arc::new(released.clone().drop_guard()),
        };
        (results, rx, released)
    }

    /// Queues a message for the client, charged to the job's buffer.
    pub fn send(&self, message: pb::SubmitResponse) {
        let charge = self
            .buffer
            .charge_result(prost::Message::encoded_len(&message) as u64);
        let _ = self.tx.send(JobResultMessage {
            message: Ok(message),
            charge: Some(charge),
        });
    }

    /// The job's buffer, which its results are charged to.
    pub fn buffer(&self) -> &Arc<JobBuffer> {
        &self.buffer
    }

    /// Ends the client's stream with an error.
    pub fn fail(&self, status: tonic::Status) {
        let _ = self.tx.send(JobResultMessage {
            message: Err(status),
            charge: None,
        });
    }
}
