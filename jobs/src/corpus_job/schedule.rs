//! The chunk schedule (pure): how many documents each chunk of a job holds.
//!
//! A planned job starts with a few small *probe* chunks, two per actor. They are real work
//! (their vectors are kept), and their timings size the *body*: once the first probes are
//! back the planner picks the body's chunk size from the measured speeds, while the second
//! probes keep the actors busy. The last chunks shrink (each takes half of an even share of
//! what is left, down to a floor of about a second's work), so the actors finish together
//! instead of one running a whole chunk while the others idle.
//!
//! The schedule is recorded in the manifest: the chunk boundaries are a pure function of it
//! and the number of documents, so a resumed run cuts the same chunks.

use serde::{Deserialize, Serialize};

/// Probe chunks per actor: the first ones are measured while the second ones run.
pub const PROBES_PER_ACTOR: u64 = 2;
/// Probe chunk sizes: about a sixteenth of an actor's share of the corpus, within these.
pub const MIN_PROBE: usize = 16;
/// The largest probe chunk.
pub const MAX_PROBE: usize = 256;
/// The smallest tail chunk, in seconds of the slowest actor's work.
pub const TAIL_MIN_SECONDS: f64 = 1.0;

/// Where each chunk of a job starts and ends: probe chunks first, then the planned body,
/// then a shrinking tail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSchedule {
    /// Documents in each probe chunk.
    pub probe_size: usize,
    /// Probe chunks at the start of the job (0: none, a fixed chunk size).
    pub probe_chunks: u64,
    /// The body's chunk size; `None` until the probes have been measured.
    pub body_size: Option<usize>,
    /// The smallest tail chunk.
    pub tail_min: usize,
    /// Actors the tail is shared between.
    pub tail_actors: usize,
    /// The fewest documents a chunk holds, whatever the timings (the work's
    /// `min_chunk_records`; 0 in manifests from before it).
    #[serde(default)]
    pub min_chunk: usize,
}

impl ChunkSchedule {
    /// Every chunk the same size (`--chunk-size N`, and manifests from before schedules).
    pub fn uniform(size: usize) -> Self {
        let size = size.max(1);
        Self {
            probe_size: size,
            probe_chunks: 0,
            body_size: Some(size),
            tail_min: size,
            tail_actors: 1,
            min_chunk: 0,
        }
    }

    /// A schedule that starts with probes and plans its body from them; no chunk holds
    /// fewer than `min_chunk` documents (nor [`MIN_PROBE`]).
    pub fn probing(total_docs: u64, actors: usize, min_chunk: usize) -> Self {
        let actors = actors.max(1);
        let share = total_docs / (16 * actors as u64);
        let floor = min_chunk.max(MIN_PROBE);
        let probe_size = (share as usize).clamp(floor, MAX_PROBE.max(floor));
        Self {
            probe_size,
            probe_chunks: PROBES_PER_ACTOR * actors as u64,
            body_size: None,
            tail_min: floor,
            tail_actors: actors,
            min_chunk,
        }
    }

    /// The probe chunks a corpus of `total_docs` has, in words: "2 probe chunks of 128
    /// records".
    pub fn probes(&self, total_docs: u64) -> String {
        match self.probe_indexes(total_docs).end {
            1 => format!("1 probe chunk of {} records", self.probe_size),
            count => format!("{count} probe chunks of {} records", self.probe_size),
        }
    }

    /// The schedule in words, for a resumed job's plan: `total_docs` decide how many of the
    /// probes the corpus holds.
    pub fn describe(&self, total_docs: u64) -> String {
        let probes = self.probes(total_docs);
        match (self.probe_chunks, self.body_size) {
            (0, size) => format!("chunks of {}", size.unwrap_or(self.probe_size)),
            (_, Some(body)) => format!("{probes}, then chunks of {body}"),
            (_, None) => format!("{probes}; the rest sized by their timings"),
        }
    }

    /// Whether the body's size is known.
    pub fn is_planned(&self) -> bool {
        self.body_size.is_some()
    }

    /// Sets the body's chunk size and the tail's floor (at least 1, at most the body).
    pub fn plan_body(&mut self, body_size: usize, tail_min: usize) {
        let body_size = body_size.max(self.min_chunk).max(1);
        self.body_size = Some(body_size);
        self.tail_min = tail_min.clamp(self.min_chunk.max(1), body_size);
    }

    /// Documents the probe chunks hold out of `total_docs`.
    pub fn probe_docs(&self, total_docs: u64) -> u64 {
        (self.probe_chunks * self.probe_size as u64).min(total_docs)
    }

    /// The indexes of the probe chunks a corpus of `total_docs` has.
    pub fn probe_indexes(&self, total_docs: u64) -> std::ops::Range<u64> {
        0..self.probe_docs(total_docs).div_ceil(self.probe_size as u64)
    }

    /// Whether chunk `index` is a probe.
    pub fn is_probe(&self, index: u64) -> bool {
        index < self.probe_chunks
    }

