#!/usr/bin/env bash
# Installs s3s-fs, a real S3-compatible server backed by a directory, that the S3 tests
# start on a free port. Prints the binary's path. Does nothing when it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${RESIDENT_TOOLS_DIR:-$PWD/target/tools}"
bin="$root/bin/s3s-fs"
if [[ ! -x "$bin" ]]; then
  echo "installing s3s-fs 0.14.1 into $root (a few minutes, once)" >&2
  cargo install s3s-fs@0.14.1 --features binary --locked --root "$root" >&2
fi
echo "$bin"
