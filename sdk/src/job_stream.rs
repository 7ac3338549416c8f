//! One job's task stream, kept alive across a lost scheduler.
//!
//! A driver task owns the connection: it feeds the inputs (numbering them), keeps every
//! input sent but not answered, and passes each result to the [`JobStream`] once. When the
//! stream breaks (the scheduler restarted, or the connection died) it reconnects with
//! backoff and resumes the job by id, sends again every unanswered input, and drops any
//! result it already delivered. It gives up when the scheduler stays away longer than the
//! cluster's reconnect timeout.

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use prost::bytes::Bytes;
use resident_proto::connect::is_transport_failure;
use resident_proto::{ActorId, JobId, NodeId, pb};
use tokio::sync::{mpsc, watch};

use crate::client::Cluster;
use crate::error::SdkError;
use crate::request_queue::RequestQueue;

/// One task's answer.
#[derive(Clone, Debug)]
pub struct TaskOutput {
    /// Position of the task in the submitted stream (0-based).
    pub seq: u64,
    /// The actor's output, or why the task failed for good.
    pub output: Result<Bytes, String>,
    /// Times the task was run (more than 1 after a retry).
    pub attempts: u32,
    /// The actor that ran it last (empty when it never ran).
    pub actor_id: ActorId,
    /// The node of that actor.
    pub node_id: NodeId,
    /// Microseconds the task waited in the scheduler's queue.
    pub queue_micros: u64,
    /// Microseconds the actor took to run it.
    pub run_micros: u64,
}

/// Results of one submitted job, each task's once, even across a scheduler restart.
///
/// Dropping it before the job finished cancels the job: the scheduler stops its tasks and
/// gives back what it held for it at once, rather than after the detach grace it keeps for
/// a client that lost its connection.
pub struct JobStream {
    /// The job's id (to inspect or cancel it from elsewhere).
    pub job_id: JobId,
    results: mpsc::Receiver<Result<TaskOutput, SdkError>>,
    items_running: watch::Receiver<u64>,
    /// The driver: stopped when the results are no longer wanted.
    driver: tokio::task::AbortHandle,
    /// Set by the driver once every task's result is in `results`: dropping the stream
    /// then cancels nothing.
    all_answered: Arc<AtomicBool>,
    /// Where to cancel the job from when it is dropped unfinished.
    cluster: Cluster,
}

/// How long a dropped job's cancel may take before its driver stops anyway.
const CANCEL_ON_DROP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for JobStream {
    fn drop(&mut self) {
        let unfinished = !self.driver.is_finished() && !self.all_answered.load(Ordering::Acquire);
        // The driver's stream may be stalled by flow control (its reader stopped reading,
        // so the scheduler reads its tasks no further): closing it does not reach the
        // scheduler, a cancel does. On the same connection: the scheduler's connection
        // window leaves room beside a stalled stream. The driver stops once the cancel is
        // in: stopped first, its request would end cleanly, and a job whose tasks so far
        // were all answered would finish as succeeded before the cancel arrived.
        match (unfinished, tokio::runtime::Handle::try_current()) {
            (true, Ok(runtime)) => {
                let cluster = self.cluster.clone();
                let job_id = self.job_id.clone();
                let driver = self.driver.clone();
                runtime.spawn(async move {
                    let cancelled =
                        tokio::time::timeout(CANCEL_ON_DROP_TIMEOUT, cluster.cancel_job(&job_id))
                            .await;
                    driver.abort();
                    if !matches!(cancelled, Ok(Ok(_))) {
                        tracing::debug!(%job_id, ?cancelled, "could not cancel a dropped job; the scheduler cancels it after its detach grace");
                    }
                });
            }
            _ => self.driver.abort(),
        }
    }
}

impl JobStream {
    /// Items done so far inside tasks still running (actors report progress within a
    /// chunk; see `RunningTaskProgress`): add it to the items of the results read for a
    /// bar that moves between results. It changes a few times a second at most.
    pub fn items_running(&self) -> watch::Receiver<u64> {
        self.items_running.clone()
    }
}

