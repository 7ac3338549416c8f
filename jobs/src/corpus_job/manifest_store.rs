//! The manifest as the job keeps it: `manifest.json` (the header and the chunks compacted
//! into it, with the generation of the journal that continues it) plus that journal of
//! chunks finished since. Local outputs append one synced line per chunk to
//! `journal/<generation>.jsonl`; S3 outputs, which cannot append, put one small object per
//! chunk under `journal/<generation>/`. Either way a chunk costs one small write, not a
//! rewrite of the manifest.
//!
//! Compaction writes a new `manifest.json` (all chunks, generation + 1) atomically, then
//! removes the old generation's journal. A crash before the rename leaves the old manifest
//! and its journal; after it, the new manifest, whose generation tells the old journal to be
//! ignored and removed. Either way every recorded chunk is found exactly once.

use futures::StreamExt;

use super::JobError;
use super::journal::{CompactionPolicy, PauseAt, PausePoint, decode_journal, encode_entry};
use super::manifest::{Manifest, ShardEntry};
use super::output::OutputDir;
use crate::storage::{Location, S3Error, key_under};

const JOURNAL_DIR: &str = "journal";

/// Manifests with a journal are version 2 (version 1 had every chunk in `manifest.json`).
pub const MANIFEST_VERSION: u32 = 2;

fn local_journal(generation: u64) -> String {
    format!("{JOURNAL_DIR}/{generation:06}.jsonl")
}

fn s3_journal_prefix(generation: u64) -> String {
    format!("{JOURNAL_DIR}/{generation:06}/")
}

/// What the manifest writes cost this run (for the report and the job-overhead benchmark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestWrites {
    /// Entries appended to the journal.
    pub journal_appends: u64,
    /// Times the journal was folded into `manifest.json`.
    pub compactions: u64,
    /// Journal lines plus compacted manifests, in bytes.
    pub bytes: u64,
}

/// The manifest of a running job and where it is kept: each finished chunk is appended to
/// the journal, which is folded into `manifest.json` when the policy says.
pub struct ManifestStore<'a> {
    out: &'a OutputDir,
    manifest: Manifest,
    /// Entries in the `manifest.json` on disk; the rest are in the journal.
    compacted: usize,
    /// Chunk indexes journaled in this generation (S3 removes their objects on compaction).
    journaled: Vec<u64>,
    local_journal: Option<std::fs::File>,
    policy: CompactionPolicy,
    writes: ManifestWrites,
    pause: Option<PauseAt>,
}

/// Reads `manifest.json` and the journal that continues it: the chunks of both, a chunk
/// journaled twice (redone after a lost result) counted once, a torn last line dropped.
pub async fn load_manifest(out: &OutputDir) -> Result<Option<Manifest>, JobError> {
    let Some(mut manifest) = out.read_manifest().await? else {
        return Ok(None);
    };
    let generation = manifest.journal_generation;
    let journaled = read_journal(out, generation).await?;
    if !journaled.is_empty() {
        let mut by_index: std::collections::BTreeMap<u64, ShardEntry> = manifest
            .chunks
            .drain(..)
            .map(|entry| (entry.index, entry))
            .collect();
        for entry in journaled {
            by_index.insert(entry.index, entry);
        }
        manifest.chunks = by_index.into_values().collect();
    }
    Ok(Some(manifest))
}

async fn read_journal(out: &OutputDir, generation: u64) -> Result<Vec<ShardEntry>, JobError> {
    match out.location() {
        Location::Local(_) => {
            let name = local_journal(generation);
            let Some(bytes) = out.read(&name).await? else {
                return Ok(Vec::new());
            };
            let decoded = decode_journal(&bytes, &out.location().join(&name).to_string())
                .map_err(|damaged| JobError::Output(damaged.to_string()))?;
            if decoded.torn_tail {
                tracing::warn!(
                    journal = %name,
                    kept = decoded.entries.len(),
                    "the journal's last line was cut short by a crash; its chunk will be redone"
                );
            }
            Ok(decoded.entries)
        }
        Location::S3 { bucket, prefix } => {
            let listed = out
                .client()
                .list(bucket, &key_under(prefix, &s3_journal_prefix(generation)))
                .await
                .map_err(|e| JobError::Output(e.to_string()))?;
            let objects: Vec<Result<Option<Vec<u8>>, S3Error>> = futures::stream::iter(listed)
                .map(|object| async move { out.client().get(bucket, &object.key).await })
                .buffered(32)
                .collect()
                .await;
            let mut entries = Vec::new();
            for bytes in objects {
                // Objects appear whole: a damaged one is refused like a damaged line.
                let Some(bytes) = bytes.map_err(|e| JobError::Output(e.to_string()))? else {
                    continue;
                };
                let decoded = decode_journal(
                    &bytes,
                    &format!(
                        "a journal object under {}",
                        out.location().join(JOURNAL_DIR)
                    ),
                )
                .map_err(|damaged| JobError::Output(damaged.to_string()))?;
                entries.extend(decoded.entries);
            }
            Ok(entries)
        }
    }
}

