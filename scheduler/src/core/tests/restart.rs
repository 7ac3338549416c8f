//! A restarted core takes back what its agents kept (actors, held outcomes) and what its
//! clients send again (resumed jobs), each task answered once.

use super::*;
use crate::store::{StoreOp, StoredOutcome};

fn hosted(actor: &str, pool: &str, in_hand: &[(&str, u64)]) -> pb::HostedActor {
    pb::HostedActor {
        start: Some(pb::StartActor {
            actor_id: actor.into(),
            incarnation: 1,
            pool: pool.into(),
            kind: "echo".into(),
            max_in_flight: 1,
            ..Default::default()
        }),
        report: Some(pb::ActorReport {
            actor_id: actor.into(),
            incarnation: 1,
            state: pb::ActorState::Ready as i32,
            model_loads: 1,
            ..Default::default()
        }),
        tasks_in_hand: in_hand
            .iter()
            .map(|(job, seq)| pb::TaskKey {
                job_id: (*job).into(),
                seq: *seq,
            })
            .collect(),
    }
}

fn node_hosting(name: &str, inventory: Vec<pb::HostedActor>) -> pb::RegisterNode {
    pb::RegisterNode {
        node_id: name.into(),
        generation: format!("{name}-gen"),
        cpu_cores: 4,
        actor_kinds: vec!["echo".into()],
        inventory,
        ..Default::default()
    }
}

fn stopped(messages: &[pb::scheduler_message::Body]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            pb::scheduler_message::Body::StopActor(stop) => Some(stop.actor_id.clone()),
            _ => None,
        })
        .collect()
}

impl Harness {
    /// Attaches a new client stream to `job`, as a client that lost its connection does.
    fn resume_job(
        &mut self,
        pool: &str,
        job: &JobId,
        owner: &str,
    ) -> Result<ResultsRx, SchedulerError> {
        let header = pb::SubmitHeader {
            pool: pool.into(),
            resume_job_id: job.to_string(),
            ..Default::default()
        };
        self.attach(header, owner).map(|(_, rx)| rx)
    }
}

/// The agents kept their actors through the restart: the restarted core adopts them under
/// their own ids with their one model load, starts nothing, and stops what no pool wants.
#[tokio::test(start_paused = true)]
async fn a_restarted_core_adopts_the_actors_its_agents_kept() {
    let mut h = restarted_with_two_known_nodes();
    h.register(
        node_hosting("n1", vec![hosted("p-a", "p", &[]), hosted("p-b", "p", &[])]),
        Principal::ANONYMOUS,
    )
    .unwrap();
    h.tick();
    h.register(
        node_hosting(
            "n2",
            vec![
                hosted("p-c", "p", &[]),
                hosted("p-d", "p", &[]),
                hosted("p-e", "p", &[]),
                hosted("gone-x", "gone", &[]),
            ],
        ),
        Principal::ANONYMOUS,
    )
    .unwrap();
    h.tick();
    h.tick();
    assert_eq!(started(&mut h, "n1"), 0, "nothing loads again");
    let to_n2 = sent(h.agent("n2"));
    assert_eq!(stopped(&to_n2), vec!["gone-x", "p-e"], "{to_n2:?}");
    assert!(
        !to_n2
            .iter()
            .any(|m| matches!(m, pb::scheduler_message::Body::StartActor(_))),
        "{to_n2:?}"
    );
    let actors = h.core.actor_infos(None);
    let listed: Vec<(&str, &str, i32, u64)> = actors
        .iter()
        .map(|a| {
            (
                a.actor_id.as_str(),
                a.node_id.as_str(),
                a.state,
                a.model_loads,
            )
        })
        .collect();
    let ready = pb::ActorState::Ready as i32;
    assert_eq!(
        listed,
        vec![
            ("p-a", "n1", ready, 1),
            ("p-b", "n1", ready, 1),
            ("p-c", "n2", ready, 1),
            ("p-d", "n2", ready, 1),
        ]
    );
}

