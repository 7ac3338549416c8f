//! The blocks the quantised kernels work on, as GGUF and llama.cpp lay them out: weights in
//! Q4_1 and Q8_0, activations quantised to 8 bits a block, and tiles of activation rows. A
//! leaf: the portable kernels and the dispatch (`mod.rs`) and the x86 kernels (`x86.rs`)
//! all read it, and it names neither.

use half::f16;

use crate::generate::lanes::LANES;

pub(super) const BLOCK: usize = 32;
/// Activation rows one kernel call multiplies by a weight row: independent sums, so each
/// fused multiply-add need not wait for the one before it (a single row's sum waits four
/// cycles a block), and each weight block is unpacked once for all of them.
pub const TILE: usize = 4;
/// One block of activations quantised to 8 bits.
#[derive(Clone, Copy)]
pub struct ActivationBlock {
    /// The scale and `scale * Σ qs`, rounded through f16 as llama.cpp stores them.
    pub(super) d: f32,
    pub(super) s: f32,
    pub(super) qs: [i8; BLOCK],
}

/// Block `j` of [`TILE`] activation rows side by side: the rows' values one after another
/// (one 512-bit register holds two rows), then each row's scale repeated over the 8 lanes
/// its sums run in (so a kernel reads a row's, or two rows', scales as one register, with
/// no shuffle), then their scaled sums (one 128-bit register).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct TileBlock {
    pub(super) qs: [[i8; BLOCK]; TILE],
    pub(super) d_lanes: [[f32; LANES]; TILE],
    pub(super) s: [f32; TILE],
}

impl TileBlock {
    pub(super) fn new(rows: [ActivationBlock; TILE]) -> Self {
        Self {
            qs: rows.map(|row| row.qs),
            d_lanes: rows.map(|row| [row.d; LANES]),
            s: rows.map(|row| row.s),
        }
    }

    pub(super) fn row(&self, t: usize) -> ActivationBlock {
        ActivationBlock {
            d: self.d_lanes[t][0],
            s: self.s[t],
            qs: self.qs[t],
        }
    }
}
pub(super) fn half(bytes: &[u8]) -> f32 {
    f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}
/// Q4_1: `d` and `m` as f16, then 16 bytes of 4-bit values (the low nibbles are the block's
/// first 16 values, the high nibbles its last 16); a value is `d * q + m`.
#[derive(Clone, Copy)]
pub struct Q4_1 {
    pub(super) d: f32,
    pub(super) m: f32,
    pub(super) qs: [u8; 16],
}
/// Q8_0: `d` as f16, then 32 signed bytes; a value is `d * q`.
#[derive(Clone, Copy)]
pub struct Q8_0 {
    pub(super) d: f32,
    pub(super) qs: [i8; BLOCK],
}
/// The block with its scale `d` and `d * sum`, rounded through f16 as llama.cpp stores them.
pub(super) fn activation_block(d: f32, sum: i32, qs: [i8; BLOCK]) -> ActivationBlock {
    ActivationBlock {
        d: f16::from_f32(d).to_f32(),
        s: f16::from_f32(d * sum as f32).to_f32(),
        qs,
    }
}