impl Stream for JobStream {
    type Item = Result<TaskOutput, SdkError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.results.poll_recv(cx)
    }
}

type Inputs = Pin<Box<dyn Stream<Item = TaskPayload> + Send>>;

/// One task's input: its payload and how many items (documents) it covers, which the
/// scheduler counts for the job's docs/s (`items_done`).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskPayload {
    /// What the actor receives.
    pub payload: Bytes,
    /// At least 1.
    pub items: u32,
}

impl TaskPayload {
    /// A payload covering `items` items (at least 1).
    pub fn new(payload: impl Into<Bytes>, items: u32) -> Self {
        Self {
            payload: payload.into(),
            items: items.max(1),
        }
    }
}

impl From<Bytes> for TaskPayload {
    fn from(payload: Bytes) -> Self {
        Self { payload, items: 1 }
    }
}

/// One attached client stream: where tasks go (until the job has them all), and where
/// results come from.
struct Attached {
    job_id: JobId,
    requests: Option<RequestQueue>,
    responses: tonic::Streaming<pb::SubmitResponse>,
}

struct JobDriver {
    cluster: Cluster,
    header: pb::SubmitHeader,
    /// Tasks the client stream may hold before the scheduler reads them.
    buffer: usize,
    inputs: Inputs,
    inputs_done: bool,
    next_seq: u64,
    /// Sent and not answered yet: sent again after a reconnect.
    unanswered: BTreeMap<u64, TaskPayload>,
    /// To be sent again on the current stream before any new input.
    resend: VecDeque<u64>,
    /// Items done inside each unanswered task that reported progress, and their sum.
    running: RunningItems,
    /// Every input was sent and every result passed on (see [`JobStream`]).
    all_answered: Arc<AtomicBool>,
}

/// Progress inside running tasks, by sequence number, published as a sum.
struct RunningItems {
    by_seq: BTreeMap<u64, u64>,
    total: watch::Sender<u64>,
}

impl RunningItems {
    fn set(&mut self, seq: u64, items_done: u64) {
        self.by_seq.insert(seq, items_done);
        self.publish();
    }

    fn answered(&mut self, seq: u64) {
        if self.by_seq.remove(&seq).is_some() {
            self.publish();
        }
    }

    /// A new stream: tasks still running report again (a task sent elsewhere restarts).
    fn clear(&mut self) {
        self.by_seq.clear();
        self.publish();
    }

    fn publish(&self) {
        let total = self.by_seq.values().sum();
        self.total.send_if_modified(|current| {
            let changed = *current != total;
            *current = total;
            changed
        });
    }
}

/// Opens the job (an error here is the scheduler's refusal: unknown pool, no permission)
/// and starts the driver that keeps it going.
pub(crate) async fn open_job(
    cluster: &Cluster,
    header: pb::SubmitHeader,
    inputs: Inputs,
) -> Result<JobStream, SdkError> {
    let buffer = match header.max_outstanding {
        0 => 1024,
        window => window as usize,
    };
    let (items_running_tx, items_running) = watch::channel(0);
    let mut driver = JobDriver {
        cluster: cluster.clone(),
        header,
        buffer,
        inputs,
        inputs_done: false,
        next_seq: 0,
        unanswered: BTreeMap::new(),
        resend: VecDeque::new(),
        running: RunningItems {
            by_seq: BTreeMap::new(),
            total: items_running_tx,
        },
        all_answered: Arc::new(AtomicBool::new(false)),
    };
    let all_answered = driver.all_answered.clone();
    let attached = driver.attach(cluster.request_timeout()).await?;
    let job_id = attached.job_id.clone();
    driver.header.resume_job_id = job_id.to_string();
    let (results_tx, results) = mpsc::channel(64);
    let task = tokio::spawn(driver.run(attached, results_tx));
    Ok(JobStream {
        job_id,
        results,
        items_running,
        driver: task.abort_handle(),
        all_answered,
        cluster: cluster.clone(),
    })
}

