//! A GGUF file's tensors checked against its metadata before any is read. The forward
//! passes size their buffers and index the weights from the metadata's shape; a file
//! whose tensors disagree with it (corrupt, hand-edited, or hostile) would index past a
//! weight or compute garbage. The load refuses it instead, naming the tensor, both shapes
//! and the metadata keys they come from.

use candle_core::quantized::gguf_file::Content;

use super::decoder::LlamaConfig;
use crate::ModelError;

/// Checks every tensor the Llama layout names that the file has (a missing one is named
/// when it is read) against the shape `config` gives it, in candle's row-major order
/// (output features first).
pub fn check_tensor_shapes(content: &Content, config: &LlamaConfig) -> Result<(), ModelError> {
    for (name, expected) in expected_shapes(config) {
        let Some(info) = content.tensor_infos.get(&name) else {
            continue;
        };
        let found = info.shape.dims();
        if found != expected.as_slice() {
            return Err(ModelError::Load(format!(
                "GGUF tensor `{name}` has shape {found:?}, but the file's metadata says \
                 {expected:?} (hidden {}, {} heads and {} KV heads of {}, feed-forward {}, \
                 vocabulary {}, {} layers): the metadata disagrees with the tensors, so the \
                 file is corrupt or was edited; convert the model again",
                config.hidden,
                config.heads,
                config.kv_heads,
                config.head_dim,
                config.ffn,
                config.vocab,
                config.layers
            )));
        }
    }
    Ok(())
}

fn expected_shapes(c: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let queries = c.heads * c.head_dim;
    let mut shapes = vec![
        ("token_embd.weight".to_owned(), vec![c.vocab, c.hidden]),
        ("output.weight".to_owned(), vec![c.vocab, c.hidden]),
        ("output_norm.weight".to_owned(), vec![c.hidden]),
    ];
    for layer in 0..c.layers {
        let parts = [
            ("attn_norm", vec![c.hidden]),
            ("attn_q", vec![queries, c.hidden]),
            ("attn_k", vec![c.kv_dim(), c.hidden]),
            ("attn_v", vec![c.kv_dim(), c.hidden]),
            ("attn_output", vec![c.hidden, queries]),
            ("ffn_norm", vec![c.hidden]),
            ("ffn_gate", vec![c.ffn, c.hidden]),
            ("ffn_up", vec![c.ffn, c.hidden]),
            ("ffn_down", vec![c.hidden, c.ffn]),
        ];
        for (part, dims) in parts {
            shapes.push((format!("blk.{layer}.{part}.weight"), dims));
        }
    }
    shapes
}
