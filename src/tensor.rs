//! [`Tensor`]: a tensor in convtune's own GPU memory, so chained convolutions skip the host.

use crate::dtype::{DType, Elem};
use crate::engine::Engine;
use crate::error::{no_panic, Error, Result};
use crate::host::{expect_len, expect_operands, poison};
use crate::plan::Plan;
use crate::runner::{self, DeviceArray};
use crate::timing::Phases;

/// A 4-D float32 or float16 tensor resident on an engine's device, in a buffer from its
/// pool (Python: `convtune.Tensor`). [`Engine::conv2d_tensor`] takes one as x and returns
/// its output as another.
pub struct Tensor {
    pub(crate) array: DeviceArray,
    engine: Engine,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor").field("dims", &self.array.dims).field("dtype", &self.array.dtype).finish()
    }
}

/// Where a call's residual `z` comes from.
#[derive(Clone, Copy, Debug)]
pub enum Residual<'a, T> {
    /// Host data, uploaded for the call.
    Host(&'a [T]),
    /// A tensor already on the device.
    Tensor(&'a Tensor),
}

/// Where a call's weights come from: host data uploaded for the call, or a tensor already on
/// the device (uploaded once for many calls, as a network's weights are).
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a, T> {
    /// Host data, (K, C/groups, R, S) (transposed: (C, K/groups, R, S)), C-ordered.
    Host(&'a [T]),
    /// A tensor of w's dims on the same engine.
    Tensor(&'a Tensor),
}

impl<'a, T> From<&'a [T]> for Weights<'a, T> {
    fn from(w: &'a [T]) -> Self {
        Weights::Host(w)
    }
}

impl<'a, T> From<&'a Vec<T>> for Weights<'a, T> {
    fn from(w: &'a Vec<T>) -> Self {
        Weights::Host(w)
    }
}

impl<'a, T> From<&'a Tensor> for Weights<'a, T> {
    fn from(w: &'a Tensor) -> Self {
        Weights::Tensor(w)
    }
}

impl Engine {
    /// Uploads C-ordered data of `dims` (`u16` for float16 bits).
    pub fn upload<T: Elem>(&self, data: &[T], dims: [usize; 4]) -> Result<Tensor> {
        let elems = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        expect_len("the data", data.len(), elems.ok_or_else(|| Error::invalid(format!("dims {dims:?} overflow")))?)?;
        let array = no_panic(|| "upload".into(), || DeviceArray::upload(&self.inner, data, dims))?;
        Ok(Tensor { array, engine: self.clone() })
    }

    /// Runs `plan` on a device-resident x; the output stays on the device. `w` is host data
    /// (`&[T]` or `&Vec<T>`, uploaded for the call) or a [`Tensor`] of w's dims (no upload).
    /// Returns once the kernel is queued, after waiting for the previous such call instead
    /// (so the host prepares the next call while the GPU runs this one); reading a tensor
    /// waits for it.
    pub fn conv2d_tensor<'a, T: Elem>(
        &self,
        plan: &Plan,
        x: &Tensor,
        w: impl Into<Weights<'a, T>>,
        bias: Option<&[f32]>,
        z: Option<Residual<'_, T>>,
    ) -> Result<Tensor> {
        self.conv2d_tensor_timed(plan, x, w.into(), bias, z, &mut Phases::start())
    }

    /// [`conv2d_tensor`](Self::conv2d_tensor), its host time charged to `ph`'s phases.
    pub(crate) fn conv2d_tensor_timed<T: Elem>(
        &self,
        plan: &Plan,
        x: &Tensor,
        w: Weights<'_, T>,
        bias: Option<&[f32]>,
        z: Option<Residual<'_, T>>,
        ph: &mut Phases,
    ) -> Result<Tensor> {
        self.check_lost()?;
        let _busy = crate::background::busy();
        let p = plan.problem();
        let ours = |t: &Tensor| t.engine.same_as(self);
        if !ours(x) || matches!(z, Some(Residual::Tensor(t)) if !ours(t)) || matches!(w, Weights::Tensor(t) if !ours(t)) {
            return Err(Error::invalid("a Tensor of another engine: tensors run on the engine that uploaded them"));
        }
        if x.array.dims != p.x_dims() {
            return Err(Error::invalid(format!("x is {:?}, the problem's x is {:?}", x.array.dims, p.x_dims())));
        }
        let w_len = match w {
            Weights::Host(h) => h.len(),
            Weights::Tensor(t) => {
                if t.array.dims != p.w_dims() {
                    return Err(Error::invalid(format!("w is {:?}, the problem's w is {:?}", t.array.dims, p.w_dims())));
                }
                t.len()
            }
        };
        let z_len = z.map(|z| match z {
            Residual::Host(h) => Some(h.len()),
            Residual::Tensor(_) => None,
        });
        expect_operands(p, w_len, bias, z_len)?;
        let z = match z {
            Some(Residual::Host(h)) => Some(runner::Residual::Host(h)),
            Some(Residual::Tensor(t)) => {
                if t.array.dims != p.y_dims() {
                    return Err(Error::invalid(format!("z is {:?}, the output is {:?}", t.array.dims, p.y_dims())));
                }
                Some(runner::Residual::Device(&t.array))
            }
            None => None,
        };
        let w = match w {
            Weights::Host(h) => runner::WeightSource::Host(h),
            Weights::Tensor(t) => runner::WeightSource::Device(&t.array),
        };
        let array = no_panic(|| format!("conv2d_tensor on {}", p.label()), || {
            runner::conv2d_device(&self.inner, &p.shape, &plan.variant, &x.array, w, bias, z, poison(), ph)
        })?;
        Ok(Tensor { array, engine: self.clone() })
    }

    /// Waits for every queued [`conv2d_tensor`](Self::conv2d_tensor) call; their errors
    /// surface here.
    pub fn synchronize(&self) -> Result<()> {
        no_panic(|| "synchronize".into(), || runner::synchronize(&self.inner))
    }
}

impl Tensor {
    /// Its dims.
    pub fn dims(&self) -> [usize; 4] {
        self.array.dims
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        self.array.dtype
    }

    /// Its elements.
    pub fn len(&self) -> usize {
        self.array.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.array.is_empty()
    }

    /// The engine it lives on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The buffer holding it, from offset 0 (the buffer may be larger), for the caller's
    /// own passes. Since those may write it, the tensor forgets the largest |value| it took
    /// on upload: a float32-data tensor-core kernel then finds it with a pass of its own.
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.array.forget_max();
        &self.array.buf
    }

    /// Copies it into `out` (`u16` for float16 bits), waiting for the calls writing it.
    pub fn read<T: Elem>(&self, out: &mut [T]) -> Result<()> {
        expect_len("out", out.len(), self.len() as u64)?;
        self.engine.check_lost()?;
        no_panic(|| "reading a Tensor".into(), || self.array.read(&self.engine.inner, out))
    }

    /// Copies it into a new `Vec`.
    pub fn to_vec<T: Elem>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::from_f32(0.0); self.len()];
        self.read(&mut out)?;
        Ok(out)
    }
}
