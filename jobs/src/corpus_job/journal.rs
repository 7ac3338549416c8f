//! The manifest's journal, the pure part: how a finished chunk becomes one line, how a
//! journal is read back (a line torn by a crash is dropped, so the chunk is redone), and
//! when the journal is folded into `manifest.json`.
//!
//! Why a journal: rewriting the whole manifest after every chunk is quadratic (100,000
//! chunks of a 20 MB manifest are terabytes of writes). Appending one line per chunk and
//! compacting only when the journal has grown by a fixed fraction of the manifest keeps the
//! bytes written linear in the number of chunks (about 6 entries written per chunk with the
//! default policy, see the test below).

use super::manifest::ShardEntry;
use crate::files::sha256_hex;

/// Hex digits of the line check (a SHA-256 prefix: enough to tell a torn or damaged line,
/// not a security boundary).
const CHECK_HEX: usize = 16;
const LINE_HEAD: &str = "{\"check\":\"";
const LINE_MIDDLE: &str = "\",\"chunk\":";

/// One journal line: `{"check":"<16 hex>","chunk":{...}}\n`. The check covers the exact
/// bytes of the chunk object, so the line stays plain JSON for `jq` and is still verifiable.
pub fn encode_entry(entry: &ShardEntry) -> Vec<u8> {
    let chunk = serde_json::to_string(entry).expect("a shard entry serializes");
    let check = &sha256_hex(chunk.as_bytes())[..CHECK_HEX];
    format!("{LINE_HEAD}{check}{LINE_MIDDLE}{chunk}}}\n").into_bytes()
}

fn decode_line(line: &[u8]) -> Option<ShardEntry> {
    let text = std::str::from_utf8(line).ok()?;
    let rest = text.strip_prefix(LINE_HEAD)?;
    let (check, rest) = rest.split_at_checked(CHECK_HEX)?;
    let chunk = rest.strip_prefix(LINE_MIDDLE)?.strip_suffix('}')?;
    if sha256_hex(chunk.as_bytes())[..CHECK_HEX] != *check {
        return None;
    }
    serde_json::from_str(chunk).ok()
}

/// A journal as read back.
#[derive(Debug, PartialEq)]
pub struct DecodedJournal {
    /// The journaled entries, in order.
    pub entries: Vec<ShardEntry>,
    /// Bytes of whole, verified lines: where the next append belongs.
    pub valid_bytes: usize,
    /// Whether the last line was cut short or damaged (a crash mid-append).
    pub torn_tail: bool,
}

/// A journal line damaged before its last line: not what a crash leaves.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name} line {line} is damaged (not a crash's torn last line); remove {name} to redo the \
     chunks it records, then rerun"
)]
pub struct JournalDamaged {
    /// The journal (a file or an object).
    pub name: String,
    /// The damaged line, from 1.
    pub line: usize,
}

/// Reads journal bytes. Only the last line can be torn by a crash (lines are appended and
/// synced one at a time); a damaged line before it is refused, since that is not what a
/// crash leaves and silently dropping it would hide lost work.
pub fn decode_journal(bytes: &[u8], name: &str) -> Result<DecodedJournal, JournalDamaged> {
    let mut entries = Vec::new();
    let mut valid_bytes = 0;
    let mut lines = bytes
        .split_inclusive(|b| *b == b'\n')
        .enumerate()
        .peekable();
    while let Some((number, line)) = lines.next() {
        let is_last = lines.peek().is_none();
        let entry = line.strip_suffix(b"\n").and_then(decode_line);
        match entry {
            Some(entry) => {
                entries.push(entry);
                valid_bytes += line.len();
            }
            None if is_last => {
                return Ok(DecodedJournal {
                    entries,
                    valid_bytes,
                    torn_tail: true,
                });
            }
            None => {
                return Err(JournalDamaged {
                    name: name.to_owned(),
                    line: number + 1,
                });
            }
        }
    }
    Ok(DecodedJournal {
        entries,
        valid_bytes,
        torn_tail: false,
    })
}

/// When to fold the journal into `manifest.json`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompactionPolicy {
    /// Never compact a journal shorter than this.
    pub min_entries: usize,
    /// Compact once the journal holds this fraction of the manifest's entries: each
    /// compaction then writes a manifest at least `1 + fraction` times the last one, and
    /// the sum of those writes is a geometric series, linear in the chunks.
    pub fraction: f64,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        Self {
            min_entries: 1024,
            fraction: 0.25,
        }
    }
}

impl CompactionPolicy {
    /// Whether `journaled` entries beside `compacted` ones are enough to fold the journal
    /// in.
    pub fn due(&self, journaled: usize, compacted: usize) -> bool {
        let threshold = (compacted as f64 * self.fraction).ceil() as usize;
        journaled >= self.min_entries.max(threshold).max(1)
    }
}

