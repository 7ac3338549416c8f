//! Built without the `s3` feature: every S3 location is refused with a message that says how
//! to get S3 support. The API matches the real client so callers need no `cfg`.

use std::io::Read;
use std::path::Path;

use super::{ObjectInfo, S3Options};

const DISABLED: &str = "this build has no S3 support: build with the `s3` feature of resident-storage (the resident CLI has it)";

/// Refuses every call.
#[derive(Clone, Debug)]
pub struct S3Client;

impl S3Client {
    /// A client that refuses every call.
    pub async fn connect(_options: &S3Options) -> Self {
        S3Client
    }

    /// Refused: this build has no S3.
    pub async fn list(&self, _bucket: &str, _prefix: &str) -> Result<Vec<ObjectInfo>, String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn get(&self, _bucket: &str, _key: &str) -> Result<Option<Vec<u8>>, String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn size(&self, _bucket: &str, _key: &str) -> Result<Option<u64>, String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn put(&self, _bucket: &str, _key: &str, _bytes: Vec<u8>) -> Result<(), String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn put_if_absent(
        &self,
        _bucket: &str,
        _key: &str,
        _bytes: Vec<u8>,
    ) -> Result<bool, String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn delete(&self, _bucket: &str, _key: &str) -> Result<(), String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn upload_file(&self, _bucket: &str, _key: &str, _path: &Path) -> Result<(), String> {
        Err(DISABLED.into())
    }

    /// A writer that refuses every write.
    pub fn object_writer(&self, _bucket: &str, _key: &str) -> ObjectWriter {
        ObjectWriter
    }

    /// Refused: this build has no S3.
    pub fn open_blocking(&self, _bucket: &str, _key: &str) -> Result<Box<dyn Read + Send>, String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub fn download_blocking(
        &self,
        _bucket: &str,
        _key: &str,
        _file: &mut std::fs::File,
    ) -> Result<(), String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn check_writable(&self, _bucket: &str, _key: &str) -> Result<(), String> {
        Err(DISABLED.into())
    }
}

/// Refuses every write.
pub struct ObjectWriter;

impl ObjectWriter {
    /// Refused: this build has no S3.
    pub async fn write(&mut self, _bytes: &[u8]) -> Result<(), String> {
        Err(DISABLED.into())
    }

    /// Refused: this build has no S3.
    pub async fn finish(self) -> Result<u64, String> {
        Err(DISABLED.into())
    }

    /// Nothing to abort.
    pub async fn abort(self) {}
}
