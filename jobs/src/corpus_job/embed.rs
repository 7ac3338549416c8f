//! `resident embed`'s own part of the corpus pipeline: chunks of texts to `embed` actors,
//! vectors back, shards as `.npy`, merged into `embeddings.npy` and `ids.jsonl`.

use std::time::Duration;

use futures::StreamExt;
use prost::Message;
use resident_proto::pb;
use resident_sdk::{
    Bytes, Cluster, EmbedOptions, EmbeddedChunk, Pool, Prompt, RowWindow, SdkError, TaskOutput,
    Windows, embed_request_options, embed_request_with,
};
use serde::{Deserialize, Serialize};

use super::kept_columns::{KeptColumn, kept_names};
use super::manifest::Manifest;
use super::npy::encode_vectors;
use super::output::MergeLayout;
use super::parquet_out;
use super::reader::{Kept, Record};
use super::report::JobReport;
use super::shard_rows::{ShardRows, WINDOW_FIELDS};
use super::vectors::OutputDtype;
use super::vectors::{QuantizationRanges, VectorShaping, encode_rows};
use super::work::{ChunkWork, Piece};
use super::{CorpusJobConfig, JobError, planner};
use crate::model_pin::PinnedModel;
use crate::pools::EmbedActors;
use crate::serde_skip::is_default;

/// Records read to calibrate int8 and uint8 ranges (the corpus's first ones): a twentieth of
/// the corpus, at least 256 (sentence-transformers warns below 100) and at most 1,024, so
/// calibrating costs a corpus of 20,000 records or more at most 5% of its time.
pub fn calibration_sample(total_docs: u64) -> usize {
    (total_docs / 20).clamp(256, 1024) as usize
}

/// A `resident embed` job: what every corpus job has, and what it does to every text.
#[derive(Clone, Debug)]
pub struct EmbedJobConfig {
    /// What every corpus job has.
    pub corpus: CorpusJobConfig,
    /// What the job does to every text.
    pub embedding: EmbedWork,
}

impl EmbedJobConfig {
    /// A job with the model's own prompt, pooling and length, writing float32 vectors.
    pub fn new(
        input: impl Into<crate::storage::Location>,
        model: impl Into<String>,
        output: impl Into<crate::storage::Location>,
    ) -> Self {
        Self {
            corpus: CorpusJobConfig::new(input, model, output),
            embedding: EmbedWork::default(),
        }
    }
}

/// Whether vectors are scaled to unit length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Normalization {
    /// As the model does (its Normalize module, when it has one).
    #[default]
    Model,
    /// Scaled to unit length after `--truncate-dim` (`--normalize`;
    /// sentence-transformers' `normalize_embeddings=True`).
    UnitLength,
    /// As pooled, without the model's Normalize module (`--no-normalize`).
    Raw,
}

/// How shards and the merged output are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VectorFormat {
    /// `.npy` shards, merged into `embeddings.npy` plus `ids.jsonl`.
    #[default]
    Npy,
    /// Parquet shards (`id`, `embedding`, the carried columns), merged into
    /// `embeddings.parquet`.
    Parquet,
}

impl VectorFormat {
    /// The shards' file extension.
    pub fn extension(self) -> &'static str {
        match self {
            VectorFormat::Npy => "npy",
            VectorFormat::Parquet => "parquet",
        }
    }
}

/// Chunks of texts in, vectors out.
#[derive(Clone, Debug, Default)]
pub struct EmbedWork {
    /// Put before every text (`--prompt-name`, `--prompt`).
    pub prompt: Prompt,
    /// Whether vectors are scaled to unit length.
    pub normalization: Normalization,
    /// Keep each vector's first this many dimensions (`--truncate-dim`).
    pub truncate_dim: Option<usize>,
    /// Vectors are written as this (`--precision`; the manifest records it; a resume must
    /// match).
    pub dtype: OutputDtype,
    /// Cut texts to this many tokens, prompt included (only shorter than the model's).
    pub max_seq_length: Option<usize>,
    /// Padded tokens per model batch on each actor (the actor's default when `None`).
    pub max_batch_tokens: Option<usize>,
    /// `--format`: npy (the default) or Parquet.
    pub format: VectorFormat,
    /// Input fields carried to the output (`--keep-columns`, each under its name):
    /// Parquet columns, or fields of each line of `ids.jsonl`.
    pub keep_columns: Vec<KeptColumn>,
    /// Cut long texts into windows (`--split`, `--pool-windows`).
    pub windows: Option<Windows>,
}

