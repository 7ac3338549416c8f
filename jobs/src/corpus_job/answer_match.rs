//! A generated answer checked against a record's reference (pure): lm-evaluation-harness's
//! `generate_until` tasks (GSM8K, TriviaQA, Natural Questions) as it scores them. A regex
//! filter extracts the answer from the generated text (its first or last match; of a match,
//! its first non-empty group, else the whole match), then both it and each reference lose
//! what the ignore regexes match, are lower-cased and stripped of ASCII punctuation when
//! asked, and trimmed; the answer is right when it equals any reference (TriviaQA's
//! aliases).
//!
//! The patterns are Python's `re` syntax, look-around and backreferences included, as
//! lm-evaluation-harness's task files write them (BIG-Bench Hard's
//! `(?<=the answer is )(.*)(?=.)`): `fancy_regex` runs them, handing what needs no
//! backtracking to the `regex` crate. A pattern whose backtracking passes `fancy_regex`'s
//! limit (a million steps) on one text finds nothing there (logged), rather than hang the
//! job as Python's would.

use fancy_regex::Regex;
use serde_json::Value;

use super::answer_spec::{AnswerFlags, AnswerMatchSpec, AnswerRefusal, ExtractMatch};
use super::text_overlap::{OverlapScores, RougeWords, overlap_scores};

/// [`AnswerMatchSpec`] with its patterns compiled.
#[derive(Clone, Debug)]
pub struct AnswerMatch {
    spec: AnswerMatchSpec,
    /// `--extract` (one, unnamed, `None` pattern: the whole text) or the named filters, in
    /// order: the first is the line's own.
    filters: Vec<Filter>,
    ignore: Vec<Regex>,
}

/// One compiled filter.
#[derive(Clone, Debug)]
struct Filter {
    /// `None` for `--extract`'s.
    name: Option<String>,
    /// `None`: the whole text.
    pattern: Option<Regex>,
    select: ExtractMatch,
}

/// One generated text against its record's references.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// The answer the filter found, as it found it (trimmed); `None` when it matched
    /// nothing.
    pub extracted: Option<String>,
    /// Whether it equals a reference after normalising both; `None` when the record has
    /// none.
    pub correct: Option<bool>,
    /// Its overlap figures with the references (`--metric`), each the best over them, the
    /// answer as found (not normalised; none found: empty); `None` when the job asks for
    /// none or the record has no reference.
    pub overlap: Option<OverlapScores>,
}

/// `pattern` compiled, or why not, naming where it came from.
fn compile(flag: &str, pattern: &str) -> Result<Regex, String> {
    Regex::new(pattern).map_err(|e| {
        format!(
            "{flag} {pattern:?} is not a regular expression (Python's `re` syntax, \
             look-around and backreferences included): {e}"
        )
    })
}

