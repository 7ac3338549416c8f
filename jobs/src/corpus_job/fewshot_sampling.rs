//! Few-shot examples drawn at random for each record (`--fewshot-seed`), as
//! lm-evaluation-harness's default sampler draws them from a train split (ARC, HellaSwag):
//! each record's `--fewshot` examples are a seeded draw from every answered example of the
//! file (of its own group under `--fewshot-group`), leaving out an example with the
//! record's own id (a split sampled for its own records).
//!
//! A record's draw depends on the seed and its id alone, never on the chunk it lands in or
//! the records read before it, so a resumed or re-chunked job writes the same prompts.
//! Distinct starts cost the prefix cache its sharing: the first N (no seed) share one.
//!
//! `--fewshot-sampler lm-eval` draws as lm-evaluation-harness itself does instead, so each
//! record gets the very examples it gets there: one `random.Random(seed)` stream
//! ([`PythonRandom`]) through the records in input order, each taking
//! `sample(examples, n)`. A record's draw then depends on its place ([`Record::ordinal`]),
//! which a resumed or re-chunked job reads the same, so it still writes the same prompts.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use resident_proto::SeededRng;

use super::JobError;
#[cfg(test)]
use super::fewshot::FewshotSampling;
use super::fewshot::{FewshotSource, ShotTurns, no_examples_of, read_groups, write_shot};
use super::prompt::PromptTemplate;
use super::python_random::PythonRandom;
use super::reader::ReaderOptions;
#[cfg(doc)]
use super::reader::Record;

/// lm-evaluation-harness's draws: `sample(examples, take)` for each record in turn, from
/// one stream, kept as they are drawn (a record's draw needs every earlier one's).
#[derive(Clone)]
pub struct SequentialDraws {
    /// Examples each record samples: `--fewshot`, one more when the examples are the
    /// job's own input (lm-evaluation-harness's few-shot split being its test split), so
    /// that leaving out the record itself still leaves `--fewshot`.
    take: usize,
    drawn: Arc<Mutex<(PythonRandom, Vec<Vec<u32>>)>>,
}

impl SequentialDraws {
    /// A stream seeded by `seed`, each record sampling `take` examples.
    pub fn new(seed: u64, take: usize) -> Self {
        let drawn = Arc::new(Mutex::new((PythonRandom::new(seed), Vec::new())));
        Self { take, drawn }
    }

    /// The examples (indexes into a pool of `pool_len`) of the record at `ordinal`.
    fn of(&self, ordinal: u64, pool_len: usize) -> Vec<usize> {
        let mut guard = self.drawn.lock().expect("few-shot draws");
        let (random, drawn) = &mut *guard;
        while drawn.len() as u64 <= ordinal {
            let sample = random.sample(pool_len, self.take.min(pool_len));
            drawn.push(sample.into_iter().map(|i| i as u32).collect());
        }
        drawn[ordinal as usize]
            .iter()
            .map(|&i| i as usize)
            .collect()
    }
}

/// Two samplers' draws agree when they take as many (the seed is the sampler's own).
impl PartialEq for SequentialDraws {
    fn eq(&self, other: &Self) -> bool {
        self.take == other.take
    }
}

impl fmt::Debug for SequentialDraws {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SequentialDraws({} a record)", self.take)
    }
}

/// One example as it goes before a prompt: its id, and its text through the job's prompt
/// with its right choice after it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shot {
    /// The example's id (a record with the same id does not get it).
    pub id: String,
    /// Written as the job writes a record, its answer after it.
    pub text: String,
    /// As a conversation's turns (`--fewshot-as-multiturn`).
    pub turns: ShotTurns,
}

/// Every example a record may draw, by group, and how each record draws its own.
#[derive(Clone, Debug, PartialEq)]
pub struct FewshotSampler {
    /// The field whose value picks a record's pool (`None`: one pool, under "").
    pub field: Option<String>,
    /// The answered examples, by group value.
    pub pools: BTreeMap<String, Vec<Shot>>,
    /// Examples before each prompt.
    pub count: usize,
    /// Seeds every record's draw (with its id).
    pub seed: u64,
    /// Between two examples, and between the last and the prompt.
    pub delimiter: String,
    /// The description's template source, before the examples.
    pub description: String,
    /// The job's prompt's source, after them.
    pub prompt: String,
    /// Where the examples were read (for a record whose group has none).
    pub source: String,
    /// lm-evaluation-harness's draws, record after record (`--fewshot-sampler lm-eval`);
    /// `None`: each record's own.
    pub sequence: Option<SequentialDraws>,
    /// The drawn examples go before the prompt as turns ([`Self::turns_for`]), not text.
    pub as_turns: bool,
}

