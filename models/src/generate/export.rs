//! Writes a Llama GGUF model as a Hugging Face checkpoint directory: `config.json`,
//! `tokenizer.json` (built from the GGUF metadata), `tokenizer_config.json` (special tokens,
//! chat template) and, optionally, `model.safetensors` with the weights dequantised to f32
//! and the query and key rows back in Hugging Face's order.
//!
//! For checks (the dense path's tests load both and compare) and for benchmarks against
//! `transformers`, which can then load the same model, or random weights of its shape when
//! the weights cannot travel.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::GenerateModel;
use super::decoder::{LlamaConfig, RopeStyle};
use super::dense::Part;
use crate::ModelError;

/// Parts of a decoder layer a plain Llama file has.
const LAYER_PARTS: &[Part] = &[
    Part::AttnNorm,
    Part::Q,
    Part::K,
    Part::V,
    Part::O,
    Part::FfnNorm,
    Part::Gate,
    Part::Up,
    Part::Down,
];

/// A part's tensor, by part and layer (`None` for the model-wide ones).
pub type PartTensor = (Part, Option<usize>, Tensor);

/// GGUF keeps a Llama model's query and key rows permuted for interleaved RoPE; Hugging Face
/// keeps them in halves. `w` is `heads * head_dim x in`.
pub fn unpermute_rows(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (out, input) = w.dims2()?;
    let head_dim = out / heads;
    w.reshape((heads, head_dim / 2, 2, input))?
        .transpose(1, 2)?
        .reshape((out, input))
}

/// The GGUF file's tensors dequantised to f32, with the query and key rows in halves order.
pub fn halves_layout_tensors(
    gguf: &Path,
    config: &LlamaConfig,
) -> Result<Vec<PartTensor>, ModelError> {
    if config.rope != RopeStyle::Interleaved {
        return Err(ModelError::Load(
            "only a Llama GGUF file (interleaved RoPE) is exported".into(),
        ));
    }
    let (mut file, content) = super::decoder::read_gguf(gguf)?;
    super::gguf_shapes::check_tensor_shapes(&content, config)?;
    let mut load = |part: Part, layer: usize| -> Result<Tensor, ModelError> {
        let name = part.gguf_name(layer);
        let failed = |e: candle_core::Error| ModelError::Load(format!("GGUF tensor `{name}`: {e}"));
        let tensor = content
            .tensor(&mut file, &name, &Device::Cpu)
            .map_err(failed)?;
        let values = tensor.dequantize(&Device::Cpu).map_err(failed)?;
        match part {
            Part::Q => unpermute_rows(&values, config.heads).map_err(failed),
            Part::K => unpermute_rows(&values, config.kv_heads).map_err(failed),
            _ => Ok(values),
        }
    };
    let mut out = Vec::new();
    for part in [Part::Embedding, Part::OutputNorm] {
        out.push((part, None, load(part, 0)?));
    }
    for layer in 0..config.layers {
        for &part in LAYER_PARTS {
            out.push((part, Some(layer), load(part, layer)?));
        }
    }
    Ok(out)
}

fn write(path: &Path, text: String) -> Result<(), ModelError> {
    std::fs::write(path, text)
        .map_err(|e| ModelError::Load(format!("cannot write {}: {e}", path.display())))
}

/// Writes the GGUF model at `gguf` into `dir` as a Hugging Face checkpoint; with
/// `weights`, `model.safetensors` too (f32).
pub fn export_hf_checkpoint(gguf: &Path, dir: &Path, weights: bool) -> Result<(), ModelError> {
    let model = GenerateModel::load(gguf)?;
    let c = model.config();
    std::fs::create_dir_all(dir)
        .map_err(|e| ModelError::Load(format!("cannot create {}: {e}", dir.display())))?;
    if weights {
        let tensors: HashMap<String, Tensor> = halves_layout_tensors(gguf, c)?
            .into_iter()
            .map(|(part, layer, t)| (part.hf_name(layer.unwrap_or(0)), t))
            .collect();
        candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))
            .map_err(|e| ModelError::Load(format!("model.safetensors: {e}")))?;
    }
    let vocab = &model.format.vocab;
    let token = |id: Option<u32>| id.and_then(|id| vocab.token(id));
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": c.layers,
        "hidden_size": c.hidden,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.ffn,
        "vocab_size": c.vocab,
        "max_position_embeddings": c.context,
        "rope_theta": c.rope_base,
        "rms_norm_eps": c.rms_eps,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "bos_token_id": vocab.bos,
        "eos_token_id": vocab.eos,
        "torch_dtype": "float32",
    });
    write(&dir.join("config.json"), config.to_string())?;
    let tokenizer = dir.join("tokenizer.json");
    vocab
        .tokenizer
        .save(&tokenizer, false)
        .map_err(|e| ModelError::Load(format!("cannot write {}: {e}", tokenizer.display())))?;
    let tokenizer_config = serde_json::json!({
        "bos_token": token(vocab.bos),
        "eos_token": token(Some(vocab.eos)),
        "add_bos_token": vocab.add_bos,
        "chat_template": vocab.chat_template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    write(
        &dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )?;
    let generation = serde_json::json!({ "eos_token_id": vocab.end_tokens });
    write(&dir.join("generation_config.json"), generation.to_string())
}
