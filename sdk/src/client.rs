use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use prost::bytes::Bytes;
pub use resident_proto::connect::ClientCredentials;
use resident_proto::connect::{
    AuthedChannel, BearerToken, is_transport_failure, plaintext_hint, scheduler_endpoint,
    transport_hint,
};
use resident_proto::pb;
use resident_proto::pb::scheduler_service_client::SchedulerServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::SdkError;
use crate::info::{ActorInfo, ActorState, JobStatus, NodeInfo, PoolStatus};
use crate::job_stream::open_job;
pub use crate::job_stream::{JobStream, TaskPayload};
use crate::pool_spec::PoolSpec;
use resident_proto::{ActorId, JobId, NodeId};

/// A connection to a Resident cluster (remote, or in this process with `Cluster::local`).
#[derive(Clone)]
pub struct Cluster {
    client: SchedulerServiceClient<AuthedChannel>,
    url: String,
    request_timeout: Duration,
    /// How long a job's stream waits for a lost scheduler to come back before it fails.
    reconnect_timeout: Duration,
    /// Keeps an in-process cluster alive as long as any handle to it exists.
    _local: Option<Arc<dyn Any + Send + Sync>>,
}

/// How often the client pings the scheduler on an otherwise quiet connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long an unanswered ping may wait before the connection counts as dead.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a job waits, by default, for a scheduler that went away (a restart, a network
/// cut) before it fails; within it, the job resumes where it was.
pub const DEFAULT_RECONNECT_TIMEOUT: Duration = Duration::from_secs(600);

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

/// How a job's tasks are sent.
#[derive(Clone, Debug, Default)]
pub struct SubmitOptions {
    /// At most this many tasks submitted but unanswered (0 = the scheduler's limit); inputs
    /// beyond it wait in the client's stream.
    pub window: u32,
    /// The actor method every task calls; empty = the kind's default.
    pub method: String,
    /// How many tasks the job will have, when known (0 = unknown): the dashboard's and
    /// `resident jobs`' progress and ETA.
    pub expected_tasks: u64,
}

