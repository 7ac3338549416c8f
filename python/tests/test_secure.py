"""A separately started `resident scheduler` with TLS and tokens, and a `resident agent`:
each exception class raised by a real cause."""

from __future__ import annotations

import numpy as np
import pytest

import resident
from conftest import MINILM, free_port, wiki_texts


def test_a_submit_token_embeds_over_tls(secure_cluster):
    cluster = secure_cluster.connect("alice")
    assert cluster.url.startswith("https://")
    vectors = cluster.embed(
        [r["text"] for r in wiki_texts(8)], model=str(MINILM), replicas=1, progress=False
    )
    assert vectors.shape == (8, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_no_token_is_unauthenticated(secure_cluster):
    with pytest.raises(resident.Unauthenticated) as refused:
        resident.connect(secure_cluster.url, ca=str(secure_cluster.ca)).nodes()
    assert refused.value.kind == "Unauthenticated"
    assert isinstance(refused.value, resident.ResidentError)


def test_a_read_token_may_not_create_a_pool(secure_cluster):
    cluster = secure_cluster.connect("auditor")
    assert [n.state for n in cluster.nodes()] == ["alive"]
    with pytest.raises(resident.PermissionDenied) as refused:
        cluster.pool("not-mine", kind="echo")
    assert "has role read" in str(refused.value)


def test_a_pool_no_node_can_hold_is_unplaceable(secure_cluster):
    cluster = secure_cluster.connect("alice")
    with pytest.raises(resident.Unplaceable) as refused:
        cluster.pool("huge", kind="echo", gpus=1.0, vram_gib=200.0)
    assert "cannot place pool `huge`" in str(refused.value)


def test_a_scheduler_that_is_not_there_is_gone():
    with pytest.raises(resident.SchedulerGone) as refused:
        resident.connect(f"http://127.0.0.1:{free_port()}")
    assert refused.value.kind == "Connect"


def test_a_bad_url_and_a_missing_ca_are_bad_input(secure_cluster, monkeypatch):
    with pytest.raises(resident.BadInput):
        resident.connect("not a url")
    with pytest.raises(resident.BadInput) as refused:
        resident.connect(secure_cluster.url, ca="/nonexistent/ca.pem")
    assert "ca /nonexistent/ca.pem" in str(refused.value)
    monkeypatch.delenv("RESIDENT_CLUSTER", raising=False)
    with pytest.raises(resident.BadInput) as refused:
        resident.connect()
    assert "RESIDENT_CLUSTER" in str(refused.value)


def test_the_environment_gives_url_token_and_ca(secure_cluster, monkeypatch):
    monkeypatch.setenv("RESIDENT_CLUSTER", secure_cluster.url)
    monkeypatch.setenv("RESIDENT_TOKEN", secure_cluster.tokens["auditor"])
    monkeypatch.setenv("RESIDENT_CA", str(secure_cluster.ca))
    assert [n.node_id for n in resident.connect().nodes()] == ["py-node"]


JOB = """
import resident, sys
cluster = resident.connect(sys.argv[1], token=sys.argv[2], ca=sys.argv[3])
cluster.embed_job(sys.argv[4], sys.argv[5], sys.argv[6], chunk_size=32, replicas=1, progress=False)
"""


def test_ctrl_c_cancels_the_job_on_the_cluster(secure_cluster, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO, write_corpus

    corpus = write_corpus(tmp_path / "corpus.jsonl", wiki_texts(3000))
    out = tmp_path / "out"
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, secure_cluster.url, secure_cluster.tokens["alice"],
         str(secure_cluster.ca), str(corpus), str(MINILM), str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 120
    while len(list((out / "shards").glob("*.npy"))) < 1:
        assert job.poll() is None, job.communicate()
        assert time.time() < deadline, "no shard written"
        time.sleep(0.05)
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=30)
    assert "KeyboardInterrupt" in stderr, stderr
    cluster = secure_cluster.connect("alice")
    deadline = time.time() + 30
    while True:
        # The corpus job's pool is `embed-<digest>` (`cluster.embed`'s are `py-embed-...`).
        jobs = [
            j for j in cluster.jobs()
            if j.owner == "alice" and j.pool.startswith("embed-") and j.name == "embed"
        ]
        if jobs and all(j.state != "running" for j in jobs):
            break
        assert time.time() < deadline, [(j.name, j.state) for j in jobs]
        time.sleep(0.1)
    assert [j.state for j in jobs] == ["cancelled"], [(j.name, j.state) for j in jobs]
