use anyhow::Context;
use clap::Args;
use resident_jobs::sweep::{
    SweepConfig, SweepEvent, SweepSummary, format_table, load_results, run_sweep,
};
use resident_sdk::{Cluster, LocalConfig};

#[derive(Args)]
pub struct SweepArgs {
    /// The sweep's TOML declaration (name, model, trial, data, metric, space, ...).
    #[arg(long, env = "RESIDENT_SWEEP_CONFIG")]
    config: std::path::PathBuf,
    /// Scheduler URL; without it a local cluster runs in this process. Agents fetch the
    /// embedded dataset from --cache, else read it from the output directory (which they
    /// must then share with this machine).
    #[arg(long, env = "RESIDENT_CLUSTER")]
    cluster: Option<String>,
    #[command(flatten)]
    credentials: crate::credentials::CredentialArgs,
    #[command(flatten)]
    reconnect: crate::credentials::ReconnectArgs,
    #[command(flatten)]
    pool: crate::pool_args::PoolRetentionArgs,
    #[command(flatten)]
    price: crate::pool_args::PriceArgs,
    /// Overrides the config's `output`.
    #[arg(long, env = "RESIDENT_OUTPUT")]
    output: Option<String>,
    /// Where agents fetch the embedded dataset, `s3://bucket/prefix/` (overrides the
    /// config's `cache`): no filesystem shared between this machine and the agents.
    #[arg(long, env = "RESIDENT_SWEEP_CACHE")]
    cache: Option<String>,
    /// An S3-compatible endpoint for --cache and s3:// models (MinIO, Ceph); default AWS.
    #[arg(long, env = "RESIDENT_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
}

impl SweepArgs {
    /// Whether the sweep runs on a cluster in this process.
    pub fn is_local(&self) -> bool {
        self.cluster.is_none()
    }
}

pub async fn run(args: SweepArgs) -> anyhow::Result<()> {
    let config = sweep_config(&args)?;
    let cluster = match &args.cluster {
        Some(url) => args
            .credentials
            .connect(url)
            .await?
            .with_reconnect_timeout(args.reconnect.reconnect_timeout),
        None => {
            let mut local = LocalConfig::default();
            local.models.s3.endpoint = config.s3_endpoint.clone();
            Cluster::local(local).await?
        }
    };
    let mut shown = SweepShown::new(&config);
    let summary = run_sweep(&cluster, &config, &mut |event| shown.event(event)).await?;
    print_summary(&config, &summary)
}

/// The sweep's TOML declaration with the command line's overrides.
fn sweep_config(args: &SweepArgs) -> anyhow::Result<SweepConfig> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("cannot read {}", args.config.display()))?;
    let mut config = SweepConfig::from_toml(&text)?;
    if let Some(output) = &args.output {
        config.output = output.clone();
    }
    if let Some(cache) = &args.cache {
        config.cache = Some(cache.clone());
    }
    if let Some(endpoint) = &args.s3_endpoint {
        config.s3_endpoint = Some(endpoint.clone());
    }
    config.prices = args.price.prices()?;
    config.keep_pool |= args.pool.keep_pool;
    if args.pool.idle_ttl.is_some() {
        config.idle_ttl = args.pool.idle_ttl;
    }
    Ok(config)
}

/// How a running sweep shows itself: a bar on a terminal (trials done, best so far, ETA), a
/// log line per trial otherwise.
struct SweepShown {
    started: std::time::Instant,
    progress: crate::sweep_progress::SweepProgress,
    bar: Option<indicatif::ProgressBar>,
    metric_name: String,
}

