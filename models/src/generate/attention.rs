//! Causal attention over each sequence's KV cache, with llama.cpp's arithmetic.
//!
//! Keys and values are kept in f16, as llama.cpp keeps its KV cache by default: half the
//! memory of f32, and the same rounding. The products go through f16 as llama.cpp's CPU
//! matmuls on an f16 cache do: a query is rounded to f16 before its dot products with the
//! keys, and the softmax weights are rounded to f16 before they weigh the values. Dot
//! products over head dimensions, and sums over positions, run in 8 lanes, as a llama.cpp
//! build for an AVX2 host sums them (16 with `RESIDENT_SUM_LANES=16`, as a build for
//! AVX-512 does; `lanes.rs`).

use rayon::prelude::*;

use super::cache_lanes::{self, CachedHead};
use super::decoder::Row;
use super::f16_slices;
use super::kv_arena::{KvArena, SlotCache};
use super::lanes::{self, LANES, Width};
use crate::embed::cpu_ops;

/// The attention's shape.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Rows of one sequence attended in one task: they share its keys and values, widened to
/// f32 once for all of them and all the query heads of a KV head.
const ROWS_PER_TASK: usize = 64;

/// Each row's attention output (`rows x heads*head_dim`), from its queries `q` (same shape,
/// after RoPE) over its own sequence's cache in `layer`, positions `0..=pos`, into `out`
/// (whose memory is reused).
pub fn attend(
    shape: Heads,
    rows: &[Row],
    q: &[f32],
    kv: &KvArena,
    layer: usize,
    out: &mut Vec<f32>,
) {
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
    // Where each row's output is, by task: (task, position among the task's rows).
    let mut found = vec![(0, 0); rows.len() * shape.kv_heads];
    for (task, &(kv_head, indices)) in tasks.iter().enumerate() {
        for (k, &i) in indices.iter().enumerate() {
            found[i * shape.kv_heads + kv_head] = (task, k);
        }
    }
    out.resize(rows.len() * hidden, 0.0);
    out.par_chunks_mut(width)
        .with_min_len(64)
        .zip(found)
        .for_each(|(heads, (task, k))| {
            heads.copy_from_slice(&outputs[task][k * width..(k + 1) * width]);
        });
}

/// The outputs of the query heads of `kv_head` for the rows `indices` (all of one slot),
/// row by row. A few rows read the f16 cache as it is ([`cache_lanes`]); more share one
/// widening of it to f32, keys as `[pos][dim]` and values as `[dim][pos]`, so that both
/// products read memory in order. Both give the same bits.
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
    let cache = &kv.slot(rows[indices[0]].slot);
    let width = Width::configured();
    let hidden = shape.heads * d;
    let q_group = |i: usize| &q[i * hidden + kv_head * group * d..][..group * d];
    // Each row's queries of the group, and the positions it sees.
    let queries: Vec<(&[f32], usize)> = indices
        .iter()
        .map(|&i| (q_group(i), rows[i].pos + 1))
        .collect();
    let mut out = vec![0.0f32; indices.len() * group * d];
    SCRATCH.with_borrow_mut(|scratch| {
        if indices.len() <= CACHED_ROWS && cache_lanes::applies(width, d) {
            let head = |data| CachedHead {
                data,
                stride: kv.kv_dim(),
                offset: kv_head * d,
                head_dim: d,
            };
            let source = Cached {
                keys: head(&cache.k[layer]),
                values: head(&cache.v[layer]),
            };
            attend_rows(width, &source, &queries, scratch, &mut out);
            return;
        }
        let len = indices.iter().map(|&i| rows[i].pos + 1).max().unwrap_or(0);
        let (keys, values) = widen(cache, (layer, kv_head * d, kv.kv_dim()), d, len, scratch);
        let source = Widened {
            keys: &keys,
            values: &values,
            stride: len,
            head_dim: d,
        };
        attend_rows(width, &source, &queries, scratch, &mut out);
        (scratch.keys, scratch.values) = (keys, values);
    });
    out
}

