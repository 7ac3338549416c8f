//! The paged KV cache's bookkeeping, without tensors: positions live in fixed-size blocks, each
//! sequence slot has a table of its blocks, and blocks are counted by reference so that
//! sequences can share them.
//!
//! - **Allocation.** A slot's table grows a block at a time as its positions are reserved.
//!   Blocks come from the free list, then from the prefix cache's least recently used
//!   unreferenced block, then by growing the pool (doubling, up to its limit). Past the limit
//!   [`BlockManager::reserve`] refuses with [`OutOfBlocks`] and the engine preempts a
//!   sequence (it frees the blocks and recomputes the sequence later).
//! - **Prefix cache.** Once a full block's positions are computed it is registered under a
//!   key of its tokens and its parent block, so a later sequence whose prompt starts with the
//!   same tokens (every record of a job shares its template and chat header) takes the block
//!   instead of computing it again ([`BlockManager::share_prefix`]). Keys compare tokens
//!   exactly; a parent is named with its generation, which changes whenever the block is
//!   handed out afresh, so a key never matches a block reused for other tokens.
//! - **Copy on write.** A step that would write into a block another sequence also holds
//!   gets a private copy first ([`BlockCopy`], made by the tensor store). Prompts share at
//!   most the blocks before their last token, which is always computed, so in practice only
//!   forks write into shared blocks.
//!
//! Pure policy, unit-tested on the CPU; `dense.rs` keeps the tensors.

use std::collections::{BTreeMap, HashMap};

/// A block's index in the pool: its positions are rows `id * block_size ..` of the cache.
pub type BlockId = u32;

/// Positions of a block, as vLLM's default.
pub const BLOCK_SIZE: usize = 16;

/// No block for a step: every block is held by a sequence and the pool is at its limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the KV cache has no free block: {needed} more needed, every one of {limit} blocks held by \
     a sequence"
)]
pub struct OutOfBlocks {
    /// Blocks the refused reservation still needed.
    pub needed: usize,
    /// The pool's limit.
    pub limit: usize,
}

/// Before a step writes: copy block `from`'s rows into block `to` (copy on write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    /// The shared block.
    pub from: BlockId,
    /// The writer's private copy.
    pub to: BlockId,
}

/// What the tensor store must do before a step's writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservation {
    /// Blocks the pool now has, where it grew (the store grows its tensors to this many).
    pub grown_to: Option<usize>,
    /// Copies to make, in order.
    pub copies: Vec<BlockCopy>,
}

/// A full block's identity in the prefix cache: its tokens after its parent's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PrefixKey {
    /// The block before it and that block's generation; `None` for a sequence's first.
    parent: Option<(BlockId, u64)>,
    tokens: Box<[u32]>,
}

#[derive(Clone, Debug, Default)]
struct Block {
    /// Tables that hold it.
    refs: u32,
    /// Bumped each time it is handed out afresh.
    generation: u64,
    /// Its key, while the prefix cache holds it.
    cached_as: Option<PrefixKey>,
    /// Its place in the eviction order, while cached and unreferenced.
    idle_since: Option<u64>,
}

/// One slot's blocks.
#[derive(Clone, Debug, Default)]
struct Table {
    blocks: Vec<BlockId>,
    /// For each leading block already in the prefix cache (shared from it or registered):
    /// the cached block that holds its tokens, with its generation. That is the slot's own
    /// block, or the one the cache already had for the same tokens, which the next key
    /// names as its parent.
    cached: Vec<(BlockId, u64)>,
}

/// Blocks, tables and the prefix cache of one paged KV cache.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    limit: usize,
    blocks: Vec<Block>,
    /// Unreferenced blocks outside the prefix cache.
    free: Vec<BlockId>,
    /// Unreferenced cached blocks by the time they became so: the oldest is evicted first.
    idle: BTreeMap<u64, BlockId>,
    cached: HashMap<PrefixKey, BlockId>,
    tables: Vec<Table>,
    clock: u64,
}

