//! The files of a corpus: a local file or directory, or the objects under an S3 prefix,
//! listed once in a stable order and opened as streams.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::JobError;
use super::parquet_columns::Columns;
use super::parquet_rows::ParquetRows;
use crate::storage::{Location, S3Client};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    Jsonl,
    Text,
    Parquet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

const KINDS: &str = ".jsonl, .ndjson, .json or .txt (optionally .gz or .zst) or .parquet";

fn format_of(name: &str) -> Option<(Format, Compression)> {
    let name = name.rsplit('/').next()?.to_ascii_lowercase();
    let (stem, compression) = if let Some(stem) = name.strip_suffix(".gz") {
        (stem.to_owned(), Compression::Gzip)
    } else if let Some(stem) = name.strip_suffix(".zst") {
        (stem.to_owned(), Compression::Zstd)
    } else {
        (name, Compression::None)
    };
    if stem.ends_with(".parquet") && compression == Compression::None {
        Some((Format::Parquet, compression))
    } else if stem.ends_with(".jsonl") || stem.ends_with(".ndjson") || stem.ends_with(".json") {
        Some((Format::Jsonl, compression))
    } else if stem.ends_with(".txt") || stem.ends_with(".text") {
        Some((Format::Text, compression))
    } else {
        None
    }
}

#[derive(Clone, Debug)]
enum InputSource {
    Local(PathBuf),
    S3 {
        bucket: String,
        key: String,
        size: u64,
        etag: String,
    },
}

/// One input file.
#[derive(Clone, Debug)]
pub struct InputFile {
    /// Relative to the input location; used in bad-record lists and generated ids.
    pub name: String,
    source: InputSource,
}

impl InputFile {
    pub(super) fn format(&self) -> Format {
        format_of(&self.name).map_or(Format::Jsonl, |f| f.0)
    }
}

/// An open input file.
pub(super) enum Source {
    Lines(Box<dyn BufRead + Send>),
    Parquet(ParquetRows),
}

/// The files of an input location.
#[derive(Clone, Debug)]
pub struct InputSet {
    /// The files, in the order they are read.
    pub files: Vec<InputFile>,
    s3: Option<S3Client>,
}

impl InputSet {
    /// Lists `location`; S3 locations need `s3`.
    pub async fn list(location: &Location, s3: Option<&S3Client>) -> Result<Self, JobError> {
        match location {
            Location::Local(path) => Self::local(path),
            Location::S3 { bucket, prefix } => {
                let client = s3.ok_or_else(|| JobError::Input("no S3 client".into()))?;
                let objects = client
                    .list(bucket, prefix)
                    .await
                    .map_err(|e| JobError::Input(e.to_string()))?;
                let single = objects.iter().any(|o| o.key == *prefix);
                let files: Vec<InputFile> = objects
                    .into_iter()
                    .filter_map(|object| {
                        let name = if single {
                            (object.key == *prefix)
                                .then(|| object.key.rsplit('/').next().unwrap_or_default())?
                        } else if prefix.is_empty() {
                            object.key.as_str()
                        } else {
                            object
                                .key
                                .strip_prefix(prefix.as_str())?
                                .strip_prefix('/')?
                        };
                        format_of(name)?;
                        Some(InputFile {
                            name: name.to_owned(),
                            source: InputSource::S3 {
                                bucket: bucket.clone(),
                                key: object.key.clone(),
                                size: object.size,
                                etag: object.etag,
                            },
                        })
                    })
                    .collect();
                if files.is_empty() {
                    return Err(JobError::Input(format!(
                        "no {KINDS} objects under {location}"
                    )));
                }
                Ok(Self {
                    files,
                    s3: Some(client.clone()),
                })
            }
        }
    }

