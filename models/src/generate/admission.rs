//! Admission: which waiting requests (and preempted sequences) start in the free KV slots
//! before a step, in which slot, and with how much of their prompt already computed.
//!
//! Requests start in order while the cache has room, with three exceptions that save
//! computing a prompt's start twice:
//! - one whose start a sequence in flight is still computing waits a step for it
//!   ([`batcher::waits_for_prefix`]), then takes it;
//! - in the quantised cache, one whose start a free slot still holds (left by a finished
//!   sequence: a question's earlier choice, a record's earlier sample) goes first and
//!   takes that slot, before another request writes over it;
//! - a fresh sequence takes the free slot that holds the longest start of its prompt.

use super::batcher;
use super::cache::Cache;
use super::running::{Batch, GenerationFeed, InFlight};
use super::sampling::Sampler;
use super::thinking::{ThinkingWatch, prompt_leaves_thinking};
use super::{GenerateModel, GenerationRequest, PromptScoring};
use crate::ModelError;

/// How many waiting requests, from the front, are looked at for a free slot holding their
/// start: a question's choices and a record's samples wait side by side, so a few slots'
/// worth is enough, and admission stays a small part of a step.
const HELD_START_LOOKAHEAD: usize = 256;

impl GenerateModel {
    /// Moves preempted sequences, then waiting requests, into free cache slots, in order,
    /// while the cache has blocks for them (but for the exceptions in this module's
    /// comment); an empty prompt, or one that fills the context, is answered at once
    /// without a slot. A sequence starts with the computed positions of its prompt's start
    /// (the prefix cache), computing only the rest.
    pub(super) fn admit(
        &self,
        batch: &mut Batch,
        kv: &mut Cache,
        feed: &mut dyn GenerationFeed,
    ) -> Result<(), ModelError> {
        // With nothing in flight, a sequence starts whatever the cache says: alone, it
        // either fits or is refused as out of memory.
        let fits = |kv: &Cache, batch: &Batch, len: usize| {
            !batch.free_slots.is_empty()
                && (batch.flight.is_empty() || kv.can_admit(len, batch.flight.len()))
        };
        while let Some(seq) = batch.preempted.last() {
            if !fits(kv, batch, seq.tokens.len()) {
                // No new request overtakes a preempted one.
                return Ok(());
            }
            let mut seq = batch.preempted.pop().expect("checked above");
            seq.slot = take_free_slot(kv, &mut batch.free_slots, &seq.tokens);
            let scoring = batch.requests.get(seq.request).score;
            let shareable = PromptScoring::shareable(scoring, seq.scored.len(), seq.tokens.len());
            seq.cached = self.share_prefix(kv, seq.slot, &seq.tokens[..shareable]);
            batch.flight.push(seq);
        }
        self.admit_held_starts(batch, kv)?;
        // Requests waiting a step for a sequence computing their start (`waits_for_prefix`),
        // put back in order ahead of the rest.
        let mut deferred = Vec::new();
        while let Some(&next) = batch.waiting.front() {
            let request = batch.requests.get(next);
            if request.prompt.is_empty() || request.prompt.len() >= self.context() {
                let answer = self.too_long_or_empty(request);
                batch.waiting.pop_front();
                batch.answer(next, answer, feed);
                continue;
            }
            // Room first: with none, the queue is not scanned for prompts to hold back.
            if !fits(kv, batch, request.prompt.len()) {
                break;
            }
            batch.waiting.pop_front();
            if waits_for_prefix(batch, request) {
                deferred.push(next);
                continue;
            }
            let slot = take_free_slot(kv, &mut batch.free_slots, &request.prompt);
            self.start_sequence(batch, kv, next, slot)?;
        }
        for next in deferred.into_iter().rev() {
            batch.waiting.push_front(next);
        }
        Ok(())
    }