impl<'a> ManifestStore<'a> {
    /// Takes over `manifest` (loaded, checked, its missing shards dropped): compacts it into
    /// a new generation, so this run appends to a fresh journal and no older one is left.
    pub async fn start(
        out: &'a OutputDir,
        manifest: Manifest,
        policy: CompactionPolicy,
    ) -> Result<Self, JobError> {
        let mut store = Self {
            out,
            manifest,
            compacted: 0,
            journaled: Vec::new(),
            local_journal: None,
            policy,
            writes: ManifestWrites::default(),
            pause: PauseAt::from_env(),
        };
        store.compact(false).await?;
        store
            .remove_journals_before(store.manifest.journal_generation)
            .await?;
        Ok(store)
    }

    /// The manifest as it stands.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest, to change before the next write.
    pub fn manifest_mut(&mut self) -> &mut Manifest {
        &mut self.manifest
    }

    /// What the writes cost so far.
    pub fn writes(&self) -> ManifestWrites {
        self.writes
    }

    /// Records a finished chunk durably, then compacts if the journal has grown enough.
    pub async fn record(&mut self, entry: ShardEntry) -> Result<(), JobError> {
        let line = encode_entry(&entry);
        self.append(entry.index, &line).await?;
        self.writes.journal_appends += 1;
        self.writes.bytes += line.len() as u64;
        self.journaled.push(entry.index);
        self.manifest.chunks.push(entry);
        if self.policy.due(self.journaled.len(), self.compacted) {
            self.compact(false).await?;
        }
        Ok(())
    }

    /// Writes `manifest.json` now (a changed header, such as the chunk plan), as a
    /// compaction.
    pub async fn save(&mut self) -> Result<(), JobError> {
        self.compact(false).await
    }

    /// The last compaction: every chunk in `manifest.json`, in chunk order, pretty-printed
    /// for people, and no journal left.
    pub async fn finish(mut self) -> Result<(Manifest, ManifestWrites), JobError> {
        self.compact(true).await?;
        Ok((self.manifest, self.writes))
    }

    async fn append(&mut self, index: u64, line: &[u8]) -> Result<(), JobError> {
        let occurrence = self.writes.journal_appends + 1;
        let generation = self.manifest.journal_generation;
        match self.out.location() {
            Location::Local(root) => {
                let path = root.join(local_journal(generation));
                let failed =
                    |e: std::io::Error| JobError::Output(format!("{}: {e}", path.display()));
                if self.local_journal.is_none() {
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .map_err(failed)?;
                    crate::files::sync_parent_dir(&path).map_err(failed)?;
                    self.local_journal = Some(file);
                }
                use std::io::Write;
                if self.pause.is_some() {
                    let file = self.local_journal.as_mut().expect("opened above");
                    let half = line.len() / 2;
                    file.write_all(&line[..half]).map_err(failed)?;
                    file.sync_data().map_err(failed)?;
                    PauseAt::check(&self.pause, PausePoint::JournalAppend, occurrence);
                    file.write_all(&line[half..]).map_err(failed)?;
                    return file.sync_data().map_err(failed);
                }
                // The write and its fsync run on tokio's blocking pool, not on a runtime
                // thread that the job's dispatch and result streams share.
                let mut file = self.local_journal.take().expect("opened above");
                let line = line.to_vec();
                let (file, written) = tokio::task::spawn_blocking(move || {
                    let written = file.write_all(&line).and_then(|()| file.sync_data());
                    (file, written)
                })
                .await
                .map_err(|e| {
                    JobError::Output(format!(
                        "{}: the journal write panicked: {e}",
                        path.display()
                    ))
                })?;
                self.local_journal = Some(file);
                written.map_err(failed)
            }
            Location::S3 { .. } => {
                PauseAt::check(&self.pause, PausePoint::JournalAppend, occurrence);
                let name = format!("{}chunk-{index:08}.json", s3_journal_prefix(generation));
                self.out.write(&name, line.to_vec()).await
            }
        }
    }

