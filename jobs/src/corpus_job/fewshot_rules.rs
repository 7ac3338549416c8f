//! The rules by which the CLI and Python refuse few-shot arguments that cannot work, each
//! front end wording them in its own names (as `answer_spec` does for answer checks).

/// What a front end was asked for, as far as the few-shot rules need.
#[derive(Clone, Copy, Debug, Default)]
pub struct FewshotAsked {
    /// A file of examples (`--fewshot-input`).
    pub input: bool,
    /// Arguments that pick or write the examples from that file: a group field, a seed, a
    /// sampler other than the default, an answer field.
    pub picked: bool,
    /// Something answers the examples: scoring (their right choice), their own answer
    /// field, or the job's reference field.
    pub answered: bool,
}

/// Why few-shot arguments cannot run as asked; [`FewshotRefusal::message`] words it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FewshotRefusal {
    /// Arguments that pick or write examples, without the file they come from.
    PickedWithoutInput,
    /// Examples with nothing to answer them.
    Unanswered,
}

impl FewshotAsked {
    /// Why these arguments cannot run, if they cannot.
    pub fn refusal(&self) -> Option<FewshotRefusal> {
        match (self.input, self.picked, self.answered) {
            (false, true, _) => Some(FewshotRefusal::PickedWithoutInput),
            (true, _, false) => Some(FewshotRefusal::Unanswered),
            _ => None,
        }
    }
}

/// What a front end calls the arguments named in refusals.
#[derive(Clone, Copy, Debug)]
pub struct FewshotFlags {
    /// The file of examples.
    pub input: &'static str,
    /// The field that groups them.
    pub group: &'static str,
    /// The seed that draws them.
    pub seed: &'static str,
    /// How they are drawn.
    pub sampler: &'static str,
    /// The field of their answers.
    pub answer_field: &'static str,
    /// Asking for scoring.
    pub score: &'static str,
    /// The records' reference field.
    pub reference_field: &'static str,
}

impl FewshotFlags {
    /// `resident generate`'s flags.
    pub const CLI: Self = Self {
        input: "--fewshot-input",
        group: "--fewshot-group",
        seed: "--fewshot-seed",
        sampler: "--fewshot-sampler",
        answer_field: "--fewshot-answer-field",
        score: "--score",
        reference_field: "--reference-field",
    };

    /// Python's `generate_job` keyword arguments.
    pub const PYTHON: Self = Self {
        input: "fewshot_input",
        group: "fewshot_group",
        seed: "fewshot_seed",
        sampler: "fewshot_sampler",
        answer_field: "fewshot_answer_field",
        score: "score=True",
        reference_field: "reference_field",
    };
}

impl FewshotRefusal {
    /// What was wrong and what to do, in `flags`' names.
    pub fn message(self, flags: &FewshotFlags) -> String {
        let FewshotFlags {
            input,
            answer_field,
            ..
        } = flags;
        match self {
            Self::PickedWithoutInput => format!(
                "{}, {}, {} and {answer_field} pick and write each record's examples from \
                 {input}: give that file too",
                flags.group, flags.seed, flags.sampler
            ),
            Self::Unanswered => format!(
                "{input} puts answered examples before each prompt: it needs {} (and records \
                 with choices), {answer_field} or {} (each example's answer)",
                flags.score, flags.reference_field
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Picking arguments need the file; the file needs an answer for its examples; each
    /// refusal is worded in the front end's names.
    #[test]
    fn fewshot_arguments_are_refused_in_each_front_end_s_names() {
        let asked = |input, picked, answered| FewshotAsked {
            input,
            picked,
            answered,
        };
        assert_eq!(asked(false, false, false).refusal(), None);
        assert_eq!(asked(true, true, true).refusal(), None);
        assert_eq!(
            asked(false, true, true).refusal(),
            Some(FewshotRefusal::PickedWithoutInput)
        );
        assert_eq!(
            asked(true, false, false).refusal(),
            Some(FewshotRefusal::Unanswered)
        );
        let cli = FewshotRefusal::Unanswered.message(&FewshotFlags::CLI);
        assert!(
            cli.starts_with(
                "--fewshot-input puts answered examples before each prompt: it \
                 needs --score (and records with choices), --fewshot-answer-field or \
                 --reference-field"
            ),
            "{cli}"
        );
        let python = FewshotRefusal::PickedWithoutInput.message(&FewshotFlags::PYTHON);
        assert_eq!(
            python,
            "fewshot_group, fewshot_seed, fewshot_sampler and fewshot_answer_field pick and \
             write each record's examples from fewshot_input: give that file too"
        );
    }
}
