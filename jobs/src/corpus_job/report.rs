//! `report.json`: what the job produced, how fast, where, and what it cost.

use std::collections::BTreeMap;
use std::time::Duration;

use resident_sdk::{ActorInfo, HeldUsage, NodeInfo};
use serde::{Deserialize, Serialize};

use super::config::CorpusJobConfig;
use super::manifest::Manifest;
use super::reader::BadRecord;
use super::work::Piece;
use crate::usage::PricedUsage;

pub use resident_proto::prices::PriceTable;

#[derive(Clone, Debug, Default)]
pub(super) struct ReportBuilder {
    docs_by_actor: BTreeMap<String, u64>,
    node_of_actor: BTreeMap<String, String>,
}

impl ReportBuilder {
    pub fn add_chunk<T>(&mut self, piece: &Piece<T>) {
        *self
            .docs_by_actor
            .entry(piece.actor_id.to_string())
            .or_default() += piece.rows as u64;
        self.node_of_actor
            .insert(piece.actor_id.to_string(), piece.node_id.to_string());
    }

    pub fn finish<F>(self, inputs: ReportInputs<'_, F>) -> JobReport<F> {
        let wall_s = inputs.wall.as_secs_f64();
        let items = inputs
            .manifest
            .chunks
            .iter()
            .map(|c| c.records.unwrap_or(c.rows))
            .sum::<u64>();
        let computed: u64 = self.docs_by_actor.values().sum();
        let nodes: BTreeMap<&str, &NodeInfo> = inputs
            .nodes
            .iter()
            .map(|n| (n.node_id.as_str(), n))
            .collect();
        let pool_actors: Vec<&ActorInfo> = inputs
            .actors
            .iter()
            .filter(|a| a.pool.as_str() == inputs.pool)
            .collect();

        let (per_node, per_gpu) = self.throughput(&nodes, &pool_actors, wall_s);
        let usage = PricedUsage::of(&inputs.held, &inputs.config.prices);
        JobReport {
            items,
            bad_record_count: inputs.bad_records_total,
            bad_records: inputs.bad_records,
            wall_seconds: wall_s,
            ready_seconds: inputs.ready.as_secs_f64(),
            docs_per_second: if wall_s > 0.0 {
                computed as f64 / wall_s
            } else {
                0.0
            },
            computed_items: computed,
            chunks: ChunkSummary {
                total: inputs.manifest.chunks.len() as u64,
                computed: inputs.manifest.chunks.len() as u64 - inputs.reused_chunks,
                reused: inputs.reused_chunks,
                size: inputs.manifest.chunk_size,
                plan: inputs.plan_reasoning,
            },
            per_node,
            per_gpu,
            actors: pool_actors.len() as u64,
            model_loads: pool_actors.iter().map(|a| a.model_loads).sum(),
            gpu_hours: usage.gpu_hours,
            cpu_hours: usage.cpu_hours,
            estimated_cost_usd: usage.cost_usd,
            prices: inputs.config.prices.clone(),
            model: inputs.config.model.clone(),
            pool: inputs.pool.to_owned(),
            input: inputs.config.input.to_string(),
            limit: inputs.config.reader.limit,
            limit_share: inputs.config.limit_share,
            limit_by: inputs.config.reader.limit_by.clone(),
            input_fingerprint: inputs.input_fingerprint,
            model_fingerprint: inputs.model_fingerprint,
            output: inputs.output,
            figures: inputs.figures,
        }
    }

