//! Finding a model's files and reading its sentence-transformers settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ModelError;
use crate::roots::{FileRoots, MAX_MODEL_JSON_BYTES, MAX_WEIGHTS_BYTES};

/// How token vectors become one text vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the text's tokens (padding left out).
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
    /// The last real token's (decoder embedders such as Qwen3).
    LastToken,
}

/// Which encoder runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// BERT and its kin: RoBERTa, XLM-R, MPNet (MiniLM, bge, e5, mpnet).
    Bert,
    /// Qwen3 decoder embedders.
    Qwen3,
}

/// How the model wants to be run, from its own files.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelLayout {
    /// The model's directory.
    pub dir: PathBuf,
    /// Its encoder.
    pub architecture: Architecture,
    /// The most tokens a text keeps (sentence-transformers' `max_seq_length`, within the
    /// position table).
    pub max_seq_length: usize,
    /// How token vectors become one.
    pub pooling: Pooling,
    /// Whether vectors are scaled to unit length (a `Normalize` module).
    pub normalize: bool,
    /// Whether texts are lower-cased first.
    pub do_lower_case: bool,
    /// The safetensors files, one or the shards in order.
    pub weights: Vec<PathBuf>,
    /// The prompts the model names (`config_sentence_transformers.json`), by name.
    pub prompts: BTreeMap<String, String>,
    /// The prompt put before every text that asks for none (sentence-transformers'
    /// `default_prompt_name`); always a key of `prompts`.
    pub default_prompt_name: Option<String>,
    /// Whether the prompt's tokens are pooled with the text's (the Pooling module's
    /// `include_prompt`, true unless the model says otherwise).
    pub include_prompt: bool,
}

/// `config_sentence_transformers.json`: the prompts a model was trained with.
#[derive(Deserialize, Default)]
struct SentenceTransformersConfig {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    #[serde(default)]
    default_prompt_name: Option<String>,
}

#[derive(Deserialize)]
struct HfConfig {
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    max_position_embeddings: Option<usize>,
}

#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    #[serde(default)]
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
}

#[derive(Deserialize, Default)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default = "yes")]
    include_prompt: bool,
}

fn yes() -> bool {
    true
}

fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    roots: &FileRoots,
) -> Result<T, ModelError> {
    let bytes = roots.read_model_file(path, MAX_MODEL_JSON_BYTES)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ModelError::Load(format!("{} is not valid: {e}", path.display())))
}

fn architecture_of(config: &HfConfig) -> Result<Architecture, ModelError> {
    let model_type = config
        .model_type
        .clone()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let names = config.architectures.join(",");
    match model_type.as_str() {
        "bert" | "roberta" | "xlm-roberta" | "mpnet" => Ok(Architecture::Bert),
        "qwen3" => Ok(Architecture::Qwen3),
        _ if names.contains("Bert") => Ok(Architecture::Bert),
        _ => Err(ModelError::Load(format!(
            "unsupported architecture `{}` ({names}); supported: bert (MiniLM, bge, e5), roberta, mpnet, qwen3",
            config.model_type.as_deref().unwrap_or("unknown")
        ))),
    }
}

