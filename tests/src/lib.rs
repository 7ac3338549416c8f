//! Test harness: in-process clusters on loopback, real-binary clusters, and waiting helpers.

#![warn(missing_docs)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use resident_node_agent::backends::ActorKindRegistry;
use resident_node_agent::gpu::{GpuProbe, NoGpus, SimulatedGpus};
use resident_node_agent::{AgentConfig, parse_labels, run_agent};
use resident_scheduler::core::CoreConfig;
use resident_scheduler::server::{ServerSecurity, start_scheduler};
use resident_scheduler::store::MemoryStore;
use resident_sdk::Cluster;
use tokio_util::sync::CancellationToken;

pub mod cut_proxy;
pub mod data_plane;
pub mod fleet;
pub mod function_length;
pub mod module_graph;
pub mod ports;
pub mod s3_server;
pub mod scale_run;
pub mod secure;

pub use ports::free_port;

/// Polls `pred` until it returns `Some`, or fails after `deadline`.
pub async fn wait_until<T, F, Fut>(what: &str, deadline: Duration, mut pred: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let until = Instant::now() + deadline;
    loop {
        if let Some(value) = pred().await {
            return value;
        }
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Logs of the crates under test to the test's output, filtered by `RUST_LOG` (warnings by
/// default).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// One agent of an [`InProcessCluster`].
pub struct AgentSpec {
    /// Its node id.
    pub node_id: String,
    /// Simulated GPUs (`--simulate-gpus` syntax, `T4:16GiB,T4:16GiB`), or none.
    pub gpus: Option<String>,
    /// Labels, `key=value,...`.
    pub labels: String,
}

/// A scheduler and agents as tasks in this process, talking gRPC over loopback.
pub struct InProcessCluster {
    /// A client of the cluster.
    pub cluster: Cluster,
    /// The scheduler's URL.
    pub url: String,
    cancel: CancellationToken,
    agents: Vec<(String, CancellationToken)>,
}

impl InProcessCluster {
    /// Starts a scheduler and `agents` and waits until every agent registered.
    pub async fn start(agents: Vec<AgentSpec>) -> Self {
        init_logging();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let cancel = CancellationToken::new();
        let server = start_scheduler(
            listener,
            CoreConfig::for_test(),
            Arc::new(MemoryStore::default()),
            ServerSecurity::open(),
            cancel.clone(),
        )
        .expect("scheduler starts");
        let url = server.url.clone();
        let mut this = Self {
            cluster: Cluster::connect(&url).await.expect("connect"),
            url,
            cancel,
            agents: Vec::new(),
        };
        let count = agents.len();
        for spec in agents {
            this.add_agent(spec);
        }
        this.cluster
            .wait_for_nodes(count, Duration::from_secs(10))
            .await
            .expect("agents join");
        this
    }

    /// Starts one more agent.
    pub fn add_agent(&mut self, spec: AgentSpec) {
        let probe: Arc<dyn GpuProbe> = match &spec.gpus {
            Some(gpus) => Arc::new(SimulatedGpus::parse(gpus).expect("gpu spec")),
            None => Arc::new(NoGpus),
        };
        let mut config = AgentConfig::for_test(self.url.clone(), spec.node_id.clone());
        config.labels = parse_labels(&spec.labels).expect("labels");
        let token = self.cancel.child_token();
        tokio::spawn(run_agent(
            config,
            ActorKindRegistry::with_builtin_kinds(),
            probe,
            token.clone(),
        ));
        self.agents.push((spec.node_id, token));
    }

    /// Stops an agent (its session closes, as when its process exits).
    pub fn stop_agent(&self, node_id: &str) {
        for (id, token) in &self.agents {
            if id == node_id {
                token.cancel();
            }
        }
    }
}

impl Drop for InProcessCluster {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The `resident` binary built beside the test executables.
pub fn resident_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("RESIDENT_BIN") {
        return PathBuf::from(path);
    }
    workspace_bin("resident")
}

/// A binary of the workspace built beside the test executables (scripts/test.sh builds the
/// ones the tests start; `cargo build --release --workspace --bins --tests` builds them all).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    // Tests run from target/<profile>/deps; benchmark binaries from target/<profile>.
    let beside = exe.parent().expect("exe dir");
    let profile_dir = if beside.ends_with("deps") {
        beside.parent().expect("target/<profile>")
    } else {
        beside
    };
    let bin = profile_dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it first with `cargo build --release --workspace --bins --tests` (scripts/test.sh builds the ones the tests start)",
        bin.display()
    );
    bin
}

