#!/usr/bin/env bash
# Builds Resident with CUDA (candle's cuda backend and our own kernels) on a machine without
# CUDA: nvcc, the CUDA 13.0 runtime and cuBLAS come from pinned PyPI wheels (about 1.2 GB
# installed, once, into target/cuda-toolkit), libcuda from a link-time stub that is never
# shipped. Nothing else is needed on a fresh clone. The GPU machines run driver 580 (CUDA
# 13.0), so the toolkit is pinned to 13.0.
#
#   scripts/build-cuda.sh           target/cuda/release/{resident,embed-bench,generate-bench} and stripped
#                                   copies in target/cuda/dist/ (small enough to carry to a GPU)
#   scripts/build-cuda.sh --tests   also resident-models' unit tests built with CUDA, as
#                                   target/cuda/dist/models-tests (their kernel checks need a GPU)
#   scripts/build-cuda.sh --toolkit only installs the toolkit and the link stubs (for
#                                   scripts/cuda-emu, which needs the CUDA headers)
#   scripts/build-cuda.sh --emu-tests
#                                   resident-models' unit tests built with `cuda` for
#                                   scripts/cuda-emu (candle's MoE library stubbed), in the
#                                   release profile and target/ of the test command (the link
#                                   stubs come from LIBRARY_PATH: RUSTFLAGS would rebuild every
#                                   crate); prints the test binary's path. About 60 crates
#                                   compile again (about 4 minutes on two cores): candle,
#                                   cudarc and resident-models, and dependencies such as tokio,
#                                   tonic and tokenizers, since cargo unifies features over the
#                                   packages a build selects and resident-models alone asks for
#                                   fewer of theirs than the workspace (`cargo tree -e
#                                   features` shows which)
#   scripts/build-cuda.sh --check   what CI runs (through scripts/test.sh, after `cargo doc`):
#                                   every crate, test, bench and example target type-checked
#                                   with `--features cuda` and every kernel compiled by nvcc
#                                   (but candle's static MoE library, stubbed as for --emu-tests,
#                                   which then reuses the kernels),
#                                   in the release profile and target/ that the test build
#                                   and `cargo doc --release` fill, so only candle, cudarc and
#                                   our crates are checked again;
#                                   nothing linked, nothing run
#
# Compute capabilities: our kernels (models/build.rs) and candle's (patched, vendor/README.md)
# are built as SASS for 7.5, 8.0, 8.6, 8.9 and 9.0 plus PTX for newer GPUs, so one binary runs
# on a T4, an A10G, an A6000 or an H100 without the driver's JIT compile; candle's static
# MoE/GGUF library too (its quantised matmuls run for a GGUF kept quantised on a GPU,
# `--dtype quantised`). RESIDENT_CUDA_ARCHS narrows the list (90 for an H100 or H200 alone);
# --check and --emu-tests take 90 alone unless it says otherwise.
# At run time the binaries need libcuda (the driver) and CUDA 13 libcudart, libcublas(Lt),
# libcurand: from a CUDA install, or from PyTorch's wheels
# (LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in
  "" | --tests | --check | --toolkit | --emu-tests) ;;
  *)
    echo "unknown option '$mode'; use --tests, --check, --toolkit or --emu-tests (or nothing)" >&2
    exit 2
    ;;
esac
toolkit="${RESIDENT_CUDA_TOOLKIT:-$PWD/target/cuda-toolkit}"
cuda_home="$toolkit/nvidia/cu13"
if [[ ! -x "$cuda_home/bin/nvcc" ]]; then
  echo "installing the CUDA 13.0 toolkit wheels into $toolkit (once)" >&2
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$toolkit" \
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
[[ $mode == --toolkit ]] && exit 0
export CUDA_HOME="$cuda_home" CUDA_PATH="$cuda_home"
export PATH="$cuda_home/bin:$PATH"

if [[ $mode == --check ]]; then
  started=$SECONDS
  # A type check, not a build: the CI machine has 90 minutes for the whole test command on two
  # cores, and linking the CUDA binaries or test binaries after the test run did not fit (the
  # last two stops: out of disk, then out of time). The kernels are still compiled (the build
  # scripts run nvcc), ours and candle's for one capability: the others differ only in nvcc's
  # code generation, which scripts/build-cuda.sh without --check exercises. candle's static
  # MoE/GGUF library is stubbed (RESIDENT_CANDLE_MOE=stub, vendor/README.md): a check
  # links nothing, and its 15 modules took about 700 s of one-threaded nvcc,
  # most of this step on CI's two cores (stop 59 ran out of time in it); --emu-tests, which
  # CI runs next, sets the same, so candle's build script runs once for both. No RUSTFLAGS
  # (nothing is linked), so that the dependency checks `cargo doc --release` left in target/
  # are reused, and the release profile for the same reason (and for the build scripts and
  # proc macros of the test build).
  RESIDENT_CUDA_ARCHS="${RESIDENT_CUDA_ARCHS:-90}" RESIDENT_CANDLE_MOE=stub \
    cargo check --release --locked --workspace --features cuda --all-targets
  echo "cuda check: every target checked with --features cuda in $((SECONDS - started)) s"
  exit 0
fi

models_tests_executable() { # cargo's JSON messages on stdin: the path of resident-models' test binary
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "resident_models":
        print(m["executable"])'
}

if [[ $mode == --emu-tests ]]; then
  # The same kernel archs and MoE stub as --check, whose build script runs this reuses.
  RESIDENT_CUDA_ARCHS="${RESIDENT_CUDA_ARCHS:-90}" RESIDENT_CANDLE_MOE=stub \
    LIBRARY_PATH="$links:$cuda_home/lib${LIBRARY_PATH:+:$LIBRARY_PATH}" \
    cargo test --release --locked -p resident-models --features cuda --lib --no-run \
    --message-format=json-render-diagnostics | models_tests_executable
  exit 0
fi

export RUSTFLAGS="${RUSTFLAGS:-} -L native=$links -L native=$cuda_home/lib"
cargo build --release --locked --target-dir target/cuda \
  -p resident-cli --bin resident -p resident-bench --bin embed-bench --bin generate-bench --features cuda
# RESIDENT_CANDLE_MOE=stub (scripts/cuda-emu.sh) links a stub for candle's MoE/GGUF library:
# such binaries go to emu-dist/, never to dist/, which pack-gpu-carry.sh takes to a GPU.
dist=target/cuda/dist
[[ ${RESIDENT_CANDLE_MOE:-} == stub ]] && dist=target/cuda/emu-dist
mkdir -p "$dist"
for bin in resident embed-bench generate-bench; do
  strip -o "$dist/$bin" "target/cuda/release/$bin"
done
if [[ $mode == --tests ]]; then
  tests=$(cargo test --release --locked --target-dir target/cuda -p resident-models --features cuda \
    --lib --no-run --message-format=json-render-diagnostics | models_tests_executable)
  strip -o "$dist/models-tests" "$tests"
fi
ls -la "$dist"