impl AnswerMatch {
    /// Compiles `spec`'s patterns; a pattern that does not compile is refused naming its
    /// flag and why, as are `--extract` beside `--filter` and two filters of one name.
    pub fn new(spec: AnswerMatchSpec) -> Result<Self, String> {
        if let Some(
            rule @ (AnswerRefusal::ExtractBesideFilters | AnswerRefusal::FilterNamedTwice),
        ) = spec.refusal(false, false)
        {
            return Err(rule.message(&AnswerFlags::CLI));
        }
        let mut filters = Vec::new();
        for named in &spec.filters {
            filters.push(Filter {
                name: Some(named.name.clone()),
                pattern: (!named.pattern.is_empty())
                    .then(|| compile(&format!("--filter {}", named.name), &named.pattern))
                    .transpose()?,
                select: named.select,
            });
        }
        if filters.is_empty() {
            filters.push(Filter {
                name: None,
                pattern: (spec.extract.as_deref())
                    .map(|pattern| compile("--extract", pattern))
                    .transpose()?,
                select: spec.extract_match,
            });
        }
        let ignore = (spec.ignore.iter())
            .map(|pattern| compile("--ignore-regex", pattern))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            spec,
            filters,
            ignore,
        })
    }

    /// What it was made from.
    pub fn spec(&self) -> &AnswerMatchSpec {
        &self.spec
    }

    /// The answer in `generated` by the first filter: the chosen match's first non-empty
    /// group (the whole match for a pattern without groups), trimmed; all of `generated`,
    /// trimmed, without a pattern; `None` when the pattern finds nothing.
    pub fn extract(&self, generated: &str) -> Option<String> {
        self.filters[0].extract(generated)
    }

    /// `text` as it is compared: the ignore regexes' matches removed (each in turn),
    /// lower-cased and without ASCII punctuation when asked, trimmed.
    pub fn normalize(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for pattern in &self.ignore {
            match pattern.try_replacen(&text, 0, "") {
                Ok(kept) => text = kept.into_owned(),
                Err(error) => gave_up("--ignore-regex", pattern, &error),
            }
        }
        if self.spec.ignore_case {
            text = text.to_lowercase();
        }
        if self.spec.ignore_punctuation {
            text.retain(|c| !c.is_ascii_punctuation());
        }
        text.trim().to_owned()
    }

    /// `generated` checked against `references` by the first filter (none: extracted
    /// only).
    pub fn judge(&self, generated: &str, references: &[String]) -> Judgement {
        let references = References::new(self, references);
        self.judge_normalized(&self.filters[0], generated, &references)
            .0
    }

    /// `generated` checked by `filter` against `references`; with its answer normalised,
    /// for the majority.
    fn judge_normalized(
        &self,
        filter: &Filter,
        generated: &str,
        references: &References,
    ) -> (Judgement, Option<String>) {
        let extracted = filter.extract(generated);
        let answer = extracted.as_deref().map(|answer| self.normalize(answer));
        let normalized = &references.normalized;
        let correct = (!normalized.is_empty())
            .then(|| answer.as_ref().is_some_and(|a| normalized.contains(a)));
        let words = RougeWords {
            stemmed: self.spec.rouge_stemmer,
        };
        let metrics = &self.spec.metrics;
        let overlap = overlap_scores(metrics, words, extracted.as_deref(), references.raw);
        let judged = Judgement {
            extracted,
            correct,
            overlap,
        };
        (judged, answer)
    }

    /// What the job's settings fingerprint holds of it (the spec, each key as the flags
    /// name it): another filter or comparison writes other lines, so an output made under
    /// one is not resumed under another.
    pub fn settings(&self) -> Value {
        serde_json::to_value(&self.spec).expect("a spec of texts and flags is JSON")
    }
}

impl Filter {
    /// The answer in `generated`: the chosen match's first non-empty group (the whole
    /// match for a pattern without groups), trimmed; all of `generated`, trimmed, without
    /// a pattern; `None` when the pattern finds nothing.
    fn extract(&self, generated: &str) -> Option<String> {
        let Some(pattern) = &self.pattern else {
            return Some(generated.trim().to_owned());
        };
        let mut matches = pattern.captures_iter(generated);
        let chosen = match self.select {
            ExtractMatch::First => matches.next(),
            ExtractMatch::Last => matches.last(),
        }?;
        let chosen = chosen
            .map_err(|error| gave_up(self.flag().as_str(), pattern, &error))
            .ok()?;
        let text = match chosen.len() {
            1 => chosen.get(0).map(|m| m.as_str()),
            _ => (chosen.iter().skip(1).flatten())
                .map(|m| m.as_str())
                .find(|group| !group.is_empty()),
        }?;
        Some(text.trim().to_owned())
    }
}

impl Filter {
    /// The flag it came from, as a refusal names it.
    fn flag(&self) -> String {
        match &self.name {
            Some(name) => format!("--filter {name}"),
            None => "--extract".to_owned(),
        }
    }
}

/// Logs that `pattern` (of `flag`) gave up on a text: its backtracking passed the limit.
fn gave_up(flag: &str, pattern: &Regex, error: &fancy_regex::Error) {
    tracing::warn!(
        "{flag} {:?} gave up on a text ({error}): it finds nothing there; a pattern that \
         backtracks less (fewer nested repeats) judges every text",
        pattern.as_str()
    );
}