impl SweepShown {
    fn new(config: &SweepConfig) -> Self {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {msg}").expect("valid template"),
            );
            bar
        });
        Self {
            started: std::time::Instant::now(),
            progress: crate::sweep_progress::SweepProgress::new(
                config.mode == resident_jobs::sweep::Mode::Max,
            ),
            bar,
            metric_name: config.metric.clone(),
        }
    }

    fn event(&mut self, event: SweepEvent<'_>) {
        match event {
            SweepEvent::DataReady {
                examples,
                cache_hit,
            } => {
                tracing::info!(examples, cache_hit, "sweep data embedded")
            }
            SweepEvent::TrialsPlanned { total, resumed } => {
                self.progress.planned(total, resumed);
                if let Some(bar) = &self.bar {
                    bar.set_length(total as u64);
                    bar.set_position(self.progress.done() as u64);
                }
                tracing::info!(total, resumed = resumed.len(), "trials planned");
            }
            SweepEvent::PbtRound {
                epoch,
                members,
                copies,
                best_metric,
            } => {
                let line = format!(
                    "PBT round at epoch {epoch}: {copies} of {members} trials copied a better one, best {} {:.4}",
                    self.metric_name,
                    best_metric.unwrap_or(f64::NAN)
                );
                match &self.bar {
                    Some(bar) => bar.set_message(line),
                    None => tracing::info!(epoch, members, copies, best_metric, "{line}"),
                }
            }
            SweepEvent::PopulationResumed { epoch, members } => tracing::info!(
                epoch,
                members,
                "PBT: resumed the population saved at this epoch"
            ),
            SweepEvent::TrialFinished(result) => {
                self.progress.finished(result);
                let line = self
                    .progress
                    .line(self.started.elapsed(), &self.metric_name);
                match &self.bar {
                    Some(bar) => {
                        bar.set_position(self.progress.done() as u64);
                        bar.set_message(line);
                        if self.progress.done() >= self.progress.total() {
                            bar.finish_and_clear();
                        }
                    }
                    None => tracing::info!(
                        trial = result.trial_id,
                        metric = result.metric,
                        epochs = result.epochs,
                        stopped_early = result.stopped_early,
                        error = result.error.as_deref().unwrap_or(""),
                        progress = %line,
                        "trial finished"
                    ),
                }
            }
        }
    }
}

/// Prints the results table and the best trial, says what the sweep did, and fails when a
/// trial failed.
fn print_summary(config: &SweepConfig, summary: &SweepSummary) -> anyhow::Result<()> {
    let output = std::path::Path::new(&config.output);
    print!("{}", format_table(&load_results(output), summary));
    match (
        &summary.best_trial,
        &summary.best_params,
        summary.best_metric,
    ) {
        (Some(trial), Some(params), Some(metric)) => println!(
            "best: trial {trial}, {} = {metric:.4}, params {}",
            summary.metric_name,
            serde_json::to_string(params)?
        ),
        _ => println!("no trial finished"),
    }
    if !summary.best_policy.is_empty() {
        println!("best policy (PBT: the hyperparameters that trained its weights, by epoch):");
        for step in &summary.best_policy {
            println!(
                "  epochs {}-{}: trial {} {}",
                step.start_epoch + 1,
                step.end_epoch,
                step.trial,
                serde_json::to_string(&step.params)?
            );
        }
    }
    if let Some(head) = &summary.best_head {
        println!(
            "best head: {} (its weights as safetensors; the metadata names the model, the classes and how to apply them)",
            output.join(head).display()
        );
    }
    if summary.resumed_from_epoch > 0 {
        eprintln!(
            "PBT resumed the population saved after epoch {}",
            summary.resumed_from_epoch
        );
    }
    eprintln!(
        "{} trials by {} search ({} stopped early, {} failed, {} from an earlier run) in {:.1} s on {} actors with {} model loads, {:.3} GPU-hours and {:.3} CPU core-hours (~${:.2}); results: {}",
        summary.trials,
        config.search.algorithm.name(),
        summary.stopped_early,
        summary.failed,
        summary.resumed_trials,
        summary.wall_s,
        summary.actors,
        summary.model_loads,
        summary.gpu_hours,
        summary.cpu_hours,
        summary.estimated_cost_usd,
        output.join("results.jsonl").display()
    );
    if summary.failed > 0 {
        return Err(crate::exit::FinishedWithFailures(format!(
            "{} of {} trials failed (their errors are in {})",
            summary.failed,
            summary.trials,
            output.join("results.jsonl").display()
        ))
        .into());
    }
    Ok(())
}