impl EmbedWork {
    /// What each task asks of the actor.
    pub fn options(&self) -> EmbedOptions {
        EmbedOptions {
            prompt: self.prompt.clone(),
            skip_model_normalize: self.normalization == Normalization::Raw,
            windows: self.windows,
        }
    }

    /// What happens to each vector between the actor and the file.
    pub fn shaping(&self) -> VectorShaping {
        VectorShaping {
            truncate_dim: self.truncate_dim,
            normalize: self.normalization == Normalization::UnitLength,
        }
    }

    /// The settings that change the vectors, besides the model and the precision, as
    /// `key=value` words (none for the defaults, so earlier outputs resume as they were).
    fn settings_words(&self) -> Vec<String> {
        let mut words = Vec::new();
        if self.prompt != Prompt::ModelDefault {
            words.push(format!("prompt={}", self.prompt.describe()));
        }
        match self.normalization {
            Normalization::Model => {}
            Normalization::UnitLength => words.push("normalize=unit".into()),
            Normalization::Raw => words.push("normalize=none".into()),
        }
        if let Some(dim) = self.truncate_dim {
            words.push(format!("truncate_dim={dim}"));
        }
        if let Some(length) = self.max_seq_length {
            words.push(format!("max_seq_length={length}"));
        }
        if !self.keep_columns.is_empty() {
            let columns: Vec<String> = self.keep_columns.iter().map(KeptColumn::describe).collect();
            words.push(format!("keep={}", columns.join(",")));
        }
        if let Some(windows) = self.windows {
            words.push(format!("windows={}", windows.describe()));
        }
        words
    }
}

impl ChunkWork for EmbedWork {
    type Data = EmbeddedChunk;
    type Tally = VectorStats;
    type Figures = EmbedFigures;
    const JOB: &'static str = "embed";
    const OUTPUT: &'static str = "embeddings";
    const SETTINGS: &'static str = "model, prompt, --normalize, --truncate-dim, \
         --max-seq-length, --keep-columns, --split or --pool-windows";
    const LAYOUT: MergeLayout = MergeLayout {
        format: "resident-embeddings",
        data: "embeddings.npy",
        npy: true,
        parquet: false,
        ids: Some("ids.jsonl"),
        generations: false,
    };
    const RUNNING_ITEMS_ARE_RECORDS: bool = true;

    fn settings_fingerprint(&self, model_fingerprint: &str) -> String {
        let words = self.settings_words();
        match words.is_empty() {
            true => model_fingerprint.to_owned(),
            false => format!("{model_fingerprint}|{}", words.join("|")),
        }
    }

    fn output_dtype(&self) -> OutputDtype {
        self.dtype
    }

    async fn create_pool(
        &self,
        cluster: &Cluster,
        config: &CorpusJobConfig,
        model: &PinnedModel,
        replicas: u32,
    ) -> Result<Pool, JobError> {
        let spec = EmbedActors {
            pool: super::work::pool_name::<Self>(config),
            model: &config.model,
            revision: model.revision.as_deref(),
            replicas,
            gpus_per_actor: config.gpus(),
            vram_gib_per_actor: config.vram_gib_per_actor,
            selector: &config.selector,
            retention: config.retention,
            task_timeout: config.task_timeout,
            max_seq_length: self.max_seq_length,
            max_batch_tokens: self.max_batch_tokens,
        }
        .spec();
        match cluster.create_embed_pool(spec, config.load_timeout).await {
            Ok(pool) => Ok(pool.pool),
            Err(error) => Err(super::work::pool_error(error)),
        }
    }

    fn layout(&self) -> MergeLayout {
        match self.format {
            VectorFormat::Npy => Self::LAYOUT,
            VectorFormat::Parquet => MergeLayout {
                format: "resident-embeddings",
                data: "embeddings.parquet",
                npy: false,
                parquet: true,
                ids: None,
                generations: false,
            },
        }
    }

    fn check_resume(&self, manifest: &Manifest, place: &str) -> Result<(), JobError> {
        manifest.check_shard_format(place, self.format.extension(), ("npy", "npy"))?;
        if manifest.dtype != self.dtype {
            return Err(JobError::Mismatch(format!(
                "{place} holds {} embeddings; rerun with --precision {}, or write to another \
                 --output",
                manifest.dtype.precision_name(),
                manifest.dtype.precision_name()
            )));
        }
        Ok(())
    }