/// A record's references as given (what overlap figures read) and normalised (what exact
/// match compares), each normalised once.
struct References<'a> {
    raw: &'a [String],
    normalized: Vec<String>,
}

impl<'a> References<'a> {
    fn new(check: &AnswerMatch, raw: &'a [String]) -> Self {
        let normalized = raw.iter().map(|r| check.normalize(r)).collect();
        Self { raw, normalized }
    }
}

/// Every sample of one record checked by one filter against its references.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordAnswers {
    /// The filter's name (`--filter`); `None` for `--extract`'s.
    pub filter: Option<String>,
    /// Each sample's, the first (the record's `text`) first.
    pub samples: Vec<Judgement>,
    /// With several samples and references: whether their most common answer (after
    /// normalising; of equally common ones the first found; lm-evaluation-harness's
    /// `majority_vote`, self-consistency's maj@n) is right.
    pub majority: Option<bool>,
}

impl RecordAnswers {
    /// Whether the first sample is right (`None` without references).
    pub fn first_correct(&self) -> Option<bool> {
        self.samples.first().and_then(|judged| judged.correct)
    }

    /// With several samples and references: whether any sample is right (pass@n).
    pub fn any_correct(&self) -> Option<bool> {
        let correct: Vec<bool> = self.samples.iter().filter_map(|j| j.correct).collect();
        (correct.len() > 1).then(|| correct.contains(&true))
    }
}

impl AnswerMatch {
    /// Each of a record's `samples` checked by each filter against `references` (each
    /// normalised once), and their majority: one [`RecordAnswers`] a filter, in order (the
    /// first is the line's own).
    pub fn judge_record(&self, samples: &[&str], references: &[String]) -> Vec<RecordAnswers> {
        let references = References::new(self, references);
        (self.filters.iter())
            .map(|filter| self.judge_by(filter, samples, &references))
            .collect()
    }

    /// `samples` checked by `filter` against `references`.
    fn judge_by(
        &self,
        filter: &Filter,
        samples: &[&str],
        references: &References,
    ) -> RecordAnswers {
        let (judged, answers): (Vec<Judgement>, Vec<Option<String>>) = samples
            .iter()
            .map(|text| self.judge_normalized(filter, text, references))
            .unzip();
        let references = &references.normalized;
        let majority = (samples.len() > 1 && !references.is_empty()).then(|| {
            let mut counts: Vec<(&String, usize)> = Vec::new();
            for answer in answers.iter().flatten() {
                match counts.iter_mut().find(|(seen, _)| *seen == answer) {
                    Some((_, count)) => *count += 1,
                    None => counts.push((answer, 1)),
                }
            }
            let most = counts.iter().map(|(_, count)| *count).max();
            let winner = counts.iter().find(|(_, count)| Some(*count) == most);
            winner.is_some_and(|(answer, _)| references.contains(answer))
        });
        RecordAnswers {
            filter: filter.name.clone(),
            samples: judged,
            majority,
        }
    }
}

