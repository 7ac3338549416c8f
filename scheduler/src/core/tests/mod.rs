//! The scheduler core as a plain synchronous state machine: feed it commands, read what it
//! sends to agents and clients. Time is tokio's paused clock, so backoffs are exact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use resident_proto::{JobId, NodeId, PoolName, pb};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{Core, CoreConfig, JobStream, LastHeard, SchedulerCommand, SessionId};
use crate::auth::{Principal, Role};
use crate::error::SchedulerError;
use crate::store::{DurableStore, MemoryStore, StoreWriter};

type AgentRx = mpsc::UnboundedReceiver<Result<pb::SchedulerMessage, tonic::Status>>;
type ResultsRx = mpsc::UnboundedReceiver<super::JobResultMessage>;

struct Agent {
    /// What the core sent along with `Registered` (placements made at registration).
    early: Vec<pb::scheduler_message::Body>,
    session: SessionId,
    rx: AgentRx,
    /// What the session handler would stamp on each message received.
    heard: LastHeard,
}

struct Harness {
    core: Core,
    agents: BTreeMap<String, Agent>,
    /// The client stream attached to each job last.
    streams: BTreeMap<JobId, JobStream>,
    /// Fires once the core lets go of that stream's results sender.
    released: BTreeMap<JobId, tokio_util::sync::CancellationToken>,
}

/// Sends one command and waits for its answer: at once for reads and refusals, and for a
/// change once the store's writer thread has committed it.
fn answer<T>(make: impl FnOnce(oneshot::Sender<T>) -> SchedulerCommand, core: &mut Core) -> T {
    let (reply, mut answer) = oneshot::channel();
    core.handle(make(reply));
    core.after_commands();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        core.run_follow_ups();
        match answer.try_recv() {
            Ok(value) => return value,
            Err(oneshot::error::TryRecvError::Empty) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(error) => panic!("the core did not answer: {error}"),
        }
    }
}

/// A test job's results channel, with a buffer that never fills, and the token that fires
/// once the core lets go of the results.
fn job_results() -> (
    super::JobResults,
    ResultsRx,
    tokio_util::sync::CancellationToken,
) {
    let budget = crate::budget::BufferBudget::new(u64::MAX / 2, u64::MAX / 4);
    super::JobResults::new(budget.job_buffer())
}

fn gpu(index: u32, gib: u64) -> pb::GpuInfo {
    pb::GpuInfo {
        index,
        name: "A10G".into(),
        total_vram_bytes: gib << 30,
        free_vram_bytes: gib << 30,
        compute_major: 8,
        compute_minor: 6,
        ..Default::default()
    }
}

impl Harness {
    fn new(config: CoreConfig) -> Self {
        Self::with_store(config, Arc::new(MemoryStore::default()))
    }

    /// A core writing to `store`, which the test reads back.
    fn with_store(config: CoreConfig, store: Arc<MemoryStore>) -> Self {
        Self::with_durable(config, store)
    }

    /// A core writing to any store (one that fails on demand).
    fn with_durable(config: CoreConfig, store: Arc<dyn DurableStore>) -> Self {
        Self {
            core: Core::new(
                config,
                StoreWriter::spawn(store, Default::default()),
                Default::default(),
            ),
            agents: BTreeMap::new(),
            streams: BTreeMap::new(),
            released: BTreeMap::new(),
        }
    }

    fn add_node(&mut self, name: &str, gpus: Vec<pb::GpuInfo>) {
        self.add_node_as(name, gpus, Principal::ANONYMOUS)
            .expect("registered");
    }

    /// Registers `name` with `credential`; the refusal when the scheduler says no.
    fn add_node_as(
        &mut self,
        name: &str,
        gpus: Vec<pb::GpuInfo>,
        credential: &str,
    ) -> Result<(), SchedulerError> {
        let register = pb::RegisterNode {
            node_id: name.into(),
            generation: format!("{name}-gen"),
            cpu_cores: 4,
            gpus,
            actor_kinds: vec!["echo".into()],
            ..Default::default()
        };
        self.register(register, credential)
    }

    /// Registers a node as its agent would: `register` names it and lists what it hosts.
    fn register(
        &mut self,
        register: pb::RegisterNode,
        credential: &str,
    ) -> Result<(), SchedulerError> {
        let name = register.node_id.clone();
        let (outbound, rx) = mpsc::unbounded_channel();
        let heard = LastHeard::now();
        let session = answer(
            |reply| SchedulerCommand::RegisterNode {
                register,
                credential: credential.into(),
                outbound,
                last_heard: heard.clone(),
                reply,
            },
            &mut self.core,
        )?;
        let mut agent = Agent {
            early: Vec::new(),
            session,
            rx,
            heard,
        };
        let mut first = sent(&mut agent);
        assert!(matches!(
            first.first(),
            Some(pb::scheduler_message::Body::Registered(_))
        ));
        agent.early = first.split_off(1);
        self.agents.insert(name, agent);
        Ok(())
    }

    fn agent(&mut self, name: &str) -> &mut Agent {
        self.agents.get_mut(name).expect("known agent")
    }

    fn send(&mut self, node: &str, message: pb::agent_message::Body) {
        let session = self.agent(node).session;
        self.core
            .handle(SchedulerCommand::AgentMessage { session, message });
        self.core.after_commands();
    }