    async fn compact(&mut self, last: bool) -> Result<(), JobError> {
        self.manifest.chunks.sort_by_key(|c| c.index);
        self.manifest.chunks.dedup_by_key(|c| c.index);
        let old_generation = self.manifest.journal_generation;
        self.manifest.journal_generation = old_generation + 1;
        self.manifest.version = MANIFEST_VERSION;
        let encoded = match last {
            true => serde_json::to_vec_pretty(&self.manifest),
            false => serde_json::to_vec(&self.manifest),
        };
        let bytes = encoded.map_err(|e| JobError::Output(e.to_string()))?;
        self.writes.bytes += bytes.len() as u64;
        self.writes.compactions += 1;
        self.out.write("manifest.json", bytes).await?;
        PauseAt::check(&self.pause, PausePoint::Compaction, self.writes.compactions);
        self.remove_journal(old_generation).await?;
        self.compacted = self.manifest.chunks.len();
        self.local_journal = None;
        Ok(())
    }

    /// Removes a generation's journal, now folded into `manifest.json`.
    async fn remove_journal(&mut self, generation: u64) -> Result<(), JobError> {
        let journaled = std::mem::take(&mut self.journaled);
        match self.out.location() {
            Location::Local(root) => {
                let path = root.join(local_journal(generation));
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(JobError::Output(format!("{}: {e}", path.display())))
                    }
                    _ => Ok(()),
                }
            }
            Location::S3 { bucket, prefix } => {
                let keys = journaled.into_iter().map(|index| {
                    key_under(
                        prefix,
                        &format!("{}chunk-{index:08}.json", s3_journal_prefix(generation)),
                    )
                });
                self.delete_s3_keys(bucket, keys.collect()).await
            }
        }
    }

    /// Removes journals an earlier run left (folded into the manifest, or from an
    /// interrupted compaction).
    async fn remove_journals_before(&mut self, generation: u64) -> Result<(), JobError> {
        match self.out.location() {
            Location::Local(root) => {
                let dir = root.join(JOURNAL_DIR);
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    return Ok(());
                };
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let stale = name
                        .strip_suffix(".jsonl")
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|g| g < generation);
                    if stale {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
                Ok(())
            }
            Location::S3 { bucket, prefix } => {
                let listed = self
                    .out
                    .client()
                    .list(bucket, &key_under(prefix, &format!("{JOURNAL_DIR}/")))
                    .await
                    .map_err(|e| JobError::Output(e.to_string()))?;
                let under = key_under(prefix, &format!("{JOURNAL_DIR}/"));
                let stale = listed
                    .into_iter()
                    .filter(|object| {
                        object.key[under.len().min(object.key.len())..]
                            .split('/')
                            .next()
                            .and_then(|g| g.parse::<u64>().ok())
                            .is_some_and(|g| g < generation)
                    })
                    .map(|object| object.key)
                    .collect();
                self.delete_s3_keys(bucket, stale).await
            }
        }
    }

    async fn delete_s3_keys(&self, bucket: &str, keys: Vec<String>) -> Result<(), JobError> {
        let client = self.out.client();
        let deleted: Vec<Result<(), S3Error>> = futures::stream::iter(keys)
            .map(|key| async move { client.delete(bucket, &key).await })
            .buffer_unordered(32)
            .collect()
            .await;
        deleted
            .into_iter()
            .collect::<Result<(), _>>()
            .map_err(|e| JobError::Output(e.to_string()))
    }
}

