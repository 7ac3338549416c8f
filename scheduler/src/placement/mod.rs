//! Pure actor placement: `place(&Problem, &Previous) -> Plan`.
//!
//! No tokio, tonic, clock or randomness: the same input always gives the same plan.
//! See `README.md` beside this file for the algorithm.

mod refusal;
mod solve;
mod types;

pub use refusal::Refusal;
pub use solve::{Holding, place, place_pending, share_per_gpu};
pub use types::{
    ActorDemand, Assignment, ComputeCapability, GpuCapacity, NodeCapacity, PlacementStrategy,
    Previous, Problem, ResourceRequest,
};

#[cfg(test)]
use solve::check_plan;
#[cfg(test)]
mod tests;
