//! The output directory: per-chunk shards written atomically, the manifest of finished
//! chunks, and the merged `embeddings.npy` + `ids.jsonl`.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::JobError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputDtype {
    F32,
    F16,
}

impl OutputDtype {
    pub fn name(self) -> &'static str {
        match self {
            OutputDtype::F32 => "f32",
            OutputDtype::F16 => "f16",
        }
    }

    fn descr(self) -> &'static str {
        match self {
            OutputDtype::F32 => "<f4",
            OutputDtype::F16 => "<f2",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            OutputDtype::F32 => 4,
            OutputDtype::F16 => 2,
        }
    }
}

/// One finished chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub index: u64,
    pub rows: u64,
    pub vectors_file: String,
    pub vectors_sha256: String,
    pub ids_file: String,
    pub ids_sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub input_fingerprint: String,
    pub model_fingerprint: String,
    pub chunk_size: usize,
    pub dtype: OutputDtype,
    pub dim: Option<usize>,
    pub chunks: Vec<ShardEntry>,
}

fn io(path: &Path, error: std::io::Error) -> JobError {
    JobError::Output(format!("{}: {error}", path.display()))
}

/// Writes `bytes` to `path` through a temporary file and a rename, so readers only ever see
/// a complete file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), JobError> {
    let temp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut file = File::create(&temp).map_err(|e| io(&temp, e))?;
    file.write_all(bytes).map_err(|e| io(&temp, e))?;
    file.sync_all().map_err(|e| io(&temp, e))?;
    std::fs::rename(&temp, path).map_err(|e| io(path, e))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A NumPy `.npy` v1 header for a C-order `[rows, dim]` matrix.
pub fn npy_header(dtype: OutputDtype, rows: u64, dim: usize) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ({rows}, {dim}), }}",
        dtype.descr()
    );
    let unpadded = 10 + dict.len() + 1;
    let padding = (64 - unpadded % 64) % 64;
    let header_len = dict.len() + padding + 1;
    let mut out = Vec::with_capacity(10 + header_len);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', padding));
    out.push(b'\n');
    out
}

/// Length of the header of an `.npy` file we wrote.
fn npy_header_len(bytes: &[u8]) -> usize {
    10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize
}

pub fn encode_vectors(values: &[f32], rows: u64, dim: usize, dtype: OutputDtype) -> Vec<u8> {
    let mut out = npy_header(dtype, rows, dim);
    match dtype {
        OutputDtype::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        OutputDtype::F16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&half_bits(*v).to_le_bytes())),
    }
    out
}

/// IEEE half-precision bits of `value`, rounded to nearest even.
fn half_bits(value: f32) -> u16 {
    half::f16::from_f32(value).to_bits()
}

pub struct OutputDir {
    pub root: PathBuf,
}

impl OutputDir {
    /// Creates the directory (and `shards/`) and checks it is writable before any chunk runs.
    pub fn prepare(root: &Path) -> Result<Self, JobError> {
        let shards = root.join("shards");
        std::fs::create_dir_all(&shards)
            .map_err(|e| JobError::Output(format!("cannot create {}: {e}", shards.display())))?;
        let probe = root.join(".write-test");
        std::fs::write(&probe, b"ok")
            .map_err(|e| JobError::Output(format!("{} is not writable: {e}", root.display())))?;
        let _ = std::fs::remove_file(probe);
        Ok(Self {
            root: root.to_owned(),
        })
    }

