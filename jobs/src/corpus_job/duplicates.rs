//! Duplicate ids over a corpus of any size, in memory bounded by a run, not by the corpus.
//!
//! During the scan every record's id is hashed (XXH3-128: a collision among 10^9 ids has a
//! chance near 10^-21, where a 64-bit hash would misfire at one in 30 per 10^9). The
//! occurrences are collected into runs of [`RUN_ENTRIES`]; a full run is sorted by (hash,
//! ordinal) and spilled to a temporary file. At the end a k-way merge over the runs finds
//! equal hashes: the first occurrence (lowest ordinal) is kept, every later one is a
//! duplicate. Later passes skip those ordinals. A set of every id seen, the obvious way,
//! costs 16+ bytes per record for the whole job: 1.6 GB at 100M documents.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufReader, BufWriter, Read, Write};

/// Occurrences held in memory before a run is spilled (about 20 MB with short ids).
pub const RUN_ENTRIES: usize = 1 << 18;

/// One record's id, where it was.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Occurrence {
    hash: u128,
    ordinal: u64,
    file: u32,
    line: u64,
    id: String,
}

impl Occurrence {
    fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        out.write_all(&self.hash.to_le_bytes())?;
        out.write_all(&self.ordinal.to_le_bytes())?;
        out.write_all(&self.file.to_le_bytes())?;
        out.write_all(&self.line.to_le_bytes())?;
        out.write_all(&(self.id.len() as u32).to_le_bytes())?;
        out.write_all(self.id.as_bytes())
    }

    fn read(input: &mut impl Read) -> std::io::Result<Option<Self>> {
        let mut hash = [0u8; 16];
        match input.read_exact(&mut hash) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            other => other?,
        }
        let mut word = [0u8; 8];
        let mut half = [0u8; 4];
        input.read_exact(&mut word)?;
        let ordinal = u64::from_le_bytes(word);
        input.read_exact(&mut half)?;
        let file = u32::from_le_bytes(half);
        input.read_exact(&mut word)?;
        let line = u64::from_le_bytes(word);
        input.read_exact(&mut half)?;
        let mut id = vec![0u8; u32::from_le_bytes(half) as usize];
        input.read_exact(&mut id)?;
        Ok(Some(Self {
            hash: u128::from_le_bytes(hash),
            ordinal,
            file,
            line,
            id: String::from_utf8_lossy(&id).into_owned(),
        }))
    }
}

/// A record whose id an earlier record already has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duplicate {
    pub ordinal: u64,
    pub file: u32,
    pub line: u64,
    /// The id as JSON (`1`, `"a"`).
    pub id: String,
    pub first_file: u32,
    pub first_line: u64,
}

/// Collects ids during the scan.
pub struct DuplicateFinder {
    run: Vec<Occurrence>,
    run_entries: usize,
    spilled: Vec<std::fs::File>,
    dir: Option<tempfile::TempDir>,
}

impl Default for DuplicateFinder {
    fn default() -> Self {
        Self::with_run_entries(RUN_ENTRIES)
    }
}

fn spill_error(e: std::io::Error) -> String {
    format!(
        "cannot spill the duplicate-id check to a temporary file: {e} (set TMPDIR to a disk with room)"
    )
}

impl DuplicateFinder {
    pub fn with_run_entries(run_entries: usize) -> Self {
        Self {
            run: Vec::new(),
            run_entries: run_entries.max(1),
            spilled: Vec::new(),
            dir: None,
        }
    }

    /// Records the id (as JSON text) of the record with this ordinal.
    pub fn add(&mut self, id: &str, ordinal: u64, file: u32, line: u64) -> Result<(), String> {
        self.run.push(Occurrence {
            hash: twox_hash::XxHash3_128::oneshot(id.as_bytes()),
            ordinal,
            file,
            line,
            id: id.to_owned(),
        });
        if self.run.len() >= self.run_entries {
            self.spill().map_err(spill_error)?;
        }
        Ok(())
    }

