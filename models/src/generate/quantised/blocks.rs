//! The blocks the quantised kernels work on: weights in Q4_1 and Q8_0 laid out in panels
//! of [`PANEL`] rows, and activations quantised to 8 bits a block. A leaf: the portable
//! kernels and the dispatch (`mod.rs`) and the x86 kernels (`x86.rs`) all read it, and it
//! names neither.
//!
//! A panel block holds one block of 32 values of each of its 16 weight rows, their bytes
//! interleaved four at a time: chunk `c` (values `4c..4c + 4` of the block) of row `r` is
//! at bytes `4r..4r + 4` of `qs[c]`. A 512-bit register then holds one chunk of all 16
//! rows, so that one `vpdpbusd` against one activation chunk broadcast to every lane gives
//! each lane its own row's products: each lane ends a block with its row's exact integer
//! sum, and the block's scaling is one multiply-add per row, not eight.

use half::f16;

pub(super) const BLOCK: usize = 32;
/// Weight rows in one panel: the 32-bit lanes of a 512-bit register.
pub const PANEL: usize = 16;
/// Activation rows a kernel call takes at most: each weight block is unpacked once for
/// all of them, and their sums are independent, so that each `vpdpbusd` need not wait for
/// the one before it.
pub const TILE: usize = 4;

/// One block of activations quantised to 8 bits.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(8))]
pub struct ActivationBlock {
    /// The scale and `scale * Σ qs`, rounded through f16 as llama.cpp stores them.
    pub(super) d: f32,
    pub(super) s: f32,
    /// `Σ qs`, exact.
    pub(super) sum: i32,
    pub(super) qs: [i8; BLOCK],
}

impl ActivationBlock {
    /// The 4 values of chunk `c` as one little-endian word (for a broadcast to every lane).
    #[inline(always)]
    pub(super) fn chunk(&self, c: usize) -> i32 {
        let q = &self.qs[4 * c..4 * c + 4];
        i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
    }
}

pub(super) fn half(bytes: &[u8]) -> f32 {
    f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

/// Q4_1 in the file: `d` and `m` as f16, then 16 bytes of 4-bit values (the low nibbles
/// are the block's first 16 values, the high nibbles its last 16); a value is `d * q + m`.
/// In a panel: chunk `c < 4` of a row is the low nibbles of its bytes `4c..4c + 4`, and
/// chunk `c + 4` their high nibbles, so `qs[c]` holds both and one shift parts them.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Q4_1 {
    pub(super) qs: [[u8; 4 * PANEL]; 4],
    pub(super) d: [f32; PANEL],
    pub(super) m: [f32; PANEL],
}

/// Q8_0 in the file: `d` as f16, then 32 signed bytes; a value is `d * q`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Q8_0 {
    pub(super) qs: [[i8; 4 * PANEL]; 8],
    pub(super) d: [f32; PANEL],
}

impl Q4_1 {
    pub(super) const FILE_BYTES: usize = 20;

    /// A panel block from one file block of each row; rows past the matrix are `None`
    /// (zero weights).
    pub(super) fn from_file(rows: [Option<&[u8]>; PANEL]) -> Self {
        let mut block = Self {
            qs: [[0; 4 * PANEL]; 4],
            d: [0.0; PANEL],
            m: [0.0; PANEL],
        };
        for (r, bytes) in rows.into_iter().enumerate() {
            let Some(bytes) = bytes else { continue };
            block.d[r] = half(&bytes[0..2]);
            block.m[r] = half(&bytes[2..4]);
            for (c, chunk) in block.qs.iter_mut().enumerate() {
                chunk[4 * r..4 * r + 4].copy_from_slice(&bytes[4 + 4 * c..8 + 4 * c]);
            }
        }
        block
    }

    /// Row `r`'s value `j` of the block, `0..16`.
    pub(super) fn stored_value(&self, r: usize, j: usize) -> i32 {
        let byte = self.qs[j % 16 / 4][4 * r + j % 4];
        i32::from(if j < 16 { byte & 0x0f } else { byte >> 4 })
    }
}

impl Q8_0 {
    pub(super) const FILE_BYTES: usize = 34;

    /// A panel block from one file block of each row; rows past the matrix are `None`.
    pub(super) fn from_file(rows: [Option<&[u8]>; PANEL]) -> Self {
        let mut block = Self {
            qs: [[0; 4 * PANEL]; 8],
            d: [0.0; PANEL],
        };
        for (r, bytes) in rows.into_iter().enumerate() {
            let Some(bytes) = bytes else { continue };
            block.d[r] = half(&bytes[0..2]);
            for (c, chunk) in block.qs.iter_mut().enumerate() {
                for i in 0..4 {
                    chunk[4 * r + i] = bytes[2 + 4 * c + i] as i8;
                }
            }
        }
        block
    }

    /// Row `r`'s value `j` of the block.
    pub(super) fn stored_value(&self, r: usize, j: usize) -> i32 {
        i32::from(self.qs[j / 4][4 * r + j % 4])
    }
}

/// The block with its scale `d` and `d * sum`, rounded through f16 as llama.cpp stores them.
pub(super) fn activation_block(d: f32, sum: i32, qs: [i8; BLOCK]) -> ActivationBlock {
    let mut block = ActivationBlock {
        d: 0.0,
        s: 0.0,
        sum: 0,
        qs,
    };
    block.set_scales(d, sum);
    block
}

impl ActivationBlock {
    /// The scale `d`, and the exact sum of the values `sum`, as stored.
    #[inline(always)]
    pub(super) fn set_scales(&mut self, d: f32, sum: i32) {
        self.d = f16::from_f32(d).to_f32();
        self.s = f16::from_f32(d * sum as f32).to_f32();
        self.sum = sum;
    }
}