    fn create_pool(&mut self, spec: pb::PoolSpec) -> pb::PoolStatus {
        answer(
            |reply| SchedulerCommand::CreatePool {
                spec,
                requester: Principal::anonymous(),
                reply,
            },
            &mut self.core,
        )
        .expect("pool created")
    }

    /// Scales `pool` as the anonymous admin would.
    fn scale_pool(&mut self, pool: &str, replicas: u32) -> Result<pb::PoolStatus, SchedulerError> {
        let pool = PoolName::from(pool);
        answer(
            |reply| SchedulerCommand::ScalePool {
                pool,
                replicas,
                requester: Principal::anonymous(),
                reply,
            },
            &mut self.core,
        )
    }

    /// Deletes `pool` as the anonymous admin would; with `if_unused`, only when unused.
    fn delete_pool(
        &mut self,
        pool: &str,
        if_unused: bool,
    ) -> Result<Option<String>, SchedulerError> {
        let pool = PoolName::from(pool);
        answer(
            |reply| SchedulerCommand::DeletePool {
                pool,
                if_unused,
                requester: Principal::anonymous(),
                reply,
            },
            &mut self.core,
        )
    }

    /// The one actor started on `node` since its messages were last read.
    fn started_actor(&mut self, node: &str) -> pb::StartActor {
        sent(self.agent(node))
            .into_iter()
            .find_map(|m| match m {
                pb::scheduler_message::Body::StartActor(start) => Some(start),
                _ => None,
            })
            .expect("an actor was started there")
    }

    /// Reports every actor started on `node` as loaded; returns the other messages.
    fn load_actors(&mut self, node: &str) -> Vec<pb::scheduler_message::Body> {
        let mut others = Vec::new();
        for message in sent(self.agent(node)) {
            match message {
                pb::scheduler_message::Body::StartActor(start) => {
                    let report = pb::ActorReport {
                        actor_id: start.actor_id,
                        incarnation: start.incarnation,
                        state: pb::ActorState::Ready as i32,
                        model_loads: 1,
                        ..Default::default()
                    };
                    self.send(node, pb::agent_message::Body::ActorReport(report));
                }
                other => others.push(other),
            }
        }
        others
    }

    /// Node `n1` with pool `p` of one actor (credit 1), loaded, and job `p` with one task,
    /// which the actor now runs.
    fn one_task_running(&mut self) -> (JobId, ResultsRx, pb::RunTask) {
        self.add_node("n1", vec![]);
        self.create_pool(cpu_pool("p", 1, 1));
        self.load_actors("n1");
        let (job, rx) = self.open_job("p");
        self.submit(&job, 0..1);
        let task = run_tasks(&sent(self.agent("n1"))).remove(0);
        (job, rx, task)
    }

    fn open_job(&mut self, pool: &str) -> (JobId, ResultsRx) {
        self.open_job_as(pool, Principal::ANONYMOUS)
    }

    fn open_job_as(&mut self, pool: &str, owner: &str) -> (JobId, ResultsRx) {
        let header = pb::SubmitHeader {
            pool: pool.into(),
            job_name: "test".into(),
            ..Default::default()
        };
        self.attach(header, owner).expect("job opened")
    }

    /// Opens (or, with `resume_job_id`, resumes) a job as a client stream would.
    fn attach(
        &mut self,
        header: pb::SubmitHeader,
        owner: &str,
    ) -> Result<(JobId, ResultsRx), SchedulerError> {
        let (results, mut rx, released) = job_results();
        let stream = answer(
            |reply| SchedulerCommand::OpenJob {
                header,
                owner: owner.into(),
                results,
                reply,
            },
            &mut self.core,
        )?;
        assert!(matches!(
            rx.try_recv().unwrap().message.unwrap().body,
            Some(pb::submit_response::Body::Accepted(_))
        ));
        self.streams.insert(stream.job.clone(), stream.clone());
        self.released.insert(stream.job.clone(), released);
        Ok((stream.job, rx))
    }

    /// The client stream attached to `job` last.
    fn stream(&self, job: &JobId) -> JobStream {
        self.streams[job].clone()
    }

    fn submit(&mut self, job: &JobId, seqs: std::ops::Range<u64>) {
        for seq in seqs {
            let input = pb::TaskInput {
                seq,
                payload: vec![seq as u8 + 1].into(),
                items: 1,
            };
            self.core.handle(SchedulerCommand::SubmitTask {
                stream: self.stream(job),
                input,
                charge: None,
            });
        }
        self.core.after_commands();
    }

    fn job(&mut self, job: &JobId) -> pb::JobStatus {
        let job = job.clone();
        answer(
            |reply| SchedulerCommand::GetJob { job, reply },
            &mut self.core,
        )
        .unwrap()
    }

    fn outcome(&mut self, node: &str, task: &pb::RunTask, result: Result<&str, &str>) {
        let result = match result {
            Ok(output) => pb::task_outcome::Result::Output(output.as_bytes().to_vec().into()),
            Err(error) => pb::task_outcome::Result::Error(error.into()),
        };
        let outcome = pb::TaskOutcome {
            task_id: task.task_id,
            dispatch: task.dispatch,
            actor_id: task.actor_id.clone(),
            result: Some(result),
            ..Default::default()
        };
        self.send(node, pb::agent_message::Body::TaskOutcome(outcome));
    }

