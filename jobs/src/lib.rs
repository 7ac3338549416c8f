//! Resident's batch jobs, as a library over the client SDK:
//!
//! - [`corpus_job`]: run a corpus through a pool end to end, resumably: embed it
//!   (`resident embed`) or generate a text per record (`resident generate`);
//! - [`eval_suite`]: suites of evaluation tasks, each a generate job (`resident eval`),
//!   and [`eval_output`], their `results.json`;
//! - [`sweep`]: hyperparameter sweeps whose trials train on resident `embed` actors
//!   (`resident sweep`);
//! - [`storage`]: where jobs read and write, a local path or `s3://bucket/prefix`.
//!
//! Features: `s3` (aws-sdk-s3) and `parquet` (Parquet corpus files), both on by default. A
//! build without one refuses such inputs with a message that names the feature.

#![warn(missing_docs)]

pub mod corpus_job;
pub mod eval_output;
pub mod eval_suite;
pub mod files;
pub mod model_pin;
pub mod pools;
pub mod records;
mod serde_skip;
pub mod storage;
pub mod sweep;
pub mod usage;
