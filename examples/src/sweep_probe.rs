//! A sweep declared in code instead of TOML: 8 random topic classifiers on frozen
//! all-MiniLM-L6-v2 embeddings of the Wikipedia vital articles, ASHA stopping the weak ones,
//! all trials on two resident actors.
//! `scripts/fetch-model.sh && scripts/fetch-data.sh && cargo run --release -p resident-examples --bin sweep-probe`

use std::collections::BTreeMap;

use resident_jobs::sweep::config::{
    Mode, ParamSpec, SchedulerConfig, SearchAlgorithm, SearchConfig, TrialKind, TrialScheduler,
};
use resident_jobs::sweep::{SweepConfig, format_table, load_results, run_sweep};
use resident_sdk::{Cluster, LocalConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    resident_models::device::set_compute_threads(1);
    let config = SweepConfig {
        name: "probe".into(),
        model: "models/all-MiniLM-L6-v2".into(),
        replicas: 2,
        trial: TrialKind::Classifier,
        data: "data/wiki_vital.jsonl".into(),
        metric: "macro_f1".into(),
        mode: Mode::Max,
        trials: 8,
        seed: 1,
        output: "out/sweep-probe".into(),
        search: SearchConfig {
            algorithm: SearchAlgorithm::Random,
            startup_trials: None,
        },
        scheduler: SchedulerConfig {
            kind: TrialScheduler::Asha,
            max_epochs: 12,
            grace_epochs: 3,
            reduction_factor: 2,
            ..SchedulerConfig::default()
        },
        space: BTreeMap::from([
            ("lr".into(), ParamSpec::LogUniform([1e-4, 1e-1])),
            (
                "hidden".into(),
                ParamSpec::Choice(vec![0.into(), 128.into()]),
            ),
            ("dropout".into(), ParamSpec::Uniform([0.0, 0.3])),
        ]),
        text_field: "text".into(),
        label_field: Some("topic".into()),
        query_field: None,
        trials_per_actor: 2,
        gpus_per_actor: 0.0,
        vram_gib: 2.0,
        cache: None,
        s3_endpoint: None,
        selector: BTreeMap::new(),
        keep_pool: false,
        idle_ttl: None,
        prices: Default::default(),
    };
    let cluster = Cluster::local(LocalConfig::default()).await?;
    let summary = run_sweep(&cluster, &config, &mut |_| {}).await?;
    print!(
        "{}",
        format_table(&load_results(config.output.as_ref()), &summary)
    );
    println!(
        "{} trials, {} model loads",
        summary.trials, summary.model_loads
    );
    Ok(())
}
