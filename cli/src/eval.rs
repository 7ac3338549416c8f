//! `resident eval`: a suite of evaluation tasks on one model, each a `resident generate`
//! job written as that command's flags (`resident_jobs::eval_suite`), run one after another
//! on one cluster; tasks whose actors are the same share one pool, so the model loads once.
//! Writes each task's output under `--output DIR/NAME` (a directory or an S3 prefix), then
//! `DIR/results.json` (keeping an earlier run's results of the tasks `--only` left out) and
//! the results table. A rerun resumes each task (finished ones redo nothing).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser};
use resident_jobs::eval_output::write_results;
use resident_jobs::eval_suite::{EvalResults, EvalSuite, TaskResult, results_table, task_metrics};
use resident_jobs::pools::PoolRetention;
use resident_sdk::Cluster;
use resident_storage::Location;

use crate::exit::BadInput;
use crate::generate::GenerateArgs;

#[derive(Args)]
pub struct EvalArgs {
    /// The suite, a TOML file: `flags` (resident generate's flags every task takes; a
    /// task's own overrides one), then `[[task]]`s, each with a `name` and its own `flags`
    /// (`--input` and the rest). Each task runs as `resident generate` with those flags,
    /// --model and --output DIR/NAME.
    #[arg(long, env = "RESIDENT_EVAL_TASKS", value_name = "FILE")]
    tasks: PathBuf,
    /// The model every task runs (as resident generate's --model).
    #[arg(long, env = "RESIDENT_MODEL")]
    model: String,
    /// Where each task writes its output (DIR/NAME) and the suite its results.json: a
    /// directory or s3://bucket/prefix.
    #[arg(long, env = "RESIDENT_OUTPUT", value_name = "DIR")]
    output: String,
    /// Run only these tasks, in the suite's order (repeatable; in the variable,
    /// comma-separated). results.json keeps the earlier results of the others (of the
    /// same --model), so a suite run a few tasks at a time has one results.json.
    #[arg(
        long,
        env = "RESIDENT_EVAL_ONLY",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    only: Vec<String>,
}

/// A task's flags, parsed as `resident generate` parses them; a flag given again (the
/// task's after the suite's) overrides the first.
#[derive(Parser)]
#[command(name = "resident generate", args_override_self = true)]
struct TaskLine {
    #[command(flatten)]
    args: GenerateArgs,
}

impl EvalArgs {
    /// Whether the suite runs on a cluster in this process: no `--cluster` in its flags (a
    /// suite that does not parse is refused later, by `run`).
    pub fn is_local(&self) -> bool {
        let text = std::fs::read_to_string(&self.tasks).unwrap_or_default();
        let Ok(suite) = EvalSuite::parse(&text) else {
            return true;
        };
        let mut flags = suite
            .flags
            .iter()
            .chain(suite.tasks.iter().flat_map(|t| &t.flags));
        std::env::var_os("RESIDENT_CLUSTER").is_none()
            && !flags.any(|flag| flag.split('=').next() == Some("--cluster"))
    }
}

/// The tasks' parsed flags, checked to run on one cluster.
fn task_lines(args: &EvalArgs, suite: &EvalSuite) -> anyhow::Result<Vec<(String, GenerateArgs)>> {
    let mut lines = Vec::new();
    for task in suite.select(&args.only).map_err(BadInput)? {
        let line = suite.command_line(task, &args.model, &args.output);
        let parsed = TaskLine::try_parse_from(&line)
            .map_err(|e| BadInput(format!("task {:?}: {}", task.name, e.render())))?;
        lines.push((task.name.clone(), parsed.args));
    }
    let clusters: Vec<Option<&str>> = lines.iter().map(|(_, a)| a.corpus.cluster_url()).collect();
    if clusters.windows(2).any(|pair| pair[0] != pair[1]) {
        let why = "the tasks name different --cluster URLs: give --cluster once, in the \
                   suite's flags";
        return Err(BadInput(why.into()).into());
    }
    if lines.iter().any(|(_, a)| a.dry_run.is_some()) {
        let why = "--dry-run (or RESIDENT_DRY_RUN) is not for a suite: run resident generate \
                   with a task's flags to see its prompts";
        return Err(BadInput(why.into()).into());
    }
    Ok(lines)
}

