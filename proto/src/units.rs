//! Units with their arithmetic checked: VRAM in bytes and GPU shares in thousandths.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Bytes of GPU memory.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct VramBytes(pub u64);

const GIB: f64 = (1u64 << 30) as f64;

impl VramBytes {
    /// No bytes.
    pub const ZERO: VramBytes = VramBytes(0);

    /// `gib` GiB, rounded to a byte.
    pub fn from_gib(gib: f64) -> Self {
        VramBytes((gib * GIB).round() as u64)
    }

    /// In GiB.
    pub fn gib(self) -> f64 {
        self.0 as f64 / GIB
    }

    /// The sum, at most `u64::MAX`.
    pub fn saturating_add(self, other: VramBytes) -> VramBytes {
        VramBytes(self.0.saturating_add(other.0))
    }

    /// The difference, at least zero.
    pub fn saturating_sub(self, other: VramBytes) -> VramBytes {
        VramBytes(self.0.saturating_sub(other.0))
    }
}

impl fmt::Display for VramBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} GiB", self.gib())
    }
}

/// Parses `48GiB`, `16 GB`, `512MiB`, `1073741824` (bytes). GB is read as GiB, as GPU vendors mean it.
impl FromStr for VramBytes {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a size like 48GiB"))?;
        let scale = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" | "kib" => 1024.0,
            "m" | "mb" | "mib" => 1024.0 * 1024.0,
            "g" | "gb" | "gib" => GIB,
            "t" | "tb" | "tib" => GIB * 1024.0,
            other => return Err(format!("unknown size unit `{other}` in `{text}`")),
        };
        Ok(VramBytes((value * scale).round() as u64))
    }
}

/// Why a `gpus` number was refused.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum GpuCountError {
    /// Negative, infinite or not a number.
    #[error("gpus must be a non-negative number, got {0}")]
    NotANumber(f64),
    /// A fraction above one GPU (1.5): above one, GPUs come whole.
    #[error("gpus above 1 must be a whole number, got {0}; use 0.5, 1, 2, ...")]
    FractionAboveOne(f64),
    /// Less than the smallest share, a thousandth.
    #[error("gpus must be at least 0.001, got {0}")]
    BelowAThousandth(f64),
    /// More GPUs than a node has.
    #[error("gpus must be at most 64, got {0}")]
    AboveSixtyFour(f64),
}

/// A share of GPUs in thousandths: 250 = a quarter of one GPU, 2000 = two whole GPUs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct GpuFraction(pub u32);

impl GpuFraction {
    /// One whole GPU.
    pub const WHOLE: GpuFraction = GpuFraction(1000);

    /// Converts a user's `gpus` number; fractions above one must be whole numbers.
    pub fn from_gpus(gpus: f64) -> Result<Self, GpuCountError> {
        if !gpus.is_finite() || gpus < 0.0 {
            return Err(GpuCountError::NotANumber(gpus));
        }
        if gpus > 1.0 && gpus.fract() != 0.0 {
            return Err(GpuCountError::FractionAboveOne(gpus));
        }
        if gpus > 0.0 && gpus < 0.001 {
            return Err(GpuCountError::BelowAThousandth(gpus));
        }
        if gpus > 64.0 {
            return Err(GpuCountError::AboveSixtyFour(gpus));
        }
        Ok(GpuFraction((gpus * 1000.0).round() as u32))
    }

    /// No GPU at all.
    pub fn is_cpu_only(self) -> bool {
        self.0 == 0
    }

    /// A share of one GPU, less than a whole.
    pub fn is_fractional(self) -> bool {
        self.0 > 0 && self.0 < 1000
    }

    /// Whole GPUs needed (1 for a fraction).
    pub fn whole_gpus(self) -> u32 {
        if self.0 == 0 {
            0
        } else {
            self.0.div_ceil(1000)
        }
    }

    /// In GPUs (0.5, 1, 2).
    pub fn as_gpus(self) -> f64 {
        f64::from(self.0) / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!("48GiB".parse::<VramBytes>().unwrap(), VramBytes(48 << 30));
        assert_eq!("16 GB".parse::<VramBytes>().unwrap(), VramBytes(16 << 30));
        assert_eq!("512MiB".parse::<VramBytes>().unwrap(), VramBytes(512 << 20));
        assert!("lots".parse::<VramBytes>().is_err());
        assert!("3parsecs".parse::<VramBytes>().is_err());
    }

    #[test]
    fn gpu_fractions() {
        assert_eq!(GpuFraction::from_gpus(0.25).unwrap(), GpuFraction(250));
        assert_eq!(GpuFraction::from_gpus(2.0).unwrap().whole_gpus(), 2);
        assert_eq!(GpuFraction::from_gpus(0.5).unwrap().whole_gpus(), 1);
        assert!(GpuFraction::from_gpus(1.5).is_err());
        assert!(GpuFraction::from_gpus(-1.0).is_err());
        assert!(GpuFraction::from_gpus(f64::NAN).is_err());
    }

    #[test]
    fn displays_gib_with_one_decimal() {
        assert_eq!(VramBytes::from_gib(47.5).to_string(), "47.5 GiB");
    }
}
