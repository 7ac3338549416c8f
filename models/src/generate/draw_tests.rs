//! The draw's kept set and its distribution on the host, and the device's kernel against
//! them (on a GPU when the build has `cuda` and the machine one).

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::generate::device_ops::test_devices;

fn draw(temperature: f32, top_k: u32, top_p: f32, min_p: f32, uniform: f32) -> Draw {
    Draw {
        temperature,
        top_k,
        top_p,
        min_p,
        uniform,
    }
}

#[test]
fn the_kept_set_is_the_likeliest_run_with_ties_by_the_lower_id() {
    // Ties at 2.0 (ids 1, 3, 4) and at 0.0 (ids 0, 5).
    let logits = [0.0, 2.0, f32::NEG_INFINITY, 2.0, 2.0, 0.0, 3.0, f32::NAN];
    let kept = |d: Draw| kept_tokens(&logits, &d).0;
    assert_eq!(kept(draw(1.0, 0, 1.0, 0.0, 0.5)), vec![6, 1, 3, 4, 0, 5]);
    assert_eq!(kept(draw(1.0, 3, 1.0, 0.0, 0.5)), vec![6, 1, 3]);
    // p(2.0) / p(3.0) = e^-1 = 0.37: min_p 0.3 keeps them, 0.5 does not.
    assert_eq!(kept(draw(1.0, 0, 1.0, 0.3, 0.5)), vec![6, 1, 3, 4]);
    assert_eq!(kept(draw(1.0, 0, 1.0, 0.5, 0.5)), vec![6]);
    // Weights 1, e^-1 (three), e^-3 (two): 1 / 2.20 = 0.45, then 0.62, 0.79, 0.95.
    assert_eq!(kept(draw(1.0, 0, 0.6, 0.0, 0.5)), vec![6, 1]);
    assert_eq!(kept(draw(1.0, 0, 0.7, 0.0, 0.5)), vec![6, 1, 3]);
    assert_eq!(kept(draw(1.0, 0, 0.96, 0.0, 0.5)), vec![6, 1, 3, 4, 0]);
    assert_eq!(kept(draw(1.0, 0, 0.1, 0.0, 0.5)), vec![6]);
    // A low temperature sharpens: e^-10 is under min_p 1e-4.
    assert_eq!(kept(draw(0.1, 0, 1.0, 1e-4, 0.5)), vec![6]);
}

#[test]
fn draws_fall_in_proportion_to_the_kept_weights_walked_in_id_order() {
    let logits: Vec<f32> = (0..40).map(|i| ((i * 37) % 11) as f32 * 0.4).collect();
    let d = draw(0.7, 12, 0.95, 0.0, 0.0);
    let (kept, weights) = kept_tokens(&logits, &d);
    let total: f32 = weights.iter().sum();
    let n = 20_000;
    let mut counts = vec![0usize; logits.len()];
    for j in 0..n {
        let uniform = (j as f32 + 0.5) / n as f32;
        counts[draw_token(&logits, &Draw { uniform, ..d }) as usize] += 1;
    }
    for (id, count) in counts.iter().enumerate() {
        match kept.iter().position(|&k| k as usize == id) {
            None => assert_eq!(*count, 0, "token {id} is not kept"),
            Some(i) => {
                let expected = weights[i] / total * n as f32;
                assert!(
                    (*count as f32 - expected).abs() <= 2.0,
                    "{id}: {count} vs {expected}"
                );
            }
        }
    }
    // The walk is in id order: the smallest uniform draws the smallest kept id.
    let first = *kept.iter().min().unwrap();
    assert_eq!(draw_token(&logits, &Draw { uniform: 0.0, ..d }), first);
}

#[test]
fn rows_with_nothing_finite_take_the_hosts_argmax() {
    let d = draw(1.0, 0, 1.0, 0.0, 0.3);
    let nan_inf = [f32::NEG_INFINITY, f32::NAN, f32::INFINITY, f32::INFINITY];
    assert_eq!(draw_token(&nan_inf, &d), 2);
    assert_eq!(draw_token(&[f32::NEG_INFINITY; 4], &d), 0);
    for device in test_devices() {
        let logits = Tensor::new(&[nan_inf, [f32::NEG_INFINITY; 4]], &device).unwrap();
        assert_eq!(
            sample_rows(&logits, &[d, d]).unwrap(),
            vec![2, 0],
            "{device:?}"
        );
    }
}

/// Logits of a vocabulary-sized row with many equal values (rounded to bf16, as a GPU's
/// logits are), and the draws of every kind of truncation.
fn rows_and_draws(vocab: usize) -> (Vec<Vec<f32>>, Vec<Draw>) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32
    };
    let params = [
        (1.0, 0, 1.0, 0.0),
        (0.8, 40, 1.0, 0.0),
        (0.7, 0, 0.9, 0.0),
        (1.2, 50, 0.95, 0.05),
        (0.5, 1, 1.0, 0.0),
        (1.0, 0, 0.5, 0.1),
        (2.0, 7, 0.3, 0.0),
        (0.9, 0, 1.0, 0.2),
    ];
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    for (i, &(temperature, top_k, top_p, min_p)) in params.iter().cycle().take(48).enumerate() {
        let spread = [2.0, 6.0, 12.0][i % 3];
        let row: Vec<f32> = (0..vocab)
            .map(|_| half::bf16::from_f32((next() - 0.5) * spread).to_f32())
            .collect();
        rows.push(row);
        draws.push(draw(temperature, top_k, top_p, min_p, next()));
    }
    (rows, draws)
}

#[test]
fn the_device_draws_what_the_reference_draws() {
    let vocab = 5000;
    let (rows, draws) = rows_and_draws(vocab);
    let expected: Vec<u32> = rows
        .iter()
        .zip(&draws)
        .map(|(r, d)| draw_token(r, d))
        .collect();
    for device in test_devices() {
        for dtype in [DType::F32, DType::BF16] {
            let logits = Tensor::from_vec(rows.concat(), (rows.len(), vocab), &device)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let got = sample_rows(&logits, &draws).unwrap();
            // The same kept set and order; only the weights' rounding (the device's expf,
            // its sums in another order) may move a draw that falls within a few ulps of a
            // boundary to the neighbouring kept token.
            let mut same = 0;
            for (i, (&g, &e)) in got.iter().zip(&expected).enumerate() {
                let kept = kept_tokens(&rows[i], &draws[i]).0;
                assert!(
                    kept.contains(&g),
                    "{device:?} {dtype:?} row {i}: {g} is not kept"
                );
                same += usize::from(g == e);
            }
            match device {
                Device::Cpu => assert_eq!(got, expected, "{dtype:?}"),
                _ => assert!(
                    same + 1 >= got.len(),
                    "{device:?} {dtype:?}: {same} of {}",
                    got.len()
                ),
            }
        }
    }
}

#[test]
fn a_rows_draw_on_the_device_is_the_same_every_time() {
    let (rows, draws) = rows_and_draws(49_152);
    for device in test_devices() {
        let logits = Tensor::from_vec(rows.concat(), (rows.len(), 49_152), &device)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let first = sample_rows(&logits, &draws).unwrap();
        for _ in 0..3 {
            assert_eq!(sample_rows(&logits, &draws).unwrap(), first, "{device:?}");
        }
    }
}
