#!/usr/bin/env bash
# Builds the CPU and CUDA images with docker or podman, whichever is here (the CUDA one
# compiles five times: expect about an hour). Tags: resident:<version>-cpu and
# resident:<version>-cuda, plus REGISTRY/... when REGISTRY is set (then pushed).
#   deploy/docker/build-images.sh [cpu|cuda|all]
set -euo pipefail
cd "$(dirname "$0")/../.."
which=${1:-all}
engine=${CONTAINER_ENGINE:-}
if [[ -z $engine ]]; then
  for candidate in docker podman; do
    if command -v "$candidate" >/dev/null && "$candidate" info >/dev/null 2>&1; then
      engine=$candidate
      break
    fi
  done
fi
if [[ -z $engine ]]; then
  echo "no working docker or podman here (set CONTAINER_ENGINE to choose one)" >&2
  exit 1
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
build() {
  local flavour=$1 tag="resident:${version}-$1"
  "$engine" build -f "deploy/docker/Dockerfile.$flavour" -t "$tag" .
  if [[ -n ${REGISTRY:-} ]]; then
    "$engine" tag "$tag" "$REGISTRY/$tag"
    "$engine" push "$REGISTRY/$tag"
  fi
}
case $which in
  cpu | cuda) build "$which" ;;
  all) build cpu && build cuda ;;
  *) echo "usage: $0 [cpu|cuda|all]" >&2; exit 2 ;;
esac
