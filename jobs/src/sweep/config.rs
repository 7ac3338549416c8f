//! A sweep's declaration (`resident sweep --config FILE`), parsed and checked before anything
//! runs: unknown keys, impossible ranges and metrics that do not fit the trial kind are errors.

use std::collections::BTreeMap;

use resident_proto::prices::PriceTable;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A sweep as its TOML file declares it: the model and data, the trial kind and metric, the
/// search space, how trials are searched and stopped, and where they run.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// The sweep's name: its pool and job are named after it, and a rerun with the same
    /// name and output resumes it.
    pub name: String,
    /// The embedding model every trial's data is embedded with (a directory, an HF id,
    /// `s3://`).
    pub model: String,
    /// Actors of the sweep's pool.
    #[serde(default = "one")]
    pub replicas: u32,
    /// What each trial trains.
    pub trial: TrialKind,
    /// The JSONL file of examples.
    pub data: String,
    /// The metric trials are ranked by: `accuracy` or `macro_f1` (classifier), `recall@10`
    /// or `ndcg@10` (retrieval).
    pub metric: String,
    /// Whether a larger or a smaller metric is better.
    pub mode: Mode,
    /// Trials to draw (random and TPE search; grid search runs every combination).
    #[serde(default = "one")]
    pub trials: u32,
    /// Seeds the search, the data split, initialisation and batch order: a rerun replays
    /// exactly.
    #[serde(default)]
    pub seed: u64,
    /// The output directory: `results.jsonl`, the embedded data, the lock.
    pub output: String,
    /// How trials are drawn from the space.
    #[serde(default)]
    pub search: SearchConfig,
    /// How trials are run and stopped early.
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// The hyperparameters and their ranges, by name.
    pub space: BTreeMap<String, ParamSpec>,
    /// The JSONL field holding each record's text (documents, for retrieval).
    #[serde(default = "default_text_field")]
    pub text_field: String,
    /// Classifier labels; default `label`, else `topic` (the Wikipedia vital articles).
    #[serde(default)]
    pub label_field: Option<String>,
    /// Retrieval queries, one per document; default `query`, else `description`.
    #[serde(default)]
    pub query_field: Option<String>,
    /// Segments in flight per actor (default 2, the runtime's credit).
    #[serde(default = "default_per_actor")]
    pub trials_per_actor: u32,
    /// GPUs per actor (0 = CPU actors; 0.25 shares a GPU four ways) and the VRAM each
    /// reserves, in GiB.
    #[serde(default)]
    pub gpus_per_actor: f64,
    /// VRAM each actor reserves, in GiB.
    #[serde(default = "default_vram_gib")]
    pub vram_gib: f64,
    /// Only nodes with these labels (`pool = "onprem-a6000"`).
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    /// Where agents fetch the embedded dataset: `s3://bucket/prefix/`. Without it they
    /// read it from the output directory, which they must then share with the client.
    #[serde(default)]
    pub cache: Option<String>,
    /// An S3-compatible endpoint for `cache` (MinIO, Ceph); default AWS.
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    /// Keep the sweep's pool when it ends (`--keep-pool`).
    #[serde(default)]
    pub keep_pool: bool,
    /// Delete the pool after this long unused (`--idle-ttl`): `30m`, `2h`.
    #[serde(default, with = "humantime_serde_opt")]
    pub idle_ttl: Option<std::time::Duration>,
    /// What `summary.json` prices the pool's GPU- and core-hours at (`--price`): not part
    /// of the declaration.
    #[serde(skip)]
    pub prices: PriceTable,
}

impl SweepConfig {
    /// Keys of the declaration that say how this run goes, not what the sweep is: a rerun
    /// that changes them resumes the same sweep. The embedded data's cache is found by its
    /// content (model, data and fields, checked by SHA-256), so where it lives is one of them.
    pub const RUN_OPTIONS: [&str; 4] = ["keep_pool", "idle_ttl", "cache", "s3_endpoint"];
}

