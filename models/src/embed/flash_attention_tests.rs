//! The flash attention op against the formula in f64, on the CPU and (a `cuda` build on a
//! GPU machine) the GPU, inputs stacked and side by side in rows.

use super::*;

use crate::generate::device_ops::{max_abs_diff_to, noise, test_devices as devices};

/// Extras of a case: a padding mask (sequence `s` keeps its first `t - 5 s` keys) and a
/// random bias.
#[derive(Clone, Copy)]
struct Extras {
    padded: bool,
    biased: bool,
}

const PLAIN: Extras = Extras {
    padded: false,
    biased: false,
};
const PADDED: Extras = Extras {
    padded: true,
    biased: false,
};
const PADDED_AND_BIASED: Extras = Extras {
    padded: true,
    biased: true,
};

/// The formula in f64, heads merged: what the op must equal. `keep` `[seqs, t]`, `bias`
/// `[heads, t, t]`.
fn expected(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (keep, bias): (Option<&[f32]>, Option<&[f32]>),
    shape: Dims,
    (causal, scale): (bool, f32),
) -> Vec<f32> {
    let Dims {
        seqs,
        heads,
        kv_heads,
        t,
        head_dim: d,
    } = shape;
    let mut out = vec![0f32; seqs * t * heads * d];
    let queries =
        (0..seqs).flat_map(|s| (0..heads).flat_map(move |h| (0..t).map(move |i| (s, h, i))));
    for (s, h, i) in queries {
        let query = &q[((s * heads + h) * t + i) * d..][..d];
        let kv = (s * kv_heads + h / (heads / kv_heads)) * t * d;
        let seen: Vec<usize> = (0..t)
            .filter(|&j| (!causal || j <= i) && keep.is_none_or(|keep| keep[s * t + j] != 0.0))
            .collect();
        let scores: Vec<f64> = seen
            .iter()
            .map(|&j| {
                let key = &k[kv + j * d..][..d];
                let dot: f64 = query.iter().zip(key).map(|(a, b)| f64::from(a * b)).sum();
                dot * f64::from(scale) + bias.map_or(0.0, |b| f64::from(b[(h * t + i) * t + j]))
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for c in 0..d {
            let value: f64 = seen
                .iter()
                .zip(&weights)
                .map(|(&j, w)| w * f64::from(v[kv + j * d + c]))
                .sum();
            if total > 0.0 {
                out[(s * t + i) * heads * d + h * d + c] = (value / total) as f32;
            }
        }
    }
    out
}

fn case(shape: Dims, causal: bool, extras: Extras, seed: u64) {
    let Dims {
        seqs,
        heads,
        kv_heads,
        t,
        head_dim: d,
    } = shape;
    let scale = 1.0 / (d as f32).sqrt();
    // Scores of a few units, as trained models give: softmax neither flat nor one-hot.
    let q: Vec<f32> = noise(seqs * heads * t * d, seed)
        .iter()
        .map(|x| x * 3.0)
        .collect();
    let k = noise(seqs * kv_heads * t * d, seed + 1);
    let v = noise(seqs * kv_heads * t * d, seed + 2);
    let keep: Option<Vec<f32>> = extras.padded.then(|| {
        (0..seqs * t)
            .map(|r| f32::from(u8::from(r % t + 5 * (r / t) < t)))
            .collect()
    });
    let bias: Option<Vec<f32>> = extras.biased.then(|| noise(heads * t * t, seed + 3));
    let want = expected(
        (&q, &k, &v),
        (keep.as_deref(), bias.as_deref()),
        shape,
        (causal, scale),
    );
    for device in devices() {
        for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::F16, 4e-3), (DType::BF16, 3e-2)] {
            if device.is_cuda() && !kernel_exists(&device, dtype, d) {
                continue;
            }
            let tensor = |data: &[f32], shape: &[usize]| {
                Tensor::from_slice(data, shape, &device)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let keep = keep.as_ref().map(|keep| tensor(keep, &[seqs, t]));
            let bias = bias.as_ref().map(|bias| tensor(bias, &[heads, t, t]));
            let op = FlashAttention {
                seq_len: t,
                head_dim: d,
                causal,
                scale,
                keep: keep.as_ref(),
                bias: bias.as_ref(),
            };
            let (q, k, v) = (
                tensor(&q, &[seqs, heads, t, d]),
                tensor(&k, &[seqs, kv_heads, t, d]),
                tensor(&v, &[seqs, kv_heads, t, d]),
            );
            let stacked = (Heads::Stacked(&q), Heads::Stacked(&k), Heads::Stacked(&v));
            // The same heads side by side in rows, as a fused QKV product gives them: from
            // column 0, and from column 4 (keys and values then off 16-byte alignment).
            for lead in [None, Some(0), Some(4)] {
                let width = (heads + 2 * kv_heads) * d;
                let rows = lead.map(|lead| {
                    tensor(
                        &side_by_side(&[&q, &k, &v], lead),
                        &[seqs * t, lead + width],
                    )
                });
                let (q, k, v) = match (&rows, lead) {
                    (Some(rows), Some(lead)) => {
                        let columns = |first: usize, count| Heads::Columns {
                            rows,
                            first_column: lead + first * d,
                            count,
                        };
                        let kv = columns(heads + kv_heads, kv_heads);
                        (columns(0, heads), columns(heads, kv_heads), kv)
                    }
                    _ => stacked,
                };
                let got = flash_attention(q, k, v, &op).unwrap();
                assert_eq!(got.dims(), &[seqs * t, heads * d]);
                let worst = max_abs_diff_to(&got, &want);
                assert!(
                    worst <= tolerance,
                    "{device:?} {dtype:?} {seqs} seqs of {t}, {heads}/{kv_heads} heads of \
                     {d}, causal {causal}, padded {}, biased {}, columns from {lead:?}: off \
                     by {worst}",
                    extras.padded,
                    extras.biased
                );
            }
        }
    }
}

/// Stacked `[seqs, heads, t, d]` inputs side by side in `[seqs * t, lead + all heads * d]`
/// rows after `lead` zero columns (f32 values, read back from the tensors).
fn side_by_side(inputs: &[&Tensor; 3], lead: usize) -> Vec<f32> {
    let (seqs, _, t, d) = inputs[0].dims4().unwrap();
    let all: usize = inputs.iter().map(|x| x.dims4().unwrap().1).sum();
    let width = lead + all * d;
    let mut rows = vec![0f32; seqs * t * width];
    let mut column = lead;
    for x in inputs {
        let count = x.dims4().unwrap().1;
        let values: Vec<f32> = x
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for s in 0..seqs {
            for h in 0..count {
                for i in 0..t {
                    let from = ((s * count + h) * t + i) * d;
                    let to = (s * t + i) * width + column + h * d;
                    rows[to..to + d].copy_from_slice(&values[from..from + d]);
                }
            }
        }
        column += count * d;
    }
    rows
}

fn shape(seqs: usize, heads: usize, kv_heads: usize, t: usize, head_dim: usize) -> Dims {
    Dims {
        seqs,
        heads,
        kv_heads,
        t,
        head_dim,
    }
}

/// Qwen3-0.6B's heads (16 over 8 KV heads of 128) and smaller groups, lengths around
/// the kernel's 64-key tiles: one token, a tile less one, a tile and one, several tiles.
#[test]
fn causal_attention_equals_the_formula_across_tile_edges() {
    case(shape(2, 16, 8, 1, 128), true, PLAIN, 1);
    case(shape(2, 16, 8, 63, 128), true, PLAIN, 2);
    case(shape(1, 16, 8, 130, 128), true, PLAIN, 3);
    case(shape(3, 4, 1, 65, 64), true, PLAIN, 4);
    case(shape(1, 2, 2, 200, 32), true, PLAIN, 5);
}

/// Bidirectional (BERT-style) attention: every query sees every key of its sequence but
/// the padding; MPNet's bias added to the scores; a sequence of padding only gives zeros.
#[test]
fn full_attention_with_padding_and_bias_equals_the_formula() {
    case(shape(2, 12, 12, 77, 32), false, PLAIN, 6);
    case(shape(3, 12, 12, 70, 32), false, PADDED, 7);
    case(shape(2, 12, 12, 128, 64), false, PADDED_AND_BIASED, 8);
    case(shape(2, 4, 2, 33, 128), false, PADDED_AND_BIASED, 9);
    // t = 10: the third sequence keeps no key.
    case(shape(3, 2, 2, 10, 64), false, PADDED, 10);
    case(shape(2, 4, 2, 66, 64), true, PADDED_AND_BIASED, 11);
}

#[test]
fn mismatched_keys_are_refused_with_the_shapes() {
    let device = Device::Cpu;
    let q = Tensor::zeros((1, 4, 8, 32), DType::F32, &device).unwrap();
    let kv = Tensor::zeros((1, 3, 8, 32), DType::F32, &device).unwrap();
    let op = FlashAttention {
        seq_len: 8,
        head_dim: 32,
        causal: true,
        scale: 1.0,
        keep: None,
        bias: None,
    };
    let (q, kv) = (Heads::Stacked(&q), Heads::Stacked(&kv));
    let error = flash_attention(q, kv, kv, &op).unwrap_err().to_string();
    assert!(error.contains("heads a multiple of kv_heads"), "{error}");
    assert!(error.contains("[1, 3, 8, 32]"), "{error}");
    // Columns past the rows' width.
    let rows = Tensor::zeros((8, 64), DType::F32, &device).unwrap();
    let columns = |first_column| Heads::Columns {
        rows: &rows,
        first_column,
        count: 1,
    };
    let error = flash_attention(columns(0), columns(32), columns(40), &op)
        .unwrap_err()
        .to_string();
    assert!(error.contains("from column 40 of rows [8, 64]"), "{error}");
}

#[test]
fn the_cpu_and_f32_never_fit_the_kernel() {
    assert!(!flash_attention_fits(&Device::Cpu, DType::BF16, 128));
    for device in devices().into_iter().filter(Device::is_cuda) {
        assert!(!flash_attention_fits(&device, DType::F32, 128));
        assert!(!flash_attention_fits(&device, DType::F16, 80));
    }
}

/// On a GPU, the first-use check passes for every kernel this GPU has (it runs the same
/// comparison the encoders rely on).
#[test]
fn the_first_use_check_passes_for_each_kernel() {
    for device in devices().into_iter().filter(Device::is_cuda) {
        for dtype in [DType::F16, DType::BF16] {
            for width in HEAD_WIDTHS {
                if kernel_exists(&device, dtype, width) {
                    self_check(&device, dtype, width).unwrap();
                    assert!(flash_attention_fits(&device, dtype, width));
                }
            }
        }
    }
    assert!(
        self_check(&Device::Cpu, DType::F32, 64).is_ok(),
        "the CPU against itself"
    );
}
