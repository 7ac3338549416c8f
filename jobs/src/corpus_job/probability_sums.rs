//! The sums behind a scoring job's mean probabilities (pure): each answered record's
//! right choices' probability among the choices (TruthfulQA MC2's figure) and its Brier
//! score, each kept as records, sum and squares' sum, so chunks add up and the mean's
//! standard error follows. The job's counts and each group's keep one set each, flattened
//! into the manifest and the report under the same field names.

use serde::{Deserialize, Serialize};

use super::shares::mean_with_stderr;
use crate::serde_skip::is_default;

/// The answered records' probabilities and Brier scores, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbabilitySums {
    /// The answered records whose right choices' probability among all is a number.
    #[serde(default, skip_serializing_if = "is_default")]
    pub answer_probability_records: u64,
    /// The sum of those probabilities.
    #[serde(default, skip_serializing_if = "is_default")]
    pub answer_probability_sum: f64,
    /// The sum of their squares (for the mean's standard error).
    #[serde(default, skip_serializing_if = "is_default")]
    pub answer_probability_squares: f64,
    /// The answered records that named one right choice and whose Brier score is a
    /// number.
    #[serde(default, skip_serializing_if = "is_default")]
    pub brier_records: u64,
    /// The sum of their Brier scores.
    #[serde(default, skip_serializing_if = "is_default")]
    pub brier_sum: f64,
    /// The sum of their squares (for the mean's standard error).
    #[serde(default, skip_serializing_if = "is_default")]
    pub brier_squares: f64,
}

impl ProbabilitySums {
    /// Counts one answered record's right choices' probability and Brier score, where it
    /// has them (`None` for NaN, and a Brier score needs one right answer).
    pub fn add(&mut self, answer_probability: Option<f64>, brier: Option<f64>) {
        if let Some(p) = answer_probability {
            self.answer_probability_records += 1;
            self.answer_probability_sum += p;
            self.answer_probability_squares += p * p;
        }
        if let Some(b) = brier {
            self.brier_records += 1;
            self.brier_sum += b;
            self.brier_squares += b * b;
        }
    }

    /// Adds another chunk's sums.
    pub fn absorb(&mut self, other: &ProbabilitySums) {
        self.answer_probability_records += other.answer_probability_records;
        self.answer_probability_sum += other.answer_probability_sum;
        self.answer_probability_squares += other.answer_probability_squares;
        self.brier_records += other.brier_records;
        self.brier_sum += other.brier_sum;
        self.brier_squares += other.brier_squares;
    }

    /// The mean right choices' probability and its standard error (`None` without
    /// records; no error for one).
    pub fn answer_probability(&self) -> Option<(f64, Option<f64>)> {
        mean_with_stderr(
            self.answer_probability_sum,
            self.answer_probability_squares,
            self.answer_probability_records,
        )
    }

    /// The mean Brier score and its standard error, likewise.
    pub fn brier_score(&self) -> Option<(f64, Option<f64>)> {
        mean_with_stderr(self.brier_sum, self.brier_squares, self.brier_records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_add_up_by_record_and_by_chunk_and_give_the_means() {
        let mut first = ProbabilitySums::default();
        first.add(Some(0.5), Some(0.5));
        first.add(Some(1.0), None);
        first.add(None, None);
        let mut second = ProbabilitySums::default();
        second.add(Some(0.0), Some(1.5));
        let mut whole = first;
        whole.absorb(&second);
        assert_eq!(
            (whole.answer_probability_records, whole.brier_records),
            (3, 2)
        );
        assert_eq!(whole.answer_probability_sum, 1.5);
        assert_eq!(whole.answer_probability_squares, 1.25);
        assert_eq!((whole.brier_sum, whole.brier_squares), (2.0, 2.5));
        let (mean, stderr) = whole.answer_probability().unwrap();
        // Values 0.5, 1, 0: mean 0.5, sample variance 0.25, stderr sqrt(0.25 / 3).
        assert_eq!(mean, 0.5);
        assert!((stderr.unwrap() - (0.25f64 / 3.0).sqrt()).abs() < 1e-12);
        let (mean, stderr) = whole.brier_score().unwrap();
        // Values 0.5, 1.5: mean 1, sample variance 0.5, stderr 0.5.
        assert_eq!(mean, 1.0);
        assert!((stderr.unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(second.answer_probability(), Some((0.0, None)));
        assert_eq!(ProbabilitySums::default().brier_score(), None);
    }

    #[test]
    fn empty_sums_write_no_fields_and_written_sums_read_back() {
        let empty = serde_json::to_value(ProbabilitySums::default()).unwrap();
        assert_eq!(empty, serde_json::json!({}));
        let mut sums = ProbabilitySums::default();
        sums.add(Some(0.25), Some(0.75));
        let written = serde_json::to_value(sums).unwrap();
        assert_eq!(written["answer_probability_sum"], 0.25);
        assert_eq!(written["brier_squares"], 0.5625);
        assert_eq!(
            serde_json::from_value::<ProbabilitySums>(written).unwrap(),
            sums
        );
    }
}
