//! Built without the `s3` feature: every S3 location is refused with a message that says how
//! to get S3 support. The API matches the real client so callers need no `cfg`.

use std::io::Read;
use std::path::Path;

use super::{ObjectInfo, S3Error, S3Options};

/// Refuses every call.
#[derive(Clone, Debug)]
pub struct S3Client;

impl S3Client {
    /// A client that refuses every call.
    pub async fn connect(_options: &S3Options) -> Self {
        S3Client
    }

    /// Refused: this build has no S3.
    pub async fn list(&self, _bucket: &str, _prefix: &str) -> Result<Vec<ObjectInfo>, S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn get(&self, _bucket: &str, _key: &str) -> Result<Option<Vec<u8>>, S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn size(&self, _bucket: &str, _key: &str) -> Result<Option<u64>, S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn put(&self, _bucket: &str, _key: &str, _bytes: Vec<u8>) -> Result<(), S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn put_if_absent(
        &self,
        _bucket: &str,
        _key: &str,
        _bytes: Vec<u8>,
    ) -> Result<bool, S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn delete(&self, _bucket: &str, _key: &str) -> Result<(), S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn upload_file(
        &self,
        _bucket: &str,
        _key: &str,
        _path: &Path,
    ) -> Result<(), S3Error> {
        Err(S3Error::Disabled)
    }

    /// A writer that refuses every write.
    pub fn object_writer(&self, _bucket: &str, _key: &str) -> ObjectWriter {
        ObjectWriter
    }

    /// Refused: this build has no S3.
    pub fn open_blocking(
        &self,
        _bucket: &str,
        _key: &str,
    ) -> Result<Box<dyn Read + Send>, S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub fn download_blocking(
        &self,
        _bucket: &str,
        _key: &str,
        _file: &mut std::fs::File,
    ) -> Result<(), S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn check_writable(&self, _bucket: &str, _key: &str) -> Result<(), S3Error> {
        Err(S3Error::Disabled)
    }
}

/// Refuses every write.
pub struct ObjectWriter;

impl ObjectWriter {
    /// Refused: this build has no S3.
    pub async fn write(&mut self, _bytes: &[u8]) -> Result<(), S3Error> {
        Err(S3Error::Disabled)
    }

    /// Refused: this build has no S3.
    pub async fn finish(self) -> Result<u64, S3Error> {
        Err(S3Error::Disabled)
    }

    /// Nothing to abort.
    pub async fn abort(self) {}
}
