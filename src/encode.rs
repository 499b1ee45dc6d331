//! [`Engine::encode`]: a convolution recorded into the caller's command encoder, on the
//! caller's buffers.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::host::expect_present;
use crate::plan::Plan;
use crate::pool::{PooledBuffer, View};
use crate::runner::{self, Tensors};
use crate::wait::scoped;

/// The caller's buffers for one convolution: byte ranges (`buffer.slice(offset..)`) of
/// buffers with [`wgpu::BufferUsages::STORAGE`], each starting at a multiple of the
/// device's `min_storage_buffer_offset_alignment` and holding at least the bytes
/// [`Conv2d::buffer_bytes`](crate::Conv2d::buffer_bytes) gives; tensors are C-ordered in
/// the problem's layout. `y` must not overlap the others.
#[derive(Clone, Copy, Debug)]
pub struct Conv2dBuffers<'a> {
    /// The input.
    pub x: wgpu::BufferSlice<'a>,
    /// The weights, (K, C/groups, R, S).
    pub w: wgpu::BufferSlice<'a>,
    /// The float32 bias of K elements, where the problem has one.
    pub bias: Option<wgpu::BufferSlice<'a>>,
    /// The residual of the output's shape, where the problem has one.
    pub z: Option<wgpu::BufferSlice<'a>>,
    /// The output, written whole.
    pub y: wgpu::BufferSlice<'a>,
}

/// Scratch buffers a recorded convolution uses (scales, rearranged copies of x and w,
/// split-K partial sums), on loan from the engine's pool. Keep it until the command buffer
/// holding the convolution has been submitted: dropping it returns the buffers to the pool,
/// which may hand them to another call (later in queue order, which is safe) or free them
/// (which would invalidate an unsubmitted command buffer).
#[must_use = "the workspace must live until the command buffer is submitted"]
#[derive(Debug)]
pub struct Workspace {
    _buffers: Vec<std::sync::Arc<PooledBuffer>>,
}

/// `slice` as the binding of a tensor of `bytes` bytes, or an error naming `what` and the
/// rule it breaks.
fn view<'a>(engine: &Engine, what: &str, slice: wgpu::BufferSlice<'a>, bytes: u64) -> Result<View<'a>> {
    let buffer = slice.buffer();
    if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
        return Err(Error::invalid(format!("{what}'s buffer needs BufferUsages::STORAGE, it has {:?}", buffer.usage())));
    }
    let align = engine.limits().min_storage_buffer_offset_alignment as u64;
    if slice.offset() % align != 0 {
        return Err(Error::invalid(format!(
            "{what}'s offset {} is not a multiple of the device's min_storage_buffer_offset_alignment ({align})",
            slice.offset()
        )));
    }
    if slice.size() < bytes {
        return Err(Error::invalid(format!("{what} needs {bytes} bytes from its offset, its slice holds {}", slice.size())));
    }
    let max = engine.max_binding();
    if bytes > max {
        return Err(Error::invalid(format!(
            "{what} needs {bytes} bytes, more than the device's largest storage binding ({max} bytes); \
             encode takes problems whose tensors each fit one binding"
        )));
    }
    Ok(View { buffer, offset: slice.offset(), size: bytes })
}

/// An optional tensor: present exactly when the problem has it.
fn optional<'a>(engine: &Engine, what: &str, slice: Option<wgpu::BufferSlice<'a>>, bytes: Option<u64>) -> Result<Option<View<'a>>> {
    expect_present(what, slice.is_some(), bytes.is_some())?;
    match (slice, bytes) {
        (Some(s), Some(b)) => view(engine, what, s, b).map(Some),
        _ => Ok(None),
    }
}

impl Engine {
    /// Records `plan`'s convolution into `encoder` as compute passes over the caller's
    /// buffers (one to three passes: a prologue or a max-|x| pass for some kernels, the
    /// convolution, a finishing pass for split-K kernels; a kernel run in chunks repeats its
    /// passes per chunk, with a 4-byte buffer copy before each). Nothing is submitted: the
    /// convolution runs with the rest of the command buffer, ordered after the passes
    /// recorded before it and before those recorded after it. The kernel is compiled on
    /// first use of the (variant, problem) pair and kept.
    ///
    /// Returns the [`Workspace`] to keep until the command buffer is submitted.
    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder, plan: &Plan, buffers: &Conv2dBuffers<'_>) -> Result<Workspace> {
        self.check_lost()?;
        let bytes = plan.problem().buffer_bytes();
        let t = Tensors {
            x: view(self, "x", buffers.x, bytes.x)?,
            w: view(self, "w", buffers.w, bytes.w)?,
            bias: optional(self, "a bias", buffers.bias, bytes.bias)?,
            z: optional(self, "a residual z", buffers.z, bytes.z)?,
            y: view(self, "y", buffers.y, bytes.y)?,
            maxima: None,
            resident: None,
        };
        let engine = &*self.inner;
        let kernel = engine.pipeline(&plan.variant, &plan.problem().shape)?;
        let bound = scoped(engine, || runner::bind(engine, &kernel, t))??;
        runner::encode(engine, encoder, &kernel, &bound, None)?;
        Ok(Workspace { _buffers: bound.into_workspace() })
    }
}
