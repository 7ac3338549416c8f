//! What `resident embed` writes of each vector: cut to its first dimensions (matryoshka),
//! normalised, and stored at a precision (sentence-transformers' `truncate_dim`,
//! `normalize_embeddings` and `precision`, in that order), as `.npy` bytes.
//!
//! Pure functions: the job calls them on each chunk's vectors.

use serde::{Deserialize, Serialize};

/// How vectors are stored: sentence-transformers' `precision` values, plus `float16`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputDtype {
    /// `float32`.
    #[default]
    F32,
    /// `float16`: half the size, IEEE half precision rounded to nearest even.
    F16,
    /// One signed byte a dimension, from per-dimension ranges calibrated on the corpus.
    Int8,
    /// One unsigned byte a dimension, from the same ranges.
    Uint8,
    /// One bit a dimension (value > 0), packed eight to a byte, stored as signed bytes
    /// less 128.
    Binary,
    /// One bit a dimension, packed eight to an unsigned byte.
    Ubinary,
}

impl OutputDtype {
    /// Every precision, by its `--precision` name.
    pub const ALL: [OutputDtype; 6] = [
        OutputDtype::F32,
        OutputDtype::F16,
        OutputDtype::Int8,
        OutputDtype::Uint8,
        OutputDtype::Binary,
        OutputDtype::Ubinary,
    ];

    /// The manifest's name: `f32`, `f16`, `int8`, `uint8`, `binary`, `ubinary`.
    pub fn name(self) -> &'static str {
        match self {
            OutputDtype::F32 => "f32",
            OutputDtype::F16 => "f16",
            OutputDtype::Int8 => "int8",
            OutputDtype::Uint8 => "uint8",
            OutputDtype::Binary => "binary",
            OutputDtype::Ubinary => "ubinary",
        }
    }

    /// sentence-transformers' name, which `--precision` takes: `float32`, `float16`, ...
    pub fn precision_name(self) -> &'static str {
        match self {
            OutputDtype::F32 => "float32",
            OutputDtype::F16 => "float16",
            other => other.name(),
        }
    }

    /// Parses a `--precision` (or manifest) name.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == name || d.precision_name() == name)
            .ok_or_else(|| {
                format!(
                    "precision `{name}` is not one of {}",
                    Self::ALL.map(Self::precision_name).join(", ")
                )
            })
    }

    /// NumPy's type string for one stored element.
    pub(super) fn descr(self) -> &'static str {
        match self {
            OutputDtype::F32 => "<f4",
            OutputDtype::F16 => "<f2",
            OutputDtype::Int8 | OutputDtype::Binary => "|i1",
            OutputDtype::Uint8 | OutputDtype::Ubinary => "|u1",
        }
    }

    /// Bytes of one stored element.
    pub fn bytes(self) -> usize {
        match self {
            OutputDtype::F32 => 4,
            OutputDtype::F16 => 2,
            _ => 1,
        }
    }

    /// Stored elements per vector of `dim` dimensions (bits packed eight to a byte).
    pub fn stored_width(self, dim: usize) -> usize {
        match self {
            OutputDtype::Binary | OutputDtype::Ubinary => dim.div_ceil(8),
            _ => dim,
        }
    }

    /// Whether vectors are stored from calibrated ranges (int8, uint8).
    pub fn needs_ranges(self) -> bool {
        matches!(self, OutputDtype::Int8 | OutputDtype::Uint8)
    }
}

/// Per-dimension minimum and maximum of a calibration sample: how int8 and uint8 vectors
/// map back to values, and how queries are quantised to match (sentence-transformers'
/// `ranges`, shape `(2, dim)`: `[min, max]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantizationRanges {
    /// Each dimension's least value.
    pub min: Vec<f32>,
    /// Each dimension's largest value.
    pub max: Vec<f32>,
    /// Vectors the ranges were taken from.
    pub sample_rows: u64,
}

impl QuantizationRanges {
    /// The ranges of `values` (`rows x dim`, row-major).
    pub fn of(values: &[f32], dim: usize) -> Self {
        let mut min = vec![f32::INFINITY; dim];
        let mut max = vec![f32::NEG_INFINITY; dim];
        for row in values.chunks_exact(dim.max(1)) {
            for ((lo, hi), v) in min.iter_mut().zip(max.iter_mut()).zip(row) {
                *lo = lo.min(*v);
                *hi = hi.max(*v);
            }
        }
        Self {
            min,
            max,
            sample_rows: (values.len() / dim.max(1)) as u64,
        }
    }

