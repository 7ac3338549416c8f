"""Writes a Qwen3-Embedding-0.6B-sized model with random weights (bf16 safetensors, the real
config, the real tokenizer) for throughput and MFU measurements, where real weights cannot
be had. Vectors from it mean nothing; speed does. Needs torch and safetensors.
Usage: python3 benches/qwen3_random.py --tokenizer models/qwen3-tokenizer/tokenizer.json --out DIR"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151669,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seq-length", type=int, default=512)
    args = parser.parse_args()
    os.makedirs(os.path.join(args.out, "1_Pooling"), exist_ok=True)
    c = CONFIG
    h, d, inter = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    tensors = {"embed_tokens.weight": rand(c["vocab_size"], h), "norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = rand(c["num_attention_heads"] * d, h)
        tensors[p + "self_attn.k_proj.weight"] = rand(c["num_key_value_heads"] * d, h)
        tensors[p + "self_attn.v_proj.weight"] = rand(c["num_key_value_heads"] * d, h)
        tensors[p + "self_attn.o_proj.weight"] = rand(h, c["num_attention_heads"] * d)
        tensors[p + "self_attn.q_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        tensors[p + "self_attn.k_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        tensors[p + "mlp.gate_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.up_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.down_proj.weight"] = rand(h, inter)
        tensors[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    save_file(tensors, os.path.join(args.out, "model.safetensors"))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    with open(os.path.join(args.out, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": args.max_seq_length, "do_lower_case": False}, f)
    with open(os.path.join(args.out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": h, "pooling_mode_lasttoken": True}, f)
    with open(os.path.join(args.out, "modules.json"), "w") as f:
        json.dump([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ], f)
    shutil.copy(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    params = sum(t.numel() for t in tensors.values())
    print(f"wrote {args.out}: {params / 1e6:.0f}M parameters (random, bf16)")


if __name__ == "__main__":
    main()
