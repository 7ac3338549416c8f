//! `resident eval` (pure): a suite of evaluation tasks run on one model, as
//! lm-evaluation-harness runs `--tasks a,b,c`. Each task is a `resident generate` job
//! written as that command's own flags (a suite-wide list first, then the task's), so a
//! task runs exactly as the same `resident generate` line would; the suite adds only the
//! model and each task's output directory. This module reads the suite, writes each task's
//! command line, turns the tasks' reports into the results table, and keeps an earlier
//! run's results of the tasks a run left out (`eval_output` reads and writes them).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::corpus_job::{GenerateFigures, OverlapMetric};
use crate::serde_skip::is_default;

/// A suite file (TOML): `flags` every task takes, then `[[task]]`s with a `name` and their
/// own `flags`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSuite {
    /// `resident generate` flags every task takes, before its own (`--template none`,
    /// `--cluster URL`, `--replicas 2`).
    #[serde(default)]
    pub flags: Vec<String>,
    /// The tasks, run in order.
    #[serde(rename = "task")]
    pub tasks: Vec<EvalTask>,
}

/// One task: a name (its output directory and its rows in the results) and its flags.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalTask {
    /// Letters, digits, `-`, `_` and `.`.
    pub name: String,
    /// Its `resident generate` flags: `--input` and whatever else it needs.
    pub flags: Vec<String>,
}

/// Flags the suite gives every task itself: in a task's flags they are refused.
const SUITE_FLAGS: [(&str, &str); 3] = [
    (
        "--model",
        "give it to `resident eval --model`: one model for the whole suite",
    ),
    (
        "--output",
        "each task writes under `resident eval --output DIR`, in DIR/NAME",
    ),
    (
        "--dry-run",
        "run `resident generate` with the task's flags to see its prompts",
    ),
];

impl EvalSuite {
    /// The suite in `text`, checked: at least one task, names a directory can take and no
    /// two alike, no flag the suite gives itself.
    pub fn parse(text: &str) -> Result<Self, String> {
        let suite: Self = toml::from_str(text).map_err(|e| format!("the suite: {e}"))?;
        check_task_names(suite.tasks.iter().map(|t| t.name.as_str()))?;
        let every = (suite.flags.iter().map(|f| (None, f)))
            .chain((suite.tasks.iter()).flat_map(|t| t.flags.iter().map(|f| (Some(&t.name), f))));
        for (task, flag) in every {
            let name = flag.split('=').next().unwrap_or_default();
            if let Some((flag, why)) = SUITE_FLAGS.iter().find(|(owned, _)| *owned == name) {
                let place = match task {
                    None => "the suite's flags".to_owned(),
                    Some(task) => format!("task {task:?}"),
                };
                return Err(format!("{place} give {flag}: {why}"));
            }
        }
        Ok(suite)
    }

    /// The tasks named in `only` (all when empty), in the suite's order; a name the suite
    /// lacks is refused, naming those it has.
    pub fn select(&self, only: &[String]) -> Result<Vec<&EvalTask>, String> {
        let names: Vec<&str> = self.tasks.iter().map(|t| t.name.as_str()).collect();
        let selected = select_tasks(&names, only)?;
        Ok((self.tasks.iter())
            .filter(|task| selected.contains(&task.name.as_str()))
            .collect())
    }

    /// `task`'s `resident generate` command line (the program name first): the suite's
    /// flags, the task's, the model and the task's output under `output`.
    pub fn command_line(&self, task: &EvalTask, model: &str, output: &str) -> Vec<String> {
        let output = format!("{}/{}", output.trim_end_matches('/'), task.name);
        let suite = ["resident generate".to_owned()].into_iter();
        (suite
            .chain(self.flags.iter().cloned())
            .chain(task.flags.iter().cloned()))
        .chain(["--model".into(), model.into(), "--output".into(), output])
        .collect()
    }
}