    fn tick(&mut self) {
        self.core.on_tick(Instant::now());
    }
}

fn sent(agent: &mut Agent) -> Vec<pb::scheduler_message::Body> {
    let mut messages = std::mem::take(&mut agent.early);
    while let Ok(message) = agent.rx.try_recv() {
        messages.extend(message.expect("not an error").body);
    }
    messages
}

fn run_tasks(messages: &[pb::scheduler_message::Body]) -> Vec<pb::RunTask> {
    messages
        .iter()
        .filter_map(|m| match m {
            pb::scheduler_message::Body::RunTask(task) => Some(task.clone()),
            _ => None,
        })
        .collect()
}

fn results(rx: &mut ResultsRx) -> Vec<pb::TaskResult> {
    let mut out = Vec::new();
    while let Ok(message) = rx.try_recv() {
        if let Some(pb::submit_response::Body::Result(result)) = message.message.unwrap().body {
            out.push(result);
        }
    }
    out
}

fn cpu_pool(name: &str, replicas: u32, credit: u32) -> pb::PoolSpec {
    pb::PoolSpec {
        name: name.into(),
        actor_kind: "echo".into(),
        replicas,
        max_in_flight_per_actor: credit,
        resources: Some(pb::ResourceRequest {
            strategy: pb::PlacementStrategy::Spread as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn counts(status: &pb::JobStatus) -> [u64; 6] {
    [
        status.submitted,
        status.queued,
        status.running,
        status.succeeded,
        status.failed,
        status.cancelled,
    ]
}

#[tokio::test(start_paused = true)]
async fn an_actor_gets_no_more_tasks_than_its_credit() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 2));
    assert!(h.load_actors("n1").is_empty());
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..5);
    let first = run_tasks(&sent(h.agent("n1")));
    assert_eq!(first.len(), 2, "credit 2");
    assert_eq!(counts(&h.job(&job)), [5, 3, 2, 0, 0, 0]);
    h.outcome("n1", &first[0], Ok("done"));
    let next = run_tasks(&sent(h.agent("n1")));
    assert_eq!(next.len(), 1, "one answer frees one credit");
    assert_eq!(results(&mut rx).len(), 1);
    assert_eq!(counts(&h.job(&job)), [5, 2, 2, 1, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_task_waits_out_its_backoff_and_a_late_answer_is_dropped() {
    let config = CoreConfig::for_test();
    let base = config.retry_backoff.base;
    let mut h = Harness::new(config);
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 2));
    h.load_actors("n1");
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..1);
    let first = run_tasks(&sent(h.agent("n1"))).remove(0);
    assert_eq!(first.dispatch, 1);
    h.outcome("n1", &first, Err("cuda error"));
    assert!(
        results(&mut rx).is_empty(),
        "a transient failure is retried"
    );
    assert_eq!(counts(&h.job(&job)), [1, 1, 0, 0, 0, 0]);

    tokio::time::advance(base / 2).await;
    h.tick();
    assert!(
        run_tasks(&sent(h.agent("n1"))).is_empty(),
        "still backing off"
    );
    tokio::time::advance(base).await;
    h.tick();
    let second = run_tasks(&sent(h.agent("n1"))).remove(0);
    assert_eq!((second.task_id, second.dispatch), (first.task_id, 2));

    // The first dispatch answers late: ignored; the second one counts, once.
    h.outcome("n1", &first, Ok("stale"));
    assert!(results(&mut rx).is_empty());
    h.outcome("n1", &second, Ok("fresh"));
    h.outcome("n1", &second, Ok("duplicate"));
    let delivered = results(&mut rx);
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].attempts, 2);
    assert!(matches!(
        &delivered[0].result,
        Some(pb::task_result::Result::Output(out)) if out.as_ref() == b"fresh"
    ));
    assert_eq!(counts(&h.job(&job)), [1, 0, 0, 1, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn tasks_fail_for_good_after_their_attempts() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    let mut spec = cpu_pool("p", 1, 1);
    spec.max_task_attempts = 2;
    h.create_pool(spec);
    h.load_actors("n1");
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..1);
    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(1)).await;
        h.tick();
        let task = run_tasks(&sent(h.agent("n1"))).remove(0);
        h.outcome("n1", &task, Err("boom"));
    }
    let failed = results(&mut rx);
    assert_eq!(failed.len(), 1);
    assert!(matches!(
        &failed[0].result,
        Some(pb::task_result::Result::Error(e)) if e == "failed after 2 attempts: boom"
    ));
    assert_eq!(counts(&h.job(&job)), [1, 0, 0, 0, 1, 0]);
}

/// Nodes n1 and n2 with one one-credit actor each and a job of `tasks` tasks: one running
/// on each node.
fn two_busy_nodes(tasks: u64) -> (Harness, JobId, ResultsRx, pb::RunTask, pb::RunTask) {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.add_node("n2", vec![]);
    h.create_pool(cpu_pool("p", 2, 1));
    h.load_actors("n1");
    h.load_actors("n2");
    let (job, rx) = h.open_job("p");
    h.submit(&job, 0..tasks);
    let on_n1 = run_tasks(&sent(h.agent("n1"))).remove(0);
    let on_n2 = run_tasks(&sent(h.agent("n2"))).remove(0);
    (h, job, rx, on_n1, on_n2)
}

