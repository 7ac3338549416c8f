#!/bin/sh
# Starts the `resident` binary built for the newest compute capability the first GPU runs
# (the CUDA image carries one per capability); without a GPU, the oldest (CPU paths are the
# same in all). RESIDENT_COMPUTE_CAP (e.g. 86) overrides the choice.
set -eu
bin_dir=/opt/resident/bin
cap="${RESIDENT_COMPUTE_CAP:-}"
if [ -z "$cap" ] && command -v nvidia-smi >/dev/null 2>&1; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
fi
chosen=""
for built in 75 80 86 89 90; do
  if [ -z "$cap" ] || [ "$built" -le "$cap" ] 2>/dev/null; then
    chosen=$built
  fi
  [ -z "$cap" ] && break
done
exec "$bin_dir/resident-sm${chosen:-75}" "$@"
