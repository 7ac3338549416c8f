//! Hugging Face checkpoints of real decoder shapes with random weights (`generate-bench
//! --random-checkpoint`), for issue 42's 0.5B-class goal on a GPU machine, where the real
//! weights cannot travel: `config.json`, the Qwen tokenizer given, a ChatML
//! `tokenizer_config.json`, and `model.safetensors` (bf16, uniform noise of standard
//! deviation 0.02, norms at one). The tokens generated mean nothing; the speed does.
//!
//! Written in Rust rather than with `transformers` (as `generate_hf.py random` makes
//! SmolLM2's) so that it needs nothing but the bench binary and runs where torch is not.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use resident_models::generate::dense::Part;

/// A decoder shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DecoderShape {
    /// Qwen2.5-0.5B: 24 layers of 896, 14 query and 2 KV heads of 64, attention biases.
    #[value(name = "qwen2.5-0.5b")]
    Qwen25HalfB,
    /// Qwen3-0.6B: 28 layers of 1024, 16 query and 8 KV heads of 128, per-head norms.
    #[value(name = "qwen3-0.6b")]
    Qwen3PointSixB,
}

/// The shape's numbers.
struct Dims {
    model_type: &'static str,
    layers: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    context: usize,
}

/// Both shapes' vocabulary (the embedding's rows; the tokenizer has fewer tokens).
const VOCAB: usize = 151_936;

/// The ChatML template Qwen's instruct models use, without tools or thinking.
const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

impl DecoderShape {
    fn dims(self) -> Dims {
        match self {
            Self::Qwen25HalfB => Dims {
                model_type: "qwen2",
                layers: 24,
                hidden: 896,
                heads: 14,
                kv_heads: 2,
                head_dim: 64,
                ffn: 4864,
                context: 32_768,
            },
            Self::Qwen3PointSixB => Dims {
                model_type: "qwen3",
                layers: 28,
                hidden: 1024,
                heads: 16,
                kv_heads: 8,
                head_dim: 128,
                ffn: 3072,
                context: 40_960,
            },
        }
    }

    fn config(self) -> serde_json::Value {
        let d = self.dims();
        serde_json::json!({
            "architectures": [match self {
                Self::Qwen25HalfB => "Qwen2ForCausalLM",
                Self::Qwen3PointSixB => "Qwen3ForCausalLM",
            }],
            "model_type": d.model_type,
            "num_hidden_layers": d.layers,
            "hidden_size": d.hidden,
            "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads,
            "head_dim": d.head_dim,
            "intermediate_size": d.ffn,
            "vocab_size": VOCAB,
            "max_position_embeddings": d.context,
            "rope_theta": 1_000_000.0,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "tie_word_embeddings": true,
            "torch_dtype": "bfloat16",
        })
    }

    /// The parts of each layer: name, shape, and whether it is a norm (ones).
    fn layer_parts(self) -> Vec<(Part, Vec<usize>, bool)> {
        let d = self.dims();
        let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let mut parts = vec![
            (Part::AttnNorm, vec![d.hidden], true),
            (Part::Q, vec![q, d.hidden], false),
            (Part::K, vec![kv, d.hidden], false),
            (Part::V, vec![kv, d.hidden], false),
            (Part::O, vec![d.hidden, q], false),
            (Part::FfnNorm, vec![d.hidden], true),
            (Part::Gate, vec![d.ffn, d.hidden], false),
            (Part::Up, vec![d.ffn, d.hidden], false),
            (Part::Down, vec![d.hidden, d.ffn], false),
        ];
        match self {
            Self::Qwen25HalfB => parts.extend([
                (Part::QBias, vec![q], false),
                (Part::KBias, vec![kv], false),
                (Part::VBias, vec![kv], false),
            ]),
            Self::Qwen3PointSixB => parts.extend([
                (Part::QNorm, vec![d.head_dim], true),
                (Part::KNorm, vec![d.head_dim], true),
            ]),
        }
        parts
    }
}

/// Writes a checkpoint of `shape` with random weights (made on `device`) and the tokenizer
/// at `tokenizer` into `out`; returns its parameters.
pub fn write(
    shape: DecoderShape,
    tokenizer: &Path,
    out: &Path,
    device: &Device,
) -> anyhow::Result<usize> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&shape.config())?,
    )?;
    std::fs::copy(tokenizer, out.join("tokenizer.json"))?;
    let tokenizer_config = serde_json::json!({
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": false,
        "chat_template": CHATML,
    });
    std::fs::write(
        out.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&tokenizer_config)?,
    )?;
    let d = shape.dims();
    // Uniform on [-a, a] has standard deviation a / sqrt(3).
    let spread = 0.02 * 3f32.sqrt();
    let make = |dims: &[usize], norm: bool| -> candle_core::Result<Tensor> {
        let values = match norm {
            true => Tensor::ones(dims, DType::F32, device)?,
            false => Tensor::rand(-spread, spread, dims, device)?,
        };
        values.to_dtype(DType::BF16)?.to_device(&Device::Cpu)
    };
    let mut tensors = HashMap::new();
    tensors.insert(Part::Embedding.hf_name(0), make(&[VOCAB, d.hidden], false)?);
    tensors.insert(Part::OutputNorm.hf_name(0), make(&[d.hidden], true)?);
    for layer in 0..d.layers {
        for (part, dims, norm) in shape.layer_parts() {
            tensors.insert(part.hf_name(layer), make(&dims, norm)?);
        }
    }
    let parameters = tensors.values().map(Tensor::elem_count).sum();
    candle_core::safetensors::save(&tensors, out.join("model.safetensors"))?;
    Ok(parameters)
}
