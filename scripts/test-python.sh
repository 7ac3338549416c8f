#!/usr/bin/env bash
# The Python package's tests: `pip install ./python` (the README's install line: maturin
# builds the PyO3 crate from source) into target/python-venv, then pytest against real
# processes: resident.local(), a TLS scheduler with tokens and an agent started from the
# `resident` binary (cargo build --release first), kill -9 and Ctrl-C of Python processes.
# Needs the models (scripts/fetch-model.sh) and the Wikipedia data (fetched here).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-data.sh >/dev/null
venv=target/python-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
# pandas and pyarrow: the data-work calls (embed_frame, Arrow in, read_embeddings);
# rouge-score and sacrebleu: the references the overlap figures (--metric) are held to.
"$venv/bin/pip" install -q --disable-pip-version-check "numpy>=1.21" "pytest>=7" "pandas>=2" \
  "pyarrow>=14" "rouge-score==0.1.2" "sacrebleu==2.6.0"
started=$SECONDS
"$venv/bin/pip" install -q --disable-pip-version-check ./python
echo "pip install ./python: $((SECONDS - started)) s"
RESIDENT_BIN=${RESIDENT_BIN:-$PWD/target/release/resident} \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