    /// Cuts `total_docs` documents into chunks.
    pub fn cutter(&self, total_docs: u64) -> ChunkCutter {
        ChunkCutter {
            schedule: self.clone(),
            index: 0,
            remaining: total_docs,
        }
    }

    /// Chunks of `total_docs`; before the body is planned, an estimate that assumes the
    /// largest body the planner would pick (so it errs low).
    pub fn chunk_count(&self, total_docs: u64) -> u64 {
        let mut schedule = self.clone();
        if !schedule.is_planned() {
            let rest = total_docs - self.probe_docs(total_docs);
            let share = rest / (4 * self.tail_actors.max(1) as u64);
            let body = (share as usize).clamp(self.probe_size, super::planner::MAX_CHUNK);
            schedule.plan_body(body, body);
        }
        let mut cutter = schedule.cutter(total_docs);
        let mut chunks = 0;
        while let NextChunk::Docs(_) = cutter.next_chunk() {
            chunks += 1;
        }
        chunks
    }
}

/// What the cutter says the next chunk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextChunk {
    /// A chunk of this many documents.
    Docs(usize),
    /// The probes are cut; the body's size must be planned before the next chunk.
    NeedsPlan,
    /// Every document is in a chunk.
    Done,
}

/// Walks a schedule chunk by chunk.
#[derive(Clone, Debug)]
pub struct ChunkCutter {
    schedule: ChunkSchedule,
    index: u64,
    remaining: u64,
}

impl ChunkCutter {
    /// The next chunk's size; advances past it.
    pub fn next_chunk(&mut self) -> NextChunk {
        if self.remaining == 0 {
            return NextChunk::Done;
        }
        let docs = if self.schedule.is_probe(self.index) {
            self.schedule.probe_size
        } else {
            match self.schedule.body_size {
                None => return NextChunk::NeedsPlan,
                Some(body) => self.tail_or_body(body),
            }
        };
        let docs = (docs as u64).min(self.remaining);
        self.remaining -= docs;
        self.index += 1;
        NextChunk::Docs(docs as usize)
    }

    /// Half of an even share of what is left, between the tail's floor and the body size:
    /// the body size until the last `2 x actors` body chunks, then shrinking.
    fn tail_or_body(&self, body: usize) -> usize {
        let actors = self.schedule.tail_actors.max(1) as u64;
        let half_share = self.remaining.div_ceil(2 * actors);
        (half_share.min(body as u64) as usize).max(self.schedule.tail_min.min(body))
    }

    /// Plans the body (see [`ChunkSchedule::plan_body`]).
    pub fn plan_body(&mut self, body_size: usize, tail_min: usize) {
        self.schedule.plan_body(body_size, tail_min);
    }

    /// The schedule.
    pub fn schedule(&self) -> &ChunkSchedule {
        &self.schedule
    }
}