/// Refuses a suite without tasks, a task name that is not a directory name, and two tasks
/// of one name (the CLI's suite file and Python's `Cluster.eval` alike).
pub fn check_task_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for name in names {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if name.is_empty() || !name.chars().all(allowed) || name.starts_with('.') {
            return Err(format!(
                "task name {name:?} is not letters, digits, '-', '_' and '.': it names the \
                 task's output directory"
            ));
        }
        if !seen.insert(name) {
            return Err(format!("two tasks are named {name:?}: name each apart"));
        }
    }
    match seen.is_empty() {
        true => Err("the suite has no [[task]]: add one with a name and its flags".into()),
        false => Ok(()),
    }
}

/// Of the tasks `names`, those `only` names (all when it is empty), in their order; a name
/// they lack is refused, naming those there are.
pub fn select_tasks<'a>(names: &[&'a str], only: &[String]) -> Result<Vec<&'a str>, String> {
    if let Some(unknown) = only.iter().find(|name| !names.contains(&name.as_str())) {
        return Err(format!(
            "the suite has no task {unknown:?}: it has {}",
            names.join(", ")
        ));
    }
    Ok((names.iter().copied())
        .filter(|name| only.is_empty() || only.iter().any(|o| o == name))
        .collect())
}

/// One figure of a task, as the results table shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskMetric {
    /// lm-evaluation-harness's name where it has one: `acc`, `acc_norm`, `exact_match`,
    /// `exact_match,FILTER`, `rouge1`, `rouge2`, `rougeL`, `rougeLsum`, `f1` (each with
    /// `,FILTER` too), `perplexity` (per text), `word_perplexity`,
    /// `byte_perplexity`, `bits_per_byte`; and `token_perplexity`.
    pub metric: String,
    /// Its value.
    pub value: f64,
    /// Its standard error, where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<f64>,
    /// The records it counts.
    pub records: u64,
}

/// A task's figures, in the results' order: accuracy (plain, per character, the mean over
/// groups; the right choices' probability for several right answers), exact match (the
/// one filter's, or each named filter's, with pass@n and maj@n); for scored texts, as
/// lm-evaluation-harness reports its two kinds of task: after a context (`loglikelihood`,
/// LAMBADA) the share written greedily (`acc`, unless choices gave one) and the perplexity
/// per text, alone (`loglikelihood_rolling`, wikitext) the perplexity per word and byte
/// and the bits per byte of the texts scored whole; then the perplexity per token.
/// Only the perplexity per text has a standard error (lm-evaluation-harness bootstraps
/// one for LAMBADA's; ours is the delta method's).
pub fn task_metrics(figures: &GenerateFigures) -> Vec<TaskMetric> {
    let mut rows = Rows::default();
    accuracy_rows(&mut rows, figures);
    answer_rows(&mut rows, figures);
    scored_text_rows(&mut rows, figures);
    rows.0
}

/// The rows of a task's figures, in order: a figure the report lacks has none.
#[derive(Default)]
struct Rows(Vec<TaskMetric>);

impl Rows {
    fn put(
        &mut self,
        metric: impl Into<String>,
        value: Option<f64>,
        stderr: Option<f64>,
        records: u64,
    ) {
        if let Some(value) = value {
            self.0.push(TaskMetric {
                metric: metric.into(),
                value,
                stderr,
                records,
            });
        }
    }
}

/// The accuracy over scored choices: plain, per character, the mean over groups, then the
/// Brier score (`brier_score`, lower is better); for a task of several right answers
/// (TruthfulQA's MC2), as lm-evaluation-harness reports it, only `acc`, the right choices'
/// probability among all.
fn accuracy_rows(rows: &mut Rows, figures: &GenerateFigures) {
    let answered = figures.tally.evaluation.answered_records;
    if figures.tally.evaluation.several_answer_records > 0 {
        let (probability, stderr) = (
            figures.answer_probability,
            figures.answer_probability_stderr,
        );
        let records = figures
            .tally
            .evaluation
            .probabilities
            .answer_probability_records;
        rows.put("acc", probability, stderr, records);
        if let Some(by) = &figures.accuracy_by_group {
            let groups = by.groups.values();
            let records = groups.map(|g| g.counts.probabilities.answer_probability_records);
            let records = records.sum();
            let metric = format!("mean_acc,by {}", by.field);
            let stderr = by.mean_answer_probability_stderr;
            rows.put(metric, by.mean_answer_probability, stderr, records);
        }
        return;
    }
    rows.put("acc", figures.accuracy, figures.accuracy_stderr, answered);
    let normalized = figures.accuracy_normalized_stderr;
    rows.put(
        "acc_norm",
        figures.accuracy_normalized,
        normalized,
        answered,
    );
    if let Some(by) = &figures.accuracy_by_group {
        let records = by.groups.values().map(|g| g.counts.answered_records).sum();
        let metric = format!("mean_acc,by {}", by.field);
        rows.put(
            metric,
            Some(by.mean_accuracy),
            by.mean_accuracy_stderr,
            records,
        );
    }
    let brier_records = figures.tally.evaluation.probabilities.brier_records;
    rows.put(
        "brier_score",
        figures.brier_score,
        figures.brier_score_stderr,
        brier_records,
    );
}

