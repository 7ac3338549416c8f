//! Seeing a running cluster, with TLS and tokens on, against a scheduler process and two
//! agent processes: `/metrics` scraped during and after a job agrees with what the client
//! got and with `status`; the dashboard, in a real headless Chromium, shows both nodes and
//! the job's progress rising, behind its login page.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use resident_sdk::{Bytes, Cluster, PoolSpec};
use resident_tests::secure::SecureSetup;
use resident_tests::{Proc, free_port, https_get, init_logging, wait_until};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// A secure scheduler with its HTTP port, and two agents (`node-a`: two T4s, `node-b`: one
/// A10G, and a second it cannot open), with an admin client connected.
struct ObservedCluster {
    setup: SecureSetup,
    http: String,
    /// `node-a`'s own HTTP port (loopback, plaintext).
    agent_http: std::net::SocketAddr,
    client: Cluster,
    _procs: Vec<Proc>,
}

impl ObservedCluster {
    async fn start() -> Self {
        let setup = SecureSetup::new(&[("ops", "admin"), ("viewer", "read"), ("node", "agent")]);
        let http_port = free_port();
        let (scheduler, url) = setup.spawn_scheduler_with(&[
            "--http-listen".into(),
            format!("127.0.0.1:{http_port}").into(),
        ]);
        let mut procs = vec![scheduler];
        let agent_http: std::net::SocketAddr = ([127, 0, 0, 1], free_port()).into();
        for (node, gpus, extra) in [
            (
                "node-a",
                "T4:16GiB x2",
                vec!["--http-listen".into(), agent_http.to_string().into()],
            ),
            ("node-b", "A10G:24GiB, !A10G:24GiB", vec![]),
        ] {
            procs.push(setup.spawn_agent(
                &url,
                node,
                gpus,
                Some("node"),
                &extra,
                std::process::Stdio::inherit(),
            ));
        }
        let client = setup.connect_as(&url, "ops").await.unwrap();
        client
            .wait_for_nodes(2, Duration::from_secs(15))
            .await
            .unwrap();
        Self {
            http: format!("https://127.0.0.1:{http_port}"),
            agent_http,
            setup,
            client,
            _procs: procs,
        }
    }

    fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        https_get(&format!("{}{path}", self.http), &self.setup.ca(), token)
    }

    /// The scrape as `name{labels}` -> value.
    fn scrape(&self) -> BTreeMap<String, f64> {
        let (status, body) = self.get("/metrics", Some(self.setup.token("viewer")));
        assert_eq!(status, 200, "{body}");
        parse_metrics(&body)
    }
}

fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn series(metrics: &BTreeMap<String, f64>, name: &str) -> f64 {
    metrics.get(name).copied().unwrap_or(0.0)
}

