//! Attention's two products read straight from the f16 KV cache, in the lanes' order of
//! `lanes.rs` (8 lanes), so that a row attended alone needs no widened copy of its
//! sequence's keys and values: the scores (a query with each key, over head dimensions)
//! and the weighted values (each dimension's sum over positions, position `p` in lane
//! `p % 8`). Widening f16 to f32 is exact, so these give the same bits as the widened
//! path's [`lanes::dot_block`] and [`lanes::dot`]; the tests hold them to it.
//!
//! A decode row is one row of its sequence in a step: widening the whole cache for it
//! (keys as rows, values transposed) cost as much as its attention did. Rows prefilled
//! together share one widening, so they keep that path.

use half::f16;

use super::lanes::{self, LANES, Width};

/// One KV head's keys or values of one layer: position `p`'s `head_dim` values start at
/// `p * stride + offset` of `data`.
#[derive(Clone, Copy)]
pub struct CachedHead<'a> {
    pub data: &'a [f16],
    pub stride: usize,
    pub offset: usize,
    pub head_dim: usize,
}

impl<'a> CachedHead<'a> {
    pub fn at(&self, p: usize) -> &'a [f16] {
        let start = p * self.stride + self.offset;
        &self.data[start..start + self.head_dim]
    }
}

/// Whether these kernels take the sums of `width` over heads of `head_dim`: 8 lanes, whole
/// registers of head dimensions. The widened path takes the rest.
pub fn applies(width: Width, head_dim: usize) -> bool {
    width == Width::Eight && head_dim.is_multiple_of(LANES) && head_dim <= MAX_HEAD_DIM
}

/// The longest head these kernels take (their accumulators live on the stack).
pub const MAX_HEAD_DIM: usize = 256;

/// The scores of `M` queries with the keys at positions `first..first + 4`: each
/// [`lanes::dot`] of a query with a key, bit for bit.
pub fn dot_block<const M: usize>(
    queries: [&[f32]; M],
    keys: CachedHead<'_>,
    first: usize,
) -> [[f32; 4]; M] {
    let rows: [&[f16]; 4] = std::array::from_fn(|k| keys.at(first + k));
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked at run time); every row is
        // `head_dim` long, a whole number of registers ([`applies`]).
        #[allow(unsafe_code)]
        return unsafe { avx2::dot_block(queries, rows) };
    }
    let mut widened = [[0.0f32; MAX_HEAD_DIM]; 4];
    for (wide, row) in widened.iter_mut().zip(rows) {
        for (w, h) in wide.iter_mut().zip(row) {
            *w = h.to_f32();
        }
    }
    let d = keys.head_dim;
    let widened: [&[f32]; 4] = std::array::from_fn(|k| &widened[k][..d]);
    lanes::dot_block(Width::Eight, queries, widened)
}

/// `out[m * head_dim + i] = Σ_p weights[m][p] · values[p][i]` over the positions
/// `0..weights[m].len()`, position `p` into lane `p % 8` with fused multiply-adds and the
/// lanes reduced as [`lanes::hsum`]: [`lanes::dot`] of the weights with a column of the
/// values, bit for bit, with the registers running across dimensions instead.
pub fn weighted_values<const M: usize>(
    weights: [&[f32]; M],
    values: CachedHead<'_>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: as in `dot_block`.
        #[allow(unsafe_code)]
        return unsafe { avx2::weighted_values(weights, values, out) };
    }
    weighted_values_portable(weights, values, out);
}

