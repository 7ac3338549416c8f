//! Streaming one S3 object in parts: what a merge of many shards needs to write a file far
//! larger than the machine's disk or memory.

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};

use std::path::Path;

use tokio::io::AsyncReadExt;

use super::s3::{S3Client, describe};
use super::{S3Action, S3Error};

/// Writes one object from a sequence of byte slices. Bytes are buffered into parts of the
/// client's part size (at least 5 MiB, S3's smallest) and each full part is uploaded as it
/// fills, so at most one part is held. The object appears only at [`ObjectWriter::finish`]
/// (a single PUT when everything fit in one part); on any error the upload is aborted, so
/// no half object and no orphaned parts remain.
pub struct ObjectWriter {
    pub(crate) client: S3Client,
    pub(crate) bucket: String,
    pub(crate) key: String,
    pub(crate) upload_id: Option<String>,
    pub(crate) buffer: Vec<u8>,
    pub(crate) parts: Vec<CompletedPart>,
    pub(crate) written: u64,
}

impl S3Client {
    /// Uploads a local file through an [`ObjectWriter`]: one request when small, a multipart
    /// upload otherwise (the object appears only when the upload completes; a failed one is
    /// aborted).
    pub async fn upload_file(&self, bucket: &str, key: &str, path: &Path) -> Result<(), S3Error> {
        let local = |e: std::io::Error| S3Error::LocalFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let mut file = tokio::fs::File::open(path).await.map_err(local)?;
        let mut writer = self.object_writer(bucket, key);
        let mut buffer = vec![0u8; 8 << 20];
        loop {
            let read = match file.read(&mut buffer).await {
                Ok(read) => read,
                Err(error) => {
                    writer.abort().await;
                    return Err(local(error));
                }
            };
            if read == 0 {
                break;
            }
            writer.write(&buffer[..read]).await?;
        }
        writer.finish().await.map(|_| ())
    }

    /// A writer that streams one object to `key` in parts, holding at most one part.
    pub fn object_writer(&self, bucket: &str, key: &str) -> ObjectWriter {
        ObjectWriter {
            client: self.clone(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            upload_id: None,
            buffer: Vec::new(),
            parts: Vec::new(),
            written: 0,
        }
    }
}

impl ObjectWriter {
    fn failed(&self, error: impl ToString) -> S3Error {
        S3Error::call(S3Action::Upload, &self.bucket, &self.key, error)
    }

    /// Appends `bytes`, uploading every part that fills.
    pub async fn write(&mut self, mut bytes: &[u8]) -> Result<(), S3Error> {
        let part_bytes = self.client.part_bytes;
        self.written += bytes.len() as u64;
        while !bytes.is_empty() {
            let room = part_bytes - self.buffer.len();
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.buffer.extend_from_slice(now);
            bytes = rest;
            if self.buffer.len() == part_bytes {
                let part = std::mem::replace(&mut self.buffer, Vec::with_capacity(part_bytes));
                if let Err(error) = self.upload_part(part).await {
                    self.abort_upload().await;
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// Completes the object; returns its size in bytes.
    pub async fn finish(mut self) -> Result<u64, S3Error> {
        if self.upload_id.is_none() {
            let bytes = std::mem::take(&mut self.buffer);
            self.client.put(&self.bucket, &self.key, bytes).await?;
            return Ok(self.written);
        }
        if !self.buffer.is_empty() {
            let last = std::mem::take(&mut self.buffer);
            if let Err(error) = self.upload_part(last).await {
                self.abort_upload().await;
                return Err(error);
            }
        }
        let upload_id = self.upload_id.clone().unwrap_or_default();
        let completed = self
            .client
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(std::mem::take(&mut self.parts)))
                    .build(),
            )
            .send()
            .await;
        match completed {
            Ok(_) => Ok(self.written),
            Err(error) => {
                let message = self.failed(describe(error));
                self.abort_upload().await;
                Err(message)
            }
        }
    }

    /// Gives up: the parts uploaded so far are discarded.
    pub async fn abort(mut self) {
        self.abort_upload().await;
    }

    async fn upload_part(&mut self, part: Vec<u8>) -> Result<(), S3Error> {
        let upload_id = match &self.upload_id {
            Some(id) => id.clone(),
            None => {
                let created = self
                    .client
                    .client
                    .create_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&self.key)
                    .send()
                    .await
                    .map_err(|e| self.failed(describe(e)))?;
                let id = created.upload_id().unwrap_or_default().to_owned();
                self.upload_id = Some(id.clone());
                id
            }
        };
        let number = self.parts.len() as i32 + 1;
        let uploaded = self
            .client
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(part))
            .send()
            .await
            .map_err(|e| self.failed(describe(e)))?;
        self.parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(uploaded.e_tag().map(str::to_owned))
                .build(),
        );
        Ok(())
    }

    async fn abort_upload(&mut self) {
        if let Some(upload_id) = self.upload_id.take() {
            let _ = self
                .client
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(upload_id)
                .send()
                .await;
        }
    }
}