/// `Option<Duration>` as a humantime string (`"30m"`) in TOML.
mod humantime_serde_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        value: &Option<std::time::Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => {
                serializer.serialize_str(&humantime::format_duration(*duration).to_string())
            }
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<std::time::Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        text.map(|t| {
            humantime::parse_duration(&t).map_err(|e| {
                serde::de::Error::custom(format!("idle_ttl `{t}`: {e} (say `30m`, `2h`)"))
            })
        })
        .transpose()
    }
}

fn default_vram_gib() -> f64 {
    2.0
}

fn default_text_field() -> String {
    "text".into()
}

fn default_per_actor() -> u32 {
    2
}

fn one() -> u32 {
    1
}

/// What a trial trains on the embedded data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialKind {
    /// A small classifier head over the vectors (labels from `label_field`).
    Classifier,
    /// A query adapter for retrieval (queries from `query_field`).
    Retrieval,
}

/// Which way the metric is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Larger is better.
    Max,
    /// Smaller is better.
    Min,
}

/// How trials are drawn from the space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchAlgorithm {
    /// Every combination of the values, in order.
    Grid,
    /// Independent draws, seeded.
    #[default]
    Random,
    /// Tree-structured Parzen Estimator: after `startup_trials` random draws, each trial is
    /// drawn where the best quarter of the trials before it lie and the rest do not.
    Tpe,
}

impl SearchAlgorithm {
    /// Its name in the TOML file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Grid => "grid",
            Self::Random => "random",
            Self::Tpe => "tpe",
        }
    }
}

/// `[search]`: how trials are drawn.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SearchConfig {
    /// Grid, random (the default) or TPE.
    #[serde(default)]
    pub algorithm: SearchAlgorithm,
    /// TPE: how many trials are random draws before the model takes over (default: a
    /// third of `trials`, at least 2 and at most 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_trials: Option<u32>,
}

impl SearchConfig {
    /// TPE's random trials before its model takes over, for a sweep of `trials`.
    pub fn tpe_startup_trials(&self, trials: u32) -> u32 {
        self.startup_trials.unwrap_or((trials / 3).clamp(2, 10))
    }
}

/// How trials run to their end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialScheduler {
    /// Every trial runs every epoch, first come first served.
    #[default]
    Fifo,
    /// Asynchronous successive halving: trials behind at a rung stop early.
    Asha,
    /// Population-based training: the trials train together; every
    /// `perturbation_interval` epochs the worst quantile takes a copy of a better trial's
    /// weights and hyperparameters and perturbs them.
    Pbt,
}

impl TrialScheduler {
    /// Its name in the TOML file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Asha => "asha",
            Self::Pbt => "pbt",
        }
    }
}

/// `[scheduler]`: how trials run and stop.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// FIFO (the default) or ASHA.
    #[serde(default)]
    pub kind: TrialScheduler,
    /// Epochs a trial runs at most.
    #[serde(default = "default_max_epochs")]
    pub max_epochs: u32,
    /// Epochs before ASHA's first rung: no trial stops sooner.
    #[serde(default = "one")]
    pub grace_epochs: u32,
    /// ASHA keeps one trial in this many at each rung.
    #[serde(default = "default_reduction")]
    pub reduction_factor: u32,
    /// PBT: epochs between two rounds of exploit and explore (default a quarter of
    /// `max_epochs`, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perturbation_interval: Option<u32>,
    /// PBT: the share of the population that copies a better trial each round, and the
    /// share it copies from (default 0.25; at most 0.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantile_fraction: Option<f64>,
    /// PBT: the chance that a copied hyperparameter is drawn afresh from its range rather
    /// than perturbed (default 0.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resample_probability: Option<f64>,
    /// PBT: the hyperparameters a round may change (default every one of the space's that
    /// a trial can change between epochs: not `hidden`, `adapter` or `epochs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutations: Option<Vec<String>>,
}

/// Hyperparameters that shape a trial's weights: a trial that copies another's weights
/// keeps the other's value, and PBT never changes them.
pub const SHAPE_PARAMS: [&str; 3] = ["hidden", "adapter", "epochs"];

impl SchedulerConfig {
    /// PBT's epochs between rounds.
    pub fn pbt_interval(&self) -> u32 {
        self.perturbation_interval
            .unwrap_or((self.max_epochs / 4).max(1))
    }

