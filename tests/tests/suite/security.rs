//! TLS, tokens, roles and agent file roots, with real `resident` processes on loopback: a
//! TLS scheduler with certificates from `resident certs init` and an auth file filled by
//! `resident token create`.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{ClientCredentials, Cluster, EmbedPoolSpec, PoolSpec, SdkError};
use resident_tests::secure::{SecureSetup, read_text};
use resident_tests::{
    init_logging, minilm_dir, read_json, repo_root, resident_bin, wait_until, wiki_sample_lines,
};

const ROLES: &[(&str, &str)] = &[
    ("ops", "admin"),
    ("alice", "submit"),
    ("bob", "submit"),
    ("viewer", "read"),
    ("node-1", "agent"),
    ("node-2", "agent"),
];

fn agent_log(dir: &Path, name: &str) -> (std::path::PathBuf, Stdio) {
    let path = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&path).expect("agent log");
    (path, Stdio::from(file))
}

/// How many times the agent logging to `log` was refused by the scheduler (each dial it makes
/// after a refusal is refused again, or it got in).
fn refusals(log: &Path) -> usize {
    read_text(log)
        .matches("the scheduler refused this agent")
        .count()
}

/// Waits until every agent of `logs` has been refused at least `count` times: proof that each
/// came back after its first refusal, so what it could have done by retrying has had its chance.
async fn wait_for_refusals(logs: &[&Path], count: usize) {
    wait_until(
        "every refused agent dialled again and was refused again",
        Duration::from_secs(20),
        || async { logs.iter().all(|log| refusals(log) >= count).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_roles_decide_every_call() {
    init_logging();
    let mut setup = SecureSetup::new(ROLES);
    let (_scheduler, url) = setup.spawn_scheduler();
    assert!(url.starts_with("https://"), "{url}");
    let (agent_log_path, stderr) = agent_log(setup.dir.path(), "worker");
    let _agent = setup.spawn_agent(&url, "worker", "T4:16GiB", Some("node-1"), &[], stderr);

    // An admin token works: the agent joined, a pool runs tasks.
    let ops = setup.connect_as(&url, "ops").await.unwrap();
    ops.wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    let nodes = ops.list_nodes().await.unwrap();
    assert_eq!(nodes[0].node_id, "worker");

    // No token, a wrong token: refused, saying what is missing.
    let refused = Cluster::connect_with(&url, setup.credentials(None))
        .await
        .err()
        .expect("no token is refused");
    assert!(
        refused.to_string()
            == "unauthenticated: this cluster needs a token; pass --token or set RESIDENT_TOKEN",
        "{refused}"
    );
    let refused = Cluster::connect_with(&url, setup.credentials(Some("rsd_0000")))
        .await
        .err()
        .expect("a wrong token is refused");
    assert!(
        matches!(&refused, SdkError::Unauthenticated(m) if m.contains("not known to this cluster")),
        "{refused}"
    );

    // A read token reads, and cannot create a pool.
    let viewer = setup.connect_as(&url, "viewer").await.unwrap();
    assert_eq!(viewer.list_nodes().await.unwrap().len(), 1);
    let refused = viewer
        .create_pool(PoolSpec::new("stats", "text-stats"))
        .await
        .err()
        .expect("read cannot create pools");
    assert!(
        matches!(&refused, SdkError::PermissionDenied(m) if m.contains("has role read") && m.contains("needs role submit or admin")),
        "{refused}"
    );

    // A submit token runs jobs, and cannot cancel another principal's job.
    let alice = setup.connect_as(&url, "alice").await.unwrap();
    let pool = alice
        .create_pool(PoolSpec::new("stats", "text-stats"))
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    let mut job = pool
        .submit(
            "alices-job",
            futures::stream::iter(["one two three"]).chain(futures::stream::pending()),
        )
        .await
        .unwrap();
    let first = job.next().await.expect("a result").unwrap();
    assert!(first.output.is_ok());
    let job_id = job.job_id.clone();
    assert_eq!(alice.job_status(&job_id).await.unwrap().owner, "alice");

    let bob = setup.connect_as(&url, "bob").await.unwrap();
    let refused = bob
        .cancel_job(&job_id)
        .await
        .expect_err("bob cannot cancel alice's job");
    assert!(
        matches!(&refused, SdkError::PermissionDenied(m) if m.contains("belongs to `alice`")),
        "{refused}"
    );
    assert!(alice.job_status(&job_id).await.unwrap().is_running());

    // Issue 48: pools have owners. Bob may not scale or delete alice's pool (before, his
    // delete was accepted and failed her job); the listing names her.
    for refused in [
        bob.pool("stats")
            .delete()
            .await
            .expect_err("bob cannot delete alice's pool"),
        bob.pool("stats")
            .scale(3)
            .await
            .expect_err("bob cannot scale alice's pool"),
    ] {
        assert!(
            matches!(&refused, SdkError::PermissionDenied(m) if m.contains("pool `stats` belongs to `alice`")),
            "{refused}"
        );
    }
    let pools = bob.list_pools().await.unwrap();
    assert_eq!(pools.len(), 1);
    assert_eq!((pools[0].spec.owner(), pools[0].replicas()), ("alice", 1));
    assert!(alice.job_status(&job_id).await.unwrap().is_running());
    let cancelled = alice.cancel_job(&job_id).await.unwrap();
    assert!(!cancelled.is_running());

    // An agent token cannot use the client API.
    let as_agent = Cluster::connect_with(&url, setup.credentials(Some(setup.token("node-1"))))
        .await
        .unwrap();
    let refused = as_agent.list_nodes().await.expect_err("agents cannot list");
    assert!(
        matches!(&refused, SdkError::PermissionDenied(m) if m.contains("agent tokens serve only agent sessions")),
        "{refused}"
    );

    // Revoked (and added) without a restart: the scheduler re-reads its auth file.
    let carol = setup.create_token("carol", "read");
    setup.revoke("viewer");
    wait_until("the auth file reload", Duration::from_secs(10), || async {
        let refused = viewer.list_nodes().await.err()?;
        assert!(
            matches!(&refused, SdkError::Unauthenticated(m) if m.contains("revoked")),
            "{refused}"
        );
        Some(())
    })
    .await;
    let carol = Cluster::connect_with(&url, setup.credentials(Some(&carol)))
        .await
        .unwrap();
    assert_eq!(carol.list_nodes().await.unwrap().len(), 1);

    // Revoking an agent's token cuts off its live session, and it cannot come back.
    setup.revoke("node-1");
    wait_until(
        "the revoked node is dead",
        Duration::from_secs(10),
        || async {
            let nodes = ops.list_nodes().await.ok()?;
            (!nodes[0].alive).then_some(())
        },
    )
    .await;
    // The cut-off agent dials again; wait until it has been refused twice, then look.
    wait_for_refusals(&[&agent_log_path], 2).await;
    assert!(!ops.list_nodes().await.unwrap()[0].alive, "it stays out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_agent_credentials_join_and_no_one_takes_over_a_live_node() {
    init_logging();
    let setup = SecureSetup::new(ROLES);
    let (_scheduler, url) = setup.spawn_scheduler();
    let logs = setup.dir.path();

    let (no_token_log, stderr) = agent_log(logs, "no-token");
    let _no_token = setup.spawn_agent(&url, "intruder", "T4:16GiB", None, &[], stderr);
    let (admin_log, stderr) = agent_log(logs, "admin");
    let _admin = setup.spawn_agent(&url, "intruder-2", "T4:16GiB", Some("ops"), &[], stderr);
    let _real = setup.spawn_agent(
        &url,
        "gpu-1",
        "A10G:24GiB",
        Some("node-1"),
        &[],
        Stdio::inherit(),
    );
    let ops = setup.connect_as(&url, "ops").await.unwrap();
    let nodes = ops
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    let owner_generation = nodes[0].generation.clone();

    // Another agent credential dials in as the live node id.
    let (takeover_log, stderr) = agent_log(logs, "takeover");
    let _takeover = setup.spawn_agent(&url, "gpu-1", "H100:80GiB", Some("node-2"), &[], stderr);
    wait_until(
        "every intruder refused",
        Duration::from_secs(15),
        || async {
            let refused = read_text(&no_token_log).contains("this cluster needs a token")
                && read_text(&admin_log).contains("client tokens cannot join as nodes")
                && read_text(&takeover_log).contains("cannot take it over");
            refused.then_some(())
        },
    )
    .await;
    // Refusals are retried: wait until each intruder has been refused again, then look.
    wait_for_refusals(&[&no_token_log, &admin_log, &takeover_log], 2).await;
    let nodes = ops.list_nodes().await.unwrap();
    assert_eq!(nodes.len(), 1, "only the real agent joined: {nodes:?}");
    assert!(nodes[0].alive);
    assert_eq!(nodes[0].generation, owner_generation, "never taken over");
    assert_eq!(nodes[0].gpus[0].name, "A10G");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mutual_tls_the_node_id_is_the_certificates_name() {
    init_logging();
    let setup = SecureSetup::new(ROLES);
    let (cert, key) = setup.agent_certificate("gpu-1");
    let (_scheduler, url) =
        setup.spawn_scheduler_with(&["--agent-ca".into(), setup.ca().into_os_string()]);
    let identity: Vec<OsString> = vec![
        "--client-cert".into(),
        cert.into_os_string(),
        "--client-key".into(),
        key.into_os_string(),
    ];
    let logs = setup.dir.path();
    let _owner = setup.spawn_agent(
        &url,
        "gpu-1",
        "L4:24GiB",
        Some("node-1"),
        &identity,
        Stdio::inherit(),
    );
    let (borrowed_log, stderr) = agent_log(logs, "borrowed");
    let _borrowed = setup.spawn_agent(&url, "gpu-2", "L4:24GiB", Some("node-2"), &identity, stderr);
    let (bare_log, stderr) = agent_log(logs, "bare");
    let _bare = setup.spawn_agent(&url, "gpu-3", "L4:24GiB", Some("node-2"), &[], stderr);

    // Clients need no certificate.
    let ops = setup.connect_as(&url, "ops").await.unwrap();
    ops.wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();
    wait_until("both refusals", Duration::from_secs(15), || async {
        let refused = read_text(&borrowed_log).contains("not issued for node id `gpu-2`")
            && read_text(&bare_log).contains("requires agents to present a client certificate");
        refused.then_some(())
    })
    .await;
    let nodes = ops.list_nodes().await.unwrap();
    let ids: Vec<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids, ["gpu-1"], "only the certificate's node joined");
    assert_eq!(nodes[0].credential, "node-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_never_optional_once_served() {
    init_logging();
    let setup = SecureSetup::new(ROLES);
    let (_scheduler, url) = setup.spawn_scheduler();
    let token = Some(setup.token("ops").to_owned());

    // A client that trusts another CA.
    let other = SecureSetup::new(&[]);
    let refused = Cluster::connect_with(&url, other.credentials(token.as_deref()))
        .await
        .err()
        .expect("another CA is refused");
    let text = refused.to_string();
    assert!(
        text.contains("certificate is not trusted") && text.contains("--ca"),
        "{text}"
    );

    // Plaintext to the TLS port.
    let plain = url.replace("https://", "http://");
    let refused = Cluster::connect_with(&plain, ClientCredentials::default().with_token(token))
        .await
        .err()
        .expect("plaintext is refused");
    let text = refused.to_string();
    assert!(
        text.contains("if it serves TLS, use an https:// url"),
        "{text}"
    );

    // A CA with an http:// url is a mistake, not a silent downgrade.
    let output = Command::new(resident_bin())
        .args(["status", "--cluster", &plain, "--ca"])
        .arg(setup.ca())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("use an https:// url to talk TLS"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_load_models_only_under_their_roots() {
    init_logging();
    let setup = SecureSetup::new(ROLES);
    let (_scheduler, url) = setup.spawn_scheduler();
    let root = setup.dir.path().join("model-root");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(minilm_dir(), root.join("escape")).unwrap();
    let roots: Vec<OsString> = vec!["--model-root".into(), root.clone().into_os_string()];
    let _agent = setup.spawn_agent(
        &url,
        "worker",
        "T4:16GiB",
        Some("node-1"),
        &roots,
        Stdio::inherit(),
    );
    let alice = setup.connect_as(&url, "alice").await.unwrap();
    alice
        .wait_for_nodes(1, Duration::from_secs(10))
        .await
        .unwrap();

    for (pool, model, expect) in [
        ("outside", minilm_dir(), "outside this agent's model roots"),
        (
            "symlink",
            root.join("escape").display().to_string(),
            "through a symlink",
        ),
    ] {
        let spec = EmbedPoolSpec::new(pool, model)
            .into_pool_spec()
            .max_restarts(0);
        let pool = alice.create_pool(spec).await.unwrap();
        let refused = pool
            .wait_ready(Duration::from_secs(20))
            .await
            .expect_err("the model is refused");
        let text = refused.to_string();
        assert!(text.contains(expect), "{text}");
        assert!(
            text.contains(&root.display().to_string()),
            "names the roots: {text}"
        );
        assert!(text.contains("--model-root"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embed_job_runs_end_to_end_over_tls_with_tokens() {
    init_logging();
    let setup = SecureSetup::new(ROLES);
    let (_scheduler, url) = setup.spawn_scheduler();
    let mut agents = Vec::new();
    for (node, token) in [("node-a", "node-1"), ("node-b", "node-2")] {
        let roots: Vec<OsString> = vec!["--model-root".into(), repo_root().join("models").into()];
        agents.push(setup.spawn_agent(
            &url,
            node,
            "T4:16GiB",
            Some(token),
            &roots,
            Stdio::inherit(),
        ));
    }
    let dir = setup.dir.path();
    let input = dir.join("sample.jsonl");
    std::fs::write(&input, wiki_sample_lines(60).join("\n") + "\n").unwrap();
    let out = dir.join("out");
    let output = Command::new(resident_bin())
        .args(["embed", "--model", &minilm_dir(), "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&out)
        .args(["--cluster", &url, "--chunk-size", "10", "--replicas", "2"])
        .args(["--gpus-per-actor", "1"])
        .env("RESIDENT_CA", setup.ca())
        .env("RESIDENT_TOKEN", setup.token("alice"))
        .env("RESIDENT_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "embed over TLS failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["items"], 60);
    assert_eq!(report["per_gpu"][0]["gpu_name"], "T4");
}

#[test]
fn open_binds_need_tls_and_tokens_or_insecure() {
    let state = tempfile::tempdir().unwrap();
    let output = Command::new(resident_bin())
        .args(["scheduler", "--listen", "0.0.0.0:0", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    assert!(!output.status.success(), "an open bind must not start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to serve")
            && stderr.contains("--tls-cert")
            && stderr.contains("--auth-file")
            && stderr.contains("--insecure"),
        "{stderr}"
    );
    let output = Command::new(resident_bin())
        .args(["local", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("refusing to serve"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // --insecure starts, with a warning.
    let mut child = Command::new(resident_bin())
        .args([
            "scheduler",
            "--listen",
            "0.0.0.0:0",
            "--insecure",
            "--state-dir",
        ])
        .arg(state.path())
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.contains("listening on http://"), "{line}");
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("(--insecure)"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Issue 48, item 8: a token never crosses a network in the clear by accident. The CLI and
/// the agent refuse to send one over plaintext http:// to a host beyond loopback, before
/// dialling, naming https:// and --insecure; loopback stays allowed.
#[test]
fn tokens_are_not_sent_over_plaintext_beyond_loopback() {
    // TEST-NET-1: never routed, so nothing is dialled whatever happens.
    let remote = "http://192.0.2.1:50051";
    let output = Command::new(resident_bin())
        .args(["status", "--cluster", remote, "--token", "rsd_secret"])
        .env("RESIDENT_LOG", "warn")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to send the token over plaintext")
            && stderr.contains("https://")
            && stderr.contains("--insecure")
            && !stderr.contains("rsd_secret"),
        "{stderr}"
    );

    let state = tempfile::tempdir().unwrap();
    let output = Command::new(resident_bin())
        .args([
            "agent",
            "--scheduler",
            remote,
            "--node-id",
            "n",
            "--token",
            "rsd_secret",
            "--simulate-gpus",
            "T4:16GiB",
            "--model-cache",
        ])
        .arg(state.path())
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to send the token over plaintext")
            && stderr.contains("192.0.2.1"),
        "{stderr}"
    );
}
