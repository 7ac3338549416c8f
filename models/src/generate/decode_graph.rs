//! CUDA graphs for the dense engine's decode steps (issue 42 item 6).
//!
//! A decode step of SmolLM2-135M is about 360 small kernels (twelve a layer, thirty layers),
//! each put together and launched by the host through candle: at a few rows a sequence the
//! host's work, not the GPU's, sets the step's time. Captured once as a CUDA graph and
//! replayed, the step is one launch.
//!
//! How:
//! - A step whose rows are each their own sequence and each want logits ([`is_decode_step`])
//!   is padded to the next batch size of [`BUCKETS`] ([`bucket`]) with rows that write and
//!   read the cache's scratch block (`DenseKv::scratch_block`), so that a few graphs serve
//!   every batch.
//! - Per bucket, static tensors on the GPU: the inputs (token ids, rotations, cache rows,
//!   the paged layout's words) and the logits (`bucket x vocab`). The first step of a bucket
//!   runs the forward eagerly on them (its answer, and the warm-up: kernels loaded, cuBLAS
//!   ready), then captures the same forward into a graph. Later steps copy their inputs into
//!   the static tensors and replay it.
//! - Checked, because a graph that replays stale inputs would answer wrong without an error:
//!   a bucket's first replay is followed by the eager forward on the same inputs, and unless
//!   their logits agree every graph of the cache is dropped and the engine stays eager
//!   (logged). A capture that fails does the same.
//! - The KV cache's tensors must stay where the graphs saw them: a growth (a new
//!   [`DenseKv::epoch`]) drops every graph, and a layout that outgrows its bucket's words
//!   buffer recaptures that bucket.
//! - What follows the logits (greedy argmax, draws, logits for the host's sampler) runs
//!   eagerly, as in the eager step.
//!
//! Steps that prefill (their shapes vary), steps past the largest bucket and the CPU run
//! the eager forward (`DenseLlama::forward`). `GenerateModel::use_decode_graphs(false)`
//! turns graphs off for a model (`--enforce-eager`; benchmarks compare both).

use candle_core::Device;

#[cfg(feature = "cuda")]
use super::decode_graph_cuda as cuda;
use super::decoder::{NextToken, Row};
use super::dense::{DenseKv, DenseLlama};
use super::step_profile::PhaseClock;
use crate::ModelError;

/// The batch sizes graphs are captured for: a step is padded to the next one (at most half
/// as many rows again from 16 on; a padding row shares the weights' read with the real
/// rows and attends to one position).
pub const BUCKETS: [usize; 16] = [
    1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512,
];

/// The batch size a decode step of `rows` rows runs as; `None` past the largest bucket.
pub fn bucket(rows: usize) -> Option<usize> {
    match rows {
        0 => None,
        _ => BUCKETS.iter().copied().find(|&size| size >= rows),
    }
}

/// Whether `rows` are a step a graph can run: each row its own sequence, each wanting
/// logits (no prompt rows, whose numbers vary step to step).
pub fn is_decode_step(rows: &[Row]) -> bool {
    if rows.is_empty() || !rows.iter().all(|row| row.logits) {
        return false;
    }
    let mut slots: Vec<usize> = rows.iter().map(|row| row.slot).collect();
    slots.sort_unstable();
    slots.windows(2).all(|pair| pair[0] != pair[1])
}

/// Graphs captured and steps replayed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphCounts {
    /// Captures (each batch size once an epoch of the cache; again where its layout outgrew
    /// its buffer).
    pub captures: u64,
    /// Decode steps replayed from a graph.
    pub replays: u64,
}

/// The decode graphs of one KV cache.
pub struct DecodeGraphs {
    /// Whether steps may run as graphs: a CUDA device, and no failure so far.
    on: bool,
    /// Why graphs were given up, if they were (as logged).
    given_up: Option<String>,
    counts: GraphCounts,
    #[cfg(feature = "cuda")]
    graphs: cuda::Graphs,
}

impl DecodeGraphs {
    /// Graphs for a cache on `device` (none on the CPU).
    pub fn new(device: &Device) -> Self {
        Self {
            on: device.is_cuda(),
            given_up: None,
            counts: GraphCounts::default(),
            #[cfg(feature = "cuda")]
            graphs: cuda::Graphs::default(),
        }
    }

    /// Graphs off for this cache (`GenerateModel::use_decode_graphs(false)`, and tests that
    /// compare both paths).
    pub fn off() -> Self {
        Self::new(&Device::Cpu)
    }

    /// Whether steps may still run as graphs.
    pub fn on(&self) -> bool {
        self.on
    }

    /// Why graphs were given up for this cache, if they were.
    pub fn given_up(&self) -> Option<&str> {
        self.given_up.as_deref()
    }

    /// Graphs captured and steps replayed, over the cache's life.
    pub fn counts(&self) -> GraphCounts {
        self.counts
    }

    /// The batch sizes whose graphs are held now.
    pub fn captured(&self) -> Vec<usize> {
        #[cfg(feature = "cuda")]
        return self.graphs.buckets();
        #[cfg(not(feature = "cuda"))]
        Vec::new()
    }

    /// One step of `model` over `rows`, as `DenseLlama::forward` answers it: replayed from
    /// a graph where it can be, eager otherwise.
    pub fn forward(
        &mut self,
        model: &DenseLlama,
        rows: &[Row],
        kv: &mut DenseKv,
        clock: &mut PhaseClock,
    ) -> Result<Vec<NextToken>, ModelError> {
        #[cfg(feature = "cuda")]
        if self.on
            && is_decode_step(rows)
            && let Some(size) = bucket(rows.len())
        {
            return self.graphed(model, rows, kv, size, clock);
        }
        model.forward(rows, kv, clock)
    }

    #[cfg(feature = "cuda")]
    fn graphed(
        &mut self,
        model: &DenseLlama,
        rows: &[Row],
        kv: &mut DenseKv,
        size: usize,
        clock: &mut PhaseClock,
    ) -> Result<Vec<NextToken>, ModelError> {
        match self.graphs.step(model, rows, kv, size, clock) {
            Ok(cuda::Stepped::Captured(out)) => {
                self.counts.captures += 1;
                Ok(out)
            }
            Ok(cuda::Stepped::Replayed(out)) => {
                self.counts.replays += 1;
                Ok(out)
            }
            Ok(cuda::Stepped::Disagreed(out, why)) => {
                let why = format!(
                    "a CUDA graph of {size} decode rows disagreed with the eager step ({why})"
                );
                tracing::error!(
                    "{why}: this cache runs eager steps from now on (slower, the same tokens)"
                );
                self.give_up(why);
                Ok(out)
            }
            Err(cuda::GraphError::Capture(error)) => {
                let why =
                    format!("a CUDA graph of {size} decode rows could not be captured ({error})");
                tracing::warn!("{why}: this cache runs eager steps from now on");
                self.give_up(why);
                model.forward(rows, kv, clock)
            }
            Err(cuda::GraphError::Step(error)) => Err(ModelError::from_candle(error)),
        }
    }

    #[cfg(feature = "cuda")]
    fn give_up(&mut self, why: String) {
        self.on = false;
        self.given_up = Some(why);
        self.graphs = cuda::Graphs::default();
    }
}

#[cfg(test)]
#[path = "decode_graph_tests.rs"]
mod tests;
