//! A report's shares of records and their standard errors (pure), as
//! lm-evaluation-harness reports `acc` beside `acc_stderr`: a share of right answers is the
//! mean of each record's 0 or 1, and its standard error that mean's (the sample standard
//! deviation, over n - 1, divided by the square root of n), so two models' figures can be
//! told apart from noise.

/// `part / whole`; `None` when `whole` is 0.
pub fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// The standard error of `part / whole`: `sqrt(p (1 - p) / (whole - 1))`, which is the
/// sample standard deviation of `whole` outcomes of 0 or 1 over the square root of
/// `whole`; `None` for fewer than two records.
pub fn share_stderr(part: u64, whole: u64) -> Option<f64> {
    let p = share(part, whole)?;
    (whole > 1).then(|| (p * (1.0 - p) / (whole - 1) as f64).sqrt())
}

/// The standard error of the mean of independent groups' shares, each group counting
/// once (a macro average): `sqrt(sum of their squared errors) / groups`; `None` when a
/// group has none (a group of one record).
pub fn mean_stderr(stderrs: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let (mut squares, mut groups) = (0.0, 0usize);
    for stderr in stderrs {
        squares += stderr? * stderr?;
        groups += 1;
    }
    (groups > 0).then(|| squares.sqrt() / groups as f64)
}

/// The mean of `count` values from their sum and the sum of their squares, and its
/// standard error (the sample standard deviation, over n - 1, over the square root of n;
/// `None` under two values), as lm-evaluation-harness reports a mean of fractions (MC2's
/// `acc`); `None` without values.
pub fn mean_with_stderr(sum: f64, squares: f64, count: u64) -> Option<(f64, Option<f64>)> {
    let n = count as f64;
    let mean = (count > 0).then(|| sum / n)?;
    // Rounding may take squares - n mean^2 a hair below 0 where every value is the same.
    let variance = || ((squares - n * mean * mean) / (n - 1.0)).max(0.0);
    let stderr = (count > 1).then(|| (variance() / n).sqrt());
    Some((mean, stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lm-evaluation-harness's `mean_stderr`, written out over the outcomes themselves.
    fn stderr_of(outcomes: &[f64]) -> f64 {
        let n = outcomes.len() as f64;
        let mean = outcomes.iter().sum::<f64>() / n;
        let variance = outcomes.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        variance.sqrt() / n.sqrt()
    }

    #[test]
    fn a_mean_s_error_is_lm_evaluation_harness_s_from_the_sums_alone() {
        let values = [0.625, 0.1, 0.9, 0.333, 0.0, 1.0];
        let (sum, squares) = (values.iter().sum(), values.iter().map(|v| v * v).sum());
        let (mean, stderr) = mean_with_stderr(sum, squares, values.len() as u64).unwrap();
        assert!((mean - values.iter().sum::<f64>() / 6.0).abs() < 1e-12);
        assert!((stderr.unwrap() - stderr_of(&values)).abs() < 1e-12);
        assert_eq!(mean_with_stderr(0.4, 0.16, 1), Some((0.4, None)));
        assert_eq!(mean_with_stderr(0.0, 0.0, 0), None);
        let same = mean_with_stderr(0.3 * 3.0, 0.09 * 3.0, 3).unwrap();
        assert!(
            same.1.unwrap() >= 0.0,
            "rounding never makes a negative variance"
        );
    }

    #[test]
    fn a_share_s_error_is_the_standard_error_of_its_outcomes_mean() {
        for (part, whole) in [(1, 2), (5, 7), (0, 9), (9, 9), (230, 400)] {
            let outcomes: Vec<f64> = (0..whole).map(|i| f64::from(u8::from(i < part))).collect();
            let stderr = share_stderr(part, whole).unwrap();
            assert!(
                (stderr - stderr_of(&outcomes)).abs() < 1e-12,
                "{part}/{whole}"
            );
        }
        assert_eq!(share_stderr(1, 2), Some(0.5));
        assert_eq!(
            share_stderr(1, 1),
            None,
            "one record has no spread to measure"
        );
        assert_eq!((share(0, 0), share_stderr(0, 0)), (None, None));
    }

    #[test]
    fn a_mean_of_groups_adds_their_variances() {
        let (a, b) = (share_stderr(1, 2).unwrap(), share_stderr(2, 5).unwrap());
        let mean = mean_stderr([Some(a), Some(b)]).unwrap();
        assert!((mean - (a * a + b * b).sqrt() / 2.0).abs() < 1e-12);
        assert_eq!(mean_stderr([Some(a), None]), None);
        assert_eq!(mean_stderr([]), None);
    }
}
