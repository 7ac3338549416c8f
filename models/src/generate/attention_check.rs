//! The paged attention kernels' first-use check on a GPU. Before a model's first step, the
//! kernel it is to run answers one small case of the model's own heads (decoding rows across
//! block edges and past four warps' worth of keys, a prefilling sequence's rows, a later
//! chunk of a longer one, blocks out of order) and is compared with the CPU reference. A
//! kernel that is wrong on some GPU or driver (the tensor-core one rests on `mma.sync`'s
//! fragment layouts, which only a real GPU can confirm) then costs speed, never wrong text:
//! a model left to choose runs the scalar kernel instead, saying so in the log; one told
//! which kernel to run, or whose every kernel fails, is refused with what to do. The
//! encoders' flash kernel is checked the same way (`embed::flash_attention`).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Device, Tensor};

use super::decoder::LlamaConfig;
use super::device_ops::noise;
use super::paged_attention::{AttentionKernel, PagedAttention, PagedRows, Tiling, paged_attention};
use crate::ModelError;

/// A model's attention heads: what the kernels' tiles and the check's case are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeadShape {
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Each head's width.
    pub head_dim: usize,
}

impl HeadShape {
    /// A decoder's heads.
    pub fn of(config: &LlamaConfig) -> Self {
        Self {
            heads: config.heads,
            kv_heads: config.kv_heads,
            head_dim: config.head_dim,
        }
    }
}

/// The GPU attention kernel a model of `dtype` with heads `shape` runs on `device`: `wanted`
/// where set, else [`AttentionKernel::best`], once it has passed its check on this GPU (run
/// once a process for each GPU, dtype, head shape and kernel). Where the best one fails, the
/// scalar kernel, logged; a `wanted` kernel that fails, or every kernel failing, is an error
/// that says what to do. On the CPU, which runs the reference itself, nothing is checked.
pub fn checked_kernel(
    device: &Device,
    dtype: DType,
    shape: HeadShape,
    wanted: Option<AttentionKernel>,
) -> Result<AttentionKernel, ModelError> {
    let best = AttentionKernel::best(device, dtype, shape.head_dim);
    if !device.is_cuda() {
        return Ok(wanted.unwrap_or(best));
    }
    choose(wanted, best, |kernel| checked(device, dtype, shape, kernel))
}

/// The kernel to run, given each kernel's check (`Err` says how it failed): the policy of
/// [`checked_kernel`], apart from the GPU.
fn choose(
    wanted: Option<AttentionKernel>,
    best: AttentionKernel,
    mut check: impl FnMut(AttentionKernel) -> Result<(), String>,
) -> Result<AttentionKernel, ModelError> {
    if let Some(kernel) = wanted {
        let other = match kernel {
            AttentionKernel::Scalar => AttentionKernel::TensorCores,
            AttentionKernel::TensorCores => AttentionKernel::Scalar,
        };
        return check(kernel).map(|()| kernel).map_err(|why| {
            ModelError::Load(format!(
                "the {} attention kernel gives wrong answers on this GPU ({why}): set the \
                 attention kernel to `auto` or `{}` instead",
                kernel.name(),
                other.name()
            ))
        });
    }
    let mut failed = Vec::new();
    let fallback = (best != AttentionKernel::Scalar).then_some(AttentionKernel::Scalar);
    for kernel in std::iter::once(best).chain(fallback) {
        match check(kernel) {
            Ok(()) => {
                if !failed.is_empty() {
                    tracing::error!(
                        failed = failed.join("; "),
                        runs = kernel.name(),
                        "a GPU attention kernel failed its check on this GPU: attention runs \
                         on the other (slower, the same text)"
                    );
                }
                return Ok(kernel);
            }
            Err(why) => failed.push(format!("{}: {why}", kernel.name())),
        }
    }
    Err(ModelError::Load(format!(
        "every GPU attention kernel gives wrong answers on this GPU ({}): run the model on the \
         CPU (`--gpus-per-actor 0`), and report the GPU and its driver",
        failed.join("; ")
    )))
}

