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