/// [`weighted_values`] as a plain loop: the reference the SIMD kernel is held to.
fn weighted_values_portable<const M: usize>(
    weights: [&[f32]; M],
    values: CachedHead<'_>,
    out: &mut [f32],
) {
    let d = values.head_dim;
    for (m, weights) in weights.iter().enumerate() {
        let mut acc = [[0.0f32; LANES]; MAX_HEAD_DIM];
        for (p, &weight) in weights.iter().enumerate() {
            for (acc, value) in acc.iter_mut().zip(values.at(p)) {
                acc[p % LANES] = weight.mul_add(value.to_f32(), acc[p % LANES]);
            }
        }
        for (out, acc) in out[m * d..(m + 1) * d].iter_mut().zip(acc) {
            *out = lanes::hsum(acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{CachedHead, LANES};
    use crate::generate::lanes::avx2::hsum4;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// Eight f16 at `at`, widened.
    ///
    /// # Safety
    /// Eight values must be readable at `at`; the CPU must have F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen(at: *const f16) -> __m256 {
        // SAFETY: the caller's.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) }
    }

    /// [`super::dot_block`]: `lanes::avx2::dot_block` with the keys widened as loaded.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; every row must be `queries[0]`'s length, a
    /// multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_block<const M: usize>(
        queries: [&[f32]; M],
        keys: [&[f16]; 4],
    ) -> [[f32; 4]; M] {
        let len = queries[0].len();
        let queries = queries.map(|row| &row[..len]);
        let keys = keys.map(|row| &row[..len]);
        let mut sums = [[_mm256_setzero_ps(); 4]; M];
        for i in (0..len).step_by(LANES) {
            // SAFETY: `i + 8 <= len` for every row.
            unsafe {
                let x = queries.map(|row| _mm256_loadu_ps(row.as_ptr().add(i)));
                for (k, row) in keys.iter().enumerate() {
                    let y = widen(row.as_ptr().add(i));
                    for m in 0..M {
                        sums[m][k] = _mm256_fmadd_ps(x[m], y, sums[m][k]);
                    }
                }
            }
        }
        let mut totals = [[0.0f32; 4]; M];
        for (total, sums) in totals.iter_mut().zip(sums) {
            *total = hsum4(sums);
        }
        totals
    }

    /// [`super::weighted_values`]: for each query head and each 8 dimensions, one
    /// register per lane (position `p` into register `p % 8`), reduced across registers
    /// in [`crate::generate::lanes::hsum`]'s order.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `values.head_dim` must be a multiple of 8,
    /// `out` `M * head_dim` long, and every position of the weights in `values`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_values<const M: usize>(
        weights: [&[f32]; M],
        values: CachedHead<'_>,
        out: &mut [f32],
    ) {
        let d = values.head_dim;
        let seen = weights[0].len();
        assert!(out.len() >= M * d && (seen == 0 || values.at(seen - 1).len() == d));
        for (m, weights) in weights.iter().enumerate() {
            let weights = &weights[..seen];
            for first in (0..d).step_by(LANES) {
                let mut acc = [_mm256_setzero_ps(); LANES];
                // Eight positions at a time, one into each lane's register (constant
                // indices, so the registers stay registers), then the last few.
                for start in (0..seen).step_by(LANES) {
                    for (lane, acc) in acc.iter_mut().enumerate() {
                        let p = start + lane;
                        if p < seen {
                            // SAFETY: position `p < seen` is in `values` (asserted), and
                            // its dimensions `first..first + 8` within its `d`.
                            unsafe {
                                let value = widen(values.at(p).as_ptr().add(first));
                                *acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[p]), value, *acc);
                            }
                        }
                    }
                }
                let quarters: [__m256; 4] =
                    std::array::from_fn(|i| _mm256_add_ps(acc[i], acc[i + 4]));
                let total = _mm256_add_ps(
                    _mm256_add_ps(quarters[0], quarters[2]),
                    _mm256_add_ps(quarters[1], quarters[3]),
                );
                // SAFETY: `m * d + first + 8 <= M * d <= out.len()`.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(m * d + first), total) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of `len` positions, 3 KV heads of `d`, and the middle head's view of it.
    fn cache(len: usize, d: usize, salt: f32) -> Vec<f16> {
        (0..len * 3 * d)
            .map(|i| f16::from_f32((i as f32 * salt).sin() * 2.0))
            .collect()
    }

    fn head(data: &[f16], d: usize) -> CachedHead<'_> {
        CachedHead {
            data,
            stride: 3 * d,
            offset: d,
            head_dim: d,
        }
    }

    fn widened(view: CachedHead<'_>, p: usize) -> Vec<f32> {
        view.at(p).iter().map(|h| h.to_f32()).collect()
    }

    #[test]
    fn the_scores_are_the_widened_keys_dots_bit_for_bit() {
        fn check<const M: usize>(d: usize) {
            let data = cache(9, d, 0.37);
            let keys = head(&data, d);
            let queries: Vec<Vec<f32>> = (0..M)
                .map(|m| (0..d).map(|i| ((i + m * 7) as f32 * 0.11).cos()).collect())
                .collect();
            let queries: [&[f32]; M] = std::array::from_fn(|m| queries[m].as_slice());
            for first in [0, 5] {
                let scores = dot_block(queries, keys, first);
                for (m, query) in queries.iter().enumerate() {
                    for (k, score) in scores[m].iter().enumerate() {
                        let key = widened(keys, first + k);
                        let alone = lanes::dot(Width::Eight, query, &key);
                        assert_eq!(score.to_bits(), alone.to_bits(), "d {d} m {m} key {k}");
                    }
                }
            }
        }
        for d in [8, 64, 128] {
            check::<1>(d);
            check::<2>(d);
            check::<3>(d);
        }
    }

    #[test]
    fn the_weighted_values_are_the_transposed_dots_bit_for_bit() {
        fn check<const M: usize>(d: usize, seen: usize) {
            let data = cache(seen.max(1), d, 0.29);
            let values = head(&data, d);
            let weights: Vec<Vec<f32>> = (0..M)
                .map(|m| {
                    (0..seen)
                        .map(|p| ((p * 3 + m) as f32 * 0.7).sin().abs() / seen as f32)
                        .collect()
                })
                .collect();
            let weights: [&[f32]; M] = std::array::from_fn(|m| weights[m].as_slice());
            let mut simd = vec![0.0f32; M * d];
            weighted_values(weights, values, &mut simd);
            let mut portable = vec![0.0f32; M * d];
            weighted_values_portable(weights, values, &mut portable);
            for (m, weights) in weights.iter().enumerate() {
                for i in 0..d {
                    let column: Vec<f32> = (0..seen).map(|p| widened(values, p)[i]).collect();
                    let alone = lanes::dot(Width::Eight, weights, &column);
                    let at = m * d + i;
                    assert_eq!(simd[at].to_bits(), alone.to_bits(), "d {d} seen {seen}");
                    assert_eq!(portable[at].to_bits(), alone.to_bits(), "d {d} seen {seen}");
                }
            }
        }
        for seen in [1, 7, 8, 9, 17, 64, 301] {
            for d in [8, 64] {
                check::<1>(d, seen);
                check::<2>(d, seen);
                check::<3>(d, seen);
            }
        }
    }
}
