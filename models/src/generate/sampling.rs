//! Choosing the next token, as vLLM documents its sampling parameters: the repetition,
//! frequency and presence penalties on the model's logits first, then greedy at temperature
//! 0, else temperature, min-p, top-k and top-p, and a draw from a random stream of the
//! record's own (`draw.rs`, which a GPU runs where the logits are). Pure: logits and the
//! sequence's tokens in, a token out.
//!
//! Each record's stream is seeded by the job's seed and the record's id (and, for the second
//! and later of `n` completions, the completion's index), never by its place in a batch or
//! chunk, so a seeded job samples the same text on any agent, with any chunk size or batch
//! composition.

use std::collections::{HashMap, HashSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

pub use super::draw::argmax;
use super::draw::{self, Draw};

/// How a sequence's tokens are chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches this (1 keeps all).
    pub top_p: f32,
    /// Keep this many most likely tokens (0 keeps all).
    pub top_k: usize,
    /// Drop tokens less likely than this fraction of the likeliest one's probability
    /// (after temperature; 0 keeps all).
    pub min_p: f32,
    /// Divides a positive logit and multiplies a negative one of every token already in
    /// the prompt or the output (1 is off; above 1 discourages repeats).
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token the output holds at least once (0 is off;
    /// -2 to 2).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the output holds it (0 is off; -2 to
    /// 2).
    pub frequency_penalty: f32,
    /// Seeds the draw (with the request's id and choice).
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Whether any penalty changes the logits.
    fn penalises(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// One token's log-probability, and the likeliest tokens' at its step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Natural log of the token's probability under the model (its raw logits, before
    /// penalties, temperature or truncation, as vLLM reports by default).
    pub logprob: f32,
    /// The `top_logprobs` likeliest tokens at this step, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One sequence's sampler: its random stream and what its penalties count.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// The prompt's distinct tokens (only kept under a repetition penalty).
    prompt: HashSet<u32>,
    /// Each output token's count so far.
    output: HashMap<u32, u32>,
    /// The uniform number drawn for the next token, until it is taken.
    pending: Option<f32>,
}

impl Sampler {
    /// A sampler for completion `choice` (0 for the first) of the record `record_id`, whose
    /// prompt is `prompt`: its stream depends on nothing else but the seed.
    pub fn new(params: &SamplingParams, record_id: &str, choice: u32, prompt: &[u32]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(params.seed.to_le_bytes());
        hasher.update(record_id.as_bytes());
        // The first completion keeps the stream it had before `n` existed.
        if choice > 0 {
            hasher.update(b"\0choice");
            hasher.update(choice.to_le_bytes());
        }
        let digest: [u8; 32] = hasher.finalize().into();
        let prompt = match params.repetition_penalty != 1.0 {
            true => prompt.iter().copied().collect(),
            false => HashSet::new(),
        };
        Self {
            params: params.clone(),
            rng: ChaCha8Rng::from_seed(digest),
            prompt,
            output: HashMap::new(),
            pending: None,
        }
    }

    /// The next token given the logits over the vocabulary; `suppressed` tokens are never
    /// chosen (the end tokens before `min_tokens`), nor, when a grammar gives `allowed`,
    /// any token outside it. The token counts towards the penalties of the steps after.
    pub fn next(
        &mut self,
        logits: &[f32],
        suppressed: &[u32],
        allowed: Option<&dyn Fn(u32) -> bool>,
    ) -> u32 {
        let token = if self.params.penalises() || !suppressed.is_empty() || allowed.is_some() {
            let mut adjusted = logits.to_vec();
            self.penalise(&mut adjusted);
            for &token in suppressed {
                if let Some(logit) = adjusted.get_mut(token as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
            if let Some(allowed) = allowed {
                for (token, logit) in adjusted.iter_mut().enumerate() {
                    if !allowed(token as u32) {
                        *logit = f32::NEG_INFINITY;
                    }
                }
            }
            self.choose(&adjusted)
        } else {
            self.choose(logits)
        };
        *self.output.entry(token).or_default() += 1;
        token
    }

    /// Whether a penalty changes the logits before the draw (then only the host chooses).
    pub fn penalises(&self) -> bool {
        self.params.penalises()
    }

    /// Counts `token`, chosen elsewhere (the device's argmax of a plain greedy row, or its
    /// draw by [`Sampler::device_draw`]), as [`Sampler::next`] counts what it chooses.
    pub fn took(&mut self, token: u32) {
        self.pending = None;
        *self.output.entry(token).or_default() += 1;
    }

    /// vLLM's penalties: repetition over the prompt's and the output's tokens, presence
    /// and frequency over the output's.
    fn penalise(&self, logits: &mut [f32]) {
        let repetition = self.params.repetition_penalty;
        if repetition != 1.0 {
            let seen = self
                .prompt
                .iter()
                .chain(self.output.keys().filter(|t| !self.prompt.contains(t)));
            for &token in seen {
                if let Some(logit) = logits.get_mut(token as usize) {
                    *logit = match *logit > 0.0 {
                        true => *logit / repetition,
                        false => *logit * repetition,
                    };
                }
            }
        }
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        if presence != 0.0 || frequency != 0.0 {
            for (&token, &count) in &self.output {
                if let Some(logit) = logits.get_mut(token as usize) {
                    *logit -= presence + frequency * count as f32;
                }
            }
        }
    }

    fn choose(&mut self, logits: &[f32]) -> u32 {
        match self.device_draw() {
            None => argmax(logits),
            Some(draw) => {
                self.pending = None;
                draw::draw_token(logits, &draw)
            }
        }
    }

    /// What a draw of this sequence's next token needs where the logits are (the engine's
    /// device, `draw::sample_rows`), or `None` for greedy. The uniform number is taken from
    /// the stream once and kept until the token is taken, so that the host's draw (an engine
    /// that gives the logits back) uses the same one.
    pub fn device_draw(&mut self) -> Option<Draw> {
        if self.params.temperature <= 0.0 {
            return None;
        }
        let uniform = *self.pending.get_or_insert_with(|| self.rng.random::<f32>());
        Some(Draw {
            temperature: self.params.temperature,
            top_k: u32::try_from(self.params.top_k).unwrap_or(u32::MAX),
            top_p: self.params.top_p,
            min_p: self.params.min_p,
            uniform,
        })
    }
}

/// `token`'s log-probability under `logits` (a log-softmax in f64), and the `top` likeliest
/// tokens' (ties by id).
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_total = logits
        .iter()
        .map(|&logit| f64::from(logit - max).exp())
        .sum::<f64>()
        .ln();
    let logprob = |logit: f32| (f64::from(logit - max) - log_total) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &logit) in logits.iter().enumerate() {
            // Whether a token already held ranks before this one.
            let ahead =
                |held: &(u32, f32)| held.1 > logit || (held.1 == logit && held.0 < id as u32);
            if best.len() == top && best.last().is_some_and(ahead) {
                continue;
            }
            let at = best.partition_point(ahead);
            best.insert(at, (id as u32, logit));
            best.truncate(top);
        }
    }
    TokenLogprob {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        top: best
            .into_iter()
            .map(|(id, logit)| (id, logprob(logit)))
            .collect(),
    }
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
            ..SamplingParams::default()
        }
    }

    fn sampler(params: &SamplingParams, id: &str) -> Sampler {
        Sampler::new(params, id, 0, &[])
    }

    #[test]
    fn temperature_zero_is_greedy_and_takes_the_first_of_equal_maxima() {
        let mut sampler = sampler(&params(0.0, 1.0, 0, 7), "a");
        assert_eq!(sampler.next(&[0.1, 3.0, 3.0, -1.0], &[], None), 1);
    }

    #[test]
    fn a_records_draws_depend_on_the_seed_its_id_and_its_choice_only() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let draws = |seed, id: &str, choice| {
            let mut sampler = Sampler::new(&params(1.0, 1.0, 0, seed), id, choice, &[1, 2]);
            (0..20)
                .map(|_| sampler.next(&logits, &[], None))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(1, "doc-1", 0), draws(1, "doc-1", 0));
        assert_ne!(draws(1, "doc-1", 0), draws(1, "doc-2", 0));
        assert_ne!(draws(1, "doc-1", 0), draws(2, "doc-1", 0));
        assert_ne!(draws(1, "doc-1", 0), draws(1, "doc-1", 1));
        assert_ne!(draws(1, "doc-1", 1), draws(1, "doc-1", 2));
        assert_eq!(draws(1, "doc-1", 2), draws(1, "doc-1", 2));
    }

    #[test]
    fn top_k_top_p_and_min_p_keep_only_the_likely_tokens() {
        let logits = [5.0, 4.9, 0.0, -3.0, -3.0];
        let mut top_k = sampler(&params(1.0, 1.0, 2, 3), "x");
        let mut top_p = sampler(&params(1.0, 0.9, 0, 3), "x");
        // p(2) / p(0) = e^-5 < 0.01.
        let mut min_p = sampler(
            &SamplingParams {
                min_p: 0.01,
                ..params(1.0, 1.0, 0, 3)
            },
            "x",
        );
        let mut seen_min_p = HashSet::new();
        for _ in 0..300 {
            assert!(top_k.next(&logits, &[], None) < 2);
            assert!(top_p.next(&logits, &[], None) < 2);
            seen_min_p.insert(min_p.next(&logits, &[], None));
        }
        assert_eq!(seen_min_p, HashSet::from([0, 1]));
        // A min-p under every token's share keeps them all.
        let mut loose = sampler(
            &SamplingParams {
                min_p: 1e-9,
                ..params(1.0, 1.0, 0, 3)
            },
            "x",
        );
        let drawn: HashSet<u32> = (0..3000)
            .map(|_| loose.next(&[0.0, 0.0, -1.0], &[], None))
            .collect();
        assert_eq!(drawn.len(), 3);
    }

    #[test]
    fn a_grammar_mask_leaves_only_its_tokens() {
        let odd = |token: u32| token % 2 == 1;
        let mut greedy = sampler(&params(0.0, 1.0, 0, 0), "x");
        assert_eq!(greedy.next(&[9.0, 1.0, 2.0, 0.5], &[], Some(&odd)), 1);
        let mut sampled = sampler(&params(1.0, 1.0, 0, 0), "x");
        for _ in 0..200 {
            assert!(odd(sampled.next(&[9.0, 1.0, 2.0, 0.5], &[], Some(&odd))));
        }
    }

    #[test]
    fn suppressed_tokens_are_never_chosen() {
        let mut greedy = sampler(&params(0.0, 1.0, 0, 0), "x");
        assert_eq!(greedy.next(&[9.0, 1.0, 2.0], &[0], None), 2);
        let mut sampled = sampler(&params(1.0, 1.0, 0, 0), "x");
        for _ in 0..200 {
            assert_ne!(sampled.next(&[9.0, 1.0, 2.0], &[0], None), 0);
        }
    }

    /// vLLM's formulas: repetition divides positive and multiplies negative logits of
    /// tokens in the prompt or output; presence subtracts once, frequency per occurrence,
    /// over the output only.
    #[test]
    fn the_penalties_change_the_logits_by_vllms_formulas() {
        let penalised = |params: SamplingParams, prompt: &[u32], output: &[u32]| {
            let mut sampler = Sampler::new(&params, "x", 0, prompt);
            for &token in output {
                *sampler.output.entry(token).or_default() += 1;
            }
            let mut logits = vec![2.0, -2.0, 2.0, 2.0, 1.0];
            sampler.penalise(&mut logits);
            logits
        };
        let repetition = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        assert_eq!(
            penalised(repetition, &[0, 1], &[3, 3]),
            [1.0, -4.0, 2.0, 1.0, 1.0]
        );
        let presence = SamplingParams {
            presence_penalty: 0.5,
            ..SamplingParams::default()
        };
        assert_eq!(
            penalised(presence, &[0, 1], &[3, 3, 4]),
            [2.0, -2.0, 2.0, 1.5, 0.5]
        );
        let frequency = SamplingParams {
            frequency_penalty: 0.5,
            ..SamplingParams::default()
        };
        assert_eq!(
            penalised(frequency, &[0, 1], &[3, 3, 4]),
            [2.0, -2.0, 2.0, 1.0, 0.5]
        );
    }

    /// A greedy sampler under a frequency penalty leaves a token once its repeats have
    /// cost it the lead.
    #[test]
    fn a_greedy_sequence_under_a_penalty_stops_repeating_itself() {
        let logits = [3.0, 2.0, 1.0];
        let mut plain = sampler(&params(0.0, 1.0, 0, 0), "x");
        assert!((0..5).all(|_| plain.next(&logits, &[], None) == 0));
        let mut penalised = sampler(
            &SamplingParams {
                frequency_penalty: 0.6,
                ..SamplingParams::default()
            },
            "x",
        );
        let drawn: Vec<u32> = (0..4).map(|_| penalised.next(&logits, &[], None)).collect();
        // 3 -> 2.4 -> 1.8 (below 2): token 1, then 0 (1.8 > 1.4), ...
        assert_eq!(drawn, [0, 0, 1, 0]);
    }

    #[test]
    fn logprobs_are_a_log_softmax_with_the_likeliest_tokens_first() {
        let logits = [1.0, 3.0, 3.0, 0.0];
        let got = token_logprob(&logits, 0, 2);
        let total: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let expect = |l: f32| (f64::from(l) - total.ln()) as f32;
        assert!((got.logprob - expect(1.0)).abs() < 1e-6);
        assert_eq!(got.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        assert!((got.top[0].1 - expect(3.0)).abs() < 1e-6);
        assert!(token_logprob(&logits, 3, 0).top.is_empty());
        let sum: f64 = token_logprob(&logits, 0, 4)
            .top
            .iter()
            .map(|t| f64::from(t.1).exp())
            .sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }
}
