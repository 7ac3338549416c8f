//! Everything in Resident that runs a model: text encoders (BERT family through candle, a CPU
//! forward on plain slices for BERT in f32, Qwen3), tokenisation and token-budget batching,
//! the sweep trial trainers, and CUDA device discovery.
//!
//! This is the only crate of the workspace with `unsafe` code (memory-mapped weights, the
//! GEMM calls of the CPU forward, the CUDA driver check); each block states its safety
//! argument. The node agent wraps these types into actor kinds; nothing here knows about
//! actors, sessions or the scheduler.

#![warn(missing_docs)]

mod bounds;
#[cfg(feature = "cuda")]
mod cuda_memory;
pub mod cuda_probe;
pub mod device;
pub mod embed;
#[cfg(all(test, feature = "cuda"))]
mod emu_counts;
mod error;
pub mod generate;
pub mod memory;
pub mod roots;
pub mod trials;

pub use error::ModelError;
