#!/usr/bin/env bash
# Runs Resident's GPU code on the CPU, through cuda-emu (scripts/cuda-emu/README.md): a fake
# CUDA driver, cuBLAS and cuRAND that run our kernels and candle's as C++ on the host. For a
# machine without a GPU, before GPU time is spent: it finds wrong indices, missing
# synchronisation (partly), kernels that were never built, API misuse such as a graph that
# captures a copy from freed host memory, and script mistakes. It measures nothing: a GPU's
# speed, and its rounding, are the GPU's alone.
#
#   scripts/cuda-emu.sh test [FILTER...]  resident-models' unit tests built with `cuda`, run on
#                                         two emulated H100s (sm_90) and two emulated T4s
#                                         (sm_75), where a test without its GPUs fails
#                                         (RESIDENT_TEST_GPU=required, RESIDENT_TEST_GPUS=2);
#                                         the last step of the test command, so CI runs it
#   scripts/cuda-emu.sh build             resident, embed-bench, generate-bench and the tests
#                                         with `cuda`, into target/cuda/emu-dist/
#   scripts/cuda-emu.sh smoke             build, then the binaries' GPU paths on small inputs
#                                         (needs the models and data: scripts/fetch-*.sh)
#   scripts/cuda-emu.sh run CMD [ARG...]  CMD with the emulated GPU
#
# CUDA_EMU_ARCH (90 or 75), CUDA_EMU_DEVICES (how many GPUs; 1 unless set, 2 for `test`),
# CUDA_EMU_GUARD=1 (a kernel writing or reading past a device
# allocation faults, named), CUDA_EMU_MEMORY_GIB, CUDA_EMU_THREADS, CUDA_EMU_ORDER=reverse
# (threads resumed in the other order: a race shows as a different answer),
# CUDA_EMU_TRACE=1 (every launch, and captured host copies) and CUDA_EMU_STATS=FILE (counts
# of launches, copies, waits and allocations; scripts/cuda-emu/step-profile.sh) pass
# through to the emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
command=${1:-test}
shift || true
lib=$PWD/target/cuda-emu/lib

emulated() { # command...: with the fake libraries first on the library path
  LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" "$@"
}

build() { # the cuda binaries and tests against the MoE stub, one kernel arch
  bash scripts/cuda-emu/build.sh
  RESIDENT_CANDLE_MOE=stub RESIDENT_CUDA_ARCHS=${RESIDENT_CUDA_ARCHS:-90} \
    scripts/build-cuda.sh --tests >&2
}

case "$command" in
  test)
    bash scripts/cuda-emu/build.sh
    # Built in the test command's target/ (build-cuda.sh --emu-tests), not target/cuda, so
    # that in CI the workspace's build scripts and most dependencies are reused.
    tests=$(scripts/build-cuda.sh --emu-tests)
    status=0
    for arch in 90 75; do
      echo "== resident-models' tests on an emulated sm_$arch" >&2
      # Two GPUs, as a multi-GPU host has: the tests of GPUs side by side need them.
      RESIDENT_TEST_GPU=required RESIDENT_TEST_GPUS=2 CUDA_EMU_DEVICES=2 CUDA_EMU_ARCH=$arch \
        emulated "$tests" "$@" || status=1
    done
    exit $status
    ;;
  build) build ;;
  smoke)
    build
    exec bash scripts/cuda-emu/smoke.sh
    ;;
  run) emulated "$@" ;;
  *)
    echo "unknown command '$command'; use test, build, smoke or run" >&2
    exit 2
    ;;
esac
