//! What every text encoder is to its caller: the [`TextEncoder`] trait, the [`EncoderSpec`] it
//! answers, and pooling of its hidden states. A leaf: the implementations (`bert.rs`'s
//! `FastBert`, `cpu_bert`'s `CpuBert`, `qwen3.rs`, the candle-transformers fallback) build on
//! it, and `load.rs` picks one for a model.

use candle_core::{D, DType, Tensor};

use super::model_files::Pooling;

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