    async fn check_chunk_size(&self, pool: &Pool, size: usize) -> Result<(), JobError> {
        let dimension = probe_dimension(pool).await?;
        planner::check_chunk_size(size, dimension)
            .map_err(|too_large| JobError::ChunkSize(too_large.to_string()))
    }

    async fn prepare_output(
        &self,
        pool: &Pool,
        sample: Vec<Record>,
        manifest: &mut Manifest,
    ) -> Result<(), JobError> {
        let names = kept_names(&self.keep_columns);
        for (i, &name) in names.iter().enumerate() {
            if name == "id" || name == super::parquet_out::VECTOR_COLUMN || name.is_empty() {
                return Err(JobError::Input(format!(
                    "--keep-columns cannot carry `{name}`: the output has its own `id` and \
                     `embedding` (the record's id is always written; see --id-field); keep \
                     the field under another name (FIELD=NAME)"
                )));
            }
            if self.windows.is_some_and(|w| !w.mean) && WINDOW_FIELDS.contains(&name) {
                return Err(JobError::Input(format!(
                    "--keep-columns cannot carry `{name}` with --split: each window's row has \
                     its own `{name}` ({})",
                    WINDOW_FIELDS.join(", ")
                )));
            }
            if names[..i].contains(&name) {
                return Err(JobError::Input(format!(
                    "--keep-columns names `{name}` twice: give each kept field its own name \
                     (FIELD=NAME)"
                )));
            }
        }
        // One short text first when a setting can fail on this model: a prompt name it
        // lacks, a --truncate-dim past its width or windows longer than it takes fail here,
        // in words, before any chunk runs. (Default settings send no extra job: a job's
        // tasks are its chunks.)
        if matches!(self.prompt, Prompt::Named(_))
            || self.truncate_dim.is_some()
            || self.windows.is_some()
        {
            let texts = vec!["settings probe".to_owned()];
            let (_, model_dim) =
                embed_outside_chunks(pool, "settings probe", texts, &self.options()).await?;
            self.shaping()
                .output_dim(model_dim)
                .map_err(JobError::Input)?;
        }
        if self.dtype.needs_ranges() && manifest.quantization_ranges.is_none() {
            let texts: Vec<String> = sample.into_iter().map(|r| r.text).collect();
            if texts.is_empty() {
                return Ok(());
            }
            let (values, model_dim) =
                embed_outside_chunks(pool, "quantisation calibration", texts, &self.options())
                    .await?;
            let shaping = self.shaping();
            let shaped = shaping.shape(&values, model_dim).map_err(JobError::Input)?;
            let dim = shaping.output_dim(model_dim).map_err(JobError::Input)?;
            let ranges = QuantizationRanges::of(&shaped, dim);
            tracing::info!(
                rows = ranges.sample_rows,
                precision = self.dtype.precision_name(),
                "calibrated the quantisation ranges"
            );
            manifest.quantization_ranges = Some(ranges);
        }
        Ok(())
    }

    fn calibration_records(&self, manifest: &Manifest, total_docs: u64) -> usize {
        match self.dtype.needs_ranges() && manifest.quantization_ranges.is_none() {
            true => calibration_sample(total_docs),
            false => 0,
        }
    }

    fn request(&self, records: Vec<Record>) -> Bytes {
        embed_request_with(
            records.into_iter().map(|r| r.text).collect(),
            &self.options(),
        )
    }

    fn split(&self, payload: &[u8]) -> Result<Vec<Bytes>, String> {
        let request = pb::EmbedRequest::decode(payload).map_err(|e| e.to_string())?;
        let options = embed_request_options(&request);
        Ok(request
            .texts
            .into_iter()
            .map(|text| embed_request_with(vec![text], &options))
            .collect())
    }

    fn read(&self, output: TaskOutput) -> Result<Piece<EmbeddedChunk>, SdkError> {
        let chunk = EmbeddedChunk::from_output(output)?;
        Ok(Piece {
            rows: chunk.stats.texts as usize,
            actor_id: chunk.actor_id.clone(),
            node_id: chunk.node_id.clone(),
            micros: chunk.stats.total_micros,
            model_fingerprint: chunk.stats.model_fingerprint.clone(),
            data: chunk,
        })
    }

