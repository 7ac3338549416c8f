//! The output directory: per-chunk shards written atomically, the manifest of finished
//! chunks, and the merged `embeddings.npy` + `ids.jsonl`.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use futures::StreamExt;

use crate::files::{OutputLock, sha256_hex, write_atomically};
use serde::{Deserialize, Serialize};

use super::error::JobError;
use super::manifest::{Manifest, ShardEntry};
use super::npy::{npy_header, npy_header_len};
use super::shard_rows::{ShardRows, WINDOW_FIELDS};
pub use super::vectors::OutputDtype;
use super::vectors::QuantizationRanges;
use crate::storage::lease::S3OutputLease;
use crate::storage::{Location, S3Client, key_under};

fn io(path: &Path, error: std::io::Error) -> JobError {
    JobError::Output(format!("{}: {error}", path.display()))
}

/// What the merge writes from the shards, in chunk order.
#[derive(Clone, Copy, Debug)]
pub struct MergeLayout {
    /// `index.json`'s `format`: `resident-embeddings`, `resident-generations`.
    pub format: &'static str,
    /// The shards' data files concatenated: `embeddings.npy`, `generations.jsonl`.
    pub data: &'static str,
    /// Whether each shard's data file starts with an npy header (the merged file gets one
    /// header for all rows instead).
    pub npy: bool,
    /// Whether each shard's data file is a Parquet file (the merge rewrites their rows
    /// into one file).
    pub parquet: bool,
    /// The shards' id files concatenated, when the data does not carry the ids.
    pub ids: Option<&'static str>,
    /// Whether the data is generations (`index.json`'s `merged.generations`) rather than
    /// vectors (`merged.vectors`).
    pub generations: bool,
}

impl MergeLayout {
    /// The merged files, for clearing an earlier run's when this run does not merge.
    pub fn files(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.data).chain(self.ids)
    }
}

/// The job's output: a local directory or an S3 prefix.
pub struct OutputDir {
    location: Location,
    s3: Option<S3Client>,
    /// Held while the job runs: a `flock` (local outputs) or a renewed lease (S3).
    _lock: Option<OutputLock>,
    lease: Option<S3OutputLease>,
}

impl OutputDir {
    /// Creates the directory (and `shards/`), or checks the bucket, and proves it writable
    /// before any chunk runs.
    pub async fn prepare(location: &Location, s3: Option<&S3Client>) -> Result<Self, JobError> {
        let mut lock = None;
        let mut lease = None;
        match location {
            Location::Local(root) => {
                for dir in ["shards", "journal"] {
                    let dir = root.join(dir);
                    std::fs::create_dir_all(&dir).map_err(|e| {
                        JobError::Output(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
                let probe = root.join(".write-test");
                std::fs::write(&probe, b"ok").map_err(|e| {
                    JobError::Output(format!("{} is not writable: {e}", root.display()))
                })?;
                let _ = std::fs::remove_file(probe);
                lock = Some(
                    OutputLock::acquire(root)
                        .map_err(|refused| JobError::Output(refused.to_string()))?,
                );
            }
            Location::S3 { bucket, prefix } => {
                let client = s3.ok_or_else(|| JobError::Output("no S3 client".into()))?;
                client
                    .check_writable(bucket, &key_under(prefix, ".write-test"))
                    .await
                    .map_err(|e| JobError::Output(format!("{location} is not writable: {e}")))?;
                lease = Some(
                    S3OutputLease::acquire(client, bucket, prefix)
                        .await
                        .map_err(|refused| JobError::Output(refused.to_string()))?,
                );
            }
        }
        Ok(Self {
            location: location.clone(),
            s3: s3.cloned(),
            _lock: lock,
            lease,
        })
    }

    /// Gives up the output's lock now (it would also go when dropped; an S3 lease is
    /// deleted here rather than by a task that may never run).
    pub async fn release(mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release().await;
        }
    }

    pub(super) fn location(&self) -> &Location {
        &self.location
    }

    pub(super) fn client(&self) -> &S3Client {
        self.s3
            .as_ref()
            .expect("S3 outputs are prepared with a client")
    }

    /// The file `name` below the output, or `None` when it is not there.
    pub(super) async fn read(&self, name: &str) -> Result<Option<Vec<u8>>, JobError> {
        match &self.location {
            Location::Local(root) => {
                let path = root.join(name);
                match std::fs::read(&path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io(&path, e)),
                }
            }
            Location::S3 { bucket, prefix } => self
                .client()
                .get(bucket, &key_under(prefix, name))
                .await
                .map_err(|e| JobError::Output(e.to_string())),
        }
    }

    /// A file the manifest records: its absence is an error.
    async fn read_recorded(&self, name: &str) -> Result<Vec<u8>, JobError> {
        self.read(name)
            .await?
            .ok_or_else(|| JobError::Output(format!("{} disappeared", self.location.join(name))))
    }

    /// Writes `name` so that readers see it whole or not at all.
    pub async fn write(&self, name: &str, bytes: Vec<u8>) -> Result<(), JobError> {
        match &self.location {
            Location::Local(root) => write_atomically(&root.join(name), &bytes)
                .map_err(|e| JobError::Output(e.to_string())),
            Location::S3 { bucket, prefix } => self
                .client()
                .put(bucket, &key_under(prefix, name), bytes)
                .await
                .map_err(|e| JobError::Output(e.to_string())),
        }
    }

    /// Removes `name` below the output, if it is there.
    pub async fn remove(&self, name: &str) -> Result<(), JobError> {
        match &self.location {
            Location::Local(root) => match std::fs::remove_file(root.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&root.join(name), e)),
                _ => Ok(()),
            },
            Location::S3 { bucket, prefix } => self
                .client()
                .delete(bucket, &key_under(prefix, name))
                .await
                .map_err(|e| JobError::Output(e.to_string())),
        }
    }

