//! The quantised CPU engine's KV cache: a slot of the whole context per sequence, in f16
//! (`attention.rs` reads it), and the prefix sharing between slots.
//!
//! A slot remembers the tokens its positions hold, and keeps them after its sequence ends
//! until another writes over them. A fresh sequence starts with the longest start of its
//! prompt that any slot holds (a finished sequence's, or one in flight): the slot's own
//! when it holds it (no work), copied from the other slot when not (a memory copy, a small
//! fraction of computing those positions again). The choices of one question, the samples
//! of one record, and a job's records under one instruction compute that start once.
//! Every position's keys and values depend only on the tokens up to it, and every row of
//! these kernels is computed on its own, so a copied position is the same bits as a
//! computed one.

use std::ops::Range;

use half::f16;

use super::f16_slices;
use crate::ModelError;

/// The KV caches of the sequences in flight, one per slot; a slot's buffers keep their
/// memory, and what they hold, when a new sequence takes it.
pub struct KvArena {
    kv_dim: usize,
    layers: usize,
    slots: Vec<SlotCache>,
    /// Bytes the caches hold now, and the most they may (`crate::memory`).
    bytes: u64,
    budget: u64,
}

#[derive(Default)]
pub struct SlotCache {
    /// Per layer, `[pos][kv_head][head_dim]`.
    pub k: Vec<Vec<f16>>,
    pub v: Vec<Vec<f16>>,
    /// The tokens whose keys and values positions `0..held.len()` hold: its sequence's
    /// computed positions, kept after it ends until another sequence writes over them.
    held: Vec<u32>,
}

/// The fewest positions of a prompt's start that a free slot must hold for a request to
/// be started out of order in it ([`KvArena::free_slot_holding`]): a block's worth, as
/// the paged cache shares.
pub const HELD_START_MIN: usize = 16;

/// A slot's cache grows in whole multiples of this many positions.
const GROWTH_POSITIONS: usize = 64;

impl KvArena {
    /// Caches for `slots` sequences within half the host's RAM.
    pub fn new(layers: usize, kv_dim: usize, slots: usize) -> Self {
        Self::with_budget(layers, kv_dim, slots, crate::memory::cache_budget_bytes())
    }

    pub fn with_budget(layers: usize, kv_dim: usize, slots: usize, budget: u64) -> Self {
        Self {
            kv_dim,
            layers,
            slots: (0..slots).map(|_| SlotCache::default()).collect(),
            bytes: 0,
            budget,
        }
    }

    /// Makes room in `slot` for positions `0..len`; an [`ModelError::OutOfMemory`] past the
    /// budget or what the host can give.
    ///
    /// The buffers' capacity grows by half again at least (in whole [`GROWTH_POSITIONS`]),
    /// so a sequence that gains a position a step moves its cache a few times in its life,
    /// not at every step. The budget counts the positions held: capacity beyond them is
    /// never written, so the host gives it no memory.
    pub fn reserve(&mut self, slot: usize, len: usize) -> Result<(), ModelError> {
        let (layers, kv_dim) = (self.layers, self.kv_dim.max(1));
        let cache = &mut self.slots[slot];
        let held = cache.k.first().map_or(0, Vec::len) / kv_dim;
        if len <= held {
            return Ok(());
        }
        // Keys and values, every layer, f16.
        let added = ((len - held) as u64)
            .checked_mul(kv_dim as u64 * 2 * layers as u64 * 2)
            .and_then(|added| added.checked_add(self.bytes));
        crate::memory::check_cache_size("KV cache", added, self.budget)?;
        let room = cache.k.first().map_or(0, Vec::capacity) / kv_dim;
        let room = len.max(room + room / 2).next_multiple_of(GROWTH_POSITIONS);
        let (width, room_width) = (len.saturating_mul(kv_dim), room.saturating_mul(kv_dim));
        for side in [&mut cache.k, &mut cache.v] {
            side.resize_with(layers, Vec::new);
            for layer in side.iter_mut() {
                crate::memory::try_grow(layer, width, room_width, f16::ZERO)?;
            }
        }
        self.bytes = added.expect("checked");
        Ok(())
    }

    /// Stores a token's key and value (rounded to f16) at `pos` of `slot`, in `layer`.
    pub fn store(&mut self, slot: usize, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let at = pos * self.kv_dim..(pos + 1) * self.kv_dim;
        let cache = &mut self.slots[slot];
        f16_slices::narrow(key, &mut cache.k[layer][at.clone()]);
        f16_slices::narrow(value, &mut cache.v[layer][at]);
    }

    /// Each position's width: the keys (or values) of every KV head.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// `slot`'s cache.
    pub fn slot(&self, slot: usize) -> &SlotCache {
        &self.slots[slot]
    }

    /// Which of the `free` slots (an index into it; freed first, first) a sequence of
    /// `tokens` should take: the one holding the longest start of what it would share
    /// (where the last sequence with this prompt ran); of equals, the one freed first,
    /// whose start the requests behind it are the least likely to want.
    pub fn free_slot_for(&self, free: &[usize], tokens: &[u32]) -> usize {
        self.longest_free(free, tokens).0
    }

