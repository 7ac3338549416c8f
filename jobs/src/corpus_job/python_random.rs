//! CPython's `random.Random` (pure), as far as lm-evaluation-harness's few-shot sampler
//! uses it: seeded by a whole number, `getrandbits`, `_randbelow` and `sample` over
//! indexes, each giving exactly the numbers Python gives. lm-evaluation-harness draws a
//! task's random few-shot examples with `random.Random(1234).sample(docs, n)`, one draw a
//! record in order; replaying that stream is how `--fewshot-sampler lm-eval` puts the very
//! same examples before each record.
//!
//! Written here rather than taken from a crate: the Mersenne Twister itself is the
//! reference's few lines, and what must match Python is CPython's own seeding (a number's
//! 32-bit words through `init_by_array`), its rejection sampling and its choice between
//! two sampling algorithms, which no Rust crate reproduces.

/// The Mersenne Twister's state size and shift.
const N: usize = 624;
const M: usize = 397;

/// `random.Random(seed)`.
pub struct PythonRandom {
    state: [u32; N],
    /// The next word of `state` to hand out (`N`: time to regenerate).
    index: usize,
}

impl PythonRandom {
    /// As `random.Random(seed)` seeds itself with a whole number: its 32-bit words, least
    /// significant first, through `init_by_array` (0 as the one word 0).
    pub fn new(seed: u64) -> Self {
        let key: Vec<u32> = match seed >> 32 {
            0 => vec![seed as u32],
            high => vec![seed as u32, high as u32],
        };
        let mut random = Self {
            state: [0; N],
            index: N,
        };
        random.init_by_array(&key);
        random
    }

    fn init_genrand(&mut self, seed: u32) {
        self.state[0] = seed;
        for i in 1..N {
            let previous = self.state[i - 1];
            self.state[i] = 1_812_433_253u32
                .wrapping_mul(previous ^ (previous >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let mix = |state: &[u32; N], i: usize, factor: u32| {
            let previous = state[i - 1];
            state[i] ^ (previous ^ (previous >> 30)).wrapping_mul(factor)
        };
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            self.state[i] = mix(&self.state, i, 1_664_525)
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            (i, j) = (i + 1, j + 1);
            if i >= N {
                self.state[0] = self.state[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            self.state[i] = mix(&self.state, i, 1_566_083_941).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.state[0] = self.state[N - 1];
                i = 1;
            }
        }
        self.state[0] = 0x8000_0000;
    }

    /// The next 32 random bits (`genrand_uint32`).
    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.regenerate();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn regenerate(&mut self) {
        let twist = |upper: u32, lower: u32, far: u32| {
            let y = (upper & 0x8000_0000) | (lower & 0x7fff_ffff);
            far ^ (y >> 1) ^ if y & 1 == 1 { 0x9908_b0df } else { 0 }
        };
        for k in 0..N {
            let far = self.state[(k + M) % N];
            self.state[k] = twist(self.state[k], self.state[(k + 1) % N], far);
        }
        self.index = 0;
    }

    /// `getrandbits(bits)` for 1 to 32 bits: the next word's top `bits`.
    pub fn getrandbits(&mut self, bits: u32) -> u32 {
        debug_assert!((1..=32).contains(&bits), "{bits} bits");
        self.next_u32() >> (32 - bits)
    }

    /// `_randbelow(n)`: a number below `n` (above 0), drawn as `n`'s bit length of random
    /// bits until one falls below it.
    pub fn randbelow(&mut self, n: u32) -> u32 {
        let bits = u32::BITS - n.leading_zeros();
        loop {
            let drawn = self.getrandbits(bits);
            if drawn < n {
                return drawn;
            }
        }
    }

    /// `sample(range(population), count)`: `count` distinct indexes below `population`, in
    /// the order drawn, by the algorithm CPython picks (a shrinking pool where a list of
    /// the population is smaller than a set of the sample, else draws until unseen).
    pub fn sample(&mut self, population: usize, count: usize) -> Vec<usize> {
        assert!(count <= population, "a sample larger than its population");
        let mut set_size = 21usize;
        if count > 5 {
            // CPython: 4 ** ceil(log(count * 3, 4)), the log in floating point.
            let exponent = ((count as f64 * 3.0).ln() / 4f64.ln()).ceil() as u32;
            set_size += 4usize.pow(exponent);
        }
        let below = |random: &mut Self, n: usize| random.randbelow(n as u32) as usize;
        let mut drawn = Vec::with_capacity(count);
        if population <= set_size {
            let mut pool: Vec<usize> = (0..population).collect();
            for i in 0..count {
                let at = below(self, population - i);
                drawn.push(pool[at]);
                pool[at] = pool[population - i - 1];
            }
        } else {
            let mut seen = std::collections::HashSet::with_capacity(count);
            for _ in 0..count {
                let mut at = below(self, population);
                while !seen.insert(at) {
                    at = below(self, population);
                }
                drawn.push(at);
            }
        }
        drawn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers CPython 3.11 gives (`random.Random(seed)` then the same calls), both
    /// sampling algorithms and a seed of two words among them; one stream through several
    /// samples, as lm-evaluation-harness draws one a record.
    #[test]
    fn it_gives_exactly_the_numbers_python_gives() {
        let mut random = PythonRandom::new(1234);
        let words: Vec<u32> = (0..3).map(|_| random.getrandbits(32)).collect();
        assert_eq!(words, [4_150_886_329, 3_342_196_574, 1_892_932_127]);
        // ARC-Challenge's train split (1,119 examples), 25 shots: drawn until unseen.
        let mut random = PythonRandom::new(1234);
        assert_eq!(
            random.sample(1119, 25),
            [
                902, 239, 15, 185, 71, 171, 201, 726, 484, 35, 63, 32, 708, 991, 949, 304, 186,
                374, 234, 29, 1030, 996, 511, 132, 1108
            ]
        );
        assert_eq!(random.sample(1119, 25)[..5], [954, 140, 182, 1054, 94]);
        // A population below the set size: the shrinking pool.
        let mut random = PythonRandom::new(1234);
        assert_eq!(random.sample(10, 4), [7, 1, 0, 9]);
        assert_eq!(random.sample(10, 4), [9, 0, 1, 8]);
        let mut random = PythonRandom::new((1 << 40) + 7);
        assert_eq!(random.getrandbits(32), 2_635_837_658);
        assert_eq!(
            random.sample(40_000, 11),
            [
                37381, 31190, 16439, 8306, 33869, 24593, 34166, 23799, 25767, 29031, 29453
            ]
        );
        assert_eq!(PythonRandom::new(0).getrandbits(32), 3_626_764_237);
    }
}
