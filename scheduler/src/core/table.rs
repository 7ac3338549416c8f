//! The core's tables of records by id (actors, nodes), which count every record they hand
//! out: a lookup counts one, a walk counts each record it passes. The counts are how the
//! guard tests (`core/tests/fleet_cost.rs`) prove that a message costs work in what it is
//! about (one node's actors, one task), never in the size of the fleet. A counter, not a
//! timer, so the proof holds on any machine; it costs one add per record read.
//!
//! Records are found by hashing their id (foldhash, fixed seed), not by a search of a tree:
//! at 80,000 actors a tree lookup compared a string id some 17 times (`memcmp` was 10-23%
//! of the loop's time at 10,000 agents), a hash lookup hashes it once and compares it once.
//! A walk visits the records in no meaningful order (the same order for the same history);
//! what a user sees sorted (node and actor listings) is sorted where it is listed.

use std::borrow::Borrow;
use std::cell::Cell;
use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Index;

/// The core's hash maps (its tables, and its indices by session, task, job and node): a fast
/// hasher with a fixed seed, instead of SipHash's tens of nanoseconds per lookup. The ids
/// come from the scheduler itself or from authenticated agents and clients.
pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

type Records<K, V> = FastMap<K, V>;

/// A `HashMap` with the same methods, counting the records read through it.
#[derive(Debug)]
pub(super) struct Table<K, V> {
    records: Records<K, V>,
    visits: Cell<u64>,
}

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Self {
            records: Records::default(),
            visits: Cell::new(0),
        }
    }
}

impl<K: Hash + Eq, V> Table<K, V> {
    /// Records read through this table so far.
    #[cfg(test)]
    pub fn visits(&self) -> u64 {
        self.visits.get()
    }

    /// The records, read without counting.
    #[cfg(test)]
    pub fn uncounted(&self) -> &Records<K, V> {
        &self.records
    }

    /// Sets the count back to `visits`, so that a check that is not part of what a handler
    /// costs (the test-only index assertions) leaves no trace in it.
    #[cfg(test)]
    pub fn forget_visits_since(&self, visits: u64) {
        self.visits.set(visits);
    }

    fn visit(&self, records: u64) {
        self.visits.set(self.visits.get() + records);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.visit(1);
        self.records.get(key)
    }

    pub fn get_mut<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.visit(1);
        self.records.get_mut(key)
    }

    #[cfg(test)]
    pub fn contains_key<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.visit(1);
        self.records.contains_key(key)
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.visit(1);
        self.records.insert(key, value)
    }

    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.visit(1);
        self.records.remove(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.records.iter().inspect(|_| self.visit(1))
    }

    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(key, _)| key)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, value)| value)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        let visits = &self.visits;
        self.records
            .iter_mut()
            .inspect(move |_| visits.set(visits.get() + 1))
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let visits = &self.visits;
        self.records.retain(|key, value| {
            visits.set(visits.get() + 1);
            keep(key, value)
        });
    }
}

impl<K: Hash + Eq + Borrow<Q>, Q: Hash + Eq + ?Sized, V> Index<&Q> for Table<K, V> {
    type Output = V;

    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no record with this id")
    }
}

impl<'a, K: Hash + Eq, V> IntoIterator for &'a Table<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Box<dyn Iterator<Item = (&'a K, &'a V)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<'a, K: Hash + Eq, V> IntoIterator for &'a mut Table<K, V> {
    type Item = (&'a K, &'a mut V);
    type IntoIter = Box<dyn Iterator<Item = (&'a K, &'a mut V)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_read_counts_once() {
        let mut table: Table<String, u32> = Table::default();
        for n in 0..10 {
            table.insert(format!("k{n}"), n);
        }
        let before = table.visits();
        assert_eq!(table["k3"], 3);
        assert!(table.get("missing").is_none());
        assert_eq!(table.visits() - before, 2);
        let before = table.visits();
        assert_eq!(table.values().filter(|v| **v > 4).count(), 5);
        assert_eq!(table.visits() - before, 10, "a walk counts every record");
        let before = table.visits();
        assert!(table.values().next().is_some());
        assert_eq!(
            table.visits() - before,
            1,
            "a walk stopped early counts what it read"
        );
        table.retain(|_, v| *v % 2 == 0);
        assert_eq!(table.len(), 5);
        assert_eq!(table.uncounted().len(), 5);
    }
}
