//! Models and sweep datasets come to the agents from S3 (a real s3s-fs server): `resident
//! model push`, the agent's model cache (one download per node, checked against the
//! manifest, damaged copies fetched again, changed models refused), `resident embed --model
//! s3://…` on a cluster of two agent processes giving exactly the vectors of the same model
//! loaded from disk, and `resident sweep --cache s3://…` with agents that cannot read the
//! client's files.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use resident_node_agent::model_cache::{ModelCache, ModelCacheConfig};
use resident_storage::model_manifest::{MANIFEST_FILE, ModelManifest};
use resident_tests::s3_server::S3Server;
use resident_tests::{
    Proc, agent_command, init_logging, minilm_dir, parse_npy_f32, read_json, resident_bin, sample,
    spawn_scheduler,
};

/// `resident model push DIR DESTINATION` against `server`; returns its stdout.
fn push(server: &S3Server, dir: &str, destination: &str) -> String {
    let output = Command::new(resident_bin())
        .args(["model", "push", dir, destination])
        .envs(server.env())
        .output()
        .expect("run resident model push");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "push failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn minilm_digest() -> String {
    ModelManifest::of_dir(Path::new(&minilm_dir()))
        .expect("manifest of the fixture model")
        .digest()
}

/// The cache's complete entries (not locks or partial downloads).
fn cache_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| !name.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(".partial"))
                .collect()
        })
        .unwrap_or_default()
}

