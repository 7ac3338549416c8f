//! The KV cache of a [`super::GenerateModel::generate`] call, of its engine's kind, and
//! what the continuous batcher asks of it: room for a step's rows, prefix sharing, and
//! giving a sequence's memory back. The quantised CPU engine's cache ([`KvArena`]) has a
//! slot of the whole context per sequence and never runs out; a fresh sequence starts
//! with the longest start of its prompt that a slot holds, copied. The dense engine's
//! ([`DenseKv`]) is paged, shares computed blocks between sequences, and is kept from one
//! call to the next ([`KeptCache`]) so that the blocks one chunk of a job computed (its
//! prompt template, the chat header, any shared start) serve the next chunk's prompts.

use std::sync::PoisonError;

use super::batcher::Span;
use super::decode_graph::{DecodeGraphs, GraphCounts};
use super::dense::{DenseKv, ReserveError};
use super::kv_arena::KvArena;
use super::quantised_llama::StepBuffers;

/// The KV caches of one `generate` call.
pub(super) enum Cache {
    /// The quantised CPU engine's: a slot of the whole context per sequence.
    Quantised(KvArena, Box<StepBuffers>),
    /// The dense engine's: paged, and its decode steps' CUDA graphs (which read its tensors).
    Dense(Box<DenseKv>, DecodeGraphs),
}

/// The dense engine's cache between `generate` calls, with the limits it was made for
/// (slots and block limit): a call with the same limits takes it, with its prefix cache.
/// A call that fails drops it (its sequences were never released).
#[derive(Default)]
pub(super) struct KeptCache {
    kept: std::sync::Mutex<Option<(CacheLimits, Cache)>>,
}

/// What a cache is made for: its slots and its block limit.
pub(super) type CacheLimits = (usize, Option<usize>);

impl KeptCache {
    /// The cache kept for `limits`, if there is one.
    pub fn take(&self, limits: CacheLimits) -> Option<Cache> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.take() {
            Some((made_for, cache)) if made_for == limits => Some(cache),
            _ => None,
        }
    }

    /// Keeps `cache`, made for `limits`, every sequence in it released (a paged cache only:
    /// the quantised engine's has no prefix cache to keep).
    pub fn keep(&self, limits: CacheLimits, cache: Cache) {
        if let Cache::Dense(..) = cache {
            *self.kept.lock().unwrap_or_else(PoisonError::into_inner) = Some((limits, cache));
        }
    }

    /// The kept cache's decode graph counts (a dense cache only).
    pub fn graph_counts(&self) -> Option<GraphCounts> {
        match &*self.kept.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((_, Cache::Dense(_, graphs))) => Some(graphs.counts()),
            _ => None,
        }
    }

    /// Drops the kept cache, giving its memory back.
    pub fn clear(&self) {
        *self.kept.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// A sequence in flight as the cache sees it.
pub(super) struct SeqKv<'a> {
    /// Its slot.
    pub slot: usize,
    /// Its tokens so far.
    pub tokens: &'a [u32],
}

impl Cache {
    /// Whether a sequence of `len` tokens may start beside `in_flight` others: its blocks
    /// and one spare block for each sequence already running, so that admitting it does not
    /// at once preempt another.
    pub fn can_admit(&self, len: usize, in_flight: usize) -> bool {
        match self {
            Self::Quantised(..) => true,
            Self::Dense(kv, _) => {
                let blocks = kv.blocks();
                blocks.available() >= blocks.blocks_for(len + 1) + in_flight
            }
        }
    }

    /// Which of the `free` slots (an index into it) a fresh sequence of `tokens` takes: the
    /// last (freed last), or for the quantised cache the one that still holds the longest
    /// start of them.
    pub fn free_slot_for(&self, free: &[usize], tokens: &[u32]) -> usize {
        match self {
            Self::Quantised(kv, _) => kv.free_slot_for(free, tokens),
            Self::Dense(..) => free.len().saturating_sub(1),
        }
    }

    /// Which of the `free` slots (an index into it) still holds enough of the start of
    /// `tokens` that a request for them should start there ahead of its turn (the quantised
    /// cache's slots; the paged cache shares blocks whatever the slot).
    pub fn free_slot_holding(&self, free: &[usize], tokens: &[u32]) -> Option<usize> {
        match self {
            Self::Quantised(kv, _) => kv.free_slot_holding(free, tokens),
            Self::Dense(..) => None,
        }
    }

    /// Gives a fresh sequence in `slot` the computed positions of its prompt's start (the
    /// paged cache's whole blocks, or what a quantised slot holds); returns how many of its
    /// positions need no computing.
    pub fn share_prefix(&mut self, slot: usize, tokens: &[u32]) -> usize {
        match self {
            Self::Quantised(kv, _) => kv.share_prefix(slot, tokens),
            Self::Dense(kv, _) => kv.share_prefix(slot, tokens),
        }
    }

    /// Room for every span of a step (`seqs[span.seq]`'s positions `start..end`).
    pub fn reserve(&mut self, spans: &[Span], seqs: &[SeqKv<'_>]) -> Result<(), ReserveError> {
        match self {
            Self::Quantised(..) => Ok(()),
            Self::Dense(kv, _) => spans
                .iter()
                .try_for_each(|span| kv.reserve(seqs[span.seq].slot, span.start, span.end)),
        }
    }

    /// After a step: the sequence's positions `0..computed` are in the cache.
    pub fn computed(&mut self, seq: SeqKv<'_>, computed: usize) {
        match self {
            Self::Quantised(kv, _) => kv.computed(seq.slot, seq.tokens, computed),
            Self::Dense(kv, _) => kv.register(seq.slot, seq.tokens, computed),
        }
    }

    /// The sequence in `slot` ended or was preempted.
    pub fn release(&mut self, slot: usize) {
        if let Self::Dense(kv, _) = self {
            kv.release(slot);
        }
    }
}
