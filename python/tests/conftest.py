"""Shared paths and clusters for the package's tests: real processes, real models
(scripts/fetch-model.sh), the real `resident` binary (cargo build --release)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# A test command started in the background of a script (`cmd &`, nohup, some CI runners)
# inherits SIGINT as ignored, every child inherits that too, and CPython installs no
# KeyboardInterrupt handler when it starts with SIGINT ignored: the Ctrl-C tests' children
# would never hear their SIGINT. A handled signal is reset to its default in a child at exec,
# so catching it here gives every child the disposition a terminal gives it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[2]
RESIDENT_BIN = Path(os.environ.get("RESIDENT_BIN", REPO / "target" / "release" / "resident"))
MINILM = REPO / "models" / "all-MiniLM-L6-v2"
SMOLLM2 = REPO / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WIKI = REPO / "data" / "wiki_vital.jsonl"


def wiki_texts(count: int) -> list[dict]:
    """The first `count` Wikipedia leads as `{id, text}` records."""
    records = []
    with open(WIKI) as f:
        for line in f:
            if len(records) == count:
                break
            record = json.loads(line)
            records.append({"id": record["id"], "text": record["text"]})
    return records


def write_corpus(path: Path, records: list[dict]) -> Path:
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return path


def resident(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Runs the `resident` binary, checking it succeeded."""
    return subprocess.run([str(RESIDENT_BIN), *args], check=True, capture_output=True, text=True, **kwargs)


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a port bind(0) gives comes from
    that range, where any outgoing connection may take it before the process we start binds it
    (tests/src/ports.rs does the same for the Rust tests)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lowest_ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lowest_ephemeral = 0
    if lowest_ephemeral >= 17_000:
        for _ in range(1_000):
            port = random.randrange(15_000, lowest_ephemeral)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def local_cluster():
    import resident

    return resident.local()


class SecureCluster:
    """`resident certs init`, tokens of three roles, a TLS scheduler with them and an agent
    (real processes)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="resident-py-"))
        self.pki = self.dir / "pki"
        self.auth = self.dir / "auth.toml"
        resident("certs", "init", "--out", str(self.pki), "--san", "127.0.0.1")
        self.tokens = {}
        for name, role in (("alice", "submit"), ("auditor", "read"), ("node", "agent")):
            out = resident("token", "create", "--auth-file", str(self.auth), "--name", name, "--role", role)
            self.tokens[name] = out.stdout.strip().splitlines()[-1]
        self.scheduler = subprocess.Popen(
            [
                str(RESIDENT_BIN), "scheduler", "--listen", "127.0.0.1:0",
                "--state-dir", str(self.dir / "state"),
                "--tls-cert", str(self.pki / "scheduler.pem"),
                "--tls-key", str(self.pki / "scheduler-key.pem"),
                "--auth-file", str(self.auth),
            ],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "RESIDENT_LOG": "warn"},
        )
        self.url = self.scheduler.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert self.url.startswith("https://"), self.url
        self.agent = subprocess.Popen(
            [
                str(RESIDENT_BIN), "agent", "--scheduler", self.url, "--node-id", "py-node",
                "--ca", str(self.ca), "--token", self.tokens["node"],
                "--model-root", str(REPO / "models"),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "RESIDENT_LOG": "warn"},
        )

    @property
    def ca(self) -> Path:
        return self.pki / "ca.pem"

    def connect(self, name: str):
        import resident

        cluster = resident.connect(self.url, token=self.tokens[name], ca=str(self.ca))
        deadline = time.time() + 30
        while not [n for n in cluster.nodes() if n.state == "alive"]:
            assert time.time() < deadline, "the agent did not register"
            time.sleep(0.1)
        return cluster

    def close(self) -> None:
        for process in (self.agent, self.scheduler):
            process.kill()
            process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def secure_cluster():
    cluster = SecureCluster()
    yield cluster
    cluster.close()


def interrupt(child: subprocess.Popen) -> tuple[float, str, str]:
    """Sends `child` SIGINT (Ctrl-C) and waits for it to end: the seconds it took, its
    stdout and stderr. Fails the test when it is still running 30 s later."""
    interrupted = time.time()
    child.send_signal(signal.SIGINT)
    try:
        stdout, stderr = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the interrupted Python process was still alive 30 s after SIGINT")
    return time.time() - interrupted, stdout, stderr


def run_python(code: str, **kwargs) -> subprocess.Popen:
    """Starts `python -c code` (this interpreter) with the repository as its directory."""
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, **kwargs)


S3S_FS = Path(os.environ.get("RESIDENT_S3S_FS", REPO / "target" / "tools" / "bin" / "s3s-fs"))


@pytest.fixture
def s3_server(tmp_path, monkeypatch):
    """A real S3-compatible server (s3s-fs, from scripts/install-s3-server.sh) with a bucket
    `out`; the AWS variables point this process at it. Yields its endpoint URL."""
    assert S3S_FS.exists(), f"{S3S_FS} is missing: run scripts/install-s3-server.sh"
    data = tmp_path / "s3-data"
    (data / "out").mkdir(parents=True)
    port = free_port()
    server = subprocess.Popen(
        [str(S3S_FS), "--host", "127.0.0.1", "--port", str(port), "--access-key", "resident-test",
         "--secret-key", "resident-test-secret", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "s3s-fs did not listen"
                time.sleep(0.05)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "resident-test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "resident-test-secret")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()
