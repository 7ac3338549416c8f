"""The runtime benchmark's workload on Ray, for a side-by-side table.

Run through benches/compare-ray.sh, which installs ray into a venv first.
"""
import argparse
import time

import ray


@ray.remote
class Echo:
    def f(self, payload):
        return payload


def row(name, value, unit):
    print(f"| {name} | {value:.0f} | {unit} |", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sync-calls", type=int, default=5000)
    parser.add_argument("--pipelined-calls", type=int, default=100000)
    args = parser.parse_args()

    print("| measurement | value | unit |")
    print("|---|---:|---|")
    started = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=2)
    row("ray.init() start", (time.perf_counter() - started) * 1000, "ms")

    actor = Echo.remote()
    ray.get([actor.f.remote(b"warm") for _ in range(200)])
    started = time.perf_counter()
    for i in range(args.sync_calls):
        ray.get(actor.f.remote(i.to_bytes(4, "little")))
    row("1 actor, one call at a time", args.sync_calls / (time.perf_counter() - started), "calls/s")

    started = time.perf_counter()
    refs = [actor.f.remote(i.to_bytes(4, "little")) for i in range(args.pipelined_calls)]
    ray.get(refs)
    row("1 actor, pipelined", args.pipelined_calls / (time.perf_counter() - started), "calls/s")

    started = time.perf_counter()
    # num_cpus=0 so 20 actors fit on a 2-core machine, as Ray's own actor default does.
    actors = [Echo.options(num_cpus=0).remote() for _ in range(20)]
    ray.get([a.f.remote(b"hello") for a in actors])
    row("create 20 actors and hear from each", (time.perf_counter() - started) * 1000, "ms")

    started = time.perf_counter()
    refs = [actors[i % 20].f.remote(i.to_bytes(4, "little")) for i in range(args.pipelined_calls)]
    ray.get(refs)
    row("20 actors, pipelined", args.pipelined_calls / (time.perf_counter() - started), "calls/s")
    ray.shutdown()


if __name__ == "__main__":
    main()
