//! Reading a generation model's weights and vocabulary for the dense path: from a GGUF file
//! (dequantised to the dtype, or kept quantised), or from a Hugging Face safetensors
//! directory (`config.json`, `*.safetensors`, `tokenizer.json`, `tokenizer_config.json`).

use std::fs::File;
use std::path::Path;

use candle_core::quantized::QMatMul;
use candle_core::quantized::gguf_file::Content;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use tokenizers::Tokenizer;

use super::decoder::{LlamaConfig, RopeStyle};
use super::dense::{DenseLinear, Part, WeightSource};
use super::gguf_vocab::Vocab;
use crate::ModelError;

/// A GGUF file's tensors.
pub struct GgufWeights<'a> {
    /// The file's header: metadata and tensor index.
    pub content: &'a Content,
    /// The file, read as tensors are taken.
    pub file: &'a mut File,
    /// Where tensors go.
    pub device: &'a Device,
    /// The dtype of dense (not quantised) tensors.
    pub dtype: DType,
    /// Linear layers keep their quantised blocks (candle's quantised matmul).
    pub keep_quantised: bool,
}

impl GgufWeights<'_> {
    fn qtensor(
        &mut self,
        name: &str,
    ) -> Result<Option<candle_core::quantized::QTensor>, ModelError> {
        if !self.content.tensor_infos.contains_key(name) {
            return Ok(None);
        }
        self.content
            .tensor(self.file, name, self.device)
            .map(Some)
            .map_err(|e| ModelError::Load(format!("GGUF tensor `{name}`: {e}")))
    }
}

impl WeightSource for GgufWeights<'_> {
    fn dense(&mut self, part: Part, layer: usize) -> Result<Option<Tensor>, ModelError> {
        let name = part.gguf_name(layer);
        let Some(tensor) = self.qtensor(&name)? else {
            return Ok(None);
        };
        let failed = |e: candle_core::Error| ModelError::Load(format!("GGUF tensor `{name}`: {e}"));
        let values = tensor.dequantize(self.device).map_err(failed)?;
        values.to_dtype(self.dtype).map(Some).map_err(failed)
    }

    fn linear(&mut self, part: Part, layer: usize) -> Result<Option<DenseLinear>, ModelError> {
        if !self.keep_quantised {
            return Ok(self.dense(part, layer)?.map(DenseLinear::Dense));
        }
        let name = part.gguf_name(layer);
        let Some(tensor) = self.qtensor(&name)? else {
            return Ok(None);
        };
        QMatMul::from_qtensor(tensor)
            .map(|m| Some(DenseLinear::Quantised(m)))
            .map_err(|e| ModelError::Load(format!("GGUF tensor `{name}`: {e}")))
    }

    fn keeps_quantised(&self) -> bool {
        self.keep_quantised
    }
}

/// The RoPE frequency factors a GGUF file carries (`rope_freqs.weight`, Llama 3.1), if any.
pub fn gguf_rope_factors(
    content: &Content,
    file: &mut File,
) -> Result<Option<Vec<f32>>, ModelError> {
    let name = "rope_freqs.weight";
    if !content.tensor_infos.contains_key(name) {
        return Ok(None);
    }
    let failed = |e: candle_core::Error| ModelError::Load(format!("GGUF tensor `{name}`: {e}"));
    let tensor = content.tensor(file, name, &Device::Cpu).map_err(failed)?;
    let values = tensor.dequantize(&Device::Cpu).map_err(failed)?;
    values.to_vec1::<f32>().map(Some).map_err(failed)
}

/// A safetensors checkpoint's tensors.
pub struct SafetensorsWeights<'a> {
    /// The memory-mapped files.
    pub tensors: &'a MmapedSafetensors,
    /// Where tensors go.
    pub device: &'a Device,
    /// The dtype tensors take.
    pub dtype: DType,
}

impl WeightSource for SafetensorsWeights<'_> {
    fn dense(&mut self, part: Part, layer: usize) -> Result<Option<Tensor>, ModelError> {
        let name = part.hf_name(layer);
        if self.tensors.get(&name).is_err() {
            return Ok(None);
        }
        let failed = |e: candle_core::Error| ModelError::Load(format!("tensor `{name}`: {e}"));
        let tensor = self.tensors.load(&name, self.device).map_err(failed)?;
        tensor.to_dtype(self.dtype).map(Some).map_err(failed)
    }

    fn linear(&mut self, part: Part, layer: usize) -> Result<Option<DenseLinear>, ModelError> {
        Ok(self.dense(part, layer)?.map(DenseLinear::Dense))
    }
}

/// Memory-maps the directory's safetensors files.
pub fn open_safetensors(dir: &Path) -> Result<MmapedSafetensors, ModelError> {
    let files = crate::embed::model_files::find_weights(dir)?;
    // SAFETY: the weight files are memory-mapped read-only and not modified while loaded.
    #[allow(unsafe_code)]
    let tensors = unsafe { MmapedSafetensors::multi(&files) };
    tensors.map_err(|e| ModelError::Load(format!("{}: {e}", dir.display())))
}

/// The fields of a Hugging Face `config.json` a Llama-family decoder needs.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: String,
    num_hidden_layers: usize,
    hidden_size: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    max_position_embeddings: usize,
    rope_theta: Option<f32>,
    rms_norm_eps: Option<f32>,
    rope_scaling: Option<HfRopeScaling>,
}

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    #[serde(alias = "type")]
    rope_type: String,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
}

/// `model_type`s of `config.json` the dense path runs.
pub const HF_MODEL_TYPES: &[&str] = &["llama", "mistral", "qwen2", "qwen3"];

