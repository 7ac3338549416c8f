//! Corpus jobs: run a corpus through a pool of resident actors end to end, resumably.
//! `resident embed` writes a vector per record, `resident generate` a completion; both run
//! the same pipeline (`pipeline.rs`), and each adds only its own part (`work.rs`:
//! `embed.rs`, `generate.rs`).
//!
//! 1. Check the input, the output directory and the manifest of an earlier run (a changed
//!    input, model or generation settings under the same output is refused); list bad
//!    records.
//! 2. Create the job's pool and wait until every actor has loaded the model.
//! 3. Pick the chunk size (the earlier run's, `--chunk-size`, or planned from measured
//!    records/s), then stream chunks to the pool; each finished chunk becomes a shard,
//!    written atomically and recorded by one synced line in the manifest's journal, which is
//!    folded into `manifest.json` now and then (`manifest_store`). Chunks already recorded
//!    are skipped.
//! 4. Merge the shards (streamed; skipped past `merge_max_bytes`): `embeddings.npy` +
//!    `ids.jsonl`, or `generations.jsonl`. Write `index.json` and `report.json`.

mod answer_match;
mod answer_spec;
pub mod chat_input;
pub mod choice_input;
mod config;
mod duplicates;
mod embed;
mod engine_settings;
mod error;
mod evaluation_counts;
mod fewshot;
mod fewshot_rules;
mod fewshot_sampling;
mod generate;
mod generation_lines;
#[cfg(not(feature = "parquet"))]
#[path = "generation_parquet_off.rs"]
mod generation_parquet;
#[cfg(feature = "parquet")]
mod generation_parquet;
mod generation_report;
mod group_accuracy;
mod inputs;
pub mod journal;
mod kept_columns;
pub mod manifest;
pub mod manifest_store;
mod npy;
mod openai_batch;
mod output;
mod overlap_sums;
mod parquet_columns;
#[cfg(not(feature = "parquet"))]
#[path = "parquet_out_off.rs"]
mod parquet_out;
#[cfg(feature = "parquet")]
mod parquet_out;
#[cfg(not(feature = "parquet"))]
#[path = "parquet_off.rs"]
mod parquet_rows;
#[cfg(feature = "parquet")]
mod parquet_rows;
#[cfg(all(test, feature = "parquet"))]
mod parquet_structure_tests;
mod pipeline;
pub mod planner;
mod poison;
mod porter_stem;
mod probability_sums;
mod progress;
mod prompt;
mod python_random;
pub mod reader;
mod record_limit;
mod report;
mod results;
mod sacrebleu_figures;
pub(crate) mod scan;
pub mod schedule;
mod shard_rows;
mod shares;
mod text_overlap;
mod vectors;
mod work;

use resident_sdk::Cluster;

pub use answer_match::{AnswerMatch, Judgement, RecordAnswers};
pub use answer_spec::{AnswerFlags, AnswerMatchSpec, AnswerRefusal, ExtractMatch, FilterSpec};
pub use chat_input::PromptInput;
pub use choice_input::ChoiceFields;
pub use config::{BadRecordPolicy, CorpusJobConfig, DEFAULT_MERGE_MAX_BYTES};
pub use embed::{EmbedFigures, EmbedReport, NormSummary, WindowFigures};
pub use embed::{EmbedJobConfig, EmbedWork, Normalization, VectorFormat};
pub use engine_settings::EngineSettings;
pub use error::JobError;
pub use evaluation_counts::{
    AnswerCounts, AnswerFigures, AnswerShares, EvaluationCounts, FilterFigures, InOrder,
};
pub use fewshot::{DEFAULT_FEWSHOT_DELIMITER, FewshotGroups, FewshotSampling, FewshotSource};
pub use fewshot_rules::{FewshotAsked, FewshotFlags, FewshotRefusal};
pub use fewshot_sampling::FewshotSampler;
pub use generate::{
    GenerateJobConfig, GenerateWork, GenerationFormat, GenerationOutput, PreviewPrompt,
    preview_prompts,
};
pub use generation_report::{GenerateFigures, GenerationTally};
pub use group_accuracy::{AccuracyByGroup, GroupCounts, GroupFigures};
pub use inputs::InputSet;
pub use kept_columns::KeptColumn;
pub use output::OutputDtype;
pub use overlap_sums::{MeanSums, OverlapMeans, OverlapSums};
pub use progress::Progress;
pub use prompt::PromptTemplate;
pub use reader::{BadRecord, ReaderOptions};
pub use record_limit::RecordLimit;
pub use report::{JobReport, PriceTable};
pub use resident_sdk::{Prompt, WindowSplit, Windows};
pub use sacrebleu_figures::{BleuStats, ChrfStats};
pub use text_overlap::{OverlapMetric, OverlapScores, RougeWords, overlap_scores};
pub use vectors::QuantizationRanges;

/// Runs `resident embed` on `cluster` and returns its report (also written to
/// `report.json`).
pub async fn run_embed_job(
    cluster: &Cluster,
    config: &EmbedJobConfig,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<EmbedReport, JobError> {
    let mut corpus = config.corpus.clone();
    let fields = config
        .embedding
        .keep_columns
        .iter()
        .map(|c| c.field.clone());
    corpus.reader.keep_fields = fields.collect();
    pipeline::run_job(cluster, &corpus, &config.embedding, on_progress).await
}

/// Runs `resident generate` on `cluster` and returns its report (also written to
/// `report.json`).
pub async fn run_generate_job(
    cluster: &Cluster,
    config: &GenerateJobConfig,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<JobReport<GenerateFigures>, JobError> {
    config.check()?;
    pipeline::run_job(cluster, &config.corpus, &config.generation, on_progress).await
}
