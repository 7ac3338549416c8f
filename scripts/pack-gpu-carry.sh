#!/usr/bin/env bash
# Packs what a GPU benchmark run needs into .gpu-carry/ (git-excluded), under the device
# tool's 64 MiB carry limit: the CUDA builds of embed-bench and resident (one xz stream),
# all-MiniLM-L6-v2 in f16 (half the bytes; GPU actors run f16 anyway; its weights xz'd), all-mpnet-base-v2's config and tokenizer
# without its weights (too large to travel; gpu-bench.sh makes random ones of that shape),
# the Wikipedia articles (xz) and the Qwen3 tokenizer (xz). benches/gpu-bench.sh unpacks and
# runs them on the GPU machine; .gpu-profile/ (below) is for benches/gpu-profile.sh.
# Needs: scripts/build-cuda.sh done, target/release/generate-bench built, models and data fetched (python3 alone makes the f16 copy).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info && { grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude; }
out=.gpu-carry
rm -rf "$out" && mkdir -p "$out/minilm-f16/1_Pooling" "$out/mpnet-config/1_Pooling"
# Both binaries in one xz stream whose dictionary spans the pair: most of their bytes are
# candle's kernels, the same in each, so the second costs little (29 MB as two files, 18 MB
# this way). Single-threaded, since threads would split the stream and lose the sharing.
tar -C target/cuda/dist -cf - resident embed-bench generate-bench |
  xz -T1 --lzma2=preset=6,dict=192MiB > "$out/bins.tar.xz"
xz -T0 -6 -c data/wiki_vital.jsonl > "$out/wiki_vital.jsonl.xz"
# SmolLM2-135M-Instruct's config and tokenizer as a Hugging Face directory, without weights
# (gpu-bench.sh fills it with random ones of that shape): the CPU build's generate-bench.
target/release/generate-bench --model models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
  --export-hf "$out/smollm2-hf" >/dev/null
xz -T0 -6 -c models/qwen3-tokenizer/tokenizer.json > "$out/qwen3-tokenizer.json.xz"
mpnet=models/all-mpnet-base-v2
for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt \
  modules.json sentence_bert_config.json config_sentence_transformers.json 1_Pooling/config.json; do
  cp "$mpnet/$f" "$out/mpnet-config/$f"
done
src=models/all-MiniLM-L6-v2
for f in config.json tokenizer.json modules.json sentence_bert_config.json 1_Pooling/config.json; do
  cp "$src/$f" "$out/minilm-f16/$f"
done
python3 - "$src/model.safetensors" "$out/minilm-f16/model.safetensors" <<'PY'
# f32 -> f16 with the standard library alone (no torch here): safetensors is an 8-byte header
# length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw tensors.
import array, json, struct, sys
with open(sys.argv[1], "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    data = f.read()
meta = header.pop("__metadata__", None)
out_header, chunks, offset = {}, [], 0
for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    begin, end = info["data_offsets"]
    raw = data[begin:end]
    dtype = info["dtype"]
    if dtype == "F32":
        values = array.array("f")
        values.frombytes(raw)
        raw, dtype = struct.pack(f"<{len(values)}e", *values), "F16"
    out_header[name] = {"dtype": dtype, "shape": info["shape"], "data_offsets": [offset, offset + len(raw)]}
    chunks.append(raw)
    offset += len(raw)
if meta is not None:
    out_header["__metadata__"] = meta
encoded = json.dumps(out_header, separators=(",", ":")).encode()
encoded += b" " * (-len(encoded) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(encoded)) + encoded)
    for raw in chunks:
        f.write(raw)
PY
xz -T0 -6 "$out/minilm-f16/model.safetensors"
du -sh "$out"; du -sh "$out"/*
total=$(du -sb "$out" | cut -f1)
if ((total > 62 * 1024 * 1024)); then
  echo "warning: $out is $((total / 1024 / 1024)) MiB; with the working tree it must stay under the 64 MiB carry limit" >&2
fi
# .gpu-profile/: what benches/gpu-profile.sh needs (CARRY=.gpu-profile), without MiniLM but
# with the CUDA build of resident-models' unit tests (scripts/build-cuda.sh --tests), which
# would not fit beside MiniLM under the carry limit.
profile=.gpu-profile
grep -qx "/$profile/" .git/info/exclude || echo "/$profile/" >> .git/info/exclude
rm -rf "$profile" && mkdir -p "$profile"
for f in bins.tar.xz wiki_vital.jsonl.xz qwen3-tokenizer.json.xz; do ln "$out/$f" "$profile/$f"; done
cp -r "$out/mpnet-config" "$profile/"
if [[ -f target/cuda/dist/models-tests ]]; then
  xz -T0 -6 -c target/cuda/dist/models-tests > "$profile/models-tests.xz"
fi
du -sh "$profile"