/// A child process killed (SIGKILL) when dropped.
pub struct Proc {
    /// A name for messages.
    pub name: String,
    child: Child,
}

impl Proc {
    /// Owns `child`: killed with -9 when dropped.
    pub fn new(name: &str, child: Child) -> Self {
        Self {
            name: name.to_owned(),
            child,
        }
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("poll the process").is_none()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `deadline` for the process to exit by itself; `None` if it is still running.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let started = std::time::Instant::now();
        while started.elapsed() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Sends a signal by name (`STOP`, `CONT`) with the system's `kill`.
    pub fn signal(&self, name: &str) {
        signal_pid(self.pid(), name);
    }
}

/// Sends a signal by name (`STOP`, `CONT`) to process `pid` with the system's `kill`.
pub fn signal_pid(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Starts `resident scheduler` on `port` with short test intervals; returns it and its URL.
pub fn spawn_scheduler(port: u16, state_dir: &std::path::Path) -> (Proc, String) {
    spawn_scheduler_with(port, state_dir, &[])
}

/// [`spawn_scheduler`] with more arguments (TLS, auth file); the URL may be `https://`.
pub fn spawn_scheduler_with(
    port: u16,
    state_dir: &std::path::Path,
    extra: &[std::ffi::OsString],
) -> (Proc, String) {
    let mut args: Vec<std::ffi::OsString> = ["--heartbeat-ms", "100", "--node-dead-ms", "700"]
        .into_iter()
        .map(Into::into)
        .collect();
    args.extend(extra.iter().cloned());
    spawn_scheduler_exactly(port, state_dir, &args)
}

/// `resident scheduler` on loopback `port` (0: any) with `args` and no others: its own
/// intervals unless `args` set them.
pub fn spawn_scheduler_exactly(
    port: u16,
    state_dir: &std::path::Path,
    args: &[std::ffi::OsString],
) -> (Proc, String) {
    let mut command = Command::new(resident_bin());
    command
        .args(["scheduler", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--state-dir")
        .arg(state_dir)
        .args(args);
    spawn_scheduler_command(command)
}

/// Spawns `command`, which runs (or execs) `resident scheduler`, and reads the URL it
/// prints first.
pub fn spawn_scheduler_command(mut command: Command) -> (Proc, String) {
    let mut child = command
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn scheduler");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("scheduler prints its address");
    let url = line.trim().rsplit(' ').next().expect("url").to_owned();
    assert!(
        url.starts_with("http://") || url.starts_with("https://"),
        "unexpected scheduler output: {line}"
    );
    (
        Proc {
            name: "scheduler".into(),
            child,
        },
        url,
    )
}

/// A `resident scheduler` process on loopback (any port) with short test intervals and
/// `extra` arguments, agent `node-1` with one simulated A10G, and a client once the agent
/// has joined; the scheduler's URL last.
pub async fn scheduler_with_one_agent(
    state_dir: &std::path::Path,
    extra: &[std::ffi::OsString],
) -> (Proc, Proc, Cluster, String) {
    let (scheduler, url) = spawn_scheduler_with(0, state_dir, extra);
    let agent = spawn_agent(&url, "node-1", "A10G:24GiB", "");
    let cluster = Cluster::connect(&url).await.expect("connect");
    cluster
        .wait_for_nodes(1, Duration::from_secs(20))
        .await
        .expect("node-1 joins");
    (scheduler, agent, cluster, url)
}

/// Starts `resident agent` with simulated GPUs.
pub fn spawn_agent(url: &str, node_id: &str, gpus: &str, labels: &str) -> Proc {
    spawn_agent_with(url, node_id, gpus, labels, &[], Stdio::inherit())
}

/// Agents `node-a` and `node-b` with one simulated T4 each, once both have joined.
pub async fn spawn_two_t4_agents(url: &str) -> [Proc; 2] {
    let agents = [
        spawn_agent(url, "node-a", "T4:16GiB", ""),
        spawn_agent(url, "node-b", "T4:16GiB", ""),
    ];
    resident_sdk::Cluster::connect(url)
        .await
        .expect("connect")
        .wait_for_nodes(2, std::time::Duration::from_secs(10))
        .await
        .expect("both agents join");
    agents
}

/// [`spawn_agent`] with more arguments (`--ca`, `--token`, roots) and its log going to
/// `stderr`.
pub fn spawn_agent_with(
    url: &str,
    node_id: &str,
    gpus: &str,
    labels: &str,
    extra: &[std::ffi::OsString],
    stderr: Stdio,
) -> Proc {
    let child = agent_command(url, node_id, gpus, labels, extra)
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn agent");
    Proc::new(node_id, child)
}

/// The `resident agent` command line of [`spawn_agent_with`], to spawn with a log level and
/// output of the test's choosing.
pub fn agent_command(
    url: &str,
    node_id: &str,
    gpus: &str,
    labels: &str,
    extra: &[std::ffi::OsString],
) -> Command {
    let has_roots = extra.iter().any(|a| a == "--model-root");
    let mut command = Command::new(resident_bin());
    command
        .args([
            "agent",
            "--scheduler",
            url,
            "--node-id",
            node_id,
            "--simulate-gpus",
            gpus,
            "--labels",
            labels,
        ])
        .args(extra);
    if !extra.iter().any(|a| a == "--reconnect-max-ms") {
        command.args(["--reconnect-max-ms", "300"]);
    }
    if !has_roots {
        command
            .arg("--model-root")
            .arg(repo_root().join("models"))
            .arg("--data-root")
            .arg(std::env::temp_dir());
    }
    command
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repo")
        .to_owned()
}

/// The workspace's members as the root `Cargo.toml` lists them (on one line), e.g.
/// `node-agent`, `examples/custom-actor`.
pub fn workspace_members() -> Vec<String> {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    let members_line = manifest
        .lines()
        .find(|line| line.starts_with("members = ["))
        .expect("the workspace manifest lists its members on one line");
    let members: Vec<String> = members_line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(members.len() >= 12, "read the members: {members:?}");
    members
}

/// The real all-MiniLM-L6-v2 from `scripts/fetch-model.sh`.
pub fn minilm_dir() -> String {
    fetched_model_dir("all-MiniLM-L6-v2", "scripts/fetch-model.sh")
}

/// A copy of all-MiniLM-L6-v2 in `dir` that names prompts, as
/// `scripts/make-prompt-fixture.py` makes it: `{"query": "query: ", "passage": "passage: "}`,
/// `passage` by default; `include_prompt` false leaves the prompt out of pooling. The
/// weights are hard-linked where the file system allows.
pub fn prompted_minilm(dir: &std::path::Path, include_prompt: bool) -> String {
    let source = PathBuf::from(minilm_dir());
    let model = dir.join(match include_prompt {
        true => "minilm-prompts-in",
        false => "minilm-prompts-ex",
    });
    copy_tree(&source, &model);
    std::fs::write(
        model.join("config_sentence_transformers.json"),
        r#"{"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"}"#,
    )
    .expect("write the prompts");
    let pooling = model.join("1_Pooling/config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&pooling).expect("pooling config"))
            .expect("pooling config is JSON");
    config["include_prompt"] = include_prompt.into();
    std::fs::write(&pooling, config.to_string()).expect("write the pooling config");
    model.to_string_lossy().into_owned()
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("model copy");
    for entry in std::fs::read_dir(from).expect("model dir") {
        let entry = entry.expect("model dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else if entry.file_name() == "model.safetensors" {
            if std::fs::hard_link(entry.path(), &target).is_err() {
                std::fs::copy(entry.path(), &target).expect("copy the weights");
            }
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a model file");
        }
    }
}

/// sentence-transformers/all-mpnet-base-v2, the seed pipeline's model.
pub fn mpnet_dir() -> String {
    fetched_model_dir(
        "all-mpnet-base-v2",
        "scripts/fetch-model.sh all-mpnet-base-v2",
    )
}

/// A llama.cpp fixture under `tests/fixtures/` (`file`), checked to come from the very GGUF
/// file the tests run ([`smollm2_gguf`]); `script` is what writes it again.
pub fn llama_cpp_fixture(file: &str, script: &str) -> serde_json::Value {
    let fixture = read_json(&repo_root().join("tests/fixtures").join(file));
    let model = std::fs::File::open(smollm2_gguf()).unwrap();
    let (_, sha256) = resident_storage::model_manifest::sha256_of(model).unwrap();
    assert_eq!(
        fixture["model_sha256"], sha256,
        "the fixture was made from another GGUF: run {script}"
    );
    fixture
}

/// SmolLM2-135M-Instruct, GGUF Q4_1: the generation tests' model.
pub fn smollm2_gguf() -> String {
    let file = repo_root().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        file.is_file(),
        "{} is missing: run scripts/fetch-model.sh smollm2-135m-instruct (scripts/test.sh does)",
        file.display()
    );
    file.to_string_lossy().into_owned()
}

fn fetched_model_dir(name: &str, fetch: &str) -> String {
    let dir = repo_root().join("models").join(name);
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is missing: run {fetch} (scripts/test.sh does)",
        dir.display()
    );
    dir.to_string_lossy().into_owned()
}

/// The first `count` of the 300 real Wikipedia articles committed as a fixture, as JSONL
/// lines (`{"id", "text", ...}`).
pub fn wiki_sample_lines(count: usize) -> Vec<String> {
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/fixtures/wiki_sample.jsonl.json"))
            .expect("wiki sample fixture"),
    )
    .expect("fixture is JSON");
    fixture
        .as_array()
        .expect("an array of records")
        .iter()
        .take(count)
        .map(|record| record.to_string())
        .collect()
}

/// The first `count` of the 300-article fixture as `sample.jsonl` in `dir`.
pub fn sample(dir: &std::path::Path, count: usize) -> PathBuf {
    let path = dir.join("sample.jsonl");
    std::fs::write(&path, wiki_sample_lines(count).join("\n") + "\n").expect("write sample");
    path
}

/// `resident embed` of `input` into `out` with the MiniLM fixture model; its log is piped.
pub fn embed_command(input: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Command {
    embed_command_of(&minilm_dir(), input, out, extra)
}

/// `resident embed` of `input` into `out` with `model`; its log is piped.
pub fn embed_command_of(
    model: &str,
    input: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
) -> Command {
    job_command(&["embed", "--model", model], input, out, extra)
}

/// `resident JOB ARGS --input INPUT --output OUT EXTRA`, logging warnings only, its log piped.
fn job_command(
    job: &[&str],
    input: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
) -> Command {
    let mut command = Command::new(resident_bin());
    command
        .args(job)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(out)
        .args(extra)
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// `resident generate` of `input` into `out` with the SmolLM2 fixture model and `prompt`;
/// its log is piped. `extra` arguments follow.
pub fn generate_command(
    input: &std::path::Path,
    out: &std::path::Path,
    prompt: &str,
    extra: &[&str],
) -> Command {
    let model = smollm2_gguf();
    job_command(
        &["generate", "--model", &model, "--prompt", prompt],
        input,
        out,
        extra,
    )
}

/// `resident embed` on the cluster at `url` in chunks of 3 over two actors of one GPU each,
/// so a fault lands mid-job; the pool is kept, so its actors (and their model loads) can be
/// read after the job. `extra` arguments follow.
pub fn two_actor_embed(
    input: &std::path::Path,
    out: &std::path::Path,
    url: &str,
    extra: &[&str],
) -> Command {
    let mut args = vec![
        "--cluster",
        url,
        "--chunk-size",
        "3",
        "--gpus-per-actor",
        "1",
        "--replicas",
        "2",
        "--keep-pool",
    ];
    args.extend_from_slice(extra);
    embed_command(input, out, &args)
}

/// `resident status --json` of the cluster at `url`.
pub fn status_json(url: &str) -> serde_json::Value {
    resident_json(&["status", "--cluster", url, "--json"])
}

/// What `resident ARGS` prints as JSON (it must succeed).
pub fn resident_json(args: &[&str]) -> serde_json::Value {
    let output = Command::new(resident_bin())
        .args(args)
        .output()
        .expect("run resident");
    assert!(
        output.status.success(),
        "resident {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("--json is JSON")
}

/// The GPU-seconds every pool of the cluster at `url` has held, by `resident pools --json`.
pub fn pools_gpu_seconds(url: &str) -> f64 {
    let pools = resident_json(&["pools", "--cluster", url, "--json"]);
    let pools = pools["pools"].as_array().expect("pools");
    let classes = pools
        .iter()
        .flat_map(|p| p["usage"].as_array().expect("usage"));
    classes
        .map(|c| c["gpu_seconds"].as_f64().expect("gpu_seconds"))
        .sum()
}

/// Each actor in `resident status --json` of the cluster at `url`: its id and its model
/// loads, by id.
pub fn actor_model_loads(url: &str) -> Vec<(String, u64)> {
    let status = status_json(url);
    let mut actors: Vec<(String, u64)> = status["actors"]
        .as_array()
        .expect("actors")
        .iter()
        .map(|a| {
            (
                a["actor_id"].as_str().expect("actor_id").to_owned(),
                a["model_loads"].as_u64().expect("model_loads"),
            )
        })
        .collect();
    actors.sort();
    actors
}

/// The shape and f32 values of an `.npy` file's bytes.
pub fn parse_npy_f32(bytes: &[u8]) -> (Vec<usize>, Vec<f32>) {
    let header_len = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = String::from_utf8_lossy(&bytes[10..header_len]).to_string();
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("npy header has a shape");
    let shape = shape
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
    let data = bytes[header_len..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    (shape, data)
}

/// The `id` of every line of a JSONL file (an `ids.jsonl`, a `generations.jsonl`).
pub fn ids_in_file(path: &std::path::Path) -> Vec<serde_json::Value> {
    ids_in_jsonl(&std::fs::read_to_string(path).expect("read a JSONL file"))
}

/// The `id` of each line of JSONL `text`.
pub fn ids_in_jsonl(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line")["id"].clone())
        .collect()
}

/// Asserts that a JSON document (`what`) has every one of `fields`, non-null.
pub fn assert_has_fields(json: &serde_json::Value, fields: &[&str], what: &str) {
    for field in fields {
        assert!(!json[field].is_null(), "{what} lacks {field}: {json}");
    }
}

/// Waits until a `resident embed` started with `RESIDENT_TEST_PAUSE_AT` (and its stderr
/// piped) says it has paused there, so the caller can kill it at exactly that point.
pub async fn wait_for_pause(child: &mut Child) {
    let stderr = child.stderr.take().expect("stderr piped");
    let marker = tokio::task::spawn_blocking(move || {
        let mut seen = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if line.contains("paused at") {
                return;
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        panic!("the job ended without pausing: {seen}");
    });
    tokio::time::timeout(Duration::from_secs(120), marker)
        .await
        .expect("the job pauses within 2 minutes")
        .unwrap();
}

/// The chunks a running or finished local embed output records as done (`manifest.json`
/// and its journal, read as a resume would), in chunk order.
pub fn finished_chunks(
    out: &std::path::Path,
) -> Vec<resident_jobs::corpus_job::manifest::ShardEntry> {
    resident_jobs::corpus_job::manifest_store::finished_chunks_blocking(out)
        .unwrap_or_else(|e| panic!("the output's manifest cannot be read: {e}"))
}

/// A JSON file, parsed.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every line of a JSONL file, parsed.
pub fn read_jsonl(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

/// Writes `values` to `path`, a JSON line each.
pub fn write_jsonl(path: &std::path::Path, values: &[serde_json::Value]) {
    let text: String = values.iter().map(|v| format!("{v}\n")).collect();
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Runs `command` to its end with stdout and stderr captured, asserts that it succeeded
/// (showing its stderr if not), and returns both.
pub fn run_to_success(mut command: Command) -> (String, String) {
    let output = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{command:?} failed: {stderr}");
    (String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
}

/// Runs `resident generate` over `input` into `out` (prompt `{text}`) with each of
/// `cases`' flags, and checks it is refused: exit code 2, stderr saying the case's text,
/// nothing written. Returns each refusal's stderr, in order.
pub fn assert_refused(
    input: &std::path::Path,
    out: &std::path::Path,
    cases: &[(&[&str], &str)],
) -> Vec<String> {
    let mut refusals = Vec::new();
    for (flags, says) in cases {
        let output = generate_command(input, out, "{text}", flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(!out.exists(), "{flags:?} wrote nothing");
        refusals.push(stderr);
    }
    refusals
}

/// GET `url` over HTTPS trusting `ca` (Python's standard library: a real client, not ours),
/// with a bearer token if given; returns the status and body.
pub fn https_get(url: &str, ca: &std::path::Path, token: Option<&str>) -> (u16, String) {
    let script = r#"
import ssl, sys, urllib.request, urllib.error
request = urllib.request.Request(sys.argv[1])
if sys.argv[3]:
    request.add_header("Authorization", "Bearer " + sys.argv[3])
context = ssl.create_default_context(cafile=sys.argv[2])
try:
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        status, body = response.status, response.read()
except urllib.error.HTTPError as error:
    status, body = error.code, error.read()
print(status)
sys.stdout.write(body.decode())
"#;
    let output = Command::new("python3")
        .args(["-c", script, url])
        .arg(ca)
        .arg(token.unwrap_or(""))
        .output()
        .expect("python3");
    assert!(
        output.status.success(),
        "GET {url}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let (status, body) = text.split_once('\n').expect("a status line");
    (status.parse().expect("a status"), body.to_owned())
}

/// Waits for a spawned `resident embed` to end, asserts it succeeded, and that `out` holds
/// every id of `input` once, in input order; returns what it wrote to stderr.
pub async fn assert_embed_succeeds_exactly(
    child: std::process::Child,
    input: &std::path::Path,
    out: &std::path::Path,
) -> String {
    let finished = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait for embed");
    let stderr = String::from_utf8_lossy(&finished.stderr);
    assert!(finished.status.success(), "embed failed: {stderr}");
    let ids = |path: &std::path::Path| ids_in_jsonl(&std::fs::read_to_string(path).expect("ids"));
    assert_eq!(
        ids(&out.join("ids.jsonl")),
        ids(input),
        "every input id once, in order"
    );
    stderr.into_owned()
}

/// A plain HTTP/1.0 GET: the body of a 200 answer.
pub fn plain_http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

/// `GET path` over plain HTTP/1.1: the status and body.
pub fn plain_get(port: u16, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    std::io::Write::write_all(&mut stream, request.as_bytes()).unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut stream, &mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}