impl BlockManager {
    /// A manager for `slots` sequences whose pool may grow to `limit` blocks of
    /// `block_size` positions (both at least one).
    pub fn new(block_size: usize, slots: usize, limit: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            limit: limit.max(1),
            blocks: Vec::new(),
            free: Vec::new(),
            idle: BTreeMap::new(),
            cached: HashMap::new(),
            tables: vec![Table::default(); slots],
            clock: 0,
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks the pool has now.
    pub fn pool_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks the pool may grow to.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Blocks a reservation could still take: free, idle in the prefix cache, or not yet
    /// grown.
    pub fn available(&self) -> usize {
        self.free.len() + self.idle.len() + (self.limit - self.blocks.len())
    }

    /// Blocks needed to hold positions `0..len`.
    pub fn blocks_for(&self, len: usize) -> usize {
        len.div_ceil(self.block_size)
    }

    /// `slot`'s block table.
    pub fn table(&self, slot: usize) -> &[BlockId] {
        &self.tables[slot].blocks
    }

    /// The cache row that holds `slot`'s position `pos` (reserved before).
    pub fn row_of(&self, slot: usize, pos: usize) -> usize {
        let block = self.tables[slot].blocks[pos / self.block_size] as usize;
        block * self.block_size + pos % self.block_size
    }

    /// Gives `slot` (empty) the cached blocks that hold the start of `tokens`, at most those
    /// before its last token (which the step must compute for its logits). Returns the
    /// positions they hold: the sequence's computation starts there.
    pub fn share_prefix(&mut self, slot: usize, tokens: &[u32]) -> usize {
        debug_assert!(self.tables[slot].blocks.is_empty(), "a fresh slot");
        let whole = tokens.len().saturating_sub(1) / self.block_size;
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_size).take(whole) {
            let key = PrefixKey {
                parent,
                tokens: chunk.into(),
            };
            let Some(&id) = self.cached.get(&key) else {
                break;
            };
            self.hold(id);
            parent = Some((id, self.blocks[id as usize].generation));
            let table = &mut self.tables[slot];
            table.blocks.push(id);
            table.cached.extend(parent);
        }
        self.tables[slot].blocks.len() * self.block_size
    }

    /// Makes room for `slot` to write positions `start..end` (its table then covers `0..end`),
    /// copying any shared block it would write into. On [`OutOfBlocks`], the blocks it did
    /// take stay in the table.
    pub fn reserve(
        &mut self,
        slot: usize,
        start: usize,
        end: usize,
    ) -> Result<Reservation, OutOfBlocks> {
        let before = self.blocks.len();
        let mut copies = Vec::new();
        let held = self.tables[slot].blocks.len();
        let first = start / self.block_size;
        for index in first..held.min(self.blocks_for(end)) {
            let id = self.tables[slot].blocks[index];
            let block = &self.blocks[id as usize];
            if block.refs > 1 {
                let copy = self.take_block(end, slot)?;
                self.release_block(id);
                self.tables[slot].blocks[index] = copy;
                copies.push(BlockCopy { from: id, to: copy });
                self.unregister_from(slot, index);
            } else if block.cached_as.is_some() {
                // Its tokens are about to change: it leaves the cache.
                self.uncache(id);
                self.unregister_from(slot, index);
            }
        }
        while self.tables[slot].blocks.len() < self.blocks_for(end) {
            let id = self.take_block(end, slot)?;
            self.tables[slot].blocks.push(id);
        }
        Ok(Reservation {
            grown_to: (self.blocks.len() != before).then_some(self.blocks.len()),
            copies,
        })
    }