fn output_of(result: pb::TaskResult) -> TaskOutput {
    let output = match result.result {
        Some(pb::task_result::Result::Output(bytes)) => Ok(bytes),
        Some(pb::task_result::Result::Error(error)) => Err(error),
        None => Err("empty result".to_owned()),
    };
    TaskOutput {
        seq: result.seq,
        output,
        attempts: result.attempts,
        actor_id: ActorId::new(result.actor_id),
        node_id: NodeId::new(result.node_id),
        queue_micros: result.queue_micros,
        run_micros: result.run_micros,
    }
}

fn task_request(seq: u64, task: TaskPayload) -> pb::SubmitRequest {
    pb::SubmitRequest {
        body: Some(pb::submit_request::Body::Task(pb::TaskInput {
            seq,
            payload: task.payload,
            items: task.items,
        })),
    }
}

/// Whether a broken stream is worth resuming: the connection failed, or the scheduler went
/// away (a restart), as opposed to a refusal.
fn worth_resuming(error: &SdkError) -> bool {
    match error {
        SdkError::Unavailable(_) | SdkError::Timeout(_) => true,
        SdkError::Scheduler { code, .. } => matches!(
            code,
            tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
        ),
        _ => false,
    }
}

/// Opens (or, with `header.resume_job_id`, resumes) the job on a new client stream.
async fn attach(
    cluster: Cluster,
    header: pb::SubmitHeader,
    buffer: usize,
    timeout: Duration,
) -> Result<Attached, SdkError> {
    let (requests, requests_rx) = RequestQueue::new(buffer);
    requests.push(pb::SubmitRequest {
        body: Some(pb::submit_request::Body::Header(header)),
    });
    let open = async {
        let mut responses = cluster
            .client()
            .submit_tasks(requests_rx)
            .await?
            .into_inner();
        match responses.message().await?.and_then(|m| m.body) {
            Some(pb::submit_response::Body::Accepted(accepted)) => Ok(Attached {
                job_id: JobId::new(accepted.job_id),
                requests: Some(requests),
                responses,
            }),
            _ => Err(SdkError::Unavailable(
                "scheduler did not accept the job".into(),
            )),
        }
    };
    tokio::time::timeout(timeout, open)
        .await
        .unwrap_or_else(|_| {
            Err(SdkError::Timeout(format!(
                "the scheduler did not accept the job stream within {timeout:?}"
            )))
        })
}

impl JobDriver {
    /// Attaches within `timeout` at most (a frozen scheduler accepts connections and
    /// never answers).
    fn attach(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Attached, SdkError>> + Send + 'static {
        let timeout = timeout.min(self.cluster.request_timeout());
        attach(
            self.cluster.clone(),
            self.header.clone(),
            self.buffer,
            timeout,
        )
    }

