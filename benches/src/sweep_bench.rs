//! A 32-trial sweep on resident actors against the same trials where every trial loads the
//! model itself (Ray Tune's default, `reuse_actors` off): a fresh actor per trial that loads
//! the weights, embeds the data and trains. Also the middle ground, a fresh actor per trial
//! reading cached embeddings, to show the model load alone. Prints a markdown table.
//! `cargo run --release -p resident-bench --bin sweep-bench -- --limit 500`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use resident_jobs::sweep::data::{embed_into_cache, read_sweep_data};
use resident_jobs::sweep::driver::Segment;
use resident_jobs::sweep::runner::{DatasetRef, TRIAL_METHOD, publish_dataset, trial_payload};
use resident_jobs::sweep::{SweepConfig, generate_trials, load_results, run_sweep};
use resident_sdk::{Cluster, EmbedPoolSpec, LocalConfig, SubmitOptions};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    model: String,
    #[arg(long, default_value = "data/wiki_vital.jsonl")]
    data: String,
    /// Articles in the sweep's data.
    #[arg(long, default_value_t = 500)]
    limit: usize,
    #[arg(long, default_value_t = 32)]
    trials: u32,
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    #[arg(long, default_value_t = 10)]
    epochs: u32,
    #[arg(long, default_value = "out/sweep-bench")]
    out: PathBuf,
}

#[derive(Default)]
struct TrialTimes {
    load_s: f64,
    embed_s: f64,
    train_s: f64,
}

fn config(args: &Args, data: &Path, output: &Path) -> anyhow::Result<SweepConfig> {
    let toml = format!(
        "name = \"bench\"\nmodel = \"{}\"\nreplicas = {}\ntrial = \"classifier\"\ndata = \"{}\"\n\
         metric = \"accuracy\"\nmode = \"max\"\ntrials = {}\nseed = 7\noutput = \"{}\"\n\
         [scheduler]\nkind = \"fifo\"\nmax_epochs = {}\n[space]\nlr = {{ loguniform = [1e-4, 1e-1] }}\n\
         weight_decay = {{ loguniform = [1e-6, 1e-2] }}\nhidden = {{ choice = [0, 64, 256] }}\n",
        args.model,
        args.replicas,
        data.display(),
        args.trials,
        output.display(),
        args.epochs
    );
    Ok(SweepConfig::from_toml(&toml)?)
}

/// One trial the Ray Tune way: a fresh actor loads the model, (embeds the data,) trains.
async fn fresh_actor_trial(
    cluster: &Cluster,
    config: &SweepConfig,
    trial: usize,
    cached: Option<&DatasetRef>,
    scratch: &Path,
) -> anyhow::Result<TrialTimes> {
    let mut times = TrialTimes::default();
    let started = Instant::now();
    let spec = EmbedPoolSpec::new(format!("trial-{trial}-{}", cached.is_some()), &config.model);
    let pool = cluster
        .create_embed_pool(spec, Duration::from_secs(600))
        .await?;
    times.load_s = started.elapsed().as_secs_f64();
    let dataset = match cached {
        Some(dataset) => DatasetRef {
            uri: dataset.uri.clone(),
            key: format!("{}-{trial}", dataset.key), // never the actor's cached copy
            sha256: dataset.sha256.clone(),
        },
        None => {
            let embed_started = Instant::now();
            let data = read_sweep_data(config, &model_fingerprint(config).await?)?;
            let (path, _) =
                embed_into_cache(&pool, &data, &scratch.join(format!("trial-{trial}"))).await?;
            times.embed_s = embed_started.elapsed().as_secs_f64();
            let published =
                publish_dataset(config, &std::fs::canonicalize(path)?, &data.key).await?;
            DatasetRef {
                key: format!("{}-{trial}", data.key),
                ..published
            }
        }
    };
    let params = &generate_trials(
        &config.space,
        config.search.algorithm,
        config.trials,
        config.seed,
    )[trial];
    let segment = Segment {
        trial,
        start_epoch: 0,
        end_epoch: config.scheduler.max_epochs,
    };
    let train_started = Instant::now();
    let outputs = pool
        .pool
        .map_with(
            [trial_payload(config, &dataset, params, &segment, None)],
            SubmitOptions {
                method: TRIAL_METHOD.into(),
                ..SubmitOptions::default()
            },
        )
        .await?;
    outputs[0].output.clone().map_err(anyhow::Error::msg)?;
    times.train_s = train_started.elapsed().as_secs_f64();
    pool.pool.delete().await?;
    Ok(times)
}