/// The model's shape from the directory's `config.json`.
pub fn hf_config(dir: &Path) -> Result<LlamaConfig, ModelError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ModelError::Load(format!("cannot read {}: {e}", path.display())))?;
    let hf: HfConfig = serde_json::from_str(&text)
        .map_err(|e| ModelError::Load(format!("{}: {e}", path.display())))?;
    if !HF_MODEL_TYPES.contains(&hf.model_type.as_str()) {
        return Err(ModelError::Load(format!(
            "model_type `{}` is not supported for generation (supported: {})",
            hf.model_type,
            HF_MODEL_TYPES.join(", ")
        )));
    }
    let heads = hf.num_attention_heads;
    let kv_heads = hf.num_key_value_heads.unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(ModelError::Load(format!(
            "inconsistent attention shape: {heads} heads, {kv_heads} KV heads"
        )));
    }
    let head_dim = hf.head_dim.unwrap_or(hf.hidden_size / heads);
    if head_dim > 1024 {
        return Err(ModelError::Load(format!(
            "the model's head dimension is {head_dim}; it must be at most 1024 (is config.json corrupt?)"
        )));
    }
    let rope_base = hf.rope_theta.unwrap_or(10_000.0);
    let rope_freq_factors = match &hf.rope_scaling {
        None => None,
        Some(scaling) if scaling.rope_type == "llama3" => {
            Some(llama3_rope_factors(scaling, head_dim, rope_base))
        }
        Some(scaling) if scaling.rope_type == "default" => None,
        Some(scaling) => {
            return Err(ModelError::Load(format!(
                "rope_scaling `{}` is not supported (llama3 and default are)",
                scaling.rope_type
            )));
        }
    };
    LlamaConfig {
        layers: hf.num_hidden_layers,
        hidden: hf.hidden_size,
        heads,
        kv_heads,
        head_dim,
        ffn: hf.intermediate_size,
        vocab: hf.vocab_size,
        context: hf.max_position_embeddings,
        rope_base,
        rms_eps: hf.rms_norm_eps.unwrap_or(1e-6),
        rope: RopeStyle::Halves,
        rope_freq_factors,
    }
    .check_bounds()
}

/// Llama 3.1's frequency factors: long wavelengths slowed by `factor`, short ones kept, the
/// band between blended.
fn llama3_rope_factors(scaling: &HfRopeScaling, head_dim: usize, base: f32) -> Vec<f32> {
    let factor = scaling.factor.unwrap_or(8.0);
    let low = scaling.low_freq_factor.unwrap_or(1.0);
    let high = scaling.high_freq_factor.unwrap_or(4.0);
    let original = scaling.original_max_position_embeddings.unwrap_or(8192) as f32;
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = base.powf(-2.0 * i as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                // The scaled frequency is a blend of freq/factor and freq.
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SpecialToken {
    Text(String),
    Added { content: String },
}

impl SpecialToken {
    fn text(&self) -> &str {
        match self {
            Self::Text(text) | Self::Added { content: text } => text,
        }
    }
}

/// A chat template: one, or several by name (`default` is used).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ChatTemplates {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    bos_token: Option<SpecialToken>,
    eos_token: Option<SpecialToken>,
    add_bos_token: Option<bool>,
    chat_template: Option<ChatTemplates>,
}

/// One id or several (`generation_config.json`'s `eos_token_id`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Ids {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Debug, Default, Deserialize)]
struct GenerationConfig {
    eos_token_id: Option<Ids>,
}

fn read_json<T: for<'de> Deserialize<'de> + Default>(path: &Path) -> Result<T, ModelError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| ModelError::Load(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(ModelError::Load(format!("{}: {e}", path.display()))),
    }
}

/// The vocabulary of a Hugging Face directory: `tokenizer.json`, with the special tokens
/// and chat template of `tokenizer_config.json` and the end tokens of
/// `generation_config.json`.
pub fn hf_vocab(dir: &Path) -> Result<Vocab, ModelError> {
    let path = dir.join("tokenizer.json");
    let tokenizer = Tokenizer::from_file(&path).map_err(|e| {
        ModelError::Load(format!(
            "{}: {e} (a safetensors model needs its tokenizer.json)",
            path.display()
        ))
    })?;
    let config: TokenizerConfig = read_json(&dir.join("tokenizer_config.json"))?;
    let generation: GenerationConfig = read_json(&dir.join("generation_config.json"))?;
    let id =
        |token: &Option<SpecialToken>| token.as_ref().and_then(|t| tokenizer.token_to_id(t.text()));
    let bos = id(&config.bos_token);
    let mut end_tokens: Vec<u32> = match generation.eos_token_id {
        Some(Ids::One(id)) => vec![id],
        Some(Ids::Many(ids)) => ids,
        None => Vec::new(),
    };
    end_tokens.extend(id(&config.eos_token));
    end_tokens.dedup();
    let eos = id(&config.eos_token)
        .or_else(|| end_tokens.first().copied())
        .ok_or_else(|| {
            ModelError::Load(format!(
                "{}: no eos_token in tokenizer_config.json or generation_config.json",
                dir.display()
            ))
        })?;
    let chat_template = match config.chat_template {
        Some(ChatTemplates::One(source)) => Some(source),
        Some(ChatTemplates::Named(named)) => named
            .into_iter()
            .find(|t| t.name == "default")
            .map(|t| t.template),
        None => None,
    };
    Ok(Vocab {
        tokenizer,
        bos,
        eos,
        end_tokens,
        add_bos: config.add_bos_token.unwrap_or(false),
        chat_template,
    })
}

/// Whether `path` is a Hugging Face safetensors directory.
pub fn is_safetensors_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}
