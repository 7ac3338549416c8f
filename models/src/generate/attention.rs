//! Causal attention over each sequence's KV cache, with llama.cpp's arithmetic.
//!
//! Keys and values are kept in f16, as llama.cpp keeps its KV cache by default: half the
//! memory of f32, and the same rounding. The products go through f16 as llama.cpp's CPU
//! matmuls on an f16 cache do: a query is rounded to f16 before its dot products with the
//! keys, and the softmax weights are rounded to f16 before they weigh the values. Dot
//! products over head dimensions, and sums over positions, run in 8 lanes (`lanes.rs`).

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::lanes::{self, LANES};
use super::llama::Row;

/// The KV caches of the sequences in flight, one per slot; a slot's buffers keep their
/// memory when a new sequence takes it.
pub struct KvArena {
    kv_dim: usize,
    layers: usize,
    slots: Vec<SlotCache>,
}

#[derive(Default)]
struct SlotCache {
    /// Per layer, `[pos][kv_head][head_dim]`.
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

impl KvArena {
    pub fn new(layers: usize, kv_dim: usize, slots: usize) -> Self {
        Self {
            kv_dim,
            layers,
            slots: (0..slots).map(|_| SlotCache::default()).collect(),
        }
    }

    /// Makes room in `slot` for positions `0..len`.
    pub fn reserve(&mut self, slot: usize, len: usize) {
        let (layers, width) = (self.layers, len * self.kv_dim);
        let cache = &mut self.slots[slot];
        for side in [&mut cache.k, &mut cache.v] {
            side.resize_with(layers, Vec::new);
            for layer in side.iter_mut() {
                if layer.len() < width {
                    layer.resize(width, f16::ZERO);
                }
            }
        }
    }

