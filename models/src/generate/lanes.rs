//! Sums taken in the order of an 8-lane register, the order of llama.cpp's x86 kernels
//! (AVX2 with FMA, the build `pip install llama-cpp-python` makes on our hosts): element `i`
//! of a dot product goes to lane `i % 8` with a fused multiply-add, and the lanes are added
//! pairwise at the end. Floating-point sums depend on their order; summing in the same
//! order as the reference keeps our logits within a rounding of its, which is what lets
//! greedy decoding agree with it token for token (BENCHMARKS.md, issue 31).

/// Lanes of an AVX2 register of f32.
pub const LANES: usize = 8;

/// The lanes' total as a 256-bit register is reduced: the two halves added, then the
/// halves of that, then the last pair.
#[inline(always)]
pub fn hsum(lanes: [f32; LANES]) -> f32 {
    let quarter = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quarter[0] + quarter[2]) + (quarter[1] + quarter[3])
}

/// `Σ a[i] b[i]` (equal lengths), lane by lane with fused multiply-adds.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (mut xs, mut ys) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut xs).zip(&mut ys) {
        for lane in 0..LANES {
            acc[lane] = x[lane].mul_add(y[lane], acc[lane]);
        }
    }
    for (lane, (x, y)) in xs.remainder().iter().zip(ys.remainder()).enumerate() {
        acc[lane] = x.mul_add(*y, acc[lane]);
    }
    hsum(acc)
}

/// [`dot`] of `a` with each of four slices (each `a`'s length): four independent sums, so
/// one fused multiply-add need not wait for the one before it; each in [`dot`]'s order, so
/// the same bits. In AVX2 intrinsics where the CPU has them (the compiler's own
/// vectorisation of this loop shuffled lanes for most of its time), else a portable loop.
#[inline(always)]
pub fn dot4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    let b = b.map(|row| &row[..a.len()]);
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time); the rows are `a`'s length.
        #[allow(unsafe_code)]
        return unsafe { avx2::dot4(a, b) };
    }
    dot4_portable(a, b)
}

fn dot4_portable(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    let mut sums = [[0.0f32; LANES]; 4];
    let whole = a.len() / LANES * LANES;
    for (k, row) in b.iter().enumerate() {
        for (x, y) in a[..whole].chunks_exact(LANES).zip(row.chunks_exact(LANES)) {
            for lane in 0..LANES {
                sums[k][lane] = x[lane].mul_add(y[lane], sums[k][lane]);
            }
        }
    }
    finish4(a, b, whole, sums)
}

/// The elements after the last whole 8, into lanes `0..`, and the four totals.
#[inline(always)]
fn finish4(a: &[f32], b: [&[f32]; 4], whole: usize, mut sums: [[f32; LANES]; 4]) -> [f32; 4] {
    for (k, row) in b.iter().enumerate() {
        for lane in 0..a.len() - whole {
            sums[k][lane] = a[whole + lane].mul_add(row[whole + lane], sums[k][lane]);
        }
    }
    sums.map(hsum)
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA, and each of `b` must be `a`'s length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        let whole = a.len() / LANES * LANES;
        let mut sums = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 8 <= whole <= len` for `a` and each row of `b`.
            unsafe {
                let x = _mm256_loadu_ps(a.as_ptr().add(i));
                for k in 0..4 {
                    let y = _mm256_loadu_ps(b[k].as_ptr().add(i));
                    sums[k] = _mm256_fmadd_ps(x, y, sums[k]);
                }
            }
            i += LANES;
        }
        let mut lanes = [[0.0f32; LANES]; 4];
        for k in 0..4 {
            // SAFETY: each of `lanes` holds 8 f32.
            unsafe { _mm256_storeu_ps(lanes[k].as_mut_ptr(), sums[k]) };
        }
        super::finish4(a, b, whole, lanes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_order_sums_what_a_plain_loop_sums() {
        let a: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..67).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
        assert!((f64::from(dot(&a, &b)) - plain).abs() < 1e-5);
        assert_eq!(hsum([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]), 36.0);
    }

    /// Four sums at once are each the single sum, bit for bit, at any length.
    #[test]
    fn four_dots_at_once_equal_four_alone() {
        for n in [1, 7, 8, 64, 67] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let rows: Vec<Vec<f32>> = (0..4)
                .map(|k| (0..n).map(|i| ((i * 5 + k) as f32 * 0.11).cos()).collect())
                .collect();
            let together = dot4(&a, std::array::from_fn(|k| rows[k].as_slice()));
            for (k, row) in rows.iter().enumerate() {
                assert_eq!(
                    together[k].to_bits(),
                    dot(&a, row).to_bits(),
                    "n {n} row {k}"
                );
            }
        }
    }

    /// The order is the register's, not left to right: 1e8 + 1 - 1e8 loses the 1 only
    /// when the big values meet first.
    #[test]
    fn lanes_four_apart_meet_first() {
        let lanes = [1e8, 1.0, 0.0, 0.0, -1e8, 0.0, 0.0, 0.0];
        assert_eq!(hsum(lanes), 1.0);
        let left_to_right: f32 = lanes.iter().sum();
        assert_eq!(left_to_right, 0.0);
    }
}