#[tokio::test(start_paused = true)]
async fn a_dead_node_gives_its_tasks_back_and_its_late_answers_are_dropped() {
    let (mut h, job, mut rx, on_n1, on_n2) = two_busy_nodes(3);

    let gone = h.agent("n1").session;
    h.core.handle(SchedulerCommand::AgentGone { session: gone });
    h.core.after_commands();
    // n1's task goes back to the front of the queue; n2 takes it when it has credit.
    h.outcome("n2", &on_n2, Ok("two"));
    let retried = run_tasks(&sent(h.agent("n2"))).remove(0);
    assert_eq!(
        (retried.task_id, retried.dispatch),
        (on_n1.task_id, 2),
        "the lost task runs before the one still queued"
    );
    // n1's answer through its dead session is dropped.
    let outcome = pb::TaskOutcome {
        task_id: on_n1.task_id,
        dispatch: on_n1.dispatch,
        actor_id: on_n1.actor_id.clone(),
        result: Some(pb::task_outcome::Result::Output(b"late".to_vec().into())),
        ..Default::default()
    };
    h.core.handle(SchedulerCommand::AgentMessage {
        session: gone,
        message: pb::agent_message::Body::TaskOutcome(outcome),
    });
    assert_eq!(results(&mut rx).len(), 1, "only n2's first answer so far");
    h.outcome("n2", &retried, Ok("one"));
    let last = run_tasks(&sent(h.agent("n2"))).remove(0);
    h.outcome("n2", &last, Ok("three"));
    let delivered = results(&mut rx);
    assert_eq!(delivered.len(), 2);
    assert!(delivered.iter().all(|r| r.node_id == "n2"));
    assert_eq!(counts(&h.job(&job)), [3, 0, 0, 3, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_queued_tasks_and_drops_running_answers() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..4);
    let running = run_tasks(&sent(h.agent("n1"))).remove(0);
    let cancelled = answer(
        |reply| SchedulerCommand::CancelJob {
            job: job.clone(),
            requester: Principal::anonymous(),
            reply,
        },
        &mut h.core,
    )
    .unwrap();
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);
    assert_eq!(counts(&cancelled), [4, 0, 0, 0, 0, 4]);
    let cancel = sent(h.agent("n1"));
    assert!(matches!(
        cancel.as_slice(),
        [pb::scheduler_message::Body::CancelTask(c)] if c.task_id == running.task_id
    ));
    h.outcome("n1", &running, Ok("too late"));
    assert!(results(&mut rx).is_empty(), "nothing after the cancel");
    // The actor's credit came back: a new job runs at once.
    let (other, mut other_rx) = h.open_job("p");
    h.submit(&other, 0..1);
    let task = run_tasks(&sent(h.agent("n1"))).remove(0);
    h.outcome("n1", &task, Ok("ok"));
    assert_eq!(results(&mut other_rx).len(), 1);
}

/// The client stream's task forwarder stops reading tasks once the core holds no sender of
/// the job's results: after a cancel, a finish (once durable) and a takeover by a new
/// stream, but not while the job runs.
#[tokio::test(start_paused = true)]
async fn a_jobs_results_are_released_when_it_ends_or_another_stream_takes_it() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");

    let (cancelled, _rx) = h.open_job("p");
    h.submit(&cancelled, 0..2);
    assert!(
        !h.released[&cancelled].is_cancelled(),
        "released while running"
    );
    answer(
        |reply| SchedulerCommand::CancelJob {
            job: cancelled.clone(),
            requester: Principal::anonymous(),
            reply,
        },
        &mut h.core,
    )
    .unwrap();
    assert!(h.released[&cancelled].is_cancelled(), "kept after a cancel");

    let (finished, _rx) = h.open_job("p");
    let first_stream = h.released[&finished].clone();
    let header = pb::SubmitHeader {
        pool: "p".into(),
        job_name: "test".into(),
        resume_job_id: finished.to_string(),
        ..Default::default()
    };
    let (_, _rx) = h.attach(header, Principal::ANONYMOUS).unwrap();
    assert!(
        first_stream.is_cancelled(),
        "the replaced stream's sender is kept"
    );
    let stream = h.stream(&finished);
    h.core.handle(SchedulerCommand::CloseJobInput { stream });
    h.core.after_commands();
    // The store's writer thread lets go of it once the job's end is on disk.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !h.released[&finished].is_cancelled() {
        assert!(
            std::time::Instant::now() < deadline,
            "the finished job's sender is kept"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(start_paused = true)]