    /// Resumes the job on a new stream, with backoff, until the reconnect timeout.
    async fn reattach(&mut self, broke: SdkError) -> Result<Attached, SdkError> {
        let timeout = self.cluster.reconnect_timeout();
        let job = self.header.resume_job_id.clone();
        if timeout.is_zero() {
            return Err(broke);
        }
        tracing::warn!(job_id = %job, error = %broke, "job stream broke; resuming");
        let began = Instant::now();
        let mut delay = Duration::from_millis(100);
        let mut last;
        loop {
            let left = timeout.saturating_sub(began.elapsed());
            match self.attach(left.max(Duration::from_secs(1))).await {
                Ok(attached) => {
                    tracing::info!(job_id = %job, after = ?began.elapsed(), unanswered = self.unanswered.len(), "job resumed");
                    self.resend = self.unanswered.keys().copied().collect();
                    self.running.clear();
                    return Ok(attached);
                }
                Err(error) if worth_resuming(&error) => last = error,
                Err(refused) => return Err(refused),
            }
            let waited = began.elapsed();
            if waited >= timeout {
                return Err(SdkError::SchedulerGone {
                    job: job.clone(),
                    waited,
                    last_error: last.to_string(),
                });
            }
            tokio::time::sleep(delay.min(timeout - waited)).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    async fn run(
        mut self,
        attached: Attached,
        results: mpsc::Sender<Result<TaskOutput, SdkError>>,
    ) {
        let mut attached = attached;
        loop {
            let broke = match self.pump(&mut attached, &results).await {
                Ok(()) => return,
                Err(broke) if worth_resuming(&broke) => broke,
                Err(error) => {
                    let _ = results.send(Err(error)).await;
                    return;
                }
            };
            attached = match self.reattach(broke).await {
                Ok(next) => next,
                Err(error) => {
                    let _ = results.send(Err(error)).await;
                    return;
                }
            };
        }
    }

    /// Before the last result is passed on, so a reader that drops the stream on reading
    /// it cancels nothing.
    fn note_if_all_answered(&self) {
        if self.inputs_done && self.unanswered.is_empty() {
            self.all_answered.store(true, Ordering::Release);
        }
    }

    /// Moves inputs out and results in on one attached stream until the job is done (Ok),
    /// the reader went away (Ok), or the stream broke (the error).
    async fn pump(
        &mut self,
        attached: &mut Attached,
        results: &mpsc::Sender<Result<TaskOutput, SdkError>>,
    ) -> Result<(), SdkError> {
        loop {
            self.note_if_all_answered();
            if self.inputs_done && self.resend.is_empty() {
                // Closing the request side tells the scheduler the job has all its tasks.
                attached.requests = None;
            }
            let requests = attached.requests.as_ref();
            let may_send = requests.is_some_and(RequestQueue::has_room);
            tokio::select! {
                biased;
                response = attached.responses.message() => match response {
                    Ok(Some(pb::SubmitResponse { body: Some(pb::submit_response::Body::Result(result)) })) => {
                        if self.unanswered.remove(&result.seq).is_none() {
                            continue; // Delivered before the stream broke.
                        }
                        self.running.answered(result.seq);
                        self.note_if_all_answered();
                        if results.send(Ok(output_of(result))).await.is_err() {
                            // The `JobStream` was dropped unfinished: its drop cancels the
                            // job, then stops this driver. Returning now would end the
                            // request cleanly first, and a job whose tasks so far were all
                            // answered would finish as succeeded before the cancel came.
                            std::future::pending::<()>().await;
                        }
                    }
                    Ok(Some(pb::SubmitResponse { body: Some(pb::submit_response::Body::Progress(progress)) })) => {
                        if self.unanswered.contains_key(&progress.seq) {
                            self.running.set(progress.seq, progress.items_done);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) if self.inputs_done && self.unanswered.is_empty() => return Ok(()),
                    Ok(None) => {
                        return Err(SdkError::Unavailable(
                            "the scheduler ended the job stream before every task was answered".into(),
                        ));
                    }
                    Err(status) if is_transport_failure(&status) => {
                        return Err(SdkError::Unavailable(status.message().to_owned()));
                    }
                    Err(status) => return Err(status.into()),
                },
                _ = std::future::ready(()), if may_send && !self.resend.is_empty() => {
                    let seq = self.resend.pop_front().expect("not empty");
                    // Answered on this stream before its turn came (the scheduler held it).
                    let Some(payload) = self.unanswered.get(&seq).cloned() else {
                        continue;
                    };
                    requests.expect("may send").push(task_request(seq, payload));
                }
                input = self.inputs.next(), if may_send && self.resend.is_empty() && !self.inputs_done => {
                    match input {
                        Some(payload) => {
                            let seq = self.next_seq;
                            self.next_seq += 1;
                            self.unanswered.insert(seq, payload.clone());
                            requests.expect("may send").push(task_request(seq, payload));
                        }
                        None => self.inputs_done = true,
                    }
                }
                _ = wait_for_room(requests), if !may_send && requests.is_some() => {}
            }
        }
    }
}

/// Resolves once the request queue has room again.
async fn wait_for_room(requests: Option<&RequestQueue>) {
    if let Some(requests) = requests {
        requests.room().await;
    }
}
