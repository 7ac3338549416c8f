//! Vectorisable CPU kernels for the element-wise ops of an encoder on CPU: exact-erf GELU,
//! softmax and layer norm, on f32 slices. candle's GELU and softmax call libm's scalar
//! `erff`/`expf` per element; these use polynomial approximations (relative error near 1e-7)
//! that the compiler turns into SIMD.

/// e^x for x in about [-87, 88], relative error below 2e-7.
#[inline(always)]
fn fast_exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round x * log2(e) to the nearest integer without a libm call.
    let shifted = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let k = shifted - 12_582_912.0;
    let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_57 + r * (0.041_665_8 + r * (0.008_333_45 + r * 0.001_388_89)))));
    // The integer k sits in the low mantissa bits of `shifted` (whose exponent is fixed at
    // 2^23): reading it there keeps the whole function in vector registers, where `k as i32`
    // would be a saturating scalar conversion per element.
    let k_int = (shifted.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let bits = ((k_int + 127) as u32) << 23;
    p * f32::from_bits(bits)
}

/// e^x evaluated in f64 and rounded once to f32: the correctly rounded result but where the
/// exact value lies within about 1e-13 (relative) of a halfway point between two f32 (on
/// none of the 23 million inputs the test takes). libm's `expf` is within 0.502 ULP: it
/// rounds the other way on about one input in 13,000, so the two differ there by one ULP.
/// Unlike a libm call, a loop of it vectorises. Subnormal results, 0 below about -104 and
/// infinity above about 88.7 come from the one rounding to f32; NaN stays NaN.
#[inline(always)]
pub fn exp_rounded(x: f32) -> f32 {
    // 1.5 * 2^52: adding it rounds to an integer, which lands in the low mantissa bits.
    const ROUND: f64 = 6_755_399_441_055_744.0;
    // Far enough past f32's range that the rounding gives 0 or infinity, and 2^k stays a
    // normal f64.
    let x = f64::from(x).clamp(-120.0, 100.0);
    let shifted = x * std::f64::consts::LOG2_E + ROUND;
    let k = shifted - ROUND;
    // |r| <= ln 2 / 2: Taylor to degree 10 leaves a relative error near 2e-13.
    let r = (-k).mul_add(std::f64::consts::LN_2, x);
    let mut p: f64 = 1.0 / 3_628_800.0;
    for factorial in [
        362_880.0, 40_320.0, 5_040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0,
    ] {
        p = p.mul_add(r, 1.0 / factorial);
    }
    let k_int = (shifted.to_bits() as i64).wrapping_sub(ROUND.to_bits() as i64);
    let scale = f64::from_bits(((k_int + 1023) as u64) << 52);
    (p * scale) as f32
}

/// `values[i] = e^(values[i] - shift)` by [`exp_rounded`] (a softmax's exponentials).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn exp_shifted(values: &mut [f32], shift: f32) {
    for v in values {
        *v = exp_rounded(*v - shift);
    }
}

/// `gate[i] = silu(gate[i]) * up[i]`, SiLU as `g / (1 + e^-g)` with [`exp_rounded`].
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn silu_times(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_rounded(-*g)) * u;
    }
}

/// erf(x) by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7).
#[inline(always)]
fn fast_erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * fast_exp(-a * a);
    if x < 0.0 { -y } else { y }
}

/// GELU (exact erf form, BERT's `gelu`) in place.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn gelu_slice(values: &mut [f32]) {
    for v in values {
        let x = *v;
        *v = 0.5 * x * (1.0 + fast_erf(x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

const LANES: usize = 16;

/// `row += addend`, element-wise (MPNet's relative bias onto a row of attention scores).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn add_assign(row: &mut [f32], addend: &[f32]) {
    for (value, add) in row.iter_mut().zip(addend) {
        *value += add;
    }
}

/// Softmax of one row. Max and sum run over `LANES` independent accumulators so the
/// compiler can keep them in vector registers.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn softmax_row(row: &mut [f32]) {
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in maxes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    max = maxes.iter().copied().fold(max, f32::max);
    for v in row.iter_mut() {
        *v = fast_exp(*v - max);
    }
    let mut sums = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (s, &v) in sums.iter_mut().zip(chunk) {
            *s += v;
        }
    }
    let sum: f32 = sums.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>();
    let inv = 1.0 / sum;
    for v in row {
        *v *= inv;
    }
}

