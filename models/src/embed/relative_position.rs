//! MPNet's relative attention bias: each head adds a learned bias to its attention scores,
//! looked up by the bucket of the key's offset from the query (T5-style buckets: exact for
//! small offsets, logarithmic up to `max_distance`, one bucket per direction beyond).
//!
//! The bias depends only on the offset `key - query`, so [`RelativeBias`] keeps one row per
//! head over every offset the model's positions allow; the scores of query row `i` over keys
//! `0..len` take the contiguous slice starting at offset `-i`.

/// MPNet's (and T5's) bidirectional bucket of a relative position, computed in f32 as
/// PyTorch does (`relative_position_bucket` in transformers' MPNet).
pub fn relative_position_bucket(relative: i64, num_buckets: usize, max_distance: usize) -> usize {
    let half = (num_buckets / 2) as i64;
    let n = -relative;
    let mut bucket = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    if n < max_exact {
        bucket += n;
    } else {
        let ratio = (n as f32 / max_exact as f32).ln()
            / ((max_distance as f64 / max_exact as f64).ln() as f32);
        let large = max_exact + (ratio * (half - max_exact) as f32) as i64;
        bucket += large.min(half - 1);
    }
    bucket as usize
}

/// Per-head bias for every offset `-(positions-1)..=(positions-1)`, row-major `[heads, 2p-1]`.
#[derive(Clone, Debug)]
pub struct RelativeBias {
    heads: usize,
    positions: usize,
    by_offset: Vec<f32>,
}

impl RelativeBias {
    /// `table` is the model's `relative_attention_bias` weight, `[num_buckets, heads]`
    /// row-major; `positions` the longest sequence it will see.
    pub fn new(table: &[f32], num_buckets: usize, heads: usize, positions: usize) -> Self {
        const MAX_DISTANCE: usize = 128;
        assert_eq!(table.len(), num_buckets * heads, "bias table shape");
        let width = 2 * positions - 1;
        let mut by_offset = vec![0.0; heads * width];
        for column in 0..width {
            let offset = column as i64 - (positions as i64 - 1);
            let bucket = relative_position_bucket(offset, num_buckets, MAX_DISTANCE);
            for head in 0..heads {
                by_offset[head * width + column] = table[bucket * heads + head];
            }
        }
        Self {
            heads,
            positions,
            by_offset,
        }
    }

    pub fn heads(&self) -> usize {
        self.heads
    }

    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Every head's biases by offset, `[heads, 2 * positions - 1]` row-major; column
    /// `positions - 1 + (key - query)`.
    pub fn by_offset(&self) -> &[f32] {
        &self.by_offset
    }

    /// The biases of query row `query` over keys `0..len` for `head`.
    pub fn row(&self, head: usize, query: usize, len: usize) -> &[f32] {
        let width = 2 * self.positions - 1;
        let start = head * width + (self.positions - 1 - query);
        &self.by_offset[start..start + len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_pytorch_mpnet() {
        // transformers' MPNet relative_position_bucket(relative, 32, 128) run in PyTorch
        // (torch 2.15 CPU) for key - query = 0..=20, 30, 60, 100, 127, 128, 200, 400, and
        // their negatives.
        let offsets = [
            0i64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 30, 60,
            100, 127, 128, 200, 400,
        ];
        let ahead: Vec<usize> = offsets
            .iter()
            .map(|&o| relative_position_bucket(o, 32, 128))
            .collect();
        let behind: Vec<usize> = offsets
            .iter()
            .map(|&o| relative_position_bucket(-o, 32, 128))
            .collect();
        assert_eq!(ahead, EXPECTED_AHEAD);
        assert_eq!(behind, EXPECTED_BEHIND);
    }

    const EXPECTED_AHEAD: [usize; 28] = [
        0, 17, 18, 19, 20, 21, 22, 23, 24, 24, 24, 24, 25, 25, 25, 25, 26, 26, 26, 26, 26, 27, 29,
        31, 31, 31, 31, 31,
    ];
    const EXPECTED_BEHIND: [usize; 28] = [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 10, 11, 13, 15, 15, 15, 15,
        15,
    ];

    #[test]
    fn rows_are_slices_of_one_offset_table() {
        let (buckets, heads, positions) = (32, 2, 10);
        let table: Vec<f32> = (0..buckets * heads).map(|i| i as f32).collect();
        let bias = RelativeBias::new(&table, buckets, heads, positions);
        for head in 0..heads {
            for query in 0..positions {
                let row = bias.row(head, query, positions);
                for (key, &value) in row.iter().enumerate() {
                    let bucket = relative_position_bucket(key as i64 - query as i64, 32, 128);
                    assert_eq!(value, table[bucket * heads + head]);
                }
            }
        }
        let width = 2 * positions - 1;
        assert_eq!(bias.by_offset().len(), heads * width);
        assert_eq!(
            &bias.by_offset()[width + positions - 1..][..3],
            bias.row(1, 0, 3)
        );
    }
}