/// Exact match, pass@n, maj@n and the overlap figures asked for (`rouge1`, ..., `f1`): the
/// one filter's, or each named filter's.
fn answer_rows(rows: &mut Rows, figures: &GenerateFigures) {
    let counts = &figures.tally.evaluation;
    let filters =
        (figures.filters.iter()).map(|(name, f)| (format!(",{name}"), &f.counts, &f.shares));
    let single = std::iter::once((String::new(), &counts.answers, &figures.answers));
    let answers: Vec<_> = match figures.filters.is_empty() {
        true => single.collect(),
        false => filters.collect(),
    };
    for (suffix, counts, shares) in answers {
        let (references, sampled) = (counts.reference_records, counts.sampled_reference_records);
        let (exact, any, majority) = (
            shares.exact_match_stderr,
            shares.exact_match_any_stderr,
            shares.exact_match_majority_stderr,
        );
        rows.put(
            format!("exact_match{suffix}"),
            shares.exact_match,
            exact,
            references,
        );
        rows.put(
            format!("pass@n{suffix}"),
            shares.exact_match_any,
            any,
            sampled,
        );
        rows.put(
            format!("maj@n{suffix}"),
            shares.exact_match_majority,
            majority,
            sampled,
        );
        for metric in OverlapMetric::ALL {
            let mean = counts.overlap_sums.mean(metric);
            let records = counts.overlap_sums.records(metric);
            let (value, stderr) = (mean.map(|(m, _)| m), mean.and_then(|(_, se)| se));
            rows.put(format!("{}{suffix}", metric.name()), value, stderr, records);
        }
    }
}

/// Scored texts' figures, as lm-evaluation-harness reports its two kinds of task: after a
/// context LAMBADA's (`acc`, unless choices gave one, and the perplexity per text), alone
/// wikitext's (per word and byte, bits per byte); then the perplexity per token.
fn scored_text_rows(rows: &mut Rows, figures: &GenerateFigures) {
    let counts = &figures.tally.evaluation;
    let texts = counts.scored_texts;
    if figures.scored_after_context {
        if counts.answered_records == 0 {
            let stderr = figures.greedy_share_stderr;
            rows.put("acc", figures.greedy_share, stderr, texts);
        }
        let stderr = figures.text_perplexity_stderr;
        rows.put("perplexity", figures.text_perplexity, stderr, texts);
    } else {
        let whole = counts.whole_scored_texts;
        rows.put("word_perplexity", figures.word_perplexity, None, whole);
        rows.put("byte_perplexity", figures.byte_perplexity, None, whole);
        rows.put("bits_per_byte", figures.bits_per_byte, None, whole);
    }
    let per_token = figures.scored_perplexity;
    rows.put("token_perplexity", per_token, None, texts);
}

/// `results.json`: the suite's model and each task's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalResults {
    /// The model every task ran.
    pub model: String,
    /// The tasks, in the suite's order: this run's, and the earlier results of those an
    /// `--only` run left out.
    pub tasks: Vec<TaskResult>,
}

/// One task's row group of the results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// Its name.
    pub name: String,
    /// Its output directory (generations.jsonl, report.json).
    pub output: String,
    /// The pool it ran on: tasks whose actors are the same share one, the model loaded
    /// once.
    pub pool: String,
    /// Its records.
    pub records: u64,
    /// Its whole job's seconds (this run's).
    pub wall_seconds: f64,
    /// Its figures.
    pub metrics: Vec<TaskMetric>,
    /// Its prompts cut to fit the context (their lines say `truncated`): its figures are
    /// over cut prompts (absent when none was).
    #[serde(default, skip_serializing_if = "is_default")]
    pub truncated_prompts: u64,
}