/// `kernel`'s check on `device`, run the first time each GPU, dtype, shape and kernel is
/// asked, then remembered.
fn checked(
    device: &Device,
    dtype: DType,
    shape: HeadShape,
    kernel: AttentionKernel,
) -> Result<(), String> {
    type Key = (usize, &'static str, HeadShape, &'static str);
    static CHECKED: Mutex<BTreeMap<Key, Result<(), String>>> = Mutex::new(BTreeMap::new());
    let key = (
        crate::device::gpu_ordinal(device),
        dtype.as_str(),
        shape,
        kernel.name(),
    );
    let mut checked = CHECKED.lock().unwrap_or_else(PoisonError::into_inner);
    checked
        .entry(key)
        .or_insert_with(|| {
            let tolerance = match dtype {
                DType::F32 => 1e-3,
                DType::F16 => 1e-2,
                // Outputs are averages of values under 1: bf16 rounds at 2^-8 of them, and
                // the tensor cores take the softmax's weights in bf16 too.
                _ => 5e-2,
            };
            match off_by(device, dtype, shape, kernel) {
                Ok(worst) if worst <= tolerance => Ok(()),
                Ok(worst) => Err(format!(
                    "off the CPU reference by {worst} where {tolerance} is allowed"
                )),
                Err(error) => Err(error.to_string()),
            }
        })
        .clone()
}

