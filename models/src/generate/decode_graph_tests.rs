//! The decode graphs' policy (buckets, which steps), the padded step on every device (what a
//! graph replays, run eagerly: on the CPU as well), and, on a GPU, graphs against eager
//! steps over a run whose batch shrinks and grows and whose cache grows.

use candle_core::{DType, Device, Tensor};

use super::super::decoder::{LlamaConfig, NextToken, Pick, RopeStyle, Row};
use super::super::dense::{DenseKv, DenseLinear, DenseLlama, Part, WeightSource, build};
use super::super::device_ops::{noise, test_devices};
use super::super::kv_blocks::BLOCK_SIZE;
use super::super::sampling;
use super::super::step_profile::PhaseClock;
use super::*;
use crate::ModelError;

#[test]
fn a_step_is_padded_to_the_next_bucket_and_never_by_more_than_half_again_from_16() {
    assert_eq!(bucket(0), None);
    assert_eq!(bucket(1), Some(1));
    assert_eq!(bucket(3), Some(4));
    assert_eq!(bucket(17), Some(24));
    assert_eq!(bucket(200), Some(256));
    assert_eq!(bucket(512), Some(512));
    assert_eq!(bucket(513), None, "past the largest: eager");
    for rows in 1..=512 {
        let size = bucket(rows).unwrap();
        assert!(size >= rows);
        if rows > 16 {
            assert!(2 * size <= 3 * rows, "{rows} rows padded to {size}");
        }
    }
}

fn row(slot: usize, pos: usize, logits: bool) -> Row {
    Row {
        slot,
        pos,
        token: (slot * 7 + pos * 3) as u32 % 96,
        logits,
        pick: Pick::Logits,
    }
}

#[test]
fn only_steps_of_one_row_a_sequence_each_wanting_logits_are_graphed() {
    let decode = [row(3, 40, true), row(0, 7, true), row(5, 1, true)];
    assert!(is_decode_step(&decode));
    assert!(!is_decode_step(&[]));
    let prefill = [row(3, 40, true), row(0, 0, false), row(0, 1, true)];
    assert!(!is_decode_step(&prefill), "a prompt's rows");
    let twice = [row(3, 40, true), row(0, 7, true), row(3, 41, true)];
    assert!(!is_decode_step(&twice), "one slot twice");
}

/// A model of SmolLM2's layout at a tiny size, random weights (tied output).
fn tiny_model(device: &Device, dtype: DType) -> DenseLlama {
    tiny_model_seeded(device, dtype, 0)
}

/// [`tiny_model`] with other random weights for each `seed`.
fn tiny_model_seeded(device: &Device, dtype: DType, seed: u64) -> DenseLlama {
    let config = LlamaConfig {
        layers: 2,
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        // 32: the smallest head the tensor-core attention takes (the half-precision runs).
        head_dim: 32,
        ffn: 128,
        vocab: 96,
        context: 512,
        rope_base: 10_000.0,
        rms_eps: 1e-5,
        rope: RopeStyle::Halves,
        rope_freq_factors: None,
    };
    let mut source = RandomWeights {
        config: config.clone(),
        device: device.clone(),
        dtype,
        seed,
    };
    build(config, &mut source, device.clone(), dtype).unwrap()
}

struct RandomWeights {
    config: LlamaConfig,
    device: Device,
    dtype: DType,
    seed: u64,
}

impl RandomWeights {
    fn shape(&self, part: Part) -> Option<(usize, usize)> {
        let c = &self.config;
        let q = c.heads * c.head_dim;
        match part {
            Part::AttnNorm | Part::FfnNorm | Part::OutputNorm => Some((1, c.hidden)),
            Part::Embedding => Some((c.vocab, c.hidden)),
            Part::Q => Some((q, c.hidden)),
            Part::K | Part::V => Some((c.kv_dim(), c.hidden)),
            Part::O => Some((c.hidden, q)),
            Part::Gate | Part::Up => Some((c.ffn, c.hidden)),
            Part::Down => Some((c.hidden, c.ffn)),
            _ => None,
        }
    }
}

