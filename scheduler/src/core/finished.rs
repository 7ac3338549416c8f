//! How each finished task of a job ended, by sequence number, for the job's whole life.
//!
//! A client sends a task again when it never read its result: its stream broke after the
//! result was sent, or the scheduler restarted. Such a task runs again (or is answered from
//! a held output) but must be counted once, so it first leaves the counter it ended in
//! (`TaskLifecycle::resubmitted`). Kept as ranges of sequence numbers: the SDK numbers a
//! job's tasks 0, 1, 2, … and most end the same way, so a million finished tasks take a
//! handful of entries instead of a map entry each.

use rangemap::RangeInclusiveMap;

use crate::state::TaskEnd;

#[derive(Default)]
pub struct FinishedSeqs(RangeInclusiveMap<u64, TaskEnd>);

impl FinishedSeqs {
    pub fn insert(&mut self, seq: u64, end: TaskEnd) {
        self.0.insert(seq..=seq, end);
    }

    /// How `seq` ended, if it did; it is no longer finished (it runs again).
    pub fn take(&mut self, seq: u64) -> Option<TaskEnd> {
        let end = *self.0.get(&seq)?;
        self.0.remove(seq..=seq);
        Some(end)
    }

    #[cfg(test)]
    /// Runs of consecutive sequence numbers that ended alike: what this costs in memory.
    pub fn ranges(&self) -> usize {
        self.0.iter().count()
    }
}

impl FromIterator<(u64, TaskEnd)> for FinishedSeqs {
    fn from_iter<I: IntoIterator<Item = (u64, TaskEnd)>>(iter: I) -> Self {
        let mut seqs = Self::default();
        for (seq, end) in iter {
            seqs.insert(seq, end);
        }
        seqs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_seq_says_how_it_ended_once() {
        let mut seqs: FinishedSeqs = [(3, TaskEnd::Failed), (4, TaskEnd::Succeeded)]
            .into_iter()
            .collect();
        assert_eq!(seqs.take(3), Some(TaskEnd::Failed));
        assert_eq!(seqs.take(3), None);
        assert_eq!(seqs.take(4), Some(TaskEnd::Succeeded));
        assert_eq!(seqs.take(5), None);
    }

    #[test]
    fn a_million_tasks_that_ended_alike_take_one_range() {
        let mut seqs = FinishedSeqs::default();
        // Out of order, as results come back.
        for block in (0..1_000u64).rev() {
            for seq in block * 1_000..(block + 1) * 1_000 {
                seqs.insert(seq, TaskEnd::Succeeded);
            }
        }
        assert_eq!(seqs.ranges(), 1);
        seqs.insert(500_000, TaskEnd::Failed);
        assert_eq!(seqs.ranges(), 3);
        assert_eq!(seqs.take(500_000), Some(TaskEnd::Failed));
        assert_eq!(seqs.take(499_999), Some(TaskEnd::Succeeded));
        assert_eq!(seqs.ranges(), 2);
        seqs.insert(499_999, TaskEnd::Succeeded);
        seqs.insert(500_000, TaskEnd::Succeeded);
        assert_eq!(seqs.ranges(), 1);
    }
}