    /// PBT's quantile: the share that copies, and the share copied from.
    pub fn pbt_quantile(&self) -> f64 {
        self.quantile_fraction.unwrap_or(0.25)
    }

    /// PBT's chance of drawing a hyperparameter afresh.
    pub fn pbt_resample_probability(&self) -> f64 {
        self.resample_probability.unwrap_or(0.25)
    }

    /// The hyperparameters of `space` that PBT may change.
    pub fn pbt_mutations(&self, space: &BTreeMap<String, ParamSpec>) -> Vec<String> {
        match &self.mutations {
            Some(names) => names.clone(),
            None => space
                .keys()
                .filter(|name| !SHAPE_PARAMS.contains(&name.as_str()))
                .cloned()
                .collect(),
        }
    }
}

fn default_max_epochs() -> u32 {
    10
}

fn default_reduction() -> u32 {
    3
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            kind: TrialScheduler::Fifo,
            max_epochs: 10,
            grace_epochs: 1,
            reduction_factor: 3,
            perturbation_interval: None,
            quantile_fraction: None,
            resample_probability: None,
            mutations: None,
        }
    }
}

/// One hyperparameter's search space.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum ParamSpec {
    /// Pick one of these values (random search) or try each (grid search).
    Choice(Vec<Value>),
    /// Try each value (grid search only).
    Grid(Vec<Value>),
    /// A float drawn uniformly from `[low, high)`.
    Uniform([f64; 2]),
    /// A float whose logarithm is drawn uniformly (learning rates).
    LogUniform([f64; 2]),
    /// An integer in `[low, high]`, both included.
    Int([i64; 2]),
}

/// Why a sweep's TOML was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SweepConfigError {
    /// The text is not TOML of a sweep (the parser's message).
    #[error("sweep config is not valid TOML: {0}")]
    Syntax(String),
    /// A setting is out of bounds or names something unknown (what to change is said).
    #[error("sweep config: {0}")]
    Invalid(String),
}

fn invalid(message: String) -> SweepConfigError {
    SweepConfigError::Invalid(message)
}

impl SweepConfig {
    /// What becomes of the sweep's pool when it ends.
    pub fn retention(&self) -> crate::pools::PoolRetention {
        crate::pools::PoolRetention {
            keep: self.keep_pool,
            idle_ttl: self.idle_ttl,
        }
    }

