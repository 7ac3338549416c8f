//! A generate job's engine settings as a front end takes them (`resident generate`'s
//! `--max-sequences`, `--max-step-tokens`, `--max-context`, `--dtype`, `--enforce-eager`,
//! `--attention-kernel`; Python's `generate_job` keywords of the same names), set on the
//! job's work in one place so that every front end means the same by them.

use resident_actor::generate::GenerateConfig;
use serde::Deserialize;

use super::generate::GenerateWork;

/// The engine settings of a generate job's actors; absent ones are the actors' defaults.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Sequences each actor decodes at once.
    #[serde(default)]
    pub max_sequences: Option<u32>,
    /// Tokens in one forward step.
    #[serde(default)]
    pub max_step_tokens: Option<u32>,
    /// Each sequence's context cap.
    #[serde(default)]
    pub max_context: Option<u32>,
    /// The weights' precision: `auto` (the default), `quantised`, `f32`, `f16`, `bf16`.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Decode steps without CUDA graphs.
    #[serde(default)]
    pub enforce_eager: bool,
    /// The paged attention's GPU kernel: `auto` (the default), `tensor-cores`, `scalar`.
    #[serde(default)]
    pub attention_kernel: Option<String>,
}

impl EngineSettings {
    /// Sets them on `work`; `auto` is the same as absent (the same actors, the same pool).
    pub fn apply(self, work: &mut GenerateWork) {
        let config = self.actor_config(String::new());
        work.max_sequences = config.max_sequences;
        work.max_step_tokens = config.max_step_tokens;
        work.max_context = config.max_context;
        work.dtype = config.dtype;
        work.enforce_eager = config.enforce_eager;
        work.attention = config.attention;
    }

    /// The config of actors of `model` with these settings (a pool of its own, as
    /// Python's `generate` makes); `auto` is left unset.
    pub fn actor_config(self, model: String) -> GenerateConfig {
        let named = |value: Option<String>| value.filter(|name| name != "auto");
        GenerateConfig {
            model,
            max_sequences: self.max_sequences,
            max_step_tokens: self.max_step_tokens,
            max_context: self.max_context,
            dtype: named(self.dtype),
            enforce_eager: self.enforce_eager,
            attention: named(self.attention_kernel),
            ..GenerateConfig::default()
        }
    }

    /// Why actors cannot run with these: a limit of 0.
    pub fn problem(&self) -> Option<String> {
        zero_limit(self.max_sequences, self.max_step_tokens, self.max_context)
    }
}

/// Why an engine's limits cannot run: one of 0 (each must be at least 1, or absent for
/// the default).
pub(super) fn zero_limit(
    max_sequences: Option<u32>,
    max_step_tokens: Option<u32>,
    max_context: Option<u32>,
) -> Option<String> {
    let limits = [
        ("max_sequences (--max-sequences)", max_sequences),
        ("max_step_tokens (--max-step-tokens)", max_step_tokens),
        ("max_context (--max-context)", max_context),
    ];
    let (name, _) = limits.into_iter().find(|(_, value)| *value == Some(0))?;
    Some(format!(
        "{name} must be at least 1 (leave it out for the default)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus_job::{CorpusJobConfig, GenerateJobConfig, PromptTemplate};

    /// What a front end passes lands on the work; `auto` is left unset, so a job that
    /// names it runs on the pool of one that does not.
    #[test]
    fn settings_land_on_the_work_and_auto_is_the_default() {
        let prompt = PromptTemplate::parse("{text}").unwrap();
        let corpus = CorpusJobConfig::new("in.jsonl", "model.gguf", "out");
        let mut config = GenerateJobConfig::new(corpus, prompt);
        let settings: EngineSettings = serde_json::from_str(
            r#"{"max_sequences": 64, "max_context": 2048, "dtype": "auto",
                "enforce_eager": true, "attention_kernel": "scalar"}"#,
        )
        .unwrap();
        settings.apply(&mut config.generation);
        let work = &config.generation;
        assert_eq!(
            (work.max_sequences, work.max_step_tokens, work.max_context),
            (Some(64), None, Some(2048))
        );
        assert_eq!(work.dtype, None);
        assert!(work.enforce_eager);
        assert_eq!(work.attention.as_deref(), Some("scalar"));
        let zero: EngineSettings = serde_json::from_str(r#"{"max_context": 0}"#).unwrap();
        let why = zero.problem().unwrap();
        assert!(why.starts_with("max_context (--max-context) must be at least 1"));
        assert_eq!(EngineSettings::default().problem(), None);
        let typo = serde_json::from_str::<EngineSettings>(r#"{"max_sequence": 8}"#);
        assert!(
            typo.unwrap_err()
                .to_string()
                .contains("unknown field `max_sequence`")
        );
    }
}