/// A record's references from its reference field's value: a text, a number or a
/// boolean as JSON writes it, each of a list's (empty and null ones left out); none for
/// null or a missing field. An object is refused, saying how to name a text inside it.
pub fn references_of(value: Option<&Value>, field: &str) -> Result<Vec<String>, String> {
    let one = |value: &Value| match value {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        Value::Number(_) | Value::Bool(_) => Ok(Some(value.to_string())),
        Value::Array(_) | Value::Object(_) => Err(format!(
            "the reference `{field}` holds {}: give a text, a number or a list of them \
             (name one inside it by path, as `{field}.value` or `{field}.aliases`)",
            if value.is_array() {
                "a list inside a list"
            } else {
                "an object"
            }
        )),
    };
    match value {
        None => Ok(Vec::new()),
        Some(Value::Array(list)) => {
            let all: Vec<Option<String>> = list.iter().map(one).collect::<Result<_, _>>()?;
            Ok(all.into_iter().flatten().collect())
        }
        Some(value) => Ok(one(value)?.into_iter().collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// lm-evaluation-harness's GSM8K: its two filters and its exact_match settings.
    fn gsm8k(extract: &str, pick: ExtractMatch) -> AnswerMatch {
        AnswerMatch::new(AnswerMatchSpec {
            reference_field: Some("answer".into()),
            extract: Some(extract.into()),
            extract_match: pick,
            ignore: [",", r"\$", "(?s).*#### ", r"\.$"]
                .map(String::from)
                .to_vec(),
            ignore_case: true,
            ..AnswerMatchSpec::default()
        })
        .unwrap()
    }

    /// The record's answers by its one filter.
    fn judged(check: &AnswerMatch, samples: &[&str], references: &[String]) -> RecordAnswers {
        let mut by_filter = check.judge_record(samples, references);
        assert_eq!(by_filter.len(), 1);
        by_filter.remove(0)
    }

    #[test]
    fn gsm8k_s_filters_find_the_answer_as_lm_evaluation_harness_does() {
        let strict = gsm8k(r"#### (\-?[0-9\.\,]+)", ExtractMatch::First);
        let flexible = gsm8k(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", ExtractMatch::Last);
        let reference = ["She sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18".to_owned()];
        let solution = "Janet has 16 eggs, uses 7, sells 9 at $2: 9 * 2 = $18.\n#### 18";
        let judged = strict.judge(solution, &reference);
        assert_eq!(judged.extracted.as_deref(), Some("18"));
        assert_eq!(judged.correct, Some(true), "the reference loses `.*#### `");
        assert_eq!(
            strict.judge("The answer is 18.", &reference),
            Judgement {
                extracted: None,
                correct: Some(false),
                overlap: None,
            },
            "no `####`: nothing extracted, wrong"
        );
        let flexible_judged = flexible.judge("9 * 2 = $18.", &reference);
        assert_eq!(flexible_judged.extracted.as_deref(), Some("$18."));
        assert_eq!(
            flexible_judged.correct,
            Some(true),
            "$ and the final . ignored"
        );
        // The second group when the first is empty; the first match under `First`.
        assert_eq!(flexible.extract("so 7").as_deref(), Some("7"));
        let first = gsm8k(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", ExtractMatch::First);
        assert_eq!(first.extract("12 then 1,000").as_deref(), Some("12"));
        assert_eq!(flexible.extract("12 then 1,000").as_deref(), Some("1,000"));
        assert_eq!(flexible.normalize("1,000"), "1000");
        // No references: extracted only.
        assert_eq!(strict.judge("#### 5", &[]).correct, None);
    }

    #[test]
    fn without_a_filter_the_whole_text_is_compared_with_any_reference() {
        let plain = AnswerMatch::new(AnswerMatchSpec {
            ignore_case: true,
            ignore_punctuation: true,
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        let aliases = ["Paris".to_owned(), "City of Light".to_owned()];
        assert_eq!(plain.judge("  paris!\n", &aliases).correct, Some(true));
        assert_eq!(
            plain.judge("the city of light", &aliases).correct,
            Some(false)
        );
        assert_eq!(plain.judge("City of Light.", &aliases).correct, Some(true));
        assert_eq!(plain.extract(" x ").as_deref(), Some("x"));
        let strict = AnswerMatch::new(AnswerMatchSpec::default()).unwrap();
        assert_eq!(
            strict.judge("paris", &aliases).correct,
            Some(false),
            "case counts"
        );
        // A pattern without groups gives its whole match.
        let whole = AnswerMatch::new(AnswerMatchSpec {
            extract: Some("[A-D]".into()),
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        assert_eq!(whole.extract("The answer: C").as_deref(), Some("C"));
    }

    /// Several samples: the first decides `exact_match`, any one pass@n, the most common
    /// normalised answer (the first found of equals) the majority.
    #[test]
    fn a_record_s_samples_give_first_any_and_majority() {
        let numbers = gsm8k(r"#### (\-?[0-9\.\,]+)", ExtractMatch::First);
        let references = ["#### 1,000".to_owned()];
        let record = judged(
            &numbers,
            &["#### 7", "#### 1000", "no answer", "#### 7.", "#### 1,000"],
            &references,
        );
        assert_eq!(record.first_correct(), Some(false));
        assert_eq!(record.any_correct(), Some(true));
        assert_eq!(
            record.majority,
            Some(false),
            "7 twice ('7.' normalises to 7), 1000 twice: 7 first"
        );
        let won = judged(
            &numbers,
            &["#### 5", "#### 1000", "#### 1,000."],
            &references,
        );
        assert_eq!(won.majority, Some(true));
        let none = judged(&numbers, &["x", "y"], &references);
        assert_eq!(
            (none.any_correct(), none.majority),
            (Some(false), Some(false))
        );
        let one = judged(&numbers, &["#### 1000"], &references);
        assert_eq!(
            (one.first_correct(), one.any_correct(), one.majority),
            (Some(true), None, None)
        );
        assert_eq!(judged(&numbers, &["#### 1", "#### 1"], &[]).majority, None);
    }

    /// GSM8K's two filters over one generation, each judged as its own `--extract` would.
    #[test]
    fn named_filters_each_judge_the_same_samples_as_their_own_extract_would() {
        let strict = r"#### (\-?[0-9\.\,]+)";
        let flexible = r"(-?[$0-9.,]{2,})|(-?[0-9]+)";
        let both = AnswerMatch::new(AnswerMatchSpec {
            filters: vec![
                format!("strict-match={strict}").parse().unwrap(),
                format!("flexible-extract:last={flexible}").parse().unwrap(),
                "whole=".parse().unwrap(),
            ],
            extract: None,
            ..gsm8k(strict, ExtractMatch::First).spec().clone()
        })
        .unwrap();
        let references = ["#### 18".to_owned()];
        let samples = ["so $18.", "#### 18", "#### 7 or 18"];
        let by_filter = both.judge_record(&samples, &references);
        let names: Vec<_> = by_filter.iter().map(|a| a.filter.as_deref()).collect();
        assert_eq!(
            names,
            [
                Some("strict-match"),
                Some("flexible-extract"),
                Some("whole")
            ]
        );
        let alone = [
            gsm8k(strict, ExtractMatch::First),
            gsm8k(flexible, ExtractMatch::Last),
        ];
        for (named, single) in by_filter.iter().zip(&alone) {
            let expected = judged(single, &samples, &references);
            assert_eq!(
                (&named.samples, named.majority),
                (&expected.samples, expected.majority)
            );
        }
        assert_eq!(
            by_filter[2].samples[1].extracted.as_deref(),
            Some("#### 18")
        );
        assert_eq!(
            by_filter[2].samples[1].correct,
            Some(true),
            "the whole text, `.*#### ` ignored"
        );
        assert_eq!(
            both.extract("so $18."),
            None,
            "extract is the first filter's"
        );
        let error = AnswerMatch::new(AnswerMatchSpec {
            filters: vec!["a=(".parse().unwrap()],
            ..AnswerMatchSpec::default()
        })
        .unwrap_err();
        assert!(error.starts_with("--filter a \"(\" is not"), "{error}");
        let error = AnswerMatch::new(AnswerMatchSpec {
            extract: Some("x".into()),
            filters: vec!["a=y".parse().unwrap()],
            ..AnswerMatchSpec::default()
        })
        .unwrap_err();
        assert!(error.starts_with("--extract and --filter both"), "{error}");
    }

    #[test]
    fn bad_patterns_and_references_are_refused_saying_what_to_do() {
        // A group left open.
        let error = AnswerMatch::new(AnswerMatchSpec {
            extract: Some("(?<=#+ )([0-9]+".into()),
            ..AnswerMatchSpec::default()
        })
        .unwrap_err();
        assert!(
            error.starts_with("--extract \"(?<=#+ )([0-9]+\" is not a regular expression"),
            "{error}"
        );
        assert!(error.contains("Python's `re` syntax"), "{error}");
        let error = AnswerMatch::new(AnswerMatchSpec {
            ignore: vec!["(".into()],
            ..AnswerMatchSpec::default()
        })
        .unwrap_err();
        assert!(error.starts_with("--ignore-regex \"(\""), "{error}");
        let of = |value: Value| references_of(Some(&value), "answer");
        assert_eq!(of(json!("72")).unwrap(), vec!["72"]);
        assert_eq!(of(json!(72)).unwrap(), vec!["72"]);
        assert_eq!(of(json!(["a", 1, null])).unwrap(), vec!["a", "1"]);
        assert!(of(json!(null)).unwrap().is_empty());
        assert!(references_of(None, "answer").unwrap().is_empty());
        let error = of(json!({"value": "x"})).unwrap_err();
        assert!(
            error.contains("an object") && error.contains("`answer.aliases`"),
            "{error}"
        );
        assert!(
            of(json!([["x"]]))
                .unwrap_err()
                .contains("a list inside a list")
        );
    }

    /// A filter of one pattern, its first or last match.
    fn filter(pattern: &str, select: &str) -> AnswerMatch {
        AnswerMatch::new(AnswerMatchSpec {
            reference_field: Some("answer".into()),
            filters: vec![format!("f{select}={pattern}").parse().unwrap()],
            ..AnswerMatchSpec::default()
        })
        .unwrap()
    }

    #[test]
    fn look_around_and_backreferences_match_as_python_s_re_does() {
        // BIG-Bench Hard's chain-of-thought filter in lm-evaluation-harness: what follows
        // "the answer is ", less its last character.
        let bbh = filter("(?<=the answer is )(.*)(?=.)", "");
        let reasoning = "Fish swim; so the answer is (B).";
        assert_eq!(bbh.extract(reasoning).as_deref(), Some("(B)"));
        assert_eq!(bbh.judge(reasoning, &["(B)".into()]).correct, Some(true));
        assert_eq!(
            bbh.extract("The answer is (B)."),
            None,
            "look-behind is exact"
        );
        // Negative look-around: a number of exactly two digits.
        let two_digits = filter("(?<![0-9])[0-9]{2}(?![0-9])", ":last");
        assert_eq!(
            two_digits.extract("123, 45 and 6, 78!").as_deref(),
            Some("78")
        );
        assert_eq!(two_digits.extract("123 and 4567"), None);
        // A backreference: the doubled word.
        let doubled = filter(r"\b(\w+) \1\b", "");
        assert_eq!(
            doubled.extract("it is is what it is").as_deref(),
            Some("is")
        );
        // The ignore regexes take look-around too: a full stop only at the very end.
        let check = AnswerMatch::new(AnswerMatchSpec {
            reference_field: Some("answer".into()),
            ignore: vec![r"\.(?!.)".into()],
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        assert_eq!(check.normalize("3.14."), "3.14");
    }

    #[test]
    fn a_pattern_that_backtracks_past_the_limit_finds_nothing_there_and_goes_on() {
        // Overlapping alternatives under a repeat, before an atomic group: exponential
        // backtracking on a text without the `c` (Python's `re` would run for hours).
        let runaway = filter("(a|b|ab)*(?>c)", "");
        let text = "ab".repeat(40);
        let gives_up = Regex::new("(a|b|ab)*(?>c)").unwrap().captures(&text);
        assert!(gives_up.is_err(), "past the limit: {gives_up:?}");
        let judged = runaway.judge(&text, &["c".into()]);
        assert_eq!(judged.extracted, None);
        assert_eq!(judged.correct, Some(false));
        assert_eq!(
            runaway.extract("abc").as_deref(),
            Some("b"),
            "it still matches"
        );
        // An ignore regex that gives up leaves the text as it was.
        let check = AnswerMatch::new(AnswerMatchSpec {
            reference_field: Some("answer".into()),
            ignore: vec!["(a|b|ab)*(?>c)".into()],
            ..AnswerMatchSpec::default()
        })
        .unwrap();
        assert_eq!(check.normalize(&text), text);
        assert_eq!(check.normalize("xabc"), "x");
    }
}