/// A node whose session dropped (the scheduler lived on) comes back with its actors before
/// they were placed elsewhere: they are adopted as themselves, not loaded again.
#[tokio::test(start_paused = true)]
async fn a_node_back_from_a_network_cut_keeps_its_actors() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    let start = h.started_actor("n1");
    let session = h.agent("n1").session;
    h.core.handle(SchedulerCommand::AgentGone { session });
    h.core.after_commands();
    let mut kept = hosted(&start.actor_id, "p", &[]);
    kept.start = Some(start.clone());
    h.register(node_hosting("n1", vec![kept]), Principal::ANONYMOUS)
        .unwrap();
    h.tick();
    assert_eq!(started(&mut h, "n1"), 0, "adopted, not started again");
    let actor = &h.core.actor_infos(None)[0];
    assert_eq!(
        (actor.actor_id.as_str(), actor.state, actor.model_loads),
        (start.actor_id.as_str(), pb::ActorState::Ready as i32, 1)
    );
}

/// A core restarted on a store holding job `j1` of pool `p` (one actor, credit 2), which
/// was running with tasks 0 and 1 recorded as succeeded.
fn restarted_with_an_interrupted_job() -> (Harness, JobId) {
    let store = Arc::new(MemoryStore::default());
    let job = JobId::new("j1");
    let done = |seq| StoreOp::PutOutcome {
        job: job.clone(),
        seq,
        outcome: StoredOutcome {
            ok: true,
            attempts: 1,
            error: None,
            output_bytes: 1,
            items: 1,
        },
    };
    store
        .apply(&[
            StoreOp::PutPool(cpu_pool("p", 1, 2)),
            StoreOp::PutNode(NodeId::from("n1")),
            placement("p-a", "p", "n1"),
            StoreOp::PutJob(pb::JobStatus {
                job_id: job.to_string(),
                pool: "p".into(),
                state: pb::JobState::Running as i32,
                owner: Principal::ANONYMOUS.into(),
                submitted: 3,
                ..Default::default()
            }),
            done(0),
            done(1),
        ])
        .unwrap();
    let mut h = Harness::with_store(CoreConfig::for_test(), store.clone());
    h.core.restore(store.as_ref()).unwrap();
    (h, job)
}

/// Actor `p-a`'s answer "two" to seq 2 of `j1`, dispatched by the scheduler before the
/// restart.
fn old_run_of_seq_2() -> pb::agent_message::Body {
    pb::agent_message::Body::TaskOutcome(pb::TaskOutcome {
        task_id: 7,
        dispatch: 1,
        actor_id: "p-a".into(),
        result: Some(pb::task_outcome::Result::Output(b"two".to_vec().into())),
        key: Some(pb::TaskKey {
            job_id: "j1".into(),
            seq: 2,
        }),
        ..Default::default()
    })
}

/// [`restarted_with_an_interrupted_job`], its node back with actor `p-a` (credit 2) still
/// running seq 2, and the client reattached.
fn resumed_with_seq_2_in_hand() -> (Harness, JobId, ResultsRx) {
    let (mut h, job) = restarted_with_an_interrupted_job();
    let mut kept = hosted("p-a", "p", &[("j1", 2)]);
    kept.start.as_mut().unwrap().max_in_flight = 2;
    h.register(node_hosting("n1", vec![kept]), Principal::ANONYMOUS)
        .unwrap();
    let rx = h.resume_job("p", &job, Principal::ANONYMOUS).unwrap();
    (h, job, rx)
}

/// Across a restart each task's result reaches the client once: a task recorded as done
/// whose result the client never got runs again and is counted once; an output the agent
/// held answers its task without running it again; a task sent twice runs once.
#[tokio::test(start_paused = true)]
async fn a_resumed_job_answers_each_task_once_and_counts_it_once() {
    let (mut h, job) = restarted_with_an_interrupted_job();
    let mut kept = hosted("p-a", "p", &[("j1", 2)]);
    kept.start.as_mut().unwrap().max_in_flight = 2;
    h.register(node_hosting("n1", vec![kept]), Principal::ANONYMOUS)
        .unwrap();
    // The outcome of seq 2, dispatched by the old scheduler, arrives before the client.
    h.send("n1", old_run_of_seq_2());
    let mut rx = h.resume_job("p", &job, Principal::ANONYMOUS).unwrap();
    // The client got results 0 and 2 before? No: only 0. It sends 1, 2 and a new 3, and 3
    // a second time (it reconnected again in between).
    h.submit(&job, 1..4);
    h.submit(&job, 3..4);
    let tasks = run_tasks(&sent(h.agent("n1")));
    let dispatched: Vec<u64> = tasks.iter().map(|t| t.key.as_ref().unwrap().seq).collect();
    assert_eq!(dispatched, vec![1, 3], "2 was answered by the held output");
    for task in &tasks {
        h.outcome("n1", task, Ok("out"));
    }
    let stream = h.stream(&job);
    h.core.handle(SchedulerCommand::CloseJobInput { stream });
    let mut seqs: Vec<u64> = results(&mut rx).iter().map(|r| r.seq).collect();
    seqs.sort();
    assert_eq!(seqs, vec![1, 2, 3], "each once");
    let status = h.job(&job);
    assert_eq!(status.state, pb::JobState::Succeeded as i32);
    assert_eq!(
        (status.submitted, status.succeeded, status.queued),
        (4, 4, 0),
        "{status:?}"
    );
}