/// How far `kernel` on `device` is from the CPU reference on the check's case (the largest
/// absolute difference; infinite where it gave a NaN), both given the same inputs in `dtype`.
fn off_by(
    device: &Device,
    dtype: DType,
    shape: HeadShape,
    kernel: AttentionKernel,
) -> candle_core::Result<f32> {
    let HeadShape {
        heads,
        kv_heads,
        head_dim,
    } = shape;
    let (block_size, pool) = (16, 16);
    // Blocks spread over the pool out of order, some shared between sequences.
    let table = |first: usize, len: usize| -> Vec<u32> {
        (0..len.div_ceil(block_size))
            .map(|b| ((first + b * 5) % pool) as u32)
            .collect()
    };
    // Decoding rows (one position, a block and one, past the four warps' 64 keys), a
    // prompt's first nine rows, and a later chunk of a longer prompt.
    let mut rows: Vec<(Vec<u32>, usize)> = [1, 17, 100]
        .iter()
        .enumerate()
        .map(|(i, &len)| (table(i, len), len))
        .collect();
    rows.extend((1..=9).map(|len| (table(3, 9), len)));
    rows.extend((70..=75).map(|len| (table(4, 75), len)));
    let kv_rows = pool * block_size;
    let make = |values: Vec<f32>, shape: &[usize]| {
        Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(dtype)
    };
    let q = make(
        noise(rows.len() * heads * head_dim, 1),
        &[rows.len(), heads, head_dim],
    )?;
    let keys = make(
        noise(kv_rows * kv_heads * head_dim, 2),
        &[kv_rows, kv_heads * head_dim],
    )?;
    let values = make(
        noise(kv_rows * kv_heads * head_dim, 3),
        &[kv_rows, kv_heads * head_dim],
    )?;
    let tiling = Tiling {
        group: heads / kv_heads.max(1),
        kernel,
    };
    let run = |on: &Device| -> candle_core::Result<Vec<f32>> {
        let layout = PagedRows::from_tables(&rows, tiling, block_size, on)?;
        let op = PagedAttention {
            layout: &layout,
            heads,
            kv_heads,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let moved = |t: &Tensor| t.to_device(on);
        paged_attention(&moved(&q)?, &moved(&keys)?, &moved(&values)?, &op)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()
    };
    let (want, got) = (run(&Device::Cpu)?, run(device)?);
    Ok(want.iter().zip(&got).fold(0f32, |worst, (w, g)| {
        let off = (w - g).abs();
        if off.is_nan() {
            f32::INFINITY
        } else {
            worst.max(off)
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::device_ops::test_devices;

    const SCALAR: AttentionKernel = AttentionKernel::Scalar;
    const TENSOR: AttentionKernel = AttentionKernel::TensorCores;

    /// A check where the kernels in `wrong` fail, counting the checks it ran.
    fn check_with(
        wrong: &[AttentionKernel],
        ran: &mut Vec<AttentionKernel>,
    ) -> impl FnMut(AttentionKernel) -> Result<(), String> {
        move |kernel| {
            ran.push(kernel);
            if wrong.contains(&kernel) {
                Err("off the CPU reference by 1.5".into())
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn the_best_kernel_runs_once_it_passes_and_the_scalar_one_where_it_fails() {
        let mut ran = Vec::new();
        assert_eq!(
            choose(None, TENSOR, check_with(&[], &mut ran)).unwrap(),
            TENSOR
        );
        assert_eq!(
            ran,
            [TENSOR],
            "the fallback is not checked when the best passes"
        );
        let mut ran = Vec::new();
        assert_eq!(
            choose(None, TENSOR, check_with(&[TENSOR], &mut ran)).unwrap(),
            SCALAR
        );
        assert_eq!(ran, [TENSOR, SCALAR]);
        let mut ran = Vec::new();
        assert_eq!(
            choose(None, SCALAR, check_with(&[], &mut ran)).unwrap(),
            SCALAR
        );
        assert_eq!(ran, [SCALAR]);
    }

    #[test]
    fn every_kernel_failing_or_a_chosen_one_failing_is_refused_with_what_to_do() {
        let mut ran = Vec::new();
        let error = choose(None, TENSOR, check_with(&[TENSOR, SCALAR], &mut ran))
            .unwrap_err()
            .to_string();
        for words in [
            "tensor-cores: off the CPU reference by 1.5",
            "scalar: off",
            "--gpus-per-actor 0",
        ] {
            assert!(error.contains(words), "{error}");
        }
        let mut ran = Vec::new();
        let error = choose(None, SCALAR, check_with(&[SCALAR], &mut ran)).unwrap_err();
        assert_eq!(
            ran,
            [SCALAR],
            "a model only the scalar kernel takes has no other"
        );
        assert!(error.to_string().contains("scalar: off"), "{error}");
        // Asked for by name: no quiet fallback, the other named instead.
        let mut ran = Vec::new();
        let error = choose(Some(TENSOR), TENSOR, check_with(&[TENSOR], &mut ran))
            .unwrap_err()
            .to_string();
        assert_eq!(ran, [TENSOR]);
        assert!(
            error.contains("the tensor-cores attention kernel gives wrong answers")
                && error.contains("`scalar`"),
            "{error}"
        );
        let mut ran = Vec::new();
        assert_eq!(
            choose(Some(SCALAR), TENSOR, check_with(&[TENSOR], &mut ran)).unwrap(),
            SCALAR
        );
        assert_eq!(ran, [SCALAR]);
    }

    /// On a GPU every kernel that takes the shape passes its check, for SmolLM2's, Qwen2.5's
    /// and Qwen3's heads; on the CPU nothing is checked and the choice stands.
    #[test]
    fn each_kernel_passes_its_check_on_the_gpu_and_the_cpu_is_not_checked() {
        let shapes =
            [(9, 3, 64), (14, 2, 64), (16, 8, 128)].map(|(heads, kv_heads, head_dim)| HeadShape {
                heads,
                kv_heads,
                head_dim,
            });
        for device in test_devices() {
            for (dtype, shape) in [DType::F32, DType::F16, DType::BF16]
                .into_iter()
                .flat_map(|dtype| shapes.map(|shape| (dtype, shape)))
            {
                for kernel in [SCALAR, TENSOR] {
                    let runs =
                        kernel.takes(dtype, shape.head_dim) && kernel.runs_on(&device, dtype);
                    if device.is_cuda() && runs {
                        assert_eq!(
                            checked(&device, dtype, shape, kernel),
                            Ok(()),
                            "{dtype:?} {shape:?} {kernel:?}"
                        );
                    }
                }
                if device.is_cpu() {
                    // The case is well made: the reference against itself.
                    assert_eq!(off_by(&device, DType::F32, shape, SCALAR).unwrap(), 0.0);
                }
                let chosen = checked_kernel(&device, dtype, shape, None).unwrap();
                assert_eq!(
                    chosen,
                    AttentionKernel::best(&device, dtype, shape.head_dim)
                );
            }
        }
    }
}