impl WeightSource for RandomWeights {
    fn dense(&mut self, part: Part, layer: usize) -> Result<Option<Tensor>, ModelError> {
        let Some((rows, cols)) = self.shape(part) else {
            return Ok(None);
        };
        let seed = 1_000 * self.seed + 31 * layer as u64 + part as u64;
        let noise = noise(rows * cols, seed);
        let values: Vec<f32> = match rows {
            // A norm's weights near 1.
            1 => noise.iter().map(|v| 1.0 + 0.1 * v).collect(),
            _ => noise.iter().map(|v| 0.5 * v).collect(),
        };
        let shape: &[usize] = match rows {
            1 => &[cols],
            _ => &[rows, cols],
        };
        let tensor = Tensor::from_vec(values, shape, &self.device)
            .and_then(|t| t.to_dtype(self.dtype))
            .map_err(ModelError::from_candle)?;
        Ok(Some(tensor))
    }

    fn linear(&mut self, part: Part, layer: usize) -> Result<Option<DenseLinear>, ModelError> {
        match part {
            Part::Output | Part::Embedding => Ok(None),
            _ => Ok(self.dense(part, layer)?.map(DenseLinear::Dense)),
        }
    }
}

/// Each row's logits, in f32.
fn logits(out: Vec<NextToken>) -> Vec<Vec<f32>> {
    out.into_iter()
        .map(|next| match next {
            NextToken::Logits(logits) => logits,
            NextToken::Chosen(token) => panic!("chose {token}, logits were asked for"),
            NextToken::Listed { .. } => panic!("listed, logits were asked for"),
        })
        .collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Prefills `slot` with a prompt of `len` tokens: its last row wants logits.
fn prompt_rows(slot: usize, len: usize) -> Vec<Row> {
    (0..len).map(|pos| row(slot, pos, pos + 1 == len)).collect()
}

/// A prefill whose rows score the prompt's next tokens (`Pick::Score`, as a scored prompt
/// asks, with its top tokens), or choose and list theirs (`Pick::Listed`), gives, on every
/// device, the tokens, log-probabilities, top tokens and greedy flags the same rows' logits
/// give on the host, in f32 and in the half precisions a GPU runs.
#[test]
fn scored_prefill_rows_give_what_their_logits_give_on_the_host() {
    const TOP: usize = 3;
    for device in test_devices() {
        let dtypes = [DType::F32, DType::BF16];
        let runs = |dtype: &DType| {
            *dtype == DType::F32 || (device.is_cuda() && crate::device::has_bf16_kernels(&device))
        };
        for dtype in dtypes.into_iter().filter(runs) {
            let model = tiny_model(&device, dtype);
            let mut off = PhaseClock::off(&device);
            let rows = |pick: fn(&Row, u32) -> Pick| -> Vec<Row> {
                let plain = prompt_rows(0, 40);
                (0..plain.len())
                    .map(|pos| {
                        let next = plain.get(pos + 1).map_or(0, |r| r.token);
                        Row {
                            logits: true,
                            pick: pick(&plain[pos], next),
                            ..plain[pos]
                        }
                    })
                    .collect()
            };
            let mut kv = DenseKv::new(&model, 1);
            let logits = model
                .forward(&rows(|_, _| Pick::Logits), &mut kv, &mut off)
                .unwrap();
            let mut kv = DenseKv::new(&model, 1);
            // Every other row is a greedy row that lists its logprobs, as a decode row of
            // a request with `logprobs` asks.
            let score = |row: &Row, target| match row.pos % 2 {
                0 => Pick::Score { target, top: TOP },
                _ => Pick::Listed {
                    draw: None,
                    top: TOP,
                },
            };
            let scored = model.forward(&rows(score), &mut kv, &mut off).unwrap();
            let targets: Vec<Option<u32>> = rows(score)
                .iter()
                .map(|r| match r.pick {
                    Pick::Score { target, .. } => Some(target),
                    _ => None,
                })
                .collect();
            let mut greedy_rows = 0;
            for ((logits, scored), target) in logits.iter().zip(&scored).zip(targets) {
                let (NextToken::Logits(row), NextToken::Listed { logprob, greedy }) =
                    (logits, scored)
                else {
                    panic!("{device:?}: {scored:?}");
                };
                // A listed row's token is its argmax, as the host would choose it.
                let target = target.unwrap_or_else(|| sampling::argmax(row));
                assert_eq!(logprob.token, target, "{device:?} {dtype:?}");
                let host = sampling::token_logprob(row, target, TOP);
                let close = |a: f32, b: f32| (a - b).abs() < 1e-3;
                assert!(
                    close(logprob.logprob, host.logprob),
                    "{device:?} {dtype:?}: {logprob:?} vs {host:?}"
                );
                // The top tokens' order may differ where two logits are within rounding.
                let top_close = logprob
                    .top
                    .iter()
                    .zip(&host.top)
                    .all(|(a, b)| close(a.1, b.1));
                assert!(
                    top_close && logprob.top.len() == TOP,
                    "{logprob:?} vs {host:?}"
                );
                assert_eq!(
                    *greedy,
                    sampling::argmax(row) == target,
                    "{device:?} {dtype:?}"
                );
                greedy_rows += usize::from(*greedy);
            }
            assert!(greedy_rows < scored.len(), "not every row is its argmax");
        }
    }
}

#[test]
fn padding_rows_change_neither_the_real_rows_nor_the_cache() {
    for device in test_devices() {
        let model = tiny_model(&device, DType::F32);
        let mut off = PhaseClock::off(&device);
        let mut padded_kv = DenseKv::new(&model, 4);
        let mut plain_kv = DenseKv::new(&model, 4);
        for kv in [&mut padded_kv, &mut plain_kv] {
            for (slot, len) in [(0, 5), (1, 20), (2, 33)] {
                model
                    .forward(&prompt_rows(slot, len), kv, &mut off)
                    .unwrap();
            }
        }
        let step = [row(2, 33, true), row(0, 5, true), row(1, 20, true)];
        // The step padded to 8 rows, as a graph of 8 runs it.
        padded_kv.reserve_rows(&step).unwrap();
        let host = model.host_inputs(&step, 5, &padded_kv).unwrap();
        let scratch = padded_kv.scratch_block();
        assert_eq!(host.rows(), 8);
        assert_eq!(scratch as usize + 1, padded_kv.cache_blocks());
        assert!(
            host.at[3..]
                .iter()
                .all(|&at| at == scratch * BLOCK_SIZE as u32)
        );
        assert!((0..3).all(|slot| !padded_kv.blocks().table(slot).contains(&scratch)));
        let inputs = host.upload(&device, model.config.kv_dim()).unwrap();
        let h = model.hidden_states(&inputs, &padded_kv, &mut off).unwrap();
        let all = model.lm_head(&h).unwrap().to_dtype(DType::F32).unwrap();
        assert_eq!(all.dims(), [8, 96]);
        let padded = all.narrow(0, 0, 3).unwrap().to_vec2::<f32>().unwrap();
        let plain = logits(model.forward(&step, &mut plain_kv, &mut off).unwrap());
        assert!(
            max_diff(&padded, &plain) < 1e-4,
            "{device:?}: {}",
            max_diff(&padded, &plain)
        );
        // The next step reads what both wrote: the padding touched no sequence's keys.
        let next = [row(2, 34, true), row(0, 6, true), row(1, 21, true)];
        let after_padded = logits(model.forward(&next, &mut padded_kv, &mut off).unwrap());
        let after_plain = logits(model.forward(&next, &mut plain_kv, &mut off).unwrap());
        assert!(max_diff(&after_padded, &after_plain) < 1e-4, "{device:?}");
    }
}

/// A run of decode steps over `graphs`' cache: six prompts, two end after 8 steps, a new one
/// joins after 14, 30 steps in all (positions cross blocks, the cache grows). Every decode
/// row's logits, step by step.
fn decode_run(model: &DenseLlama, graphs: &mut DecodeGraphs) -> Vec<Vec<Vec<f32>>> {
    let device = model.device.clone();
    let mut off = PhaseClock::off(&device);
    let mut kv = DenseKv::with_limit(model, 8, 64);
    let mut lens: Vec<(usize, usize)> = vec![(0, 3), (1, 17), (2, 30), (3, 5), (4, 9), (5, 40)];
    for &(slot, len) in &lens {
        graphs
            .forward(model, &prompt_rows(slot, len), &mut kv, &mut off)
            .unwrap();
    }
    let mut out = Vec::new();
    for step in 0..30 {
        if step == 8 {
            lens.retain(|&(slot, _)| slot != 1 && slot != 4);
            kv.release(1);
            kv.release(4);
        }
        if step == 14 {
            graphs
                .forward(model, &prompt_rows(6, 20), &mut kv, &mut off)
                .unwrap();
            lens.push((6, 20));
        }
        let rows: Vec<Row> = lens
            .iter()
            .map(|&(slot, pos)| row(slot, pos, true))
            .collect();
        out.push(logits(
            graphs.forward(model, &rows, &mut kv, &mut off).unwrap(),
        ));
        lens.iter_mut().for_each(|(_, pos)| *pos += 1);
    }
    assert!(kv.epoch() > 1, "the cache grew during the run");
    out
}

/// On a GPU (a `cuda` build on a GPU machine; nothing to compare on the CPU): every step of
/// a run through graphs gives the eager run's logits, in f32 and bf16, and the graphs stay
/// on.
#[test]
fn decode_graphs_answer_as_the_eager_steps_do() {
    for device in test_devices().into_iter().filter(Device::is_cuda) {
        // bf16 from compute capability 8.0, f16 before (what `auto` runs there).
        let half = crate::generate::gpu_dtype(crate::device::compute_capability(&device));
        for (dtype, tolerance) in [(DType::F32, 1e-3), (half, 3e-2)] {
            let model = tiny_model(&device, dtype);
            // Half precision runs (and is captured with) the tensor-core attention.
            let tensor_cores = dtype != DType::F32;
            assert_eq!(
                model.attention == crate::generate::AttentionKernel::TensorCores,
                tensor_cores
            );
            let mut graphs = DecodeGraphs::new(&device);
            assert!(graphs.on());
            let graphed = decode_run(&model, &mut graphs);
            assert!(
                graphs.on(),
                "{dtype:?}: graphs were given up: {}",
                graphs.given_up().unwrap_or_default()
            );
            let counts = graphs.counts();
            assert_eq!(
                counts.captures + counts.replays,
                30,
                "{dtype:?}: {counts:?}"
            );
            assert!(counts.replays >= 20, "{dtype:?}: {counts:?}");
            assert!(!graphs.captured().is_empty());
            let eager = decode_run(&model, &mut DecodeGraphs::off());
            for (step, (g, e)) in graphed.iter().zip(&eager).enumerate() {
                let scale = e.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
                let diff = max_diff(g, e);
                assert!(
                    diff <= tolerance * (1.0 + scale),
                    "{dtype:?} step {step}: {diff} on a scale of {scale}"
                );
            }
        }
    }
}

/// Under cuda-emu (CI's GPU tests), what a replayed decode step of greedy rows asks of the
/// GPU, counted by its fake driver for this test's thread (issue 42: no allocation inside a
/// step, only token ids back): one graph launch that holds the whole forward, the pick's
/// own launches and its token ids back (4 bytes a row, the step's one wait), the step's
/// inputs copied in, and neither a cuBLAS call outside the graph nor an allocation but the
/// pick's few bytes. On a real GPU nothing counts the driver's calls, and the test says so.
#[cfg(feature = "cuda")]
#[test]
fn a_replayed_decode_step_is_one_graph_launch_and_the_token_ids_back() {
    use crate::emu_counts::EmuCounts;
    let Some(device) = crate::device::test_gpu() else {
        return;
    };
    if EmuCounts::of_this_thread().is_none() {
        eprintln!("not on cuda-emu: no driver counts its calls here; skipped");
        return;
    }
    let model = tiny_model(&device, DType::F32);
    let mut graphs = DecodeGraphs::new(&device);
    let mut off = PhaseClock::off(&device);
    let mut kv = DenseKv::with_limit(&model, 8, 64);
    // Six steps stay inside the prompts' last blocks: no block is added, the cache never
    // grows, and the one graph is never captured again.
    let mut lens = vec![(0, 3), (1, 17), (2, 33)];
    for &(slot, len) in &lens {
        graphs
            .forward(&model, &prompt_rows(slot, len), &mut kv, &mut off)
            .unwrap();
    }
    let mut step = |lens: &mut Vec<(usize, usize)>| {
        let rows: Vec<Row> = lens
            .iter()
            .map(|&(slot, pos)| Row {
                pick: Pick::Greedy,
                ..row(slot, pos, true)
            })
            .collect();
        let out = graphs.forward(&model, &rows, &mut kv, &mut off).unwrap();
        assert!(out.iter().all(|next| matches!(next, NextToken::Chosen(_))));
        lens.iter_mut().for_each(|(_, pos)| *pos += 1);
    };
    // The capture, then the first replay, which is checked against the eager step.
    step(&mut lens);
    step(&mut lens);
    let before = EmuCounts::of_this_thread().unwrap();
    const STEPS: u64 = 4;
    for _ in 0..STEPS {
        step(&mut lens);
    }
    let per = EmuCounts::of_this_thread().unwrap().since(before);
    let counts = graphs.counts();
    assert_eq!((counts.captures, counts.replays), (1, STEPS + 1));
    assert_eq!(per.graph_launches, STEPS, "{per:?}");
    assert!(
        per.replayed >= STEPS * 20,
        "the forward is in the graph: {per:?}"
    );
    assert_eq!((per.captured, per.library_calls), (0, 0), "{per:?}");
    assert_eq!(per.copies_to_host, STEPS, "{per:?}");
    assert_eq!(
        per.bytes_to_host,
        STEPS * 3 * 4,
        "three rows' token ids: {per:?}"
    );
    assert_eq!(per.waits, STEPS, "one wait a step, for the ids: {per:?}");
    assert!(per.kernel_launches <= 2 * STEPS, "the pick's: {per:?}");
    assert!(
        per.copies_to_device <= 5 * STEPS,
        "the step's inputs: {per:?}"
    );
    assert!(
        per.allocations <= STEPS && per.allocated_bytes <= 256 * STEPS,
        "the pick's ids alone: {per:?}"
    );
}

/// Every GPU of a host at once, as an 8-GPU server runs them (an actor on each, in one agent
/// process): each GPU, in its own thread, captures and replays the decode graphs of its own
/// model (other random weights on each) and gives the logits that model gives on GPU 0
/// alone. A GPU that read another's weights, cache or graphs, or a kernel module, graph or
/// first-use check kept for one GPU and used on another, fails it; under cuda-emu
/// (`CUDA_EMU_DEVICES=2` in CI) so does any launch or GEMM that touches another device's
/// memory. Needs two GPUs; skipped on one.
#[cfg(feature = "cuda")]
#[test]
fn every_gpu_of_a_host_runs_its_own_model_at_once_with_the_answers_of_one() {
    let gpus = crate::device::test_gpus(2);
    if gpus.len() < 2 {
        return;
    }
    let half = crate::generate::gpu_dtype(crate::device::compute_capability(&gpus[0]));
    let run_on = |gpu: &Device, seed: u64| {
        let model = tiny_model_seeded(gpu, half, seed);
        let mut graphs = DecodeGraphs::new(gpu);
        let run = decode_run(&model, &mut graphs);
        assert!(
            graphs.on() && graphs.counts().replays >= 20,
            "{gpu:?}: graphs given up ({}) or not replayed ({:?})",
            graphs.given_up().unwrap_or_default(),
            graphs.counts()
        );
        run
    };
    let together: Vec<Vec<Vec<Vec<f32>>>> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0u64..)
            .zip(&gpus)
            .map(|(seed, gpu)| scope.spawn(move || run_on(gpu, seed)))
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    for (seed, run) in (0u64..).zip(&together) {
        let alone = run_on(&gpus[0], seed);
        for (step, (got, want)) in run.iter().zip(&alone).enumerate() {
            let scale = want.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
            let diff = max_diff(got, want);
            assert!(
                diff <= 3e-2 * (1.0 + scale),
                "GPU {seed}'s model, step {step}: {diff} from GPU 0's on a scale of {scale}"
            );
        }
    }
    // Each GPU ran its own weights: no two runs alike.
    assert!(max_diff(&together[0][0], &together[1][0]) > 1e-3);
}
