//! The CUDA side of [`super::fused`]: candle custom ops that launch `fused_kernels.cu`
//! (compiled by `build.rs` to a fatbin: SASS for each compute capability we ship to, plus
//! PTX for newer ones). Callers check shapes, dtypes and contiguity first (`fused.rs`); these
//! ops check again and refuse anything else with an error.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{
    CpuStorage, CudaDevice, CudaStorage, DType, InplaceOp2, InplaceOp3, Layout, Result, Shape,
};

/// `fused_kernels.cu` as built by `build.rs`.
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fused_kernels.fatbin"));
/// Threads per block for the element-wise kernels.
pub(crate) const THREADS: u32 = 256;

/// A launch over `n` elements, one thread each, grid-strided past 2^20 blocks.
pub(crate) fn elementwise(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            n.div_ceil(u64::from(THREADS)).clamp(1, 1 << 20) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A launch of one block of [`THREADS`] per row (callers skip launches with no rows).
pub(crate) fn block_per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernel `name` and the stream to launch it on. The module is loaded once per GPU (its
/// primary context, which every candle device on that GPU shares) and kept for the process:
/// candle's own `get_or_load_custom_func` takes PTX text only, and a fatbin is binary.
pub(crate) fn kernel(dev: &CudaDevice, name: &str) -> Result<(Arc<CudaStream>, CudaFunction)> {
    static MODULES: Mutex<BTreeMap<usize, Arc<CudaModule>>> = Mutex::new(BTreeMap::new());
    let stream = dev.cuda_stream();
    let context = stream.context().clone();
    let module = {
        let mut modules = MODULES.lock().unwrap_or_else(PoisonError::into_inner);
        match modules.get(&context.ordinal()) {
            Some(module) => module.clone(),
            None => {
                let module = context.load_module(Ptx::from_binary(FATBIN.to_vec())).w()?;
                modules.insert(context.ordinal(), module.clone());
                module
            }
        }
    };
    let function = module.load_function(name).w()?;
    Ok((stream, function))
}

pub(crate) fn dtype_suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F16 => Ok("f16"),
        DType::BF16 => Ok("bf16"),
        other => candle_core::bail!("fused kernels take f32, f16 or bf16, not {other:?}"),
    }
}

/// The contiguous view of `storage` that `layout` describes.
pub(crate) fn view<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
) -> Result<CudaView<'a, T>> {
    if !layout.is_contiguous() {
        candle_core::bail!("fused kernels need contiguous inputs");
    }
    let slice = storage.as_cuda_slice::<T>()?;
    Ok(slice.slice(layout.start_offset()..layout.start_offset() + layout.shape().elem_count()))
}

/// The whole of an in-place destination (a fresh tensor: contiguous, from offset 0).
pub(crate) fn destination<'a, T: CudaDType>(
    storage: &'a mut CudaStorage,
    layout: &Layout,
) -> Result<&'a mut CudaSlice<T>> {
    if !layout.is_contiguous() || layout.start_offset() != 0 {
        candle_core::bail!("fused kernels write in place only into whole contiguous tensors");
    }
    storage.as_cuda_slice_mut::<T>()
}

/// `x = act(x + bias + residual)` over `[rows, cols]`, in place; GELU (erf) when `gelu`.
pub struct BiasAdd {
    pub gelu: bool,
}

