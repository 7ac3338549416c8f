//! `--limit` (pure): the input's first N records, or a share of them, as
//! lm-evaluation-harness's `--limit` takes either (`--limit 100`, `--limit 0.1`). A share
//! becomes a count once the input is counted (`scan::resolve_limit_share`): the
//! job then reads exactly the records `--limit` with that count would.

use std::fmt;
use std::str::FromStr;

/// How much of the input a job reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RecordLimit {
    /// The first this many records (1 or more).
    Records(u64),
    /// This share of the records, above 0 and below 1: the first `ceil(share x records)`,
    /// as lm-evaluation-harness rounds it.
    Share(f64),
}

impl RecordLimit {
    /// The share as a count of the input's `items` (records and bad lines).
    pub fn records_of(self, items: u64) -> u64 {
        match self {
            Self::Records(count) => count,
            Self::Share(share) => (share * items as f64).ceil() as u64,
        }
    }
}

impl FromStr for RecordLimit {
    type Err = String;

    /// `N` (a whole number from 1) or a share between 0 and 1 (`0.1`); anything else is
    /// refused saying which to give.
    fn from_str(text: &str) -> Result<Self, String> {
        let refused = || {
            format!(
                "{text:?} is not a limit: give a count of records from 1 (100) or a share of \
                 them between 0 and 1 (0.1)"
            )
        };
        if let Ok(count) = text.parse::<u64>() {
            return (count >= 1)
                .then_some(Self::Records(count))
                .ok_or_else(refused);
        }
        let share: f64 = text.parse().map_err(|_| refused())?;
        (share > 0.0 && share < 1.0)
            .then_some(Self::Share(share))
            .ok_or_else(refused)
    }
}

impl fmt::Display for RecordLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Records(count) => write!(f, "{count}"),
            Self::Share(share) => write!(f, "{share}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_a_count_from_one_or_a_share_below_one_rounded_up() {
        assert_eq!("100".parse(), Ok(RecordLimit::Records(100)));
        assert_eq!("0.1".parse(), Ok(RecordLimit::Share(0.1)));
        assert_eq!(".25".parse(), Ok(RecordLimit::Share(0.25)));
        for refused in [
            "0", "0.0", "1.0", "1.5", "-3", "-0.1", "NaN", "inf", "ten", "",
        ] {
            let error = refused.parse::<RecordLimit>().unwrap_err();
            assert!(error.contains("give a count of records from 1"), "{error}");
        }
        // lm-evaluation-harness: int(math.ceil(len(docs) * limit)).
        assert_eq!(RecordLimit::Share(0.1).records_of(1_000), 100);
        assert_eq!(RecordLimit::Share(0.1).records_of(1_001), 101);
        assert_eq!(RecordLimit::Share(0.5).records_of(1), 1);
        assert_eq!(RecordLimit::Share(0.5).records_of(0), 0);
        assert_eq!(RecordLimit::Records(7).records_of(3), 7);
        assert_eq!(RecordLimit::Share(0.1).to_string(), "0.1");
    }
}
