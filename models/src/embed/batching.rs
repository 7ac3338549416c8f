//! Cutting one chunk into model batches (pure).
//!
//! Texts are sorted by token length (longest first, so the first batch shows the peak memory),
//! then cut greedily: a batch grows while `size * longest <= max_batch_tokens` (padded tokens
//! stay under the budget) and `size <= max_batch_size`. Short texts therefore travel in large
//! batches and long ones in small, with almost no padding.

/// Indices into the chunk, one inner `Vec` per batch, each sorted longest first.
pub fn plan_batches(
    lengths: &[usize],
    max_batch_tokens: usize,
    max_batch_size: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut longest = 0;
    for index in order {
        let length = lengths[index].max(1);
        let grown_longest = longest.max(length);
        let fits = current.len() < max_batch_size.max(1)
            && (current.len() + 1) * grown_longest <= max_batch_tokens;
        if !current.is_empty() && !fits {
            batches.push(std::mem::take(&mut current));
            longest = 0;
        }
        longest = longest.max(length);
        current.push(index);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Real and padded token counts of a plan.
pub fn token_counts(lengths: &[usize], batches: &[Vec<usize>]) -> (usize, usize) {
    let real = batches.iter().flatten().map(|&i| lengths[i]).sum();
    let padded = batches
        .iter()
        .map(|b| b.len() * b.iter().map(|&i| lengths[i]).max().unwrap_or(0))
        .sum();
    (real, padded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_text_once_and_budget_kept() {
        let lengths = vec![5, 300, 12, 12, 7, 256, 1, 40, 40, 40];
        let batches = plan_batches(&lengths, 600, 4);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for batch in &batches {
            let longest = batch.iter().map(|&i| lengths[i]).max().unwrap();
            assert!(batch.len() <= 4);
            assert!(
                batch.len() * longest <= 600 || batch.len() == 1,
                "{batch:?}"
            );
        }
        assert_eq!(
            batches[0],
            vec![1, 5],
            "the two longest share a batch under 600 tokens"
        );
    }

    #[test]
    fn a_text_over_budget_goes_alone() {
        assert_eq!(plan_batches(&[1000, 10], 512, 32), vec![vec![0], vec![1]]);
    }

    #[test]
    fn sorting_leaves_little_padding() {
        let lengths: Vec<usize> = (0..1000).map(|i| 10 + (i * 7919) % 240).collect();
        let batches = plan_batches(&lengths, 8192, 64);
        let (real, padded) = token_counts(&lengths, &batches);
        assert!(
            padded as f64 / (real as f64) < 1.05,
            "padding {real} -> {padded}"
        );
    }

    #[test]
    fn empty_chunk_has_no_batches() {
        assert!(plan_batches(&[], 100, 8).is_empty());
    }
}
