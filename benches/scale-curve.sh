#!/usr/bin/env bash
# scale-bench at several fleet sizes, one markdown row each (from each run's JSON line).
# Usage: benches/scale-curve.sh [N ...]   (default: 100 300 1000 3000 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins >&2
runs=$(mktemp)
for n in "${@:-100 300 1000 3000 10000}"; do
  for size in $n; do
    target/release/scale-bench --agents "$size" --tasks 300000 --idle-seconds 10 --json 2>/dev/null | tail -1 >> "$runs"
  done
done
python3 - "$runs" <<'PY'
import json, sys
print("| agents x GPUs | actors | register s | place s | loop lag p50 / p99 ms (placing) | tasks/s | sched. CPU µs/task | p50 / p99 ms (windows full) | p50 / p99 ms (one at a time) | idle CPU | RSS MiB | lost agents / actors | re-place s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("| {} x {} | {} | {:.2f} | {:.2f} | {:.1f} / {:.1f} | {:.0f} | {:.1f} | {:.0f} / {:.0f} | {:.2f} / {:.2f} | {:.1f}% | {:.0f} | {} / {} | {:.2f} |".format(
        r["agents"], r["gpus"] // r["agents"], r["actors_placed"], r["register_s"], r["placement_s"],
        r["placement_loop_lag_p50_ms"], r["placement_loop_lag_p99_ms"], r["tasks_per_s"], r["scheduler_cpu_us_per_task"], r["p50_task_ms"], r["p99_task_ms"],
        r["p50_idle_task_ms"], r["p99_idle_task_ms"], 100 * r["idle_cpu_ratio"],
        r["scheduler_rss_bytes"] / 2**20, r["agents_lost"], r["actors_lost"], r["replace_after_loss_s"]))
PY
rm -f "$runs"
