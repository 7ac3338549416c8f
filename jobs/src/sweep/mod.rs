//! Hyperparameter sweeps whose trials run on resident actors: the declaration (TOML),
//! search (grid, seeded random, TPE), trial schedulers (FIFO, ASHA, PBT) and the driver (pure), and
//! the runner that trains trials on a pool of `embed` actors (`resident sweep`).

pub mod asha;
pub mod best_head;
pub mod config;
pub mod data;
pub mod driver;
mod error;
pub mod pbt;
mod population;
pub mod results;
pub mod runner;
pub mod search;
pub mod tpe;

pub use asha::{Decision, TrialSchedulerState};
pub use config::{Mode, SweepConfig, SweepConfigError};
pub use error::SweepError;
pub use results::{SweepSummary, TrialResult, format_table};
pub use runner::{SweepEvent, load_results, run_sweep};
pub use search::{Params, generate_trials};
