//! Chunk planning (pure): how many documents go into one task.
//!
//! A chunk should take 10 to 30 seconds on the actor that runs it (long enough that per-task
//! overhead is noise, short enough that a lost chunk costs little), and every actor should
//! get several chunks, so that with pull-based dispatch the fast actors take more and the
//! tail (the last chunk still running after the others are idle) stays short.

/// What the planner knows.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    /// Documents in the corpus.
    pub total_docs: u64,
    /// Measured (or estimated) docs/s of each actor.
    pub actor_docs_per_s: Vec<f64>,
    /// The model's vector width (0: unknown), which bounds a chunk by its result's bytes.
    pub dimension: usize,
    /// The work's floor ([`MIN_CHUNK`] when smaller).
    pub min_chunk: usize,
}

/// The planner's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkPlan {
    /// Documents per body chunk.
    pub chunk_size: usize,
    /// Why this size, in a sentence, for the log.
    pub reasoning: String,
}

/// A chunk should take about this long on one actor.
pub const TARGET_CHUNK_SECONDS: f64 = 20.0;
/// No shorter than this (scheduling overhead).
pub const MIN_CHUNK_SECONDS: f64 = 10.0;
/// No longer than this (what a lost chunk costs).
pub const MAX_CHUNK_SECONDS: f64 = 30.0;
/// At least this many chunks per actor, for an even tail.
pub const MIN_CHUNKS_PER_ACTOR: f64 = 4.0;
/// The smallest chunk.
pub const MIN_CHUNK: usize = 16;
/// The largest chunk.
pub const MAX_CHUNK: usize = 20_000;

/// Bytes of one document's result: its f32 vector and, at most, its truncation flag.
fn result_bytes_per_doc(dimension: usize) -> usize {
    dimension * 4 + 4
}

/// The most documents a chunk may hold so that its result fits in one message (tasks whose
/// result is larger fail). None when the dimension is unknown.
pub fn max_chunk_for_dimension(dimension: usize) -> Option<usize> {
    (dimension > 0).then(|| {
        let room = resident_proto::MAX_RESULT_BYTES - (64 << 10);
        (room / result_bytes_per_doc(dimension)).max(1)
    })
}

/// A chunk size whose results would not fit in one message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "a chunk of {chunk_size} documents gives a result of {} MB ({chunk_size} x {dimension} \
     dimensions x 4 bytes), over the {} MiB one task result may take: use --chunk-size {most} \
     or less",
    (.chunk_size * result_bytes_per_doc(*.dimension)) / 1_000_000,
    resident_proto::MAX_RESULT_BYTES >> 20
)]
pub struct ChunkTooLarge {
    /// Documents per chunk asked for.
    pub chunk_size: usize,
    /// The model's dimension.
    pub dimension: usize,
    /// The most documents a chunk of this dimension may hold.
    pub most: usize,
}

/// Refuses a chunk size whose results would not fit in one message.
pub fn check_chunk_size(chunk_size: usize, dimension: usize) -> Result<(), ChunkTooLarge> {
    match max_chunk_for_dimension(dimension) {
        Some(most) if chunk_size > most => Err(ChunkTooLarge {
            chunk_size,
            dimension,
            most,
        }),
        _ => Ok(()),
    }
}

/// Picks a chunk size for the corpus and actors.
pub fn plan_chunk_size(input: &PlanInput) -> ChunkPlan {
    let plan = plan_by_speed(input);
    match max_chunk_for_dimension(input.dimension) {
        Some(most) if plan.chunk_size > most => ChunkPlan {
            chunk_size: most,
            reasoning: format!(
                "{}; capped at {most} so that a chunk's {}-dimension vectors fit in one message",
                plan.reasoning, input.dimension
            ),
        },
        _ => plan,
    }
}

