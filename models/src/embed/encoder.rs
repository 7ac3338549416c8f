//! Transformer forward passes behind one small trait, and pooling.

use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};

use super::model_files::{Architecture, ModelLayout, Pooling};
use crate::ModelError;

/// Which side padding goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaddingSide {
    Right,
    Left,
}

/// What the caller of an encoder needs to know to feed it and to size its output.
#[derive(Clone, Copy, Debug)]
pub struct EncoderSpec {
    pub hidden_size: usize,
    pub pad_id: u32,
    pub padding_side: PaddingSide,
}

/// A text encoder: token ids and attention mask in, hidden states `[batch, seq, hidden]` out.
pub trait TextEncoder: Send {
    fn forward(&mut self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor>;
    fn spec(&self) -> EncoderSpec;

    /// Pooled vectors for unpadded token sequences, for encoders that run without padding;
    /// `None` makes the caller pad, call [`TextEncoder::forward`] and pool.
    fn embed_unpadded(
        &mut self,
        _sequences: &[&[u32]],
        _pooling: Pooling,
        _normalize: bool,
    ) -> Option<candle_core::Result<Vec<Vec<f32>>>> {
        None
    }
}

struct Bert {
    model: BertModel,
    hidden: usize,
    pad_id: u32,
}

impl TextEncoder for Bert {
    fn forward(&mut self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let type_ids = ids.zeros_like()?;
        self.model.forward(ids, &type_ids, Some(mask))
    }

    fn spec(&self) -> EncoderSpec {
        EncoderSpec {
            hidden_size: self.hidden,
            pad_id: self.pad_id,
            padding_side: PaddingSide::Right,
        }
    }
}

fn load_err(error: impl std::fmt::Display) -> ModelError {
    ModelError::Load(error.to_string())
}

/// Loads the weights onto `device` in `dtype`.
pub fn load_encoder(
    layout: &ModelLayout,
    device: &Device,
    dtype: DType,
) -> Result<Box<dyn TextEncoder>, ModelError> {
    let config_text = std::fs::read_to_string(layout.dir.join("config.json")).map_err(load_err)?;
    // SAFETY: the weight files are memory-mapped read-only and not modified while loaded.
    #[allow(unsafe_code)]
    let weights = unsafe { VarBuilder::from_mmaped_safetensors(&layout.weights, dtype, device) }
        .map_err(load_err)?;
    match layout.architecture {
        Architecture::Bert => {
            let fast = serde_json::from_str::<super::bert::BertConfig>(&config_text)
                .map_err(load_err)?
                .check_bounds()?;
            if fast.supported() {
                let model = super::bert::FastBert::load(fast, weights)
                    .map_err(|e| ModelError::Load(format!("bert weights: {e}")))?;
                if device.is_cpu() && dtype == DType::F32 {
                    let model = super::cpu_bert::CpuBert::from_model(&model)
                        .map_err(|e| ModelError::Load(format!("bert weights: {e}")))?;
                    return Ok(Box::new(model));
                }
                return Ok(Box::new(model));
            }
            if fast.is_mpnet() {
                return Err(ModelError::Load(format!(
                    "mpnet with hidden_act `{}` and position_embedding_type `{}` is not \
                     supported (only gelu with absolute positions)",
                    fast.hidden_act, fast.position_embedding_type
                )));
            }
            let config: BertConfig = serde_json::from_str(&config_text).map_err(load_err)?;
            let model = BertModel::load(weights, &config)
                .map_err(|e| ModelError::Load(format!("bert weights: {e}")))?;
            Ok(Box::new(Bert {
                model,
                hidden: fast.hidden_size,
                pad_id: fast.pad_token_id,
            }))
        }
        Architecture::Qwen3 => super::qwen3::load(&config_text, weights),
    }
}

/// Pools hidden states `[b, l, h]` with the mask `[b, l]` (1 = real token) into `[b, h]` f32.
pub fn pool(
    hidden: &Tensor,
    mask: &Tensor,
    pooling: Pooling,
    side: PaddingSide,
    normalize: bool,
) -> candle_core::Result<Tensor> {
    let hidden = hidden.to_dtype(DType::F32)?;
    let mask_f = mask.to_dtype(DType::F32)?;
    let pooled = match pooling {
        Pooling::Mean => {
            let summed = hidden.broadcast_mul(&mask_f.unsqueeze(2)?)?.sum(1)?;
            let counts = mask_f.sum_keepdim(1)?.clamp(1e-9, f64::MAX)?;
            summed.broadcast_div(&counts)?
        }
        Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1)?,
        Pooling::LastToken => {
            let seq = hidden.dim(1)?;
            let last: Vec<u32> = match side {
                PaddingSide::Left => vec![(seq - 1) as u32; hidden.dim(0)?],
                PaddingSide::Right => mask_f
                    .sum(1)?
                    .to_vec1::<f32>()?
                    .into_iter()
                    .map(|n| (n as u32).max(1) - 1)
                    .collect(),
            };
            let rows: Vec<Tensor> = last
                .iter()
                .enumerate()
                .map(|(row, &at)| hidden.get(row)?.get(at as usize))
                .collect::<candle_core::Result<_>>()?;
            Tensor::stack(&rows, 0)?
        }
    };
    if normalize {
        let norms = pooled
            .sqr()?
            .sum_keepdim(D::Minus1)?
            .sqrt()?
            .clamp(1e-12, f64::MAX)?;
        pooled.broadcast_div(&norms)
    } else {
        Ok(pooled)
    }
}
