//! Hyperparameter sweeps whose trials run on resident actors: the declaration (TOML),
//! search (grid, seeded random), trial schedulers (FIFO, ASHA) and the driver (pure), and
//! the runner that trains trials on a pool of `embed` actors (`resident sweep`).

pub mod asha;
pub mod config;
pub mod data;
pub mod driver;
pub mod results;
pub mod runner;
pub mod search;

pub use asha::{Decision, TrialSchedulerState};
pub use config::{Mode, SweepConfig, SweepConfigError};
pub use results::{SweepSummary, TrialResult, format_table};
pub use runner::{SweepEvent, load_results, run_sweep};
pub use search::{Params, generate_trials};

use resident_sdk::SdkError;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Config(#[from] SweepConfigError),
    #[error("sweep data: {0}")]
    Data(String),
    #[error("sweep output: {0}")]
    Output(String),
    #[error("{0}")]
    Mismatch(String),
    #[error("model did not load: {0}")]
    Model(String),
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("cluster: {0}")]
    Sdk(#[from] SdkError),
}