/// A test hook: `RESIDENT_TEST_PAUSE_AT=journal-append:N` stops the job in the middle of its
/// Nth journal append (half the line written and synced), `compaction:N` in the middle of
/// its Nth compaction (the new manifest in place, the old journal not yet removed). The
/// process prints `paused at <point>` on stderr and sleeps until it is killed, so a test
/// can `kill -9` it at exactly that point. Unset, it costs one comparison per append.
#[derive(Clone, Debug, PartialEq)]
pub struct PauseAt {
    /// Where to pause.
    pub point: PausePoint,
    /// At which occurrence of it, from 1.
    pub occurrence: u64,
}

/// Where a job can be paused for a kill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PausePoint {
    /// Halfway through a journal append.
    JournalAppend,
    /// Halfway through a compaction.
    Compaction,
}

impl PauseAt {
    /// The environment variable that sets the hook.
    pub const ENV: &'static str = "RESIDENT_TEST_PAUSE_AT";

    /// The hook the environment sets, if any.
    pub fn from_env() -> Option<Self> {
        std::env::var(Self::ENV).ok().and_then(|v| Self::parse(&v))
    }

    fn parse(value: &str) -> Option<Self> {
        let (point, occurrence) = value.split_once(':')?;
        let point = match point {
            "journal-append" => PausePoint::JournalAppend,
            "compaction" => PausePoint::Compaction,
            _ => return None,
        };
        Some(Self {
            point,
            occurrence: occurrence.parse().ok()?,
        })
    }

    /// Pauses forever if this is the configured point and occurrence.
    pub fn check(this: &Option<Self>, point: PausePoint, occurrence: u64) {
        if let Some(pause) = this
            && pause.point == point
            && pause.occurrence == occurrence
        {
            eprintln!("paused at {point:?} {occurrence}");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64) -> ShardEntry {
        ShardEntry::for_test(index)
    }

    #[test]
    fn lines_round_trip_and_stay_json() {
        let line = encode_entry(&entry(7));
        let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(value["chunk"]["index"], 7);
        let decoded = decode_journal(&line, "j").unwrap();
        assert_eq!(decoded.entries, vec![entry(7)]);
        assert_eq!(decoded.valid_bytes, line.len());
        assert!(!decoded.torn_tail);
    }

    #[test]
    fn a_torn_last_line_is_dropped_at_every_cut() {
        let whole: Vec<u8> = [encode_entry(&entry(0)), encode_entry(&entry(1))].concat();
        let first = encode_entry(&entry(0)).len();
        for cut in first..whole.len() {
            let decoded = decode_journal(&whole[..cut], "j").unwrap();
            assert_eq!(decoded.entries, vec![entry(0)], "cut at {cut}");
            assert_eq!(decoded.valid_bytes, first);
            assert_eq!(decoded.torn_tail, cut > first, "cut at {cut}");
        }
        assert_eq!(decode_journal(&whole, "j").unwrap().entries.len(), 2);
    }

    #[test]
    fn a_damaged_line_before_the_last_is_refused() {
        let mut bytes: Vec<u8> = [encode_entry(&entry(0)), encode_entry(&entry(1))].concat();
        bytes[40] ^= 1;
        let error = decode_journal(&bytes, "journal/000001.jsonl")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 1") && error.contains("remove journal/000001.jsonl"),
            "{error}"
        );
        let mut flipped_check = encode_entry(&entry(0));
        flipped_check[12] = if flipped_check[12] == b'0' {
            b'1'
        } else {
            b'0'
        };
        let decoded = decode_journal(&flipped_check, "j").unwrap();
        assert!(decoded.torn_tail && decoded.entries.is_empty());
    }

    #[test]
    fn compaction_keeps_manifest_writes_linear_in_chunks() {
        let policy = CompactionPolicy::default();
        for chunks in [10usize, 5_000, 100_000] {
            let (mut compacted, mut journaled, mut written) = (0usize, 0usize, 0usize);
            for _ in 0..chunks {
                journaled += 1;
                written += 1;
                if policy.due(journaled, compacted) {
                    compacted += journaled;
                    journaled = 0;
                    written += compacted;
                }
            }
            written += compacted + journaled; // the final compaction
            assert!(
                written <= 7 * chunks.max(policy.min_entries),
                "{chunks} chunks: {written} entries written"
            );
        }
    }

    #[test]
    fn pause_points_parse() {
        assert_eq!(
            PauseAt::parse("journal-append:3"),
            Some(PauseAt {
                point: PausePoint::JournalAppend,
                occurrence: 3
            })
        );
        assert_eq!(PauseAt::parse("compaction:x"), None);
        assert_eq!(PauseAt::parse("elsewhere:1"), None);
    }
}
