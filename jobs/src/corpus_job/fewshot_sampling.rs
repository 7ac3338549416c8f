//! Few-shot examples drawn at random for each record (`--fewshot-seed`), as
//! lm-evaluation-harness's default sampler draws them from a train split (ARC, HellaSwag):
//! each record's `--fewshot` examples are a seeded draw from every answered example of the
//! file (of its own group under `--fewshot-group`), leaving out an example with the
//! record's own id (a split sampled for its own records).
//!
//! A record's draw depends on the seed and its id alone, never on the chunk it lands in or
//! the records read before it, so a resumed or re-chunked job writes the same prompts.
//! Distinct starts cost the prefix cache its sharing: the first N (no seed) share one.

use std::collections::BTreeMap;

use resident_proto::SeededRng;

use super::JobError;
use super::fewshot::{FewshotSource, examples_text, read_groups};
use super::prompt::PromptTemplate;
use super::reader::ReaderOptions;

/// One example as it goes before a prompt: its id, and its text through the job's prompt
/// with its right choice after it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shot {
    /// The example's id (a record with the same id does not get it).
    pub id: String,
    /// Written as the job writes a record, its answer after it.
    pub text: String,
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
    /// The prompt of the record `record_id` of group `group` (`""` when ungrouped): the
    /// description, its drawn examples, the job's prompt. A refusal that says what to do
    /// when the file has no examples of that group.
    pub fn prompt_for(&self, group: &str, record_id: &str) -> Result<PromptTemplate, String> {
        let pool = self.pools.get(group).ok_or_else(|| {
            format!(
                "the few-shot examples ({}) have no record whose `{}` is {group:?}: add \
                 answered records of that group, or leave out --fewshot-group",
                self.source,
                self.field.as_deref().unwrap_or_default()
            )
        })?;
        let mut examples = String::new();
        let drawn = draw(self.seed, record_id, pool.len(), self.count);
        let chosen = drawn
            .iter()
            .map(|at| &pool[*at])
            .filter(|shot| shot.id != record_id);
        for shot in chosen.take(self.count) {
            examples.push_str(&shot.text);
            examples.push_str(&self.delimiter);
        }
        let literal = examples.replace('{', "{{").replace('}', "}}");
        PromptTemplate::parse(&format!("{}{literal}{}", self.description, self.prompt))
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
        serde_json::json!({
            "field": self.field,
            "count": self.count,
            "seed": self.seed,
            "delimiter": self.delimiter,
            "start": format!("{}{}", self.description, self.prompt),
            "examples_sha256": crate::files::sha256_hex(examples.as_bytes()),
        })
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
) -> Result<FewshotSampler, JobError> {
    let names = options.extra_fields.clone();
    let groups = read_groups(source, options, usize::MAX)?;
    let mut pools = BTreeMap::new();
    for (group, records) in groups {
        let mut shots = Vec::with_capacity(records.len());
        for record in records {
            let text = examples_text(prompt, &names, std::slice::from_ref(&record), source, "")
                .map_err(JobError::Input)?;
            let id = match &record.id {
                serde_json::Value::String(id) => id.clone(),
                other => other.to_string(),
            };
            shots.push(Shot { id, text });
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
        }
    }

    #[test]
    fn each_record_draws_its_own_examples_from_its_seed_and_id() {
        let all = sampler(40, 3);
        let prompt = |id: &str| all.prompt_for("", id).unwrap().as_str().to_owned();
        assert_eq!(prompt("r1"), prompt("r1"), "the same record draws the same");
        assert_ne!(prompt("r1"), prompt("r2"), "another record draws others");
        let other_seed = FewshotSampler {
            seed: 1,
            ..all.clone()
        };
        assert_ne!(
            other_seed.prompt_for("", "r1").unwrap().as_str(),
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
            let text = all.prompt_for("", id).unwrap().as_str().to_owned();
            let own = format!("Q{} ", &id[1..]);
            assert!(
                !text.contains(&own),
                "{id} is left out of its own examples: {text}"
            );
            assert_eq!(text.matches(" A").count(), 3, "{text}");
        }
        // A pool of exactly --fewshot: a record of it gets the others.
        let exact = sampler(3, 3);
        let text = exact.prompt_for("", "d1").unwrap().as_str().to_owned();
        assert_eq!(text.matches(" A").count(), 2, "{text}");
        assert!(
            exact
                .prompt_for("math", "r")
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
}