impl TaskResult {
    /// What to say of the task when some of its prompts were cut to fit the context.
    pub fn cut_prompts_note(&self) -> Option<String> {
        (self.truncated_prompts > 0).then(|| {
            format!(
                "task {}: {} of its {} prompts were cut to fit the context (their lines in \
                 {}/generations.jsonl, or rows of generations.parquet, say \"truncated\"), so \
                 its figures are over cut prompts; a larger --max-context (up to the model's), fewer --fewshot \
                 examples or a shorter --prompt reads them whole",
                self.name,
                self.truncated_prompts,
                self.records,
                self.output.trim_end_matches('/'),
            )
        })
    }
}

/// [`EvalResults`] as written over an earlier `results.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct MergedResults {
    /// This run's tasks and the earlier results of the suite's tasks it did not run (an
    /// `--only` run), in the suite's order.
    pub results: EvalResults,
    /// The tasks whose earlier results were kept, in the suite's order.
    pub kept: Vec<String>,
    /// The earlier results' model, when it was another: none of them kept.
    pub other_model: Option<String>,
}

impl EvalResults {
    /// This run's results with `earlier`'s of the suite's other tasks (`suite`: every
    /// task's name, in order), so that running a suite's tasks a few at a time (`--only`)
    /// leaves one `results.json` of all of them, as a whole run would. Only results of
    /// the same model and of tasks still in the suite are kept; a task run now replaces
    /// its earlier results.
    pub fn over_earlier(self, earlier: Option<EvalResults>, suite: &[&str]) -> MergedResults {
        let mut other_model = None;
        let mut earlier_tasks = Vec::new();
        if let Some(earlier) = earlier {
            if earlier.model == self.model {
                earlier_tasks = earlier.tasks;
            } else if !earlier.tasks.is_empty() {
                other_model = Some(earlier.model);
            }
        }
        let ran: BTreeSet<String> = self.tasks.iter().map(|t| t.name.clone()).collect();
        earlier_tasks.retain(|t| suite.contains(&t.name.as_str()) && !ran.contains(&t.name));
        let mut tasks: Vec<TaskResult> = self.tasks.into_iter().chain(earlier_tasks).collect();
        let place = |name: &str| suite.iter().position(|n| *n == name);
        tasks.sort_by_key(|task| place(&task.name));
        let kept = (tasks.iter())
            .filter(|task| !ran.contains(&task.name))
            .map(|task| task.name.clone())
            .collect();
        MergedResults {
            results: EvalResults {
                model: self.model,
                tasks,
            },
            kept,
            other_model,
        }
    }
}

impl MergedResults {
    /// What the user is told of the earlier results (none when there were none to keep
    /// or drop).
    pub fn note(&self) -> Option<String> {
        if let Some(model) = &self.other_model {
            return Some(format!(
                "results.json held results of another model ({model}): written over with \
                 this run's"
            ));
        }
        (!self.kept.is_empty()).then(|| {
            format!(
                "results.json keeps the earlier results of {} (not run this time)",
                self.kept.join(", ")
            )
        })
    }
}