impl BiasAdd {
    fn launch<T: CudaDType + DeviceRepr>(
        &self,
        x: (&mut CudaStorage, &Layout),
        bias: (&CudaStorage, &Layout),
        residual: Option<(&CudaStorage, &Layout)>,
    ) -> Result<()> {
        let dev = x.0.device().clone();
        let (rows, cols) = x.1.shape().dims2()?;
        if bias.1.shape().elem_count() != cols {
            candle_core::bail!("bias of {:?} for rows of {cols}", bias.1.shape());
        }
        let bias = view::<T>(bias.0, bias.1)?;
        let residual = residual.map(|(s, l)| view::<T>(s, l)).transpose()?;
        let name = format!("bias_add_{}", dtype_suffix(x.0.dtype())?);
        let (stream, func) = kernel(&dev, &name)?;
        let target = destination::<T>(x.0, x.1)?;
        let (rows, cols) = (rows as u32, cols as u32);
        let config = LaunchConfig {
            grid_dim: (cols.div_ceil(THREADS), rows.clamp(1, 65_535), 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let null = 0u64;
        let gelu = i32::from(self.gelu);
        let mut builder = stream.launch_builder(&func);
        builder.arg(target);
        builder.arg(&bias);
        match &residual {
            Some(residual) => builder.arg(residual),
            None => builder.arg(&null),
        };
        builder.arg(&rows).arg(&cols).arg(&gelu);
        // SAFETY: the kernel writes rows x cols elements of `target` and reads as many of
        // `residual` and cols of `bias`; all three were checked to hold that many.
        #[allow(unsafe_code)]
        unsafe { builder.launch(config) }.w()?;
        Ok(())
    }

    fn dispatch(
        &self,
        x: (&mut CudaStorage, &Layout),
        bias: (&CudaStorage, &Layout),
        residual: Option<(&CudaStorage, &Layout)>,
    ) -> Result<()> {
        if let Some((_, layout)) = residual
            && layout.shape() != x.1.shape()
        {
            candle_core::bail!("residual {:?} for {:?}", layout.shape(), x.1.shape());
        }
        match x.0.dtype() {
            DType::F32 => self.launch::<f32>(x, bias, residual),
            DType::F16 => self.launch::<half::f16>(x, bias, residual),
            DType::BF16 => self.launch::<half::bf16>(x, bias, residual),
            other => candle_core::bail!("bias_add takes f32, f16 or bf16, not {other:?}"),
        }
    }
}

impl InplaceOp2 for BiasAdd {
    fn name(&self) -> &'static str {
        "resident-bias-add"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<()> {
        candle_core::bail!("resident-bias-add runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        x: &mut CudaStorage,
        xl: &Layout,
        bias: &CudaStorage,
        bl: &Layout,
    ) -> Result<()> {
        self.dispatch((x, xl), (bias, bl), None)
    }
}

impl InplaceOp3 for BiasAdd {
    fn name(&self) -> &'static str {
        "resident-bias-residual-add"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        candle_core::bail!("resident-bias-residual-add runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        x: &mut CudaStorage,
        xl: &Layout,
        bias: &CudaStorage,
        bl: &Layout,
        residual: &CudaStorage,
        rl: &Layout,
    ) -> Result<()> {
        self.dispatch((x, xl), (bias, bl), Some((residual, rl)))
    }
}

/// `silu(gate) * up` of `[rows, 2 * cols]` rows (gate, then up), as `[rows, cols]`.
pub struct SiluMulHalves;

impl SiluMulHalves {
    fn launch<T: CudaDType + DeviceRepr>(
        storage: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, width) = layout.shape().dims2()?;
        let cols = width / 2;
        let dev = storage.device().clone();
        let x = view::<T>(storage, layout)?;
        let n = (rows * cols) as u64;
        // SAFETY: the kernel writes every one of the n elements.
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(rows * cols)? };
        let name = format!("silu_mul_halves_{}", dtype_suffix(storage.dtype())?);
        let (stream, func) = kernel(&dev, &name)?;
        let config = elementwise(n);
        let cols = cols as u32;
        let mut builder = stream.launch_builder(&func);
        builder.arg(&out).arg(&x).arg(&n).arg(&cols);
        // SAFETY: reads the rows x 2 cols input, writes rows x cols.
        #[allow(unsafe_code)]
        if n > 0 {
            unsafe { builder.launch(config) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((rows, cols as usize)),
        ))
    }
}

impl candle_core::CustomOp1 for SiluMulHalves {
    fn name(&self) -> &'static str {
        "resident-silu-mul-halves"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("resident-silu-mul-halves runs on CUDA only")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        match storage.dtype() {
            DType::F32 => Self::launch::<f32>(storage, layout),
            DType::F16 => Self::launch::<half::f16>(storage, layout),
            DType::BF16 => Self::launch::<half::bf16>(storage, layout),
            other => candle_core::bail!("silu_mul_halves takes f32, f16 or bf16, not {other:?}"),
        }
    }
}

/// `x + y` and its RMSNorm times `weight`, for `[rows, cols]` rows `x` and `y` and a
/// `[cols]` weight: one output of `[2, rows, cols]`, the sum then the normed rows.
pub struct AddRmsNorm {
    pub eps: f32,
}