/// Resuming is refused, with what to do, for a job the scheduler does not know, another
/// principal's job, and a cancelled one.
#[tokio::test(start_paused = true)]
async fn a_resume_that_cannot_be_honoured_says_why() {
    let (mut h, job) = restarted_with_an_interrupted_job();
    h.add_node("n1", vec![]);
    let unknown = h
        .resume_job("p", &JobId::new("nope"), Principal::ANONYMOUS)
        .unwrap_err();
    assert!(
        unknown.to_string().contains("run the command again"),
        "{unknown}"
    );
    let other = h.resume_job("p", &job, "mallory").unwrap_err();
    assert!(
        matches!(other, SchedulerError::PermissionDenied(_)),
        "{other}"
    );
    h.resume_job("p", &job, Principal::ANONYMOUS).unwrap();
    let requester = Principal {
        name: Principal::ANONYMOUS.into(),
        role: Role::Admin,
    };
    cancel_as(&mut h, &job, requester).unwrap();
    let cancelled = h.resume_job("p", &job, Principal::ANONYMOUS).unwrap_err();
    assert!(
        cancelled.to_string().contains("was cancelled"),
        "{cancelled}"
    );
}

/// The stream a resumed job left behind breaking later does not cancel the job.
#[tokio::test(start_paused = true)]
async fn an_old_stream_breaking_does_not_cancel_the_resumed_job() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 1));
    h.load_actors("n1");
    let (job, _old_rx) = h.open_job("p");
    let old = h.stream(&job);
    let _rx = h.resume_job("p", &job, Principal::ANONYMOUS).unwrap();
    h.core.handle(SchedulerCommand::ClientGone { stream: old });
    assert_eq!(h.job(&job).state, pb::JobState::Running as i32);
}

/// An agent can hand back only what this scheduler started on it for that pool: an actor
/// started on another node, one it never started, and another pool's actor id reported
/// under this pool are all stopped and audited, and no record is overwritten.
#[tokio::test(start_paused = true)]
async fn a_spoofed_adoption_is_stopped_and_changes_no_record() {
    let mut h = restarted_with_two_known_nodes();
    h.register(
        node_hosting("n1", vec![hosted("p-a", "p", &[]), hosted("p-b", "p", &[])]),
        Principal::ANONYMOUS,
    )
    .unwrap();
    // n2 claims n1's actor, an actor nobody started, and (below) n1's actor for pool q.
    let mut other_pool = hosted("p-b", "q", &[]);
    other_pool.start.as_mut().unwrap().pool = "q".into();
    h.create_pool(cpu_pool("q", 1, 1));
    h.register(
        node_hosting(
            "n2",
            vec![
                hosted("p-a", "p", &[]),
                hosted("made-up", "p", &[]),
                other_pool,
            ],
        ),
        Principal::ANONYMOUS,
    )
    .unwrap();
    h.tick();
    let to_n2 = sent(h.agent("n2"));
    let mut refused = stopped(&to_n2);
    refused.sort();
    assert_eq!(refused, ["made-up", "p-a", "p-b"], "{to_n2:?}");
    let actors = answer(
        |reply| SchedulerCommand::ListActors { pool: None, reply },
        &mut h.core,
    )
    .unwrap();
    let on = |id: &str| {
        actors
            .iter()
            .find(|a| a.actor_id == id)
            .map(|a| (a.pool.clone(), a.node_id.clone()))
    };
    assert_eq!(on("p-a"), Some(("p".into(), "n1".into())));
    assert_eq!(on("p-b"), Some(("p".into(), "n1".into())));
    assert_eq!(on("made-up"), None);
    let audit = crate::auth::audit::recent_refusals().recent(200);
    assert!(
        audit
            .iter()
            .any(|e| e.message.contains("adopt_actor") && e.message.contains("started on n1")),
        "{audit:?}"
    );
}