async fn per_trial_loads(
    cluster: &Cluster,
    config: &SweepConfig,
    cached: Option<&DatasetRef>,
    scratch: &Path,
) -> anyhow::Result<(f64, Vec<TrialTimes>)> {
    let started = Instant::now();
    let results: Vec<anyhow::Result<TrialTimes>> = futures::stream::iter(0..config.trials as usize)
        .map(|trial| fresh_actor_trial(cluster, config, trial, cached, scratch))
        .buffer_unordered(config.replicas as usize)
        .collect()
        .await;
    let times = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok((started.elapsed().as_secs_f64(), times))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    resident_models::device::set_compute_threads(1);
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(&args.out);
    std::fs::create_dir_all(&args.out)?;
    let data = args.out.join("data.jsonl");
    let text = std::fs::read_to_string(&args.data)?;
    let lines: Vec<&str> = text.lines().take(args.limit).collect();
    std::fs::write(&data, lines.join("\n") + "\n")?;
    let cluster = Cluster::local(LocalConfig::default()).await?;

    let resident = config(&args, &data, &args.out.join("resident"))?;
    let started = Instant::now();
    let summary = run_sweep(&cluster, &resident, &mut |_| {}).await?;
    let resident_wall = started.elapsed().as_secs_f64();
    let trained: Vec<f64> = load_results(Path::new(&resident.output))
        .iter()
        .map(|r| r.train_s)
        .collect();
    let sweep_data = read_sweep_data(&resident, &model_fingerprint(&resident).await?)?;
    let cache =
        resident_jobs::sweep::data::cache_path(Path::new(&resident.output), &sweep_data.key);
    let cached =
        publish_dataset(&resident, &std::fs::canonicalize(cache)?, &sweep_data.key).await?;
    let scratch = args.out.join("baseline");
    let (reload_wall, reload) =
        per_trial_loads(&cluster, &resident, Some(&cached), &scratch).await?;
    let (full_wall, full) = per_trial_loads(&cluster, &resident, None, &scratch).await?;

    println!(
        "{} trials x {} epochs, classifier on {} Wikipedia articles ({}), {} actors, all-MiniLM-L6-v2, CPU\n",
        resident.trials,
        args.epochs,
        sweep_data.texts.len(),
        args.data,
        args.replicas
    );
    println!(
        "| mode | wall s | model loads | embedding passes | trial phase s | mean trial s | model load share of a trial | embedding share of a trial | wall vs resident |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let trial_phase = (summary.wall_s - summary.model_load_s - summary.embed_s).max(0.0);
    println!(
        "| resident actors (load once, embed once) | {resident_wall:.1} | {} | 1 | {trial_phase:.1} | {:.2} | - | - | 1.0x |",
        summary.model_loads,
        mean(&trained),
    );
    for (label, wall, times) in [
        (
            "fresh actor per trial, cached embeddings",
            reload_wall,
            &reload,
        ),
        (
            "fresh actor per trial, embeds itself (Tune default)",
            full_wall,
            &full,
        ),
    ] {
        let total: f64 = times.iter().map(|t| t.load_s + t.embed_s + t.train_s).sum();
        let load: f64 = times.iter().map(|t| t.load_s).sum();
        let embed: f64 = times.iter().map(|t| t.embed_s).sum();
        let passes = if embed > 0.0 { times.len() } else { 0 };
        println!(
            "| {label} | {wall:.1} | {} | {passes} | {wall:.1} | {:.2} | {:.0}% | {:.0}% | {:.1}x |",
            times.len(),
            total / times.len() as f64,
            100.0 * load / total,
            100.0 * embed / total,
            wall / resident_wall
        );
    }
    println!(
        "\nresident: model load {:.2} s, embedding {:.1} s, trials {trial_phase:.1} s; fresh actors with cached embeddings need {reload_wall:.1} s for the same trials ({:.1}x)",
        summary.model_load_s,
        summary.embed_s,
        reload_wall / trial_phase.max(1e-9)
    );
    Ok(())
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The fingerprint `run_sweep` keys its embedded-documents cache with.
async fn model_fingerprint(config: &SweepConfig) -> anyhow::Result<String> {
    let pinned = resident_jobs::model_pin::pin_model(&config.model, &Default::default())
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(pinned.fingerprint)
}
