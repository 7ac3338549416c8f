#!/usr/bin/env bash
# Fails, naming the crates, when the Python package's build would resolve a dependency with
# other features than the workspace's test build does (`cargo build --release --workspace
# --tests`, scripts/test.sh). maturin builds python/ alone, and cargo resolves features per
# build: one crate low in the tree with other features (tokio, log, ...) makes
# `pip install ./python` compile everything above it a second time, most of the tree. The
# fix is to ask for the workspace's features in python/Cargo.toml (see the comment there).
# Seconds: `cargo tree` only, nothing is compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(mktemp)
workspace=$(mktemp)
trap 'rm -f "$python" "$workspace"' EXIT
cargo tree --locked -p resident-python -e normal,build -f '{p} [{f}]' --prefix none > "$python"
cargo tree --locked --workspace -e normal,build,dev -f '{p} [{f}]' --prefix none > "$workspace"
python3 - "$python" "$workspace" <<'PY'
import re
import sys


def features(path):
    found = {}
    for line in open(path):
        m = re.match(r"(\S+ v\S+)(?: \(.*?\))? \[(.*)\]", line.strip())
        if m:
            found.setdefault(m.group(1), set()).update(f for f in m.group(2).split(",") if f)
    return found


python, workspace = features(sys.argv[1]), features(sys.argv[2])
differ = {
    crate: sorted(workspace[crate] - python[crate])
    for crate in python
    if crate in workspace and python[crate] != workspace[crate]
}
if differ:
    print("The Python package's build resolves these crates with fewer features than the")
    print("workspace's test build, so `pip install ./python` would compile most of the tree again:")
    for crate, missing in sorted(differ.items()):
        print(f"  {crate}: also {', '.join(missing) or '(other features)'}")
    print("Ask for those features in python/Cargo.toml (the block on feature unification).")
    sys.exit(1)
print(f"python/ resolves its {len(python)} crates with the workspace's features")
PY