/// Reads the layout of a model directory; every missing piece is a clear error, and every
/// file it reads or names lies under `roots`.
pub fn read_layout(dir: &Path, roots: &FileRoots) -> Result<ModelLayout, ModelError> {
    let dir = &roots.check_model_path(dir)?;
    if !dir.is_dir() {
        return Err(ModelError::Load(format!(
            "model directory {} does not exist",
            dir.display()
        )));
    }
    for required in ["config.json", "tokenizer.json"] {
        if !dir.join(required).is_file() {
            return Err(ModelError::Load(format!(
                "model directory {} has no {required}",
                dir.display()
            )));
        }
    }
    let weights = find_weights(dir)?
        .iter()
        .map(|w| roots.check_model_file(w, MAX_WEIGHTS_BYTES))
        .collect::<Result<Vec<_>, _>>()?;
    let config: HfConfig = read_json(&dir.join("config.json"), roots)?;
    let architecture = architecture_of(&config)?;

    let modules: Vec<ModuleEntry> = if dir.join("modules.json").is_file() {
        read_json(&dir.join("modules.json"), roots)?
    } else {
        Vec::new()
    };
    let sbert: Option<SentenceBertConfig> = dir
        .join("sentence_bert_config.json")
        .is_file()
        .then(|| read_json(&dir.join("sentence_bert_config.json"), roots))
        .transpose()?;
    let pooling_dir = modules
        .iter()
        .find(|m| m.kind.ends_with("models.Pooling"))
        .map_or_else(|| dir.join("1_Pooling"), |m| dir.join(&m.path));
    let pooling_config: Option<PoolingConfig> = pooling_dir
        .join("config.json")
        .is_file()
        .then(|| read_json(&pooling_dir.join("config.json"), roots))
        .transpose()?;
    let include_prompt = pooling_config.as_ref().is_none_or(|p| p.include_prompt);
    let st_config = read_prompts(dir, roots)?;
    let pooling = pooling_of(pooling_config, architecture)?;
    let normalize = if modules.is_empty() {
        architecture == Architecture::Qwen3
    } else {
        modules.iter().any(|m| m.kind.ends_with("models.Normalize"))
    };
    let position_limit = config.max_position_embeddings.unwrap_or(512);
    let max_seq_length = sbert
        .as_ref()
        .and_then(|s| s.max_seq_length)
        .unwrap_or(position_limit.min(512))
        .min(position_limit);
    Ok(ModelLayout {
        dir: dir.to_owned(),
        architecture,
        max_seq_length,
        pooling,
        normalize,
        do_lower_case: sbert.is_some_and(|s| s.do_lower_case),
        weights,
        prompts: st_config.prompts,
        default_prompt_name: st_config.default_prompt_name,
        include_prompt,
    })
}

/// `config_sentence_transformers.json` (its prompts), or none; its default prompt must be
/// one of its prompts.
fn read_prompts(dir: &Path, roots: &FileRoots) -> Result<SentenceTransformersConfig, ModelError> {
    let path = dir.join("config_sentence_transformers.json");
    let config: SentenceTransformersConfig = match path.is_file() {
        true => read_json(&path, roots)?,
        false => SentenceTransformersConfig::default(),
    };
    if let Some(name) = &config.default_prompt_name
        && !config.prompts.contains_key(name)
    {
        return Err(ModelError::Load(format!(
            "config_sentence_transformers.json names `{name}` as the default prompt, but its \
             prompts are {:?}",
            config.prompts.keys().collect::<Vec<_>>()
        )));
    }
    Ok(config)
}

/// The pooling the model's pooling module asks for, else its architecture's usual one
/// (mean for BERT-likes, the last token for Qwen3).
fn pooling_of(
    config: Option<PoolingConfig>,
    architecture: Architecture,
) -> Result<Pooling, ModelError> {
    let default_pooling = match architecture {
        Architecture::Bert => Pooling::Mean,
        Architecture::Qwen3 => Pooling::LastToken,
    };
    Ok(match config {
        None => default_pooling,
        Some(p) if p.pooling_mode_max_tokens && !p.pooling_mode_mean_tokens => {
            return Err(ModelError::Load(
                "max-token pooling is not supported".into(),
            ));
        }
        Some(p) if p.pooling_mode_lasttoken => Pooling::LastToken,
        Some(p) if p.pooling_mode_cls_token => Pooling::Cls,
        Some(p) if p.pooling_mode_mean_tokens => Pooling::Mean,
        Some(_) => default_pooling,
    })
}

pub(crate) fn find_weights(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::Load(format!("cannot list {}: {e}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(ModelError::Load(format!(
            "model directory {} has no model.safetensors",
            dir.display()
        )));
    }
    Ok(shards)
}

