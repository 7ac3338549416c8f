//! Grouping near-duplicates (pure): locality-sensitive hashing over signature bands finds
//! candidate pairs without comparing every pair; candidates whose signatures agree on at
//! least `threshold` of their positions are joined, and the groups are the connected sets.

use std::collections::HashMap;
use std::hash::Hasher;

/// The fraction of positions where two signatures agree: an estimate of their texts'
/// Jaccard similarity.
pub fn estimated_jaccard(a: &[u64], b: &[u64]) -> f64 {
    if a.is_empty() || a.len() != b.len() {
        return 0.0;
    }
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    same as f64 / a.len() as f64
}

struct DisjointSets {
    parent: Vec<usize>,
}

impl DisjointSets {
    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[a.max(b)] = a.min(b);
        }
    }
}

/// Groups of two or more documents (by position) whose signatures agree on at least
/// `threshold` of their positions, each group in order and the groups by first member.
/// `bands` splits each signature for the candidate search (more bands: more candidates).
pub fn group_near_duplicates(
    signatures: &[Vec<u64>],
    bands: usize,
    threshold: f64,
) -> Vec<Vec<usize>> {
    let width = signatures.first().map_or(0, Vec::len);
    let bands = bands.clamp(1, width.max(1));
    let rows = (width / bands).max(1);
    let mut sets = DisjointSets {
        parent: (0..signatures.len()).collect(),
    };
    for band in 0..bands {
        // Each bucket is compared against its first member: linear in the corpus however
        // full a bucket gets (a run of empty texts, boilerplate).
        let mut first_in_bucket: HashMap<u64, usize> = HashMap::new();
        for (doc, sig) in signatures.iter().enumerate() {
            let Some(slice) = sig.get(band * rows..(band + 1) * rows) else {
                continue;
            };
            let mut hasher = twox_hash::XxHash64::with_seed(band as u64);
            for value in slice {
                hasher.write_u64(*value);
            }
            match first_in_bucket.entry(hasher.finish()) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(doc);
                }
                std::collections::hash_map::Entry::Occupied(first) => {
                    let first = *first.get();
                    if estimated_jaccard(&signatures[first], sig) >= threshold {
                        sets.union(first, doc);
                    }
                }
            }
        }
    }
    let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for doc in 0..signatures.len() {
        let root = sets.find(doc);
        groups.entry(root).or_default().push(doc);
    }
    groups.into_values().filter(|g| g.len() > 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn similar_signatures_group_and_the_rest_stay_alone() {
        let base: Vec<u64> = (0..64).collect();
        let mut near = base.clone();
        near[3] = 1000; // 63 of 64 agree
        let mut far: Vec<u64> = (500..564).collect();
        far[0] = 0;
        let again = base.clone();
        let groups = group_near_duplicates(&[base, far, near, again], 16, 0.8);
        assert_eq!(groups, vec![vec![0, 2, 3]]);
    }

    #[test]
    fn no_documents_no_groups() {
        assert!(group_near_duplicates(&[], 16, 0.8).is_empty());
        assert_eq!(estimated_jaccard(&[1, 2], &[1]), 0.0);
    }
}
