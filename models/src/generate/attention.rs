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

/// Rows of one sequence attended in one task: they share its keys and values, widened to
/// f32 once for all of them and all the query heads of a KV head.
const ROWS_PER_TASK: usize = 32;

/// Each row's attention output (`rows x heads*head_dim`), from its queries `q` (same shape,
/// after RoPE) over its own sequence's cache in `layer`, positions `0..=pos`.
pub fn attend(shape: Heads, rows: &[Row], q: &[f32], kv: &KvArena, layer: usize) -> Vec<f32> {
    let hidden = shape.heads * shape.head_dim;
    // Each slot's rows, in order, cut into tasks, once per KV head.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| rows[i].slot);
    let tasks: Vec<(usize, &[usize])> = order
        .chunk_by(|&a, &b| rows[a].slot == rows[b].slot)
        .flat_map(|same_slot| same_slot.chunks(ROWS_PER_TASK))
        .flat_map(|indices| (0..shape.kv_heads).map(move |kv_head| (kv_head, indices)))
        .collect();
    let outputs: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(kv_head, indices)| attend_task(shape, rows, indices, q, kv, layer, kv_head))
        .collect();
    let group = shape.heads / shape.kv_heads;
    let width = group * shape.head_dim;
    let mut out = vec![0.0f32; rows.len() * hidden];
    for (&(kv_head, indices), output) in tasks.iter().zip(&outputs) {
        for (&i, heads) in indices.iter().zip(output.chunks_exact(width)) {
            let at = i * hidden + kv_head * width;
            out[at..at + width].copy_from_slice(heads);
        }
    }
    out
}

/// The outputs of the query heads of `kv_head` for the rows `indices` (all of one slot),
/// row by row: the cache's keys widened once as `[pos][dim]`, its values as `[dim][pos]`,
/// so that both products read memory in order.
fn attend_task(
    shape: Heads,
    rows: &[Row],
    indices: &[usize],
    q: &[f32],
    kv: &KvArena,
    layer: usize,
    kv_head: usize,
) -> Vec<f32> {
    let d = shape.head_dim;
    let group = shape.heads / shape.kv_heads;
    let cache = &kv.slots[rows[indices[0]].slot];
    let len = indices.iter().map(|&i| rows[i].pos + 1).max().unwrap_or(0);
    SCRATCH.with_borrow_mut(|scratch| {
        let Scratch {
            keys,
            values,
            value_row,
            weights,
        } = scratch;
        keys.resize(len * d, 0.0);
        values.resize(d * len, 0.0);
        value_row.resize(d, 0.0);
        for p in 0..len {
            let at = p * kv.kv_dim + kv_head * d;
            cache.k[layer][at..at + d].convert_to_f32_slice(&mut keys[p * d..(p + 1) * d]);
            cache.v[layer][at..at + d].convert_to_f32_slice(value_row);
            for (dim, &value) in value_row.iter().enumerate() {
                values[dim * len + p] = value;
            }
        }
        let hidden = shape.heads * d;
        let mut out = vec![0.0f32; indices.len() * group * d];
        for (&i, out_row) in indices.iter().zip(out.chunks_exact_mut(group * d)) {
            let seen = rows[i].pos + 1;
            for (g, out_head) in out_row.chunks_exact_mut(d).enumerate() {
                let head = kv_head * group + g;
                let q_head = &q[i * hidden + head * d..i * hidden + (head + 1) * d];
                softmax_weights(q_head, &keys[..seen * d], weights);
                weigh_values(weights, &values[..d * len], len, out_head);
            }
        }
        out
    })
}

/// A worker thread's buffers for the widened keys and values, kept between tasks: a fresh
/// allocation of that size per task cost the kernel a page clearing each time.
#[derive(Default)]
struct Scratch {
    keys: Vec<f32>,
    values: Vec<f32>,
    value_row: Vec<f32>,
    weights: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// The softmax of the query's scaled dot products with `keys` (`[pos][dim]`), each weight
/// rounded through f16, into `weights`. Loops, not closures: a closure would be compiled
/// without the function's target features, its fused multiply-adds a libm call each.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
fn softmax_weights(q: &[f32], keys: &[f32], weights: &mut Vec<f32>) {
    let d = q.len();
    let scale = 1.0 / (d as f32).sqrt();
    let mut q_half = Vec::with_capacity(d);
    for &value in q {
        q_half.push(f16::from_f32(value).to_f32());
    }
    weights.clear();
    // Four keys at a time: four independent sums, each in its own order.
    let mut quads = keys.chunks_exact(4 * d);
    for quad in &mut quads {
        let keys: [&[f32]; 4] = std::array::from_fn(|k| &quad[k * d..(k + 1) * d]);
        for score in lanes::dot4(&q_half, keys) {
            weights.push(score * scale);
        }
    }
    for key in quads.remainder().chunks_exact(d) {
        weights.push(lanes::dot(&q_half, key) * scale);
    }
    // The maximum in 8 lanes (the compiler leaves `f32::max`'s NaN rule scalar).
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    for chunk in weights.chunks(LANES) {
        for (m, &score) in lane_max.iter_mut().zip(chunk) {
            *m = if score > *m { score } else { *m };
        }
    }
    let max = lane_max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    for score in weights.iter_mut() {
        *score = (*score - max).exp();
    }
    // Each 8 weights summed as a register, the blocks' sums in f64.
    let mut total = 0.0f64;
    for block in weights.chunks(LANES) {
        let mut lanes = [0.0f32; LANES];
        lanes[..block.len()].copy_from_slice(block);
        total += f64::from(lanes::hsum(lanes));
    }
    let inverse = (1.0 / total) as f32;
    let mut halves = [f16::ZERO; 256];
    for chunk in weights.chunks_mut(256) {
        for weight in chunk.iter_mut() {
            *weight *= inverse;
        }
        let halves = &mut halves[..chunk.len()];
        halves.convert_from_f32_slice(chunk);
        halves.convert_to_f32_slice(chunk);
    }
}

/// `out[dim] = Σ_p weights[p] * values[dim][p]` over the weights' positions, position `p`
/// in lane `p % 8`; `values` is `[dim][pos]`, `stride` positions a dimension.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
fn weigh_values(weights: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    let seen = weights.len();
    let dims = |dim: usize| &values[dim * stride..dim * stride + seen];
    let done = out.len() / 4 * 4;
    let mut quads = out.chunks_exact_mut(4);
    for (q, quad) in (&mut quads).enumerate() {
        let rows: [&[f32]; 4] = [
            dims(4 * q),
            dims(4 * q + 1),
            dims(4 * q + 2),
            dims(4 * q + 3),
        ];
        quad.copy_from_slice(&lanes::dot4(weights, rows));
    }
    for (k, o) in quads.into_remainder().iter_mut().enumerate() {
        *o = lanes::dot(weights, dims(done + k));
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