    /// Parses and checks a TOML sweep declaration.
    pub fn from_toml(text: &str) -> Result<Self, SweepConfigError> {
        let config: SweepConfig =
            toml::from_str(text).map_err(|e| SweepConfigError::Syntax(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting's bounds and names, refusing the first that is wrong.
    pub fn validate(&self) -> Result<(), SweepConfigError> {
        if self.name.trim().is_empty() {
            return Err(invalid("name is empty".into()));
        }
        if self.replicas == 0 {
            return Err(invalid("replicas must be at least 1".into()));
        }
        if self.trials == 0 {
            return Err(invalid("trials must be at least 1".into()));
        }
        self.check_search()?;
        if let Some(cache) = &self.cache
            && !matches!(
                resident_storage::Location::parse(cache),
                Ok(resident_storage::Location::S3 { .. })
            )
        {
            return Err(invalid(format!(
                "cache `{cache}` is not an s3://bucket/prefix/ (agents fetch the embedded dataset from there)"
            )));
        }
        self.check_metric()?;
        check_asha(&self.scheduler)?;
        self.check_space()?;
        self.check_pbt()?;
        if !(self.gpus_per_actor >= 0.0 && self.vram_gib > 0.0) {
            return Err(invalid(format!(
                "gpus_per_actor ({}) must be >= 0 and vram_gib ({}) > 0",
                self.gpus_per_actor, self.vram_gib
            )));
        }
        if self.trials_per_actor == 0 {
            return Err(invalid("trials_per_actor must be at least 1".into()));
        }
        Ok(())
    }
}

impl SweepConfig {
    /// `startup_trials` belongs to TPE and needs at least one random trial.
    fn check_search(&self) -> Result<(), SweepConfigError> {
        match self.search.startup_trials {
            Some(_) if self.search.algorithm != SearchAlgorithm::Tpe => Err(invalid(format!(
                "search.startup_trials is TPE's; search.algorithm is \"{}\" (set algorithm = \"tpe\" or drop startup_trials)",
                self.search.algorithm.name()
            ))),
            Some(0) => Err(invalid(
                "search.startup_trials must be at least 1: TPE needs trials to learn from".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The metric must be one the trial kind reports.
    fn check_metric(&self) -> Result<(), SweepConfigError> {
        let metrics: &[&str] = match self.trial {
            TrialKind::Classifier => &["accuracy", "macro_f1"],
            TrialKind::Retrieval => &["recall@10", "ndcg@10"],
        };
        if !metrics.contains(&self.metric.as_str()) {
            return Err(invalid(format!(
                "metric `{}` does not fit trial `{:?}`; use one of: {}",
                self.metric,
                self.trial,
                metrics.join(", ")
            )));
        }
        Ok(())
    }

    /// A space of at least one hyperparameter, each one the trial kind takes, each range
    /// or list sound for the search algorithm.
    fn check_space(&self) -> Result<(), SweepConfigError> {
        if self.space.is_empty() {
            return Err(invalid(
                "space is empty; declare at least one hyperparameter".into(),
            ));
        }
        let known: &[&str] = match self.trial {
            TrialKind::Classifier => &[
                "lr",
                "weight_decay",
                "hidden",
                "dropout",
                "epochs",
                "batch_size",
            ],
            TrialKind::Retrieval => &[
                "lr",
                "weight_decay",
                "temperature",
                "epochs",
                "batch_size",
                "adapter",
            ],
        };
        for (name, spec) in &self.space {
            if !known.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "space.{name}: `{:?}` trials have no such hyperparameter; use: {}",
                    self.trial,
                    known.join(", ")
                )));
            }
            check_param(name, spec, self.search.algorithm)?;
        }
        Ok(())
    }
}

impl SweepConfig {
    /// Trials the search yields: `trials`, or every combination under grid search.
    pub fn trial_count(&self) -> usize {
        match self.search.algorithm {
            SearchAlgorithm::Grid => self
                .space
                .values()
                .map(|spec| match spec {
                    ParamSpec::Choice(values) | ParamSpec::Grid(values) => values.len(),
                    _ => 1,
                })
                .product(),
            _ => self.trials as usize,
        }
    }

    /// PBT's settings belong to PBT; under it, a population that copies at least one trial
    /// a round, trials that all train to `max_epochs`, and mutations the trial can take.
    fn check_pbt(&self) -> Result<(), SweepConfigError> {
        let s = &self.scheduler;
        if s.kind != TrialScheduler::Pbt {
            let set = [
                ("perturbation_interval", s.perturbation_interval.is_some()),
                ("quantile_fraction", s.quantile_fraction.is_some()),
                ("resample_probability", s.resample_probability.is_some()),
                ("mutations", s.mutations.is_some()),
            ];
            return match set.iter().find(|(_, set)| *set) {
                Some((key, _)) => Err(invalid(format!(
                    "scheduler.{key} is PBT's; scheduler.kind is \"{}\" (set kind = \"pbt\" or drop {key})",
                    s.kind.name()
                ))),
                None => Ok(()),
            };
        }
        if self.search.algorithm == SearchAlgorithm::Tpe {
            return Err(invalid(
                "PBT starts its whole population at once and TPE draws each trial from finished ones: use search.algorithm = \"random\" or \"grid\"".into(),
            ));
        }
        let interval = s.pbt_interval();
        if interval == 0 || interval >= s.max_epochs {
            return Err(invalid(format!(
                "scheduler.perturbation_interval ({interval}) must be at least 1 and below max_epochs ({}): PBT perturbs between epochs",
                s.max_epochs
            )));
        }
        let quantile = s.pbt_quantile();
        if !(quantile > 0.0 && quantile <= 0.5) {
            return Err(invalid(format!(
                "scheduler.quantile_fraction ({quantile}) must be above 0 and at most 0.5: the worst share copies the best share"
            )));
        }
        let resample = s.pbt_resample_probability();
        if !(0.0..=1.0).contains(&resample) {
            return Err(invalid(format!(
                "scheduler.resample_probability ({resample}) must be between 0 and 1"
            )));
        }
        let population = self.trial_count();
        if (population as f64 * quantile).floor() < 1.0 {
            return Err(invalid(format!(
                "a population of {population} trials with quantile_fraction {quantile} never copies a trial: PBT needs at least {} trials",
                (1.0 / quantile).ceil()
            )));
        }
        if self.space.contains_key("epochs") {
            return Err(invalid(
                "space.epochs: PBT trains every trial to scheduler.max_epochs; drop epochs from the space".into(),
            ));
        }
        self.check_mutations()
    }

    /// Each mutation is a hyperparameter of the space that a trial can change between
    /// epochs, and there is at least one.
    fn check_mutations(&self) -> Result<(), SweepConfigError> {
        let mutations = self.scheduler.pbt_mutations(&self.space);
        if mutations.is_empty() {
            return Err(invalid(format!(
                "PBT has nothing to perturb: every hyperparameter of the space ({}) shapes the weights; add one that can change between epochs (lr, weight_decay, batch_size, ...)",
                self.space.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        for name in &mutations {
            if SHAPE_PARAMS.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "scheduler.mutations: `{name}` shapes the weights, which a trial copies from another; PBT cannot change it between epochs"
                )));
            }
            if !self.space.contains_key(name) {
                return Err(invalid(format!(
                    "scheduler.mutations: `{name}` is not in the space; declare its range under [space]"
                )));
            }
        }
        Ok(())
    }
}

/// ASHA's settings: 1 <= grace_epochs <= max_epochs and a reduction factor of 2 or more.
fn check_asha(s: &SchedulerConfig) -> Result<(), SweepConfigError> {
    if s.max_epochs == 0 || s.grace_epochs == 0 || s.grace_epochs > s.max_epochs {
        return Err(invalid(format!(
            "scheduler needs 1 <= grace_epochs ({}) <= max_epochs ({})",
            s.grace_epochs, s.max_epochs
        )));
    }
    if s.reduction_factor < 2 {
        return Err(invalid(format!(
            "scheduler.reduction_factor must be at least 2, got {}",
            s.reduction_factor
        )));
    }
    Ok(())
}

fn check_param(
    name: &str,
    spec: &ParamSpec,
    algorithm: SearchAlgorithm,
) -> Result<(), SweepConfigError> {
    let range = |low: f64, high: f64| -> Result<(), SweepConfigError> {
        if !(low.is_finite() && high.is_finite() && low < high) {
            return Err(invalid(format!(
                "space.{name}: need low < high, got [{low}, {high}]"
            )));
        }
        Ok(())
    };
    match spec {
        ParamSpec::Choice(values) | ParamSpec::Grid(values) if values.is_empty() => {
            Err(invalid(format!("space.{name}: no values to choose from")))
        }
        ParamSpec::Grid(_) if algorithm != SearchAlgorithm::Grid => Err(invalid(format!(
            "space.{name}: `grid` needs search.algorithm = \"grid\"; use `choice` for {} search",
            algorithm.name()
        ))),
        ParamSpec::Uniform([low, high]) | ParamSpec::LogUniform([low, high])
            if algorithm == SearchAlgorithm::Grid =>
        {
            let _ = (low, high);
            Err(invalid(format!(
                "space.{name}: a continuous range cannot be searched by grid; use `grid` or `choice` values"
            )))
        }
        ParamSpec::Int(_) if algorithm == SearchAlgorithm::Grid => Err(invalid(format!(
            "space.{name}: an int range cannot be searched by grid; list the values with `grid`"
        ))),
        ParamSpec::Uniform([low, high]) => range(*low, *high),
        ParamSpec::LogUniform([low, high]) => {
            range(*low, *high)?;
            if *low <= 0.0 {
                return Err(invalid(format!(
                    "space.{name}: loguniform needs low > 0, got {low}"
                )));
            }
            Ok(())
        }
        ParamSpec::Int([low, high]) if low > high => Err(invalid(format!(
            "space.{name}: need low <= high, got [{low}, {high}]"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
name = "wiki-topic-probe"
model = "models/all-MiniLM-L6-v2"
replicas = 2
trial = "classifier"
data = "data/wiki_vital.jsonl"
metric = "accuracy"
mode = "max"
trials = 16
seed = 7
output = "out/sweep"
[search]
algorithm = "random"
[scheduler]
kind = "asha"
max_epochs = 20
grace_epochs = 2
reduction_factor = 2
[space]
lr = { loguniform = [1e-4, 1e-1] }
weight_decay = { loguniform = [1e-6, 1e-2] }
hidden = { choice = [0, 64, 256] }
"#;

    #[test]
    fn parses_the_issue_example() {
        let config = SweepConfig::from_toml(EXAMPLE).unwrap();
        assert_eq!(config.trials, 16);
        assert_eq!(config.scheduler.kind, TrialScheduler::Asha);
        assert_eq!(config.space["lr"], ParamSpec::LogUniform([1e-4, 1e-1]));
        assert_eq!(
            config.space["hidden"],
            ParamSpec::Choice(vec![0.into(), 64.into(), 256.into()])
        );
    }

    #[test]
    fn the_example_and_benchmark_sweeps_parse() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut seen = 0;
        for dir in ["examples/sweeps", "benches/sweeps"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                let text = std::fs::read_to_string(&path).unwrap();
                SweepConfig::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen >= 3);
    }

    fn error_of(edit: (&str, &str)) -> String {
        SweepConfig::from_toml(&EXAMPLE.replace(edit.0, edit.1))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bad_spaces_and_keys_are_clear_errors() {
        assert!(error_of(("seed = 7", "seed = 7\nsede = 8")).contains("unknown field `sede`"));
        assert!(
            error_of(("loguniform = [1e-4, 1e-1]", "loguniform = [0.0, 1e-1]"))
                .ends_with("space.lr: loguniform needs low > 0, got 0")
        );
        assert!(
            error_of(("loguniform = [1e-4, 1e-1]", "uniform = [0.5, 0.1]"))
                .ends_with("space.lr: need low < high, got [0.5, 0.1]")
        );
        assert!(
            error_of(("choice = [0, 64, 256]", "choice = []"))
                .ends_with("space.hidden: no values to choose from")
        );
        assert!(
            error_of(("choice = [0, 64, 256]", "normal = [0, 1]"))
                .contains("unknown variant `normal`")
        );
        assert!(
            error_of(("metric = \"accuracy\"", "metric = \"ndcg@10\""))
                .contains("use one of: accuracy, macro_f1")
        );
        assert!(
            error_of(("grace_epochs = 2", "grace_epochs = 30"))
                .contains("grace_epochs (30) <= max_epochs (20)")
        );
        assert!(
            error_of(("algorithm = \"random\"", "algorithm = \"grid\""))
                .contains("cannot be searched by grid")
        );
        assert!(
            error_of(("hidden = {", "hiden = {"))
                .contains("space.hiden: `Classifier` trials have no such hyperparameter; use: lr,")
        );
        assert!(
            error_of(("reduction_factor = 2", "reduction_factor = 1"))
                .contains("reduction_factor must be at least 2")
        );
        assert!(
            error_of((
                "algorithm = \"random\"",
                "algorithm = \"random\"\nstartup_trials = 4"
            ))
            .contains("search.startup_trials is TPE's; search.algorithm is \"random\"")
        );
        assert!(
            error_of((
                "algorithm = \"random\"",
                "algorithm = \"tpe\"\nstartup_trials = 0"
            ))
            .contains("startup_trials must be at least 1")
        );
        let grid_under_tpe = EXAMPLE
            .replace("algorithm = \"random\"", "algorithm = \"tpe\"")
            .replace("hidden = { choice", "hidden = { grid");
        assert!(
            SweepConfig::from_toml(&grid_under_tpe)
                .unwrap_err()
                .to_string()
                .contains("`grid` needs search.algorithm = \"grid\"; use `choice` for tpe search")
        );
    }

    #[test]
    fn tpe_takes_a_third_of_the_trials_at_random_unless_told() {
        let tpe = EXAMPLE.replace("algorithm = \"random\"", "algorithm = \"tpe\"");
        let config = SweepConfig::from_toml(&tpe).unwrap();
        assert_eq!(config.search.algorithm, SearchAlgorithm::Tpe);
        assert_eq!(config.search.tpe_startup_trials(config.trials), 5);
        assert_eq!(config.search.tpe_startup_trials(100), 10);
        assert_eq!(config.search.tpe_startup_trials(4), 2);
        let told = tpe.replace(
            "algorithm = \"tpe\"",
            "algorithm = \"tpe\"\nstartup_trials = 3",
        );
        let config = SweepConfig::from_toml(&told).unwrap();
        assert_eq!(config.search.tpe_startup_trials(config.trials), 3);
        // A declaration without startup_trials serializes as before (older sweep.json files
        // still resume).
        let random = serde_json::to_value(SweepConfig::from_toml(EXAMPLE).unwrap()).unwrap();
        assert_eq!(random["search"], serde_json::json!({"algorithm": "random"}));
    }

    #[test]
    fn pbt_takes_its_settings_and_refuses_what_it_cannot_run() {
        let pbt = EXAMPLE
            .replace("kind = \"asha\"", "kind = \"pbt\"")
            .replace(
                "hidden = { choice = [0, 64, 256] }",
                "hidden = { choice = [64] }",
            );
        let config = SweepConfig::from_toml(&pbt).unwrap();
        let s = &config.scheduler;
        assert_eq!(
            (
                s.pbt_interval(),
                s.pbt_quantile(),
                s.pbt_resample_probability()
            ),
            (5, 0.25, 0.25)
        );
        assert_eq!(
            s.pbt_mutations(&config.space),
            vec!["lr", "weight_decay"],
            "not hidden"
        );
        // Settings of PBT's under no PBT are refused, and so are settings PBT cannot run.
        let refused = |text: &str| SweepConfig::from_toml(text).unwrap_err().to_string();
        let edit = |key: &str| pbt.replace("reduction_factor = 2", key);
        assert!(
            refused(&EXAMPLE.replace("reduction_factor = 2", "perturbation_interval = 2"))
                .contains("scheduler.perturbation_interval is PBT's; scheduler.kind is \"asha\"")
        );
        assert!(refused(&edit("perturbation_interval = 20")).contains("below max_epochs (20)"));
        assert!(refused(&edit("quantile_fraction = 0.6")).contains("at most 0.5"));
        assert!(refused(&edit("resample_probability = 1.5")).contains("between 0 and 1"));
        assert!(refused(&edit("mutations = [\"hidden\"]")).contains("`hidden` shapes the weights"));
        assert!(
            refused(&edit("mutations = [\"dropout\"]")).contains("`dropout` is not in the space")
        );
        assert!(
            refused(&pbt.replace("trials = 16", "trials = 3"))
                .contains("a population of 3 trials with quantile_fraction 0.25 never copies a trial: PBT needs at least 4 trials")
        );
        assert!(
            refused(&pbt.replace("algorithm = \"random\"", "algorithm = \"tpe\""))
                .contains("use search.algorithm = \"random\" or \"grid\"")
        );
        assert!(
            refused(&format!("{pbt}epochs = {{ int = [1, 4] }}\n"))
                .contains("space.epochs: PBT trains every trial to scheduler.max_epochs")
        );
        let shapes_only = pbt
            .replace("lr = { loguniform = [1e-4, 1e-1] }\n", "")
            .replace("weight_decay = { loguniform = [1e-6, 1e-2] }\n", "");
        assert!(refused(&shapes_only).contains("PBT has nothing to perturb"));
        // Grid search's population is its combinations.
        let grid = pbt
            .replace("algorithm = \"random\"", "algorithm = \"grid\"")
            .replace("{ loguniform = [1e-4, 1e-1] }", "{ grid = [0.1, 0.01] }")
            .replace("{ loguniform = [1e-6, 1e-2] }", "{ grid = [0.0, 1e-4] }");
        assert_eq!(SweepConfig::from_toml(&grid).unwrap().trial_count(), 4);
        // A declaration without PBT's keys serializes as before (older sweep.json resume).
        let asha = serde_json::to_value(SweepConfig::from_toml(EXAMPLE).unwrap()).unwrap();
        assert_eq!(asha["scheduler"].as_object().unwrap().len(), 4);
    }
}