    /// Which of the `free` slots (an index into it) holds a start of `tokens` that no
    /// sequence in flight holds as long, and at least [`HELD_START_MIN`] positions of it:
    /// the slot a request for them should take ahead of its turn, before another request
    /// writes over it.
    pub fn free_slot_holding(&self, free: &[usize], tokens: &[u32]) -> Option<usize> {
        let (index, len) = self.longest_free(free, tokens);
        let mut in_flight = vec![true; self.slots.len()];
        free.iter().for_each(|&slot| in_flight[slot] = false);
        let flying = (0..self.slots.len()).filter(|&slot| in_flight[slot]);
        let (_, flying) = self.longest_held(flying, shared_part(tokens));
        (len >= HELD_START_MIN && len > flying).then_some(index)
    }

    /// Of the `free` slots, the first that holds the longest start of what a sequence of
    /// `tokens` would share: its index in `free`, and that length.
    fn longest_free(&self, free: &[usize], tokens: &[u32]) -> (usize, usize) {
        self.longest_held(free.iter().copied(), shared_part(tokens))
    }

    /// Of `slots`, the first that holds the longest start of `wanted`: its place among
    /// `slots` (0 when none holds any), and that length.
    fn longest_held(&self, slots: impl Iterator<Item = usize>, wanted: &[u32]) -> (usize, usize) {
        let mut best = (0, 0);
        for (index, slot) in slots.enumerate() {
            let len = common_start(&self.slots[slot].held, wanted);
            if len > best.1 {
                best = (index, len);
            }
        }
        best
    }

    /// Gives the fresh sequence in `slot` the longest start of `tokens` that a slot holds,
    /// at most all but their last token (which the step computes for its logits): `slot`'s
    /// own when it holds it, else copied from the slot that does. Returns the positions it
    /// need not compute. A copy past the memory budget is not made: the sequence computes
    /// those positions instead.
    pub fn share_prefix(&mut self, slot: usize, tokens: &[u32]) -> usize {
        let wanted = shared_part(tokens);
        let own = common_start(&self.slots[slot].held, wanted);
        let (donor, longest) = self.longest_held(0..self.slots.len(), wanted);
        let shared = match longest > own {
            true => match self.copy_positions(donor, slot, own..longest) {
                Ok(()) => longest,
                Err(_) => own,
            },
            false => own,
        };
        let held = &mut self.slots[slot].held;
        held.clear();
        held.extend_from_slice(&wanted[..shared]);
        shared
    }

    /// After a step: `slot`'s positions `0..computed` hold `tokens[..computed]` (which
    /// start with what it held).
    pub fn computed(&mut self, slot: usize, tokens: &[u32], computed: usize) {
        let held = &mut self.slots[slot].held;
        match held.len() < computed {
            true => held.extend_from_slice(&tokens[held.len()..computed]),
            false => held.truncate(computed),
        }
    }

    /// Copies the keys and values of `positions` from slot `from` to slot `to`, every layer.
    fn copy_positions(
        &mut self,
        from: usize,
        to: usize,
        positions: Range<usize>,
    ) -> Result<(), ModelError> {
        self.reserve(to, positions.end)?;
        let at = positions.start * self.kv_dim..positions.end * self.kv_dim;
        let (source, target) = match from < to {
            true => {
                let (before, after) = self.slots.split_at_mut(to);
                (&before[from], &mut after[0])
            }
            false => {
                let (before, after) = self.slots.split_at_mut(from);
                (&after[0], &mut before[to])
            }
        };
        let sides = source.k.iter().zip(&mut target.k);
        for (from, to) in sides.chain(source.v.iter().zip(&mut target.v)) {
            to[at.clone()].copy_from_slice(&from[at.clone()]);
        }
        Ok(())
    }
}