fn matching<'a>(
    metrics: &'a BTreeMap<String, f64>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a String, &'a f64)> + 'a {
    metrics.iter().filter(move |(k, _)| k.starts_with(prefix))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_the_client_got_and_match_status() {
    init_logging();
    let cluster = ObservedCluster::start().await;
    let (status, body) = cluster.get("/metrics", None);
    assert_eq!(status, 401, "no token, no metrics: {body}");

    let pool = cluster
        .client
        .create_pool(
            PoolSpec::new("work", "echo")
                .replicas(3)
                .gpus(0.5)
                .vram_gib(1.0)
                .config_json(&serde_json::json!({"delay_ms": 30, "fail_prefix": "FAIL"})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    // 60 tasks, two of which fail on every attempt (3 by default: 2 retries each).
    let inputs: Vec<Bytes> = (0..60)
        .map(|i| match i {
            7 | 41 => Bytes::from(format!("FAIL {i}")),
            _ => Bytes::from(format!("doc {i}")),
        })
        .collect();
    let mut job = pool
        .submit("observed", futures::stream::iter(inputs))
        .await
        .unwrap();
    let (mut ok, mut failed) = (0u64, 0u64);
    let mut scraped_during = false;
    while let Some(output) = job.next().await {
        match output.unwrap().output {
            Ok(_) => ok += 1,
            Err(_) => failed += 1,
        }
        if ok == 20 {
            // Mid-job: the count of succeeded tasks never runs ahead of what was delivered
            // (a result is counted as it is sent), and the job's per-job series exist.
            let during = cluster.scrape();
            let counted = series(
                &during,
                "resident_tasks_total{pool=\"work\",outcome=\"succeeded\"}",
            );
            assert!(counted >= 20.0, "{counted}");
            assert!(
                matching(&during, "resident_job_tasks{job=\"")
                    .any(|(k, _)| k.contains("state=\"running\"")),
                "per-job series during the job"
            );
            assert_eq!(
                series(&during, "resident_jobs{state=\"running\"}"),
                1.0,
                "{during:?}"
            );
            scraped_during = true;
        }
    }
    assert!(scraped_during);
    assert_eq!((ok, failed), (58, 2));

    let after = cluster.scrape();
    assert_eq!(
        series(
            &after,
            "resident_tasks_total{pool=\"work\",outcome=\"succeeded\"}"
        ),
        ok as f64,
        "succeeded = the results the client got"
    );
    assert_eq!(
        series(
            &after,
            "resident_tasks_total{pool=\"work\",outcome=\"failed\"}"
        ),
        failed as f64
    );
    assert_eq!(
        series(
            &after,
            "resident_tasks_total{pool=\"work\",outcome=\"retried\"}"
        ),
        4.0,
        "each failing task was retried twice"
    );
    let attempts = series(
        &after,
        "resident_task_duration_seconds_count{pool=\"work\"}",
    );
    assert_eq!(attempts, 58.0 + 6.0, "one observation per attempt");
    // Every GPU has its VRAM series; the actors' holdings are visible as used VRAM.
    let totals: Vec<_> = matching(&after, "resident_gpu_vram_total_bytes{").collect();
    assert_eq!(totals.len(), 3, "{totals:?}");
    for (gpu, _) in &totals {
        let free = gpu.replace("_total_bytes", "_free_bytes");
        assert!(after.contains_key(&free), "{free} in {after:?}");
    }
    assert_eq!(series(&after, "resident_nodes{state=\"alive\"}"), 2.0);
    // node-b's second GPU would not open: counted apart, with no VRAM series.
    assert_eq!(
        series(&after, "resident_gpus_unavailable{node=\"node-b\"}"),
        1.0
    );
    assert_eq!(
        series(&after, "resident_gpus_unavailable{node=\"node-a\"}"),
        0.0
    );
    assert_eq!(
        series(&after, "resident_actors{pool=\"work\",state=\"ready\"}"),
        3.0
    );
    assert_eq!(series(&after, "resident_jobs{state=\"failed\"}"), 1.0);
    assert_eq!(
        series(&after, "resident_pool_queue_depth{pool=\"work\"}"),
        0.0
    );
    // What the pool's GPU actors have held, as a counter by GPU model and node label.
    let held: Vec<_> = matching(&after, "resident_pool_gpu_seconds_total{pool=\"work\"").collect();
    assert!(!held.is_empty(), "{after:?}");
    assert!(held.iter().all(|(_, seconds)| **seconds > 0.0), "{held:?}");
    assert!(series(&after, "resident_scheduler_loop_lag_seconds_count") > 0.0);
    assert!(series(&after, "resident_store_write_seconds_count") > 0.0);
    // Model loads match what `status` says.
    let status = pool.status().await.unwrap();
    let loads: u64 = status.actors.iter().map(|a| a.model_loads).sum();
    assert_eq!(loads, 3);
    assert_eq!(
        series(&after, "resident_model_loads_total{pool=\"work\"}"),
        loads as f64
    );
    // The job's own series: 60 tasks, 58 documents done; and the failures are in the
    // dashboard's recent errors, with their reason.
    let job_id = job.job_id.to_string();
    let key = |state: &str| {
        format!("resident_job_tasks{{job=\"{job_id}\",pool=\"work\",state=\"{state}\"}}")
    };
    assert_eq!(series(&after, &key("submitted")), 60.0);
    assert_eq!(series(&after, &key("succeeded")), 58.0);
    let (code, overview) = cluster.get("/v1/overview", Some(cluster.setup.token("viewer")));
    assert_eq!(code, 200, "{overview}");
    let overview: serde_json::Value = serde_json::from_str(&overview).unwrap();
    let events = overview["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["subject"] == "task"
            && e["message"]
                .as_str()
                .unwrap()
                .contains("failed after 3 attempts")),
        "{events:?}"
    );
    let job_view = overview["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == job_id.as_str())
        .unwrap();
    assert_eq!(job_view["state"], "failed");
    assert_eq!(job_view["items_done"], 58);
    assert!(job_view["cost_usd"].as_f64().unwrap() > 0.0, "{job_view}");

    // The actors' busy time reaches the scheduler in heartbeats; node-a's own port shows
    // its actors and GPUs too. Every attempt slept 30 ms, so busy time covers 64 of them.
    let busy = wait_until("busy time reported", Duration::from_secs(10), || async {
        let scraped = cluster.scrape();
        let busy: f64 = matching(&scraped, "resident_actor_busy_seconds_total{pool=\"work\"")
            .map(|(_, v)| v)
            .sum();
        (busy >= 64.0 * 0.03).then_some(busy)
    })
    .await;
    assert!(busy < 30.0, "{busy}");
    let agent = parse_metrics(&resident_tests::plain_http_get(
        cluster.agent_http,
        "/metrics",
    ));
    let on_a: Vec<_> = matching(&agent, "resident_agent_actor_ready{pool=\"work\"").collect();
    assert!(!on_a.is_empty(), "{agent:?}");
    assert_eq!(
        matching(
            &agent,
            "resident_agent_gpu_vram_total_bytes{node=\"node-a\""
        )
        .count(),
        2,
        "{agent:?}"
    );
}

/// The page as Chromium renders it after running its scripts for `budget_ms` of virtual
/// time, in a profile kept in `profile` (so the login cookie carries over).
fn render(url: &str, profile: &Path, budget_ms: u32) -> String {
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--ignore-certificate-errors",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(["--dump-dom", url])
        .output()
        .expect("chromium is not installed: run scripts/install-browser.sh");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The progress (percent) the page shows for the job.
fn progress_shown(page: &str, job_id: &str) -> f64 {
    let row = page
        .split(&format!("data-job=\"{job_id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("job {job_id} is not on the page:\n{page}"));
    let value = row
        .split("aria-valuenow=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a progress bar");
    value.parse().expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_both_nodes_and_a_job_progressing_in_a_browser() {
    init_logging();
    let cluster = ObservedCluster::start().await;
    let pool = cluster
        .client
        .create_pool(
            PoolSpec::new("slow", "echo")
                .replicas(2)
                .gpus(1.0)
                .vram_gib(2.0)
                .config_json(&serde_json::json!({"delay_ms": 100})),
        )
        .await
        .unwrap();
    pool.wait_ready(Duration::from_secs(20)).await.unwrap();
    // The test feeds the inputs: a quarter before the first look, the rest after it, so the
    // job cannot end before the browser first shows it, however slow the machine (a loaded CI
    // host once ran all 400 before Chromium drew the page). The client says the total, so the
    // bar reads done over 400 throughout.
    let (feed, inputs) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let doc = |i: usize| Bytes::from(format!("doc {i}"));
    for i in 0..100 {
        feed.send(doc(i)).unwrap();
    }
    let options = resident_sdk::SubmitOptions {
        expected_tasks: 400,
        ..Default::default()
    };
    let mut job = pool
        .submit_with("browsed", UnboundedReceiverStream::new(inputs), options)
        .await
        .unwrap();
    let job_id = job.job_id.to_string();
    let drain = tokio::spawn(async move {
        let mut results = 0;
        while let Some(result) = job.next().await {
            result.unwrap();
            results += 1;
        }
        results
    });
    wait_until("some tasks done", Duration::from_secs(20), || async {
        let status = cluster
            .client
            .job_status(&resident_sdk::JobId::new(job_id.clone()))
            .await
            .ok()?;
        (status.succeeded >= 10).then_some(())
    })
    .await;

    let profile = tempfile::tempdir().unwrap();
    // Without a login, the dashboard sends the browser to the login page.
    let page = render(&format!("{}/", cluster.http), profile.path(), 2000);
    assert!(page.contains("id=\"login\""), "{page}");
    assert!(!page.contains("data-node="), "{page}");
    // A wrong token is refused, with what to do.
    let page = render(
        &format!("{}/login#token=rtk_wrong", cluster.http),
        profile.path(),
        3000,
    );
    assert!(page.contains("not known to this cluster"), "{page}");
    // The login link (token in the fragment, never sent in a URL) logs in and shows the
    // dashboard: both nodes, their GPUs, the pool's actors, and the job.
    let login = format!(
        "{}/login#token={}",
        cluster.http,
        cluster.setup.token("viewer")
    );
    let first = render(&login, profile.path(), 3000);
    for expected in [
        "data-node=\"node-a\"",
        "data-node=\"node-b\"",
        "GPU 1: T4 (simulated)",
        "GPU 0: A10G (simulated)",
        "GPU 1: unavailable (simulated: A10G marked",
        "data-pool=\"slow\"",
        "2 nodes alive",
    ] {
        assert!(first.contains(expected), "{expected} missing from\n{first}");
    }
    // The GPU-hours the pool's two whole-GPU actors have held so far.
    let pool_row = first
        .split("data-pool=\"slow\"")
        .nth(1)
        .and_then(|row| row.split("</tr>").next())
        .unwrap_or_default();
    assert!(
        pool_row.contains(" GPU-h</td>"),
        "the pool's GPU-hours missing from\n{pool_row}"
    );
    let before = progress_shown(&first, &job_id);
    for i in 100..400 {
        feed.send(doc(i)).unwrap();
    }
    drop(feed);
    // The cookie set by the login keeps the browser in; once the job has moved on (as the API
    // tells, not after a guessed sleep), the page shows the progress risen.
    let job = resident_sdk::JobId::new(job_id.clone());
    let done_then = cluster.client.job_status(&job).await.unwrap().succeeded;
    wait_until("more tasks done", Duration::from_secs(30), || async {
        let status = cluster.client.job_status(&job).await.ok()?;
        (status.succeeded >= (done_then + 20).min(400)).then_some(())
    })
    .await;
    let later = render(&format!("{}/", cluster.http), profile.path(), 3000);
    let after = progress_shown(&later, &job_id);
    assert!(
        after > before && before > 0.0 && before <= 25.0,
        "progress rose: {before}% then {after}%"
    );
    assert_eq!(drain.await.unwrap(), 400);
}

/// A chunk of 300 Wikipedia articles through the real MiniLM on one actor, in batches of
/// 16: the actor reports after its batches, so the client's running count and the job's
/// `items_running` (dashboard, `/metrics`) rise before the chunk's result comes, and the
/// result moves every document into `items_done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_moves_inside_a_chunk_before_it_ends() {
    init_logging();
    let cluster = ObservedCluster::start().await;
    let pool = cluster
        .client
        .create_embed_pool(
            resident_sdk::EmbedPoolSpec::new("inside", resident_tests::minilm_dir())
                .replicas(1)
                .max_batch_size(16),
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    let texts: Vec<String> = resident_tests::wiki_sample_lines(300)
        .iter()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            record["text"].as_str().unwrap().to_owned()
        })
        .take(300)
        .collect();
    let chunk = resident_sdk::TaskPayload::new(resident_sdk::embed_request(texts, false), 300);
    let mut job = pool
        .pool
        .submit_payloads(
            "one-chunk",
            futures::stream::iter([chunk]),
            resident_sdk::SubmitOptions {
                expected_tasks: 1,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let job_id = job.job_id.to_string();
    let mut running = job.items_running();
    let started = std::time::Instant::now();
    let mut seen: Vec<(Duration, u64)> = Vec::new();
    let mut scraped_running = 0.0;
    let output = loop {
        tokio::select! {
            output = job.next() => break output.expect("one result").unwrap(),
            Ok(()) = running.changed() => {
                let items = *running.borrow_and_update();
                seen.push((started.elapsed(), items));
                if scraped_running == 0.0 && items > 0 {
                    let key = format!("resident_job_items_running{{job=\"{job_id}\",pool=\"inside\"}}");
                    scraped_running = cluster.scrape().get(&key).copied().unwrap_or_default();
                }
            }
        }
    };
    let took = started.elapsed();
    eprintln!("chunk of 300 took {took:?}; running counts seen: {seen:?}");
    assert!(output.output.is_ok(), "{:?}", output.output);
    let rising: Vec<u64> = seen.iter().map(|(_, n)| *n).filter(|&n| n > 0).collect();
    assert!(
        rising.len() >= 2 && rising.windows(2).all(|w| w[0] < w[1]),
        "the running count rose at least twice before the result: {seen:?}"
    );
    // Reports count the chunk's documents done so far: at most the chunk's 300 (a last report
    // of all 300 may come just before the result), and some came while documents remained.
    assert!(rising.iter().all(|&n| n <= 300), "{seen:?}");
    assert!(
        rising.iter().any(|&n| n < 300),
        "a report came while documents of the chunk were still to do: {seen:?}"
    );
    assert!(
        scraped_running > 0.0,
        "/metrics showed documents inside the running chunk"
    );
    let status = cluster.client.job_status(&job.job_id).await.unwrap();
    assert_eq!((status.items_done, status.items_running), (300, 0));
    assert_eq!(
        *running.borrow(),
        0,
        "the answered chunk left the running count"
    );
}

/// Issue 48, item 8: the login cookie names a session, never the token. Python's
/// `http.client` (a real client, not ours) logs in over TLS, reads the cookie, uses it, tries
/// its value as a token (refused), logs out, and the cookie stops working.
#[test]
fn the_login_cookie_holds_a_session_id_not_the_token() {
    let setup = SecureSetup::new(&[("viewer", "read")]);
    let http_port = free_port();
    let (_scheduler, _url) = setup.spawn_scheduler_with(&[
        "--http-listen".into(),
        format!("127.0.0.1:{http_port}").into(),
    ]);
    let script = r#"
import http.client, ssl, sys, time, urllib.parse
port, ca, token = int(sys.argv[1]), sys.argv[2], sys.argv[3]
context = ssl.create_default_context(cafile=ca)
def call(method, path, body=None, headers={}):
    for attempt in range(100):
        try:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status, response.getheader("Set-Cookie") or ""
        except ConnectionRefusedError:
            time.sleep(0.1)
    raise SystemExit("the HTTP port never opened")
form = urllib.parse.urlencode({"token": token})
status, cookie = call("POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded"})
print("login", status)
print("cookie", cookie)
session = cookie.split(";")[0]
print("with-cookie", call("GET", "/v1/overview", headers={"Cookie": session})[0])
session_id = session.split("=", 1)[1]
print("id-as-token", call("GET", "/v1/overview", headers={"Authorization": "Bearer " + session_id})[0])
print("logout", call("GET", "/logout", headers={"Cookie": session})[0])
print("after-logout", call("GET", "/v1/overview", headers={"Cookie": session})[0])
"#;
    let token = setup.token("viewer");
    let output = Command::new("python3")
        .args(["-c", script, &http_port.to_string()])
        .arg(setup.ca())
        .arg(token)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} in {stdout}"))
            .to_owned()
    };
    assert_eq!(line("login"), "303");
    let cookie = line("cookie");
    assert!(
        cookie.starts_with("resident_session=")
            && cookie.contains("HttpOnly")
            && cookie.contains("Secure"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(token),
        "the token is not in the cookie: {cookie}"
    );
    assert_eq!(line("with-cookie"), "200");
    assert_eq!(line("id-as-token"), "401", "a session id is not a token");
    assert_eq!(line("logout"), "303");
    assert_eq!(line("after-logout"), "401", "logout ends the session");
}
