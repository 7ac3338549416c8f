#!/usr/bin/env bash
# The cluster part of benches/gpu-bench.sh (SECTIONS=cluster), on the GPU machine: the whole
# product through real processes, secure as deployed (TLS, an auth file, agent and client
# tokens), on loopback:
#  1. `resident scheduler` + a CUDA `resident agent` on the machine's GPUs;
#  2. `resident embed --cluster` of the Wikipedia leads with MiniLM f16 on one actor per GPU:
#     its docs/s against the bare actor's (embed-bench, same model, data and dtype), and its
#     vectors against sentence-transformers fp16 (when gpu-bench's embed section made them);
#  3. the same job on four actors sharing GPU 0 at 0.25 each: where the scheduler put them
#     (`resident status --json`) and the job's docs/s;
#  4. `/metrics` over HTTPS: the NVML series (VRAM total and free, utilisation) for each GPU;
#  5. the agent's NVML fault watcher (critical Xid and ECC events): started, and on which GPUs.
# The first job's pool is removed when it ends (it holds whole GPUs); the second is kept to be
# read. Usage (from gpu-bench.sh): benches/gpu-cluster.sh WORK_DIR RESIDENT_BIN EMBED_BENCH_BIN
# Prints markdown tables; a failed step prints a FAILED line and the rest still runs.
# CLUSTER_AGENT_ARGS adds agent flags (`--simulate-gpus T4:16GiB` tries the script on a CPU
# build, where the NVML series are absent).
set -uo pipefail
work=$1 resident=$2 embed_bench=$3
dir=$work/cluster
rm -rf "$dir" && mkdir -p "$dir"
model=$PWD/.gpu-carry/minilm-f16
data=$work/wiki_vital.jsonl
port=${CLUSTER_PORT:-50151} http_port=${CLUSTER_HTTP_PORT:-50180}
url=https://127.0.0.1:$port

failed() { echo "FAILED: $*"; }

"$resident" certs init --out "$dir/pki" --san 127.0.0.1 >/dev/null || failed "certs init"
token() { "$resident" token create --auth-file "$dir/auth.toml" --name "$1" --role "$2" | tail -1; }
agent_token=$(token gpu-agent agent)
submit_token=$(token bench submit)
read_token=$(token metrics read)
export RESIDENT_CA=$dir/pki/ca.pem

RESIDENT_LOG=warn "$resident" scheduler --listen "127.0.0.1:$port" --http-listen "127.0.0.1:$http_port" \
  --tls-cert "$dir/pki/scheduler.pem" --tls-key "$dir/pki/scheduler-key.pem" \
  --auth-file "$dir/auth.toml" --state-dir "$dir/state" --heartbeat-ms 500 \
  > "$dir/scheduler.out" 2> "$dir/scheduler.log" &
scheduler=$!
# It prints its address once it listens.
for _ in $(seq 1 100); do [[ -s $dir/scheduler.out ]] && break; sleep 0.1; done
RESIDENT_LOG=info "$resident" agent --scheduler "$url" --node-id gpu-node --token "$agent_token" \
  --model-root "$PWD/.gpu-carry" --model-root "$work" --model-cache "$dir/model-cache" \
  ${CLUSTER_AGENT_ARGS:-} > /dev/null 2> "$dir/agent.log" &
agent=$!
trap 'kill $agent $scheduler 2>/dev/null; wait 2>/dev/null' EXIT

status_json() { RESIDENT_TOKEN=$read_token "$resident" status --cluster "$url" --json 2>/dev/null; }
gpus=0
for _ in $(seq 1 120); do
  gpus=$(status_json | python3 -c 'import json, sys
nodes = json.load(sys.stdin)["nodes"]
print(sum(len(n["gpus"]) for n in nodes if n["state"] == "alive"))' 2>/dev/null || echo 0)
  [[ $gpus -gt 0 ]] && break
  sleep 0.5
done
if [[ $gpus -eq 0 ]]; then
  failed "the CUDA agent did not register with GPUs"
  tail -20 "$dir/agent.log" "$dir/scheduler.log"
  exit 1
fi
echo "agent registered with $gpus GPU(s):"
grep -m3 -i 'gpu\|cuda' "$dir/agent.log" | cut -c1-240
# The NVML fault watcher (node-agent/src/gpu/xid.rs) on a real driver: which GPUs it watches,
# or why it could not (an NVML without event support, a container without the device nodes).
grep -m1 'watching GPUs for critical Xid' "$dir/agent.log" | cut -c1-240 ||
  { failed "the agent's NVML fault watcher did not start"; grep -m3 -i 'nvml\|xid' "$dir/agent.log" | cut -c1-240; }

report_field() { python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"r": r}))' "$@"; }

