//! NumPy `.npy` files as an embed job writes them: a v1 header for a C-order matrix, then
//! the rows. The vectors' encodings are `vectors.rs`'s.

use super::vectors::{OutputDtype, QuantizationRanges, encode_rows};

/// Encodes shaped vectors (`rows x dim`) as `.npy` bytes of `dtype`; int8 and uint8 need
/// `ranges`.
pub fn encode_vectors(
    values: &[f32],
    rows: u64,
    dim: usize,
    dtype: OutputDtype,
    ranges: Option<&QuantizationRanges>,
) -> Result<Vec<u8>, String> {
    let mut out = npy_header(dtype, rows, dim);
    out.extend(encode_rows(values, dim, dtype, ranges)?);
    Ok(out)
}

/// A NumPy `.npy` v1 header for a C-order matrix of `rows` vectors of `dim` dimensions
/// stored as `dtype`.
pub fn npy_header(dtype: OutputDtype, rows: u64, dim: usize) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ({rows}, {}), }}",
        dtype.descr(),
        dtype.stored_width(dim)
    );
    let unpadded = 10 + dict.len() + 1;
    let padding = (64 - unpadded % 64) % 64;
    let header_len = dict.len() + padding + 1;
    let mut out = Vec::with_capacity(10 + header_len);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', padding));
    out.push(b'\n');
    out
}

/// Length of the header of an `.npy` file we wrote.
pub(super) fn npy_header_len(bytes: &[u8]) -> usize {
    10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize
}