    /// Enters `slot`'s full blocks among positions `0..computed` of `tokens` into the prefix
    /// cache, so later sequences share them. A block whose tokens the cache already holds
    /// stays the slot's own; the chain follows the cached one.
    pub fn register(&mut self, slot: usize, tokens: &[u32], computed: usize) {
        let full = computed.min(tokens.len()) / self.block_size;
        while self.tables[slot].cached.len() < full.min(self.tables[slot].blocks.len()) {
            let index = self.tables[slot].cached.len();
            let id = self.tables[slot].blocks[index];
            let start = index * self.block_size;
            let key = PrefixKey {
                parent: self.tables[slot].cached.last().copied(),
                tokens: tokens[start..start + self.block_size].into(),
            };
            let canonical = match self.cached.get(&key) {
                Some(&other) => other,
                None => {
                    self.cached.insert(key.clone(), id);
                    self.blocks[id as usize].cached_as = Some(key);
                    id
                }
            };
            let generation = self.blocks[canonical as usize].generation;
            self.tables[slot].cached.push((canonical, generation));
        }
    }

    /// Frees `slot`'s blocks (its last ones first, so that a prefix's later blocks are
    /// evicted before its earlier ones). Cached blocks stay cached until evicted.
    pub fn release(&mut self, slot: usize) {
        let table = std::mem::take(&mut self.tables[slot]);
        for &id in table.blocks.iter().rev() {
            self.release_block(id);
        }
    }

    /// One more reference to `id`; an idle cached block leaves the eviction order.
    fn hold(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        if let Some(since) = block.idle_since.take() {
            self.idle.remove(&since);
        }
        block.refs += 1;
    }

    fn release_block(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        block.refs -= 1;
        if block.refs > 0 {
            return;
        }
        match block.cached_as {
            Some(_) => {
                self.clock += 1;
                block.idle_since = Some(self.clock);
                self.idle.insert(self.clock, id);
            }
            None => self.free.push(id),
        }
    }

    /// A block for `slot` (which is writing up to `end`): free, evicted, or grown.
    fn take_block(&mut self, end: usize, slot: usize) -> Result<BlockId, OutOfBlocks> {
        let id = if let Some(id) = self.free.pop() {
            id
        } else if let Some((_, id)) = self.idle.pop_first() {
            self.blocks[id as usize].idle_since = None;
            self.uncache(id);
            id
        } else if self.blocks.len() < self.limit {
            let grown = (self.blocks.len() * 2).clamp(1, self.limit);
            let first = self.blocks.len() as BlockId;
            self.blocks.resize(grown, Block::default());
            // Handed out lowest first.
            self.free.extend((first + 1..grown as BlockId).rev());
            first
        } else {
            let needed = self.blocks_for(end) - self.tables[slot].blocks.len();
            return Err(OutOfBlocks {
                needed: needed.max(1),
                limit: self.limit,
            });
        };
        let block = &mut self.blocks[id as usize];
        block.generation += 1;
        block.refs = 1;
        Ok(id)
    }

    fn uncache(&mut self, id: BlockId) {
        if let Some(key) = self.blocks[id as usize].cached_as.take() {
            self.cached.remove(&key);
        }
    }

    /// `slot`'s blocks from `index` on are no longer in the cache's chain.
    fn unregister_from(&mut self, slot: usize, index: usize) {
        self.tables[slot].cached.truncate(index);
    }