async fn deleting_a_pool_fails_its_queued_tasks_and_finishes_running_ones() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, mut rx) = h.open_job("p");
    h.submit(&job, 0..3);
    let running = run_tasks(&sent(h.agent("n1"))).remove(0);
    let pool = PoolName::from("p");
    answer(
        |reply| SchedulerCommand::DeletePool {
            pool,
            if_unused: false,
            requester: Principal::anonymous(),
            reply,
        },
        &mut h.core,
    )
    .unwrap();
    let failed = results(&mut rx);
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|r| matches!(
        &r.result,
        Some(pb::task_result::Result::Error(e)) if e == "pool `p` was deleted"
    )));
    h.outcome("n1", &running, Ok("finished"));
    assert_eq!(
        results(&mut rx).len(),
        1,
        "the running task's result still arrives"
    );
    assert!(matches!(
        sent(h.agent("n1")).as_slice(),
        [pb::scheduler_message::Body::StopActor(_)]
    ));
    assert_eq!(counts(&h.job(&job)), [3, 0, 0, 1, 2, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_draining_actor_of_a_deleted_pool_keeps_its_vram_until_it_stops() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("g1", vec![gpu(0, 24)]);
    let mut big = cpu_pool("old", 1, 1);
    big.resources = Some(pb::ResourceRequest {
        gpus: 1.0,
        vram_bytes: 20 << 30,
        ..Default::default()
    });
    h.create_pool(big.clone());
    h.load_actors("g1");
    let (job, _rx) = h.open_job("old");
    h.submit(&job, 0..1);
    let running = run_tasks(&sent(h.agent("g1"))).remove(0);
    let pool = PoolName::from("old");
    answer(
        |reply| SchedulerCommand::DeletePool {
            pool,
            if_unused: false,
            requester: Principal::anonymous(),
            reply,
        },
        &mut h.core,
    )
    .unwrap();
    big.name = "new".into();
    let status = h.create_pool(big);
    assert_eq!(status.ready_actors, 0);
    assert!(
        !status.unplaced_reason.is_empty(),
        "the draining actor still holds the GPU"
    );
    assert!(h.load_actors("g1").is_empty(), "nothing started yet");
    h.outcome("g1", &running, Ok("done"));
    let messages = sent(h.agent("g1"));
    assert!(
        messages
            .iter()
            .any(|m| matches!(m, pb::scheduler_message::Body::StopActor(_)))
    );
    assert!(
        messages
            .iter()
            .any(|m| matches!(m, pb::scheduler_message::Body::StartActor(s) if s.pool == "new")),
        "the new pool is placed once the old actor stopped: {messages:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn only_the_configured_number_of_finished_jobs_is_kept() {
    let mut config = CoreConfig::for_test();
    config.finished_job_history = 2;
    let mut h = Harness::new(config);
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let (job, _rx) = h.open_job("p");
        let stream = h.stream(&job);
        h.core.handle(SchedulerCommand::CloseJobInput { stream });
        jobs.push(job);
    }
    let lookup = |h: &mut Harness, job: &JobId| {
        let job = job.clone();
        answer(|reply| SchedulerCommand::GetJob { job, reply }, &mut h.core)
    };
    assert!(lookup(&mut h, &jobs[0]).is_err(), "the oldest is forgotten");
    for job in &jobs[1..] {
        assert_eq!(
            lookup(&mut h, job).unwrap().state,
            pb::JobState::Succeeded as i32
        );
    }
}

fn submitter(name: &str) -> Principal {
    Principal {
        name: name.into(),
        role: Role::Submit,
    }
}

fn cancel_as(
    h: &mut Harness,
    job: &JobId,
    requester: Principal,
) -> Result<pb::JobStatus, SchedulerError> {
    answer(
        |reply| SchedulerCommand::CancelJob {
            job: job.clone(),
            requester,
            reply,
        },
        &mut h.core,
    )
}

#[tokio::test(start_paused = true)]
async fn a_live_node_id_is_kept_by_its_credential() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node_as("n1", vec![], "node-a").unwrap();
    let refused = h.add_node_as("n1", vec![], "node-b").unwrap_err();
    assert!(matches!(refused, SchedulerError::PermissionDenied(_)));
    assert!(
        refused.to_string().contains("held by credential `node-a`"),
        "{refused}"
    );
    assert!(
        h.core.nodes[&NodeId::new("n1")].alive,
        "the live node stays"
    );

    // The same credential reconnecting is a new session, as before.
    h.add_node_as("n1", vec![], "node-a").unwrap();
    // Once the node is dead, the id is free.
    let session = h.agents["n1"].session;
    h.core.handle(SchedulerCommand::AgentGone { session });
    h.core.after_commands();
    h.add_node_as("n1", vec![], "node-b").unwrap();
    assert_eq!(h.core.nodes[&NodeId::new("n1")].credential, "node-b");
}

#[tokio::test(start_paused = true)]
async fn submitters_cancel_only_their_own_jobs() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    let (job, _rx) = h.open_job_as("p", "alice");
    h.submit(&job, 0..2);
    let refused = cancel_as(&mut h, &job, submitter("bob")).unwrap_err();
    assert!(matches!(refused, SchedulerError::PermissionDenied(_)));
    assert!(
        refused.to_string().contains("belongs to `alice`"),
        "{refused}"
    );
    let status = h.core.job_status(&job).unwrap();
    assert_eq!(
        status.state,
        pb::JobState::Running as i32,
        "nothing was cancelled"
    );
    assert_eq!(status.owner, "alice");
    let cancelled = cancel_as(&mut h, &job, submitter("alice")).unwrap();
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);

    let (other, _rx) = h.open_job_as("p", "alice");
    let admin = Principal {
        name: "ops".into(),
        role: Role::Admin,
    };
    assert!(cancel_as(&mut h, &other, admin).is_ok());
}