fn plan_by_speed(input: &PlanInput) -> ChunkPlan {
    let speeds: Vec<f64> = input
        .actor_docs_per_s
        .iter()
        .copied()
        .filter(|s| s.is_finite() && *s > 0.0)
        .collect();
    if speeds.is_empty() || input.total_docs == 0 {
        let chunk_size = 256.max(input.min_chunk);
        return ChunkPlan {
            chunk_size,
            reasoning: format!(
                "no speed measured or empty corpus: {chunk_size} documents per chunk"
            ),
        };
    }
    let actors = speeds.len() as f64;
    let slowest = speeds.iter().copied().fold(f64::INFINITY, f64::min);
    let fastest = speeds.iter().copied().fold(0.0, f64::max);
    let total: f64 = speeds.iter().sum();
    // About 20 s on the slowest actor, so no chunk runs past 30 s anywhere.
    let by_time = (TARGET_CHUNK_SECONDS * slowest).min(MAX_CHUNK_SECONDS * slowest);
    // Several chunks per actor, weighted by speed: the whole corpus in `4 x actors` chunks.
    let by_share = input.total_docs as f64 / (MIN_CHUNKS_PER_ACTOR * actors);
    let size = by_time
        .min(by_share)
        .clamp(
            input.min_chunk.clamp(MIN_CHUNK, MAX_CHUNK) as f64,
            MAX_CHUNK as f64,
        )
        .round() as usize;
    let chunk_seconds_fast = size as f64 / fastest;
    let reasoning = format!(
        "{} docs over {} actors ({:.0}-{:.0} docs/s each, {:.0} total): chunk of {size} = min({:.0} for ~{TARGET_CHUNK_SECONDS:.0} s on the slowest actor, {:.0} for {MIN_CHUNKS_PER_ACTOR:.0}+ chunks per actor); {:.1}-{:.1} s per chunk, about {} chunks",
        input.total_docs,
        speeds.len(),
        slowest,
        fastest,
        total,
        by_time,
        by_share,
        chunk_seconds_fast,
        size as f64 / slowest,
        input.total_docs.div_ceil(size as u64),
    );
    ChunkPlan {
        chunk_size: size,
        reasoning,
    }
}

/// Speeds measured on the probe chunks, per actor.
#[derive(Clone, Debug, Default)]
pub struct ProbeTimings {
    /// Documents and microseconds of embedding, by actor id.
    by_actor: std::collections::BTreeMap<String, (u64, u64)>,
    results: usize,
}

impl ProbeTimings {
    /// Records a probe chunk: `docs` embedded by `actor` in `micros`.
    pub fn add(&mut self, actor: &str, docs: u64, micros: u64) {
        let entry = self.by_actor.entry(actor.to_owned()).or_default();
        entry.0 += docs;
        entry.1 += micros.max(1);
        self.results += 1;
    }

    /// Probe results recorded.
    pub fn results(&self) -> usize {
        self.results
    }

    /// Docs/s of each of `actors` actors; those no probe reached are assumed as fast as the
    /// measured median.
    pub fn speeds(&self, actors: usize) -> Vec<f64> {
        let mut speeds: Vec<f64> = self
            .by_actor
            .values()
            .map(|(docs, micros)| *docs as f64 * 1e6 / *micros as f64)
            .collect();
        if !speeds.is_empty() && speeds.len() < actors {
            speeds.sort_by(f64::total_cmp);
            let median = speeds[speeds.len() / 2];
            speeds.resize(actors, median);
        }
        speeds
    }
}

/// Finish time of a corpus split into `chunk_size` chunks that idle actors pull in order
/// (what the scheduler does with credit 1). Pure simulation for planning and tests.
pub fn simulate_finish_seconds(
    total_docs: u64,
    chunk_size: usize,
    actor_docs_per_s: &[f64],
) -> f64 {
    let chunk_size = chunk_size.max(1);
    let full = (total_docs / chunk_size as u64) as usize;
    let mut chunks = vec![chunk_size; full];
    let rest = (total_docs % chunk_size as u64) as usize;
    if rest > 0 {
        chunks.push(rest);
    }
    simulate_chunks_finish_seconds(&chunks, actor_docs_per_s)
}