fn with_detach_grace() -> CoreConfig {
    CoreConfig {
        detach_grace: Duration::from_secs(30),
        ..CoreConfig::for_test()
    }
}

/// A client stream breaks while the scheduler lives: the job runs on, and a client that
/// reattaches within the grace gets every result once. A task that finished while it was
/// away is answered from what was held (not run again) and counted once; one still
/// running is not run twice.
#[tokio::test(start_paused = true)]
async fn a_broken_stream_reattached_within_the_grace_gets_each_result_once() {
    let mut h = Harness::new(with_detach_grace());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 2));
    h.load_actors("n1");
    let (job, _old_rx) = h.open_job("p");
    h.submit(&job, 0..2);
    let running = run_tasks(&sent(h.agent("n1")));
    assert_eq!(running.len(), 2);
    h.core.handle(SchedulerCommand::ClientGone {
        stream: h.stream(&job),
    });
    h.core.after_commands();
    assert_eq!(h.job(&job).state, pb::JobState::Running as i32);
    // Seq 0 finishes while the client is away.
    let first = running
        .iter()
        .find(|t| t.key.as_ref().unwrap().seq == 0)
        .unwrap();
    h.outcome("n1", first, Ok("zero"));
    // Within the grace (and within the node's heartbeat deadline).
    tokio::time::advance(Duration::from_secs(1)).await;
    h.tick();
    let mut rx = h.resume_job("p", &job, Principal::ANONYMOUS).unwrap();
    h.submit(&job, 0..2);
    h.core.handle(SchedulerCommand::CloseJobInput {
        stream: h.stream(&job),
    });
    assert!(
        run_tasks(&sent(h.agent("n1"))).is_empty(),
        "neither task runs again"
    );
    let second = running
        .iter()
        .find(|t| t.key.as_ref().unwrap().seq == 1)
        .unwrap();
    h.outcome("n1", second, Ok("one"));
    let got: Vec<(u64, pb::task_result::Result)> = results(&mut rx)
        .into_iter()
        .map(|r| (r.seq, r.result.unwrap()))
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.contains(&(0, pb::task_result::Result::Output("zero".into()))));
    assert!(got.contains(&(1, pb::task_result::Result::Output("one".into()))));
    let status = h.job(&job);
    assert_eq!(status.state, pb::JobState::Succeeded as i32);
    assert_eq!((status.submitted, status.succeeded), (2, 2), "{status:?}");
}

#[tokio::test(start_paused = true)]
async fn a_client_gone_past_the_grace_has_its_job_cancelled() {
    let mut h = Harness::new(with_detach_grace());
    let (job, _rx, _task) = h.one_task_running();
    h.core.handle(SchedulerCommand::ClientGone {
        stream: h.stream(&job),
    });
    tokio::time::advance(Duration::from_secs(29)).await;
    h.tick();
    assert_eq!(h.job(&job).state, pb::JobState::Running as i32);
    tokio::time::advance(Duration::from_secs(2)).await;
    h.tick();
    assert_eq!(h.job(&job).state, pb::JobState::Cancelled as i32);
    let error = h
        .resume_job("p", &job, Principal::ANONYMOUS)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("was cancelled"), "{error}");
}

/// A result sent into a stream that broke before the client read it: the client sends its
/// task again, which runs again (its output is gone) and is counted once.
#[tokio::test(start_paused = true)]
async fn a_result_sent_but_never_read_is_counted_once_when_sent_again() {
    let mut h = Harness::new(with_detach_grace());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 2));
    h.load_actors("n1");
    let (job, _unread) = h.open_job("p");
    h.submit(&job, 0..2);
    let running = run_tasks(&sent(h.agent("n1")));
    // Seq 0's result goes into the stream; the connection breaks before the client reads it.
    h.outcome("n1", &running[0], Ok("zero"));
    h.core.handle(SchedulerCommand::ClientGone {
        stream: h.stream(&job),
    });
    let mut rx = h.resume_job("p", &job, Principal::ANONYMOUS).unwrap();
    h.submit(&job, 0..2);
    h.core.handle(SchedulerCommand::CloseJobInput {
        stream: h.stream(&job),
    });
    let again = run_tasks(&sent(h.agent("n1")));
    let seqs: Vec<u64> = again.iter().map(|t| t.key.as_ref().unwrap().seq).collect();
    assert_eq!(seqs, vec![0], "seq 1 still runs: it is not sent twice");
    h.outcome("n1", &again[0], Ok("zero"));
    h.outcome("n1", &running[1], Ok("one"));
    let mut got: Vec<u64> = results(&mut rx).iter().map(|r| r.seq).collect();
    got.sort();
    assert_eq!(got, vec![0, 1]);
    let status = h.job(&job);
    assert_eq!(status.state, pb::JobState::Succeeded as i32);
    assert_eq!(
        (status.submitted, status.succeeded, status.items_done),
        (2, 2, 2),
        "{status:?}"
    );
}