/// The positions `0..len` of one KV head (at `offset` of each position's `stride` values
/// in `layer`) widened to f32: keys as `[pos][dim]`, values as `[dim][pos]`, in the
/// memory of `scratch`'s buffers (taken from it; the caller gives them back).
fn widen(
    cache: &SlotCache,
    (layer, offset, stride): (usize, usize, usize),
    d: usize,
    len: usize,
    scratch: &mut Scratch,
) -> (Vec<f32>, Vec<f32>) {
    let (mut keys, mut values) = (
        std::mem::take(&mut scratch.keys),
        std::mem::take(&mut scratch.values),
    );
    keys.resize(len * d, 0.0);
    values.resize(d * len, 0.0);
    let value_rows = &mut scratch.value_rows;
    value_rows.resize(TRANSPOSED_POSITIONS * d, 0.0);
    // The values transposed a few positions at a time, so that each store fills part of a
    // cache line rather than touching one line per value.
    for first in (0..len).step_by(TRANSPOSED_POSITIONS) {
        let count = TRANSPOSED_POSITIONS.min(len - first);
        for (r, value_row) in value_rows.chunks_exact_mut(d).take(count).enumerate() {
            let p = first + r;
            let at = p * stride + offset;
            f16_slices::widen(&cache.k[layer][at..at + d], &mut keys[p * d..(p + 1) * d]);
            f16_slices::widen(&cache.v[layer][at..at + d], value_row);
        }
        for dim in 0..d {
            let column = &mut values[dim * len + first..dim * len + first + count];
            for (r, value) in column.iter_mut().enumerate() {
                *value = value_rows[r * d + dim];
            }
        }
    }
    (keys, values)
}

/// Each row's group of query heads (`queries`: the heads, and the positions the row sees)
/// over `source`, into its part of `out`.
fn attend_rows<S: KeyValues>(
    width: Width,
    source: &S,
    queries: &[(&[f32], usize)],
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    let per_row = out.len() / queries.len().max(1);
    for (&(q, seen), out_row) in queries.iter().zip(out.chunks_exact_mut(per_row)) {
        attend_group(width, q, source, seen, scratch, out_row);
    }
}

/// One row's query heads of one KV head (`q`, `group x head_dim`) over its `seen`
/// positions of `source`, three heads at a time (they share every key and value read),
/// into `out` (the same shape).
fn attend_group<S: KeyValues>(
    width: Width,
    q: &[f32],
    source: &S,
    seen: usize,
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    let d = source.head_dim();
    let group = q.len() / d;
    let mut done = 0;
    while done < group {
        let run = HEADS_AT_ONCE.min(group - done);
        let q_heads = &q[done * d..(done + run) * d];
        let out_heads = &mut out[done * d..(done + run) * d];
        let buffers = (&mut scratch.queries[..], &mut scratch.weights[..]);
        match run {
            3 => attend_heads::<3, S>(width, q_heads, source, seen, buffers, out_heads),
            2 => attend_heads::<2, S>(width, q_heads, source, seen, buffers, out_heads),
            _ => attend_heads::<1, S>(width, q_heads, source, seen, buffers, out_heads),
        }
        done += run;
    }
}

/// Query heads of one KV head attended together (at most 3: [`lanes::dot_block`]).
const HEADS_AT_ONCE: usize = 3;
/// Positions whose values are transposed together.
const TRANSPOSED_POSITIONS: usize = 8;
/// A task of at most this many rows reads the f16 cache as it is; more rows share one
/// widened copy.
const CACHED_ROWS: usize = 4;