    fn spill(&mut self) -> std::io::Result<()> {
        self.run.sort_unstable();
        if self.dir.is_none() {
            self.dir = Some(tempfile::Builder::new().prefix("resident-ids-").tempdir()?);
        }
        let dir = self.dir.as_ref().expect("created above");
        let path = dir.path().join(format!("run-{}", self.spilled.len()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let mut out = BufWriter::new(file);
        for occurrence in self.run.drain(..) {
            occurrence.write(&mut out)?;
        }
        let mut file = out.into_inner().map_err(|e| e.into_error())?;
        std::io::Seek::rewind(&mut file)?;
        self.spilled.push(file);
        Ok(())
    }

    /// Every duplicate, in ordinal order.
    pub fn finish(mut self) -> Result<Vec<Duplicate>, String> {
        self.run.sort_unstable();
        let mut sources: Vec<Box<dyn Iterator<Item = std::io::Result<Occurrence>>>> =
            vec![Box::new(std::mem::take(&mut self.run).into_iter().map(Ok))];
        for file in self.spilled.drain(..) {
            let mut reader = BufReader::with_capacity(1 << 16, file);
            sources.push(Box::new(std::iter::from_fn(move || {
                Occurrence::read(&mut reader).transpose()
            })));
        }
        let mut heap = BinaryHeap::new();
        for (source, iter) in sources.iter_mut().enumerate() {
            if let Some(next) = iter.next() {
                heap.push(Reverse((next.map_err(spill_error)?, source)));
            }
        }
        let mut duplicates = Vec::new();
        let mut first: Option<Occurrence> = None;
        while let Some(Reverse((occurrence, source))) = heap.pop() {
            if let Some(next) = sources[source].next() {
                heap.push(Reverse((next.map_err(spill_error)?, source)));
            }
            match &first {
                Some(kept) if kept.hash == occurrence.hash => duplicates.push(Duplicate {
                    ordinal: occurrence.ordinal,
                    file: occurrence.file,
                    line: occurrence.line,
                    id: occurrence.id,
                    first_file: kept.file,
                    first_line: kept.line,
                }),
                _ => first = Some(occurrence),
            }
        }
        duplicates.sort_unstable_by_key(|d| d.ordinal);
        Ok(duplicates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(ids: &[&str], run_entries: usize) -> Vec<(u64, String, u64)> {
        let mut finder = DuplicateFinder::with_run_entries(run_entries);
        for (ordinal, id) in ids.iter().enumerate() {
            finder
                .add(id, ordinal as u64, 0, ordinal as u64 + 1)
                .unwrap();
        }
        finder
            .finish()
            .unwrap()
            .into_iter()
            .map(|d| (d.ordinal, d.id, d.first_line))
            .collect()
    }

    #[test]
    fn later_occurrences_are_duplicates_of_the_first_in_memory_or_spilled() {
        let ids = [
            "\"a\"", "1", "\"b\"", "\"a\"", "\"1\"", "1", "\"a\"", "\"c\"",
        ];
        let expected = vec![
            (3, "\"a\"".to_owned(), 1),
            (5, "1".to_owned(), 2),
            (6, "\"a\"".to_owned(), 1),
        ];
        for run_entries in [1, 2, 3, 100] {
            assert_eq!(find(&ids, run_entries), expected, "runs of {run_entries}");
        }
    }

    #[test]
    fn many_unique_ids_across_many_runs_have_no_duplicates() {
        let ids: Vec<String> = (0..5000).map(|i| format!("\"doc-{i}\"")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        assert!(find(&refs, 64).is_empty());
        let mut again = refs.clone();
        again.push("\"doc-4321\"");
        assert_eq!(
            find(&again, 64),
            vec![(5000, "\"doc-4321\"".to_owned(), 4322)]
        );
    }
}