embed_cluster() { # label, output dir, extra embed args...
  local label=$1 out=$2; shift 2
  local started ended
  started=$(date +%s.%N)
  RESIDENT_TOKEN=$submit_token RESIDENT_LOG=warn "$resident" embed --cluster "$url" \
    --model "$model" --input "$data" --output "$out" --dtype f16 "$@" \
    > "$out.stdout" 2> "$out.stderr" || { failed "$label"; tail -5 "$out.stderr"; return 1; }
  ended=$(date +%s.%N)
  printf '| %s | %s | %s | %.1f | %s | %s |\n' "$label" \
    "$(report_field "$out/report.json" 'r["items"]')" "$(report_field "$out/report.json" 'r["actors"]')" \
    "$(python3 -c "print($ended - $started)")" "$(report_field "$out/report.json" 'round(r["docs_per_second"], 1)')" \
    "$(report_field "$out/report.json" 'r["model_loads"]')"
}

echo
echo "Bare actor (embed-bench: the model in this process, no scheduler), the same model, data and dtype:"
RUST_LOG=warn "$embed_bench" --model "$model" --data "$data" --limit 0 --replicas 1 --gpus 1 \
  --dtype f16 --chunk-size 2048 --label "bare actor, MiniLM f16, 1 GPU" || failed "embed-bench bare actor"

echo
echo "| resident embed --cluster (TLS, tokens; real scheduler and CUDA agent processes) | docs | actors | wall s (command) | docs/s (report) | model loads |"
echo "|---|---:|---:|---:|---:|---:|"
embed_cluster "MiniLM f16, one actor per GPU ($gpus)" "$dir/out-whole" --gpus-per-actor 1 --replicas "$gpus" --vram-gib 2
embed_cluster "MiniLM f16, four actors sharing GPU 0 at 0.25 each" "$dir/out-quarter" --gpus-per-actor 0.25 \
  --replicas 4 --vram-gib 2 --keep-pool

echo
echo "Where the four 0.25 actors run (resident status --json):"
status_json | python3 -c 'import json, sys
status = json.load(sys.stdin)
for actor in status["actors"]:
    print("  ", {k: actor.get(k) for k in ("pool", "node_id", "gpu_indices", "state", "model_loads", "tasks_done", "vram_bytes")})
' || failed "status --json"

merged=$dir/out-whole/embeddings.npy
theirs=$(ls "$work"/model-wiki_vital.st32.f32 "$work"/minilm-f16-wiki_vital.st32.f32 2>/dev/null | head -1)
if [[ -f $merged && -n $theirs ]]; then
  python3 - "$merged" "$theirs" <<'PY' || failed "cluster vectors against sentence-transformers"
import sys, numpy as np
ours = np.load(sys.argv[1]).astype(np.float64)
theirs = np.fromfile(sys.argv[2], dtype="<f4").reshape(-1, ours.shape[1]).astype(np.float64)
if ours.shape != theirs.shape:
    sys.exit(f"shapes differ: {ours.shape} vs {theirs.shape}")
cos = (ours * theirs).sum(1) / np.maximum(np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1), 1e-12)
print(f"parity resident embed --cluster f16 vs sentence-transformers fp16: {len(cos)} rows, min cosine {cos.min():.6f}, mean {cos.mean():.6f}")
sys.exit(0 if cos.min() >= 0.99 else 1)
PY
fi

echo
echo "NVML series on the scheduler's /metrics (HTTPS, a read token):"
python3 - "https://127.0.0.1:$http_port/metrics" "$read_token" "$RESIDENT_CA" <<'PY' || failed "/metrics NVML series"
import ssl, sys, urllib.request
url, token, ca = sys.argv[1:]
request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
text = urllib.request.urlopen(request, context=ssl.create_default_context(cafile=ca), timeout=10).read().decode()
wanted = ("resident_gpu_vram_total_bytes", "resident_gpu_vram_free_bytes", "resident_gpu_utilization_ratio")
lines = [l for l in text.splitlines() if l.startswith(wanted)]
for line in lines:
    print("   ", line)
missing = [w for w in wanted if not any(l.startswith(w) for l in lines)]
if missing:
    sys.exit(f"missing from /metrics: {missing}")
PY