/// Sum of `f(v)` over a slice, in `LANES` independent accumulators so the compiler keeps
/// them in vector registers.
#[inline(always)]
fn lane_sum(values: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut sums = [0.0f32; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (s, &v) in sums.iter_mut().zip(chunk) {
            *s += f(v);
        }
    }
    sums.iter().sum::<f32>() + chunks.remainder().iter().map(|&v| f(v)).sum::<f32>()
}

/// Layer normalisation of one row in place: `(x - mean) / sqrt(var + eps) * gamma + beta`.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn layer_norm_row(row: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let width = row.len() as f32;
    let mean = lane_sum(row, |v| v) / width;
    for v in row.iter_mut() {
        *v -= mean;
    }
    let variance = lane_sum(row, |v| v * v) / width;
    let scale = 1.0 / (variance + eps).sqrt();
    for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
        *v = *v * scale * g + b;
    }
}

/// `a . b`, in `LANES` independent accumulators.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0.0f32; LANES];
    let (mut chunks_a, mut chunks_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (ca, cb) in (&mut chunks_a).zip(&mut chunks_b) {
        for ((s, x), y) in sums.iter_mut().zip(ca).zip(cb) {
            *s += x * y;
        }
    }
    let tail: f32 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(x, y)| x * y)
        .sum();
    sums.iter().sum::<f32>() + tail
}

/// `out += weight * values`, element-wise.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn add_scaled(out: &mut [f32], weight: f32, values: &[f32]) {
    for (o, v) in out.iter_mut().zip(values) {
        *o += weight * v;
    }
}