/// How many tokens `a` and `b` start with alike.
fn common_start(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

/// What a sequence of `tokens` may share: all but its last token, which its step computes
/// for the logits.
fn shared_part(tokens: &[u32]) -> &[u32] {
    &tokens[..tokens.len().saturating_sub(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_grown_past_its_budget_is_an_out_of_memory_error() {
        // 2 layers x 8 wide x keys and values x 2 bytes: 64 bytes a position.
        let mut kv = KvArena::with_budget(2, 8, 2, 64 * 100);
        kv.reserve(0, 60).unwrap();
        kv.reserve(1, 40).unwrap();
        kv.reserve(0, 50).unwrap();
        let error = kv.reserve(1, 41).unwrap_err();
        assert!(
            matches!(&error, ModelError::OutOfMemory(m) if m.contains("KV cache")),
            "{error}"
        );
        // An absurd length is an error, not an overflow or an abort.
        assert!(kv.reserve(0, usize::MAX / 4).is_err());
    }

    /// Position `p` of a sequence of `tokens`: a key and value made from its tokens up to
    /// it, as a forward would (different starts give different keys).
    fn stored(kv: &mut KvArena, slot: usize, tokens: &[u32]) {
        kv.reserve(slot, tokens.len()).unwrap();
        for p in 0..tokens.len() {
            let seed: u32 = tokens[..=p].iter().sum();
            for layer in 0..kv.layers {
                let key: Vec<f32> = (0..kv.kv_dim).map(|j| (seed + j as u32) as f32).collect();
                let value: Vec<f32> = key.iter().map(|k| -k - layer as f32).collect();
                kv.store(slot, layer, p, &key, &value);
            }
        }
        kv.computed(slot, tokens, tokens.len());
    }

    fn same_positions(kv: &KvArena, a: usize, b: usize, len: usize) -> bool {
        let at = ..len * kv.kv_dim;
        (0..kv.layers).all(|layer| {
            let (a, b) = (kv.slot(a), kv.slot(b));
            a.k[layer][at] == b.k[layer][at] && a.v[layer][at] == b.v[layer][at]
        })
    }

    /// A fresh sequence takes the longest start of its prompt that a slot holds (a finished
    /// sequence's too), at most all but its last token: copied from another slot, or left
    /// in place in its own; it holds only what it shares until its step computes the rest.
    #[test]
    fn a_fresh_sequence_takes_the_longest_start_a_slot_holds() {
        let mut kv = KvArena::new(2, 4, 3);
        let question: Vec<u32> = (1..=10).collect();
        let first = [&question[..], &[50, 51]].concat();
        stored(&mut kv, 0, &first);
        // Another slot: the question's ten positions copied, the choice's left to compute.
        let second = [&question[..], &[60]].concat();
        assert_eq!(kv.share_prefix(1, &second), 10);
        assert!(same_positions(&kv, 0, 1, 10));
        assert_eq!(kv.slot(1).held, question);
        // The same prompt again: all but its last token.
        assert_eq!(kv.share_prefix(2, &first), 11);
        assert!(same_positions(&kv, 0, 2, 11));
        // Its own slot, which the finished sequence left: nothing to copy, and what the new
        // prompt does not share is forgotten.
        let other: Vec<u32> = [1, 2, 3, 99].into();
        assert_eq!(kv.share_prefix(0, &other), 3);
        assert_eq!(kv.slot(0).held, [1, 2, 3]);
        // Nothing in common: nothing shared.
        assert_eq!(kv.share_prefix(0, &[7, 8, 9]), 0);
        assert!(kv.slot(0).held.is_empty());
        // Computing a sequence's positions makes them held.
        kv.computed(0, &[7, 8, 9], 2);
        assert_eq!(kv.slot(0).held, [7, 8]);
    }

    /// A sequence takes the free slot that holds its start (where its question's last choice
    /// ran), else, of equals, the one freed first (the front of the free list).
    #[test]
    fn a_free_slot_holding_the_prompt_s_start_is_taken_first() {
        let mut kv = KvArena::new(1, 4, 5);
        stored(&mut kv, 1, &[1, 2, 3, 4]);
        stored(&mut kv, 2, &[1, 2, 9]);
        assert_eq!(kv.free_slot_for(&[3, 2, 1, 0], &[1, 2, 3, 5]), 2, "slot 1");
        assert_eq!(kv.free_slot_for(&[3, 2, 0], &[1, 2, 3, 5]), 1, "slot 2");
        assert_eq!(kv.free_slot_for(&[3, 0], &[1, 2, 3, 5]), 0, "freed first");
        assert_eq!(kv.free_slot_for(&[2, 1], &[1, 2, 7]), 0, "of equals");
        assert_eq!(kv.free_slot_for(&[], &[1]), 0);
        // Out of order only for a start worth it, and what the sequence would share of it.
        assert_eq!(kv.free_slot_holding(&[3, 2, 1, 0], &[1, 2, 3, 5]), None);
        let start: Vec<u32> = (100..100 + HELD_START_MIN as u32).collect();
        stored(&mut kv, 3, &start);
        let prompt = [&start[..], &[7]].concat();
        assert_eq!(kv.free_slot_holding(&[4, 3, 2, 1, 0], &prompt), Some(1));
        let all_but_last = kv.free_slot_holding(&[3, 2, 1, 0], &start);
        assert_eq!(all_but_last, None, "all but its last");
        assert_eq!(kv.free_slot_holding(&[2, 1, 0], &prompt), None);
        // A sequence in flight holding as much gives it without a slot taken out of turn.
        stored(&mut kv, 4, &prompt);
        assert_eq!(kv.free_slot_holding(&[3, 2, 1, 0], &prompt), None);
    }

    /// A copy the memory budget refuses is not made: the sequence shares what its own slot
    /// holds and computes the rest.
    #[test]
    fn a_copy_past_the_budget_shares_only_the_slot_s_own_positions() {
        // 1 layer x 4 wide x keys and values x 2 bytes: 16 bytes a position.
        let mut kv = KvArena::with_budget(1, 4, 2, 16 * 24);
        let long: Vec<u32> = (1..=20).collect();
        stored(&mut kv, 0, &long);
        stored(&mut kv, 1, &[1, 2]);
        assert_eq!(kv.share_prefix(1, &long), 2);
        assert_eq!(kv.slot(1).held, [1, 2]);
    }
}