    /// The output's `manifest.json`, or `None` for a fresh output.
    pub async fn read_manifest(&self) -> Result<Option<Manifest>, JobError> {
        let Some(bytes) = self.read("manifest.json").await? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            JobError::Output(format!(
                "{} is corrupt: {e}",
                self.location.join("manifest.json")
            ))
        })
    }

    /// Whether a recorded shard is still there, unchanged: its sha256 for local files; its
    /// size for S3 objects, which only ever appear whole (reading every shard back would
    /// cost as much as the job's output).
    pub async fn shard_intact(&self, entry: &ShardEntry) -> Result<bool, JobError> {
        let files = [
            (
                &entry.vectors_file,
                &entry.vectors_sha256,
                entry.vectors_bytes,
            ),
            (&entry.ids_file, &entry.ids_sha256, entry.ids_bytes),
        ];
        for (file, sha, bytes) in files {
            let intact = match &self.location {
                Location::S3 { bucket, prefix } if bytes > 0 => {
                    let size = self.client().size(bucket, &key_under(prefix, file)).await;
                    size.map_err(|e| JobError::Output(e.to_string()))? == Some(bytes)
                }
                _ => self
                    .read(file)
                    .await?
                    .is_some_and(|b| sha256_hex(&b) == *sha),
            };
            if !intact {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Writes one chunk's data file (`data_file`: its vectors or generations) and its ids
    /// (with the carried fields), each atomically, and describes them.
    pub async fn write_shard(
        &self,
        index: u64,
        data_file: String,
        data: Vec<u8>,
        rows: &ShardRows<'_>,
    ) -> Result<ShardEntry, JobError> {
        let ids_file = format!("shards/chunk-{index:06}.ids.jsonl");
        let mut id_lines = Vec::new();
        for row in 0..rows.len() {
            let mut line = serde_json::Map::new();
            line.insert("id".into(), rows.row_id(row));
            if let Some(window) = rows.windows.get(row) {
                let [doc_id, number, start, end] = WINDOW_FIELDS;
                line.insert(doc_id.into(), rows.ids[rows.record_of(row)].clone());
                line.insert(number.into(), window.window.into());
                line.insert(start.into(), window.char_start.into());
                line.insert(end.into(), window.char_end.into());
            }
            if let Some(kept) = rows.kept_of(row) {
                line.extend(kept.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            serde_json::to_writer(&mut id_lines, &line)
                .map_err(|e| JobError::Output(e.to_string()))?;
            id_lines.push(b'\n');
        }
        let entry = ShardEntry {
            index,
            rows: rows.len() as u64,
            records: rows.windowed().then_some(rows.ids.len() as u64),
            vectors_sha256: sha256_hex(&data),
            vectors_bytes: data.len() as u64,
            ids_sha256: sha256_hex(&id_lines),
            ids_bytes: id_lines.len() as u64,
            vectors_file: data_file,
            ids_file,
            crashed: Vec::new(),
            counts: None,
        };
        self.write(&entry.vectors_file, data).await?;
        self.write(&entry.ids_file, id_lines).await?;
        Ok(entry)
    }

    /// Concatenates every shard, in chunk order, into the layout's merged files
    /// (`embeddings.npy` and `ids.jsonl`, or `generations.jsonl`), streamed: a local output
    /// writes `.partial` files and renames them; an S3 output uploads each file in parts as
    /// it goes, so nothing is staged and at most one part per file plus a few shards are
    /// held, however large the output. A Parquet merge of no rows writes `no_rows`.
    pub async fn merge(
        &self,
        manifest: &Manifest,
        layout: &MergeLayout,
        no_rows: Vec<u8>,
    ) -> Result<(), JobError> {
        let rows: u64 = manifest.chunks.iter().map(|c| c.rows).sum();
        let mut chunks: Vec<&ShardEntry> = manifest.chunks.iter().collect();
        chunks.sort_by_key(|c| c.index);
        let mut data = self.merged_writer(layout.data)?;
        let mut ids = match layout.ids {
            Some(name) => Some(self.merged_writer(name)?),
            None => None,
        };
        let copied = async {
            if layout.npy {
                let header = npy_header(manifest.dtype, rows, manifest.dim.unwrap_or(0));
                data.write(&header).await?;
            }
            let with_ids = ids.is_some();
            let mut parquet = layout.parquet.then(super::parquet_out::ParquetMerger::new);
            let mut shards = futures::stream::iter(chunks)
                .map(|chunk| async move {
                    let shard_data = self.read_recorded(&chunk.vectors_file).await?;
                    let id_lines = match with_ids {
                        true => self.read_recorded(&chunk.ids_file).await?,
                        false => Vec::new(),
                    };
                    Ok::<_, JobError>((shard_data, id_lines))
                })
                .buffered(4);
            while let Some(shard) = shards.next().await {
                let (shard_data, id_lines) = shard?;
                if let Some(merger) = &mut parquet {
                    let bytes = merger.add(shard_data).map_err(JobError::Output)?;
                    data.write(&bytes).await?;
                    continue;
                }
                let skip = if layout.npy {
                    npy_header_len(&shard_data)
                } else {
                    0
                };
                data.write(&shard_data[skip..]).await?;
                if let Some(ids) = &mut ids {
                    ids.write(&id_lines).await?;
                }
            }
            if let Some(merger) = parquet {
                let footer = merger.finish(no_rows).map_err(JobError::Output)?;
                data.write(&footer).await?;
            }
            Ok::<_, JobError>(())
        }
        .await;
        if let Err(error) = copied {
            data.abort().await;
            if let Some(ids) = ids {
                ids.abort().await;
            }
            return Err(error);
        }
        data.finish().await?;
        match ids {
            Some(ids) => ids.finish().await,
            None => Ok(()),
        }
    }

    fn merged_writer(&self, name: &str) -> Result<MergedWriter, JobError> {
        Ok(match &self.location {
            Location::Local(root) => {
                let partial = root.join(format!("{name}.partial"));
                let file = File::create(&partial).map_err(|e| io(&partial, e))?;
                MergedWriter::Local {
                    writer: std::io::BufWriter::with_capacity(1 << 20, file),
                    partial,
                    path: root.join(name),
                }
            }
            Location::S3 { bucket, prefix } => MergedWriter::S3(
                self.client()
                    .object_writer(bucket, &key_under(prefix, name)),
            ),
        })
    }

    /// Writes `index.json`: every shard with its first row, and the merged files if any,
    /// so readers of a sharded output need not list the directory.
    pub async fn write_index(
        &self,
        manifest: &Manifest,
        merged: bool,
        layout: &MergeLayout,
    ) -> Result<(), JobError> {
        let index = OutputIndex::of(manifest, layout, merged);
        let bytes = serde_json::to_vec(&index).map_err(|e| JobError::Output(e.to_string()))?;
        self.write(OutputIndex::FILE, bytes).await
    }
}

/// Whether to write the merged files: asked for (`--no-merge` not given) and no larger than
/// `max_bytes` (the merged data alone, `merged_bytes`; past it, the shards plus
/// `index.json` are the output, since a file of hundreds of GB serves no reader better
/// than its shards).
pub fn merge_wanted(asked: bool, merged_bytes: u64, max_bytes: u64) -> bool {
    asked && merged_bytes <= max_bytes
}

/// `index.json`: how to read the output, merged or not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputIndex {
    /// The index's format name.
    pub format: String,
    /// Its version.
    pub version: u32,
    /// Rows of the whole output.
    pub rows: u64,
    /// Width of each vector (0 for generations).
    pub dim: usize,
    /// How vectors are stored.
    pub dtype: OutputDtype,
    /// How int8/uint8 values map back to floats, and how to quantise queries to match:
    /// sentence-transformers' `ranges` (`[min, max]` per dimension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization_ranges: Option<QuantizationRanges>,
    /// The merged files when they were written; `None` for a sharded output.
    pub merged: Option<MergedFiles>,
    /// In chunk order; row `first_row + i` of the whole output is row `i` of the shard.
    pub shards: Vec<IndexShard>,
}

/// The merged files: `vectors` and `ids` (embed), or `generations` (generate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergedFiles {
    /// The merged vectors (`.npy`), or the merged Parquet file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vectors: Option<String>,
    /// The merged ids (`.jsonl`), when written apart from the data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<String>,
    /// The merged generations (`.jsonl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generations: Option<String>,
}

/// One shard of the output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexShard {
    /// Its chunk's index.
    pub index: u64,
    /// Its first row in the whole output.
    pub first_row: u64,
    /// Its rows.
    pub rows: u64,
    /// The shard's data: its vectors (`.npy`), or its generations (`.jsonl`).
    pub vectors_file: String,
    /// Its ids (`.jsonl`).
    pub ids_file: String,
}

impl OutputIndex {
    /// The index's file name.
    pub const FILE: &'static str = "index.json";

    /// The index of `manifest`'s shards, and of `layout`'s merged files if `merged`.
    pub fn of(manifest: &Manifest, layout: &MergeLayout, merged: bool) -> Self {
        let mut chunks: Vec<&ShardEntry> = manifest.chunks.iter().collect();
        chunks.sort_by_key(|c| c.index);
        let mut first_row = 0;
        let shards = chunks
            .into_iter()
            .map(|chunk| {
                let shard = IndexShard {
                    index: chunk.index,
                    first_row,
                    rows: chunk.rows,
                    vectors_file: chunk.vectors_file.clone(),
                    ids_file: chunk.ids_file.clone(),
                };
                first_row += chunk.rows;
                shard
            })
            .collect();
        Self {
            format: layout.format.into(),
            version: 1,
            rows: first_row,
            dim: manifest.dim.unwrap_or(0),
            dtype: manifest.dtype,
            quantization_ranges: manifest.quantization_ranges.clone(),
            merged: merged.then(|| match layout.generations {
                false => MergedFiles {
                    vectors: Some(layout.data.into()),
                    ids: layout.ids.map(Into::into),
                    generations: None,
                },
                true => MergedFiles {
                    vectors: None,
                    ids: layout.ids.map(Into::into),
                    generations: Some(layout.data.into()),
                },
            }),
            shards,
        }
    }
}

/// One merged file being written.
enum MergedWriter {
    Local {
        writer: std::io::BufWriter<File>,
        partial: std::path::PathBuf,
        path: std::path::PathBuf,
    },
    S3(crate::storage::ObjectWriter),
}

impl MergedWriter {
    async fn write(&mut self, bytes: &[u8]) -> Result<(), JobError> {
        match self {
            MergedWriter::Local {
                writer, partial, ..
            } => writer.write_all(bytes).map_err(|e| io(partial, e)),
            MergedWriter::S3(writer) => writer
                .write(bytes)
                .await
                .map_err(|e| JobError::Output(e.to_string())),
        }
    }

    async fn finish(self) -> Result<(), JobError> {
        match self {
            MergedWriter::Local {
                writer,
                partial,
                path,
            } => {
                let file = writer
                    .into_inner()
                    .map_err(|e| JobError::Output(format!("{}: {e}", partial.display())))?;
                file.sync_all().map_err(|e| io(&partial, e))?;
                std::fs::rename(&partial, &path).map_err(|e| io(&path, e))?;
                crate::files::sync_parent_dir(&path).map_err(|e| io(&path, e))
            }
            MergedWriter::S3(writer) => writer
                .finish()
                .await
                .map(|_| ())
                .map_err(|e| JobError::Output(e.to_string())),
        }
    }

    async fn abort(self) {
        match self {
            MergedWriter::Local { partial, .. } => {
                let _ = std::fs::remove_file(partial);
            }
            MergedWriter::S3(writer) => writer.abort().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus_job::EmbedWork;
    use crate::corpus_job::npy::encode_vectors;
    use crate::corpus_job::work::ChunkWork;

    #[test]
    fn an_output_refuses_chunks_of_a_second_model() {
        let mut manifest = Manifest {
            version: 1,
            input_fingerprint: "in".into(),
            model_fingerprint: "name".into(),
            chunk_size: 10,
            chunk_schedule: None,
            dtype: OutputDtype::F32,
            dim: Some(2),
            quantization_ranges: None,
            model_content: None,
            journal_generation: 0,
            chunks: Vec::new(),
        };
        manifest.check_model_content("aaaa", 0, "actor a").unwrap();
        manifest.check_model_content("aaaa", 1, "actor a").unwrap();
        manifest.check_model_content("", 2, "an old agent").unwrap();
        let refused = manifest
            .check_model_content("bbbb", 3, "actor b on node n2")
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("chunk 3") && refused.contains("actor b on node n2"),
            "{refused}"
        );
        assert_eq!(manifest.model_content.as_deref(), Some("aaaa"));
    }

    #[tokio::test]
    async fn shards_merge_in_chunk_order() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutputDir::prepare(&dir.path().into(), None).await.unwrap();
        let second = out
            .write_shard(
                1,
                "shards/chunk-000001.npy".into(),
                encode_vectors(&[3.0, 4.0], 1, 2, OutputDtype::F32, None).unwrap(),
                &ShardRows::ids(&[serde_json::json!("b")]),
            )
            .await
            .unwrap();
        let first = out
            .write_shard(
                0,
                "shards/chunk-000000.npy".into(),
                encode_vectors(&[1.0, 2.0], 1, 2, OutputDtype::F32, None).unwrap(),
                &ShardRows::ids(&[serde_json::json!("a")]),
            )
            .await
            .unwrap();
        assert!(out.shard_intact(&first).await.unwrap());
        let manifest = Manifest {
            version: 1,
            input_fingerprint: "i".into(),
            model_fingerprint: "m".into(),
            chunk_size: 1,
            chunk_schedule: None,
            dtype: OutputDtype::F32,
            dim: Some(2),
            quantization_ranges: None,
            model_content: None,
            journal_generation: 0,
            chunks: vec![second, first],
        };
        out.merge(&manifest, &EmbedWork::LAYOUT, Vec::new())
            .await
            .unwrap();
        let merged = std::fs::read(dir.path().join("embeddings.npy")).unwrap();
        let data: Vec<f32> = merged[npy_header_len(&merged)..]
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(data, vec![1.0, 2.0, 3.0, 4.0]);
        let ids = std::fs::read_to_string(dir.path().join("ids.jsonl")).unwrap();
        assert_eq!(ids, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    }

    #[tokio::test]
    async fn generation_shards_merge_into_one_jsonl_and_the_index_says_so() {
        use crate::corpus_job::GenerateWork;
        let dir = tempfile::tempdir().unwrap();
        let out = OutputDir::prepare(&dir.path().into(), None).await.unwrap();
        let mut chunks = Vec::new();
        for (index, line) in [(1u64, "{\"id\":\"b\"}\n"), (0, "{\"id\":\"a\"}\n")] {
            let file = format!("shards/chunk-{index:06}.jsonl");
            let id = serde_json::json!(if index == 0 { "a" } else { "b" });
            let entry = out
                .write_shard(
                    index,
                    file,
                    line.as_bytes().to_vec(),
                    &ShardRows::ids(&[id]),
                )
                .await
                .unwrap();
            chunks.push(entry);
        }
        let manifest = Manifest {
            version: 1,
            input_fingerprint: "i".into(),
            model_fingerprint: "m".into(),
            chunk_size: 1,
            chunk_schedule: None,
            dtype: OutputDtype::F32,
            dim: None,
            quantization_ranges: None,
            model_content: None,
            journal_generation: 0,
            chunks,
        };
        let layout = GenerateWork::LAYOUT;
        out.merge(&manifest, &layout, Vec::new()).await.unwrap();
        let merged = std::fs::read_to_string(dir.path().join("generations.jsonl")).unwrap();
        assert_eq!(merged, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
        assert!(!dir.path().join("ids.jsonl").exists());
        let index = OutputIndex::of(&manifest, &layout, true);
        assert_eq!(index.format, "resident-generations");
        let merged = index.merged.unwrap();
        assert_eq!(merged.generations.as_deref(), Some("generations.jsonl"));
        assert_eq!(merged.vectors, None);
        assert_eq!(index.shards[0].vectors_file, "shards/chunk-000000.jsonl");
    }
}
