use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use resident_proto::pb::scheduler_service_server::SchedulerService;
use resident_proto::{JobId, PoolName, pb};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use super::listing::{MAX_LISTING_BYTES, fit_listing};
use crate::auth::{Action, audit, principal_of, require};
use crate::budget::{BufferBudget, JobBuffer};
use crate::core::{JobResultMessage, JobResults, JobStream, SchedulerCommand, SchedulerHandle};

/// The client-facing API: pools, task streams, jobs, listings.
pub struct ClientApiService {
    pub scheduler: SchedulerHandle,
    /// Tasks one job may have submitted but not yet answered; the stream waits beyond it.
    pub max_outstanding_per_job: usize,
    /// Bytes buffered for running jobs, per job and in all.
    pub budget: Arc<BufferBudget>,
}

#[tonic::async_trait]
impl SchedulerService for ClientApiService {
    #[instrument(skip_all)]
    async fn create_pool(
        &self,
        request: Request<pb::CreatePoolRequest>,
    ) -> Result<Response<pb::PoolStatus>, Status> {
        let principal = principal_of(&request)?;
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| Status::invalid_argument("pool spec is missing"))?;
        let subject = spec.name.clone();
        require(&principal, Action::ManagePools, "create_pool", &subject)?;
        let status = self
            .scheduler
            .call(|reply| SchedulerCommand::CreatePool {
                spec,
                requester: principal.clone(),
                reply,
            })
            .await
            .map_err(Status::from);
        Ok(Response::new(audit::outcome(
            &principal,
            "create_pool",
            &subject,
            status,
        )?))
    }

    #[instrument(skip_all)]
    async fn scale_pool(
        &self,
        request: Request<pb::ScalePoolRequest>,
    ) -> Result<Response<pb::PoolStatus>, Status> {
        let principal = principal_of(&request)?;
        let request = request.into_inner();
        let pool = PoolName::new(request.pool);
        let subject = format!("{pool} to {}", request.replicas);
        require(&principal, Action::ManagePools, "scale_pool", &subject)?;
        let replicas = request.replicas;
        let status = self
            .scheduler
            .call(|reply| SchedulerCommand::ScalePool {
                pool,
                replicas,
                requester: principal.clone(),
                reply,
            })
            .await
            .map_err(Status::from);
        Ok(Response::new(audit::outcome(
            &principal,
            "scale_pool",
            &subject,
            status,
        )?))
    }

    #[instrument(skip_all)]
    async fn delete_pool(
        &self,
        request: Request<pb::DeletePoolRequest>,
    ) -> Result<Response<pb::DeletePoolResponse>, Status> {
        let principal = principal_of(&request)?;
        let request = request.into_inner();
        let pool = PoolName::new(request.pool);
        let subject = pool.to_string();
        require(&principal, Action::ManagePools, "delete_pool", &subject)?;
        let kept = self
            .scheduler
            .call(|reply| SchedulerCommand::DeletePool {
                pool,
                if_unused: request.if_unused,
                requester: principal.clone(),
                reply,
            })
            .await
            .map_err(Status::from);
        let kept = audit::outcome(&principal, "delete_pool", &subject, kept)?;
        Ok(Response::new(pb::DeletePoolResponse {
            deleted: kept.is_none(),
            kept_because: kept.unwrap_or_default(),
        }))
    }

    #[instrument(skip_all)]
    async fn get_pool(
        &self,
        request: Request<pb::GetPoolRequest>,
    ) -> Result<Response<pb::PoolStatus>, Status> {
        let principal = principal_of(&request)?;
        let pool = PoolName::new(request.into_inner().pool);
        require(&principal, Action::Read, "get_pool", pool.as_str())?;
        let status = self
            .scheduler
            .call(|reply| SchedulerCommand::GetPool { pool, reply })
            .await?;
        Ok(Response::new(status))
    }

    #[instrument(skip_all)]
    async fn list_pools(
        &self,
        request: Request<pb::ListPoolsRequest>,
    ) -> Result<Response<pb::ListPoolsResponse>, Status> {
        require(&principal_of(&request)?, Action::Read, "list_pools", "")?;
        let omit_actors = request.get_ref().omit_actors;
        let pools = self
            .scheduler
            .call(|reply| SchedulerCommand::ListPools { omit_actors, reply })
            .await?;
        let (pools, omitted) = fit_listing(pools, MAX_LISTING_BYTES);
        Ok(Response::new(pb::ListPoolsResponse { pools, omitted }))
    }

    #[instrument(skip_all)]
    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        require(&principal_of(&request)?, Action::Read, "list_jobs", "")?;
        let jobs = self
            .scheduler
            .call(|reply| SchedulerCommand::ListJobs { reply })
            .await?;
        let (jobs, omitted) = fit_listing(jobs, MAX_LISTING_BYTES);
        Ok(Response::new(pb::ListJobsResponse { jobs, omitted }))
    }

    type SubmitTasksStream = JobResultStream;

    #[instrument(skip_all)]
    async fn submit_tasks(
        &self,
        request: Request<Streaming<pb::SubmitRequest>>,
    ) -> Result<Response<Self::SubmitTasksStream>, Status> {
        let principal = principal_of(&request)?;
        require(&principal, Action::SubmitJob, "submit_job", "")?;
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.and_then(|m| m.body);
        let Some(pb::submit_request::Body::Header(header)) = first else {
            return Err(Status::invalid_argument(
                "the first submit message must be a header naming the pool",
            ));
        };
        let subject = format!("{} on pool {}", header.job_name, header.pool);
        let window = match header.max_outstanding as usize {
            0 => self.max_outstanding_per_job,
            asked => asked.min(self.max_outstanding_per_job),
        };
        self.budget.check_new_job().map_err(|full| {
            let refusal = full.to_string();
            audit::refused(&principal, "submit_job", &subject, &refusal);
            Status::resource_exhausted(refusal)
        })?;
        let buffer = self.budget.job_buffer();
        let (results, results_rx, released) = JobResults::new(buffer.clone());
        let job = self
            .scheduler
            .call(|reply| SchedulerCommand::OpenJob {
                header,
                owner: principal.name.clone(),
                results,
                reply,
            })
            .await
            .map_err(Status::from);
        let stream = audit::outcome(&principal, "submit_job", &subject, job)?;
        let credit = Arc::new(Semaphore::new(window));
        let results_out = CancellationToken::new();
        tokio::spawn(forward_tasks(
            inbound,
            self.scheduler.clone(),
            stream.clone(),
            TaskGates {
                credit: credit.clone(),
                buffer,
                released,
                results_out: results_out.clone(),
            },
        ));
        Ok(Response::new(JobResultStream {
            results: results_rx,
            credit,
            scheduler: self.scheduler.clone(),
            stream,
            results_out,
        }))
    }

    #[instrument(skip_all)]
    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let principal = principal_of(&request)?;
        let job = JobId::new(request.into_inner().job_id);
        require(&principal, Action::Read, "get_job", job.as_str())?;
        Ok(Response::new(
            self.scheduler
                .call(|reply| SchedulerCommand::GetJob { job, reply })
                .await?,
        ))
    }

    #[instrument(skip_all)]
    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let principal = principal_of(&request)?;
        let job = JobId::new(request.into_inner().job_id);
        let subject = job.to_string();
        require(&principal, Action::CancelJob, "cancel_job", &subject)?;
        let status = self
            .scheduler
            .call(|reply| SchedulerCommand::CancelJob {
                job,
                requester: principal.clone(),
                reply,
            })
            .await
            .map_err(Status::from);
        Ok(Response::new(audit::outcome(
            &principal,
            "cancel_job",
            &subject,
            status,
        )?))
    }

    #[instrument(skip_all)]
    async fn annotate_job(
        &self,
        request: Request<pb::AnnotateJobRequest>,
    ) -> Result<Response<pb::AnnotateJobResponse>, Status> {
        let principal = principal_of(&request)?;
        let request = request.into_inner();
        let job = JobId::new(request.job_id);
        let subject = job.to_string();
        require(&principal, Action::AnnotateJob, "annotate_job", &subject)?;
        // Sent after every trial: only refusals go to the audit log.
        self.scheduler
            .call(|reply| SchedulerCommand::AnnotateJob {
                job,
                requester: principal.clone(),
                summary_json: request.summary_json,
                reply,
            })
            .await
            .map_err(|error| {
                let status = Status::from(error);
                audit::refused(&principal, "annotate_job", &subject, status.message());
                status
            })?;
        Ok(Response::new(pb::AnnotateJobResponse {}))
    }

    #[instrument(skip_all)]
    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        require(&principal_of(&request)?, Action::Read, "list_nodes", "")?;
        let nodes = self
            .scheduler
            .call(|reply| SchedulerCommand::ListNodes { reply })
            .await?;
        let (nodes, omitted) = fit_listing(nodes, MAX_LISTING_BYTES);
        Ok(Response::new(pb::ListNodesResponse { nodes, omitted }))
    }

    #[instrument(skip_all)]
    async fn list_actors(
        &self,
        request: Request<pb::ListActorsRequest>,
    ) -> Result<Response<pb::ListActorsResponse>, Status> {
        require(&principal_of(&request)?, Action::Read, "list_actors", "")?;
        let pool = Some(request.into_inner().pool)
            .filter(|p| !p.is_empty())
            .map(PoolName::new);
        let actors = self
            .scheduler
            .call(|reply| SchedulerCommand::ListActors { pool, reply })
            .await?;
        let (actors, omitted) = fit_listing(actors, MAX_LISTING_BYTES);
        Ok(Response::new(pb::ListActorsResponse { actors, omitted }))
    }
}