    /// Stores a token's key and value (rounded to f16) at `pos` of `slot`, in `layer`.
    pub fn store(&mut self, slot: usize, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let at = pos * self.kv_dim..(pos + 1) * self.kv_dim;
        let cache = &mut self.slots[slot];
        cache.k[layer][at.clone()].convert_from_f32_slice(key);
        cache.v[layer][at].convert_from_f32_slice(value);
    }
}

/// The attention's shape.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Each row's attention output (`rows x heads*head_dim`), from its queries `q` (same shape,
/// after RoPE) over its own sequence's cache in `layer`, positions `0..=pos`.
pub fn attend(shape: Heads, rows: &[Row], q: &[f32], kv: &KvArena, layer: usize) -> Vec<f32> {
    let Heads {
        heads,
        kv_heads,
        head_dim: d,
    } = shape;
    let hidden = heads * d;
    let mut out = vec![0.0f32; rows.len() * hidden];
    out.par_chunks_mut(d)
        .enumerate()
        .for_each(|(index, out_head)| {
            let (i, head) = (index / heads, index % heads);
            let row = rows[i];
            let cache = &kv.slots[row.slot];
            let kv_head = head / (heads / kv_heads);
            let q_head = &q[i * hidden + head * d..i * hidden + (head + 1) * d];
            let offset = kv_head * d;
            let (keys, values) = (&cache.k[layer][offset..], &cache.v[layer][offset..]);
            let weights = softmax_weights(q_head, keys, kv.kv_dim, row.pos + 1);
            weigh_values(&weights, values, kv.kv_dim, out_head);
        });
    out
}

/// The softmax of the query's scaled dot products with the keys at positions `0..len`,
/// each weight rounded through f16. Loops, not closures: a closure would be compiled
/// without the function's target features, its fused multiply-adds a libm call each.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
fn softmax_weights(q: &[f32], keys: &[f16], stride: usize, len: usize) -> Vec<f32> {
    let d = q.len();
    let scale = 1.0 / (d as f32).sqrt();
    let mut q_half = vec![0.0f32; d];
    for (rounded, &value) in q_half.iter_mut().zip(q) {
        *rounded = f16::from_f32(value).to_f32();
    }
    let mut k_row = vec![0.0f32; d];
    let mut scores = Vec::with_capacity(len);
    for p in 0..len {
        keys[p * stride..p * stride + d].convert_to_f32_slice(&mut k_row);
        scores.push(lanes::dot(&q_half, &k_row) * scale);
    }
    let mut max = f32::NEG_INFINITY;
    for &score in &scores {
        max = max.max(score);
    }
    for score in &mut scores {
        *score = (*score - max).exp();
    }
    // Each 8 weights summed as a register, the blocks' sums in f64.
    let mut total = 0.0f64;
    for block in scores.chunks(LANES) {
        let mut lanes = [0.0f32; LANES];
        lanes[..block.len()].copy_from_slice(block);
        total += f64::from(lanes::hsum(lanes));
    }
    let inverse = (1.0 / total) as f32;
    for weight in &mut scores {
        *weight = f16::from_f32(*weight * inverse).to_f32();
    }
    scores
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
/// `out = Σ_p weights[p] * values[p]`, position `p` in lane `p % 8`.
fn weigh_values(weights: &[f32], values: &[f16], stride: usize, out: &mut [f32]) {
    let d = out.len();
    let mut acc = vec![0.0f32; LANES * d];
    let mut v_row = vec![0.0f32; d];
    for (p, &weight) in weights.iter().enumerate() {
        values[p * stride..p * stride + d].convert_to_f32_slice(&mut v_row);
        let lane = &mut acc[(p % LANES) * d..(p % LANES + 1) * d];
        for (sum, &v) in lane.iter_mut().zip(&v_row) {
            *sum = weight.mul_add(v, *sum);
        }
    }
    for (dim, o) in out.iter_mut().enumerate() {
        *o = lanes::hsum(std::array::from_fn(|lane| acc[lane * d + dim]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against attention in f64 over the f16-rounded keys and values: the same within f16's
    /// rounding of the query and the weights.
    #[test]
    fn attention_matches_a_plain_softmax_over_the_cache() {
        let shape = Heads {
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
        };
        let kv_dim = shape.kv_heads * shape.head_dim;
        let mut kv = KvArena::new(1, kv_dim, 1);
        let len = 11;
        kv.reserve(0, len);
        let value_at = |p: usize, j: usize, salt: f32| ((p * 31 + j) as f32 * salt).sin();
        for p in 0..len {
            let key: Vec<f32> = (0..kv_dim).map(|j| value_at(p, j, 0.7)).collect();
            let value: Vec<f32> = (0..kv_dim).map(|j| value_at(p, j, 0.3)).collect();
            kv.store(0, 0, p, &key, &value);
        }
        let q: Vec<f32> = (0..shape.heads * shape.head_dim)
            .map(|j| (j as f32 * 0.21).cos())
            .collect();
        let row = Row {
            slot: 0,
            pos: len - 1,
            token: 0,
            logits: false,
        };
        let out = attend(shape, &[row], &q, &kv, 0);
        let d = shape.head_dim;
        let rounded = |x: f32| f64::from(f16::from_f32(x).to_f32());
        for head in 0..shape.heads {
            let kv_head = head / 2;
            let scores: Vec<f64> = (0..len)
                .map(|p| {
                    (0..d)
                        .map(|j| {
                            f64::from(q[head * d + j]) * rounded(value_at(p, kv_head * d + j, 0.7))
                        })
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::MIN, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for j in 0..d {
                let expected: f64 = (0..len)
                    .map(|p| {
                        (scores[p] - max).exp() / total * rounded(value_at(p, kv_head * d + j, 0.3))
                    })
                    .sum();
                let ours = f64::from(out[head * d + j]);
                assert!(
                    (ours - expected).abs() < 2e-3,
                    "head {head} dim {j}: {ours} vs {expected}"
                );
            }
        }
    }
}