    /// The bucket (0-255) of `value` in dimension `d`: sentence-transformers'
    /// `clip(floor((value - min) / step), 0, 255)` with `step = (max - min) / 255`.
    fn bucket(&self, d: usize, value: f32) -> u8 {
        let start = self.min[d];
        let mut step = (self.max[d] - start) / 255.0;
        if step == 0.0 {
            step = 1.0;
        }
        ((value - start) / step).floor().clamp(0.0, 255.0) as u8
    }
}

/// What happens to each vector between the model and the file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VectorShaping {
    /// Keep the first this many dimensions (matryoshka models).
    pub truncate_dim: Option<usize>,
    /// Scale to unit length after truncating (`--normalize`).
    pub normalize: bool,
}

impl VectorShaping {
    /// The stored dimension of a model's `dim`-wide vectors, or why it cannot be cut so.
    pub fn output_dim(&self, dim: usize) -> Result<usize, String> {
        match self.truncate_dim {
            Some(0) => Err("--truncate-dim must be at least 1".into()),
            Some(keep) if keep > dim => Err(format!(
                "--truncate-dim {keep} is more than the model's {dim} dimensions"
            )),
            Some(keep) => Ok(keep),
            None => Ok(dim),
        }
    }

    /// `values` (`rows x dim`) truncated and normalised as asked: the floats that are
    /// stored or quantised.
    pub fn shape(&self, values: &[f32], dim: usize) -> Result<Vec<f32>, String> {
        let keep = self.output_dim(dim)?;
        let mut out = Vec::with_capacity(values.len() / dim.max(1) * keep);
        for row in values.chunks_exact(dim.max(1)) {
            let row = &row[..keep];
            if self.normalize {
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
                out.extend(row.iter().map(|v| v / norm));
            } else {
                out.extend_from_slice(row);
            }
        }
        Ok(out)
    }
}