    /// Documents each node, and each GPU (or the CPU) of each node, computed this run.
    fn throughput(
        &self,
        nodes: &BTreeMap<&str, &NodeInfo>,
        pool_actors: &[&ActorInfo],
        wall_s: f64,
    ) -> (Vec<NodeThroughput>, Vec<GpuThroughput>) {
        let mut per_node: BTreeMap<String, u64> = BTreeMap::new();
        let mut per_gpu: BTreeMap<(String, Option<u32>), (String, u64)> = BTreeMap::new();
        for (actor_id, docs) in &self.docs_by_actor {
            let node = self
                .node_of_actor
                .get(actor_id)
                .cloned()
                .unwrap_or_default();
            *per_node.entry(node.clone()).or_default() += docs;
            let actor = pool_actors
                .iter()
                .find(|a| a.actor_id.as_str() == actor_id)
                .copied();
            let gpu = actor.and_then(|a| a.gpu_indices.first().copied());
            let name = device_name(actor, gpu, nodes.get(node.as_str()).copied());
            per_gpu.entry((node, gpu)).or_insert((name, 0)).1 += docs;
        }
        let per_node = per_node
            .into_iter()
            .map(|(node_id, docs)| NodeThroughput {
                docs_per_second: docs as f64 / wall_s.max(1e-9),
                node_id,
                docs,
            })
            .collect();
        let per_gpu = per_gpu
            .into_iter()
            .map(|((node_id, gpu_index), (gpu_name, docs))| GpuThroughput {
                docs_per_second: docs as f64 / wall_s.max(1e-9),
                node_id,
                gpu_index,
                gpu_name,
                docs,
            })
            .collect();
        (per_node, per_gpu)
    }
}

pub(super) struct ReportInputs<'a, F> {
    pub config: &'a CorpusJobConfig,
    pub manifest: &'a Manifest,
    pub bad_records: Vec<BadRecord>,
    pub bad_records_total: u64,
    pub output: OutputSummary,
    pub figures: F,
    pub wall: Duration,
    pub ready: Duration,
    pub reused_chunks: u64,
    pub plan_reasoning: String,
    pub pool: &'a str,
    pub actors: &'a [ActorInfo],
    pub nodes: &'a [NodeInfo],
    /// What the pool's actors held while the job ran ([`crate::usage::held_between`]).
    pub held: Vec<HeldUsage>,
    pub input_fingerprint: String,
    pub model_fingerprint: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChunkSummary {
    pub total: u64,
    pub computed: u64,
    pub reused: u64,
    pub size: usize,
    pub plan: String,
}

