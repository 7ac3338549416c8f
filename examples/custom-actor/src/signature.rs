//! MinHash signatures (pure): a text's word shingles, hashed, and for each of `k` hash
//! functions the smallest value over the shingles. Two texts' signatures agree at a position
//! with probability equal to the Jaccard similarity of their shingle sets.

use std::hash::Hasher;

/// One text's signature: the minimum of each hash function over its shingles.
pub type Signature = Vec<u64>;

/// 2^61 - 1, a Mersenne prime: the modulus of the hash functions.
const PRIME: u64 = (1 << 61) - 1;

/// `h_i(x) = (a_i x + b_i) mod p`, drawn from a seed.
pub struct HashFamily {
    coefficients: Vec<(u64, u64)>,
}

impl HashFamily {
    pub fn new(count: usize, seed: u64) -> Self {
        let mut state = seed;
        let mut next = move || {
            // splitmix64: a small, well-mixed generator; the family only needs to be
            // reproducible from the seed on every actor.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let coefficients = (0..count)
            .map(|_| (next() % (PRIME - 1) + 1, next() % PRIME))
            .collect();
        Self { coefficients }
    }
}

fn shingle_hashes(text: &str, words_per_shingle: usize) -> Vec<u64> {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let width = words_per_shingle.min(words.len()).max(1);
    words
        .windows(width)
        .map(|shingle| {
            let mut hasher = twox_hash::XxHash64::with_seed(0);
            for word in shingle {
                hasher.write(word.as_bytes());
                hasher.write_u8(0);
            }
            hasher.finish() % PRIME
        })
        .collect()
}

/// The signature of `text` (all `u64::MAX` for a text without words).
pub fn signature(text: &str, words_per_shingle: usize, family: &HashFamily) -> Signature {
    let shingles = shingle_hashes(text, words_per_shingle);
    family
        .coefficients
        .iter()
        .map(|&(a, b)| {
            shingles
                .iter()
                .map(|&x| {
                    ((u128::from(a) * u128::from(x) + u128::from(b)) % u128::from(PRIME)) as u64
                })
                .min()
                .unwrap_or(u64::MAX)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimated_jaccard;

    #[test]
    fn near_duplicates_agree_on_most_positions_and_strangers_on_few() {
        let family = HashFamily::new(256, 7);
        let base = "The quick brown fox jumps over the lazy dog while the farmer watches \
                    from the porch and the sun sets slowly behind the distant hills";
        let edited = base.replace("farmer", "old farmer");
        let other = "Rust is a systems programming language that runs blazingly fast and \
                     prevents segfaults while guaranteeing thread safety";
        let (a, b, c) = (
            signature(base, 3, &family),
            signature(&edited, 3, &family),
            signature(other, 3, &family),
        );
        assert_eq!(a.len(), 256);
        assert!(
            estimated_jaccard(&a, &b) > 0.7,
            "{}",
            estimated_jaccard(&a, &b)
        );
        assert!(
            estimated_jaccard(&a, &c) < 0.1,
            "{}",
            estimated_jaccard(&a, &c)
        );
        assert_eq!(signature(base, 3, &family), a, "deterministic");
        assert_eq!(
            signature(&base.to_uppercase(), 3, &family),
            a,
            "case does not matter"
        );
    }

    #[test]
    fn short_and_empty_texts_still_have_signatures() {
        let family = HashFamily::new(8, 1);
        assert!(
            signature("two words", 3, &family)
                .iter()
                .all(|&v| v < PRIME)
        );
        assert_eq!(signature("  ...  ", 3, &family), vec![u64::MAX; 8]);
    }
}