/// What a job stream's task forwarder waits on before it takes the next task.
struct TaskGates {
    /// Credit, a count of tasks: one comes back with each result read.
    credit: Arc<Semaphore>,
    /// Room in the job's byte buffer.
    buffer: Arc<JobBuffer>,
    /// Fires when the core lets go of this stream's results: the job ended, or another
    /// stream took it over. No task of this stream is wanted any more.
    released: CancellationToken,
    /// Fires when the result stream ended or was dropped (the client reset it).
    results_out: CancellationToken,
}

/// Moves the client's tasks into the scheduler, waiting for credit and for room in the
/// job's byte buffer, so a fast client, or one that does not read its results, cannot
/// queue unbounded work: it is simply read no further. A broken client stream detaches the
/// job (see `core/jobs.rs::client_gone`).
///
/// Once the job no longer wants this stream's tasks (it was cancelled, or another stream
/// resumed it), what the client still sends is read and dropped. That matters for a client
/// that stopped reading, so was read no further, and then dropped its job: an HTTP/2
/// client does not reset a stream whose request body is still being sent just because its
/// response was dropped, and the response cannot be sent into a window nobody reads, so
/// only the end of its request body lets the stream, and the results held for it, go.
async fn forward_tasks(
    mut inbound: Streaming<pb::SubmitRequest>,
    scheduler: SchedulerHandle,
    stream: JobStream,
    gates: TaskGates,
) {
    loop {
        let next = tokio::select! {
            () = gates.released.cancelled() => break,
            () = gates.results_out.cancelled() => return,
            next = inbound.next() => next,
        };
        match next {
            None => {
                let _ = scheduler
                    .send(SchedulerCommand::CloseJobInput { stream })
                    .await;
                return;
            }
            Some(Err(status)) => {
                tracing::info!(job_id = %stream.job, %status, "client stream broke");
                let _ = scheduler
                    .send(SchedulerCommand::ClientGone { stream })
                    .await;
                return;
            }
            Some(Ok(pb::SubmitRequest {
                body: Some(pb::submit_request::Body::Task(input)),
            })) => {
                let admitted = async {
                    let permit = gates.credit.acquire().await.ok()?;
                    permit.forget();
                    Some(gates.buffer.admit(input.payload.len() as u64).await)
                };
                let charge = tokio::select! {
                    () = gates.released.cancelled() => break,
                    () = gates.results_out.cancelled() => return,
                    charge = admitted => match charge {
                        Some(charge) => charge,
                        None => return,
                    },
                };
                if scheduler
                    .send(SchedulerCommand::SubmitTask {
                        stream: stream.clone(),
                        input,
                        charge: Some(charge),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Some(Ok(_)) => {
                tracing::warn!(job_id = %stream.job, "ignoring a non-task message after the header");
            }
        }
    }
    // Released: read on, dropping what comes, until the client closes its side or the
    // results are out. A client that dropped its results while its tasks were stalled
    // behind flow control thus gets to the end of its request, which makes its HTTP/2
    // stack reset the stream: only that ends the results it no longer reads, and gives
    // their bytes back.
    loop {
        tokio::select! {
            () = gates.results_out.cancelled() => return,
            next = inbound.next() => if !matches!(next, Some(Ok(_))) {
                return;
            },
        }
    }
}

/// The job's results as the client reads them; each result read returns one unit of credit.
/// Dropped before the job finished (the client reset the stream, or its connection died):
/// the job is detached, and cancelled unless a client resumes it within the grace.
pub struct JobResultStream {
    results: mpsc::UnboundedReceiver<JobResultMessage>,
    credit: Arc<Semaphore>,
    scheduler: SchedulerHandle,
    stream: JobStream,
    /// Tells the task forwarder that the results are out (ended or dropped).
    results_out: CancellationToken,
}

impl Stream for JobResultStream {
    type Item = Result<pb::SubmitResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.results.poll_recv(cx) {
            // The message's bytes go back to the job's buffer as it leaves.
            Poll::Ready(Some(JobResultMessage { message, charge: _ })) => {
                let is_result = message
                    .as_ref()
                    .is_ok_and(|m| matches!(m.body, Some(pb::submit_response::Body::Result(_))));
                if is_result {
                    self.credit.add_permits(1);
                }
                Poll::Ready(Some(message))
            }
            Poll::Ready(None) => {
                self.credit.close();
                self.results_out.cancel();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for JobResultStream {
    fn drop(&mut self) {
        self.credit.close();
        self.results_out.cancel();
        // A no-op for a job that already finished.
        self.scheduler.send_soon(SchedulerCommand::ClientGone {
            stream: self.stream.clone(),
        });
    }
}
