//! Pure actor placement. The running scheduler calls `place_pending` (pending actors around
//! those holding their places, in bounded slices); `place(&Problem, &Previous) -> Plan`, the
//! plain specification it is held to, exists in test builds only.
//!
//! No tokio, tonic, clock or randomness: the same input always gives the same plan.
//! See `README.md` beside this file for the algorithm.

mod fit;
mod refusal;
mod solve;
mod types;

#[cfg(test)]
pub use solve::place;
pub use solve::{Holding, Occupancy, place_pending, place_pending_on, share_per_gpu};
pub use types::{
    ActorDemand, Assignment, ComputeCapability, GpuCapacity, NodeCapacity, PlacementStrategy,
    Refusal, ResourceRequest,
};
#[cfg(test)]
pub use types::{Previous, Problem};

#[cfg(test)]
use solve::check_plan;
#[cfg(test)]
mod tests;