/// A worker thread's buffers for the widened keys and values, the queries in f16 and the
/// softmax weights, kept between tasks: a fresh allocation of that size per task cost the
/// kernel a page clearing each time.
#[derive(Default)]
struct Scratch {
    keys: Vec<f32>,
    values: Vec<f32>,
    value_rows: Vec<f32>,
    queries: [Vec<f32>; HEADS_AT_ONCE],
    weights: [Vec<f32>; HEADS_AT_ONCE],
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// One KV head's keys and values, as attention's two products read them.
trait KeyValues {
    fn head_dim(&self) -> usize;
    /// The dots of `M` queries with the keys at positions `first..first + 4`.
    fn scores<const M: usize>(
        &self,
        width: Width,
        queries: [&[f32]; M],
        first: usize,
    ) -> [[f32; 4]; M];
    /// The dot of `query` with the key at `p`.
    fn score(&self, width: Width, query: &[f32], p: usize) -> f32;
    /// `out[m * head_dim + i]`: the dot of `weights[m]` with dimension `i` of the values
    /// at positions `0..weights[m].len()`.
    fn weigh<const M: usize>(&self, width: Width, weights: [&[f32]; M], out: &mut [f32]);
}

/// Keys and values widened to f32 ([`widen`]): keys `[pos][dim]`, values `[dim][pos]`
/// with `stride` positions a dimension.
struct Widened<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    stride: usize,
    head_dim: usize,
}

impl KeyValues for Widened<'_> {
    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn scores<const M: usize>(
        &self,
        width: Width,
        queries: [&[f32]; M],
        first: usize,
    ) -> [[f32; 4]; M] {
        let d = self.head_dim;
        let keys = std::array::from_fn(|k| &self.keys[(first + k) * d..(first + k + 1) * d]);
        lanes::dot_block(width, queries, keys)
    }

    fn score(&self, width: Width, query: &[f32], p: usize) -> f32 {
        let d = self.head_dim;
        lanes::dot(width, query, &self.keys[p * d..(p + 1) * d])
    }

    fn weigh<const M: usize>(&self, width: Width, weights: [&[f32]; M], out: &mut [f32]) {
        let (d, seen) = (self.head_dim, weights[0].len());
        let dims = |dim: usize| &self.values[dim * self.stride..dim * self.stride + seen];
        for first in (0..d / 4 * 4).step_by(4) {
            let rows: [&[f32]; 4] = std::array::from_fn(|k| dims(first + k));
            for (m, sums) in lanes::dot_block(width, weights, rows)
                .into_iter()
                .enumerate()
            {
                out[m * d + first..m * d + first + 4].copy_from_slice(&sums);
            }
        }
        for dim in d / 4 * 4..d {
            for (m, weights) in weights.iter().enumerate() {
                out[m * d + dim] = lanes::dot(width, weights, dims(dim));
            }
        }
    }
}

/// Keys and values read from the f16 cache as they are ([`cache_lanes`]; 8 lanes only).
struct Cached<'a> {
    keys: CachedHead<'a>,
    values: CachedHead<'a>,
}

impl KeyValues for Cached<'_> {
    fn head_dim(&self) -> usize {
        self.keys.head_dim
    }

    fn scores<const M: usize>(
        &self,
        _: Width,
        queries: [&[f32]; M],
        first: usize,
    ) -> [[f32; 4]; M] {
        cache_lanes::dot_block(queries, self.keys, first)
    }

    fn score(&self, width: Width, query: &[f32], p: usize) -> f32 {
        let mut key = [0.0f32; cache_lanes::MAX_HEAD_DIM];
        let key = &mut key[..self.keys.head_dim];
        f16_slices::widen(self.keys.at(p), key);
        lanes::dot(width, query, key)
    }

    fn weigh<const M: usize>(&self, _: Width, weights: [&[f32]; M], out: &mut [f32]) {
        cache_lanes::weighted_values(weights, self.values, out);
    }
}

/// `M` heads' (`q`, `M x head_dim`) attention over the positions `0..seen` of `source`
/// into `out` (`M x head_dim`).
fn attend_heads<const M: usize, S: KeyValues>(
    width: Width,
    q: &[f32],
    source: &S,
    seen: usize,
    (queries, weights): (&mut [Vec<f32>], &mut [Vec<f32>]),
    out: &mut [f32],
) {
    let d = q.len() / M;
    let scale = 1.0 / (d as f32).sqrt();
    // Each query rounded to f16, as llama.cpp's matmul with an f16 cache rounds it.
    for (rounded, head) in queries.iter_mut().zip(q.chunks_exact(d)) {
        rounded.clear();
        rounded.extend_from_slice(head);
        f16_slices::round_through_f16(rounded);
    }
    let queries: [&[f32]; M] = std::array::from_fn(|m| queries[m].as_slice());
    let weights = &mut weights[..M];
    for scores in weights.iter_mut() {
        scores.clear();
    }
    // Four keys at a time for all heads: independent sums, each in its own order.
    for first in (0..seen / 4 * 4).step_by(4) {
        let dots = source.scores(width, queries, first);
        for (scores, dots) in weights.iter_mut().zip(dots) {
            scores.extend(dots.map(|dot| dot * scale));
        }
    }
    for p in seen / 4 * 4..seen {
        for (scores, query) in weights.iter_mut().zip(queries) {
            scores.push(source.score(width, query, p) * scale);
        }
    }
    for scores in weights.iter_mut() {
        softmax(width, scores);
    }
    let weights: [&[f32]; M] = std::array::from_fn(|m| weights[m].as_slice());
    source.weigh(width, weights, out);
}

