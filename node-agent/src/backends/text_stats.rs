//! `text-stats`: the example kind to copy when writing your own.
//!
//! A kind has two halves:
//! 1. [`ActorKind::load`] runs once when an actor starts, on the actor's own thread. Do the
//!    expensive work here (read weights, move them to the GPU) and keep the result in your
//!    backend struct. Errors here mark the actor failed, with your message in `resident status`.
//! 2. [`ModelBackend::run_chunk`] runs for every task, on that same thread, with the task's
//!    payload bytes. Return the output bytes, or an error that the scheduler retries.
//!
//! This one counts characters, words and lines of UTF-8 text, optionally only words of a
//! minimum length (`{"min_word_chars": 4}`), and answers with JSON.

use serde::{Deserialize, Serialize};

use super::{ActorKind, BackendError, LoadContext, ModelBackend};

/// The `text-stats` kind: counts the characters, words and lines of a UTF-8 payload (a
/// model-free kind for tests and examples).
pub struct TextStatsKind;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TextStatsConfig {
    #[serde(default)]
    min_word_chars: usize,
}

/// The output of one task.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct TextStats {
    /// Characters (Unicode scalar values).
    pub chars: usize,
    /// Words of at least the config's `min_word_chars` characters.
    pub words: usize,
    /// Lines.
    pub lines: usize,
}

struct TextStatsBackend {
    min_word_chars: usize,
}

impl ActorKind for TextStatsKind {
    fn name(&self) -> &str {
        "text-stats"
    }

    fn load(&self, context: &LoadContext) -> Result<Box<dyn ModelBackend>, BackendError> {
        let config: TextStatsConfig = context.parse_config()?;
        Ok(Box::new(TextStatsBackend {
            min_word_chars: config.min_word_chars,
        }))
    }
}

impl ModelBackend for TextStatsBackend {
    fn run_chunk(&mut self, payload: &[u8]) -> Result<Vec<u8>, BackendError> {
        let text = std::str::from_utf8(payload)
            .map_err(|e| BackendError::BadPayload(format!("payload is not UTF-8: {e}")))?;
        let stats = TextStats {
            chars: text.chars().count(),
            words: text
                .split_whitespace()
                .filter(|w| w.chars().count() >= self.min_word_chars)
                .count(),
            lines: text.lines().count(),
        };
        serde_json::to_vec(&stats).map_err(|e| BackendError::Task(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(config: &str) -> Result<Box<dyn ModelBackend>, BackendError> {
        TextStatsKind.load(&LoadContext::standalone("a", config.as_bytes().to_vec()))
    }

    #[test]
    fn counts_words_and_rejects_bad_input() {
        let mut backend = load(r#"{"min_word_chars": 4}"#).unwrap();
        let out = backend
            .run_chunk("the quick brown fox\njumps".as_bytes())
            .unwrap();
        let stats: TextStats = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            stats,
            TextStats {
                chars: 25,
                words: 3,
                lines: 2
            }
        );
        let error = backend.run_chunk(&[0xff, 0xfe]).err().unwrap().to_string();
        assert!(
            error.starts_with("bad task payload: payload is not UTF-8"),
            "{error}"
        );
        let error = load(r#"{"min_chars": 1}"#).err().unwrap().to_string();
        assert!(
            error.starts_with("invalid actor config: unknown field `min_chars`"),
            "{error}"
        );
    }
}