    fn row_windows(&self, pieces: &[Piece<EmbeddedChunk>]) -> Vec<RowWindow> {
        let mut first_record = 0;
        let mut rows = Vec::new();
        for piece in pieces {
            rows.extend(piece.data.stats.row_windows.iter().map(|window| RowWindow {
                text: window.text + first_record,
                ..*window
            }));
            first_record += piece.rows as u32;
        }
        rows
    }

    fn tally(&self, tally: &mut VectorStats, piece: &Piece<EmbeddedChunk>, _kept: &[Kept]) {
        tally.add(&piece.data);
    }

    fn merge_tally(into: &mut VectorStats, chunk: VectorStats) {
        into.merge(chunk);
    }

    fn lasting_counts(&self, chunk: &VectorStats) -> Option<serde_json::Value> {
        Some(serde_json::to_value(chunk).expect("vector tallies are JSON"))
    }

    /// This run's tokens; the norms, cuts and windows of every chunk of the output, reused
    /// ones too (this run's alone when an earlier run's manifest kept none).
    fn figures(&self, tally: VectorStats, manifest: &Manifest, _wall: Duration) -> EmbedFigures {
        let stored = manifest.chunks.iter().map(|chunk| chunk.counts.as_ref());
        let tally = match VectorStats::of_chunks(stored) {
            Some(whole) => VectorStats {
                tokens: tally.tokens,
                ..whole
            },
            None => {
                tracing::warn!(
                    "chunks from an earlier run kept no vector tallies: the report's norms, \
                     truncated records and windows count this run's chunks only"
                );
                tally
            }
        };
        tally.figures(manifest, self.windows.map(|w| w.describe()))
    }

    fn shard_data(
        &self,
        index: u64,
        pieces: &[Piece<EmbeddedChunk>],
        rows: &ShardRows<'_>,
        manifest: &mut Manifest,
    ) -> Result<(String, Vec<u8>), JobError> {
        let failed = |error: String| JobError::ChunkFailed { index, error };
        let shaping = self.shaping();
        let (values, dim) = match pieces.first() {
            Some(piece) => {
                let model_dim = piece.data.dim;
                let mut values = Vec::new();
                for piece in pieces {
                    values.extend(
                        shaping
                            .shape(&piece.data.values, model_dim)
                            .map_err(failed)?,
                    );
                }
                (values, shaping.output_dim(model_dim).map_err(failed)?)
            }
            None => (Vec::new(), manifest.dim.unwrap_or(0)),
        };
        let ranges = manifest.quantization_ranges.as_ref();
        let bytes = match self.format {
            VectorFormat::Npy => {
                encode_vectors(&values, rows.len() as u64, dim, manifest.dtype, ranges)
            }
            VectorFormat::Parquet => {
                encode_rows(&values, dim, manifest.dtype, ranges).and_then(|stored| {
                    parquet_out::encode_shard(
                        rows,
                        &kept_names(&self.keep_columns),
                        &stored,
                        manifest.dtype,
                        dim,
                    )
                })
            }
        }
        .map_err(failed)?;
        if !pieces.is_empty() {
            manifest.dim = Some(dim);
        }
        let model_rows = pieces.iter().flat_map(|piece| piece.data.rows());
        warn_of_non_finite(index, &non_finite_rows(model_rows), rows);
        let extension = self.format.extension();
        Ok((format!("shards/chunk-{index:06}.{extension}"), bytes))
    }

    /// Each kept field under its name (`--keep-columns FIELD=NAME`), in the columns' order.
    fn kept_as_written(&self, carried: Vec<Kept>) -> Vec<Kept> {
        if self.keep_columns.iter().all(|c| c.field == c.name) {
            return carried;
        }
        let renamed = |kept: Kept| -> Kept {
            (self.keep_columns.iter())
                .filter_map(|c| Some((c.name.clone(), kept.get(&c.field)?.clone())))
                .collect()
        };
        carried.into_iter().map(renamed).collect()
    }

    /// Parquet: the id, vector and carried columns with no rows.
    fn no_rows_data(&self, manifest: &Manifest) -> Result<Vec<u8>, JobError> {
        let (dtype, dim) = (manifest.dtype, manifest.dim.unwrap_or(0));
        let keep = kept_names(&self.keep_columns);
        parquet_out::encode_shard(&ShardRows::ids(&[]), &keep, &[], dtype, dim)
            .map_err(JobError::Output)
    }