/// The results as a Markdown table: a row per task and figure (a task without figures, a
/// row saying so).
pub fn results_table(results: &EvalResults) -> String {
    let mut table = String::from("| task | metric | value | ± stderr | records |\n");
    table.push_str("|---|---|---:|---:|---:|\n");
    for task in &results.tasks {
        if task.metrics.is_empty() {
            let row = format!(
                "| {} | (no references or choices) | | | {} |\n",
                task.name, task.records
            );
            table.push_str(&row);
        }
        for metric in &task.metrics {
            let stderr = metric.stderr.map(|e| format!("{e:.4}")).unwrap_or_default();
            table.push_str(&format!(
                "| {} | {} | {:.4} | {stderr} | {} |\n",
                task.name, metric.metric, metric.value, metric.records
            ));
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUITE: &str = r#"
flags = ["--template", "none", "--max-new-tokens", "0"]

[[task]]
name = "arc_easy"
flags = ["--input", "arc.jsonl", "--score"]

[[task]]
name = "gsm8k"
flags = ["--input", "gsm8k.jsonl", "--reference-field", "answer"]
"#;

    #[test]
    fn a_suite_gives_each_task_its_generate_command_line() {
        let suite = EvalSuite::parse(SUITE).unwrap();
        let tasks = suite.select(&[]).unwrap();
        assert_eq!(tasks.len(), 2);
        let line = suite.command_line(tasks[1], "m.gguf", "out/");
        assert_eq!(
            line,
            [
                "resident generate",
                "--template",
                "none",
                "--max-new-tokens",
                "0",
                "--input",
                "gsm8k.jsonl",
                "--reference-field",
                "answer",
                "--model",
                "m.gguf",
                "--output",
                "out/gsm8k"
            ]
        );
        let only = suite.select(&["gsm8k".into()]).unwrap();
        assert_eq!(only[0].name, "gsm8k");
        let error = suite.select(&["mmlu".into()]).unwrap_err();
        assert_eq!(
            error,
            "the suite has no task \"mmlu\": it has arc_easy, gsm8k"
        );
    }

    /// The README's suite is one `resident eval` takes, its GSM8K and BIG-Bench Hard
    /// filters ones the answer checks compile and judge as lm-evaluation-harness does.
    #[test]
    fn the_readme_s_suite_parses_and_its_filters_compile() {
        let readme = include_str!("../../README.md");
        let section = readme.split("## `resident eval`").nth(1).unwrap();
        let block = section.split("```toml\n").nth(1).unwrap();
        let suite = EvalSuite::parse(block.split("```").next().unwrap()).unwrap();
        let names: Vec<&str> = suite.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "mmlu",
                "mmlu-chat",
                "gsm8k",
                "bbh-date",
                "arc-challenge",
                "winogrande",
                "truthfulqa-mc2",
                "lambada",
                "cnn-dailymail",
                "wikitext"
            ]
        );
        let flags_of = |name: &str| &(suite.tasks.iter().find(|t| t.name == name)).unwrap().flags;
        assert!(flags_of("mmlu-chat").contains(&"--fewshot-as-multiturn".to_owned()));
        let flags = flags_of("gsm8k");
        let filters: Vec<crate::corpus_job::FilterSpec> = (flags.windows(2))
            .filter(|pair| pair[0] == "--filter")
            .map(|pair| pair[1].parse().unwrap())
            .collect();
        assert_eq!(filters[0].pattern, r"#### (\-?[0-9\.\,]+)");
        let ignore = (flags.windows(2))
            .filter(|pair| pair[0] == "--ignore-regex")
            .map(|pair| pair[1].clone())
            .collect();
        let spec = crate::corpus_job::AnswerMatchSpec {
            reference_field: Some("answer".into()),
            filters,
            ignore,
            ignore_case: true,
            ..Default::default()
        };
        let check = crate::corpus_job::AnswerMatch::new(spec).unwrap();
        let judged = check.judge_record(&["so 9 * 2 = $18.\n#### 18"], &["#### 18".into()]);
        assert_eq!(judged[0].samples[0].correct, Some(true));
        assert_eq!(judged[1].samples[0].correct, Some(true));
        // BIG-Bench Hard's filter looks around: what follows "the answer is ", less the
        // full stop.
        let flags = flags_of("bbh-date");
        let at = flags.iter().position(|flag| flag == "--filter").unwrap();
        let bbh = crate::corpus_job::AnswerMatch::new(crate::corpus_job::AnswerMatchSpec {
            reference_field: Some("target".into()),
            filters: vec![flags[at + 1].parse().unwrap()],
            ..Default::default()
        })
        .unwrap();
        let worked = "Yesterday was 12/31/1929, so today is 01/01/1930. So the answer is (B).";
        let judged = bbh.judge_record(&[worked], &["(B)".into()]);
        assert_eq!(judged[0].samples[0].extracted.as_deref(), Some("(B)"));
        assert_eq!(judged[0].samples[0].correct, Some(true));
    }

    #[test]
    fn suites_that_cannot_run_are_refused_saying_what_to_do() {
        let refused = |text: &str| EvalSuite::parse(text).unwrap_err();
        assert!(refused("flags = []").contains("missing field `task`"));
        assert!(refused("task = []").contains("has no [[task]]"));
        let task =
            |name: &str, flags: &str| format!("[[task]]\nname = {name:?}\nflags = [{flags}]\n");
        let twice = format!("{}{}", task("a", ""), task("a", ""));
        assert_eq!(
            refused(&twice),
            "two tasks are named \"a\": name each apart"
        );
        assert!(refused(&task("../up", "")).contains("names the task's output directory"));
        let model = refused(&task("a", r#""--model", "x""#));
        assert_eq!(
            model,
            "task \"a\" give --model: give it to `resident eval --model`: one model for the \
             whole suite"
        );
        let output = refused(&format!("flags = [\"--output=x\"]\n{}", task("a", "")));
        assert!(
            output.starts_with("the suite's flags give --output"),
            "{output}"
        );
        assert!(refused(&format!("tasks = 1\n{}", task("a", ""))).contains("unknown field"));
    }

    /// Accuracy plain and per character, each with its error; a task of several right
    /// answers, their probability as `acc` instead.
    #[test]
    fn each_figure_of_a_report_is_a_row_with_its_error() {
        let figures: GenerateFigures = serde_json::from_value(serde_json::json!({
            "prompt_tokens": 10, "generated_tokens": 0, "truncated_prompts": 0,
            "finished_by_stop": 0, "finished_by_length": 0,
            "prompt_tokens_per_second": 1.0, "generated_tokens_per_second": 0.0,
            "answered_records": 4, "correct_records": 3, "correct_normalized_records": 2,
            "accuracy": 0.75, "accuracy_normalized": 0.5, "accuracy_stderr": 0.25,
            "accuracy_normalized_stderr": 0.2887, "brier_records": 4, "brier_score": 0.3,
            "brier_score_stderr": 0.05,
        }))
        .unwrap();
        let metrics = task_metrics(&figures);
        let names: Vec<&str> = metrics.iter().map(|m| m.metric.as_str()).collect();
        assert_eq!(names, ["acc", "acc_norm", "brier_score"]);
        assert_eq!(
            (metrics[0].value, metrics[0].stderr, metrics[0].records),
            (0.75, Some(0.25), 4)
        );
        assert_eq!(
            (metrics[2].value, metrics[2].stderr, metrics[2].records),
            (0.3, Some(0.05), 4)
        );
        // TruthfulQA's MC2: several right answers; `acc` is their probability, alone.
        let mut mc2 = figures.clone();
        mc2.tally.evaluation.several_answer_records = 3;
        mc2.tally
            .evaluation
            .probabilities
            .answer_probability_records = 4;
        (mc2.answer_probability, mc2.answer_probability_stderr) = (Some(0.4), Some(0.1));
        assert_eq!(
            task_metrics(&mc2),
            [TaskMetric {
                metric: "acc".into(),
                value: 0.4,
                stderr: Some(0.1),
                records: 4
            }]
        );
        // By group, the mean of the groups' probabilities beside it.
        mc2.accuracy_by_group = Some(
            serde_json::from_value(serde_json::json!({
                "field": "category", "mean_accuracy": 0.5, "mean_answer_probability": 0.6,
                "mean_answer_probability_stderr": 0.1, "groups": {
                    "law": {"answered_records": 2, "correct_records": 0, "accuracy": 0.0,
                            "answer_probability_records": 2},
                    "health": {"answered_records": 1, "correct_records": 1, "accuracy": 1.0,
                               "answer_probability_records": 1},
                },
            }))
            .unwrap(),
        );
        let by_group = task_metrics(&mc2);
        assert_eq!(
            by_group[1],
            TaskMetric {
                metric: "mean_acc,by category".into(),
                value: 0.6,
                stderr: Some(0.1),
                records: 3
            }
        );
        let results = EvalResults {
            model: "m".into(),
            tasks: vec![
                TaskResult {
                    name: "arc".into(),
                    output: "out/arc".into(),
                    pool: "generate-1".into(),
                    records: 4,
                    wall_seconds: 1.0,
                    metrics,
                    truncated_prompts: 0,
                },
                TaskResult {
                    name: "summaries".into(),
                    output: "out/summaries".into(),
                    pool: "generate-1".into(),
                    records: 9,
                    wall_seconds: 1.0,
                    metrics: Vec::new(),
                    truncated_prompts: 2,
                },
            ],
        };
        let table = results_table(&results);
        assert_eq!(results.tasks[0].cut_prompts_note(), None);
        let note = results.tasks[1].cut_prompts_note().unwrap();
        assert!(
            note.starts_with("task summaries: 2 of its 9 prompts were cut to fit the context")
                && note.contains("out/summaries/generations.jsonl"),
            "{note}"
        );
        let written = serde_json::to_value(&results).unwrap();
        assert!(written["tasks"][0].get("truncated_prompts").is_none());
        assert_eq!(written["tasks"][1]["truncated_prompts"], 2);
        assert!(
            table.contains("| arc | acc | 0.7500 | 0.2500 | 4 |\n"),
            "{table}"
        );
        assert!(
            table.contains("| summaries | (no references or choices) | | | 9 |"),
            "{table}"
        );
    }

    /// A summarising or reading-comprehension task's overlap figures (`--metric`) follow
    /// its exact match, with their errors and the records they count, for the job's one
    /// filter or each named one.
    #[test]
    fn overlap_figures_are_rows_after_exact_match() {
        let figures: GenerateFigures = serde_json::from_value(serde_json::json!({
            "prompt_tokens": 10, "generated_tokens": 8, "truncated_prompts": 0,
            "finished_by_stop": 2, "finished_by_length": 0,
            "prompt_tokens_per_second": 1.0, "generated_tokens_per_second": 1.0,
            "reference_records": 2, "exact_match_records": 1, "exact_match": 0.5,
            "exact_match_stderr": 0.5,
            "overlap_sums": {"means": {"rouge1": {"records": 2, "sum": 1.0, "squares": 0.625},
                                       "f1": {"records": 2, "sum": 1.5, "squares": 1.25}},
                             "chrf": {"records": 2, "orders": [[4, 4, 2], [0, 0, 0], [0, 0, 0],
                                                               [0, 0, 0], [0, 0, 0], [0, 0, 0]]}},
        }))
        .unwrap();
        let metrics = task_metrics(&figures);
        let rows: Vec<(&str, f64, Option<f64>, u64)> = (metrics.iter())
            .map(|m| (m.metric.as_str(), m.value, m.stderr, m.records))
            .collect();
        assert_eq!(
            rows,
            [
                ("exact_match", 0.5, Some(0.5), 2),
                ("rouge1", 0.5, Some(0.25), 2),
                ("f1", 0.75, Some(0.25), 2),
                ("chrf", 50.0, None, 2)
            ]
        );
        let mut named = figures.clone();
        named.filters = serde_json::from_value(serde_json::json!({
            "lead": {"reference_records": 2, "exact_match_records": 0, "exact_match": 0.0,
                     "overlap_sums": {"means": {"rougeL": {"records": 2, "sum": 0.5, "squares": 0.125}}}},
        }))
        .unwrap();
        let names: Vec<String> = task_metrics(&named).into_iter().map(|m| m.metric).collect();
        assert_eq!(names, ["exact_match,lead", "rougeL,lead"]);
    }

    /// A task of texts scored alone (wikitext's) shows the perplexities per word and byte
    /// and the bits per byte of the texts scored whole; scored after a context (LAMBADA's),
    /// the share written greedily as `acc` (unless choices gave one) and the perplexity per
    /// text; both, the perplexity per token over every text. Only `acc` and the perplexity
    /// per text have an error.
    #[test]
    fn scored_texts_show_lm_evaluation_harness_s_figures_of_their_kind_of_task() {
        let figures = |more: serde_json::Value| -> GenerateFigures {
            let mut json = serde_json::json!({
                "prompt_tokens": 10, "generated_tokens": 0, "truncated_prompts": 1,
                "finished_by_stop": 0, "finished_by_length": 3,
                "prompt_tokens_per_second": 1.0, "generated_tokens_per_second": 0.0,
                "scored_texts": 3, "scored_tokens": 9, "scored_logprob": -9.0,
                "greedy_texts": 2, "whole_scored_texts": 2, "whole_scored_bytes": 40,
                "whole_scored_words": 8, "whole_scored_logprob": -6.0,
                "scored_perplexity": 2.5, "text_perplexity": 20.09, "greedy_share": 0.6667,
                "greedy_share_stderr": 0.3333, "word_perplexity": 2.117,
                "byte_perplexity": 1.162, "bits_per_byte": 0.2164,
            });
            json.as_object_mut()
                .unwrap()
                .extend(more.as_object().unwrap().clone());
            serde_json::from_value(json).unwrap()
        };
        let rows = |figures: &GenerateFigures| -> Vec<_> {
            (task_metrics(figures).into_iter())
                .map(|m| (m.metric, m.value, m.stderr, m.records))
                .collect()
        };
        let row = |name: &str, value: f64, records: u64| (name.to_owned(), value, None, records);
        assert_eq!(
            rows(&figures(serde_json::json!({}))),
            [
                row("word_perplexity", 2.117, 2),
                row("byte_perplexity", 1.162, 2),
                row("bits_per_byte", 0.2164, 2),
                row("token_perplexity", 2.5, 3),
            ]
        );
        let in_context = figures(serde_json::json!({
            "scored_after_context": true, "text_perplexity_stderr": 4.5,
        }));
        assert_eq!(
            rows(&in_context),
            [
                ("acc".to_owned(), 0.6667, Some(0.3333), 3),
                ("perplexity".to_owned(), 20.09, Some(4.5), 3),
                row("token_perplexity", 2.5, 3),
            ]
        );
        let with_choices = figures(serde_json::json!({
            "scored_after_context": true, "answered_records": 4, "correct_records": 1,
            "accuracy": 0.25,
        }));
        let names: Vec<_> = rows(&with_choices).into_iter().map(|r| r.0).collect();
        assert_eq!(names, ["acc", "perplexity", "token_perplexity"]);
        assert_eq!(
            task_metrics(&with_choices)[0].value,
            0.25,
            "the choices' accuracy"
        );
    }

    /// A task's results with one metric of `value`.
    fn task(name: &str, value: f64) -> TaskResult {
        TaskResult {
            name: name.into(),
            output: format!("out/{name}"),
            pool: "generate-1".into(),
            records: 4,
            wall_seconds: 1.0,
            truncated_prompts: 0,
            metrics: vec![TaskMetric {
                metric: "acc".into(),
                value,
                stderr: None,
                records: 4,
            }],
        }
    }

    #[test]
    fn a_run_of_some_tasks_keeps_the_earlier_results_of_the_others_in_the_suite_s_order() {
        let suite = ["arc", "gsm8k", "mmlu"];
        let of = |model: &str, tasks: Vec<TaskResult>| EvalResults {
            model: model.into(),
            tasks,
        };
        let earlier = of(
            "m",
            vec![task("arc", 0.1), task("gsm8k", 0.2), task("gone", 0.3)],
        );
        // `--only mmlu,arc`: arc's new results replace its old, gsm8k's are kept, a task no
        // longer in the suite is dropped.
        let now = of("m", vec![task("arc", 0.5), task("mmlu", 0.6)]);
        let merged = now.clone().over_earlier(Some(earlier.clone()), &suite);
        assert_eq!(
            merged.results,
            of(
                "m",
                vec![task("arc", 0.5), task("gsm8k", 0.2), task("mmlu", 0.6)]
            )
        );
        assert_eq!(merged.kept, ["gsm8k"]);
        assert_eq!(merged.other_model, None);
        // Another model's results are not kept, and said so.
        let merged = now
            .clone()
            .over_earlier(Some(of("other", earlier.tasks)), &suite);
        assert_eq!(merged.results, now);
        assert!(merged.kept.is_empty());
        assert_eq!(merged.other_model.as_deref(), Some("other"));
        // No earlier results: this run's alone.
        assert_eq!(now.clone().over_earlier(None, &suite).results, now);
    }
}