#[tokio::test(start_paused = true)]
async fn revoked_credentials_lose_their_nodes_and_running_jobs() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node_as("kept", vec![], "node-a").unwrap();
    h.add_node_as("revoked", vec![], "node-b").unwrap();
    h.create_pool(cpu_pool("p", 1, 1));
    let (alices, _a) = h.open_job_as("p", "alice");
    let (bobs, _b) = h.open_job_as("p", "bob");
    h.core.handle(SchedulerCommand::CredentialsChanged {
        valid: ["node-a", "bob"].map(String::from).into(),
    });
    h.core.after_commands();
    assert!(h.core.nodes[&NodeId::new("kept")].alive);
    assert!(!h.core.nodes[&NodeId::new("revoked")].alive);
    let cancelled = pb::JobState::Cancelled as i32;
    assert_eq!(h.core.job_status(&alices).unwrap().state, cancelled);
    assert_eq!(
        h.core.job_status(&bobs).unwrap().state,
        pb::JobState::Running as i32
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_is_alive_by_what_it_sent_not_by_when_the_loop_read_it() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    let deadline = h.core.config.node_dead_after;
    // The agent keeps sending (its handler stamps each message on receipt) while the loop is
    // too busy to process any of it: the node stays alive.
    for _ in 0..5 {
        tokio::time::advance(deadline / 2).await;
        h.agents["n1"].heard.heard();
    }
    h.core.detect_dead_nodes(Instant::now());
    assert!(h.core.nodes[&NodeId::new("n1")].alive);
    // Silence past the deadline is death.
    tokio::time::advance(deadline + Duration::from_millis(1)).await;
    h.core.detect_dead_nodes(Instant::now());
    assert!(!h.core.nodes[&NodeId::new("n1")].alive);
}

fn heartbeat(free: &[(u32, u64, u64)], actors: Vec<pb::ActorReport>) -> pb::agent_message::Body {
    pb::agent_message::Body::Heartbeat(pb::Heartbeat {
        gpus: free
            .iter()
            .map(|&(index, total_gib, free_gib)| pb::GpuInfo {
                free_vram_bytes: free_gib << 30,
                ..gpu(index, total_gib)
            })
            .collect(),
        actors,
    })
}

fn gpu_pool(name: &str, vram_gib: u64) -> pb::PoolSpec {
    let mut spec = cpu_pool(name, 1, 1);
    spec.resources = Some(pb::ResourceRequest {
        gpus: 0.5,
        vram_bytes: vram_gib << 30,
        ..Default::default()
    });
    spec
}

#[test]
fn usable_vram_is_free_plus_ours_between_our_reservations_and_the_total() {
    use super::nodes::refreshed_usable_vram;
    // Nothing of ours: what is free.
    assert_eq!(refreshed_usable_vram(24, 20, 0, 0), 20);
    // Our actor holds 6 of its 8 reserved: free 18 + 6.
    assert_eq!(refreshed_usable_vram(24, 18, 6, 8), 24);
    // A foreign process took all but 1: never below what ours reserve (no eviction).
    assert_eq!(refreshed_usable_vram(24, 1, 6, 8), 8);
    // Never above the total, even when reports overlap.
    assert_eq!(refreshed_usable_vram(24, 24, 6, 8), 24);
}

/// An agent that registered while its GPU was briefly full (a re-registration after a
/// network blip, another process loading) gets its capacity back from the next heartbeats;
/// before, placement kept the registration's figure for good.
#[tokio::test(start_paused = true)]
async fn free_vram_from_heartbeats_reaches_placement() {
    let mut h = Harness::new(CoreConfig::for_test());
    // The pool exists (restored, or created before the node came), then the node
    // registers with 2 GiB free.
    h.create_pool(gpu_pool("p", 8));
    let mut busy = gpu(0, 24);
    busy.free_vram_bytes = 2 << 30;
    h.add_node("g1", vec![busy]);
    h.tick();
    assert!(h.load_actors("g1").is_empty(), "2 GiB free: no room");
    h.send("g1", heartbeat(&[(0, 24, 24)], vec![]));
    h.tick();
    assert!(
        sent(h.agent("g1"))
            .iter()
            .any(|m| matches!(m, pb::scheduler_message::Body::StartActor(_))),
        "the freed GPU takes the actor"
    );
}

