//! A pool of resident actors as the client sees it: [`Pool`] (status, scaling, deletion, and
//! jobs submitted to it), [`CallSession`] for one call at a time, and the [`Cluster`] calls
//! that make a pool handle. Above the connection (`client.rs`) and the job stream
//! (`job_stream.rs`), which name neither.

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use prost::bytes::Bytes;
use resident_proto::pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Cluster, with_timeout};
use crate::error::SdkError;
use crate::info::{ActorState, PoolStatus};
use crate::job_stream::{JobStream, TaskOutput, TaskPayload, open_job};
use crate::pool_spec::PoolSpec;

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

impl Cluster {
    /// Creates a pool (or returns the existing one with the same spec).
    pub async fn create_pool(&self, spec: PoolSpec) -> Result<Pool, SdkError> {
        let name = spec.name().to_owned();
        let request = pb::CreatePoolRequest {
            spec: Some(spec.into_pb()),
        };
        self.client()
            .create_pool(with_timeout(request, self.request_timeout()))
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
        let request = with_timeout(request, self.cluster.request_timeout());
        let status = self.cluster.client().get_pool(request).await?;
        Ok(status.into_inner().into())
    }

    /// Waits until every replica is ready, or every one that can be: an actor that lost its
    /// place to a failure while it loaded (its GPU or its node failed) and has nowhere to go
    /// now does not hold the pool up once another is ready, as such a loss does not stop a
    /// running job. Fails early when every actor is dead, and on timeout says why actors
    /// are not ready (placement refusal or load errors).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<PoolStatus, SdkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status().await?;
            let replicas = status.replicas();
            if status.ready_actors >= replicas || ready_but_for_lost_places(&status) {
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
        let request = with_timeout(request, self.cluster.request_timeout());
        let status = self.cluster.client().scale_pool(request).await?;
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
        let request = with_timeout(request, self.cluster.request_timeout());
        let answer = self.cluster.client().delete_pool(request).await?;
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

/// Whether the pool is as ready as it can be now: some actor is ready, and every other one
/// failed after it was placed (it spent a restart) and cannot be placed again for now
/// (placement says why). A pool that never had room for its replicas keeps waiting.
fn ready_but_for_lost_places(status: &PoolStatus) -> bool {
    status.ready_actors > 0
        && status.unplaced_reason.is_some()
        && status.actors.iter().all(|actor| match actor.state {
            ActorState::Ready => true,
            ActorState::Pending => actor.restarts > 0,
            _ => false,
        })
}

#[cfg(test)]
mod wait_tests {
    use super::*;
    use crate::PoolSpec;

    fn actor(state: ActorState, restarts: u32) -> crate::info::ActorInfo {
        crate::info::ActorInfo {
            actor_id: resident_proto::ActorId::new("a"),
            pool: resident_proto::PoolName::new("p"),
            node_id: None,
            gpu_indices: Vec::new(),
            gpu_fraction: 1.0,
            state,
            model_loads: 0,
            restarts,
            vram_bytes: 0,
            in_flight: 0,
            tasks_done: 0,
            error: None,
        }
    }

    fn pool(actors: Vec<crate::info::ActorInfo>, unplaced: bool) -> PoolStatus {
        PoolStatus {
            spec: PoolSpec::new("p", "echo").replicas(actors.len() as u32),
            ready_actors: actors
                .iter()
                .filter(|a| a.state == ActorState::Ready)
                .count() as u32,
            actors,
            unplaced_reason: unplaced.then(|| "no GPU with room".to_owned()),
            usage: Vec::new(),
            usage_since_unix_ms: 0,
        }
    }

    /// An actor that lost its GPU while it loaded, with nowhere to go, does not hold up a
    /// pool with a ready actor; one that never had a place, one still loading, or a pool
    /// with no ready actor do.
    #[test]
    fn only_actors_that_lost_their_place_to_a_failure_are_not_waited_for() {
        use ActorState::{Pending, Ready, Starting};
        assert!(ready_but_for_lost_places(&pool(
            vec![actor(Ready, 0), actor(Pending, 1)],
            true
        )));
        assert!(!ready_but_for_lost_places(&pool(
            vec![actor(Ready, 0), actor(Pending, 0)],
            true
        )));
        assert!(!ready_but_for_lost_places(&pool(
            vec![actor(Ready, 0), actor(Pending, 1)],
            false
        )));
        assert!(!ready_but_for_lost_places(&pool(
            vec![actor(Ready, 0), actor(Starting, 1)],
            true
        )));
        assert!(!ready_but_for_lost_places(&pool(
            vec![actor(Pending, 1), actor(Pending, 1)],
            true
        )));
    }
}