/// Which of `pool_len` examples a record with `record_id` gets, in their order: `count + 1`
/// distinct draws (all, when fewer), so that leaving out the record's own id still leaves
/// `count`.
pub fn draw(seed: u64, record_id: &str, pool_len: usize, count: usize) -> Vec<usize> {
    let key = twox_hash::XxHash3_128::oneshot(record_id.as_bytes()) as u64;
    let mut rng = SeededRng::derived(seed, key);
    let wanted = (count + 1).min(pool_len);
    let mut drawn: Vec<usize> = Vec::with_capacity(wanted);
    while drawn.len() < wanted {
        let at = rng.below(pool_len as u64) as usize;
        if !drawn.contains(&at) {
            drawn.push(at);
        }
    }
    drawn
}

impl FewshotSampler {
    /// The prompt of the record `record_id` at `ordinal` of group `group` (`""` when
    /// ungrouped): the description, its drawn examples, the job's prompt. A refusal that
    /// says what to do when the file has no examples of that group.
    pub fn prompt_for(
        &self,
        group: &str,
        record_id: &str,
        ordinal: u64,
    ) -> Result<PromptTemplate, String> {
        let examples: Vec<String> = (self.drawn(group, record_id, ordinal)?.into_iter())
            .map(|shot| format!("{}{}", shot.text, self.delimiter))
            .collect();
        PromptTemplate::with_examples(&self.description, &examples, &self.prompt)
    }

    /// The examples drawn for the record `record_id` at `ordinal` of group `group`, as
    /// turns (`--fewshot-as-multiturn`; the record's prompt is then the job's own).
    pub fn turns_for(
        &self,
        group: &str,
        record_id: &str,
        ordinal: u64,
    ) -> Result<Vec<ShotTurns>, String> {
        let drawn = self.drawn(group, record_id, ordinal)?;
        Ok(drawn.into_iter().map(|shot| shot.turns.clone()).collect())
    }

    /// The examples drawn for the record `record_id` at `ordinal` of group `group` (`""`
    /// when ungrouped), in order; a refusal that says what to do when the file has none
    /// of that group.
    fn drawn(&self, group: &str, record_id: &str, ordinal: u64) -> Result<Vec<&Shot>, String> {
        let field = self.field.as_deref().unwrap_or_default();
        let pool =
            (self.pools.get(group)).ok_or_else(|| no_examples_of(&self.source, field, group))?;
        let drawn = match &self.sequence {
            Some(sequence) => sequence.of(ordinal, pool.len()),
            None => draw(self.seed, record_id, pool.len(), self.count),
        };
        let chosen = drawn
            .iter()
            .map(|at| &pool[*at])
            .filter(|shot| shot.id != record_id);
        Ok(chosen.take(self.count).collect())
    }

    /// What the job's settings fingerprint holds of them: the draw's settings and a digest
    /// of every example (a resumed job drawing otherwise is another job).
    pub fn settings(&self) -> serde_json::Value {
        let mut examples = String::new();
        for (group, pool) in &self.pools {
            for shot in pool {
                examples.push_str(&format!("{group}\u{0}{}\u{0}{}\u{0}", shot.id, shot.text));
            }
        }
        let mut settings = serde_json::json!({
            "field": self.field,
            "count": self.count,
            "seed": self.seed,
            "delimiter": self.delimiter,
            "start": format!("{}{}", self.description, self.prompt),
            "examples_sha256": crate::files::sha256_hex(examples.as_bytes()),
        });
        // Only when drawn so: a per-record job's settings read as before.
        if let Some(sequence) = &self.sequence {
            settings["sampler"] = serde_json::json!({"lm-eval": sequence.take});
        }
        if self.as_turns {
            settings["as_turns"] = true.into();
        }
        settings
    }
}

