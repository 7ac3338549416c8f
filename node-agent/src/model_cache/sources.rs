//! The dispatch from a pool's model spec to where its files come from: a local directory as
//! it is, an S3 manifest through the cache (`mod.rs`), a Hugging Face id through [`super::hub`].
//! Apart from the cache itself, so that the hub code can use the cache without the cache
//! naming it.

use resident_storage::model_source::ModelSource;

use super::{ModelCache, hub};
use crate::error::BackendError;

impl ModelCache {
    /// The local directory to load `spec` from, fetching it first if it is remote. Blocks
    /// (an actor thread calls it while loading); must not run on an async worker thread.
    pub fn local_dir(&self, spec: &str, revision: Option<&str>) -> Result<String, BackendError> {
        match ModelSource::parse(spec, revision)
            .map_err(|refused| BackendError::InvalidConfig(refused.to_string()))?
        {
            ModelSource::Local(path) => Ok(path),
            ModelSource::S3 { bucket, prefix } => {
                let dir = self.fetch_s3(&bucket, &prefix, revision)?;
                Ok(dir.to_string_lossy().into_owned())
            }
            ModelSource::Hub { repo, revision } => {
                let dir = hub::fetch(self, &repo, &revision)?;
                Ok(dir.to_string_lossy().into_owned())
            }
        }
    }
}
