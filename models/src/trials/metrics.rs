//! Validation metrics (pure): accuracy and macro-F1 for classifiers, recall@10 and nDCG@10
//! for retrieval with one relevant document per query.

/// Share of `predicted` equal to `truth`.
pub fn accuracy(predicted: &[u32], truth: &[u32]) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    let right = predicted.iter().zip(truth).filter(|(p, t)| p == t).count();
    right as f64 / truth.len() as f64
}

/// Mean F1 over the classes that occur in `truth` or `predicted`.
pub fn macro_f1(predicted: &[u32], truth: &[u32], classes: usize) -> f64 {
    let (mut tp, mut fp, mut fn_) = (
        vec![0u32; classes],
        vec![0u32; classes],
        vec![0u32; classes],
    );
    for (&p, &t) in predicted.iter().zip(truth) {
        if p == t {
            tp[t as usize] += 1;
        } else {
            fp[p as usize] += 1;
            fn_[t as usize] += 1;
        }
    }
    let scores: Vec<f64> = (0..classes)
        .filter(|&c| tp[c] + fp[c] + fn_[c] > 0)
        .map(|c| 2.0 * f64::from(tp[c]) / f64::from(2 * tp[c] + fp[c] + fn_[c]))
        .collect();
    if scores.is_empty() {
        0.0
    } else {
        scores.iter().sum::<f64>() / scores.len() as f64
    }
}

/// recall@10 from each query's 0-based rank of its relevant document.
pub fn recall_at_10(ranks: &[u32]) -> f64 {
    if ranks.is_empty() {
        return 0.0;
    }
    ranks.iter().filter(|&&r| r < 10).count() as f64 / ranks.len() as f64
}

/// nDCG@10 with one relevant document per query: 1 / log2(rank + 2) inside the top 10.
pub fn ndcg_at_10(ranks: &[u32]) -> f64 {
    if ranks.is_empty() {
        return 0.0;
    }
    let gain: f64 = ranks
        .iter()
        .filter(|&&r| r < 10)
        .map(|&r| 1.0 / (f64::from(r) + 2.0).log2())
        .sum();
    gain / ranks.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_metrics() {
        let truth = [0, 0, 1, 1, 2];
        let predicted = [0, 1, 1, 1, 0];
        assert!((accuracy(&predicted, &truth) - 0.6).abs() < 1e-12);
        // class 0: tp1 fp1 fn1 -> 0.5; class 1: tp2 fp1 fn0 -> 0.8; class 2: tp0 fn1 -> 0.
        let f1 = macro_f1(&predicted, &truth, 4);
        assert!((f1 - (0.5 + 0.8 + 0.0) / 3.0).abs() < 1e-12, "{f1}");
        assert_eq!(macro_f1(&truth, &truth, 3), 1.0);
    }

    #[test]
    fn ranking_metrics() {
        let ranks = [0, 1, 9, 10, 500];
        assert!((recall_at_10(&ranks) - 0.6).abs() < 1e-12);
        let expected = (1.0 + 1.0 / 3f64.log2() + 1.0 / 11f64.log2()) / 5.0;
        assert!((ndcg_at_10(&ranks) - expected).abs() < 1e-12);
    }
}
