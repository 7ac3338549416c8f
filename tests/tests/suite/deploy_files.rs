//! `deploy/` cannot drift from the binary. Both kustomize overlays render with kubectl and
//! pass `kubernetes-validate --strict` on Kubernetes 1.30 and 1.33; the Dockerfiles are
//! clean under hadolint; the systemd units carry their hardening. Then the scheduler and
//! agent command lines are read out of the rendered manifests and the systemd units, run
//! against each other (paths, ports and host names rewritten to a temporary root on
//! loopback, TLS and tokens on) and the agent must join, with the labels it was given, and
//! answer the probes the manifests declare.
//!
//! The tools come from PyPI into target/deploy-venv (`scripts/install-deploy-tools.sh`,
//! which the test command runs).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use resident_tests::secure::SecureSetup;
use resident_tests::{Proc, free_port, init_logging, repo_root, resident_bin, wait_until};
use serde_json::Value;

const OVERLAYS: &[&str] = &["eks", "onprem"];
const KUBERNETES_VERSIONS: &[&str] = &["1.30.0", "1.33.0"];

fn tool(name: &str) -> PathBuf {
    let path = repo_root().join("target/deploy-venv/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/install-deploy-tools.sh (the test command does)",
        path.display()
    );
    path
}

fn run_ok(command: &mut Command) -> String {
    let output = command.output().expect("run tool");
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `kubectl kustomize` of an overlay, as YAML.
fn render_yaml(overlay: &str) -> String {
    run_ok(
        Command::new(tool("kubectl"))
            .arg("kustomize")
            .arg(repo_root().join("deploy/k8s/overlays").join(overlay)),
    )
}

/// The rendered objects of an overlay, as JSON.
fn render(overlay: &str) -> Vec<Value> {
    let yaml = render_yaml(overlay);
    let mut python = Command::new(tool("python"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    python
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let output = python.wait_with_output().unwrap();
    assert!(output.status.success());
    serde_json::from_slice(&output.stdout).unwrap()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered overlay"))
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

#[test]
fn both_overlays_render_and_pass_strict_validation_on_kubernetes_1_30_and_1_33() {
    let dir = tempfile::tempdir().unwrap();
    for overlay in OVERLAYS {
        let path = dir.path().join(format!("{overlay}.yaml"));
        std::fs::write(&path, render_yaml(overlay)).unwrap();
        for version in KUBERNETES_VERSIONS {
            let output = run_ok(
                Command::new(tool("kubernetes-validate"))
                    .args(["--strict", "--no-warn", "-k", version])
                    .arg(&path),
            );
            assert!(
                !output.contains("ERROR"),
                "{overlay} on {version}: {output}"
            );
        }
        let objects = render(overlay);
        let scheduler = object(&objects, "StatefulSet", "resident-scheduler");
        let pod = &scheduler["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{overlay}");
        let main = container(scheduler, "scheduler");
        assert_eq!(main["securityContext"]["readOnlyRootFilesystem"], true);
        assert!(main["resources"]["requests"].is_object());
        for probe in ["readinessProbe", "livenessProbe"] {
            assert!(
                main[probe]["grpc"].is_object(),
                "{overlay}: {probe} is gRPC"
            );
        }
        let storage_class =
            &scheduler["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"];
        assert!(storage_class.is_string(), "{overlay}: a storage class");
        object(&objects, "PodDisruptionBudget", "resident-scheduler");
        let agent = object(&objects, "DaemonSet", "resident-agent");
        let agent_pod = &agent["spec"]["template"]["spec"];
        assert_eq!(agent_pod["securityContext"]["runAsNonRoot"], true);
        assert!(
            agent_pod["tolerations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["key"] == "nvidia.com/gpu"),
            "{overlay}: tolerates the GPU taint"
        );
        let limits = &container(agent, "agent")["resources"]["limits"];
        assert!(
            limits.get("nvidia.com/gpu").is_none(),
            "{overlay}: the agent sees every GPU through the NVIDIA runtime, not a count"
        );
        for image in objects
            .iter()
            .filter_map(|o| o["spec"]["template"]["spec"]["containers"].as_array())
            .flatten()
            .map(|c| c["image"].as_str().unwrap())
        {
            assert!(image.contains(':') && image.contains('/'), "{image}");
        }
    }
    // EKS: instance types pick the GPU nodes (no GPU Feature Discovery label), the NLB exists.
    let eks = render("eks");
    let agent = object(&eks, "DaemonSet", "resident-agent");
    let affinity = agent["spec"]["template"]["spec"]["affinity"].to_string();
    assert!(
        affinity.contains("node.kubernetes.io/instance-type"),
        "{affinity}"
    );
    assert_eq!(
        object(&eks, "Service", "resident-scheduler-nlb")["spec"]["type"],
        "LoadBalancer"
    );
}

#[test]
fn the_dockerfiles_are_clean_under_hadolint() {
    for file in [
        "Dockerfile.cpu",
        "Dockerfile.cuda",
        "Dockerfile.custom-agent",
    ] {
        let path = repo_root().join("deploy/docker").join(file);
        run_ok(
            Command::new(tool("hadolint"))
                .args(["--failure-threshold", "error"])
                .arg(&path),
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.matches("\nFROM ").count() >= 2,
            "{file} is multi-stage"
        );
        assert!(
            text.contains("\nUSER 10001"),
            "{file} runs as a non-root user"
        );
        assert!(text.contains("\nHEALTHCHECK "), "{file} has a health check");
    }
}

/// `Key=value` lines of a unit's `[Service]` section (repeated keys kept in order).
fn service_section(unit: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join("deploy/systemd").join(unit)).unwrap();
    let mut in_service = false;
    let mut pairs = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service
            && !line.starts_with('#')
            && let Some((key, value)) = line.split_once('=')
        {
            pairs.push((key.to_owned(), value.to_owned()));
        }
    }
    pairs
}

#[test]
fn the_systemd_units_carry_the_hardening() {
    for role in ["scheduler", "agent"] {
        let unit = format!("resident-{role}.service");
        let service = service_section(&unit);
        let get = |key: &str| {
            service
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{unit} has no {key}="))
        };
        assert_eq!(get("User"), "resident");
        assert_eq!(get("NoNewPrivileges"), "yes");
        assert_eq!(get("ProtectSystem"), "strict");
        assert_eq!(get("PrivateTmp"), "yes");
        assert_eq!(get("Restart"), "always");
        assert!(get("StateDirectory").starts_with("resident/"));
        assert_eq!(get("EnvironmentFile"), format!("/etc/resident/{role}.env"));
        assert!(
            repo_root()
                .join(format!("deploy/systemd/{role}.env"))
                .exists()
        );
    }
    // The agent drains on stop; systemd must wait longer than the drain.
    let agent = service_section("resident-agent.service");
    let stop: u64 = agent
        .iter()
        .find(|(k, _)| k == "TimeoutStopSec")
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(stop > 90, "TimeoutStopSec {stop} exceeds the 90s drain");
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let output = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args(
                ["resident-scheduler.service", "resident-agent.service"]
                    .map(|u| repo_root().join("deploy/systemd").join(u)),
            )
            .env("SYSTEMD_LOG_LEVEL", "err")
            .output()
            .unwrap();
        let complaints = String::from_utf8_lossy(&output.stderr);
        // The binary is not installed here; anything else is a unit error.
        let real: Vec<&str> = complaints
            .lines()
            .filter(|l| !l.contains("/usr/local/bin/resident is not executable"))
            .collect();
        assert!(real.is_empty(), "{}", real.join("\n"));
    }
}

#[test]
fn install_sh_lays_out_units_and_env_files() {
    let root = tempfile::tempdir().unwrap();
    for role in ["scheduler", "agent"] {
        run_ok(
            Command::new(repo_root().join("deploy/systemd/install.sh"))
                .arg(role)
                .arg("--binary")
                .arg(resident_bin())
                .arg("--root")
                .arg(root.path())
                .args(["--token", "rsd_test"]),
        );
        let env =
            std::fs::read_to_string(root.path().join(format!("etc/resident/{role}.env"))).unwrap();
        assert!(!env.contains('@'), "placeholders filled: {env}");
        assert!(
            root.path()
                .join(format!("etc/systemd/system/resident-{role}.service"))
                .exists()
        );
    }
    let agent_env = std::fs::read_to_string(root.path().join("etc/resident/agent.env")).unwrap();
    assert!(agent_env.contains("RESIDENT_TOKEN=rsd_test"), "{agent_env}");
    assert!(root.path().join("usr/local/bin/resident").exists());
    // A second run keeps an edited env file.
    std::fs::write(root.path().join("etc/resident/agent.env"), "EDITED=1\n").unwrap();
    run_ok(
        Command::new(repo_root().join("deploy/systemd/install.sh"))
            .arg("agent")
            .arg("--binary")
            .arg(resident_bin())
            .arg("--root")
            .arg(root.path()),
    );
    assert_eq!(
        std::fs::read_to_string(root.path().join("etc/resident/agent.env")).unwrap(),
        "EDITED=1\n"
    );
}

/// Where deployed paths, ports and names land in the test: a temporary root and loopback.
#[derive(Clone)]
struct Rewrite {
    root: PathBuf,
    api_port: u16,
    health_port: u16,
    http_port: u16,
}

impl Rewrite {
    /// Fresh loopback ports under `root`.
    fn new(root: &std::path::Path) -> Self {
        Self {
            root: root.to_owned(),
            api_port: free_port(),
            health_port: free_port(),
            http_port: free_port(),
        }
    }

    /// For another process beside this one: the same root and scheduler, its own health port.
    fn another_process(&self) -> Self {
        Self {
            health_port: free_port(),
            ..self.clone()
        }
    }

    fn apply(&self, text: &str) -> String {
        let root = self.root.display().to_string();
        let api = format!("127.0.0.1:{}", self.api_port);
        let mut text = text
            .replace(
                "/usr/local/bin/resident",
                &resident_bin().display().to_string(),
            )
            .replace(
                "https://resident-scheduler.resident.svc:50051",
                &format!("https://{api}"),
            )
            .replace(
                "https://resident.example.internal:50051",
                &format!("https://{api}"),
            )
            .replace("0.0.0.0:50051", &api)
            .replace("0.0.0.0:8080", &format!("127.0.0.1:{}", self.http_port));
        for prefix in [
            "/etc/resident/",
            "/var/lib/resident/",
            "/var/cache/resident/",
        ] {
            text = text.replace(prefix, &format!("{root}{prefix}"));
        }
        for health in ["0.0.0.0:8081", "127.0.0.1:8081", "127.0.0.1:8082"] {
            text = text.replace(health, &format!("127.0.0.1:{}", self.health_port));
        }
        text
    }
}

/// A test root with what the Secrets and files of `deploy/` hold: TLS, auth file, CA, the
/// labels file the agent's init container writes, and the state and model directories.
fn deployed_root(setup: &SecureSetup) -> PathBuf {
    let root = setup.dir.path().join("root");
    let pki = setup.pki();
    let files: &[(&str, PathBuf)] = &[
        ("etc/resident/tls/tls.crt", pki.join("scheduler.pem")),
        ("etc/resident/tls/tls.key", pki.join("scheduler-key.pem")),
        ("etc/resident/pki/scheduler.pem", pki.join("scheduler.pem")),
        (
            "etc/resident/pki/scheduler-key.pem",
            pki.join("scheduler-key.pem"),
        ),
        ("etc/resident/auth/auth.toml", setup.auth_file()),
        ("etc/resident/auth.toml", setup.auth_file()),
        ("etc/resident/ca/ca.pem", setup.ca()),
        ("etc/resident/ca.pem", setup.ca()),
    ];
    for (to, from) in files {
        let to = root.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
    std::fs::create_dir_all(root.join("etc/resident/labels")).unwrap();
    // What the node-labels init container writes for a node without a pool label.
    std::fs::write(
        root.join("etc/resident/labels/labels"),
        "zone=us-east-1b\ninstance_type=g5.xlarge\npool=\n",
    )
    .unwrap();
    for dir in [
        "var/lib/resident/state",
        "var/lib/resident/models",
        "var/lib/resident/scheduler",
        "var/cache/resident/models",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    root
}

/// A container of a rendered workload as a command: its args and env, rewritten.
fn container_command(container: &Value, rewrite: &Rewrite, setup: &SecureSetup) -> Command {
    let mut command = Command::new(resident_bin());
    for arg in container["args"].as_array().unwrap() {
        command.arg(rewrite.apply(arg.as_str().unwrap()));
    }
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap());
    for env in container["env"].as_array().into_iter().flatten() {
        let name = env["name"].as_str().unwrap();
        let value = if let Some(value) = env["value"].as_str() {
            rewrite.apply(value)
        } else if env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName" {
            "drift-node".to_owned()
        } else if env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            "drift-burst-pod".to_owned()
        } else if env["valueFrom"]["secretKeyRef"]["name"] == "resident-agent-token" {
            setup.token("drift-agent").to_owned()
        } else {
            panic!("an env source this test does not know: {env}")
        };
        command.env(name, value);
    }
    command
}

/// The port a gRPC probe asks, and its service.
fn grpc_probe(container: &Value, probe: &str) -> (u16, String) {
    let grpc = &container[probe]["grpc"];
    (
        grpc["port"].as_u64().unwrap() as u16,
        grpc["service"].as_str().unwrap_or_default().to_owned(),
    )
}

fn health_ok(port: u16, service: &str) -> bool {
    Command::new(resident_bin())
        .args([
            "health",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--service",
            service,
        ])
        .env_remove("RESIDENT_HEALTH_LISTEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn spawn(name: &str, mut command: Command) -> Proc {
    let child = command
        .env("RESIDENT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    Proc::new(name, child)
}

/// Waits for the agent `drift-node` to join, and returns its labels.
async fn joined_labels(setup: &SecureSetup, api_port: u16) -> BTreeMap<String, String> {
    let url = format!("https://127.0.0.1:{api_port}");
    let cluster = wait_until("the scheduler answers", Duration::from_secs(20), || async {
        setup.connect_as(&url, "ops").await.ok()
    })
    .await;
    cluster
        .wait_for_nodes(1, Duration::from_secs(20))
        .await
        .expect("the deployed agent joins the deployed scheduler");
    let nodes = cluster.list_nodes().await.unwrap();
    assert_eq!(nodes[0].node_id.as_str(), "drift-node");
    nodes[0].labels.clone()
}

async fn wait_healthy(port: u16, service: &str) {
    let service = service.to_owned();
    wait_until(
        &format!("health of `{service}` on {port}"),
        Duration::from_secs(20),
        || {
            let ok = health_ok(port, &service);
            async move { ok.then_some(()) }
        },
    )
    .await
}

fn setup() -> SecureSetup {
    init_logging();
    SecureSetup::new(&[("ops", "admin"), ("drift-agent", "agent")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_manifests_command_lines_run_and_the_agent_joins() {
    for overlay in OVERLAYS {
        let setup = setup();
        let root = deployed_root(&setup);
        let objects = render(overlay);
        let scheduler = container(
            object(&objects, "StatefulSet", "resident-scheduler"),
            "scheduler",
        );
        let agent = container(object(&objects, "DaemonSet", "resident-agent"), "agent");
        let scheduler_rewrite = Rewrite::new(&root);
        let agent_rewrite = scheduler_rewrite.another_process();
        let _scheduler = spawn(
            "scheduler",
            container_command(scheduler, &scheduler_rewrite, &setup),
        );
        let _agent = spawn("agent", container_command(agent, &agent_rewrite, &setup));
        let labels = joined_labels(&setup, scheduler_rewrite.api_port).await;
        assert_eq!(
            labels.get("zone").map(String::as_str),
            Some("us-east-1b"),
            "{labels:?}"
        );
        assert_eq!(
            labels.get("instance_type").map(String::as_str),
            Some("g5.xlarge")
        );
        assert!(
            !labels.contains_key("pool"),
            "an empty node label is dropped: {labels:?}"
        );

        // The probes the manifests declare ask ports and services the binary serves.
        for (workload, rewrite) in [(scheduler, &scheduler_rewrite), (agent, &agent_rewrite)] {
            for probe in ["readinessProbe", "livenessProbe"] {
                let (port, service) = grpc_probe(workload, probe);
                assert_eq!(port, 8081, "{overlay} {probe}: the health port of the args");
                wait_healthy(rewrite.health_port, &service).await;
            }
        }
        if *overlay == "eks" {
            keda_reads_the_schedulers_demand(&objects, &scheduler_rewrite, &setup);
            // The autoscaled agents' command line joins too, with its node-group label.
            let burst = container(
                object(&objects, "Deployment", "resident-agent-burst"),
                "agent",
            );
            let burst_rewrite = scheduler_rewrite.another_process();
            let _burst = spawn(
                "burst agent",
                container_command(burst, &burst_rewrite, &setup),
            );
            let url = format!("https://127.0.0.1:{}", scheduler_rewrite.api_port);
            let cluster = setup.connect_as(&url, "ops").await.unwrap();
            cluster
                .wait_for_nodes(2, Duration::from_secs(20))
                .await
                .unwrap();
            let nodes = cluster.list_nodes().await.unwrap();
            let burst_node = nodes
                .iter()
                .find(|n| n.node_id.as_str() == "drift-burst-pod")
                .expect("the burst agent joined under its pod name");
            // KEDA counts the GPUs on the nodes its query selects: the burst agents' own.
            let trigger_url = object(&objects, "ScaledObject", "resident-agent-burst")["spec"]
                ["triggers"][0]["metadata"]["url"]
                .as_str()
                .unwrap();
            let selector = trigger_url
                .split("node_labels=")
                .nth(1)
                .expect("a node selector");
            for pair in selector.split(',') {
                let (key, value) = pair.split_once('=').unwrap();
                assert_eq!(burst_node.labels.get(key).map(String::as_str), Some(value));
            }
            let (port, service) = grpc_probe(burst, "readinessProbe");
            assert_eq!(port, 8081);
            wait_healthy(burst_rewrite.health_port, &service).await;
        }
    }
}

/// The EKS autoscaler's trigger asks the scheduler's HTTP port for a field `/v1/demand`
/// has, and scales the Deployment that exists.
fn keda_reads_the_schedulers_demand(objects: &[Value], rewrite: &Rewrite, setup: &SecureSetup) {
    let scaled = object(objects, "ScaledObject", "resident-agent-burst");
    let target = scaled["spec"]["scaleTargetRef"]["name"].as_str().unwrap();
    object(objects, "Deployment", target);
    assert_eq!(scaled["spec"]["minReplicaCount"], 0, "scales to zero");
    let trigger = &scaled["spec"]["triggers"][0]["metadata"];
    let url = trigger["url"].as_str().unwrap();
    let path = url
        .strip_prefix("https://resident-scheduler.resident.svc:8080")
        .unwrap_or_else(|| panic!("{url}: the scheduler's HTTP port, over TLS"));
    let (status, body) = resident_tests::https_get(
        &format!("https://127.0.0.1:{}{path}", rewrite.http_port),
        &setup.ca(),
        Some(setup.token("ops")),
    );
    assert_eq!(status, 200, "{body}");
    let demand: Value = serde_json::from_str(&body).unwrap();
    let field = trigger["valueLocation"].as_str().unwrap();
    assert!(demand[field].is_number(), "{field} in {demand}");
}

/// A unit's command line and environment (its env file as `install.sh` writes it), rewritten.
fn unit_command(role: &str, rewrite: &Rewrite, setup: &SecureSetup) -> Command {
    let service = service_section(&format!("resident-{role}.service"));
    let exec = &service.iter().find(|(k, _)| k == "ExecStart").unwrap().1;
    let words: Vec<String> = rewrite
        .apply(exec)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let mut command = Command::new(&words[0]);
    command.args(&words[1..]);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap());
    let env_file = std::fs::read_to_string(repo_root().join(format!("deploy/systemd/{role}.env")))
        .unwrap()
        .replace("@HOSTNAME@", "drift-node")
        .replace("@AGENT_TOKEN@", setup.token("drift-agent"));
    // Environment= first, then the env file, which wins (as in systemd).
    let unit_env = service
        .iter()
        .filter(|(k, _)| k == "Environment")
        .map(|(_, v)| v.clone());
    let file_env = env_file
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains('='))
        .map(str::to_owned);
    for line in unit_env.chain(file_env) {
        let (name, value) = line.split_once('=').unwrap();
        command.env(name, rewrite.apply(value));
    }
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_units_command_lines_run_and_the_agent_joins() {
    let setup = setup();
    let root = deployed_root(&setup);
    std::fs::write(root.join("etc/resident/labels/labels"), "").unwrap();
    let scheduler_rewrite = Rewrite::new(&root);
    let agent_rewrite = scheduler_rewrite.another_process();
    let _scheduler = spawn(
        "scheduler",
        unit_command("scheduler", &scheduler_rewrite, &setup),
    );
    let _agent = spawn("agent", unit_command("agent", &agent_rewrite, &setup));
    let labels = joined_labels(&setup, scheduler_rewrite.api_port).await;
    assert_eq!(
        labels.get("pool").map(String::as_str),
        Some("onprem-a6000"),
        "{labels:?}"
    );
    wait_healthy(
        scheduler_rewrite.health_port,
        "resident.v1.SchedulerService",
    )
    .await;
    wait_healthy(agent_rewrite.health_port, "resident.v1.NodeAgentService").await;
    assert!(
        root.join("var/lib/resident/scheduler")
            .read_dir()
            .unwrap()
            .next()
            .is_some(),
        "the scheduler keeps its state in its StateDirectory"
    );
}