/// A job that finished in this scheduler run while its last results were on the way: the
/// client resumes it and sends those tasks again; each is counted once.
#[tokio::test(start_paused = true)]
async fn a_job_resumed_after_it_finished_counts_each_task_once() {
    let mut h = Harness::new(CoreConfig::for_test());
    h.add_node("n1", vec![]);
    h.create_pool(cpu_pool("p", 1, 2));
    h.load_actors("n1");
    let (job, _unread) = h.open_job("p");
    h.submit(&job, 0..2);
    h.core.handle(SchedulerCommand::CloseJobInput {
        stream: h.stream(&job),
    });
    for task in run_tasks(&sent(h.agent("n1"))) {
        if task.key.as_ref().unwrap().seq == 0 {
            h.outcome("n1", &task, Ok("zero"));
            continue;
        }
        let refused = pb::TaskOutcome {
            task_id: task.task_id,
            dispatch: task.dispatch,
            actor_id: task.actor_id.clone(),
            result: Some(pb::task_outcome::Result::Error("bad input".into())),
            permanent: true,
            ..Default::default()
        };
        h.send("n1", pb::agent_message::Body::TaskOutcome(refused));
    }
    assert_eq!(h.job(&job).state, pb::JobState::Failed as i32);
    let mut rx = h.resume_job("p", &job, Principal::ANONYMOUS).unwrap();
    h.submit(&job, 0..2);
    h.core.handle(SchedulerCommand::CloseJobInput {
        stream: h.stream(&job),
    });
    for task in run_tasks(&sent(h.agent("n1"))) {
        h.outcome("n1", &task, Ok("again"));
    }
    assert_eq!(results(&mut rx).len(), 2);
    let status = h.job(&job);
    assert_eq!(status.state, pb::JobState::Succeeded as i32, "{status:?}");
    assert_eq!(
        (
            status.submitted,
            status.succeeded,
            status.failed,
            status.items_done
        ),
        (2, 2, 0, 2),
        "{status:?}"
    );
}

