#!/usr/bin/env bash
# Runs the runtime benchmark for Resident and for Ray on this machine, one after the other.
# Usage: benches/compare-ray.sh [--sync-calls N] [--pipelined-calls N]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${RAY_VENV:-.venv-ray}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import ray" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "ray==2.60.0"
fi
cargo build --release -p resident-bench --bin runtime-bench
echo "## Resident ($(nproc) cores, $(date -u +%F))"
RUST_LOG=warn ./target/release/runtime-bench "$@"
echo
echo "## Ray $("$venv/bin/python" -c 'import ray; print(ray.__version__)')"
"$venv/bin/python" benches/ray/ray_bench.py "$@"
