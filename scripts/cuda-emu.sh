#!/usr/bin/env bash
# Runs Resident's GPU code on the CPU, through cuda-emu (scripts/cuda-emu/README.md): a fake
# CUDA driver, cuBLAS and cuRAND that run our kernels and candle's as C++ on the host. For a
# machine without a GPU, before GPU time is spent: it finds wrong indices, missing
# synchronisation (partly), kernels that were never built, API misuse such as a graph that
# captures a copy from freed host memory, and script mistakes. It measures nothing: a GPU's
# speed, and its rounding, are the GPU's alone.
#
#   scripts/cuda-emu.sh test [FILTER...]  resident-models' unit tests built with `cuda`, run on
#                                         an emulated H100 (sm_90) and an emulated T4 (sm_75)
#   scripts/cuda-emu.sh build             also resident, embed-bench and generate-bench with
#                                         `cuda`, into target/cuda/emu-dist/
#   scripts/cuda-emu.sh smoke             build, then the binaries' GPU paths on small inputs
#                                         (needs the models and data: scripts/fetch-*.sh)
#   scripts/cuda-emu.sh run CMD [ARG...]  CMD with the emulated GPU
#
# CUDA_EMU_ARCH (90 or 75), CUDA_EMU_GUARD=1 (a kernel writing or reading past a device
# allocation faults, named), CUDA_EMU_MEMORY_GIB, CUDA_EMU_THREADS, CUDA_EMU_ORDER=reverse
# (threads resumed in the other order: a race shows as a different answer) and
# CUDA_EMU_TRACE=1 (every launch, and captured host copies) pass through to the emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
command=${1:-test}
shift || true
lib=$PWD/target/cuda-emu/lib

emulated() { # command...: with the fake libraries first on the library path
  LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" "$@"
}

build() { # --tests or nothing: the cuda build against the MoE stub, one kernel arch
  bash scripts/cuda-emu/build.sh
  RESIDENT_CANDLE_MOE=stub RESIDENT_CUDA_ARCHS=${RESIDENT_CUDA_ARCHS:-90} \
    scripts/build-cuda.sh "$@" >&2
}

case "$command" in
  test)
    build --tests
    tests=target/cuda/emu-dist/models-tests
    status=0
    for arch in 90 75; do
      echo "== resident-models' tests on an emulated sm_$arch" >&2
      CUDA_EMU_ARCH=$arch emulated "$tests" "$@" || status=1
    done
    exit $status
    ;;
  build) build --tests ;;
  smoke)
    build --tests
    exec bash scripts/cuda-emu/smoke.sh
    ;;
  run) emulated "$@" ;;
  *)
    echo "unknown command '$command'; use test, build, smoke or run" >&2
    exit 2
    ;;
esac