/// Finish time of these chunks, pulled in order by whichever actor is idle first.
pub fn simulate_chunks_finish_seconds(chunks: &[usize], actor_docs_per_s: &[f64]) -> f64 {
    let mut free_at = vec![0.0f64; actor_docs_per_s.len()];
    for &docs in chunks {
        let (actor, at) = free_at
            .iter()
            .copied()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("at least one actor");
        free_at[actor] = at + docs as f64 / actor_docs_per_s[actor];
    }
    free_at.into_iter().fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mixed() -> Vec<f64> {
        let mut speeds = vec![2000.0; 8]; // e.g. A6000s
        speeds.extend(vec![400.0; 8]); // e.g. T4s
        speeds
    }

    #[test]
    fn beats_the_static_split_on_a_heterogeneous_cluster() {
        let speeds = mixed();
        let total = 2_000_000u64;
        let static_chunk = (total / (2 * speeds.len() as u64)) as usize;
        let plan = plan_chunk_size(&PlanInput {
            total_docs: total,
            actor_docs_per_s: speeds.clone(),
            dimension: 384,
            min_chunk: 0,
        });
        let planned = simulate_finish_seconds(total, plan.chunk_size, &speeds);
        let static_split = simulate_finish_seconds(total, static_chunk, &speeds);
        let ideal = total as f64 / speeds.iter().sum::<f64>();
        assert!(
            planned < static_split * 0.8,
            "planned {planned:.0} s vs static {static_split:.0} s"
        );
        let slow_chunk_seconds = plan.chunk_size as f64 / 400.0;
        assert!(
            planned <= ideal + slow_chunk_seconds,
            "planned {planned:.0} s vs ideal {ideal:.0} s: the tail is at most one chunk"
        );
        assert!(plan.reasoning.contains("chunk of"), "{}", plan.reasoning);
    }

    #[test]
    fn chunks_take_ten_to_thirty_seconds_when_the_corpus_is_large() {
        let speeds = mixed();
        let plan = plan_chunk_size(&PlanInput {
            total_docs: 100_000_000,
            actor_docs_per_s: speeds.clone(),
            dimension: 384,
            min_chunk: 0,
        });
        let slow_seconds = plan.chunk_size as f64 / 400.0;
        assert!(
            (MIN_CHUNK_SECONDS..=MAX_CHUNK_SECONDS).contains(&slow_seconds),
            "{slow_seconds}"
        );
    }

    #[test]
    fn small_corpora_still_give_every_actor_several_chunks() {
        let plan = plan_chunk_size(&PlanInput {
            total_docs: 300,
            actor_docs_per_s: vec![50.0, 50.0],
            dimension: 0,
            min_chunk: 0,
        });
        assert!(300usize.div_ceil(plan.chunk_size) >= 8, "{plan:?}");
        let tiny = plan_chunk_size(&PlanInput {
            total_docs: 10,
            actor_docs_per_s: vec![50.0],
            dimension: 0,
            min_chunk: 0,
        });
        assert_eq!(tiny.chunk_size, MIN_CHUNK);
    }

    #[test]
    fn no_speeds_fall_back_to_a_fixed_size() {
        let plan = plan_chunk_size(&PlanInput {
            total_docs: 1000,
            actor_docs_per_s: vec![],
            dimension: 0,
            min_chunk: 0,
        });
        assert_eq!(plan.chunk_size, 256);
    }

    #[test]
    fn chunks_of_wide_vectors_are_capped_under_the_message_limit() {
        // 4,096-dimension vectors on fast actors: by speed alone the chunk would be the
        // 20,000 maximum, a 328 MB result.
        let plan = plan_chunk_size(&PlanInput {
            total_docs: 100_000_000,
            actor_docs_per_s: vec![5000.0; 4],
            dimension: 4096,
            min_chunk: 0,
        });
        let most = max_chunk_for_dimension(4096).unwrap();
        assert_eq!(plan.chunk_size, most, "{plan:?}");
        assert!(most * 4096 * 4 < resident_proto::MAX_RESULT_BYTES, "{most}");
        assert!(most > 15_000, "{most}");
        assert!(plan.reasoning.contains("capped"), "{}", plan.reasoning);
        assert!(check_chunk_size(most, 4096).is_ok());
        let refusal = check_chunk_size(20_000, 4096).unwrap_err().to_string();
        assert!(
            refusal.contains(&format!("--chunk-size {most} or less")),
            "{refusal}"
        );
        assert!(check_chunk_size(20_000, 384).is_ok(), "narrow vectors fit");
        assert!(
            check_chunk_size(1_000_000, 0).is_ok(),
            "unknown width: no check"
        );
    }

    #[test]
    fn probe_timings_give_each_actor_its_speed_and_the_unmeasured_the_median() {
        let mut timings = ProbeTimings::default();
        timings.add("a", 30, 1_000_000);
        timings.add("a", 30, 1_000_000);
        timings.add("b", 20, 1_000_000);
        timings.add("c", 50, 1_000_000);
        assert_eq!(timings.results(), 4);
        let speeds = timings.speeds(5);
        assert_eq!(speeds, vec![20.0, 30.0, 50.0, 30.0, 30.0]);
        assert!(ProbeTimings::default().speeds(3).is_empty());
    }

    #[test]
    fn simulation_matches_a_hand_count() {
        // 4 chunks of 100 on one actor at 100 docs/s, and one at 50: 400 docs.
        assert_eq!(simulate_finish_seconds(400, 100, &[100.0]), 4.0);
        let t = simulate_finish_seconds(400, 100, &[100.0, 50.0]);
        assert_eq!(t, 3.0, "fast takes 3 chunks (3 s), slow one (2 s)");
    }

    /// A work's floor (generate: four batches of sequences) wins over a short chunk time.
    #[test]
    fn a_works_floor_raises_slow_chunks() {
        let plan = plan_chunk_size(&PlanInput {
            total_docs: 200,
            actor_docs_per_s: vec![0.13],
            dimension: 0,
            min_chunk: 128,
        });
        assert_eq!(plan.chunk_size, 128, "{plan:?}");
        let plan = plan_chunk_size(&PlanInput {
            total_docs: 200,
            actor_docs_per_s: vec![0.13],
            dimension: 0,
            min_chunk: 4,
        });
        assert_eq!(plan.chunk_size, MIN_CHUNK, "the planner's own floor stays");
    }
}