    /// Starts the waiting requests (of the first [`HELD_START_LOOKAHEAD`]) whose prompt's
    /// start a free slot still holds, each in that slot, ahead of the rest: in order, a
    /// request admitted first would take such a slot and write over a start that the
    /// requests behind it could have had for nothing. Not one that should wait for a
    /// sequence in flight computing more of its start ([`waits_for_prefix`]): a question's
    /// later choice, whose context a slot left by another question only begins.
    fn admit_held_starts(&self, batch: &mut Batch, kv: &mut Cache) -> Result<(), ModelError> {
        let mut index = 0;
        while index < batch.waiting.len().min(HELD_START_LOOKAHEAD) {
            if batch.free_slots.is_empty() {
                break;
            }
            let next = batch.waiting[index];
            let request = batch.requests.get(next);
            let held = match request.prompt.len() < self.context() {
                true => kv.free_slot_holding(&batch.free_slots, shareable_start(request)),
                false => None,
            };
            // One that would wait for a sequence computing more of its start waits. (Asked
            // second: the paged cache holds no start in a free slot, and a GPU's batch of
            // hundreds would make this scan of the flight a cost every step.)
            let held = held.filter(|_| !waits_for_prefix(batch, request));
            let Some(free) = held else {
                index += 1;
                continue;
            };
            batch.waiting.remove(index);
            let slot = batch.free_slots.remove(free);
            self.start_sequence(batch, kv, next, slot)?;
        }
        Ok(())
    }

    /// Starts waiting request `next` in `slot` (taken from the free slots), with the
    /// computed positions of its prompt's start that the cache has.
    fn start_sequence(
        &self,
        batch: &mut Batch,
        kv: &mut Cache,
        next: usize,
        slot: usize,
    ) -> Result<(), ModelError> {
        let request = batch.requests.get(next);
        let constraint = match &request.grammar {
            Some(grammar) => Some(self.constraint(grammar)?),
            None => None,
        };
        let thinking = match constraint.is_some() && request.grammar_after_thinking {
            true => {
                let prompt = self.format.decode_with_special(&request.prompt)?;
                prompt_leaves_thinking(&prompt).then(ThinkingWatch::default)
            }
            false => None,
        };
        let cached = self.share_prefix(kv, slot, shareable_start(request));
        batch.flight.push(InFlight {
            request: next,
            slot,
            tokens: request.prompt.clone(),
            prompt_len: request.prompt.len(),
            cached,
            sampler: Sampler::new(
                &request.sampling,
                &request.id,
                request.choice,
                &request.prompt,
            ),
            logprobs: Vec::new(),
            constraint,
            thinking,
            scored: Vec::new(),
            scored_greedy: true,
        });
        Ok(())
    }

    /// `kv.share_prefix`, counted in the step profile.
    fn share_prefix(&self, kv: &mut Cache, slot: usize, tokens: &[u32]) -> usize {
        let shared = kv.share_prefix(slot, tokens);
        if let Some(profile) = &self.profile {
            profile.count_shared(shared);
        }
        shared
    }
}

/// The free slot a fresh sequence of `tokens` takes ([`Cache::free_slot_for`]), taken
/// out of `free` (not empty).
fn take_free_slot(kv: &Cache, free: &mut Vec<usize>, tokens: &[u32]) -> usize {
    let index = kv.free_slot_for(free, tokens);
    free.remove(index)
}

/// Whether `request` should wait a step for a sequence in flight computing the start it
/// could take from the prefix cache ([`batcher::waits_for_prefix`]).
fn waits_for_prefix(batch: &Batch, request: &GenerationRequest) -> bool {
    let in_flight = batch.flight.iter().map(|seq| (&seq.tokens[..], seq.cached));
    batcher::waits_for_prefix(shareable_start(request), in_flight)
}

/// The start of a fresh request's prompt that may come from the cache: all of it, or for
/// a scoring request the positions before its first scored token ([`PromptScoring::shareable`]).
fn shareable_start(request: &GenerationRequest) -> &[u32] {
    let shareable = PromptScoring::shareable(request.score, 0, request.prompt.len());
    &request.prompt[..shareable]
}
