//! Hyperparameter sweeps whose trials run on resident actors. So far: the declaration
//! (TOML), search (grid, seeded random) and trial schedulers (FIFO, ASHA), all pure.
//! Running trials on actors (`resident sweep`) comes next.

pub mod asha;
pub mod config;
pub mod driver;
pub mod search;

pub use asha::{Decision, TrialSchedulerState};
pub use config::{SweepConfig, SweepConfigError};
pub use search::{Params, generate_trials};