/// Shaped vectors (`rows x dim`) as the stored elements' little-endian bytes, row after row
/// ([`OutputDtype::stored_width`] elements a row).
pub fn encode_rows(
    values: &[f32],
    dim: usize,
    dtype: OutputDtype,
    ranges: Option<&QuantizationRanges>,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(values.len() * dtype.bytes());
    match dtype {
        OutputDtype::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        OutputDtype::F16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&half_bits(*v).to_le_bytes())),
        OutputDtype::Int8 | OutputDtype::Uint8 => {
            let ranges = ranges.ok_or("int8 and uint8 vectors need calibrated ranges")?;
            if ranges.min.len() != dim {
                return Err(format!(
                    "the calibrated ranges have {} dimensions, the vectors {dim}",
                    ranges.min.len()
                ));
            }
            let signed = dtype == OutputDtype::Int8;
            for row in values.chunks_exact(dim.max(1)) {
                out.extend(row.iter().enumerate().map(|(d, v)| {
                    let bucket = ranges.bucket(d, *v);
                    match signed {
                        true => (bucket as i16 - 128) as i8 as u8,
                        false => bucket,
                    }
                }));
            }
        }
        OutputDtype::Binary | OutputDtype::Ubinary => {
            let signed = dtype == OutputDtype::Binary;
            for row in values.chunks_exact(dim.max(1)) {
                for bits in row.chunks(8) {
                    // numpy's packbits: the first value is the highest bit; a short last
                    // group is padded with zeros.
                    let byte = bits
                        .iter()
                        .enumerate()
                        .fold(0u8, |byte, (i, v)| byte | (u8::from(*v > 0.0) << (7 - i)));
                    out.push(match signed {
                        true => (byte as i16 - 128) as i8 as u8,
                        false => byte,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// IEEE half-precision bits of `value`, rounded to nearest even.
fn half_bits(value: f32) -> u16 {
    half::f16::from_f32(value).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus_job::npy::{encode_vectors, npy_header, npy_header_len};

    fn body(bytes: &[u8]) -> &[u8] {
        &bytes[npy_header_len(bytes)..]
    }

    #[test]
    fn npy_headers_are_aligned_and_give_the_stored_shape() {
        let header = npy_header(OutputDtype::F32, 3, 384);
        assert_eq!(header.len() % 64, 0);
        assert_eq!(npy_header_len(&header), header.len());
        let text = String::from_utf8_lossy(&header[10..]);
        assert!(
            text.contains("'shape': (3, 384)") && text.contains("'<f4'"),
            "{text}"
        );
        let packed = npy_header(OutputDtype::Ubinary, 2, 385);
        let text = String::from_utf8_lossy(&packed[10..]);
        assert!(
            text.contains("'shape': (2, 49)") && text.contains("'|u1'"),
            "{text}"
        );
    }

    #[test]
    fn half_precision_rounds_like_ieee() {
        assert_eq!(half_bits(1.0), 0x3c00);
        assert_eq!(half_bits(-2.0), 0xc000);
        assert_eq!(half_bits(0.0), 0);
        assert_eq!(half_bits(65504.0), 0x7bff);
        assert_eq!(half_bits(1e6), 0x7c00);
        assert_eq!(half_bits(0.333_333_34), 0x3555);
        assert_eq!(half_bits(6.0e-8), 0x0001);
    }

    #[test]
    fn binary_packs_the_first_dimension_into_the_highest_bit_like_numpy() {
        // numpy.packbits([1,0,0,0,0,0,0,1, 1,1]) == [129, 192]
        let row = [0.5, -1.0, 0.0, -0.1, -2.0, -3.0, -4.0, 0.1, 3.0, 9.0];
        let ubinary = encode_vectors(&row, 1, 10, OutputDtype::Ubinary, None).unwrap();
        assert_eq!(body(&ubinary), [129, 192]);
        let binary = encode_vectors(&row, 1, 10, OutputDtype::Binary, None).unwrap();
        assert_eq!(body(&binary), [1, 64], "less 128, as signed bytes");
    }

    #[test]
    fn int8_buckets_follow_sentence_transformers_and_clip_outside_the_ranges() {
        let sample = [0.0, -1.0, 1.0, 1.0, 0.5, 0.0];
        let ranges = QuantizationRanges::of(&sample, 2);
        assert_eq!(
            (ranges.min.clone(), ranges.max.clone()),
            (vec![0.0, -1.0], vec![1.0, 1.0])
        );
        assert_eq!(ranges.sample_rows, 3);
        // floor((0.5 - 0) / (1/255)) = 127; floor((0 - -1) / (2/255)) = 127.
        let values = [0.5, 0.0, 2.0, -5.0];
        let unsigned = encode_vectors(&values, 2, 2, OutputDtype::Uint8, Some(&ranges)).unwrap();
        assert_eq!(body(&unsigned), [127, 127, 255, 0]);
        let signed = encode_vectors(&values, 2, 2, OutputDtype::Int8, Some(&ranges)).unwrap();
        assert_eq!(body(&signed), [255, 255, 127, 128], "-1, -1, 127, -128");
        assert!(encode_vectors(&values, 2, 2, OutputDtype::Int8, None).is_err());
    }

    #[test]
    fn truncation_comes_before_normalisation() {
        let shaping = VectorShaping {
            truncate_dim: Some(2),
            normalize: true,
        };
        let shaped = shaping.shape(&[3.0, 4.0, 100.0, 0.0, 2.0, 7.0], 3).unwrap();
        assert_eq!(shaped, vec![0.6, 0.8, 0.0, 1.0]);
        assert!(
            shaping
                .output_dim(1)
                .unwrap_err()
                .contains("more than the model's 1")
        );
        let whole = VectorShaping::default();
        assert_eq!(whole.shape(&[3.0, 4.0], 2).unwrap(), vec![3.0, 4.0]);
    }

    #[test]
    fn precisions_parse_by_either_name() {
        assert_eq!(OutputDtype::parse("float16"), Ok(OutputDtype::F16));
        assert_eq!(OutputDtype::parse("f32"), Ok(OutputDtype::F32));
        assert_eq!(OutputDtype::parse("ubinary"), Ok(OutputDtype::Ubinary));
        let refused = OutputDtype::parse("int4").unwrap_err();
        assert!(
            refused.contains("float32, float16, int8, uint8, binary, ubinary"),
            "{refused}"
        );
    }
}