    fn merged_bytes(manifest: &Manifest) -> u64 {
        let rows: u64 = manifest.chunks.iter().map(|c| c.rows).sum();
        let width = manifest.dtype.stored_width(manifest.dim.unwrap_or(0));
        rows * width as u64 * manifest.dtype.bytes() as u64
    }
}

/// The rows (in order) whose vectors hold a NaN or an infinity: those the report counts as
/// `non_finite_vectors`.
fn non_finite_rows<'a>(rows: impl IntoIterator<Item = &'a [f32]>) -> Vec<usize> {
    (rows.into_iter().enumerate())
        .filter(|(_, row)| row.iter().any(|v| !v.is_finite()))
        .map(|(at, _)| at)
        .collect()
}

/// Says which rows of chunk `index` hold a NaN or an infinity, by id (the first five of
/// `bad`): the report only counts them.
fn warn_of_non_finite(index: u64, bad: &[usize], rows: &ShardRows<'_>) {
    if bad.is_empty() {
        return;
    }
    let ids: Vec<String> = bad
        .iter()
        .take(5)
        .map(|&row| rows.row_id(row).to_string())
        .collect();
    tracing::warn!(
        chunk = index,
        vectors = bad.len(),
        ids = %ids.join(", "),
        "vectors hold a NaN or an infinity, written as they came (a GPU's half precision \
         overflowed, or the weights hold one): embed those records on the CPU, in f32 \
         (--gpus-per-actor 0), or check the weights"
    );
}

/// The model's vector width, from one short embedding (for a `--chunk-size` given by hand,
/// which skips the calibration round that would tell it).
async fn probe_dimension(pool: &Pool) -> Result<usize, JobError> {
    let texts = vec!["dimension probe".to_owned()];
    Ok(
        embed_outside_chunks(pool, "dimension probe", texts, &EmbedOptions::default())
            .await?
            .1,
    )
}

/// Embeds `texts` outside the job's chunks (probes, calibration) as a job of its own named
/// `job_name` (so `resident jobs` tells it from the embed job), in tasks of 32 so every
/// actor of the pool takes part; returns the vectors in order and their width. A task the
/// actor refuses (a prompt name the model lacks) is the input's error, in the actor's words.
async fn embed_outside_chunks(
    pool: &Pool,
    job_name: &str,
    texts: Vec<String>,
    options: &EmbedOptions,
) -> Result<(Vec<f32>, usize), JobError> {
    let payloads: Vec<Bytes> = texts
        .chunks(32)
        .map(|chunk| embed_request_with(chunk.to_vec(), options))
        .collect();
    let expected = payloads.len();
    let mut results = pool
        .submit(job_name, futures::stream::iter(payloads))
        .await?;
    let mut chunks = Vec::with_capacity(expected);
    while let Some(output) = results.next().await {
        match EmbeddedChunk::from_output(output?) {
            Ok(chunk) => chunks.push(chunk),
            Err(SdkError::TaskFailed(why)) => return Err(JobError::Input(why)),
            Err(other) => return Err(other.into()),
        }
    }
    if chunks.len() != expected {
        return Err(JobError::Model(format!(
            "{} answers for {expected} probe and calibration tasks",
            chunks.len()
        )));
    }
    chunks.sort_by_key(|c| c.seq);
    let dim = chunks.first().map_or(0, |c| c.dim);
    Ok((chunks.into_iter().flat_map(|c| c.values).collect(), dim))
}

/// An embed job's `report.json`.
pub type EmbedReport = JobReport<EmbedFigures>;

/// An embed job's own figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmbedFigures {
    /// The stored vectors' dimensions (after `--truncate-dim`).
    pub dimension: usize,
    /// How vectors are stored (`--precision`).
    pub dtype: OutputDtype,
    /// The vectors' L2 norms (of those without a NaN or an infinity).
    pub norm: NormSummary,
    /// Records cut to the model's max sequence length.
    pub truncated: u64,
    /// Vectors holding a NaN or an infinity (the model overflowed its dtype, or its
    /// weights hold one): written as they came, left out of `norm`.
    #[serde(default)]
    pub non_finite_vectors: u64,
    /// Tokens embedded by this run (the other figures cover every record of the output).
    pub tokens: u64,
    /// The prompt the actors put before every text (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// How texts were cut into windows (absent: they were not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<WindowFigures>,
}

