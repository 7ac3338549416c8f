//! A generate job's engine settings as a front end takes them (`resident generate`'s
//! `--max-sequences`, `--max-step-tokens`, `--max-context`, `--dtype`, `--enforce-eager`,
//! `--attention-kernel`, `--chat-template`, `--chat-template-kwargs`; Python's
//! `generate_job`, `generate` and `chat` keywords of the same names), kept as a job's
//! (`GenerateWork::engine`) and turned into the actors' config in one place, so that every
//! front end means the same by them.

use resident_actor::generate::GenerateConfig;
use serde::Deserialize;

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
    /// A Jinja chat template (its source) in place of the model's own (`--chat-template`).
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Variables the chat template is rendered with (`--chat-template-kwargs`).
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

impl EngineSettings {
    /// The config of actors of `model` with these settings; `auto` is left unset, the same
    /// as absent (the same actors, the same pool).
    pub fn actor_config(&self, model: String) -> GenerateConfig {
        GenerateConfig {
            model,
            max_sequences: self.max_sequences,
            max_step_tokens: self.max_step_tokens,
            max_context: self.max_context,
            dtype: self.dtype().map(str::to_owned),
            enforce_eager: self.enforce_eager,
            attention: named(&self.attention_kernel).map(str::to_owned),
            chat_template: self.chat_template.clone(),
            chat_template_kwargs: self.chat_template_kwargs.clone(),
            ..GenerateConfig::default()
        }
    }

    /// The weights' precision asked for; `None` for `auto` or none.
    pub fn dtype(&self) -> Option<&str> {
        named(&self.dtype)
    }

    /// Why actors cannot run with these: a limit of 0 (each must be at least 1, or absent
    /// for the default).
    pub fn problem(&self) -> Option<String> {
        let limits = [
            ("max_sequences (--max-sequences)", self.max_sequences),
            ("max_step_tokens (--max-step-tokens)", self.max_step_tokens),
            ("max_context (--max-context)", self.max_context),
        ];
        if let Some((name, _)) = limits.into_iter().find(|(_, value)| *value == Some(0)) {
            return Some(format!(
                "{name} must be at least 1 (leave it out for the default)"
            ));
        }
        let kwargs = self.chat_template_kwargs.as_ref()?;
        resident_actor::generate::chat_template_kwargs_problem(kwargs)
            .map(|problem| format!("chat_template_kwargs (--chat-template-kwargs) {problem}"))
    }
}

/// A setting's name, unless it is `auto` (the default, the same as none).
fn named(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|name| *name != "auto")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a front end passes lands in the actors' config; `auto` is left unset, so a
    /// job that names it runs on the pool of one that does not.
    #[test]
    fn settings_land_in_the_actors_config_and_auto_is_the_default() {
        let settings: EngineSettings = serde_json::from_str(
            r#"{"max_sequences": 64, "max_context": 2048, "dtype": "auto",
                "enforce_eager": true, "attention_kernel": "scalar",
                "chat_template": "{{ messages[0].content }}"}"#,
        )
        .unwrap();
        let config = settings.actor_config("m.gguf".into());
        assert_eq!(
            (
                config.max_sequences,
                config.max_step_tokens,
                config.max_context
            ),
            (Some(64), None, Some(2048))
        );
        assert_eq!((config.model.as_str(), config.dtype), ("m.gguf", None));
        assert!(config.enforce_eager);
        assert_eq!(config.attention.as_deref(), Some("scalar"));
        let template = config.chat_template.as_deref();
        assert_eq!(template, Some("{{ messages[0].content }}"));
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