impl AddRmsNorm {
    fn launch<T: CudaDType + DeviceRepr>(
        &self,
        x: (&CudaStorage, &Layout),
        y: (&CudaStorage, &Layout),
        weight: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, cols) = x.1.shape().dims2()?;
        if y.1.shape() != x.1.shape() || weight.1.shape().dims() != [cols] {
            candle_core::bail!(
                "add_rms_norm of {:?}, {:?} and a weight of {:?}",
                x.1.shape(),
                y.1.shape(),
                weight.1.shape()
            );
        }
        let dev = x.0.device().clone();
        let (xs, ys, ws) = (
            view::<T>(x.0, x.1)?,
            view::<T>(y.0, y.1)?,
            view::<T>(weight.0, weight.1)?,
        );
        // SAFETY: the kernel writes every element of both halves.
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(2 * rows * cols)? };
        let name = format!("add_rms_norm_{}", dtype_suffix(x.0.dtype())?);
        let (stream, func) = kernel(&dev, &name)?;
        let config = block_per_row(rows);
        let (rows_arg, cols_arg) = (rows as u32, cols as u32);
        let mut builder = stream.launch_builder(&func);
        builder
            .arg(&out)
            .arg(&xs)
            .arg(&ys)
            .arg(&ws)
            .arg(&rows_arg)
            .arg(&cols_arg)
            .arg(&self.eps);
        // SAFETY: block r reads row r of x and y and the weight, and writes row r of each
        // half of `out` (2 x rows x cols).
        #[allow(unsafe_code)]
        if rows > 0 {
            unsafe { builder.launch(config) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((2, rows, cols)),
        ))
    }
}

impl candle_core::CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "resident-add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("resident-add-rms-norm runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        y: &CudaStorage,
        yl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (x, y, w) = ((x, xl), (y, yl), (w, wl));
        match x.0.dtype() {
            DType::F32 => self.launch::<f32>(x, y, w),
            DType::F16 => self.launch::<half::f16>(x, y, w),
            DType::BF16 => self.launch::<half::bf16>(x, y, w),
            other => candle_core::bail!("add_rms_norm takes f32, f16 or bf16, not {other:?}"),
        }
    }
}

/// Softmax over the last axis of `[batch, heads, t, t]` scores, in place, with an optional
/// `[heads, t, t]` bias (operand 2), keys masked by an f32 `[batch, t]` keep mask (operand 3,
/// when `keep`), and causal masking (when `causal`).
pub struct MaskedSoftmax {
    pub keep: bool,
    pub bias: bool,
    pub causal: bool,
}

impl MaskedSoftmax {
    fn launch<T: CudaDType + DeviceRepr>(
        &self,
        scores: (&mut CudaStorage, &Layout),
        bias: (&CudaStorage, &Layout),
        keep: (&CudaStorage, &Layout),
    ) -> Result<()> {
        let dev = scores.0.device().clone();
        let (batch, heads, t, t2) = scores.1.shape().dims4()?;
        if t != t2 {
            candle_core::bail!(
                "attention scores must be square, not {:?}",
                scores.1.shape()
            );
        }
        let bias = if self.bias {
            if bias.1.shape().dims() != [heads, t, t] {
                candle_core::bail!(
                    "attention bias {:?} for {heads} heads of {t}",
                    bias.1.shape()
                );
            }
            Some(view::<T>(bias.0, bias.1)?)
        } else {
            None
        };
        let keep = if self.keep {
            if keep.1.shape().dims() != [batch, t] || keep.0.dtype() != DType::F32 {
                candle_core::bail!("keep mask must be f32 [{batch}, {t}]");
            }
            Some(view::<f32>(keep.0, keep.1)?)
        } else {
            None
        };
        let suffix = dtype_suffix(scores.0.dtype())?;
        let rows = batch * heads * t;
        // Rows of up to 1024 keys: one warp per row, the row in registers (`_w<n>` holds n
        // keys per lane), four rows per block. Longer rows: one block per row.
        let per_lane = [1usize, 2, 4, 8, 16, 32].into_iter().find(|n| n * 32 >= t);
        let (name, config) = match per_lane {
            Some(n) => (
                format!("masked_softmax_{suffix}_w{n}"),
                LaunchConfig {
                    grid_dim: (rows.div_ceil(4) as u32, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                },
            ),
            None => (
                format!("masked_softmax_{suffix}"),
                LaunchConfig {
                    grid_dim: (rows as u32, 1, 1),
                    block_dim: (1024, 1, 1),
                    shared_mem_bytes: 0,
                },
            ),
        };
        let (stream, func) = kernel(&dev, &name)?;
        let target = destination::<T>(scores.0, scores.1)?;
        let (null, heads, t, causal) = (0u64, heads as u32, t as u32, i32::from(self.causal));
        let rows = rows as u64;
        let mut builder = stream.launch_builder(&func);
        builder.arg(target);
        match &bias {
            Some(bias) => builder.arg(bias),
            None => builder.arg(&null),
        };
        match &keep {
            Some(keep) => builder.arg(keep),
            None => builder.arg(&null),
        };
        builder.arg(&heads).arg(&t).arg(&causal);
        if per_lane.is_some() {
            builder.arg(&rows);
        }
        // SAFETY: one warp or block per row of `target` ([batch, heads, t, t]); the bias and keep
        // views were checked to be [heads, t, t] and [batch, t].
        #[allow(unsafe_code)]
        unsafe { builder.launch(config) }.w()?;
        Ok(())
    }
}

impl InplaceOp3 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "resident-masked-softmax"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        candle_core::bail!("resident-masked-softmax runs on CUDA only")
    }

    fn cuda_fwd(
        &self,
        scores: &mut CudaStorage,
        sl: &Layout,
        bias: &CudaStorage,
        bl: &Layout,
        keep: &CudaStorage,
        kl: &Layout,
    ) -> Result<()> {
        let operands = ((scores, sl), (bias, bl), (keep, kl));
        match operands.0.0.dtype() {
            DType::F32 => self.launch::<f32>(operands.0, operands.1, operands.2),
            DType::F16 => self.launch::<half::f16>(operands.0, operands.1, operands.2),
            DType::BF16 => self.launch::<half::bf16>(operands.0, operands.1, operands.2),
            other => candle_core::bail!("masked softmax takes f32, f16 or bf16, not {other:?}"),
        }
    }
}