/// The smallest tail chunk for actors whose slowest runs `slowest_docs_per_s`.
pub fn tail_floor(slowest_docs_per_s: f64) -> usize {
    if !(slowest_docs_per_s.is_finite() && slowest_docs_per_s > 0.0) {
        return MIN_PROBE;
    }
    ((slowest_docs_per_s * TAIL_MIN_SECONDS).round() as usize).max(MIN_PROBE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus_job::planner::simulate_chunks_finish_seconds;

    fn cut_all(schedule: &ChunkSchedule, total: u64) -> Vec<usize> {
        let mut cutter = schedule.cutter(total);
        let mut sizes = Vec::new();
        loop {
            match cutter.next_chunk() {
                NextChunk::Docs(docs) => sizes.push(docs),
                NextChunk::Done => return sizes,
                NextChunk::NeedsPlan => panic!("unplanned"),
            }
        }
    }

    /// A resumed job says which schedule it kept: a fixed size, probes with the body
    /// planned from them, or probes alone (a corpus they held whole).
    #[test]
    fn a_schedule_describes_itself() {
        assert_eq!(ChunkSchedule::uniform(64).describe(1_000), "chunks of 64");
        let mut probing = ChunkSchedule::probing(3, 1, 0);
        assert_eq!(
            probing.describe(3),
            format!(
                "1 probe chunk of {} records; the rest sized by their timings",
                probing.probe_size
            )
        );
        probing.plan_body(500, 10);
        assert!(probing.describe(10_000).ends_with("then chunks of 500"));
    }

    #[test]
    fn a_uniform_schedule_is_the_fixed_chunk_size() {
        assert_eq!(cut_all(&ChunkSchedule::uniform(4), 10), vec![4, 4, 2]);
        assert_eq!(ChunkSchedule::uniform(4).chunk_count(10), 3);
        assert_eq!(ChunkSchedule::uniform(4).probe_indexes(10), 0..0);
    }

    #[test]
    fn probes_come_first_then_the_cutter_waits_for_a_plan() {
        let schedule = ChunkSchedule::probing(1000, 2, 0);
        assert_eq!(schedule.probe_size, 31);
        assert_eq!(schedule.probe_indexes(1000), 0..4);
        let mut cutter = schedule.cutter(1000);
        for _ in 0..4 {
            assert_eq!(cutter.next_chunk(), NextChunk::Docs(31));
        }
        assert_eq!(cutter.next_chunk(), NextChunk::NeedsPlan);
        assert_eq!(cutter.next_chunk(), NextChunk::NeedsPlan, "still waiting");
        cutter.plan_body(110, 39);
        assert_eq!(cutter.next_chunk(), NextChunk::Docs(110));
    }

    #[test]
    fn a_corpus_smaller_than_the_probes_needs_no_plan() {
        let schedule = ChunkSchedule::probing(40, 2, 0);
        assert_eq!(schedule.probe_size, MIN_PROBE);
        assert_eq!(cut_all(&schedule, 40), vec![16, 16, 8]);
        assert_eq!(schedule.probe_indexes(40), 0..3);
        assert_eq!(schedule.chunk_count(40), 3);
    }

    #[test]
    fn the_tail_shrinks_to_its_floor_and_every_document_is_cut_once() {
        let mut schedule = ChunkSchedule::probing(10_000, 2, 0);
        schedule.plan_body(700, 35);
        let sizes = cut_all(&schedule, 10_000);
        assert_eq!(sizes.iter().sum::<usize>(), 10_000);
        assert_eq!(&sizes[..4], &[256; 4]);
        assert!(sizes[4..].iter().all(|&s| s <= 700), "{sizes:?}");
        let tail: Vec<usize> = sizes.iter().rev().take(6).copied().collect();
        assert!(
            tail[1..].iter().all(|&s| s == 35 || s < 100),
            "the last chunks are small: {sizes:?}"
        );
        assert!(tail[0] <= 35, "{sizes:?}");
        assert_eq!(schedule.chunk_count(10_000), sizes.len() as u64);
    }

    #[test]
    fn the_estimate_before_the_plan_errs_low() {
        let schedule = ChunkSchedule::probing(1_000_000, 4, 0);
        let estimate = schedule.chunk_count(1_000_000);
        let mut planned = schedule.clone();
        planned.plan_body(2_000, 100);
        assert!(estimate <= planned.chunk_count(1_000_000), "{estimate}");
        assert!(estimate > 8);
    }

    #[test]
    fn the_shrinking_tail_finishes_nearer_the_ideal_than_fixed_chunks() {
        // Two equal actors and a body chunk a ninth of the corpus: fixed chunks leave one
        // actor idle for a whole chunk at the end.
        let speeds = [40.0, 40.0];
        let total = 1_000u64;
        let ideal = total as f64 / 80.0;
        let fixed = cut_all(&ChunkSchedule::uniform(111), total);
        let mut shrinking = ChunkSchedule::probing(total, 2, 0);
        shrinking.plan_body(111, tail_floor(40.0));
        let shrinking = cut_all(&shrinking, total);
        let fixed_s = simulate_chunks_finish_seconds(&fixed, &speeds);
        let shrinking_s = simulate_chunks_finish_seconds(&shrinking, &speeds);
        assert!(shrinking_s < fixed_s, "{shrinking_s} vs {fixed_s}");
        assert!(
            shrinking_s <= ideal + TAIL_MIN_SECONDS / 2.0,
            "{shrinking_s} s against the ideal {ideal} s: {shrinking:?}"
        );
    }

    #[test]
    fn the_tail_floor_is_a_second_of_the_slowest_actor() {
        assert_eq!(tail_floor(39.4), 39);
        assert_eq!(tail_floor(3.0), MIN_PROBE);
        assert_eq!(tail_floor(f64::NAN), MIN_PROBE);
        assert_eq!(tail_floor(2_000.0), 2_000);
    }

    #[test]
    fn schedules_round_trip_through_json() {
        let mut schedule = ChunkSchedule::probing(5_000, 3, 0);
        schedule.plan_body(400, 20);
        let json = serde_json::to_string(&schedule).unwrap();
        assert_eq!(
            serde_json::from_str::<ChunkSchedule>(&json).unwrap(),
            schedule
        );
    }

    /// A work's floor holds for probes, body and tail alike.
    #[test]
    fn no_chunk_is_smaller_than_the_works_floor() {
        let mut schedule = ChunkSchedule::probing(200, 1, 128);
        assert_eq!(schedule.probe_size, 128);
        schedule.plan_body(16, 16);
        assert_eq!((schedule.body_size, schedule.tail_min), (Some(128), 128));
        let mut cutter = schedule.cutter(1_000);
        let mut sizes = Vec::new();
        loop {
            match cutter.next_chunk() {
                NextChunk::Docs(n) => sizes.push(n),
                NextChunk::NeedsPlan => unreachable!("planned"),
                NextChunk::Done => break,
            }
        }
        assert_eq!(sizes.iter().sum::<usize>(), 1_000);
        let last = sizes.pop().unwrap();
        assert!(sizes.iter().all(|&n| n >= 128), "{sizes:?} then {last}");
    }
}