    pub fn read_manifest(&self) -> Result<Option<Manifest>, JobError> {
        let path = self.root.join("manifest.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| JobError::Output(format!("{} is corrupt: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, e)),
        }
    }

    pub fn write_manifest(&self, manifest: &Manifest) -> Result<(), JobError> {
        let bytes =
            serde_json::to_vec_pretty(manifest).map_err(|e| JobError::Output(e.to_string()))?;
        write_atomically(&self.root.join("manifest.json"), &bytes)
    }

    /// Whether a recorded shard is still there, unchanged.
    pub fn shard_intact(&self, entry: &ShardEntry) -> bool {
        let check = |file: &str, sha: &str| {
            std::fs::read(self.root.join(file)).is_ok_and(|b| sha256_hex(&b) == sha)
        };
        check(&entry.vectors_file, &entry.vectors_sha256)
            && check(&entry.ids_file, &entry.ids_sha256)
    }

    /// Writes one chunk's vectors and ids, each atomically, and describes them.
    pub fn write_shard(
        &self,
        index: u64,
        vectors: &[u8],
        ids: &[serde_json::Value],
        rows: u64,
    ) -> Result<ShardEntry, JobError> {
        let vectors_file = format!("shards/chunk-{index:06}.npy");
        let ids_file = format!("shards/chunk-{index:06}.ids.jsonl");
        let mut id_lines = Vec::new();
        for id in ids {
            serde_json::to_writer(&mut id_lines, &serde_json::json!({ "id": id }))
                .map_err(|e| JobError::Output(e.to_string()))?;
            id_lines.push(b'\n');
        }
        write_atomically(&self.root.join(&vectors_file), vectors)?;
        write_atomically(&self.root.join(&ids_file), &id_lines)?;
        Ok(ShardEntry {
            index,
            rows,
            vectors_sha256: sha256_hex(vectors),
            ids_sha256: sha256_hex(&id_lines),
            vectors_file,
            ids_file,
        })
    }

    /// Concatenates every shard, in chunk order, into `embeddings.npy` and `ids.jsonl`.
    pub fn merge(&self, manifest: &Manifest) -> Result<(), JobError> {
        let dim = manifest.dim.unwrap_or(0);
        let rows: u64 = manifest.chunks.iter().map(|c| c.rows).sum();
        let mut chunks = manifest.chunks.clone();
        chunks.sort_by_key(|c| c.index);
        let npy_path = self.root.join("embeddings.npy");
        let ids_path = self.root.join("ids.jsonl");
        let npy_temp = npy_path.with_extension("npy.partial");
        let ids_temp = ids_path.with_extension("jsonl.partial");
        let mut npy =
            std::io::BufWriter::new(File::create(&npy_temp).map_err(|e| io(&npy_temp, e))?);
        let mut ids =
            std::io::BufWriter::new(File::create(&ids_temp).map_err(|e| io(&ids_temp, e))?);
        npy.write_all(&npy_header(manifest.dtype, rows, dim))
            .map_err(|e| io(&npy_temp, e))?;
        for chunk in &chunks {
            let shard = std::fs::read(self.root.join(&chunk.vectors_file))
                .map_err(|e| io(&self.root.join(&chunk.vectors_file), e))?;
            npy.write_all(&shard[npy_header_len(&shard)..])
                .map_err(|e| io(&npy_temp, e))?;
            let path = self.root.join(&chunk.ids_file);
            let mut reader = BufReader::new(File::open(&path).map_err(|e| io(&path, e))?);
            let mut buffer = Vec::new();
            reader.read_to_end(&mut buffer).map_err(|e| io(&path, e))?;
            ids.write_all(&buffer).map_err(|e| io(&ids_temp, e))?;
        }
        npy.into_inner()
            .map_err(|e| JobError::Output(e.to_string()))?
            .sync_all()
            .map_err(|e| io(&npy_temp, e))?;
        ids.into_inner()
            .map_err(|e| JobError::Output(e.to_string()))?
            .sync_all()
            .map_err(|e| io(&ids_temp, e))?;
        std::fs::rename(&npy_temp, &npy_path).map_err(|e| io(&npy_path, e))?;
        std::fs::rename(&ids_temp, &ids_path).map_err(|e| io(&ids_path, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_headers_are_aligned_and_parseable() {
        let header = npy_header(OutputDtype::F32, 3, 384);
        assert_eq!(header.len() % 64, 0);
        assert_eq!(npy_header_len(&header), header.len());
        let text = String::from_utf8_lossy(&header[10..]);
        assert!(
            text.contains("'shape': (3, 384)") && text.contains("'<f4'"),
            "{text}"
        );
    }

    #[test]
    fn half_precision_rounds_like_ieee() {
        assert_eq!(half_bits(1.0), 0x3c00);
        assert_eq!(half_bits(-2.0), 0xc000);
        assert_eq!(half_bits(0.0), 0);
        assert_eq!(half_bits(65504.0), 0x7bff);
        assert_eq!(half_bits(1e6), 0x7c00);
        assert_eq!(half_bits(0.333_333_34), 0x3555);
        assert_eq!(half_bits(6.0e-8), 0x0001);
    }

    #[test]
    fn shards_merge_in_chunk_order() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutputDir::prepare(dir.path()).unwrap();
        let second = out
            .write_shard(
                1,
                &encode_vectors(&[3.0, 4.0], 1, 2, OutputDtype::F32),
                &[serde_json::json!("b")],
                1,
            )
            .unwrap();
        let first = out
            .write_shard(
                0,
                &encode_vectors(&[1.0, 2.0], 1, 2, OutputDtype::F32),
                &[serde_json::json!("a")],
                1,
            )
            .unwrap();
        assert!(out.shard_intact(&first));
        let manifest = Manifest {
            version: 1,
            input_fingerprint: "i".into(),
            model_fingerprint: "m".into(),
            chunk_size: 1,
            dtype: OutputDtype::F32,
            dim: Some(2),
            chunks: vec![second, first],
        };
        out.merge(&manifest).unwrap();
        let merged = std::fs::read(dir.path().join("embeddings.npy")).unwrap();
        let data: Vec<f32> = merged[npy_header_len(&merged)..]
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(data, vec![1.0, 2.0, 3.0, 4.0]);
        let ids = std::fs::read_to_string(dir.path().join("ids.jsonl")).unwrap();
        assert_eq!(ids, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    }
}
