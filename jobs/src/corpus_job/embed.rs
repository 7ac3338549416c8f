//! `resident embed`'s own part of the corpus pipeline: chunks of texts to `embed` actors,
//! vectors back, shards as `.npy`, merged into `embeddings.npy` and `ids.jsonl`.

use std::time::Duration;

use prost::Message;
use resident_proto::pb;
use resident_sdk::{Bytes, Cluster, EmbeddedChunk, Pool, SdkError, TaskOutput, embed_request};

use super::output::{Manifest, OutputDtype, encode_vectors};
use super::reader::Record;
use super::report::{EmbedFigures, VectorStats};
use super::work::{ChunkWork, MergeLayout, Piece};
use super::{CorpusJobConfig, JobError, planner};
use crate::model_pin::PinnedModel;
use crate::pools::EmbedActors;

/// Chunks of texts in, vectors out.
#[derive(Clone, Debug)]
pub struct EmbedWork {
    /// Vectors are written as this (the manifest records it; a resume must match).
    pub dtype: OutputDtype,
}

impl ChunkWork for EmbedWork {
    type Data = EmbeddedChunk;
    type Tally = VectorStats;
    type Figures = EmbedFigures;
    const JOB: &'static str = "embed";
    const OUTPUT: &'static str = "embeddings";
    const SETTINGS: &'static str = "model";
    const LAYOUT: MergeLayout = MergeLayout {
        format: "resident-embeddings",
        data: "embeddings.npy",
        npy: true,
        ids: Some("ids.jsonl"),
    };
    const RUNNING_ITEMS_ARE_RECORDS: bool = true;

    async fn create_pool(
        &self,
        cluster: &Cluster,
        config: &CorpusJobConfig,
        model: &PinnedModel,
        replicas: u32,
    ) -> Result<Pool, JobError> {
        let spec = EmbedActors {
            pool: super::pool_name::<Self>(config),
            model: &config.model,
            revision: model.revision.as_deref(),
            replicas,
            gpus_per_actor: config.gpus_per_actor,
            vram_gib_per_actor: config.vram_gib_per_actor,
            selector: &config.selector,
            retention: config.retention,
            task_timeout: config.task_timeout,
        }
        .spec();
        match cluster.create_embed_pool(spec, config.load_timeout).await {
            Ok(pool) => Ok(pool.pool),
            Err(error) => Err(super::pool_error(error)),
        }
    }

    fn check_resume(&self, manifest: &Manifest, place: &str) -> Result<(), JobError> {
        if manifest.dtype != self.dtype {
            return Err(JobError::Mismatch(format!(
                "{place} holds {} embeddings; rerun with --dtype {}",
                manifest.dtype.name(),
                manifest.dtype.name()
            )));
        }
        Ok(())
    }

    async fn check_chunk_size(&self, pool: &Pool, size: usize) -> Result<(), JobError> {
        let dimension = probe_dimension(pool).await?;
        planner::check_chunk_size(size, dimension).map_err(JobError::ChunkSize)
    }

    fn request(&self, records: Vec<Record>) -> Bytes {
        embed_request(records.into_iter().map(|r| r.text).collect(), false)
    }

    fn split(&self, payload: &[u8]) -> Result<Vec<Bytes>, String> {
        let request = pb::EmbedRequest::decode(payload).map_err(|e| e.to_string())?;
        Ok(request
            .texts
            .into_iter()
            .map(|text| embed_request(vec![text], request.is_query))
            .collect())
    }

    fn read(&self, output: TaskOutput) -> Result<Piece<EmbeddedChunk>, SdkError> {
        let chunk = EmbeddedChunk::from_output(output)?;
        Ok(Piece {
            rows: chunk.stats.count as usize,
            actor_id: chunk.actor_id.clone(),
            node_id: chunk.node_id.clone(),
            micros: chunk.stats.total_micros,
            model_fingerprint: chunk.stats.model_fingerprint.clone(),
            data: chunk,
        })
    }

    fn tally(tally: &mut VectorStats, piece: &Piece<EmbeddedChunk>) {
        tally.add(&piece.data);
    }

    fn figures(tally: VectorStats, manifest: &Manifest, _wall: Duration) -> EmbedFigures {
        tally.figures(manifest)
    }

    fn shard_data(
        &self,
        index: u64,
        pieces: &[Piece<EmbeddedChunk>],
        ids: &[serde_json::Value],
        manifest: &mut Manifest,
    ) -> Result<(String, Vec<u8>), JobError> {
        let dim = match pieces.first() {
            Some(piece) => piece.data.dim,
            None => manifest.dim.unwrap_or(0),
        };
        let values: Vec<f32> = pieces
            .iter()
            .flat_map(|p| p.data.values.iter().copied())
            .collect();
        let bytes = encode_vectors(&values, ids.len() as u64, dim, manifest.dtype);
        if !pieces.is_empty() {
            manifest.dim = Some(dim);
        }
        Ok((format!("shards/chunk-{index:06}.npy"), bytes))
    }

    fn merged_bytes(manifest: &Manifest) -> u64 {
        let rows: u64 = manifest.chunks.iter().map(|c| c.rows).sum();
        rows * manifest.dim.unwrap_or(0) as u64 * manifest.dtype.bytes() as u64
    }
}

/// The model's vector width, from one short embedding (for a `--chunk-size` given by hand,
/// which skips the calibration round that would tell it).
async fn probe_dimension(pool: &Pool) -> Result<usize, JobError> {
    use futures::StreamExt;
    let payload = embed_request(vec!["dimension probe".to_owned()], false);
    let mut results = pool
        .submit("dimension probe", futures::stream::iter([payload]))
        .await?;
    match results.next().await {
        Some(output) => Ok(EmbeddedChunk::from_output(output?)?.dim),
        None => Err(JobError::Model("the dimension probe got no answer".into())),
    }
}