/// The chunks a local output records as finished, in chunk order: `manifest.json` and its
/// journal, as a resume would read them. For tests and tools that watch a running job.
pub fn finished_chunks_blocking(root: &std::path::Path) -> Result<Vec<ShardEntry>, String> {
    let manifest_path = root.join("manifest.json");
    let manifest: Manifest = match std::fs::read(&manifest_path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: {e}", manifest_path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", manifest_path.display())),
    };
    let journal_path = root.join(local_journal(manifest.journal_generation));
    let journaled = match std::fs::read(&journal_path) {
        Ok(bytes) => {
            decode_journal(&bytes, &journal_path.display().to_string())
                .map_err(|damaged| damaged.to_string())?
                .entries
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", journal_path.display())),
    };
    let mut by_index: std::collections::BTreeMap<u64, ShardEntry> =
        manifest.chunks.into_iter().map(|e| (e.index, e)).collect();
    by_index.extend(journaled.into_iter().map(|e| (e.index, e)));
    Ok(by_index.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus_job::output::OutputDtype;

    fn header() -> Manifest {
        Manifest {
            version: 1,
            input_fingerprint: "in".into(),
            model_fingerprint: "model".into(),
            chunk_size: 10,
            chunk_schedule: None,
            dtype: OutputDtype::F32,
            dim: Some(4),
            quantization_ranges: None,
            model_content: None,
            chunks: Vec::new(),
            journal_generation: 0,
        }
    }

    fn entry(index: u64) -> ShardEntry {
        ShardEntry::for_test(index)
    }

    fn indexes(manifest: &Manifest) -> Vec<u64> {
        manifest.chunks.iter().map(|c| c.index).collect()
    }

    #[tokio::test]
    async fn chunks_survive_in_the_journal_and_compactions_fold_it_in() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutputDir::prepare(&dir.path().into(), None).await.unwrap();
        let policy = CompactionPolicy {
            min_entries: 4,
            fraction: 0.25,
        };
        let mut store = ManifestStore::start(&out, header(), policy).await.unwrap();
        for index in [3, 0, 1, 2, 5, 4] {
            store.record(entry(index)).await.unwrap();
        }
        // Start, then one compaction after 4 chunks; 2 chunks in the journal.
        assert_eq!(store.writes().compactions, 2);
        assert_eq!(store.writes().journal_appends, 6);
        let on_disk: Manifest =
            serde_json::from_slice(&std::fs::read(dir.path().join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(indexes(&on_disk), vec![0, 1, 2, 3]);
        assert_eq!(on_disk.journal_generation, 2);
        let loaded = load_manifest(&out).await.unwrap().unwrap();
        assert_eq!(indexes(&loaded), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(
            finished_chunks_blocking(dir.path()).unwrap().len(),
            6,
            "the blocking reader agrees"
        );

        let (finished, writes) = store.finish().await.unwrap();
        assert_eq!(indexes(&finished), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(writes.compactions, 3);
        assert!(
            std::fs::read_dir(dir.path().join("journal"))
                .unwrap()
                .next()
                .is_none()
        );
        let loaded = load_manifest(&out).await.unwrap().unwrap();
        assert_eq!(loaded, finished);
    }

    #[tokio::test]
    async fn a_torn_tail_and_an_old_generation_are_read_as_a_crash_leaves_them() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutputDir::prepare(&dir.path().into(), None).await.unwrap();
        let mut manifest = header();
        manifest.journal_generation = 3;
        manifest.chunks = vec![entry(0)];
        out.write("manifest.json", serde_json::to_vec(&manifest).unwrap())
            .await
            .unwrap();
        // Generation 2 was folded in but not yet removed; generation 3 ends in half a line.
        let stale = [encode_entry(&entry(0)), encode_entry(&entry(9))].concat();
        std::fs::write(dir.path().join(local_journal(2)), stale).unwrap();
        let mut current = [encode_entry(&entry(1)), encode_entry(&entry(0))].concat();
        current.extend_from_slice(&encode_entry(&entry(2))[..30]);
        std::fs::write(dir.path().join(local_journal(3)), current).unwrap();

        let loaded = load_manifest(&out).await.unwrap().unwrap();
        assert_eq!(
            indexes(&loaded),
            vec![0, 1],
            "chunk 0 once, 9 stale, 2 torn"
        );
        let store = ManifestStore::start(&out, loaded, CompactionPolicy::default())
            .await
            .unwrap();
        assert_eq!(store.manifest().journal_generation, 4);
        assert!(
            std::fs::read_dir(dir.path().join("journal"))
                .unwrap()
                .next()
                .is_none(),
            "old journals removed"
        );
        assert_eq!(
            indexes(&load_manifest(&out).await.unwrap().unwrap()),
            vec![0, 1]
        );
    }
}