/// After a restart, a task the client sends again while an adopted actor still runs it
/// waits for that run: it is computed once, and answered by the old dispatch.
#[tokio::test(start_paused = true)]
async fn a_resent_task_an_adopted_actor_still_runs_is_not_computed_twice() {
    let (mut h, job, mut rx) = resumed_with_seq_2_in_hand();
    h.submit(&job, 2..4);
    let dispatched: Vec<u64> = run_tasks(&sent(h.agent("n1")))
        .iter()
        .map(|t| t.key.as_ref().unwrap().seq)
        .collect();
    assert_eq!(
        dispatched,
        vec![3],
        "2 waits for the run the actor has in hand"
    );
    h.send("n1", old_run_of_seq_2());
    let got: Vec<(u64, pb::task_result::Result)> = results(&mut rx)
        .into_iter()
        .map(|r| (r.seq, r.result.unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![(2, pb::task_result::Result::Output("two".into()))]
    );
    assert!(
        run_tasks(&sent(h.agent("n1"))).is_empty(),
        "2 never ran here"
    );
}

/// The adopted actor dies with the task in hand: the resent task that waited for it runs.
#[tokio::test(start_paused = true)]
async fn a_resent_task_waiting_for_a_lost_actor_runs_again() {
    let (mut h, job, mut rx) = resumed_with_seq_2_in_hand();
    h.submit(&job, 2..3);
    assert!(
        run_tasks(&sent(h.agent("n1"))).is_empty(),
        "waits, though credit is free"
    );
    let dead = pb::ActorReport {
        actor_id: "p-a".into(),
        incarnation: 1,
        state: pb::ActorState::Dead as i32,
        error: "out of memory".into(),
        ..Default::default()
    };
    h.send("n1", pb::agent_message::Body::ActorReport(dead));
    h.load_actors("n1");
    let rerun = run_tasks(&sent(h.agent("n1")));
    assert_eq!(rerun.len(), 1, "{rerun:?}");
    assert_eq!(rerun[0].key.as_ref().unwrap().seq, 2);
    h.outcome("n1", &rerun[0], Ok("two"));
    assert_eq!(results(&mut rx).len(), 1);
}

/// An actor out of restarts is never started again: its placement leaves the store, so a
/// restarted scheduler keeps no record of it for a node to claim.
#[tokio::test(start_paused = true)]
async fn an_actor_dead_for_good_leaves_no_placement_behind() {
    let store = Arc::new(MemoryStore::default());
    let mut h = Harness::with_store(CoreConfig::for_test(), store.clone());
    h.add_node("n1", vec![]);
    h.create_pool(pb::PoolSpec {
        max_restarts: 1,
        ..cpu_pool("p", 1, 1)
    });
    // The store writer is a thread of its own: wait (a little) for it to catch up.
    let placements = |store: &MemoryStore, expected: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let placed = store.load_placements().unwrap().len();
            if placed == expected || std::time::Instant::now() > deadline {
                return placed;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    for _ in 0..2 {
        h.load_actors("n1");
        assert_eq!(placements(&store, 1), 1);
        let actor = h.core.actor_infos(None).remove(0);
        let id = resident_proto::ActorId::new(actor.actor_id.clone());
        let dead = pb::ActorReport {
            actor_id: actor.actor_id,
            incarnation: h.core.actors[&id].incarnation,
            state: pb::ActorState::Dead as i32,
            error: "out of memory".into(),
            ..Default::default()
        };
        h.send("n1", pb::agent_message::Body::ActorReport(dead));
        h.tick();
    }
    let actor = h.core.actor_infos(None).remove(0);
    assert_eq!(actor.state, pb::ActorState::Dead as i32, "{actor:?}");
    assert_eq!(placements(&store, 0), 0);
}

/// Issue 48: a restart with a job history of 1 and three running jobs keeps all three,
/// interrupted and resumable; only finished jobs count against the history, oldest first.
#[tokio::test(start_paused = true)]
async fn a_restart_keeps_every_interrupted_job_whatever_the_history() {
    let store = Arc::new(MemoryStore::default());
    let job_status = |id: &str, state: pb::JobState, finished_unix_ms: u64| {
        StoreOp::PutJob(pb::JobStatus {
            job_id: id.into(),
            pool: "p".into(),
            state: state as i32,
            owner: Principal::ANONYMOUS.into(),
            finished_unix_ms,
            ..Default::default()
        })
    };
    store
        .apply(&[
            StoreOp::PutPool(cpu_pool("p", 1, 2)),
            job_status("r1", pb::JobState::Running, 0),
            job_status("r2", pb::JobState::Running, 0),
            job_status("r3", pb::JobState::Interrupted, 0),
            // Ids sort against their finishing order: the history keeps the newest.
            job_status("a-newest", pb::JobState::Succeeded, 2_000),
            job_status("z-oldest", pb::JobState::Failed, 1_000),
        ])
        .unwrap();
    let mut config = CoreConfig::for_test();
    config.finished_job_history = 1;
    let mut h = Harness::with_store(config, store.clone());
    h.core.restore(store.as_ref()).unwrap();
    let mut kept: Vec<(String, i32)> = h
        .core
        .job_statuses()
        .into_iter()
        .map(|s| (s.job_id, s.state))
        .collect();
    kept.sort();
    let interrupted = pb::JobState::Interrupted as i32;
    assert_eq!(
        kept,
        vec![
            ("a-newest".into(), pb::JobState::Succeeded as i32),
            ("r1".into(), interrupted),
            ("r2".into(), interrupted),
            ("r3".into(), interrupted),
        ]
    );
    for job in ["r1", "r2", "r3"] {
        h.resume_job("p", &JobId::new(job), Principal::ANONYMOUS)
            .unwrap_or_else(|e| panic!("{job} is resumable: {e}"));
    }
}
