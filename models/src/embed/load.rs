//! The dispatch from a model's files to the encoder that runs it: `FastBert` (and `CpuBert`
//! on the CPU in f32) for BERT and MPNet, the candle-transformers BERT for what those do not
//! support, Qwen3 for decoder embedders. One level above the implementations, which know only
//! the trait in `encoder.rs`.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};

use super::bert::{BertConfig as FastBertConfig, FastBert};
use super::cpu_bert::CpuBert;
use super::encoder::{EncoderSpec, PaddingSide, TextEncoder};
use super::model_files::{Architecture, ModelLayout};
use super::qwen3;
use crate::ModelError;

/// BERT as candle-transformers runs it: the fallback for configurations [`FastBert`] does
/// not support.
struct CandleTransformersBert {
    model: BertModel,
    hidden: usize,
    pad_id: u32,
}

impl TextEncoder for CandleTransformersBert {
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
            let fast = serde_json::from_str::<FastBertConfig>(&config_text)
                .map_err(load_err)?
                .check_bounds()?;
            if fast.supported() {
                let model = FastBert::load(fast, weights)
                    .map_err(|e| ModelError::Load(format!("bert weights: {e}")))?;
                if device.is_cpu() && dtype == DType::F32 {
                    let model = CpuBert::from_model(&model)
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
            Ok(Box::new(CandleTransformersBert {
                model,
                hidden: fast.hidden_size,
                pad_id: fast.pad_token_id,
            }))
        }
        Architecture::Qwen3 => qwen3::load(&config_text, weights),
    }
}