    /// Every reference and list agrees with the tables (for tests).
    #[cfg(test)]
    fn check(&self) {
        let mut refs = vec![0u32; self.blocks.len()];
        for table in &self.tables {
            for &id in &table.blocks {
                refs[id as usize] += 1;
            }
        }
        for (id, block) in self.blocks.iter().enumerate() {
            assert_eq!(block.refs, refs[id], "block {id}'s count");
            let free = self.free.contains(&(id as BlockId));
            let idle = block.idle_since.is_some();
            assert_eq!(
                block.refs == 0,
                free || idle,
                "block {id}: unreferenced blocks are free or idle"
            );
            assert!(!(free && idle), "block {id} in one list");
            assert_eq!(idle, block.refs == 0 && block.cached_as.is_some());
            if let Some(key) = &block.cached_as {
                assert_eq!(self.cached.get(key), Some(&(id as BlockId)));
            }
        }
        assert_eq!(
            self.cached.len(),
            self.blocks.iter().filter(|b| b.cached_as.is_some()).count()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn a_slot_takes_blocks_as_its_positions_grow_and_gives_them_back() {
        let mut m = BlockManager::new(4, 2, 64);
        let r = m.reserve(0, 0, 10).unwrap();
        assert_eq!(m.table(0).len(), 3);
        assert_eq!(r.grown_to, Some(4), "the pool doubles: 1, 2, 4");
        assert_eq!(m.row_of(0, 9), m.table(0)[2] as usize * 4 + 1);
        let r = m.reserve(0, 10, 11).unwrap();
        assert_eq!(r, Reservation::default(), "position 10 is in block 2");
        m.reserve(1, 0, 5).unwrap();
        assert_eq!(m.pool_blocks(), 8);
        let mut all: Vec<BlockId> = m.table(0).iter().chain(m.table(1)).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "no block in two tables");
        m.check();
        m.release(0);
        m.check();
        assert!(m.table(0).is_empty());
        assert_eq!(m.available(), 64 - 2);
    }

    #[test]
    fn past_the_limit_a_reservation_is_refused_and_freeing_makes_room() {
        let mut m = BlockManager::new(4, 3, 4);
        m.reserve(0, 0, 8).unwrap();
        m.reserve(1, 0, 8).unwrap();
        let refused = m.reserve(2, 0, 8).unwrap_err();
        assert_eq!(
            refused,
            OutOfBlocks {
                needed: 2,
                limit: 4
            }
        );
        assert!(refused.to_string().contains("every one of 4 blocks"));
        m.check();
        m.release(1);
        m.reserve(2, 0, 8).unwrap();
        m.check();
        assert_eq!(m.available(), 0);
    }

    #[test]
    fn a_second_prompt_shares_the_computed_blocks_of_the_same_start() {
        let mut m = BlockManager::new(4, 2, 64);
        let first = tokens(13, 1);
        assert_eq!(m.share_prefix(0, &first), 0, "nothing cached yet");
        m.reserve(0, 0, 13).unwrap();
        m.register(0, &first, 13);
        // Same first 9 tokens, then others.
        let mut second = first[..9].to_vec();
        second.extend(tokens(6, 500));
        assert_eq!(m.share_prefix(1, &second), 8, "two full blocks of 4");
        assert_eq!(m.table(1), &m.table(0)[..2]);
        m.reserve(1, 8, second.len()).unwrap();
        assert_ne!(m.table(1)[2], m.table(0)[2]);
        m.check();
        // The first sequence ends: its shared blocks stay held by the second.
        m.release(0);
        m.check();
        m.release(1);
        m.check();
        // Both gone: the cache still gives the prefix back.
        assert_eq!(m.share_prefix(0, &first), 12);
        m.check();
    }

    #[test]
    fn the_last_token_is_never_shared_so_the_step_has_logits_to_give() {
        let mut m = BlockManager::new(4, 2, 64);
        let prompt = tokens(8, 3);
        m.reserve(0, 0, 8).unwrap();
        m.register(0, &prompt, 8);
        assert_eq!(
            m.share_prefix(1, &prompt),
            4,
            "block 2 holds the last token"
        );
        m.check();
    }

    #[test]
    fn only_computed_full_blocks_are_registered() {
        let mut m = BlockManager::new(4, 2, 64);
        let prompt = tokens(11, 3);
        m.reserve(0, 0, 6).unwrap();
        m.register(0, &prompt, 6);
        assert_eq!(
            m.share_prefix(1, &prompt),
            4,
            "positions 4-5 are half a block"
        );
        m.release(1);
        m.reserve(0, 6, 11).unwrap();
        m.register(0, &prompt, 11);
        assert_eq!(m.share_prefix(1, &prompt), 8);
        m.check();
    }

    #[test]
    fn idle_cached_blocks_are_evicted_last_block_first() {
        let mut m = BlockManager::new(2, 3, 4);
        let a = tokens(5, 1);
        m.reserve(0, 0, 5).unwrap();
        m.register(0, &a, 5);
        let a_blocks = m.table(0).to_vec();
        m.release(0);
        m.check();
        // Blocks 0 and 1 cached and idle, block 2 (half full, never cached) free.
        assert_eq!(m.available(), 4);
        // Three blocks: the two free ones, then a's second block, which went idle first.
        m.reserve(1, 0, 6).unwrap();
        assert!(m.table(1).contains(&a_blocks[1]));
        assert!(!m.table(1).contains(&a_blocks[0]));
        m.check();
        assert_eq!(m.share_prefix(2, &a), 2, "a's first block is still cached");
        m.release(1);
        m.reserve(2, 2, 5).unwrap();
        m.register(2, &a, 5);
        assert_eq!(m.cached.len(), 2);
        m.check();
    }

    #[test]
    fn a_key_naming_a_reused_parent_goes_stale() {
        let mut m = BlockManager::new(2, 2, 2);
        let a = tokens(5, 1);
        m.reserve(0, 0, 4).unwrap();
        m.register(0, &a, 4);
        let parent = m.table(0)[0];
        // Keep the child held, let the parent go, and reuse it for other tokens.
        let child = m.table(0)[1];
        m.tables[0].blocks.remove(1);
        m.tables[0].cached.truncate(1);
        m.tables[1].blocks.push(child);
        m.release(0);
        let b = tokens(4, 700);
        m.reserve(0, 0, 2).unwrap();
        assert_eq!(
            m.table(0),
            &[parent],
            "the parent, evicted and handed out again"
        );
        m.register(0, &b, 2);
        // b's first block sits where a's did; a key naming it at its old generation still
        // leads to a's second block, but no lookup can build that key any more.
        let mut c = b[..2].to_vec();
        c.extend(&a[2..5]);
        m.release(1);
        assert_eq!(
            m.share_prefix(1, &c),
            2,
            "b's block, not a's child after it"
        );
        m.check();
    }

    #[test]
    fn a_write_into_a_shared_block_gets_a_copy_first() {
        let mut m = BlockManager::new(4, 2, 64);
        let prompt = tokens(8, 3);
        m.reserve(0, 0, 8).unwrap();
        m.register(0, &prompt, 8);
        // A fork: slot 1 holds slot 0's blocks, then writes position 6 (a new token there).
        let shared: Vec<BlockId> = m.table(0).to_vec();
        for &id in &shared {
            m.hold(id);
            m.tables[1].blocks.push(id);
        }
        m.check();
        let r = m.reserve(1, 6, 7).unwrap();
        assert_eq!(r.copies.len(), 1);
        assert_eq!(r.copies[0].from, shared[1]);
        assert_eq!(m.table(1)[0], shared[0]);
        assert_eq!(m.table(1)[1], r.copies[0].to);
        assert_eq!(m.table(0), &shared[..]);
        m.check();
    }

    #[test]
    fn duplicate_blocks_computed_together_chain_through_the_cached_one() {
        let mut m = BlockManager::new(4, 3, 64);
        let prompt = tokens(13, 3);
        // Both admitted before either computed: no sharing, both compute.
        assert_eq!(m.share_prefix(0, &prompt), 0);
        assert_eq!(m.share_prefix(1, &prompt), 0);
        m.reserve(0, 0, 13).unwrap();
        m.reserve(1, 0, 13).unwrap();
        m.register(0, &prompt[..8], 8);
        m.register(1, &prompt, 13);
        m.register(0, &prompt, 13);
        m.check();
        // Slot 1 registered its third block first; slot 0's chain follows it, and a third
        // sequence finds all three.
        assert_eq!(m.share_prefix(2, &prompt), 12);
        m.check();
    }
}