/// Resolves a model spec: an existing directory, or a HuggingFace id found in the local hub
/// cache (`$HF_HOME/hub` or `~/.cache/huggingface/hub`). Nothing is downloaded here.
pub fn resolve_model_dir(spec: &str) -> Result<PathBuf, ModelError> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(path.to_owned());
    }
    if spec.matches('/').count() == 1 && !spec.starts_with(['.', '/']) {
        let hub = std::env::var_os("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
            });
        if let Some(hub) = hub {
            let repo = hub.join(format!("models--{}", spec.replace('/', "--")));
            let snapshot = std::fs::read_to_string(repo.join("refs/main"))
                .ok()
                .map(|rev| repo.join("snapshots").join(rev.trim()));
            if let Some(snapshot) = snapshot.filter(|s| s.is_dir()) {
                return Ok(snapshot);
            }
        }
        return Err(ModelError::Load(format!(
            "model `{spec}` is neither a directory nor in the HuggingFace cache; \
             download it first (e.g. `huggingface-cli download {spec}`) or pass a directory"
        )));
    }
    Err(ModelError::Load(format!(
        "model directory {spec} does not exist"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn minilm_like(dir: &Path) {
        write(
            dir,
            "config.json",
            r#"{"model_type":"bert","architectures":["BertModel"],"max_position_embeddings":512}"#,
        );
        write(dir, "tokenizer.json", "{}");
        write(dir, "model.safetensors", "");
        write(
            dir,
            "modules.json",
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
        );
        write(
            dir,
            "sentence_bert_config.json",
            r#"{"max_seq_length":256,"do_lower_case":false}"#,
        );
        write(
            dir,
            "1_Pooling/config.json",
            r#"{"pooling_mode_mean_tokens":true}"#,
        );
    }

    #[test]
    fn reads_sentence_transformers_settings() {
        let dir = tempfile::tempdir().unwrap();
        minilm_like(dir.path());
        let layout = read_layout(dir.path(), &FileRoots::unrestricted()).unwrap();
        assert_eq!(layout.architecture, Architecture::Bert);
        assert_eq!(
            (layout.max_seq_length, layout.pooling, layout.normalize),
            (256, Pooling::Mean, true)
        );
        write(
            dir.path(),
            "1_Pooling/config.json",
            r#"{"pooling_mode_cls_token":true}"#,
        );
        assert_eq!(
            read_layout(dir.path(), &FileRoots::unrestricted())
                .unwrap()
                .pooling,
            Pooling::Cls
        );
    }

    #[test]
    fn reads_the_prompts_a_model_names_and_whether_pooling_includes_them() {
        let dir = tempfile::tempdir().unwrap();
        minilm_like(dir.path());
        let plain = read_layout(dir.path(), &FileRoots::unrestricted()).unwrap();
        assert!(plain.prompts.is_empty() && plain.default_prompt_name.is_none());
        assert!(plain.include_prompt);
        write(
            dir.path(),
            "config_sentence_transformers.json",
            r#"{"prompts":{"query":"query: ","passage":"passage: "},"default_prompt_name":"passage"}"#,
        );
        write(
            dir.path(),
            "1_Pooling/config.json",
            r#"{"pooling_mode_mean_tokens":true,"include_prompt":false}"#,
        );
        let layout = read_layout(dir.path(), &FileRoots::unrestricted()).unwrap();
        assert_eq!(layout.prompts["query"], "query: ");
        assert_eq!(layout.default_prompt_name.as_deref(), Some("passage"));
        assert!(!layout.include_prompt);
        write(
            dir.path(),
            "config_sentence_transformers.json",
            r#"{"prompts":{"query":"query: "},"default_prompt_name":"document"}"#,
        );
        let error = read_layout(dir.path(), &FileRoots::unrestricted())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`document` as the default prompt"),
            "{error}"
        );
    }

    #[test]
    fn missing_files_and_unknown_architectures_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        minilm_like(dir.path());
        std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
        let error = read_layout(dir.path(), &FileRoots::unrestricted())
            .unwrap_err()
            .to_string();
        assert!(error.ends_with("has no model.safetensors"), "{error}");
        minilm_like(dir.path());
        write(
            dir.path(),
            "config.json",
            r#"{"model_type":"t5","architectures":["T5Model"]}"#,
        );
        let error = read_layout(dir.path(), &FileRoots::unrestricted())
            .unwrap_err()
            .to_string();
        assert!(error.contains("unsupported architecture `t5`"), "{error}");
        let error = resolve_model_dir("no/such-model").unwrap_err().to_string();
        assert!(
            error.contains("neither a directory nor in the HuggingFace cache"),
            "{error}"
        );
    }
}
