//! f16 <-> f32 conversions of slices, inlined into one loop of F16C instructions where the
//! CPU has them. The `half` crate converts a slice with a call per 8 values (and its scalar
//! tail one value at a time); in the attention of a generation step those calls took about
//! 4% of the time. The conversions are exact (f16 to f32) or round to nearest even (f32 to
//! f16) either way, so the bits are `half`'s.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// `to[i] = from[i]` widened (equal lengths).
#[inline]
pub fn widen(from: &[f16], to: &mut [f32]) {
    assert_eq!(from.len(), to.len());
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU has AVX and F16C (checked at run time); equal lengths.
        #[allow(unsafe_code)]
        return unsafe { x86::widen(from, to) };
    }
    from.convert_to_f32_slice(to);
}

/// `to[i] = from[i]` rounded to f16, to nearest even (equal lengths).
#[inline]
pub fn narrow(from: &[f32], to: &mut [f16]) {
    assert_eq!(from.len(), to.len());
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: as above.
        #[allow(unsafe_code)]
        return unsafe { x86::narrow(from, to) };
    }
    to.convert_from_f32_slice(from);
}

/// Every value rounded to f16 and back, in place.
#[inline]
pub fn round_through_f16(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: as above.
        #[allow(unsafe_code)]
        return unsafe { x86::round_through_f16(values) };
    }
    let mut halves = [f16::ZERO; 256];
    for chunk in values.chunks_mut(256) {
        let halves = &mut halves[..chunk.len()];
        halves.convert_from_f32_slice(chunk);
        halves.convert_to_f32_slice(chunk);
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    /// Round to nearest even (the immediate takes the rounding mode only).
    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT;

    pub fn available() -> bool {
        static FOUND: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *FOUND.get_or_init(|| is_x86_feature_detected!("avx") && is_x86_feature_detected!("f16c"))
    }

    /// # Safety
    /// The CPU must have AVX and F16C; `to` as long as `from`.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn widen(from: &[f16], to: &mut [f32]) {
        let whole = from.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: 8 values from `i < whole <= len` in both slices.
            unsafe {
                let halves = _mm_loadu_si128(from.as_ptr().add(i).cast());
                _mm256_storeu_ps(to.as_mut_ptr().add(i), _mm256_cvtph_ps(halves));
            }
        }
        for (to, from) in to[whole..].iter_mut().zip(&from[whole..]) {
            *to = from.to_f32();
        }
    }

    /// # Safety
    /// As [`widen`].
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn narrow(from: &[f32], to: &mut [f16]) {
        let whole = from.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: as in `widen`.
            unsafe {
                let halves = _mm256_cvtps_ph::<ROUND>(_mm256_loadu_ps(from.as_ptr().add(i)));
                _mm_storeu_si128(to.as_mut_ptr().add(i).cast(), halves);
            }
        }
        for (to, from) in to[whole..].iter_mut().zip(&from[whole..]) {
            *to = f16::from_f32(*from);
        }
    }

    /// # Safety
    /// The CPU must have AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn round_through_f16(values: &mut [f32]) {
        let whole = values.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: 8 values from `i < whole <= len`.
            unsafe {
                let at = values.as_mut_ptr().add(i);
                let halves = _mm256_cvtps_ph::<ROUND>(_mm256_loadu_ps(at));
                _mm256_storeu_ps(at, _mm256_cvtph_ps(halves));
            }
        }
        for value in &mut values[whole..] {
            *value = f16::from_f32(*value).to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 widens, and a spread of f32 (ties, subnormals, overflow, NaN, infinities)
    /// narrows and rounds, to `half`'s bits; lengths that leave a tail.
    #[test]
    fn conversions_give_halfs_bits() {
        let every_half: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut ours = vec![0.0f32; every_half.len()];
        widen(&every_half, &mut ours);
        for (half, ours) in every_half.iter().zip(&ours) {
            let expected = half.to_f32();
            assert!(
                expected.to_bits() == ours.to_bits() || (expected.is_nan() && ours.is_nan()),
                "{half:?}: {ours} against {expected}"
            );
        }
        let mut values: Vec<f32> = every_half.iter().map(|h| h.to_f32()).collect();
        // Halfway between neighbouring halves (ties to even), just off it, and f32 past
        // f16's range and below its subnormals.
        for bits in (0..0x7c00u16).step_by(7) {
            let (low, high) = (
                f16::from_bits(bits).to_f32(),
                f16::from_bits(bits + 1).to_f32(),
            );
            let middle = (low + high) / 2.0;
            values.extend([middle, -middle, middle.next_up(), middle.next_down()]);
        }
        values.extend([
            1e6,
            -1e6,
            65520.0,
            65519.99,
            1e-9,
            -1e-9,
            f32::MAX,
            f32::MIN_POSITIVE,
        ]);
        values.push(3.0);
        for len in [values.len(), values.len() - 3] {
            let values = &values[..len];
            let mut narrowed = vec![f16::ZERO; len];
            narrow(values, &mut narrowed);
            let mut rounded = values.to_vec();
            round_through_f16(&mut rounded);
            for ((value, narrowed), rounded) in values.iter().zip(&narrowed).zip(&rounded) {
                let expected = f16::from_f32(*value);
                let same = expected.to_bits() == narrowed.to_bits()
                    || (expected.is_nan() && narrowed.is_nan());
                assert!(same, "{value}: {narrowed:?} against {expected:?}");
                let expected = expected.to_f32();
                let same = expected.to_bits() == rounded.to_bits()
                    || (expected.is_nan() && rounded.is_nan());
                assert!(same, "{value}: {rounded} against {expected}");
            }
        }
    }
}