    /// A local file, or every corpus file below a local directory.
    pub fn local(path: &Path) -> Result<Self, JobError> {
        let named = |file: PathBuf, root: &Path| InputFile {
            name: file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string(),
            source: InputSource::Local(file),
        };
        if path.is_file() {
            if format_of(&path.to_string_lossy()).is_none() {
                return Err(JobError::Input(format!(
                    "{} is not a {KINDS} file",
                    path.display()
                )));
            }
            let root = path.parent().unwrap_or(Path::new(""));
            return Ok(Self {
                files: vec![named(path.to_owned(), root)],
                s3: None,
            });
        }
        if !path.is_dir() {
            return Err(JobError::Input(format!(
                "input {} does not exist",
                path.display()
            )));
        }
        let mut files = Vec::new();
        let mut stack = vec![path.to_owned()];
        while let Some(dir) = stack.pop() {
            let cannot_list =
                |e: std::io::Error| JobError::Input(format!("cannot list {}: {e}", dir.display()));
            for entry in std::fs::read_dir(&dir).map_err(cannot_list)? {
                let entry_path = entry.map_err(cannot_list)?.path();
                if entry_path.is_dir() {
                    stack.push(entry_path);
                } else if format_of(&entry_path.to_string_lossy()).is_some() {
                    files.push(entry_path);
                }
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(JobError::Input(format!(
                "no {KINDS} files under {}",
                path.display()
            )));
        }
        Ok(Self {
            files: files.into_iter().map(|f| named(f, path)).collect(),
            s3: None,
        })
    }

    /// Opens file `index` as a stream (blocking: call it from a reader thread).
    pub(super) fn open(&self, index: usize, columns: &Columns<'_>) -> Result<Source, JobError> {
        let file = &self.files[index];
        let (format, compression) =
            format_of(&file.name).unwrap_or((Format::Jsonl, Compression::None));
        let fail = |e: &dyn std::fmt::Display| {
            JobError::Input(format!("cannot read {}: {e}", self.describe(index)))
        };
        if format == Format::Parquet {
            let local = match &file.source {
                InputSource::Local(path) => File::open(path).map_err(|e| fail(&e))?,
                InputSource::S3 { bucket, key, .. } => {
                    // Parquet needs random access: spool the object to an unnamed temp file.
                    let mut spool = tempfile::tempfile().map_err(|e| fail(&e))?;
                    self.s3_client()?
                        .download_blocking(bucket, key, &mut spool)
                        .map_err(|e| JobError::Input(e.to_string()))?;
                    spool.seek(SeekFrom::Start(0)).map_err(|e| fail(&e))?;
                    spool
                }
            };
            let name = self.describe(index);
            return Ok(Source::Parquet(ParquetRows::open(local, &name, columns)?));
        }
        let raw: Box<dyn Read + Send> = match &file.source {
            InputSource::Local(path) => Box::new(File::open(path).map_err(|e| fail(&e))?),
            InputSource::S3 { bucket, key, .. } => self
                .s3_client()?
                .open_blocking(bucket, key)
                .map_err(|e| JobError::Input(e.to_string()))?,
        };
        let reader: Box<dyn Read + Send> = match compression {
            Compression::None => raw,
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(raw)),
            Compression::Zstd => {
                Box::new(zstd::stream::read::Decoder::new(raw).map_err(|e| fail(&e))?)
            }
        };
        Ok(Source::Lines(Box::new(BufReader::with_capacity(
            1 << 20,
            reader,
        ))))
    }

    fn s3_client(&self) -> Result<&S3Client, JobError> {
        self.s3
            .as_ref()
            .ok_or_else(|| JobError::Input("no S3 client".into()))
    }

    /// The file's full path or URL, for messages.
    pub(super) fn describe(&self, index: usize) -> String {
        match &self.files[index].source {
            InputSource::Local(path) => path.display().to_string(),
            InputSource::S3 { bucket, key, .. } => format!("s3://{bucket}/{key}"),
        }
    }

    /// A fingerprint that changes when the corpus does: every file's name, plus the SHA-256
    /// of every byte of local files, or the size and ETag of S3 objects (blocking). The
    /// whole content, so that an edit in the middle of a file that keeps its size is seen
    /// too; the scan reads every byte next anyway, from the page cache this warms.
    pub(super) fn fingerprint(&self) -> Result<String, JobError> {
        let mut hasher = Sha256::new();
        for (index, file) in self.files.iter().enumerate() {
            hasher.update(file.name.as_bytes());
            match &file.source {
                InputSource::Local(path) => hash_local_file(&mut hasher, path).map_err(|e| {
                    JobError::Input(format!("cannot read {}: {e}", self.describe(index)))
                })?,
                InputSource::S3 { size, etag, .. } => {
                    hasher.update(size.to_le_bytes());
                    hasher.update(etag.as_bytes());
                }
            }
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

fn hash_local_file(hasher: &mut Sha256, path: &Path) -> std::io::Result<()> {
    let mut file = File::open(path)?;
    hasher.update(file.metadata()?.len().to_le_bytes());
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buffer)? {
            0 => return Ok(()),
            read => hasher.update(&buffer[..read]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An edit in the middle of a large file that keeps its size changes the fingerprint
    /// (the old one hashed the size and the first and last MiB only).
    #[test]
    fn a_same_size_edit_in_the_middle_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corpus.jsonl");
        let line = "{\"id\": 1, \"text\": \"a line of text\"}\n";
        let mut text = line.repeat(200_000); // about 7 MB
        std::fs::write(&path, &text).unwrap();
        let before = InputSet::local(&path).unwrap().fingerprint().unwrap();
        assert_eq!(
            before,
            InputSet::local(&path).unwrap().fingerprint().unwrap()
        );
        let middle = text.len() / 2;
        let at = middle + text[middle..].find("line").unwrap();
        text.replace_range(at..at + 4, "LINE");
        std::fs::write(&path, &text).unwrap();
        let after = InputSet::local(&path).unwrap().fingerprint().unwrap();
        assert_ne!(before, after);
    }
}