/// What an actor computed on, as it stands at the end of the job: its GPU's name, `cpu`, or
/// why it is not known (the actor lost its place: its GPU failed, or its node left).
fn device_name(actor: Option<&ActorInfo>, gpu: Option<u32>, node: Option<&NodeInfo>) -> String {
    match (actor, gpu) {
        (Some(_), Some(gpu)) => node
            .and_then(|n| n.gpus.iter().find(|g| g.index == gpu))
            .map_or_else(
                || format!("GPU {gpu}, out of service now"),
                |g| g.name.clone(),
            ),
        (Some(actor), None) if actor.node_id.is_some() => "cpu".to_owned(),
        _ => "unknown: its actor lost its place before the job ended (a GPU failed or a node \
              left)"
            .to_owned(),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeThroughput {
    pub node_id: String,
    pub docs: u64,
    pub docs_per_second: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuThroughput {
    pub node_id: String,
    pub gpu_index: Option<u32>,
    pub gpu_name: String,
    pub docs: u64,
    pub docs_per_second: f64,
}

/// The contents of `report.json`: what every corpus job reports, and its own `figures`
/// (written beside the rest, not nested).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobReport<F> {
    /// Records in the output (this run's and reused ones).
    pub items: u64,
    /// Records that could not be used.
    pub bad_record_count: u64,
    /// The first 10,000 bad records (`bad_record_count` counts them all).
    pub bad_records: Vec<BadRecord>,
    /// Seconds from start to end.
    pub wall_seconds: f64,
    /// Seconds from the start until the pool was ready (input scanned, model pinned, actors
    /// loaded): the rest of `wall_seconds` went to the chunks and the output. 0 in reports
    /// written before this field.
    #[serde(default)]
    pub ready_seconds: f64,
    /// Documents embedded by this run (not counting reused shards) per wall second.
    pub docs_per_second: f64,
    /// Records this run computed (not counting reused shards).
    pub computed_items: u64,
    /// How the corpus was chunked, and how many chunks were reused.
    pub chunks: ChunkSummary,
    /// Throughput of each node.
    pub per_node: Vec<NodeThroughput>,
    /// Throughput of each GPU (or CPU) of each node.
    pub per_gpu: Vec<GpuThroughput>,
    /// Actors of the job's pool.
    pub actors: u64,
    /// Model loads by them: one per actor when weights stay resident.
    pub model_loads: u64,
    /// GPU-hours the pool's actors held while the job ran (each actor's GPU fraction times
    /// its GPUs): each actor while it held its place, so one lost mid-job (its GPU failed,
    /// its node left) counts until then and its replacement from its placement. A pool kept
    /// from an earlier run counts from this run's start; a pool two jobs share is billed to
    /// each in full.
    pub gpu_hours: f64,
    /// CPU core-hours its CPU actors held, counted the same way.
    pub cpu_hours: f64,
    /// What those hours cost at `prices`.
    pub estimated_cost_usd: f64,
    /// The prices the estimate used.
    pub prices: PriceTable,
    /// The model as named.
    pub model: String,
    /// The pool the job ran on.
    #[serde(default)]
    pub pool: String,
    /// The input as named.
    pub input: String,
    /// Only the input's first this many records were read (`--limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// `--limit` as a share of the input's records, when given so: `limit` is its count
    /// (absent with `limit_by`: each group's share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_share: Option<f64>,
    /// The field whose values each got the limit (`--limit-by`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_by: Option<String>,
    /// SHA-256 over the input files' names and bytes (size and ETag for S3 objects), and
    /// `--limit` when given: what a resume checks.
    pub input_fingerprint: String,
    /// SHA-256 of the model's content.
    pub model_fingerprint: String,
    /// Where the output is and what it holds.
    #[serde(default)]
    pub output: OutputSummary,
    /// The job's own figures (embed: vectors; generate: tokens), written beside the rest.
    #[serde(flatten)]
    pub figures: F,
}

/// How the output was written.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OutputSummary {
    /// Whether the merged files (`embeddings.npy` and `ids.jsonl`, or `generations.jsonl`)
    /// were written (else the shards and `index.json` are the output).
    pub merged: bool,
    /// Why not, when not.
    pub merge_skipped: Option<String>,
    /// What keeping `manifest.json` and its journal cost this run.
    pub manifest_writes: super::manifest_store::ManifestWrites,
}

#[cfg(test)]
mod tests {
    use resident_sdk::{ActorState, GpuInfo};

    use super::*;

    fn actor(node: Option<&str>, gpus: Vec<u32>) -> ActorInfo {
        ActorInfo {
            actor_id: "a".into(),
            pool: "p".into(),
            node_id: node.map(Into::into),
            gpu_indices: gpus,
            gpu_fraction: 1.0,
            state: ActorState::Ready,
            model_loads: 1,
            restarts: 0,
            vram_bytes: 0,
            in_flight: 0,
            tasks_done: 0,
            error: None,
        }
    }

    /// GPU work is never reported as the CPU's: an actor whose GPU failed, or that lost its
    /// place, says so.
    #[test]
    fn each_actors_device_is_named_as_it_stands() {
        let node = NodeInfo {
            node_id: "n1".into(),
            generation: String::new(),
            hostname: String::new(),
            alive: true,
            labels: Default::default(),
            gpus: vec![GpuInfo {
                index: 0,
                uuid: String::new(),
                name: "T4".into(),
                total_vram_bytes: 16 << 30,
                free_vram_bytes: 16 << 30,
                compute_capability: (7, 5),
                simulated: true,
            }],
            cpu_cores: 4,
            ram_bytes: 0,
            last_heartbeat_ms_ago: 0,
            credential: String::new(),
            draining: false,
            unavailable_gpus: vec![],
        };
        let on = |gpus: Vec<u32>| actor(Some("n1"), gpus);
        assert_eq!(device_name(Some(&on(vec![0])), Some(0), Some(&node)), "T4");
        assert_eq!(device_name(Some(&on(vec![])), None, Some(&node)), "cpu");
        assert_eq!(
            device_name(Some(&on(vec![1])), Some(1), Some(&node)),
            "GPU 1, out of service now"
        );
        let lost = actor(None, vec![]);
        assert!(device_name(Some(&lost), None, None).starts_with("unknown"));
        assert!(device_name(None, None, Some(&node)).starts_with("unknown"));
    }
}