/// Resolves `spec` on `threads` actor-like OS threads at once.
fn resolve_together(
    cache: &Arc<ModelCache>,
    spec: &str,
    threads: usize,
) -> Vec<Result<String, String>> {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (cache, spec) = (cache.clone(), spec.to_owned());
            std::thread::spawn(move || cache.local_dir(&spec, None).map_err(|e| e.to_string()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Three variants of the fixture model (its files plus a marker file, so three digests)
/// pushed to the server, in a directory that lives as long as the caller keeps it.
fn three_variants(server: &S3Server) -> (tempfile::TempDir, Vec<String>) {
    let work = tempfile::tempdir().unwrap();
    let mut specs = Vec::new();
    for name in ["a", "b", "c"] {
        let dir = work.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for file in std::fs::read_dir(minilm_dir()).unwrap().flatten() {
            if file.file_type().unwrap().is_file() {
                std::fs::copy(file.path(), dir.join(file.file_name())).unwrap();
            }
        }
        std::fs::write(dir.join("variant.txt"), name).unwrap();
        let spec = format!("s3://models/{name}/");
        push(server, dir.to_str().unwrap(), &spec);
        specs.push(spec);
    }
    (work, specs)
}

/// `--model-cache-max-gib`: a download past the limit evicts the least recently used model,
/// but never one an actor has loaded (held), nor the one just fetched.
#[test]
fn the_model_cache_evicts_the_least_recently_used_model_but_never_a_loaded_one() {
    init_logging();
    let server = S3Server::start(&["models"]);
    let (_work, specs) = three_variants(&server);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let cache_dir = tempfile::tempdir().unwrap();
    let one_model = ModelManifest::of_dir(Path::new(&minilm_dir()))
        .unwrap()
        .total_bytes();
    let cache = ModelCache::new(ModelCacheConfig {
        dir: cache_dir.path().to_owned(),
        s3: server.options(),
        // Room for two models and a half.
        max_bytes: Some(one_model * 5 / 2),
    });
    let fetch = |spec: &str| cache.local_dir(spec, None).unwrap();
    // An actor loads A and keeps it; B is fetched and used after it, so A is the least
    // recently used.
    let a = fetch(&specs[0]);
    let loaded_a = cache.hold(&a).expect("A is a cache entry");
    std::thread::sleep(Duration::from_millis(20));
    let b = fetch(&specs[1]);
    drop(cache.hold(&b));
    std::thread::sleep(Duration::from_millis(20));
    let c = fetch(&specs[2]);
    assert!(Path::new(&a).is_dir(), "A is loaded: it stays");
    assert!(!Path::new(&b).exists(), "B, not loaded, went for C");
    assert!(Path::new(&c).is_dir(), "C was just fetched");
    assert_eq!(cache.downloads(), 3);

    // Once A's actor is gone, A is the least recently used and goes for B.
    drop(loaded_a);
    let b_again = fetch(&specs[1]);
    assert_eq!(cache.downloads(), 4, "B was fetched again");
    assert!(!Path::new(&a).exists(), "A went");
    assert!(Path::new(&b_again).is_dir() && Path::new(&c).is_dir());
    assert_eq!(cache_entries(cache_dir.path()).len(), 2, "two models fit");
}

#[test]
fn the_model_cache_downloads_once_checks_every_byte_and_refuses_changed_models() {
    init_logging();
    let server = S3Server::start(&["models"]);
    let pushed = push(&server, &minilm_dir(), "s3://models/minilm/");
    let digest = minilm_digest();
    assert!(pushed.contains(&digest), "push prints the digest: {pushed}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let cache_dir = tempfile::tempdir().unwrap();
    let config = ModelCacheConfig {
        dir: cache_dir.path().to_owned(),
        s3: server.options(),
        max_bytes: None,
    };
    let spec = "s3://models/minilm/";
    let entry = cache_dir.path().join(format!("sha256-{digest}"));

    // Six actors start at once: one download, every one gets the checked copy.
    let cache = Arc::new(ModelCache::new(config.clone()));
    let dirs = resolve_together(&cache, spec, 6);
    for dir in &dirs {
        assert_eq!(dir.as_deref(), Ok(entry.to_str().unwrap()));
    }
    assert_eq!(cache.downloads(), 1);
    assert_eq!(
        cache_entries(cache_dir.path()),
        [format!("sha256-{digest}")]
    );
    ModelManifest::parse(&std::fs::read(entry.join(MANIFEST_FILE)).unwrap())
        .unwrap()
        .verify_dir(&entry)
        .unwrap();

    // A restarted agent loads from disk, pinned or not, without asking S3 when pinned.
    let restarted = Arc::new(ModelCache::new(config.clone()));
    assert_eq!(
        restarted.local_dir(spec, Some(&digest)).unwrap(),
        entry.to_str().unwrap()
    );
    assert_eq!(
        restarted.local_dir(spec, None).unwrap(),
        entry.to_str().unwrap()
    );
    assert_eq!(restarted.downloads(), 0);

    // A damaged copy on disk is noticed by the next process and fetched again.
    let weights = entry.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    bytes[4096] ^= 0xff;
    std::fs::write(&weights, &bytes).unwrap();
    let after_damage = Arc::new(ModelCache::new(config.clone()));
    after_damage.local_dir(spec, None).unwrap();
    assert_eq!(after_damage.downloads(), 1);
    ModelManifest::of_dir(&entry).unwrap();
    assert_eq!(
        ModelManifest::parse(&std::fs::read(entry.join(MANIFEST_FILE)).unwrap())
            .unwrap()
            .digest(),
        digest
    );

    // A job pinned to other content refuses what the prefix holds now.
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = ModelCache::new(ModelCacheConfig {
        dir: fresh_dir.path().to_owned(),
        s3: server.options(),
        max_bytes: None,
    });
    let other = "0".repeat(64);
    let error = fresh.local_dir(spec, Some(&other)).unwrap_err().to_string();
    assert!(error.contains("changed since the job pinned it"), "{error}");
    // A pin names a cache directory: only a digest may.
    let error = fresh
        .local_dir(spec, Some("../../escape"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("64-hex digest"), "{error}");

    // No manifest at the prefix: say how to push one.
    let error = fresh
        .local_dir("s3://models/nothing-here/", None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("resident model push"), "{error}");

    // An object changed behind the manifest's back: refused, nothing half-made kept.
    let object = server.data_dir.path().join("models/minilm/tokenizer.json");
    let mut tokenizer = std::fs::read(&object).unwrap();
    tokenizer.extend_from_slice(b" ");
    std::fs::write(&object, &tokenizer).unwrap();
    let error = fresh.local_dir(spec, None).unwrap_err().to_string();
    assert!(
        error.contains("tokenizer.json") && error.contains("does not match the model manifest"),
        "{error}"
    );
    assert_eq!(cache_entries(fresh_dir.path()), Vec::<String>::new());
    assert_eq!(leftovers(fresh_dir.path()), Vec::<String>::new());
    assert_eq!(fresh.downloads(), 0);
}

/// A scheduler and two [`spawn_caching_agent`]s, `node-a` and `node-b`, once both joined.
struct CachingCluster {
    url: String,
    agents: [LoggedAgent; 2],
    _scheduler: Proc,
    _state: tempfile::TempDir,
}

impl CachingCluster {
    fn start(server: &S3Server, dir: &Path) -> Self {
        let state = tempfile::tempdir().unwrap();
        let (scheduler, url) = spawn_scheduler(resident_tests::free_port(), state.path());
        let agents = [
            spawn_caching_agent(&url, "node-a", server, dir),
            spawn_caching_agent(&url, "node-b", server, dir),
        ];
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            resident_sdk::Cluster::connect(&url)
                .await
                .unwrap()
                .wait_for_nodes(2, Duration::from_secs(10))
                .await
                .unwrap();
        });
        Self {
            url,
            agents,
            _scheduler: scheduler,
            _state: state,
        }
    }
}

struct LoggedAgent {
    _process: Proc,
    log: PathBuf,
    cache: PathBuf,
}

/// An agent process (two simulated T4s) with its own model cache, logging at info into a
/// file. It reads models only from the repository's `models/` and its cache, and datasets
/// only from an empty directory and its cache: nothing of the client's.
fn spawn_caching_agent(url: &str, node_id: &str, server: &S3Server, dir: &Path) -> LoggedAgent {
    let cache = dir.join(format!("{node_id}-cache"));
    let log = dir.join(format!("{node_id}.log"));
    let no_data = dir.join(format!("{node_id}-no-data"));
    std::fs::create_dir_all(&no_data).unwrap();
    let extra = [
        "--model-cache".into(),
        cache.clone().into_os_string(),
        "--model-root".into(),
        resident_tests::repo_root().join("models").into_os_string(),
        "--data-root".into(),
        no_data.into_os_string(),
    ];
    let child = agent_command(url, node_id, "T4:16GiB x2", "", &extra)
        .envs(server.env())
        .env("RESIDENT_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn agent");
    LoggedAgent {
        _process: Proc::new(node_id, child),
        log,
        cache,
    }
}

/// `resident embed` on the cluster with `actors` (each on a whole simulated GPU, or on CPU
/// with `gpus` 0).
fn embed(
    url: &str,
    server: &S3Server,
    model: &str,
    (actors, gpus): (u32, u32),
    input: &Path,
    output: &Path,
) -> serde_json::Value {
    let finished = Command::new(resident_bin())
        .args(["embed", "--cluster", url, "--model", model])
        .args(["--replicas", &actors.to_string()])
        .args(["--gpus-per-actor", &gpus.to_string()])
        .args(["--chunk-size", "20", "--input"])
        .arg(input)
        .arg("--output")
        .arg(output)
        .envs(server.env())
        .env("RESIDENT_LOG", "warn")
        .output()
        .expect("run resident embed");
    assert!(
        finished.status.success(),
        "embed --model {model} failed: {}",
        String::from_utf8_lossy(&finished.stderr)
    );
    read_json(&output.join("report.json"))
}

#[test]
fn an_embed_job_runs_on_a_model_given_as_s3_with_one_download_per_node() {
    init_logging();
    let server = S3Server::start(&["models"]);
    push(&server, &minilm_dir(), "s3://models/minilm/");
    let digest = minilm_digest();
    let dir = tempfile::tempdir().unwrap();
    let cluster = CachingCluster::start(&server, dir.path());
    let (url, agents) = (&cluster.url, &cluster.agents);
    let input = sample(dir.path(), 120);

    // Four actors on a GPU each: two on each node, all loading the model from S3.
    let from_s3 = dir.path().join("from-s3");
    let report = embed(
        url,
        &server,
        "s3://models/minilm/",
        (4, 1),
        &input,
        &from_s3,
    );
    assert_eq!(report["model_fingerprint"], digest.as_str(), "{report}");
    for agent in agents {
        let log = std::fs::read_to_string(&agent.log).unwrap();
        assert_eq!(
            log.matches("downloading model").count(),
            1,
            "one download on this node: {log}"
        );
        assert_eq!(cache_entries(&agent.cache), [format!("sha256-{digest}")]);
    }

    // The same model from disk (a CPU actor: the first job's pool holds every GPU): the
    // same fingerprint and the same vectors.
    let from_disk = dir.path().join("from-disk");
    let disk_report = embed(url, &server, &minilm_dir(), (1, 0), &input, &from_disk);
    assert_eq!(disk_report["model_fingerprint"], digest.as_str());
    let vectors = |dir: &Path| parse_npy_f32(&std::fs::read(dir.join("embeddings.npy")).unwrap());
    let (shape, s3_values) = vectors(&from_s3);
    assert_eq!(shape, [120, 384]);
    assert_eq!(vectors(&from_disk).1, s3_values);
}

#[test]
fn a_sweep_reaches_agents_through_s3_without_a_shared_filesystem() {
    init_logging();
    let server = S3Server::start(&["sweeps"]);
    let dir = tempfile::tempdir().unwrap();
    let cluster = CachingCluster::start(&server, dir.path());
    let (url, agents) = (&cluster.url, &cluster.agents);
    let data = dir.path().join("wiki.jsonl");
    std::fs::write(
        &data,
        resident_tests::wiki_sample_lines(200).join("\n") + "\n",
    )
    .unwrap();
    let output = dir.path().join("sweep-out");
    let config = dir.path().join("sweep.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"s3\"\nmodel = \"{}\"\nreplicas = 2\ngpus_per_actor = 2\n\
             data = \"{}\"\noutput = \"{}\"\nmode = \"max\"\ntrial = \"classifier\"\n\
             metric = \"accuracy\"\n[search]\nalgorithm = \"grid\"\n[scheduler]\nkind = \"fifo\"\n\
             max_epochs = 3\n[space]\nlr = {{ grid = [0.01, 0.03] }}\nhidden = {{ grid = [0, 32] }}\n",
            minilm_dir(),
            data.display(),
            output.display()
        ),
    )
    .unwrap();
    let finished = Command::new(resident_bin())
        .args([
            "sweep",
            "--cluster",
            url,
            "--cache",
            "s3://sweeps/cache/",
            "--config",
        ])
        .arg(&config)
        .envs(server.env())
        .env("RESIDENT_LOG", "warn")
        .output()
        .expect("run resident sweep");
    let stderr = String::from_utf8_lossy(&finished.stderr);
    assert!(finished.status.success(), "sweep failed: {stderr}");
    let results = resident_jobs::sweep::load_results(&output);
    assert_eq!(results.len(), 4);
    assert!(
        results.iter().all(|r| r.error.is_none() && r.epochs == 3),
        "{results:?}"
    );
    // The dataset went through the bucket, and each node (one actor on each: an actor takes
    // both of a node's GPUs) fetched it once.
    let objects: Vec<String> = std::fs::read_dir(server.data_dir.path().join("sweeps/cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        objects.len() == 1 && objects[0].ends_with(".dataset"),
        "{objects:?}"
    );

    // Without the bucket the agents cannot reach the client's dataset (other data, so the
    // actors hold no copy of it), and say so.
    std::fs::write(
        &data,
        resident_tests::wiki_sample_lines(150).join("\n") + "\n",
    )
    .unwrap();
    let elsewhere = dir.path().join("sweep-no-cache");
    let finished = Command::new(resident_bin())
        .args(["sweep", "--cluster", url, "--output"])
        .arg(&elsewhere)
        .arg("--config")
        .arg(&config)
        .envs(server.env())
        .env("RESIDENT_LOG", "warn")
        .output()
        .expect("run resident sweep");
    let failed = resident_jobs::sweep::load_results(&elsewhere);
    let error = failed
        .first()
        .and_then(|r| r.error.clone())
        .unwrap_or_default();
    assert!(
        error.contains("outside this agent's dataset roots") && error.contains("--cache s3://"),
        "status {:?}, first error: {error}; {}",
        finished.status,
        String::from_utf8_lossy(&finished.stderr)
    );
    for agent in agents {
        let log = std::fs::read_to_string(&agent.log).unwrap();
        assert_eq!(
            log.matches("sweep dataset downloaded and checked").count(),
            1,
            "{log}"
        );
    }
}

/// `resident embed` in local mode with the Hugging Face hub unreachable (a closed port) and
/// `HF_HOME` at `hf_home`; returns whether it succeeded and its stderr.
fn embed_offline_hub(model: &str, hf_home: &Path, dir: &Path, name: &str) -> (bool, String) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let input = sample(dir, 20);
    let finished = Command::new(resident_bin())
        .args(["embed", "--model", model, "--input"])
        .arg(&input)
        .arg("--output")
        .arg(dir.join(name))
        .env("HF_HOME", hf_home)
        .env_remove("HF_HUB_CACHE")
        .env("HF_ENDPOINT", endpoint)
        .env("XDG_CACHE_HOME", dir.join("xdg"))
        .env("RESIDENT_LOG", "warn")
        .output()
        .expect("run resident embed");
    (
        finished.status.success(),
        String::from_utf8_lossy(&finished.stderr).into_owned(),
    )
}

#[test]
fn a_hugging_face_id_is_pinned_to_a_commit_and_loaded_from_the_hub_cache() {
    let dir = tempfile::tempdir().unwrap();
    let repo = "sentence-transformers/all-MiniLM-L6-v2";
    let commit = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf";
    // A hub cache as huggingface_hub lays it out, holding the fixture model at one commit.
    let hf_home = dir.path().join("hf");
    let root = hf_home.join("hub/models--sentence-transformers--all-MiniLM-L6-v2");
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), commit).unwrap();
    let snapshot = root.join("snapshots").join(commit);
    let fixture = minilm_dir();
    for file in ModelManifest::of_dir(Path::new(&fixture)).unwrap().files {
        let to = snapshot.join(&file.path);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(Path::new(&fixture).join(&file.path), to).unwrap();
    }

    // Unpinned, with the hub out of reach: the client pins `main` through its hub cache,
    // and the agent loads that commit from the node's hub cache.
    let (ok, stderr) = embed_offline_hub(repo, &hf_home, dir.path(), "pinned-by-cache");
    assert!(ok, "{stderr}");
    let manifest = read_json(&dir.path().join("pinned-by-cache/manifest.json"));
    let expected = resident_jobs::files::sha256_hex(format!("hf:{repo}@{commit}").as_bytes());
    assert_eq!(manifest["model_fingerprint"], expected.as_str());

    // A commit this node does not hold, and no hub: the agent says how to get the model.
    let other = "0123456789abcdef0123456789abcdef01234567";
    let (ok, stderr) = embed_offline_hub(
        &format!("{repo}@{other}"),
        &hf_home,
        dir.path(),
        "other-commit",
    );
    assert!(!ok);
    assert!(
        stderr.contains("cannot fetch") && stderr.contains("resident model push"),
        "{stderr}"
    );

    // A branch with no hub and no cache cannot be pinned: refused before any actor starts.
    let empty = dir.path().join("empty-hf");
    std::fs::create_dir_all(&empty).unwrap();
    let (ok, stderr) = embed_offline_hub(repo, &empty, dir.path(), "unpinnable");
    assert!(!ok);
    assert!(
        stderr.contains(&format!("cannot pin {repo}@main")) && stderr.contains("40-hex commit"),
        "{stderr}"
    );
}