/// Which way [`HeadCopy`] moves: rows of tokens into heads, or back.
#[derive(Clone, Copy)]
pub enum HeadCopy {
    /// `[b * t, stride]` rows → `[b, heads, t, d]`, from column `offset`.
    Split {
        batch: usize,
        t: usize,
        heads: usize,
        d: usize,
        offset: usize,
    },
    /// `[b, heads, t, d]` → `[b * t, heads * d]`.
    Merge,
}

impl candle_core::CustomOp1 for HeadCopy {
    fn name(&self) -> &'static str {
        "resident-head-copy"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("resident-head-copy runs on CUDA only")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        match storage.dtype() {
            DType::F32 => self.copy::<f32>(storage, layout),
            DType::F16 => self.copy::<half::f16>(storage, layout),
            DType::BF16 => self.copy::<half::bf16>(storage, layout),
            other => candle_core::bail!("head copies take f32, f16 or bf16, not {other:?}"),
        }
    }
}

impl HeadCopy {
    fn copy<T: CudaDType + DeviceRepr>(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = storage.device().clone();
        let unit = 16 / std::mem::size_of::<T>();
        let units = |n: usize, what: &str| {
            if n.is_multiple_of(unit) {
                Ok((n / unit) as u32)
            } else {
                Err(candle_core::Error::Msg(format!(
                    "head copy: {what} of {n} is not a multiple of {unit} elements"
                )))
            }
        };
        if !layout.start_offset().is_multiple_of(unit) {
            candle_core::bail!("head copy: input does not start on a 16-byte boundary");
        }
        let src = view::<T>(storage, layout)?;
        let (name, args, shape) = match *self {
            HeadCopy::Split {
                batch,
                t,
                heads,
                d,
                offset,
            } => {
                let (rows, stride) = layout.shape().dims2()?;
                if rows != batch * t || offset + heads * d > stride {
                    candle_core::bail!(
                        "head split of {heads}x{d} at {offset} from {rows}x{stride}"
                    );
                }
                let args = vec![
                    batch as u32,
                    t as u32,
                    heads as u32,
                    units(d, "head width")?,
                    units(stride, "row width")?,
                    units(offset, "offset")?,
                ];
                ("split_heads", args, Shape::from((batch, heads, t, d)))
            }
            HeadCopy::Merge => {
                let (batch, heads, t, d) = layout.shape().dims4()?;
                let args = vec![
                    batch as u32,
                    t as u32,
                    heads as u32,
                    units(d, "head width")?,
                ];
                ("merge_heads", args, Shape::from((batch * t, heads * d)))
            }
        };
        let count = shape.elem_count();
        // SAFETY: the kernel writes every one of the `count` elements (a copy of each).
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(count)? };
        let grid = ((count / unit) as u32).div_ceil(THREADS).clamp(1, 1 << 20);
        let config = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (stream, func) = kernel(&dev, name)?;
        let mut builder = stream.launch_builder(&func);
        builder.arg(&src).arg(&out);
        for arg in &args {
            builder.arg(arg);
        }
        // SAFETY: split reads batch*t rows of `stride` units (checked above) and merge a
        // permutation of its input; both write `count` elements of `out`.
        #[allow(unsafe_code)]
        unsafe { builder.launch(config) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), shape))
    }
}