/// Whether `RESIDENT_INSECURE` allows a token over plaintext `http://` beyond loopback
/// (`1`, `true`, `yes`).
pub fn insecure_from_env() -> bool {
    std::env::var("RESIDENT_INSECURE")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// The CA (`RESIDENT_CA`, a PEM file) and token (`RESIDENT_TOKEN`) from the environment; the
/// one place the SDK reads them, so programs that pass credentials explicitly never do.
pub fn credentials_from_env() -> Result<ClientCredentials, SdkError> {
    let mut credentials = ClientCredentials::default()
        .with_token(std::env::var("RESIDENT_TOKEN").ok())
        .allow_token_over_plaintext(insecure_from_env());
    if let Some(ca) = std::env::var_os("RESIDENT_CA").filter(|v| !v.is_empty()) {
        credentials = credentials
            .with_ca_file(std::path::Path::new(&ca))
            .map_err(|e| SdkError::Credentials(format!("RESIDENT_CA: {e}")))?;
    }
    Ok(credentials)
}

fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

impl Cluster {
    /// Connects to the scheduler at `url`, with the CA and token from the environment
    /// (`RESIDENT_CA`, `RESIDENT_TOKEN`; see [`credentials_from_env`]). `https://` is always
    /// TLS (against `RESIDENT_CA`, or the system roots); `http://` is plaintext.
    pub async fn connect(url: &str) -> Result<Self, SdkError> {
        Self::connect_with(url, credentials_from_env()?).await
    }

    /// Connects with explicit credentials (a CA to trust, a token to send).
    pub async fn connect_with(url: &str, credentials: ClientCredentials) -> Result<Self, SdkError> {
        let endpoint = scheduler_endpoint(url, &credentials)
            .map_err(|e| SdkError::Credentials(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            // A half-open connection (the scheduler's host froze or vanished without a
            // reset) would leave a job stream waiting forever: unanswered HTTP/2 pings close
            // it within KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT, and the stream ends in an error.
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let connect_error = |source: tonic::transport::Error| SdkError::Connect {
            url: url.to_owned(),
            hint: transport_hint(url, &source)
                .map(|h| format!(": {h}"))
                .unwrap_or_default(),
            source,
        };
        let channel = endpoint.connect().await.map_err(connect_error)?;
        let token = BearerToken::new(credentials.token.as_deref())
            .map_err(|e| SdkError::Credentials(e.to_string()))?;
        let client = SchedulerServiceClient::with_interceptor(channel, token)
            .max_decoding_message_size(resident_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(resident_proto::MAX_MESSAGE_BYTES);
        let cluster = Self {
            client,
            url: url.to_owned(),
            request_timeout: Duration::from_secs(30),
            reconnect_timeout: DEFAULT_RECONNECT_TIMEOUT,
            _local: None,
        };
        cluster.check_protocol().await?;
        Ok(cluster)
    }

    /// One cheap call, so a port that does not speak our gRPC (plaintext to a TLS port, a
    /// proxy) fails here with a clear error rather than on the first real call. Any answer
    /// from the scheduler, even a refusal, proves the protocol.
    async fn check_protocol(&self) -> Result<(), SdkError> {
        let probe = pb::GetJobRequest {
            job_id: String::new(),
        };
        match self
            .client
            .clone()
            .get_job(with_timeout(probe, self.request_timeout))
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if is_transport_failure(&status) => {
                let hint = transport_hint(&self.url, &status)
                    .or_else(|| plaintext_hint(&self.url))
                    .unwrap_or_else(|| status.message().to_owned());
                Err(SdkError::Unavailable(format!(
                    "the scheduler at {} did not answer: {hint}",
                    self.url
                )))
            }
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) =>
            {
                // Unauthenticated is worth reporting now; permission depends on the call.
                if status.code() == tonic::Code::Unauthenticated {
                    Err(status.into())
                } else {
                    Ok(())
                }
            }
            Err(_) => Ok(()),
        }
    }

    #[cfg(feature = "local")]
    pub(crate) fn keep_alive(mut self, guard: Arc<dyn Any + Send + Sync>) -> Self {
        self._local = Some(guard);
        self
    }

    /// The scheduler's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What keeps an in-process cluster alive (`Cluster::local`), if this is one.
    #[cfg_attr(not(feature = "local"), allow(dead_code))]
    pub(crate) fn local_guard(&self) -> Option<&(dyn Any + Send + Sync)> {
        self._local.as_deref()
    }

    /// How long each job waits for a scheduler that went away before it fails with
    /// [`SdkError::SchedulerGone`] (default [`DEFAULT_RECONNECT_TIMEOUT`]; zero fails at
    /// once). Within it the job resumes by id: every task's result arrives once.
    pub fn with_reconnect_timeout(mut self, timeout: Duration) -> Self {
        self.reconnect_timeout = timeout;
        self
    }

    pub(crate) fn reconnect_timeout(&self) -> Duration {
        self.reconnect_timeout
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub(crate) fn client(&self) -> SchedulerServiceClient<AuthedChannel> {
        self.client.clone()
    }

    /// Creates a pool (or returns the existing one with the same spec).
    pub async fn create_pool(&self, spec: PoolSpec) -> Result<Pool, SdkError> {
        let name = spec.name().to_owned();
        let request = pb::CreatePoolRequest {
            spec: Some(spec.into_pb()),
        };
        self.client
            .clone()
            .create_pool(with_timeout(request, self.request_timeout))
            .await?;
        Ok(self.pool(name))
    }

    /// A handle to an existing pool, by name.
    pub fn pool(&self, name: impl Into<String>) -> Pool {
        Pool {
            cluster: self.clone(),
            name: name.into(),
        }
    }

    /// Sets what a job of this client's reports about itself, shown on the dashboard: a
    /// JSON object (a sweep's `status` line and `leaderboard` rows, say), at most 64 KiB.
    pub async fn annotate_job(
        &self,
        job_id: &JobId,
        summary: &serde_json::Value,
    ) -> Result<(), SdkError> {
        let request = pb::AnnotateJobRequest {
            job_id: job_id.to_string(),
            summary_json: summary.to_string(),
        };
        self.client
            .clone()
            .annotate_job(with_timeout(request, self.request_timeout))
            .await?;
        Ok(())
    }

    /// Every node the scheduler knows, alive or dead.
    pub async fn list_nodes(&self) -> Result<Vec<NodeInfo>, SdkError> {
        let request = with_timeout(pb::ListNodesRequest {}, self.request_timeout);
        let nodes = self.client.clone().list_nodes(request).await?;
        let answer = nodes.into_inner();
        warn_if_omitted("nodes", answer.omitted);
        Ok(answer.nodes.into_iter().map(NodeInfo::from).collect())
    }

    /// Every actor of every pool.
    pub async fn list_actors(&self) -> Result<Vec<ActorInfo>, SdkError> {
        let request = pb::ListActorsRequest {
            pool: String::new(),
        };
        let request = with_timeout(request, self.request_timeout);
        let actors = self.client.clone().list_actors(request).await?;
        let answer = actors.into_inner();
        warn_if_omitted("actors", answer.omitted);
        Ok(answer.actors.into_iter().map(ActorInfo::from).collect())
    }

    /// Every pool, by name, with its actors.
    pub async fn list_pools(&self) -> Result<Vec<PoolStatus>, SdkError> {
        let request = with_timeout(pb::ListPoolsRequest::default(), self.request_timeout);
        let pools = self.client.clone().list_pools(request).await?;
        let answer = pools.into_inner();
        warn_if_omitted("pools", answer.omitted);
        Ok(answer.pools.into_iter().map(PoolStatus::from).collect())
    }

    /// Every pool, by name, without its actors: ready counts and why some wait for a place,
    /// a poll that stays cheap for the scheduler however many actors the pools hold.
    pub async fn list_pool_summaries(&self) -> Result<Vec<PoolStatus>, SdkError> {
        let request = pb::ListPoolsRequest { omit_actors: true };
        let request = with_timeout(request, self.request_timeout);
        let answer = self.client.clone().list_pools(request).await?.into_inner();
        warn_if_omitted("pools", answer.omitted);
        Ok(answer.pools.into_iter().map(PoolStatus::from).collect())
    }

    /// The jobs the scheduler holds: running ones and the most recent finished ones.
    pub async fn list_jobs(&self) -> Result<Vec<JobStatus>, SdkError> {
        let request = with_timeout(pb::ListJobsRequest {}, self.request_timeout);
        let jobs = self.client.clone().list_jobs(request).await?;
        let answer = jobs.into_inner();
        warn_if_omitted("jobs", answer.omitted);
        Ok(answer.jobs.into_iter().map(JobStatus::from).collect())
    }

    /// A job's status by its id.
    pub async fn job_status(&self, job_id: &JobId) -> Result<JobStatus, SdkError> {
        let request = pb::GetJobRequest {
            job_id: job_id.to_string(),
        };
        let request = with_timeout(request, self.request_timeout);
        Ok(self
            .client
            .clone()
            .get_job(request)
            .await?
            .into_inner()
            .into())
    }

    /// Cancels what is left of a job; finished tasks keep their results.
    pub async fn cancel_job(&self, job_id: &JobId) -> Result<JobStatus, SdkError> {
        let request = pb::CancelJobRequest {
            job_id: job_id.to_string(),
        };
        let request = with_timeout(request, self.request_timeout);
        Ok(self
            .client
            .clone()
            .cancel_job(request)
            .await?
            .into_inner()
            .into())
    }

    /// Waits until `count` nodes are alive.
    pub async fn wait_for_nodes(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<NodeInfo>, SdkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let nodes = self.list_nodes().await?;
            if nodes.iter().filter(|n| n.alive).count() >= count {
                return Ok(nodes);
            }
            if Instant::now() > deadline {
                return Err(SdkError::Timeout(format!(
                    "{count} nodes did not join within {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A pool of resident actors.
#[derive(Clone)]
pub struct Pool {
    cluster: Cluster,
    name: String,
}

impl Pool {
    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool's spec, actors and readiness.
    pub async fn status(&self) -> Result<PoolStatus, SdkError> {
        let request = pb::GetPoolRequest {
            pool: self.name.clone(),
        };
        let request = with_timeout(request, self.cluster.request_timeout);
        let status = self.cluster.client.clone().get_pool(request).await?;
        Ok(status.into_inner().into())
    }

    /// Waits until every replica is ready. Fails early when every actor is dead, and on
    /// timeout says why actors are not ready (placement refusal or load errors).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<PoolStatus, SdkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status().await?;
            let replicas = status.replicas();
            if status.ready_actors >= replicas {
                return Ok(status);
            }
            let errors: Vec<&str> = status
                .actors
                .iter()
                .filter_map(|a| a.error.as_deref())
                .collect();
            let all_dead = status.actors.iter().all(|a| a.state == ActorState::Dead);
            if !status.actors.is_empty() && all_dead {
                return Err(SdkError::ActorsFailed {
                    pool: self.name.clone(),
                    error: errors.first().unwrap_or(&"no error reported").to_string(),
                });
            }
            if Instant::now() > deadline {
                let why = match &status.unplaced_reason {
                    Some(reason) => reason.clone(),
                    None => errors
                        .first()
                        .copied()
                        .unwrap_or("still loading")
                        .to_owned(),
                };
                return Err(SdkError::Timeout(format!(
                    "pool `{}` has {}/{} actors ready after {timeout:?}: {why}",
                    self.name, status.ready_actors, replicas
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sets the pool's replica count; the scheduler starts or stops actors to match.
    pub async fn scale(&self, replicas: u32) -> Result<PoolStatus, SdkError> {
        let request = pb::ScalePoolRequest {
            pool: self.name.clone(),
            replicas,
        };
        let request = with_timeout(request, self.cluster.request_timeout);
        let status = self.cluster.client.clone().scale_pool(request).await?;
        Ok(status.into_inner().into())
    }

    /// Deletes the pool: its actors stop and free what they hold; its queued tasks fail.
    pub async fn delete(&self) -> Result<(), SdkError> {
        self.delete_pool(false).await.map(drop)
    }

    /// Deletes the pool unless a running job (another client's, say) still uses it or
    /// work is queued on it: then it is kept, and the answer says why.
    pub async fn delete_if_unused(&self) -> Result<Option<String>, SdkError> {
        self.delete_pool(true).await
    }

    /// `DeletePool`: why the pool was kept, if it was.
    async fn delete_pool(&self, if_unused: bool) -> Result<Option<String>, SdkError> {
        let request = pb::DeletePoolRequest {
            pool: self.name.clone(),
            if_unused,
        };
        let request = with_timeout(request, self.cluster.request_timeout);
        let answer = self.cluster.client.clone().delete_pool(request).await?;
        let answer = answer.into_inner();
        Ok((!answer.deleted).then_some(answer.kept_because))
    }

    /// Streams `inputs` to the pool as one job; results arrive as they finish, each once.
    /// Items are anything that becomes [`Bytes`]: `Vec<u8>`, `String`, `&'static str`...
    pub async fn submit<S>(&self, job_name: &str, inputs: S) -> Result<JobStream, SdkError>
    where
        S: Stream + Send + 'static,
        S::Item: Into<Bytes> + Send,
    {
        self.submit_with(job_name, inputs, SubmitOptions::default())
            .await
    }

    /// Like [`Pool::submit`], with at most `window` tasks submitted but unanswered (0 = the
    /// scheduler's limit); inputs beyond it wait in `inputs`.
    pub async fn submit_windowed<S>(
        &self,
        job_name: &str,
        inputs: S,
        window: u32,
    ) -> Result<JobStream, SdkError>
    where
        S: Stream + Send + 'static,
        S::Item: Into<Bytes> + Send,
    {
        let options = SubmitOptions {
            window,
            ..SubmitOptions::default()
        };
        self.submit_with(job_name, inputs, options).await
    }

    /// Like [`Pool::submit`], with a window and an actor method (see [`SubmitOptions`]).
    pub async fn submit_with<S>(
        &self,
        job_name: &str,
        inputs: S,
        options: SubmitOptions,
    ) -> Result<JobStream, SdkError>
    where
        S: Stream + Send + 'static,
        S::Item: Into<Bytes> + Send,
    {
        let inputs = inputs.map(|input| TaskPayload::from(input.into()));
        self.submit_payloads(job_name, inputs, options).await
    }

    /// Like [`Pool::submit_with`], with each task's item count (see [`TaskPayload`]).
    pub async fn submit_payloads<S>(
        &self,
        job_name: &str,
        inputs: S,
        options: SubmitOptions,
    ) -> Result<JobStream, SdkError>
    where
        S: Stream<Item = TaskPayload> + Send + 'static,
    {
        let header = pb::SubmitHeader {
            pool: self.name.clone(),
            job_name: job_name.to_owned(),
            max_outstanding: options.window,
            method: options.method,
            resume_job_id: String::new(),
            expected_tasks: options.expected_tasks,
        };
        open_job(&self.cluster, header, Box::pin(inputs)).await
    }

    /// Runs every payload and returns the outputs in input order.
    pub async fn map<I>(&self, payloads: I) -> Result<Vec<TaskOutput>, SdkError>
    where
        I: IntoIterator,
        I::Item: Into<Bytes>,
    {
        self.map_with(payloads, SubmitOptions::default()).await
    }

    /// Like [`Pool::map`], with a window and an actor method (see [`SubmitOptions`]).
    pub async fn map_with<I>(
        &self,
        payloads: I,
        options: SubmitOptions,
    ) -> Result<Vec<TaskOutput>, SdkError>
    where
        I: IntoIterator,
        I::Item: Into<Bytes>,
    {
        let payloads: Vec<Bytes> = payloads.into_iter().map(Into::into).collect();
        let count = payloads.len();
        let inputs = futures::stream::iter(payloads);
        let mut job = self.submit_with("map", inputs, options).await?;
        let mut outputs = Vec::with_capacity(count);
        while let Some(output) = job.next().await {
            outputs.push(output?);
        }
        outputs.sort_by_key(|o| o.seq);
        Ok(outputs)
    }

    /// A typed handle on this pool, for a pool of the typed kind `K` (see [`crate::actor`]).
    pub fn typed<K: resident_actor::Kind>(&self) -> crate::TypedPool<K> {
        crate::TypedPool::new(self.clone())
    }

    /// A long-lived job for one-at-a-time calls, like calling a Ray actor handle.
    pub async fn session(&self) -> Result<CallSession, SdkError> {
        let (tx, rx) = mpsc::channel(16);
        let results = self.submit("session", ReceiverStream::new(rx)).await?;
        Ok(CallSession { tx, results })
    }
}

/// One call at a time over a single job stream.
pub struct CallSession {
    tx: mpsc::Sender<Bytes>,
    results: JobStream,
}

impl CallSession {
    /// Sends one payload and waits for its output; calls on one session run one at a time.
    pub async fn call(&mut self, payload: impl Into<Bytes>) -> Result<Bytes, SdkError> {
        self.tx
            .send(payload.into())
            .await
            .map_err(|_| SdkError::Unavailable("call session closed".into()))?;
        match self.results.next().await {
            Some(Ok(output)) => output.output.map_err(SdkError::TaskFailed),
            Some(Err(error)) => Err(error),
            None => Err(SdkError::Unavailable("call session closed".into())),
        }
    }
}

/// A listing the scheduler cut to fit its byte cap says so on the caller's log.
fn warn_if_omitted(what: &str, omitted: u32) {
    if omitted > 0 {
        tracing::warn!(
            omitted,
            "the scheduler left {omitted} {what} out of its answer to keep it within its byte \
             cap; the first ones are listed"
        );
    }
}
