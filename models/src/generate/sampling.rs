//! Choosing the next token: greedy at temperature 0, else temperature, top-k and top-p
//! sampling with a random stream of the record's own.
//!
//! Each record's stream is seeded by the job's seed and the record's id, never by its place
//! in a batch or chunk, so a seeded job samples the same text on any agent, with any chunk
//! size or batch composition.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

/// How a sequence's tokens are chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches this (1 keeps all).
    pub top_p: f32,
    /// Keep this many most likely tokens (0 keeps all).
    pub top_k: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

/// One record's sampler.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler for the record `record_id` (its stream depends on nothing else but the seed).
    pub fn new(params: &SamplingParams, record_id: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(params.seed.to_le_bytes());
        hasher.update(record_id.as_bytes());
        let digest: [u8; 32] = hasher.finalize().into();
        Self {
            params: params.clone(),
            rng: ChaCha8Rng::from_seed(digest),
        }
    }

    /// The next token given the logits over the vocabulary.
    pub fn next(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| (id as u32, logit / self.params.temperature))
            .collect();
        // Most likely first; ties by id, so the order never depends on the sort.
        candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.params.top_k > 0 {
            candidates.truncate(self.params.top_k);
        }
        let max = candidates[0].1;
        let mut weights: Vec<f32> = candidates.iter().map(|(_, l)| (l - max).exp()).collect();
        let total: f32 = weights.iter().sum();
        if self.params.top_p < 1.0 {
            let mut kept = 0.0;
            let mut keep = weights.len();
            for (i, weight) in weights.iter().enumerate() {
                kept += weight / total;
                if kept >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            weights.truncate(keep);
        }
        let total: f32 = weights.iter().sum();
        let mut draw = self.rng.random::<f32>() * total;
        for (i, weight) in weights.iter().enumerate() {
            draw -= weight;
            if draw <= 0.0 {
                return candidates[i].0;
            }
        }
        candidates[weights.len() - 1].0
    }
}

/// The first most likely token.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &logit) in logits.iter().enumerate() {
        if logit > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
        }
    }

    #[test]
    fn temperature_zero_is_greedy_and_takes_the_first_of_equal_maxima() {
        let mut sampler = Sampler::new(&params(0.0, 1.0, 0, 7), "a");
        assert_eq!(sampler.next(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn a_records_draws_depend_on_the_seed_and_its_id_only() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let draws = |seed, id: &str| {
            let mut sampler = Sampler::new(&params(1.0, 1.0, 0, seed), id);
            (0..20).map(|_| sampler.next(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(1, "doc-1"), draws(1, "doc-1"));
        assert_ne!(draws(1, "doc-1"), draws(1, "doc-2"));
        assert_ne!(draws(1, "doc-1"), draws(2, "doc-1"));
    }

    #[test]
    fn top_k_and_top_p_keep_only_the_likely_tokens() {
        let logits = [5.0, 4.9, 0.0, -3.0, -3.0];
        let mut top_k = Sampler::new(&params(1.0, 1.0, 2, 3), "x");
        let mut top_p = Sampler::new(&params(1.0, 0.9, 0, 3), "x");
        for _ in 0..200 {
            assert!(top_k.next(&logits) < 2);
            assert!(top_p.next(&logits) < 2);
        }
    }
}