/// Every answered example `source` names (by group when grouped), each written through
/// `prompt` with its answer; refused as the first-N reading is when a group has fewer than
/// `source.count`.
pub fn read_sampled_examples(
    source: &FewshotSource,
    seed: u64,
    description: &str,
    prompt: &PromptTemplate,
    options: ReaderOptions,
    sequence: Option<SequentialDraws>,
) -> Result<FewshotSampler, JobError> {
    let names = options.extra_fields.clone();
    let groups = read_groups(source, options, usize::MAX)?;
    let examples: usize = groups.values().map(Vec::len).sum();
    if let Some(take) = (sequence.as_ref())
        .map(|s| s.take)
        .filter(|&take| take > examples)
    {
        return Err(JobError::Input(format!(
            "lm-evaluation-harness's sampler draws {take} examples a record (--fewshot, one \
             more where the examples are the input itself), and {} holds {examples}: lower \
             --fewshot or give more examples",
            source.path.display()
        )));
    }
    let mut pools = BTreeMap::new();
    for (group, records) in groups {
        let mut shots = Vec::with_capacity(records.len());
        for record in records {
            let (text, turns) =
                write_shot(prompt, &names, &record, source).map_err(JobError::Input)?;
            let id = match &record.id {
                serde_json::Value::String(id) => id.clone(),
                other => other.to_string(),
            };
            shots.push(Shot { id, text, turns });
        }
        pools.insert(group, shots);
    }
    Ok(FewshotSampler {
        field: source.grouped().map(str::to_owned),
        pools,
        count: source.count,
        seed,
        delimiter: source.delimiter.clone(),
        description: description.to_owned(),
        prompt: prompt.as_str().to_owned(),
        source: source.path.display().to_string(),
        sequence,
        as_turns: source.as_turns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(pool: usize, count: usize) -> FewshotSampler {
        let shots = (0..pool)
            .map(|i| Shot {
                id: format!("d{i}"),
                text: format!("Q{i} {{x}} A{i}"),
                turns: ShotTurns {
                    asked: format!("Q{i} {{x}}"),
                    answer: format!("A{i}"),
                },
            })
            .collect();
        FewshotSampler {
            field: None,
            pools: BTreeMap::from([(String::new(), shots)]),
            count,
            seed: 1234,
            delimiter: "\n\n".into(),
            description: "About {subject}.\n".into(),
            prompt: "{text}\nAnswer:".into(),
            source: "dev.jsonl".into(),
            sequence: None,
            as_turns: false,
        }
    }

    #[test]
    fn each_record_draws_its_own_examples_from_its_seed_and_id() {
        let all = sampler(40, 3);
        let prompt = |id: &str| all.prompt_for("", id, 0).unwrap().as_str().to_owned();
        assert_eq!(prompt("r1"), prompt("r1"), "the same record draws the same");
        assert_ne!(prompt("r1"), prompt("r2"), "another record draws others");
        let other_seed = FewshotSampler {
            seed: 1,
            ..all.clone()
        };
        assert_ne!(
            other_seed.prompt_for("", "r1", 0).unwrap().as_str(),
            prompt("r1")
        );
        let text = prompt("r1");
        assert!(text.starts_with("About {subject}.\nQ"), "{text}");
        assert!(text.ends_with("\n\n{text}\nAnswer:"), "{text}");
        assert_eq!(
            text.matches("\n\nQ").count() + 1,
            3,
            "three examples: {text}"
        );
        assert!(
            text.contains("{{x}}"),
            "an example's braces stay literal: {text}"
        );
        // Draws are distinct, and spread over the pool.
        let mut seen = std::collections::BTreeSet::new();
        for r in 0..200 {
            let drawn = draw(1234, &format!("r{r}"), 40, 3);
            assert_eq!(drawn.len(), 4);
            assert_eq!(
                drawn
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                4
            );
            seen.extend(drawn);
        }
        assert_eq!(seen.len(), 40);
    }

    #[test]
    fn a_record_never_gets_itself_and_a_small_pool_gives_what_it_has() {
        let all = sampler(4, 3);
        for id in ["d0", "d1", "d2", "d3"] {
            let text = all.prompt_for("", id, 0).unwrap().as_str().to_owned();
            let own = format!("Q{} ", &id[1..]);
            assert!(
                !text.contains(&own),
                "{id} is left out of its own examples: {text}"
            );
            assert_eq!(text.matches(" A").count(), 3, "{text}");
        }
        // A pool of exactly --fewshot: a record of it gets the others.
        let exact = sampler(3, 3);
        let text = exact.prompt_for("", "d1", 0).unwrap().as_str().to_owned();
        assert_eq!(text.matches(" A").count(), 2, "{text}");
        assert!(
            exact
                .prompt_for("math", "r", 0)
                .unwrap_err()
                .contains("no record whose"),
            "a group the file lacks"
        );
        assert_ne!(
            all.settings(),
            sampler(5, 3).settings(),
            "other examples, other job"
        );
    }

    /// As turns, a record gets the very examples its text draw gives, in order; the
    /// settings say the examples are turns.
    #[test]
    fn drawn_examples_as_turns_are_the_ones_the_text_draw_gives() {
        let text = sampler(12, 3);
        let turns = FewshotSampler {
            as_turns: true,
            ..text.clone()
        };
        for id in ["r1", "r2", "d4"] {
            let prompt = text.prompt_for("", id, 0).unwrap();
            // Each drawn example marked where it lies, to be left out whole when too long.
            assert_eq!(prompt.example_bounds(&[]).len(), 4);
            let written = prompt.as_str().to_owned();
            let drawn = turns.turns_for("", id, 0).unwrap();
            assert_eq!(drawn.len(), 3);
            let as_text: Vec<String> = (drawn.iter())
                .map(|t| {
                    format!("{} {}\n\n", t.asked, t.answer)
                        .replace('{', "{{")
                        .replace('}', "}}")
                })
                .collect();
            assert!(
                written.contains(&as_text.concat()),
                "{written} holds {as_text:?}"
            );
        }
        assert!(turns.turns_for("math", "r1", 0).is_err());
        assert_eq!(turns.settings()["as_turns"], true);
        assert!(text.settings().get("as_turns").is_none());
    }

    /// `--fewshot-sampler lm-eval`: record after record, the examples
    /// `random.Random(1234).sample` gives lm-evaluation-harness (CPython 3.11's numbers),
    /// whatever order the records are asked in; the record itself left out where the
    /// examples are the input; the settings say so.
    #[test]
    fn lm_eval_s_draws_follow_one_python_stream_through_the_records() {
        let mut sequential = sampler(10, 3);
        sequential.sequence = Some(SequentialDraws::new(1234, 4));
        let shots = |ordinal: u64, id: &str| -> Vec<String> {
            let text = sequential
                .prompt_for("", id, ordinal)
                .unwrap()
                .as_str()
                .to_owned();
            let examples = text.trim_start_matches("About {subject}.\n");
            (examples.split("\n\n").filter(|e| e.starts_with('Q')))
                .map(|e| e.split(' ').next().unwrap().to_owned())
                .collect()
        };
        // random.Random(1234): sample(range(10), 4) gives [7, 1, 0, 9], then [9, 0, 1, 8].
        assert_eq!(
            shots(1, "r1"),
            ["Q9", "Q0", "Q1"],
            "the second record's, first"
        );
        assert_eq!(shots(0, "r0"), ["Q7", "Q1", "Q0"]);
        assert_eq!(shots(0, "d1"), ["Q7", "Q0", "Q9"], "d1 itself left out");
        let settings = sequential.settings();
        assert_eq!(settings["sampler"], serde_json::json!({"lm-eval": 4}));
        assert!(sampler(10, 3).settings().get("sampler").is_none());
        for (text, sampling) in [
            ("per-record", FewshotSampling::PerRecord),
            ("lm-eval", FewshotSampling::LmEval),
        ] {
            assert_eq!(text.parse(), Ok(sampling));
            assert_eq!(sampling.to_string(), text);
        }
        let refused = "random".parse::<FewshotSampling>().unwrap_err();
        assert!(refused.contains("give per-record"), "{refused}");
    }
}
