//! SplitMix64: a small seeded generator that gives the same numbers on every platform, so
//! sweeps (search, data split, initialisation, batch order) replay exactly from a seed.

/// The generator, its whole state one 64-bit word.
#[derive(Clone, Debug)]
pub struct SeededRng(u64);

impl SeededRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator for one stream derived from `seed` and `stream` (e.g. an epoch).
    pub fn derived(seed: u64, stream: u64) -> Self {
        let mut mixer = Self(seed ^ stream.wrapping_mul(0xd134_2543_de82_ef95));
        Self(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, n)` (0 for `n` of 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers_and_shuffles() {
        let (mut a, mut b) = (SeededRng::new(7), SeededRng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
        let mut x: Vec<u32> = (0..50).collect();
        let mut y = x.clone();
        SeededRng::derived(7, 3).shuffle(&mut x);
        SeededRng::derived(7, 3).shuffle(&mut y);
        assert_eq!(x, y);
        let mut z: Vec<u32> = (0..50).collect();
        SeededRng::derived(7, 4).shuffle(&mut z);
        assert_ne!(x, z);
        x.sort();
        assert_eq!(x, (0..50).collect::<Vec<_>>());
    }
}