/// A foreign process that fills the GPU under a running actor stops new placements there
/// but never evicts the actor.
#[tokio::test(start_paused = true)]
async fn a_fuller_gpu_blocks_new_actors_but_keeps_running_ones() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("g1", vec![gpu(0, 24)]);
    h.create_pool(gpu_pool("first", 8));
    h.load_actors("g1");
    let actor = h.core.actors.keys().next().unwrap().clone();
    let loaded = pb::ActorReport {
        actor_id: actor.to_string(),
        incarnation: h.core.actors[&actor].incarnation,
        state: pb::ActorState::Ready as i32,
        model_loads: 1,
        vram_bytes: 6 << 30,
        ..Default::default()
    };
    // 24 GiB: 6 held by our actor, 17 by someone else, 1 free; our actor may grow to its
    // 8 reserved, so nothing is left for a second one.
    h.send("g1", heartbeat(&[(0, 24, 1)], vec![loaded]));
    h.tick();
    let spec = gpu_pool("second", 8);
    let refused = answer(
        |reply| SchedulerCommand::CreatePool {
            spec,
            requester: Principal::anonymous(),
            reply,
        },
        &mut h.core,
    );
    let unplaced = match &refused {
        Ok(status) => status.unplaced_reason.clone(),
        Err(error) => error.to_string(),
    };
    assert!(
        unplaced.contains("needs 8.0 GiB") && unplaced.contains("largest free is 0.0 GiB"),
        "no room for a second actor: {refused:?}"
    );
    let messages = sent(h.agent("g1"));
    assert!(
        !messages.iter().any(|m| matches!(
            m,
            pb::scheduler_message::Body::StopActor(_) | pb::scheduler_message::Body::StartActor(_)
        )),
        "{messages:?}"
    );
    assert!(h.core.actors[&actor].state.is_placed());
}

/// A core restarted on a store that knew nodes `n1` and `n2` and a 4-replica CPU pool.
/// The store's record that the scheduler started `actor` of `pool` on `node`.
fn placement(actor: &str, pool: &str, node: &str) -> crate::store::StoreOp {
    crate::store::StoreOp::PutPlacement {
        actor: resident_proto::ActorId::from(actor),
        pool: PoolName::from(pool),
        node: NodeId::from(node),
    }
}

fn restarted_with_two_known_nodes() -> Harness {
    let store = Arc::new(MemoryStore::default());
    store
        .apply(&[
            crate::store::StoreOp::PutPool(cpu_pool("p", 4, 1)),
            crate::store::StoreOp::PutNode(NodeId::from("n1")),
            crate::store::StoreOp::PutNode(NodeId::from("n2")),
        ])
        .unwrap();
    let placed = [
        ("p-a", "n1"),
        ("p-b", "n1"),
        ("p-c", "n2"),
        ("p-d", "n2"),
        ("p-e", "n2"),
    ];
    let placements: Vec<_> = placed
        .iter()
        .map(|(actor, node)| placement(actor, "p", node))
        .collect();
    store.apply(&placements).unwrap();
    let mut h = Harness::with_store(CoreConfig::for_test(), store.clone());
    h.core.restore(store.as_ref()).unwrap();
    h
}

fn started(h: &mut Harness, node: &str) -> usize {
    sent(h.agent(node))
        .iter()
        .filter(|m| matches!(m, pb::scheduler_message::Body::StartActor(_)))
        .count()
}

/// After a restart, placement waits for the nodes known before it: the first node back
/// does not take every replica (before, it did, and they stayed there).
#[tokio::test(start_paused = true)]
async fn after_a_restart_placement_waits_for_the_known_nodes() {
    let mut h = restarted_with_two_known_nodes();
    h.add_node("n1", vec![]);
    h.tick();
    assert_eq!(started(&mut h, "n1"), 0, "n2 is still awaited");
    h.add_node("n2", vec![]);
    h.tick();
    assert_eq!(started(&mut h, "n1"), 2, "spread over both");
    assert_eq!(started(&mut h, "n2"), 2, "spread over both");
}

/// A known node that never comes back holds placement for the settle window only.
#[tokio::test(start_paused = true)]
async fn the_settle_window_ends_when_its_time_is_up() {
    let mut h = restarted_with_two_known_nodes();
    h.add_node("n1", vec![]);
    h.tick();
    assert_eq!(started(&mut h, "n1"), 0);
    tokio::time::advance(CoreConfig::for_test().settle_window).await;
    h.agents["n1"].heard.heard();
    h.tick();
    assert_eq!(started(&mut h, "n1"), 4, "n2 never came: everything on n1");
}