/// The softmax of scaled scores in place, each weight rounded through f16. Loops, not
/// closures: a closure would be compiled without the function's target features, its
/// fused multiply-adds a libm call each.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
fn softmax(width: Width, weights: &mut [f32]) {
    // The maximum in 8 lanes (the compiler leaves `f32::max`'s NaN rule scalar), whole
    // registers first: a loop over chunks of any length kept the lanes in memory, each
    // masked store stalling the next load (82% of this function's time).
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let mut chunks = weights.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &score) in lane_max.iter_mut().zip(chunk) {
            *m = if score > *m { score } else { *m };
        }
    }
    for (m, &score) in lane_max.iter_mut().zip(chunks.remainder()) {
        *m = if score > *m { score } else { *m };
    }
    let max = lane_max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    cpu_ops::exp_shifted(weights, max);
    // Each register of weights summed as one, the registers' sums in f64.
    let total = lanes::sum_by_register(width, weights);
    let inverse = (1.0 / total) as f32;
    for weight in weights.iter_mut() {
        *weight *= inverse;
    }
    f16_slices::round_through_f16(weights);
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::generate::decoder::Pick;

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
        kv.reserve(0, len).unwrap();
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
            pick: Pick::Logits,
        };
        let mut out = Vec::new();
        attend(shape, &[row], &q, &kv, 0, &mut out);
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

    /// A row attended alone reads the f16 cache as it is; rows attended together widen it
    /// once. Every row's output is the same bits either way, for every head grouping.
    #[test]
    fn a_row_alone_and_rows_together_attend_to_the_same_bits() {
        for (heads, kv_heads) in [(9, 3), (4, 2), (4, 4), (8, 1)] {
            let shape = Heads {
                heads,
                kv_heads,
                head_dim: 64,
            };
            let (kv_dim, hidden) = (kv_heads * 64, heads * 64);
            let len = 70;
            let mut kv = KvArena::new(2, kv_dim, 1);
            kv.reserve(0, len).unwrap();
            let value_at = |p: usize, j: usize, salt: f32| ((p * 31 + j) as f32 * salt).sin();
            for p in 0..len {
                let key: Vec<f32> = (0..kv_dim).map(|j| value_at(p, j, 0.7) * 3.0).collect();
                let value: Vec<f32> = (0..kv_dim).map(|j| value_at(p, j, 0.3)).collect();
                kv.store(0, 1, p, &key, &value);
            }
            let rows: Vec<Row> = (0..len)
                .map(|pos| Row {
                    slot: 0,
                    pos,
                    token: 0,
                    logits: false,
                    pick: Pick::Logits,
                })
                .collect();
            let q: Vec<f32> = (0..len * hidden)
                .map(|j| (j as f32 * 0.013).cos() * 2.0)
                .collect();
            let mut together = Vec::new();
            attend(shape, &rows, &q, &kv, 1, &mut together);
            for (i, row) in rows.iter().enumerate() {
                let mut alone = Vec::new();
                let q_row = &q[i * hidden..(i + 1) * hidden];
                attend(shape, std::slice::from_ref(row), q_row, &kv, 1, &mut alone);
                let together = &together[i * hidden..(i + 1) * hidden];
                let same = alone
                    .iter()
                    .zip(together)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{heads}/{kv_heads} heads, row {i}");
            }
        }
    }
}
