"""embed over an iterator of 100k strings: the input is read a window at a time, so memory
grows with the vectors returned, not with the input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import MINILM, REPO

COUNT = int(os.environ.get("RESIDENT_PY_MEMORY_TEXTS", "100000"))

PROBE = """
import json, resource, sys
import resident
count, model = int(sys.argv[1]), sys.argv[2]
cluster = resident.local()
# One window first: the actors' and the transport's buffers for a window's chunks.
cluster.embed([f"warm up {i}" for i in range(resident.EMBED_WINDOW)], model=model, chunk_size=512, progress=False)
def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss_mib()
samples = []
# Counts the native calls, to check the input is pulled a window at a time.
calls = []
class Counting:
    def __init__(self, native):
        self.native = native
    def embed(self, texts, *args):
        calls.append(len(texts))
        return self.native.embed(texts, *args)
cluster._native = Counting(cluster._native)
ahead = []
def texts():
    for i in range(count):
        ahead.append(i - sum(calls))
        if i % 10000 == 0:
            samples.append((i, rss_mib() - base))
        yield f"document {i} of the stream"
vectors = cluster.embed(texts(), model=model, chunk_size=512, progress=False)
print(json.dumps({"shape": list(vectors.shape), "samples": samples, "end": rss_mib() - base,
                  "most_ahead": max(ahead), "window": resident.EMBED_WINDOW}))
"""


def test_an_iterator_of_100k_strings_streams_in_windows():
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(COUNT), str(MINILM)],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shape"] == [COUNT, 384]
    # No text is pulled more than one window ahead of what was embedded.
    assert result["most_ahead"] < result["window"], result
    vector_mib = COUNT * 384 * 4 / 2**20
    print(result)
    for pulled, grown in result["samples"]:
        # What was embedded so far (its float32 rows), twice for the final concatenation's
        # copy, plus a fixed allowance for the window in hand and allocator slack.
        allowed = 2 * pulled * 384 * 4 / 2**20 + 150
        assert grown <= allowed, (pulled, grown, allowed)
    assert result["end"] <= 2 * vector_mib + 150, result