/// RMS normalisation of `row` into `out`: `x / sqrt(mean(x^2) + eps) * weight`.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma",
    "x86_64+avx"
))]
pub fn rms_norm_row(row: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean_square = lane_sum(row, |v| v * v) / row.len() as f32;
    let scale = 1.0 / (mean_square + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
        *o = v * scale * w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn dot_add_scaled_and_rms_norm_agree_with_plain_loops() {
        let a: Vec<f32> = (0..70).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..70).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - plain).abs() < 1e-5);
        let mut out = b.clone();
        add_scaled(&mut out, 0.5, &a);
        assert!((out[69] - (b[69] + 0.5 * a[69])).abs() < 1e-7);
        let mut normed = vec![0.0; 70];
        rms_norm_row(&a, &b, 1e-5, &mut normed);
        let rms = (a.iter().map(|v| v * v).sum::<f32>() / 70.0 + 1e-5).sqrt();
        assert!((normed[3] - a[3] / rms * b[3]).abs() < 1e-5);
    }

    #[test]
    fn exp_and_erf_are_accurate() {
        for i in -2000..=2000 {
            let x = i as f32 / 40.0;
            let exp_error = (fast_exp(x) - x.exp()).abs() / x.exp();
            assert!(exp_error < 3e-7, "exp({x}) off by {exp_error}");
            let erf = libm_erf(x);
            assert!((fast_erf(x) - erf).abs() < 3e-7, "erf({x})");
        }
    }

    #[test]
    fn exp_rounded_is_the_correctly_rounded_exp() {
        let (mut libm_off, mut total) = (0u32, 0u32);
        // Every 97th f32 from -110 to 90: the normal range, the subnormal results below
        // about -87.3, the underflow to 0 below about -103.97, the overflow past 88.72.
        let magnitudes = |up_to: f32| (0..=up_to.to_bits()).step_by(97).map(f32::from_bits);
        for x in magnitudes(110.0).map(|x| -x).chain(magnitudes(90.0)) {
            let ours = exp_rounded(x);
            // libm's f64 exp rounded to f32: the correctly rounded value but for exact
            // values within about 1e-16 of a halfway point.
            let reference = f64::from(x).exp() as f32;
            assert_eq!(ours.to_bits(), reference.to_bits(), "exp({x})");
            total += 1;
            let libm = x.exp();
            if libm.to_bits() != ours.to_bits() {
                libm_off += 1;
                let ulps = (i64::from(ours.to_bits()) - i64::from(libm.to_bits())).abs();
                assert_eq!(ulps, 1, "exp({x}): libm's expf gives {libm}, not {ours}");
            }
        }
        assert!(total > 20_000_000, "{total} inputs");
        // libm's expf is within 0.502 ULP: one input in about 13,000 rounds the other way.
        assert!(
            libm_off * 5_000 < total,
            "libm's expf off on {libm_off} of {total}"
        );
        assert_eq!(exp_rounded(0.0), 1.0);
        assert_eq!(exp_rounded(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_rounded(f32::INFINITY), f32::INFINITY);
        assert!(exp_rounded(f32::NAN).is_nan());
        let mut row = [1.0f32, 2.0, -3.0];
        exp_shifted(&mut row, 2.0);
        let correctly_rounded = |x: f64| x.exp() as f32;
        assert_eq!(row, [correctly_rounded(-1.0), 1.0, correctly_rounded(-5.0)]);
        let (mut gate, up) = ([-2.0f32, 0.5, 30.0], [3.0f32, -1.0, 0.5]);
        silu_times(&mut gate, &up);
        for ((g, x), u) in gate.iter().zip([-2.0f32, 0.5, 30.0]).zip(up) {
            assert!((g - x / (1.0 + (-x).exp()) * u).abs() <= 1e-6 * g.abs().max(1.0));
        }
    }

    fn libm_erf(x: f32) -> f32 {
        // Reference from candle's own scalar GELU: gelu(x) = 0.5 x (1 + erf(x / sqrt 2)).
        let t = Tensor::new(&[x * std::f32::consts::SQRT_2], &candle_core::Device::Cpu).unwrap();
        let g = t.gelu_erf().unwrap().to_vec1::<f32>().unwrap()[0];
        if x == 0.0 {
            0.0
        } else {
            2.0 * g / (x * std::f32::consts::SQRT_2) - 1.0
        }
    }

    #[test]
    fn kernels_match_candle() {
        let values: Vec<f32> = (-300..300).map(|i| i as f32 * 0.02).collect();
        let x = Tensor::from_vec(values.clone(), (6, 100), &Device::Cpu).unwrap();
        let close = |ours: &[f32], theirs: Tensor| {
            let theirs = theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (a, b) in ours.iter().zip(&theirs) {
                assert!((a - b).abs() < 1e-5 * b.abs().max(1.0), "{a} vs {b}");
            }
        };
        let mut gelu = values.clone();
        gelu_slice(&mut gelu);
        close(&gelu, x.gelu_erf().unwrap());
        let mut softmax = values.clone();
        softmax.chunks_mut(100).for_each(softmax_row);
        close(&softmax, candle_nn::ops::softmax_last_dim(&x).unwrap());
        let gamma: Vec<f32> = (0..100).map(|i| 0.5 + i as f32 * 0.01).collect();
        let beta: Vec<f32> = (0..100).map(|i| i as f32 * -0.003).collect();
        let norm = candle_nn::LayerNorm::new(
            Tensor::new(gamma.as_slice(), &Device::Cpu).unwrap(),
            Tensor::new(beta.as_slice(), &Device::Cpu).unwrap(),
            1e-12,
        );
        let mut normed = values;
        normed
            .chunks_mut(100)
            .for_each(|row| layer_norm_row(row, &gamma, &beta, 1e-12));
        close(&normed, candle_core::Module::forward(&norm, &x).unwrap());
    }
}