/// Polls the store (written on its own thread) until `done` holds, for up to 5 s.
fn stored_job(
    store: &MemoryStore,
    job: &JobId,
    done: impl Fn(&pb::JobStatus) -> bool,
) -> pb::JobStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let found = store
            .load_jobs()
            .unwrap()
            .into_iter()
            .find(|j| j.job_id == job.as_str());
        match found {
            Some(status) if done(&status) => return status,
            other if std::time::Instant::now() > deadline => {
                panic!("the store never showed the job as expected: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A running job's counters reach the store within a second of changing, and a restarted
/// scheduler shows the job as interrupted with the exact done counts (recounted from the
/// outcomes); before, the store held the counters of the job's opening.
#[tokio::test(start_paused = true)]
async fn job_counters_stay_current_in_the_store_across_a_restart() {
    let store = Arc::new(MemoryStore::default());
    let mut h = Harness::with_store(CoreConfig::for_test(), store.clone());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 4));
    h.load_actors("n1");
    let (job, _rx) = h.open_job("p");
    h.submit(&job, 0..3);
    let tasks = run_tasks(&sent(h.agent("n1")));
    h.outcome("n1", &tasks[0], Ok("a"));
    h.outcome("n1", &tasks[1], Ok("b"));
    tokio::time::advance(Duration::from_millis(1100)).await;
    h.agents["n1"].heard.heard();
    h.tick();
    let stored = stored_job(&store, &job, |j| j.succeeded == 2);
    assert_eq!((stored.submitted, stored.running), (3, 1), "{stored:?}");

    let mut restarted = Core::new(
        CoreConfig::for_test(),
        StoreWriter::spawn(store.clone(), Default::default()),
        Default::default(),
    );
    restarted.restore(store.as_ref()).unwrap();
    let status = restarted.jobs[&job].snapshot();
    assert_eq!(status.state, pb::JobState::Interrupted as i32);
    assert_eq!(
        (
            status.submitted,
            status.succeeded,
            status.queued,
            status.running
        ),
        (3, 2, 0, 0),
        "{status:?}"
    );
}

/// The store remembers registered nodes for the settle window of a restart, and forgets a
/// node that stays dead past the deadline (a lost machine must not hold up every restart).
#[tokio::test(start_paused = true)]
async fn the_store_forgets_a_node_that_stays_dead() {
    let store = Arc::new(MemoryStore::default());
    let mut h = Harness::with_store(CoreConfig::for_test(), store.clone());
    h.add_node("n1", vec![]);
    h.add_node("n2", vec![]);
    let listed = |want: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while store.load_nodes().unwrap().len() != want {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                store.load_nodes()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    listed(2);
    let session = h.agent("n2").session;
    h.core.handle(SchedulerCommand::AgentGone { session });
    h.core.after_commands();
    tokio::time::advance(CoreConfig::for_test().node_dead_after * 2).await;
    h.agents["n1"].heard.heard();
    h.tick();
    listed(1);
    assert_eq!(store.load_nodes().unwrap(), vec![NodeId::from("n1")]);
}

mod annotate;
mod drain;
mod durable_acks;
mod fleet_cost;
mod gpu_failures;
mod host_deaths;
mod idle_pools;
mod outcome_origin;
mod parked;
mod placement_slices;
mod quarantine;
mod reconcile_tick;
mod restart;
mod store_failures;
mod task_progress;
mod unavailable_gpus;

/// Issue 48: a pool belongs to the principal that created it. Another submit principal may
/// run jobs on it and create it again with the same spec, but not scale or delete it; an
/// admin may.
#[tokio::test(start_paused = true)]
async fn only_a_pools_owner_or_an_admin_scales_or_deletes_it() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    let create = |h: &mut Harness, who: &str| {
        answer(
            |reply| SchedulerCommand::CreatePool {
                spec: cpu_pool("p", 1, 1),
                requester: submitter(who),
                reply,
            },
            &mut h.core,
        )
    };
    let created = create(&mut h, "alice").unwrap();
    assert_eq!(created.spec.unwrap().owner, "alice");
    let attached = create(&mut h, "bob").expect("the same spec attaches");
    assert_eq!(
        attached.spec.unwrap().owner,
        "alice",
        "attaching takes nothing over"
    );
    let scale = |h: &mut Harness, requester: Principal| {
        answer(
            |reply| SchedulerCommand::ScalePool {
                pool: PoolName::from("p"),
                replicas: 2,
                requester,
                reply,
            },
            &mut h.core,
        )
    };
    let delete = |h: &mut Harness, requester: Principal, if_unused: bool| {
        answer(
            |reply| SchedulerCommand::DeletePool {
                pool: PoolName::from("p"),
                if_unused,
                requester,
                reply,
            },
            &mut h.core,
        )
    };
    let refused = scale(&mut h, submitter("bob")).unwrap_err();
    assert!(
        matches!(&refused, SchedulerError::PermissionDenied(m) if m.contains("belongs to `alice`")),
        "{refused}"
    );
    for if_unused in [false, true] {
        let refused = delete(&mut h, submitter("bob"), if_unused).unwrap_err();
        assert!(matches!(refused, SchedulerError::PermissionDenied(_)));
    }
    assert_eq!(h.core.pool_statuses(false).len(), 1, "bob changed nothing");
    let (job, _rx) = h.open_job_as("p", "bob");
    assert!(h.core.job_status(&job).is_ok(), "anyone may run jobs on it");
    scale(&mut h, submitter("alice")).unwrap();
    let admin = Principal {
        name: "ops".into(),
        role: Role::Admin,
    };
    assert_eq!(delete(&mut h, admin, false).unwrap(), None);
    assert!(h.core.pool_statuses(false).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pool_summary_counts_ready_actors_without_listing_them() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 3, 1));
    // Two of the three load.
    let started: Vec<pb::StartActor> = sent(h.agent("n1"))
        .into_iter()
        .filter_map(|m| match m {
            pb::scheduler_message::Body::StartActor(start) => Some(start),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 3);
    for start in &started[..2] {
        let report = pb::ActorReport {
            actor_id: start.actor_id.clone(),
            incarnation: start.incarnation,
            state: pb::ActorState::Ready as i32,
            ..Default::default()
        };
        h.send("n1", pb::agent_message::Body::ActorReport(report));
    }
    let mut list = |omit_actors| {
        answer(
            |reply| SchedulerCommand::ListPools { omit_actors, reply },
            &mut h.core,
        )
        .unwrap()
    };
    let (full, summary) = (list(false), list(true));
    assert_eq!((full[0].ready_actors, full[0].actors.len()), (2, 3));
    assert_eq!((summary[0].ready_actors, summary[0].actors.len()), (2, 0));
    assert_eq!(summary[0].spec, full[0].spec);
}
