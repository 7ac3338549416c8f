"""Memory over long streams of strings: ``embed_iter`` stays flat however many it reads
(only the chunks in flight are held), and ``embed`` over an iterator grows with the vectors
it returns, not with the input. RESIDENT_PY_MEMORY_TEXTS sets the count (50,000 here, about
2.5 minutes of MiniLM on two CPU cores: enough that holding every vector would add 73 MiB,
three times the allowance; BENCHMARKS.md records a run over 1,000,000)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import MINILM, REPO

COUNT = int(os.environ.get("RESIDENT_PY_MEMORY_TEXTS", "50000"))
# Growth of the peak RSS allowed for allocator slack (a 20,000-text run grows by 0 MiB).
SLACK_MIB = 24

PROBE = """
import json, resource, sys
import resident
count, model, call = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cluster = resident.local()
chunk = 512
# A first pass: the actors' and the transport's buffers for the chunks in flight.
for _ in cluster.embed_iter([f"warm up {i}" for i in range(8 * chunk)], model=model, chunk_size=chunk, progress=False):
    pass
def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss_mib()
samples = []
# How far the input is read ahead of the vectors handed back.
handed = [0]
ahead = []
def texts():
    for i in range(count):
        ahead.append(i - handed[0])
        if i % 10000 == 0:
            samples.append((i, rss_mib() - base))
        yield f"document {i} of the stream"
rows = 0
if call == "embed_iter":
    for block in cluster.embed_iter(texts(), model=model, chunk_size=chunk, progress=False):
        rows += len(block)
        handed[0] = rows
    dim = block.shape[1]
else:
    vectors = cluster.embed(texts(), model=model, chunk_size=chunk, progress=False)
    rows, dim = vectors.shape
actors = len([a for a in cluster.actors() if a.pool.startswith("py-embed")])
print(json.dumps({"shape": [rows, dim], "samples": samples, "end": rss_mib() - base,
                  "most_ahead": max(ahead), "chunk": chunk, "actors": actors}))
"""


def probe(call: str, count: int = COUNT) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(count), str(MINILM), call],
        cwd=REPO, capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(result)
    assert result["shape"] == [count, 384]
    return result


def test_embed_iter_over_a_long_stream_stays_flat():
    result = probe("embed_iter")
    # The input is read at most the chunks in flight (two per actor) and one more ahead.
    assert result["most_ahead"] <= (2 * result["actors"] + 1) * result["chunk"], result
    # Nothing grows with the count: a fixed allowance for allocator slack.
    for pulled, grown in result["samples"]:
        assert grown <= SLACK_MIB, (pulled, grown)
    assert result["end"] <= SLACK_MIB, result


def test_embed_over_an_iterator_grows_with_the_vectors_only():
    count = COUNT // 3
    result = probe("embed", count)
    vector_mib = count * 384 * 4 / 2**20
    for pulled, grown in result["samples"]:
        # What was embedded so far (its float32 rows), twice for the final concatenation's
        # copy, plus a fixed allowance for the chunks in hand and allocator slack.
        allowed = 2 * pulled * 384 * 4 / 2**20 + 150
        assert grown <= allowed, (pulled, grown, allowed)
    assert result["end"] <= 2 * vector_mib + 150, result
