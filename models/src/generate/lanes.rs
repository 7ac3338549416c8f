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
