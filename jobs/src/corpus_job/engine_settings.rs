//! A generate job's engine settings as a front end takes them (`resident generate`'s
//! `--max-sequences`, `--max-step-tokens`, `--max-context`, `--dtype`, `--enforce-eager`,
//! `--attention-kernel`; Python's `generate_job` keywords of the same names), set on the
//! job's work in one place so that every front end means the same by them.

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
        let named = |value: Option<String>| value.filter(|name| name != "auto");
        work.max_sequences = self.max_sequences;
        work.max_step_tokens = self.max_step_tokens;
        work.max_context = self.max_context;
        work.dtype = named(self.dtype);
        work.enforce_eager = self.enforce_eager;
        work.attention = named(self.attention_kernel);
    }
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
        let typo = serde_json::from_str::<EngineSettings>(r#"{"max_sequence": 8}"#);
        assert!(
            typo.unwrap_err()
                .to_string()
                .contains("unknown field `max_sequence`")
        );
    }
}
