use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use resident_proto::connect::ClientCredentials;
use resident_proto::connect::{
    AuthedChannel, BearerToken, is_transport_failure, plaintext_hint, scheduler_endpoint,
    transport_hint,
};
use resident_proto::pb;
use resident_proto::pb::scheduler_service_client::SchedulerServiceClient;

use crate::error::SdkError;
use crate::info::{ActorInfo, JobStatus, NodeInfo, PoolStatus};
use resident_proto::JobId;

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

pub(crate) fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
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

/// A listing the scheduler cut to fit its byte cap says so on the caller's log.
pub(crate) fn warn_if_omitted(what: &str, omitted: u32) {
    if omitted > 0 {
        tracing::warn!(
            omitted,
            "the scheduler left {omitted} {what} out of its answer to keep it within its byte \
             cap; the first ones are listed"
        );
    }
}
