//! Continuous batching: which rows go into the next forward step.
//!
//! Pure policy, no model. Sequences in flight each hold a KV slot. Every step, each sequence
//! that is decoding gives one row (its newest token); the token budget left goes to prompts
//! being prefilled, in the order they were admitted, a chunk each, so one long prompt never
//! holds the decoders up for more than a step. A sequence that finishes frees its slot at
//! once, and the next waiting prompt takes it in the same step: nothing waits for the
//! longest sequence of a batch.

use super::kv_blocks::BLOCK_SIZE;

/// Limits of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLimits {
    /// Sequences in flight at once (KV slots).
    pub max_sequences: usize,
    /// Rows in one forward step: decode rows plus prefill rows. At least `max_sequences`,
    /// so every decoding sequence moves every step ([`StepLimits::new`]).
    pub max_step_tokens: usize,
    /// The paged KV cache's blocks ([`super::kv_blocks::BLOCK_SIZE`] positions each), at
    /// most; `None`: every sequence's whole context. Fewer make sequences wait for blocks,
    /// and preempt the newest when the running ones need more.
    pub kv_blocks: Option<usize>,
}

impl StepLimits {
    /// Limits of at least one sequence and one token.
    pub fn new(max_sequences: usize, max_step_tokens: usize) -> Self {
        let max_sequences = max_sequences.max(1);
        Self {
            max_sequences,
            max_step_tokens: max_step_tokens.max(max_sequences),
            kv_blocks: None,
        }
    }

    /// The same limits with a KV cache of at most `blocks` blocks.
    pub fn with_kv_blocks(self, blocks: usize) -> Self {
        Self {
            kv_blocks: Some(blocks.max(1)),
            ..self
        }
    }
}

/// Where one sequence in flight stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqProgress {
    /// Tokens of the sequence so far: prompt, then generated.
    pub tokens: usize,
    /// Positions already in its KV cache.
    pub cached: usize,
}

impl SeqProgress {
    /// Decoding: everything but its newest token is cached.
    pub fn is_decoding(&self) -> bool {
        self.cached + 1 == self.tokens
    }
}

/// The positions `start..end` of sequence `seq` (an index into the slice given to
/// [`plan_step`]) go into the step; `logits` when `end` is the sequence's last token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The sequence.
    pub seq: usize,
    /// The first position to run.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Whether the step returns the logits after `end`.
    pub logits: bool,
}

/// The spans of the next step: a row for each decoding sequence first, then prefill chunks
/// in admission order while the budget lasts. Every sequence gets at least one row if the
/// budget allows any.
pub fn plan_step(seqs: &[SeqProgress], limits: StepLimits) -> Vec<Span> {
    let mut budget = limits.max_step_tokens.max(1);
    let mut spans = Vec::new();
    for (seq, progress) in seqs.iter().enumerate() {
        if progress.is_decoding() && budget > 0 {
            spans.push(Span {
                seq,
                start: progress.cached,
                end: progress.tokens,
                logits: true,
            });
            budget -= 1;
        }
    }
    for (seq, progress) in seqs.iter().enumerate() {
        if progress.is_decoding() || progress.cached >= progress.tokens || budget == 0 {
            continue;
        }
        let end = progress.tokens.min(progress.cached + budget);
        spans.push(Span {
            seq,
            start: progress.cached,
            end,
            logits: end == progress.tokens,
        });
        budget -= end - progress.cached;
    }
    spans
}

/// Whether a waiting prompt (its first tokens that may come from the prefix cache) should
/// wait for a sequence in flight that is computing the same start: the two share at least
/// one full KV block and the sequence has not computed all the blocks they share yet
/// (`in_flight`: each sequence's tokens and positions cached). Once it has, the prompt
/// takes them from the prefix cache instead of computing them a second time: the choices
/// of one question, or a job's records under one instruction, admitted together. The
/// quantised cache, which copies any number of positions, waits by the same rule: a start
/// shorter than a block is not worth a step's wait.
pub fn waits_for_prefix<'a>(
    prompt: &[u32],
    in_flight: impl IntoIterator<Item = (&'a [u32], usize)>,
) -> bool {
    if prompt.len() < BLOCK_SIZE {
        return false;
    }
    in_flight.into_iter().any(|(tokens, cached)| {
        let common = prompt
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let shared = common / BLOCK_SIZE * BLOCK_SIZE;
        shared > 0 && cached < shared
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt waits for a sequence computing a full block it shares, until that sequence
    /// has computed every block they share; a shorter common start, or one already
    /// computed, does not hold it.
    #[test]
    fn a_prompt_waits_for_a_shared_start_still_being_computed() {
        let start: Vec<u32> = (0..40).collect();
        let prompt = [&start[..], &[900, 901]].concat();
        let other = [&start[..], &[700]].concat();
        let two_blocks = 2 * BLOCK_SIZE;
        assert!(waits_for_prefix(&prompt, [(&other[..], 0)]));
        assert!(waits_for_prefix(&prompt, [(&other[..], two_blocks - 1)]));
        assert!(!waits_for_prefix(&prompt, [(&other[..], two_blocks)]));
        // Shorter than a block in common: nothing to share, nothing to wait for.
        let unlike: Vec<u32> = (0..10).chain(500..540).collect();
        assert!(!waits_for_prefix(&prompt, [(&unlike[..], 0)]));
        // Any sequence that holds it back is enough; none in flight holds nothing.
        assert!(waits_for_prefix(
            &prompt,
            [(&unlike[..], 0), (&other[..], 3)]
        ));
        assert!(!waits_for_prefix(&prompt, []));
        assert!(!waits_for_prefix(
            &prompt[..BLOCK_SIZE - 1],
            [(&other[..], 0)]
        ));
    }

    fn limits(max_step_tokens: usize) -> StepLimits {
        StepLimits::new(4, max_step_tokens)
    }

    fn seq(tokens: usize, cached: usize) -> SeqProgress {
        SeqProgress { tokens, cached }
    }

    #[test]
    fn decoders_go_first_and_prompts_share_what_is_left_in_order() {
        let seqs = [seq(100, 0), seq(11, 10), seq(40, 0), seq(21, 20)];
        let spans = plan_step(&seqs, limits(64));
        assert_eq!(
            spans,
            [
                Span {
                    seq: 1,
                    start: 10,
                    end: 11,
                    logits: true
                },
                Span {
                    seq: 3,
                    start: 20,
                    end: 21,
                    logits: true
                },
                Span {
                    seq: 0,
                    start: 0,
                    end: 62,
                    logits: false
                },
            ]
        );
    }

    #[test]
    fn a_prompt_that_fits_ends_with_its_logits_and_the_next_one_starts() {
        let seqs = [seq(30, 0), seq(50, 0)];
        let spans = plan_step(&seqs, limits(64));
        assert_eq!(
            spans,
            [
                Span {
                    seq: 0,
                    start: 0,
                    end: 30,
                    logits: true
                },
                Span {
                    seq: 1,
                    start: 0,
                    end: 34,
                    logits: false
                },
            ]
        );
        let spans = plan_step(&[seq(31, 30), seq(50, 34)], limits(64));
        assert_eq!(
            spans,
            [
                Span {
                    seq: 0,
                    start: 30,
                    end: 31,
                    logits: true
                },
                Span {
                    seq: 1,
                    start: 34,
                    end: 50,
                    logits: true
                },
            ]
        );
    }
}
