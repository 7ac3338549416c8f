//! Each position's rotation (the cosines and sines of its RoPE angles), computed once a
//! process and copied into every step's inputs. A step used to compute them afresh, one
//! `sin_cos` per row and rotated pair: 8,192 a decode step of 256 SmolLM2 rows, most of the
//! host's 0.24-0.45 ms of preparation that a GPU waits through between CUDA graph replays
//! (`generate-bench --profile`, BENCHMARKS.md). The table grows to the longest position
//! asked, in whole powers of two, and holds the very values the step computed, so the
//! tokens are the same bits.

use std::sync::{Mutex, PoisonError};

/// The rotations of positions `0..len`, for one model's frequencies.
pub(crate) struct RopeTable {
    /// The rotation frequency of each pair of a head (`LlamaConfig::rope_frequencies`).
    freqs: Vec<f32>,
    /// `positions x freqs` cosines, then the sines, as far as any step has asked.
    rows: Mutex<(Vec<f32>, Vec<f32>)>,
}

/// Positions the table holds at least, once asked for any.
const FIRST_POSITIONS: usize = 1024;

impl RopeTable {
    /// An empty table of these frequencies.
    pub(crate) fn new(freqs: Vec<f32>) -> Self {
        Self {
            freqs,
            rows: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// Appends each of `positions`' cosines to `cos` and its sines to `sin` (a head's pairs
    /// in order), as `(pos as f32 * freq).sin_cos()` gives them.
    pub(crate) fn extend(
        &self,
        positions: impl Iterator<Item = usize> + Clone,
        cos: &mut Vec<f32>,
        sin: &mut Vec<f32>,
    ) {
        let half = self.freqs.len();
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let need = positions.clone().max().map_or(0, |last| last + 1);
        let held = rows.0.len() / half.max(1);
        if need > held {
            let grown = need.next_power_of_two().max(FIRST_POSITIONS);
            let (table_cos, table_sin) = &mut *rows;
            for pos in held..grown {
                for f in &self.freqs {
                    let (s, c) = (pos as f32 * f).sin_cos();
                    table_cos.push(c);
                    table_sin.push(s);
                }
            }
        }
        let (table_cos, table_sin) = &*rows;
        for pos in positions {
            cos.extend_from_slice(&table_cos[pos * half..][..half]);
            sin.extend_from_slice(&table_sin[pos * half..][..half]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_the_angles_sin_cos_bit_for_bit_in_any_order_and_past_the_first_growth() {
        let freqs: Vec<f32> = (0..32)
            .map(|i| 10_000f32.powf(-2.0 * i as f32 / 64.0))
            .collect();
        let table = RopeTable::new(freqs.clone());
        // Out of order, repeated, then past what the first call grew the table to.
        for positions in [vec![7, 0, 7, 1023], vec![5000, 3, 1024, 70_000]] {
            let (mut cos, mut sin) = (vec![9.0], vec![9.0]);
            table.extend(positions.iter().copied(), &mut cos, &mut sin);
            assert_eq!(
                (cos[0], sin[0]),
                (9.0, 9.0),
                "appended after what was there"
            );
            let (mut want_cos, mut want_sin) = (vec![9.0], vec![9.0]);
            for &pos in &positions {
                for f in &freqs {
                    let (s, c) = (pos as f32 * f).sin_cos();
                    want_cos.push(c);
                    want_sin.push(s);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&cos), bits(&want_cos));
            assert_eq!(bits(&sin), bits(&want_sin));
        }
        let held = table.rows.lock().unwrap().0.len() / freqs.len();
        assert_eq!(held, 131_072, "the next power of two past 70,000");
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        table.extend(std::iter::empty(), &mut cos, &mut sin);
        assert!(cos.is_empty() && sin.is_empty());
    }
}
