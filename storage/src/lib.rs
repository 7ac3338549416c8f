//! Where Resident keeps things outside a node: local paths and `s3://bucket/prefix`
//! locations, a thin S3 client (feature `s3`; without it every S3 call is refused with a
//! message saying so), and model manifests. Jobs read and write their corpora and outputs
//! through it, and agents fetch models through it.

#![warn(missing_docs)]

mod error;
mod location;
pub mod model_manifest;
pub mod model_source;
#[cfg(feature = "s3")]
mod s3;
#[cfg(not(feature = "s3"))]
#[path = "s3_off.rs"]
mod s3;
#[cfg(feature = "s3")]
mod s3_writer;

pub use error::{LocationError, ModelSpecError, S3Action, S3Error};
pub use location::{Location, ObjectInfo, S3Options, key_under};
#[cfg(not(feature = "s3"))]
pub use s3::ObjectWriter;
pub use s3::S3Client;
#[cfg(feature = "s3")]
pub use s3_writer::ObjectWriter;