/// What `--split` did to the output's texts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WindowFigures {
    /// `tokens:SIZE:OVERLAP` or `sentences:SIZE` (0: as many tokens as the model takes),
    /// and ` pooled by mean` under `--pool-windows mean`.
    pub split: String,
    /// Windows embedded.
    pub windows: u64,
    /// Documents cut into more than one window.
    pub documents_split: u64,
}

/// The least, largest and mean L2 norm of the output's vectors.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NormSummary {
    /// The least.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// The mean.
    pub mean: f64,
}

/// Tallies of the vectors written: a chunk's, kept in its manifest entry (all but `tokens`,
/// the run's work), and the report's, summed over every chunk of the output.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VectorStats {
    count: u64,
    norm_min: f64,
    norm_max: f64,
    norm_sum: f64,
    truncated: u64,
    #[serde(skip)]
    tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prompt: Option<String>,
    #[serde(default, skip_serializing_if = "is_default")]
    windows: u64,
    #[serde(default, skip_serializing_if = "is_default")]
    texts_split: u64,
    /// Vectors holding a NaN or an infinity (left out of the norms).
    #[serde(default, skip_serializing_if = "is_default")]
    non_finite: u64,
}

impl VectorStats {
    pub fn add(&mut self, chunk: &EmbeddedChunk) {
        for row in chunk.rows() {
            let norm = row
                .iter()
                .map(|v| f64::from(*v) * f64::from(*v))
                .sum::<f64>()
                .sqrt();
            if !norm.is_finite() {
                self.non_finite += 1;
                continue;
            }
            if self.count == 0 {
                (self.norm_min, self.norm_max) = (norm, norm);
            }
            self.norm_min = self.norm_min.min(norm);
            self.norm_max = self.norm_max.max(norm);
            self.norm_sum += norm;
            self.count += 1;
        }
        self.truncated += chunk.stats.truncated_rows.len() as u64;
        self.tokens += chunk.stats.tokens;
        self.windows += u64::from(chunk.stats.windows);
        self.texts_split += u64::from(chunk.stats.texts_split);
        if self.prompt.is_none() && !chunk.stats.prompt.is_empty() {
            self.prompt = Some(chunk.stats.prompt.clone());
        }
    }
}

impl VectorStats {
    /// The tallies of every chunk of the output, from the counts the manifest keeps beside
    /// each; `None` when one has none (a manifest from before they were kept) or cannot be
    /// read.
    fn of_chunks<'a>(
        stored: impl IntoIterator<Item = Option<&'a serde_json::Value>>,
    ) -> Option<Self> {
        let mut total = VectorStats::default();
        for counts in stored {
            total.merge(serde_json::from_value(counts?.clone()).ok()?);
        }
        Some(total)
    }

    /// Adds another chunk's tallies.
    fn merge(&mut self, other: VectorStats) {
        if other.count > 0 {
            if self.count == 0 {
                (self.norm_min, self.norm_max) = (other.norm_min, other.norm_max);
            }
            self.norm_min = self.norm_min.min(other.norm_min);
            self.norm_max = self.norm_max.max(other.norm_max);
        }
        self.count += other.count;
        self.norm_sum += other.norm_sum;
        self.truncated += other.truncated;
        self.tokens += other.tokens;
        self.windows += other.windows;
        self.texts_split += other.texts_split;
        self.non_finite += other.non_finite;
        self.prompt = self.prompt.take().or(other.prompt);
    }

    /// The report's figures of an embed job (`windows`: how its texts were cut, if they
    /// were).
    pub(super) fn figures(self, manifest: &Manifest, windows: Option<String>) -> EmbedFigures {
        EmbedFigures {
            windows: windows.map(|split| WindowFigures {
                split,
                windows: self.windows,
                documents_split: self.texts_split,
            }),
            dimension: manifest.dim.unwrap_or(0),
            dtype: manifest.dtype,
            norm: NormSummary {
                min: self.norm_min,
                max: self.norm_max,
                mean: if self.count == 0 {
                    0.0
                } else {
                    self.norm_sum / self.count as f64
                },
            },
            truncated: self.truncated,
            non_finite_vectors: self.non_finite,
            tokens: self.tokens,
            prompt: self.prompt,
        }
    }
}

#[cfg(test)]
mod tests {
    use resident_sdk::{ActorId, EmbedStats, NodeId};

    use super::*;
    use crate::corpus_job::manifest::ShardEntry;

