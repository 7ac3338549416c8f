//! Actor lifecycle state.

pub mod actor;

pub use actor::{ActorEvent, ActorState, InvalidTransition, Restarts, transition};