pub async fn run(args: EvalArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.tasks)
        .with_context(|| format!("reading the suite {}", args.tasks.display()))
        .map_err(|e| BadInput(format!("{e:#}")))?;
    let suite = EvalSuite::parse(&text).map_err(BadInput)?;
    let output = Location::parse(&args.output).map_err(|e| BadInput(e.to_string()))?;
    let lines = task_lines(&args, &suite)?;
    let mut configs = Vec::new();
    for (name, line) in &lines {
        let config = line
            .job_config()
            .with_context(|| format!("task {name:?}"))?;
        // What no task of the suite can run with is refused before the first one runs.
        config.check().with_context(|| format!("task {name:?}"))?;
        configs.push(config);
    }
    let endpoints: Vec<&Option<String>> = configs.iter().map(|c| &c.corpus.s3.endpoint).collect();
    if output.is_s3() && endpoints.windows(2).any(|pair| pair[0] != pair[1]) {
        let why = "the tasks name different --s3-endpoint URLs, and their outputs all go \
                   under the suite's s3:// --output: give --s3-endpoint once, in the suite's \
                   flags";
        return Err(BadInput(why.into()).into());
    }
    let (_, first) = &lines[0];
    let cluster = first.corpus.cluster("eval", &mut configs[0].corpus).await?;
    let mut pools: BTreeMap<String, PoolRetention> = BTreeMap::new();
    let mut results = EvalResults {
        model: args.model.clone(),
        tasks: Vec::new(),
    };
    let suite_key = format!("eval|{}", args.output);
    let ran = run_tasks(
        &cluster,
        &lines,
        &mut configs,
        &suite_key,
        &mut pools,
        &mut results,
    )
    .await;
    for (pool, retention) in &pools {
        retention.job_ended(&cluster, pool).await;
    }
    ran?;
    let suite_names: Vec<&str> = suite.tasks.iter().map(|t| t.name.as_str()).collect();
    let merged = write_results(&output, &configs[0].corpus.s3, results, &suite_names)
        .await
        .context("writing results.json")?;
    if let Some(note) = merged.note() {
        eprintln!("{note}");
    }
    print!("{}", results_table(&merged.results));
    for note in merged
        .results
        .tasks
        .iter()
        .filter_map(TaskResult::cut_prompts_note)
    {
        eprintln!("{note}");
    }
    Ok(())
}

/// Runs each task in turn on `cluster`, its pool shared with the tasks before whose actors
/// are the same; `pools` gets each pool used with what should become of it at the end.
async fn run_tasks(
    cluster: &Cluster,
    lines: &[(String, GenerateArgs)],
    configs: &mut [resident_jobs::corpus_job::GenerateJobConfig],
    suite_key: &str,
    pools: &mut BTreeMap<String, PoolRetention>,
    results: &mut EvalResults,
) -> anyhow::Result<()> {
    for (index, ((name, line), config)) in lines.iter().zip(configs.iter_mut()).enumerate() {
        if index > 0 {
            config
                .corpus
                .choose_device(cluster, "--gpus-per-actor")
                .await?;
        }
        let retention = config.corpus.retention;
        config.share_pool(suite_key);
        let pool = config.pool_name();
        pools.entry(pool.clone()).or_insert(retention);
        eprintln!("task {name} ({} of {}):", index + 1, lines.len());
        let report = crate::generate::run_job(cluster, config, line)
            .await
            .with_context(|| format!("task {name:?}"))?;
        results.tasks.push(TaskResult {
            name: name.clone(),
            output: config.corpus.output.to_string(),
            pool,
            records: report.items,
            wall_seconds: report.wall_seconds,
            metrics: task_metrics(&report.figures),
            truncated_prompts: report.figures.tally.truncated_prompts,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every task of the README's suite is a `resident generate` line clap takes (a flag
    /// misspelt there would be refused when a reader runs it), and `--score-first-token`
    /// reaches wikitext's parameters.
    #[test]
    fn the_readme_s_suite_tasks_are_generate_lines() {
        let readme = include_str!("../../README.md");
        let section = readme.split("## `resident eval`").nth(1).unwrap();
        let block = section.split("```toml\n").nth(1).unwrap();
        let suite = EvalSuite::parse(block.split("```").next().unwrap()).unwrap();
        for task in &suite.tasks {
            let line = suite.command_line(task, "model.gguf", "out");
            if let Err(error) = TaskLine::try_parse_from(&line) {
                panic!("task {}: {}", task.name, error.render());
            }
        }
        let wikitext = (suite.tasks.iter()).find(|t| t.name == "wikitext").unwrap();
        let line = suite.command_line(wikitext, "model.gguf", "out");
        let args = TaskLine::try_parse_from(&line).unwrap().args;
        assert!(args.params().unwrap().score_first_token);
    }
}