    fn chunk(rows: &[[f32; 2]], truncated: &[u32], tokens: u64, prompt: &str) -> EmbeddedChunk {
        EmbeddedChunk {
            seq: 0,
            dim: 2,
            values: rows.iter().flatten().copied().collect(),
            stats: EmbedStats {
                tokens,
                truncated_rows: truncated.to_vec(),
                prompt: prompt.into(),
                ..EmbedStats::default()
            },
            actor_id: ActorId::new("a".to_owned()),
            node_id: NodeId::new("n".to_owned()),
        }
    }

    fn tallied(chunk: &EmbeddedChunk) -> VectorStats {
        let mut stats = VectorStats::default();
        stats.add(chunk);
        stats
    }

    fn manifest(chunks: Vec<ShardEntry>) -> Manifest {
        Manifest {
            version: 1,
            input_fingerprint: "in".into(),
            model_fingerprint: "model".into(),
            chunk_size: 2,
            chunk_schedule: None,
            dtype: OutputDtype::F32,
            dim: Some(2),
            quantization_ranges: None,
            model_content: None,
            chunks,
            journal_generation: 0,
        }
    }

    #[test]
    fn the_report_sums_every_chunk_s_kept_tallies_and_this_run_s_tokens() {
        let work = EmbedWork::default();
        let first = tallied(&chunk(&[[3.0, 4.0], [0.0, 1.0]], &[1], 40, "query: "));
        let second = tallied(&chunk(&[[0.0, 2.0]], &[], 9, "query: "));
        let entries: Vec<ShardEntry> = [&first, &second]
            .iter()
            .enumerate()
            .map(|(index, stats)| ShardEntry {
                counts: work.lasting_counts(stats),
                ..ShardEntry::for_test(index as u64)
            })
            .collect();
        assert!(
            entries
                .iter()
                .all(|e| e.counts.as_ref().unwrap().get("tokens").is_none())
        );
        // This run redid the second chunk alone: the norms and cuts are both chunks', the
        // tokens the second's.
        let figures = work.figures(second.clone(), &manifest(entries.clone()), Duration::ZERO);
        assert_eq!(
            (figures.norm.min, figures.norm.max, figures.norm.mean),
            (1.0, 5.0, 8.0 / 3.0)
        );
        assert_eq!((figures.truncated, figures.tokens), (1, 9));
        assert_eq!(figures.prompt.as_deref(), Some("query: "));
        assert_eq!(figures.non_finite_vectors, 0);
        // A chunk from before tallies were kept: the report counts this run's alone.
        let mut old = entries;
        old[0].counts = None;
        let figures = work.figures(second, &manifest(old), Duration::ZERO);
        assert_eq!((figures.norm.min, figures.truncated), (2.0, 0));
    }

    #[test]
    fn vectors_with_a_nan_or_an_infinity_are_counted_apart_from_the_norms_and_named_by_id() {
        let work = EmbedWork::default();
        let stats = tallied(&chunk(
            &[[3.0, 4.0], [f32::NAN, 1.0], [f32::INFINITY, 0.0]],
            &[],
            6,
            "",
        ));
        let entry = ShardEntry {
            counts: work.lasting_counts(&stats),
            ..ShardEntry::for_test(0)
        };
        // Kept in the manifest as JSON (which has no NaN) and read back whole.
        let figures = work.figures(stats, &manifest(vec![entry]), Duration::ZERO);
        assert_eq!(figures.non_finite_vectors, 2);
        assert_eq!(
            (figures.norm.min, figures.norm.max, figures.norm.mean),
            (5.0, 5.0, 5.0)
        );
        // The rows the warning names: the same two, by their windows' ids.
        let rows = [[3.0, 4.0], [f32::NAN, 1.0], [f32::INFINITY, 0.0]];
        let bad = non_finite_rows(rows.iter().map(|row| &row[..]));
        assert_eq!(bad, [1, 2]);
        let ids = [serde_json::json!("a"), serde_json::json!(7)];
        let windows: Vec<RowWindow> = [(0, 0), (1, 0), (1, 1)]
            .into_iter()
            .map(|(text, window)| RowWindow {
                text,
                window,
                ..RowWindow::default()
            })
            .collect();
        let shard = ShardRows {
            ids: &ids,
            kept: &[],
            windows: &windows,
        };
        let named: Vec<_> = bad.iter().map(|&row| shard.row_id(row)).collect();
        assert_eq!(named, ["7#0", "7#1"]);
    }
}
