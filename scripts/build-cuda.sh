#!/usr/bin/env bash
# Builds `resident` and the benches with CUDA (candle's cuda backend) on a machine without
# CUDA: nvcc, the CUDA 13.0 runtime and cuBLAS come from pinned PyPI wheels (about 1.2 GB
# installed, once), libcuda from a link-time stub that is never shipped. The GPU machines run
# driver 580 (CUDA 13.0), so the toolkit is pinned to 13.0; CUDA_COMPUTE_CAP defaults to 90
# (H100/H200; 86 for A6000/A10G, 75 for T4).
#
# Output: target/cuda/release/{resident,embed-bench} and stripped copies in target/cuda/dist/
# (small enough to carry to a GPU machine). With --tests, also resident-models' unit tests
# built with CUDA, as target/cuda/dist/models-tests (their CUDA kernel checks need a GPU). At run time they need libcuda (the driver) and
# CUDA 13 libcudart, libcublas(Lt), libcurand: from a CUDA install, or from PyTorch's wheels
# (LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib).
set -euo pipefail
cd "$(dirname "$0")/.."
toolkit="${RESIDENT_CUDA_TOOLKIT:-$PWD/target/cuda-toolkit}"
cuda_home="$toolkit/nvidia/cu13"
if [[ ! -x "$cuda_home/bin/nvcc" ]]; then
  echo "installing the CUDA 13.0 toolkit wheels into $toolkit (once)" >&2
  python3 -m pip install --quiet --no-deps --target "$toolkit" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 \
    nvidia-cublas==13.1.0.3 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88
fi
links="$toolkit/link"
mkdir -p "$links"
# Unversioned names for the linker, and a libcuda stub (the driver provides the real one).
for lib in cudart cublas cublasLt curand nvrtc; do
  real=$(ls "$cuda_home/lib/lib$lib.so."* | grep -v builtins | head -1)
  ln -sf "$real" "$links/lib$lib.so"
done
if [[ ! -f "$links/libcuda.so" ]]; then
  # Every driver entry point cudarc names, as empty functions: enough to link against.
  cargo fetch --locked >/dev/null
  sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs | tail -1)
  grep -oh 'load::<_F>("cu[A-Za-z0-9_]*")' "$sys" | sed 's/.*("\(.*\)")/void \1(void) {}/' | sort -u > "$links/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$links/libcuda.so" "$links/stub.c"
fi
export CUDA_HOME="$cuda_home" CUDA_PATH="$cuda_home"
export PATH="$cuda_home/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export RUSTFLAGS="${RUSTFLAGS:-} -L native=$links -L native=$cuda_home/lib"
cargo build --release --locked --target-dir target/cuda \
  -p resident-cli --bin resident -p resident-bench --bin embed-bench --features cuda
dist=target/cuda/dist
mkdir -p "$dist"
for bin in resident embed-bench; do
  strip -o "$dist/$bin" "target/cuda/release/$bin"
done
if [[ ${1:-} == --tests ]]; then
  tests=$(cargo test --release --locked --target-dir target/cuda -p resident-models --features cuda \
    --lib --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "resident_models":
        print(m["executable"])')
  strip -o "$dist/models-tests" "$tests"
fi
ls -la "$dist"
