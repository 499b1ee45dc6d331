//! Running a compiled kernel: device buffers, dispatch, read-back and GPU timing.

use crate::dtype::{convert, DType, Elem};
use crate::check::Comparison;
use crate::device::{Compiled, Engine};
use crate::error::{Error, Result};
use crate::params::{ConvShape, Layout};
use crate::pool::{PooledBuffer, View, INPUT_MAPPED};
use crate::resident::Resident;
use crate::split;
use crate::timing::Phases;
use crate::transfer::{self, MaxFold};
use crate::wait::{self, scoped, wait, wait_all, Landing, Submitted};
use crate::kernels::Variant;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tensors of one conv2d problem, resident on the GPU.
pub struct DeviceTensors {
    pub shape: ConvShape,
    x: PooledBuffer,
    w: Arc<PooledBuffer>,
    bias: Option<Arc<PooledBuffer>>,
    /// The epilogue's residual, of y's shape.
    z: Option<PooledBuffer>,
    y: PooledBuffer,
    /// Bits of max |x| and max |w| over finite elements, taken while uploading (float32).
    maxima: Option<[u32; 2]>,
    /// w's rearranged copies: the inputs stay on the device, so kernels are timed as with
    /// a weight Tensor, w rearranged by the first run only.
    resident: Resident,
}

/// Where a call's residual `z` (y's shape) comes from.
pub enum Residual<'a, T> {
    Host(&'a [T]),
    Device(&'a DeviceArray),
}

/// Where a device call's weights come from.
#[derive(Clone, Copy)]
pub enum WeightSource<'a, T> {
    Host(&'a [T]),
    Device(&'a DeviceArray),
}

/// A 4-D float32 or float16 tensor resident on the GPU (Python: `convtune.Tensor`).
pub struct DeviceArray {
    pub buf: PooledBuffer,
    pub dims: [usize; 4],
    pub dtype: DType,
    /// Bits of its largest finite |v| where known (float32 tensors uploaded from the host),
    /// else `UNKNOWN_MAX`: a kernel that scales it then needs no max pass over it. Atomic, as
    /// handing out the buffer (which the caller may write) forgets it.
    maxabs: AtomicU32,
    /// Copies of it rearranged for the kernels that took it as w (forgotten with the max).
    pub(crate) resident: Resident,
}

/// `DeviceArray::maxabs` when the max is not known (finite values' bits are below 0x7f800000).
const UNKNOWN_MAX: u32 = u32::MAX;

/// Bytes of a buffer of `elems` elements of `dtype`, or an error naming `what` where they
/// exceed the adapter's largest storage binding.
fn check_binding(engine: &Engine, what: &str, elems: u64, dtype: DType) -> Result<u64> {
    let size = dtype.buffer_bytes(elems);
    let max = engine.max_binding();
    if size > max {
        return Err(Error::invalid(format!(
            "{what} needs {size} bytes, more than the adapter's largest storage buffer ({max} bytes)"
        )));
    }
    Ok(size)
}

const INPUT: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_DST);
const OUTPUT: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Bytes of a pooled buffer for `elems` elements of `dtype` (never empty).
fn buffer_size(dtype: DType, elems: u64) -> u64 {
    dtype.buffer_bytes(elems).max(4)
}

/// An error unless host data of type `T` matches the problem's element type.
fn expect_dtype<T: Elem>(shape: &ConvShape) -> Result<()> {
    if T::DTYPE != shape.dtype {
        return Err(Error::invalid(format!("{} data for a {} problem", T::DTYPE.name(), shape.dtype.name())));
    }
    Ok(())
}

/// A pooled storage buffer holding `data`, uploaded and waited for.
fn upload_slice<T: Elem>(engine: &Engine, usage: wgpu::BufferUsages, data: &[T], max: MaxFold<'_>) -> Result<PooledBuffer> {
    let buf = engine.pool.take(usage, buffer_size(T::DTYPE, data.len() as u64))?;
    transfer::upload_now(engine, &buf, data, max)?;
    Ok(buf)
}

/// The weights and bias of a problem, shared by all its pieces, and the staging buffers
/// of their uploads (in flight until the caller's next wait).
struct Weights {
    w: Arc<PooledBuffer>,
    bias: Option<Arc<PooledBuffer>>,
    staging: Vec<PooledBuffer>,
}

/// A pooled input buffer holding `runs` of `data` back to back (`elems` elements). With
/// `direct` (see `Engine::direct_inputs`) it is written in place, and the caller calls
/// `remap_upload` on it once the submissions reading it are queued; otherwise its upload
/// is queued through staging buffers, kept in `staging`.
#[allow(clippy::too_many_arguments)]
fn input<T: Elem>(
    engine: &Engine,
    data: &[T],
    runs: &[(usize, usize)],
    elems: u64,
    direct: bool,
    staging: &mut Vec<PooledBuffer>,
    max: MaxFold<'_>,
) -> Result<PooledBuffer> {
    let size = buffer_size(T::DTYPE, elems);
    if direct {
        let buf = engine.pool.take(INPUT_MAPPED, size)?;
        transfer::write_direct(&buf, data, runs, max)?;
        return Ok(buf);
    }
    let buf = engine.pool.take(INPUT, size)?;
    staging.extend(transfer::upload(engine, &buf, data, runs, max)?);
    Ok(buf)
}

/// A pooled buffer with all of `data` in it (see `input`).
fn put<T: Elem>(engine: &Engine, data: &[T], direct: bool, staging: &mut Vec<PooledBuffer>, max: MaxFold<'_>) -> Result<Arc<PooledBuffer>> {
    input(engine, data, &[(0, data.len())], data.len() as u64, direct, staging, max).map(Arc::new)
}

/// Uploads w and the bias; with `max`, w's largest finite |v| is folded into it on the way.
fn upload_weights<T: Elem>(engine: &Engine, shape: &ConvShape, w: &[T], bias: Option<&[f32]>, direct: bool, max: MaxFold<'_>) -> Result<Weights> {
    check_binding(engine, "w", shape.w_len(), T::DTYPE)?;
    let mut staging = Vec::new();
    let wb = put(engine, w, direct, &mut staging, max)?;
    let bb = bias.map(|b| put(engine, b, direct, &mut staging, None)).transpose()?;
    Ok(Weights { w: wb, bias: bb, staging })
}

/// The maxima a scaled kernel reads (see `Tensors::maxima`), where both are known.
fn folded(x: Option<u32>, w: Option<u32>) -> Option<[u32; 2]> {
    x.zip(w).map(|(x, w)| [x, w])
}

impl Weights {
    /// Asks for the mappings of weights written in place back (see `input`).
    fn remap(&self) {
        self.w.remap_upload();
        if let Some(b) = &self.bias {
            b.remap_upload();
        }
    }
}

/// Fills `buf` with the poison pattern on the GPU (no host copy of the output's size).
fn poison_buffer(engine: &Engine, buf: &PooledBuffer, dtype: DType) -> Result<()> {
    let checker = engine.checker()?;
    scoped(engine, || {
        let mut enc = engine.device.create_command_encoder(&Default::default());
        checker.fill(&engine.device, &mut enc, buf, dtype);
        engine.queue.submit([enc.finish()]);
    })
}

/// A rearranged copy of w and the key it is kept under.
type KeptCopy = (u64, Arc<PooledBuffer>);

/// The bindings of one conv dispatch: x, w, bias, y, the epilogue's z, the run's words
/// (binding 4: for kernels that scale their inputs, the max |x| and max |w|, written when
/// bound where the host knows them, else by a pass before the kernel; for chunked kernels,
/// the chunk's index), and the workspace a kernel's prologue fills.
pub(crate) struct Bindings<'a> {
    group: wgpu::BindGroup,
    x: View<'a>,
    w: View<'a>,
    words: Option<PooledBuffer>,
    /// A size-generic module's sizes (binding 7 in z's place, or 4 in the words').
    dims: Option<PooledBuffer>,
    /// The words hold the maxima already: no max pass, no clearing.
    preset: bool,
    workspace: Vec<Option<Arc<PooledBuffer>>>,
    /// The weight pass's bind group (w in, the kernel's weights out; none where those
    /// weights were kept from an earlier call) and those weights.
    wprep: Option<(Option<wgpu::BindGroup>, Arc<PooledBuffer>)>,
    /// w's copy in the workspace was kept from an earlier call.
    w_copy_kept: bool,
    /// The weight passes have been recorded by an earlier `encode` of these bindings (later
    /// runs of the same submission, or later submissions, find their output in place).
    weights_recorded: std::cell::Cell<bool>,
    /// Where the copies these bindings make are kept once submitted, with their keys.
    resident: Option<(&'a Resident, Vec<KeptCopy>)>,
}

impl Bindings<'_> {
    /// The pooled buffers the kernel writes besides y: they must stay out of the pool until
    /// the GPU has run the passes that use them.
    pub(crate) fn into_workspace(self) -> Vec<Arc<PooledBuffer>> {
        let weights = self.wprep.map(|(_, buf)| buf);
        let words = self.words.into_iter().chain(self.dims).map(Arc::new);
        words.chain(self.workspace.into_iter().flatten()).chain(weights).collect()
    }

    /// Keeps the weight copies these bindings made with the weights: call once the passes
    /// writing them are submitted.
    pub(crate) fn keep_weights(&self) {
        if let Some((resident, made)) = &self.resident {
            for (key, buf) in made {
                resident.keep(*key, buf.clone());
            }
        }
    }
}

/// The tensors one dispatch binds.
pub(crate) struct Tensors<'a> {
    pub x: View<'a>,
    pub w: View<'a>,
    pub bias: Option<View<'a>>,
    pub z: Option<View<'a>>,
    pub y: View<'a>,
    /// Bits of max |x| and max |w| over finite elements where the host knows them (taken
    /// while uploading): a kernel that scales its inputs then skips its max pass.
    pub maxima: Option<[u32; 2]>,
    /// w's kept copies, where w stays on the device unchanged between calls.
    pub resident: Option<&'a Resident>,
}

#[allow(clippy::too_many_arguments)]
fn bindings<'a>(
    engine: &Engine,
    kernel: &Compiled,
    x: &'a PooledBuffer,
    w: &'a PooledBuffer,
    bias: Option<&'a PooledBuffer>,
    z: Option<&'a PooledBuffer>,
    y: &'a PooledBuffer,
    maxima: Option<[u32; 2]>,
    resident: Option<&'a Resident>,
) -> Result<Bindings<'a>> {
    let t = Tensors { x: x.view(), w: w.view(), bias: bias.map(|b| b.view()), z: z.map(|z| z.view()), y: y.view(), maxima, resident };
    bind(engine, kernel, t)
}

/// A copy of w made under `key`: the one kept with resident weights, else a new pooled
/// buffer, listed in `made` to be kept once written. Whether it was kept comes with it.
fn weight_copy(
    engine: &Engine,
    resident: Option<&Resident>,
    key: u64,
    bytes: u64,
    made: &mut Vec<KeptCopy>,
) -> Result<(Arc<PooledBuffer>, bool)> {
    if let Some(buf) = resident.and_then(|r| r.get(key)) {
        return Ok((buf, true));
    }
    let buf = Arc::new(engine.pool.take(OUTPUT, bytes.max(16))?);
    if resident.is_some() {
        made.push((key, buf.clone()));
    }
    Ok((buf, false))
}

/// The bind group of one dispatch of `kernel` over `t`, with the kernel's run words and
/// workspace taken from the pool (w's copies from those kept with resident weights).
pub(crate) fn bind<'a>(engine: &Engine, kernel: &Compiled, t: Tensors<'a>) -> Result<Bindings<'a>> {
    let Tensors { x, w, bias, z, y, maxima, resident } = t;
    let words = if kernel.scaled || kernel.chunks > 1 { Some(engine.pool.take(OUTPUT, 16)?) } else { None };
    // A size-generic module reads the call's sizes in z's place or the words' (`generic`).
    let (dims, dims_at) = match &kernel.dims {
        Some((at, dims)) => {
            let buf = engine.pool.take(OUTPUT, (4 * dims.len() as u64).max(16))?;
            engine.queue.write_buffer(&buf, 0, bytemuck::cast_slice(dims));
            (Some(buf), *at)
        }
        None => (None, 0),
    };
    let sizes_at = |binding: u32| dims.as_ref().filter(|_| dims_at == binding);
    // Written ahead of the submission that runs the kernel; no pass writes these two words
    // then: word 2 tells a layout-1 prologue, the one pass that finds the maxima itself,
    // that they are there already (it would only find the same values).
    let preset = match (kernel.scaled, maxima, &words) {
        (true, Some([mx, mw]), Some(buf)) => {
            engine.queue.write_buffer(buf, 0, bytemuck::cast_slice(&[mx, mw, 1, 0]));
            true
        }
        _ => false,
    };
    let resident = resident.filter(|_| w_copy_optional(kernel, preset));
    let mut made = Vec::new();
    // Slots keep their bindings: a kernel may need the second workspace and not the first.
    let mut w_copy_kept = false;
    let workspace = kernel
        .workspace
        .iter()
        .enumerate()
        .map(|(slot, &bytes)| -> Result<Option<Arc<PooledBuffer>>> {
            if bytes == 0 {
                return Ok(None);
            }
            if slot == 1 && kernel.w_blocks > 0 {
                let (buf, kept) = weight_copy(engine, resident, kernel.w_key, bytes, &mut made)?;
                w_copy_kept = kept;
                return Ok(Some(buf));
            }
            Ok(Some(Arc::new(engine.pool.take(OUTPUT, bytes.max(16))?)))
        })
        .collect::<Result<Vec<_>>>()?;
    // A lowered form reads the weights its weight pass writes; that pass binds w as its
    // input and the new weights where a kernel's y goes.
    let wprep = kernel
        .wprep
        .as_ref()
        .map(|pass| -> Result<_> {
            let (buf, kept) = weight_copy(engine, resident, pass.key, pass.bytes, &mut made)?;
            let group = (!kept).then(|| {
                bind_group(engine, "convtune weights", [
                    x.binding(),
                    w.binding(),
                    or_input(engine, None),
                    buf.binding(),
                    or_scratch(engine, None),
                    or_scratch(engine, None),
                    or_scratch(engine, None),
                    or_input(engine, None),
                ])
            });
            Ok((group, buf))
        })
        .transpose()?;
    let kernel_w = wprep.as_ref().map_or_else(|| w.binding(), |(_, buf)| buf.binding());
    let group = bind_group(engine, "convtune conv2d", [
        x.binding(),
        kernel_w,
        or_input(engine, bias),
        y.binding(),
        or_scratch(engine, sizes_at(4).or(words.as_ref())),
        or_scratch(engine, workspace.first().and_then(Option::as_deref)),
        or_scratch(engine, workspace.get(1).and_then(Option::as_deref)),
        match sizes_at(7) {
            Some(buf) => buf.binding(),
            None => or_input(engine, z),
        },
    ]);
    Ok(Bindings {
        group,
        x,
        w,
        words,
        dims,
        preset,
        workspace,
        wprep,
        w_copy_kept,
        weights_recorded: std::cell::Cell::new(false),
        resident: resident.map(|r| (r, made)),
    })
}

/// Whether the prologue's w workgroups may be left out once w's copy holds what they write:
/// not where they also find max |w| for the kernel (a layout-1 prologue on float32 data whose
/// max is neither preset nor found by a pass before it).
fn w_copy_optional(kernel: &Compiled, preset: bool) -> bool {
    !(kernel.scaled && !kernel.prescale && !preset)
}

/// A bind group of the engine's layout, bindings 0-7 in order.
fn bind_group(engine: &Engine, label: &str, resources: [wgpu::BindingResource<'_>; 8]) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = resources
        .into_iter()
        .enumerate()
        .map(|(i, resource)| wgpu::BindGroupEntry { binding: i as u32, resource })
        .collect();
    engine.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &engine.bind_layout, entries: &entries })
}

/// `buf`'s binding, or the stand-in for an input the call does not have (bias, z).
fn or_input<'b>(engine: &'b Engine, buf: Option<View<'b>>) -> wgpu::BindingResource<'b> {
    buf.map_or_else(|| engine.no_input.as_entire_binding(), |b| b.binding())
}

/// `buf`'s binding, or the stand-in for a writable binding the kernel does not use.
fn or_scratch<'b>(engine: &'b Engine, buf: Option<&'b PooledBuffer>) -> wgpu::BindingResource<'b> {
    match buf {
        Some(b) => b.binding(),
        None => engine.no_scratch.as_entire_binding(),
    }
}

/// `groups` workgroups folded into a 2D grid within the per-dimension limit.
fn grid(engine: &Engine, groups: u64) -> Result<(u32, u32)> {
    let max = engine.caps.limits.max_compute_workgroups_per_dimension.max(1) as u64;
    let gx = groups.min(max);
    let gy = groups.div_ceil(gx.max(1));
    if gy > max {
        return Err(Error::invalid(format!(
            "the problem needs {groups} workgroups, more than this adapter can dispatch"
        )));
    }
    Ok((gx as u32, gy as u32))
}

/// Records one run of `kernel` (its weight pass, its scale pass, then per chunk its
/// prologue, its dispatch and its finishing pass), optionally bracketed by timestamp
/// queries: the run's first pass writes the beginning, its last the end. A chunked kernel's
/// passes find the chunk's index in word `CHUNK_WORD` of the run's words (binding 4), copied
/// there from the engine's `chunk_indices` before each chunk.
pub(crate) fn encode(
    engine: &Engine,
    encoder: &mut wgpu::CommandEncoder,
    kernel: &Compiled,
    b: &Bindings,
    timestamps: Option<(&wgpu::QuerySet, u32)>,
) -> Result<()> {
    let mut began = false;
    // w's rearranged copies are written once per bindings: later runs find them in place.
    let weights_done = b.weights_recorded.replace(true);
    if let (Some(pass), Some((Some(group), _)), false) = (&kernel.wprep, &b.wprep, weights_done) {
        record_dispatches(engine, encoder, "convtune weights", &[(&pass.pipeline, pass.workgroups)], group, timestamps, true, false)?;
        began = true;
    }
    if let (true, false, Some(words)) = (kernel.scaled, b.preset, &b.words) {
        if kernel.prologue.is_some() && !kernel.prescale {
            encoder.clear_buffer(words, 0, Some(16));
        } else {
            let checker = engine.checker()?;
            checker.maxabs(&engine.device, encoder, b.x, b.w, words, timestamps.filter(|_| !began));
            began = true;
        }
    }
    for chunk in 0..kernel.chunks {
        if kernel.chunks > 1 {
            let words = b.words.as_ref().ok_or_else(|| Error::Gpu("a chunked kernel bound without its run words".into()))?;
            encoder.copy_buffer_to_buffer(&engine.chunk_indices, 4 * chunk as u64, words, 4 * crate::codegen::CHUNK_WORD, 4);
        }
        // The prologue's w workgroups come last: left out, the grid ends before them (a grid
        // folded past the per-dimension limit may still reach a few, which rewrite the same
        // values).
        let w_in_place = w_copy_optional(kernel, b.preset) && (b.w_copy_kept || weights_done || chunk > 0);
        let prologue = kernel.prologue.as_ref().map(|(p, g)| (p, if w_in_place { g - kernel.w_blocks.min(*g) } else { *g }));
        // A chunk's prologue, kernel and finishing pass are dispatches of one compute pass:
        // wgpu still orders them (a barrier between dispatches), and each pass boundary cost
        // ~5 us of GPU time on an H200.
        let dispatches: Vec<(&wgpu::ComputePipeline, u64)> = prologue
            .into_iter()
            .filter(|&(_, g)| g > 0)
            .chain([(&kernel.pipeline, kernel.workgroups)])
            .chain(kernel.finish.iter().map(|(p, g)| (p, *g)))
            .collect();
        record_dispatches(engine, encoder, "convtune conv2d", &dispatches, &b.group, timestamps, !began, chunk + 1 == kernel.chunks)?;
        began = true;
    }
    Ok(())
}

/// Records `dispatches` (pipeline, workgroups) in one compute pass over `group`, writing the
/// run's beginning (`first`) and end (`last`) timestamps where asked.
#[allow(clippy::too_many_arguments)]
fn record_dispatches(
    engine: &Engine,
    encoder: &mut wgpu::CommandEncoder,
    label: &str,
    dispatches: &[(&wgpu::ComputePipeline, u64)],
    group: &wgpu::BindGroup,
    timestamps: Option<(&wgpu::QuerySet, u32)>,
    first: bool,
    last: bool,
) -> Result<()> {
    let grids = dispatches.iter().map(|&(_, groups)| grid(engine, groups)).collect::<Result<Vec<_>>>()?;
    let timestamp_writes = timestamps.filter(|_| first || last).map(|(qs, i)| wgpu::ComputePassTimestampWrites {
        query_set: qs,
        beginning_of_pass_write_index: first.then_some(i),
        end_of_pass_write_index: last.then_some(i + 1),
    });
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes });
    pass.set_bind_group(0, group, &[]);
    for (&(pipeline, _), &(gx, gy)) in dispatches.iter().zip(&grids) {
        pass.set_pipeline(pipeline);
        pass.dispatch_workgroups(gx, gy, 1);
    }
    Ok(())
}

/// Submits one dispatch of `kernel`, after filling `poison` with the poison pattern.
fn submit_once(
    engine: &Engine,
    kernel: &Compiled,
    bg: &Bindings,
    poison: Option<&PooledBuffer>,
) -> Result<Submitted> {
    Ok(submit_then(engine, kernel, bg, poison, |_| Ok(()))?.0)
}

/// `submit_once`, with what `then` records after the dispatch in the same submission; also
/// returns what `then` returned.
fn submit_then<R>(
    engine: &Engine,
    kernel: &Compiled,
    bg: &Bindings,
    poison: Option<&PooledBuffer>,
    then: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<R>,
) -> Result<(Submitted, R)> {
    let checker = poison.map(|_| engine.checker()).transpose()?;
    scoped(engine, || -> Result<(Submitted, R)> {
        let mut enc = engine.device.create_command_encoder(&Default::default());
        if let (Some(c), Some(buf)) = (&checker, poison) {
            c.fill(&engine.device, &mut enc, buf, kernel.dtype);
        }
        encode(engine, &mut enc, kernel, bg, None)?;
        let recorded = then(&mut enc)?;
        let done = wait::submit(engine, [enc.finish()])?;
        bg.keep_weights();
        Ok((done, recorded))
    })?
}

/// Dispatches `kernel` once and waits for it.
fn run_once(engine: &Engine, kernel: &Compiled, bg: &Bindings) -> Result<()> {
    let done = submit_once(engine, kernel, bg, None)?;
    wait(engine, &done)
}

impl DeviceTensors {
    pub fn upload<T: Elem>(
        engine: &Engine,
        shape: &ConvShape,
        x: &[T],
        w: &[T],
        bias: Option<&[f32]>,
        z: Option<&[T]>,
    ) -> Result<Self> {
        expect_dtype::<T>(shape)?;
        check_binding(engine, "x", shape.x_len(), T::DTYPE)?;
        // float32 inputs carry their maxima, as a user's call's do (see `conv2d_timed`):
        // kernels are tuned and timed without the max pass they run without.
        let (xmax, wmax) = (AtomicU32::new(0), AtomicU32::new(0));
        let fold = shape.dtype == DType::F32;
        let weights = upload_weights(engine, shape, w, bias, false, fold.then_some(&wmax))?;
        let ys = check_binding(engine, "the output", shape.y_len(), T::DTYPE)?;
        let xb = upload_slice(engine, INPUT, x, fold.then_some(&xmax))?;
        Ok(DeviceTensors {
            shape: *shape,
            x: xb,
            w: weights.w,
            bias: weights.bias,
            z: z.map(|z| upload_slice(engine, INPUT, z, None)).transpose()?,
            y: engine.pool.take(OUTPUT, ys)?,
            maxima: folded(fold.then(|| xmax.load(Ordering::Relaxed)), Some(wmax.into_inner())),
            resident: Resident::default(),
        })
    }

    /// Uploads pseudo-random inputs of the problem's element type (x, w, bias and z where
    /// the problem has them, from `seeds` in that order): tuning and timing inputs.
    pub fn random(engine: &Engine, shape: &ConvShape, seeds: [u64; 4]) -> Result<Self> {
        let x = random_data(shape.x_len() as usize, seeds[0]);
        let w = random_data(shape.w_len() as usize, seeds[1]);
        let b = shape.bias.then(|| random_data(shape.k as usize, seeds[2]));
        let z = shape.epilogue.residual.then(|| random_data(shape.y_len() as usize, seeds[3]));
        match shape.dtype {
            DType::F32 => Self::upload(engine, shape, &x, &w, b.as_deref(), z.as_deref()),
            DType::F16 => {
                let (x, w) = (convert::<u16>(&x), convert::<u16>(&w));
                let z = z.map(|z| convert::<u16>(&z));
                Self::upload(engine, shape, &x, &w, b.as_deref(), z.as_deref())
            }
        }
    }

    /// The output, read back and widened to float32.
    pub fn read_y_f32(&self, engine: &Engine) -> Result<Vec<f32>> {
        let len = self.shape.y_len() as usize;
        match self.shape.dtype {
            DType::F32 => {
                let mut out = vec![0f32; len];
                self.read_y(engine, &mut out)?;
                Ok(out)
            }
            DType::F16 => {
                let mut out = vec![0u16; len];
                self.read_y(engine, &mut out)?;
                Ok(out.into_iter().map(Elem::to_f32).collect())
            }
        }
    }

    /// Fills the output with the poison pattern so unwritten elements show.
    pub fn poison(&self, engine: &Engine) -> Result<()> {
        poison_buffer(engine, &self.y, self.shape.dtype)
    }

    /// A GPU copy of the output, e.g. to compare later runs against.
    pub fn copy_y(&self, engine: &Engine) -> Result<PooledBuffer> {
        let copy = engine.pool.take(OUTPUT, self.y.size)?;
        scoped(engine, || {
            let mut enc = engine.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&self.y, 0, &copy, 0, self.y.size);
            engine.queue.submit([enc.finish()]);
        })?;
        Ok(copy)
    }

    /// Compares the output with `reference` (an earlier `copy_y`) on the GPU.
    pub fn compare_y(&self, engine: &Engine, reference: &PooledBuffer) -> Result<Comparison> {
        let checker = engine.checker()?;
        let stats = engine.pool.take(OUTPUT, 16)?;
        let idx = scoped(engine, || {
            let mut enc = engine.device.create_command_encoder(&Default::default());
            checker.compare(&engine.device, &mut enc, &self.y, reference, &stats, self.shape.dtype);
            wait::submit(engine, [enc.finish()])
        })??;
        wait(engine, &idx)?;
        let mut raw = [0u8; 16];
        read_buffer(engine, &stats, &mut raw)?;
        Ok(Comparison::from_stats(&raw))
    }

    fn bindings(&self, engine: &Engine, kernel: &Compiled) -> Result<Bindings<'_>> {
        bindings(engine, kernel, &self.x, &self.w, self.bias.as_deref(), self.z.as_ref(), &self.y, self.maxima, Some(&self.resident))
    }

    /// Runs `kernel` once and waits for it.
    pub fn run(&self, engine: &Engine, kernel: &Compiled) -> Result<()> {
        run_once(engine, kernel, &self.bindings(engine, kernel)?)
    }

    /// Copies the output into `out`.
    pub fn read_y<T: Elem>(&self, engine: &Engine, out: &mut [T]) -> Result<()> {
        transfer::download_all(engine, &self.y, out)
    }

    /// Runs `kernel` until its run time settles: two consecutive batches whose medians agree
    /// within 3%, after at least `min` and at most `max` of wall time. GPUs lower their
    /// clocks when idle (an idle H200 was read at 345 MHz against 1980 MHz under load) and
    /// take a while to raise them: right after a pause — a shader compile, the end of a
    /// tuning run — a kernel was seen to run 3-5x slower for tens of runs in a row.
    pub fn settle(&self, engine: &Engine, kernel: &Compiled, min: Duration, max: Duration) -> Result<()> {
        let start = Instant::now();
        let mut reps = 4;
        let mut prev: Option<f64> = None;
        loop {
            let times = self.time(engine, kernel, reps)?;
            let med = median(&times).unwrap_or(0.0);
            let settled = prev.is_some_and(|p| (med - p).abs() <= 0.03 * p.min(med));
            if (settled && start.elapsed() >= min) || start.elapsed() >= max {
                return Ok(());
            }
            // Batches of at least ~5 ms, so one batch spans more than a clock step.
            if times.iter().sum::<f64>() < 5e-3 {
                reps = (reps * 2).min(1024);
            }
            prev = Some(med);
        }
    }

    /// GPU time of `reps` runs of `kernel`, in seconds each: timestamp queries around each
    /// dispatch where the adapter has them, else wall clock around a queue sync.
    pub fn time(&self, engine: &Engine, kernel: &Compiled, reps: u32) -> Result<Vec<f64>> {
        let reps = reps.clamp(1, 1024);
        let bg = self.bindings(engine, kernel)?;
        if !engine.has_timestamps() {
            let mut out = Vec::with_capacity(reps as usize);
            for _ in 0..reps {
                let t0 = Instant::now();
                run_once(engine, kernel, &bg)?;
                out.push(t0.elapsed().as_secs_f64());
            }
            return Ok(out);
        }
        let count = 2 * reps;
        let (qs, resolve) = scoped(engine, || {
            let qs = engine.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("convtune timing"),
                ty: wgpu::QueryType::Timestamp,
                count,
            });
            let resolve = engine.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("convtune timing"),
                size: count as u64 * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            (qs, resolve)
        })?;
        let mut enc = engine.device.create_command_encoder(&Default::default());
        for i in 0..reps {
            encode(engine, &mut enc, kernel, &bg, Some((&qs, 2 * i)))?;
        }
        enc.resolve_query_set(&qs, 0..count, &resolve, 0);
        let idx = wait::submit(engine, [enc.finish()])?;
        bg.keep_weights();
        wait(engine, &idx)?;
        let mut raw = vec![0u8; count as usize * 8];
        read_buffer(engine, &resolve, &mut raw)?;
        let period = engine.queue.get_timestamp_period() as f64;
        let ticks: Vec<u64> = raw
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8-byte chunk")))
            .collect();
        Ok(ticks
            .chunks(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * period * 1e-9)
            .collect())
    }
}

/// Copies the start of a GPU buffer into `out` through a mappable staging buffer (small
/// reads: statistics, timestamps).
fn read_buffer(engine: &Engine, src: &wgpu::Buffer, out: &mut [u8]) -> Result<()> {
    let size = out.len() as u64;
    if size == 0 {
        return Ok(());
    }
    let staging = engine.pool.take(crate::pool::DOWNLOAD, size)?;
    let mut enc = engine.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, &staging, 0, size);
    let idx = engine.queue.submit([enc.finish()]);
    Landing::map_read(&staging, size).wait(engine, idx)?;
    {
        let view = staging
            .slice(..size)
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("mapping the output failed: {e}")))?;
        out.copy_from_slice(&view);
    }
    staging.unmap();
    Ok(())
}

/// One conv2d: upload, run `variant`, read the output into `out` (length `shape.y_len()`).
/// Problems larger than one storage binding run as several pieces (see `split`).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub fn conv2d<T: Elem>(
    engine: &Engine,
    shape: &ConvShape,
    variant: &Variant,
    x: &[T],
    w: &[T],
    bias: Option<&[f32]>,
    z: Option<&[T]>,
    out: &mut [T],
    poison: bool,
) -> Result<()> {
    conv2d_timed(engine, shape, variant, x, w, bias, z, out, poison, &mut Phases::start())
}

/// `conv2d`, charging its time to phases of `ph`.
///
/// Per piece, one pass: the input's chunks are written into mapped staging and their GPU
/// copies submitted as they fill (with the weights' for the first piece), then the kernel
/// and, queued behind it, the output's copies back; each output chunk is copied into `out`
/// as it lands (`transfer`). Phases: `gpu_wait` ends with the kernel (or less, where a
/// driver blocks in `readback_submit` until it has finished), `download` covers the rest
/// of the read-back copies and the host copies into `out`.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_timed<T: Elem>(
    engine: &Engine,
    shape: &ConvShape,
    variant: &Variant,
    x: &[T],
    w: &[T],
    bias: Option<&[f32]>,
    z: Option<&[T]>,
    out: &mut [T],
    poison: bool,
    ph: &mut Phases,
) -> Result<()> {
    expect_dtype::<T>(shape)?;
    let pieces = split::plan(shape, engine.max_binding())?;
    if pieces.len() > 1 && shape.dtype == DType::F16 {
        // Pieces copy runs at any element offset; float16 copies move whole 4-byte words.
        return Err(Error::invalid(format!(
            "float16 problems must fit the adapter's largest storage buffer ({} bytes) as a whole; \
             this one is split into {} pieces: use float32 data, or a smaller batch",
            engine.max_binding(),
            pieces.len()
        )));
    }
    let direct = engine.direct_inputs;
    // Every piece runs the same variant: where it scales its inputs, the copy threads fold
    // x's and w's maxima as they upload them and the kernel runs without its max pass.
    let scaled = match pieces.iter().find_map(|p| p.shape) {
        Some(sub) => engine.pipeline(variant, &sub)?.scaled,
        None => false,
    };
    ph.mark("pipeline");
    let wmax = AtomicU32::new(0);
    let mut weights = upload_weights(engine, shape, w, bias, direct, scaled.then_some(&wmax))?;
    ph.mark("upload");
    for (i, piece) in pieces.iter().enumerate() {
        let first = i == 0;
        let y_runs = split::y_runs(shape, piece);
        let Some(sub) = piece.shape else {
            fill_padding_only(shape, w, bias, z, &y_runs, out);
            continue;
        };
        let kernel = engine.pipeline(variant, &sub)?;
        ph.mark("pipeline");
        let y = engine.pool.take(OUTPUT, check_binding(engine, "the output", sub.y_len(), shape.dtype)?)?;
        ph.mark("buffers");
        let mut staging = Vec::new();
        let x_runs = split::x_runs(shape, piece, &sub);
        let xmax = AtomicU32::new(0);
        let mut x_in = || input(engine, x, &x_runs, sub.x_len(), direct, &mut staging, scaled.then_some(&xmax));
        // The host writes x at the rate the bus takes them (four copy threads reach it on an
        // H100 machine), so other copy threads touch the result's pages meanwhile, on the
        // pool for the larger of the two.
        let xb = if first && transfer::worth_prefaulting(out) {
            let bytes = T::DTYPE.buffer_bytes(sub.x_len()).max(std::mem::size_of_val(out) as u64);
            transfer::alongside(bytes, x_in, || transfer::prefault(out))
        } else {
            x_in()
        }?;
        // The residual is laid out like y, so it travels in y's runs.
        let zb = z.map(|z| input(engine, z, &y_runs, sub.y_len(), direct, &mut staging, None)).transpose()?;
        ph.mark("upload");
        let maxima = folded(scaled.then(|| xmax.load(Ordering::Relaxed)), Some(wmax.load(Ordering::Relaxed)));
        let bound = bindings(engine, &kernel, &xb, &weights.w, weights.bias.as_deref(), zb.as_ref(), &y, maxima, None)?;
        let (idx, staged) = submit_then(engine, &kernel, &bound, poison.then_some(&y), |enc| {
            transfer::stage_download::<T>(engine, &y, &y_runs, enc)
        })?;
        xb.remap_upload();
        if let Some(zb) = &zb {
            zb.remap_upload();
        }
        ph.mark("submit");
        // Some drivers (lavapipe) block here until the kernel is done.
        let download = staged.start(engine, &y, idx.idx.clone())?;
        ph.mark("readback_submit");
        wait(engine, &idx)?;
        ph.mark("gpu_wait");
        download.finish(engine, out)?;
        ph.mark("download");
        // The waits above covered every upload: the pool takes the staging back mapped.
        drop(staging);
        weights.staging.clear();
        ph.mark("release");
    }
    if direct {
        // Every piece's kernel is done: the weights' mappings come back at this poll.
        weights.remap();
        wait_all(engine)?;
    }
    Ok(())
}

/// Output rows whose windows see only padding: their sum is 0 * w, NaN where a weight is
/// not finite (as in a zero-padded reference), put through the epilogue like any other.
fn fill_padding_only<T: Elem>(
    shape: &ConvShape,
    w: &[T],
    bias: Option<&[f32]>,
    z: Option<&[T]>,
    runs: &[(usize, usize)],
    out: &mut [T],
) {
    let per_k = (shape.cg() * shape.r * shape.s) as usize;
    let kk = shape.k as usize;
    let nan: Vec<bool> = (0..kk).map(|k| w[k * per_k..(k + 1) * per_k].iter().any(|v| !v.to_f32().is_finite())).collect();
    for (run, &(start, len)) in runs.iter().enumerate() {
        for i in start..start + len {
            // NCHW bands are one run per channel; NHWC runs hold whole pixels, channel last.
            let k = if shape.layout == Layout::Nhwc { i % kk } else { run % kk };
            let acc = if nan[k] { f32::NAN } else { 0.0 };
            let b = bias.map_or(0.0, |b| b[k]);
            out[i] = T::from_f32(shape.epilogue.apply(acc, b, z.map_or(0.0, |z| z[i].to_f32())));
        }
    }
}

/// A device call's weights in GPU memory: uploaded for it, or a tensor's (with the call's
/// bias uploaded).
enum PlacedWeights<'a> {
    Uploaded(Weights),
    Tensor(&'a DeviceArray, Option<PooledBuffer>),
}

/// A conv2d on a GPU-resident input; the output stays on the GPU.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_device<T: Elem>(
    engine: &Engine,
    shape: &ConvShape,
    variant: &Variant,
    x: &DeviceArray,
    w: WeightSource<'_, T>,
    bias: Option<&[f32]>,
    z: Option<Residual<'_, T>>,
    poison: bool,
    ph: &mut Phases,
) -> Result<DeviceArray> {
    let w_tensor = match w {
        WeightSource::Device(t) => Some(t),
        WeightSource::Host(_) => None,
    };
    let tensor_types = [Some(x.dtype), w_tensor.map(|t| t.dtype), match z {
        Some(Residual::Device(t)) => Some(t.dtype),
        _ => None,
    }];
    if T::DTYPE != shape.dtype || tensor_types.iter().flatten().any(|&d| d != shape.dtype) {
        return Err(Error::invalid(format!("x, w and z must all hold {} data", shape.dtype.name())));
    }
    let ys = check_binding(engine, "the output", shape.y_len(), shape.dtype)?;
    let kernel = engine.pipeline(variant, shape)?;
    ph.mark("pipeline");
    let wmax = AtomicU32::new(0);
    // Host weights are uploaded (their max folded on the way); a weight tensor is bound as it
    // is, with the max it took on upload and its kept copies, and only the bias is uploaded.
    let placed = match w {
        WeightSource::Host(h) => PlacedWeights::Uploaded(upload_weights(engine, shape, h, bias, false, kernel.scaled.then_some(&wmax))?),
        WeightSource::Device(t) => PlacedWeights::Tensor(t, bias.map(|b| upload_slice(engine, INPUT, b, None)).transpose()?),
    };
    let (w_buf, b_buf, w_max, resident) = match &placed {
        PlacedWeights::Tensor(t, b) => (&t.buf, b.as_ref(), t.known_max(), Some(&t.resident)),
        PlacedWeights::Uploaded(u) => (&*u.w, u.bias.as_deref(), Some(wmax.load(Ordering::Relaxed)), None),
    };
    let z_host = match z {
        Some(Residual::Host(z)) => Some(upload_slice(engine, INPUT, z, None)?),
        _ => None,
    };
    let zb = match z {
        Some(Residual::Device(t)) => Some(&t.buf),
        _ => z_host.as_ref(),
    };
    let y = engine.pool.take(OUTPUT, ys)?;
    ph.mark("upload");
    // A tensor uploaded from the host knows its max; a conv's output does not (its max pass runs).
    let maxima = folded(x.known_max().filter(|_| kernel.scaled), w_max);
    let bound = bindings(engine, &kernel, &x.buf, w_buf, b_buf, zb, &y, maxima, resident)?;
    ph.mark("buffers");
    let idx = submit_once(engine, &kernel, &bound, poison.then_some(&y))?;
    ph.mark("submit");
    // Returns with the kernel queued and waits for this thread's previous Tensor call's
    // instead: the host prepares call n+1 while the GPU runs call n (one wait per call took
    // 0.3-0.5 ms of a 1.1 ms EDSR conv), and no thread has more than one call in flight.
    // Later work on the output is ordered behind it by the queue; reading it back waits for
    // it. Per thread, not per engine: with one slot for all, a thread waited for another's
    // call submitted a moment before (8 threads' tiny Tensor calls ran 0.75-0.95x one
    // thread's rate on an H200).
    let previous = {
        let mut slots = engine.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let previous = slots.insert(std::thread::current().id(), idx);
        // Threads that ended leave their slots: past a bound, the next wait is for all.
        let crowded = slots.len() > IN_FLIGHT_SLOTS;
        if crowded {
            slots.clear();
        }
        (previous, crowded)
    };
    match previous {
        (_, true) => wait_all(engine)?,
        (Some(p), false) => wait(engine, &p)?,
        (None, false) => {}
    }
    ph.mark("previous_wait");
    Ok(DeviceArray { buf: y, dims: shape.y_dims(), dtype: shape.dtype, maxabs: AtomicU32::new(UNKNOWN_MAX), resident: Resident::default() })
}

/// Threads' Tensor-call slots kept before a call waits for all of them (`conv2d_device`).
const IN_FLIGHT_SLOTS: usize = 256;

/// Waits for every queued GPU call (Tensor calls return before their kernel ends).
pub fn synchronize(engine: &Engine) -> Result<()> {
    let pending = {
        let mut slots = engine.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let pending = !slots.is_empty();
        slots.clear();
        pending
    };
    if pending {
        wait_all(engine)?;
    }
    Ok(())
}

impl DeviceArray {
    /// Uploads a C-contiguous 4-D array; a float32 one keeps its largest finite |v|, folded
    /// on the copy threads, for the kernels that scale it.
    pub fn upload<T: Elem>(engine: &Engine, data: &[T], dims: [usize; 4]) -> Result<Self> {
        check_binding(engine, "the tensor", data.len() as u64, T::DTYPE)?;
        let max = AtomicU32::new(0);
        let fold = T::DTYPE == DType::F32;
        let buf = upload_slice(engine, OUTPUT, data, fold.then_some(&max))?;
        let maxabs = if fold { max.into_inner() } else { UNKNOWN_MAX };
        Ok(DeviceArray { buf, dims, dtype: T::DTYPE, maxabs: AtomicU32::new(maxabs), resident: Resident::default() })
    }

    /// Bits of its largest finite |v|, where known.
    pub fn known_max(&self) -> Option<u32> {
        Some(self.maxabs.load(Ordering::Relaxed)).filter(|&m| m != UNKNOWN_MAX)
    }

    /// Forgets its max: its buffer may be written by others from now on.
    pub fn forget_max(&self) {
        self.maxabs.store(UNKNOWN_MAX, Ordering::Relaxed);
        self.resident.clear();
    }

    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the tensor to the host.
    pub fn read<T: Elem>(&self, engine: &Engine, out: &mut [T]) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(format!("reading a {} tensor as {}", self.dtype.name(), T::DTYPE.name())));
        }
        transfer::download_all(engine, &self.buf, out)
    }
}

pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mid = s.len() / 2;
    Some(if s.len() % 2 == 1 { s[mid] } else { (s[mid - 1] + s[mid]) / 2.0 })
}

/// Deterministic pseudo-random values in [-1, 1), never all zero: timing and tuning inputs.
pub fn random_data(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dtype::finite_abs_max;
    use crate::device::engine;
    use crate::params::Padding;
    use crate::kernels::swept_variants;

    /// Naive float64 reference with PyTorch semantics.
    pub(crate) fn reference(s: &ConvShape, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
        if s.is_transposed() {
            return reference_transposed(s, x, w, b);
        }
        let (oh, ow, cg, kg) = (s.oh() as i64, s.ow() as i64, s.cg() as i64, s.kg() as i64);
        let (c, h, wd, k, r, sz) = (s.c as i64, s.h as i64, s.w as i64, s.k as i64, s.r as i64, s.s as i64);
        let mut y = vec![0f64; s.y_len() as usize];
        for n in 0..s.n as i64 {
            for kk in 0..k {
                let g = kk / kg;
                for i in 0..oh {
                    for j in 0..ow {
                        let mut acc = b.map_or(0.0, |b| b[kk as usize] as f64);
                        for cc in 0..cg {
                            for rr in 0..r {
                                for ss in 0..sz {
                                    let ih = i * s.stride.0 as i64 - s.pad.0 as i64 + rr * s.dilation.0 as i64;
                                    let iw = j * s.stride.1 as i64 - s.pad.1 as i64 + ss * s.dilation.1 as i64;
                                    let xv = if ih >= 0 && ih < h && iw >= 0 && iw < wd {
                                        x[(((n * c + g * cg + cc) * h + ih) * wd + iw) as usize] as f64
                                    } else {
                                        0.0
                                    };
                                    acc += xv * w[(((kk * cg + cc) * r + rr) * sz + ss) as usize] as f64;
                                }
                            }
                        }
                        y[(((n * k + kk) * oh + i) * ow + j) as usize] = acc;
                    }
                }
            }
        }
        y
    }

    /// The transposed convolution as PyTorch defines it: each input element scatters its
    /// products into the outputs its taps reach (NCHW).
    fn reference_transposed(s: &ConvShape, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
        let (oh, ow, cg, kg) = (s.oh() as i64, s.ow() as i64, s.cg() as i64, s.kg() as i64);
        let (c, h, wd, k, r, sz) = (s.c as i64, s.h as i64, s.w as i64, s.k as i64, s.r as i64, s.s as i64);
        let mut y = vec![0f64; s.y_len() as usize];
        for n in 0..s.n as i64 {
            for kk in 0..k {
                let bv = b.map_or(0.0, |b| b[kk as usize] as f64);
                for p in 0..oh * ow {
                    y[((n * k + kk) * oh * ow + p) as usize] = bv;
                }
            }
            for cc in 0..c {
                let g = cc / cg;
                for i in 0..h {
                    for j in 0..wd {
                        let xv = x[(((n * c + cc) * h + i) * wd + j) as usize] as f64;
                        for kq in 0..kg {
                            let kk = g * kg + kq;
                            for rr in 0..r {
                                for ss in 0..sz {
                                    let o = i * s.stride.0 as i64 - s.pad.0 as i64 + rr * s.dilation.0 as i64;
                                    let q = j * s.stride.1 as i64 - s.pad.1 as i64 + ss * s.dilation.1 as i64;
                                    if o >= 0 && o < oh && q >= 0 && q < ow {
                                        let wv = w[(((cc * kg + kq) * r + rr) * sz + ss) as usize] as f64;
                                        y[(((n * k + kk) * oh + o) * ow + q) as usize] += xv * wv;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        y
    }

    /// `reference` for either layout: an NHWC problem's x is read, and its y written, in
    /// NHWC order.
    fn reference_in_layout(s: &ConvShape, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
        if s.layout == Layout::Nchw {
            return reference(s, x, w, b);
        }
        let (n, c, h, wd) = (s.n as usize, s.c as usize, s.h as usize, s.w as usize);
        let mut xc = vec![0f32; x.len()];
        for i in 0..n * h * wd {
            for ch in 0..c {
                xc[((i / (h * wd)) * c + ch) * h * wd + i % (h * wd)] = x[i * c + ch];
            }
        }
        let yc = reference(&s.with_layout(Layout::Nchw), &xc, w, b);
        let (k, p) = (s.k as usize, (s.oh() * s.ow()) as usize);
        let mut y = vec![0f64; yc.len()];
        for i in 0..n * p {
            for ch in 0..k {
                y[i * k + ch] = yc[((i / p) * k + ch) * p + i % p];
            }
        }
        y
    }

    pub(crate) fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
        let scale = want.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
        got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs() / scale).fold(0.0, f64::max)
    }

    #[test]
    fn swept_variants_compute_the_reference_on_a_small_shape() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        // Strided, dilated and grouped; a variant that cannot compute it (Winograd: 3x3 at
        // stride 1 only) runs the second shape instead.
        let shapes = [
            ConvShape::new([2, 6, 9, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 2, Some(4)).unwrap(),
            ConvShape::new([2, 6, 9, 7], [4, 3, 3, 3], (1, 1), Padding::Explicit(1, 2), (1, 1), 2, Some(4)).unwrap(),
            // Transposed (the tconv family): stride phases, dilation, output padding, groups.
            ConvShape::new_transposed([2, 6, 5, 4], [6, 2, 3, 2], (2, 3), (1, 0), (1, 2), (1, 2), 2, Some(4)).unwrap(),
            // One group (the stem family), strided and dilated.
            ConvShape::new([2, 3, 9, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 1, Some(4)).unwrap(),
            // Depthwise in NHWC (the dwise family), strided and dilated.
            ConvShape::new([2, 8, 9, 7], [8, 1, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 8, Some(8)).unwrap().with_layout(Layout::Nhwc),
        ];
        for v in swept_variants().into_iter().filter(|v| v.fits(&e.caps)) {
            let s = shapes.iter().find(|s| v.computes(s)).unwrap();
            let x = random_data(s.x_len() as usize, 1);
            let w = random_data(s.w_len() as usize, 2);
            let b = random_data(s.k as usize, 3);
            let want = reference_in_layout(s, &x, &w, Some(&b));
            let mut got = vec![0f32; s.y_len() as usize];
            conv2d(&e, s, &v, &x, &w, Some(&b), None, &mut got, true).unwrap();
            let err = max_rel_err(&got, &want);
            assert!(err <= 1e-5, "{v} on {}: max relative error {err}", s.label());
        }
    }

    /// Every variant that computes a pixel-shuffled problem stores each output where
    /// `y_store_index` puts it (a strided grouped shape, and 3x3 at stride 1 for Winograd).
    #[test]
    fn swept_variants_store_pixel_shuffled_outputs() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        let shapes = [
            ConvShape::new([2, 6, 9, 7], [8, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 2, Some(8)).unwrap(),
            ConvShape::new([2, 6, 9, 7], [18, 3, 3, 3], (1, 1), Padding::Explicit(1, 2), (1, 1), 2, Some(18)).unwrap(),
            // Winograd's tiles (2, 4 and 6 wide) past a ragged 10 x 11 image, shuffled by 2.
            ConvShape::new([1, 8, 10, 11], [16, 8, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, Some(16)).unwrap(),
            ConvShape::new([2, 8, 9, 7], [8, 1, 3, 3], (1, 2), Padding::Explicit(1, 1), (1, 1), 8, Some(8)).unwrap().with_layout(Layout::Nhwc),
        ];
        let shapes = [
            shapes[0].with_pixel_shuffle(2).unwrap(),
            shapes[1].with_pixel_shuffle(3).unwrap(),
            shapes[2].with_pixel_shuffle(2).unwrap(),
            shapes[3].with_pixel_shuffle(2).unwrap(),
        ];
        let mut ran = 0;
        // Each variant on the first shape it computes; Winograd's also on its own shapes.
        let runs = swept_variants().into_iter().filter(|v| v.fits(&e.caps)).flat_map(|v| {
            let first = shapes.iter().position(|s| v.computes(s));
            let winograd = matches!(v, Variant::Wgemm(_));
            (0..shapes.len())
                .filter(move |&i| first == Some(i) || (winograd && i >= 2 && v.computes(&shapes[i])))
                .map(move |i| (v, i))
        });
        for (v, i) in runs {
            let s = &shapes[i];
            let x = random_data(s.x_len() as usize, 1);
            let w = random_data(s.w_len() as usize, 2);
            let b = random_data(s.k as usize, 3);
            let conv = reference_in_layout(s, &x, &w, Some(&b));
            let mut want = vec![f64::NAN; conv.len()];
            conv.iter().enumerate().for_each(|(i, v)| want[s.y_store_index(i as u64) as usize] = *v);
            // Poisoned finite: max_rel_err would pass over a NaN left unwritten.
            let mut got = vec![1e30f32; s.y_len() as usize];
            conv2d(&e, s, &v, &x, &w, Some(&b), None, &mut got, true).unwrap();
            let err = max_rel_err(&got, &want);
            assert!(err <= 1e-5, "{v} on {}: max relative error {err}", s.label());
            ran += 1;
        }
        assert!(ran > 10);
    }

    #[test]
    fn gpu_comparison_sees_right_wrong_and_unwritten_outputs() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        let s = ConvShape::new([2, 5, 9, 8], [6, 5, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
            .unwrap();
        let t = DeviceTensors::upload(&e, &s, &random_data(s.x_len() as usize, 1), &random_data(s.w_len() as usize, 2), None, None)
            .unwrap();
        let looped: Variant = "direct_wg64x1_u0_k1w1".parse().unwrap();
        let gemm: Variant = "gemm_b32x32x8_t4x4".parse().unwrap();
        t.poison(&e).unwrap();
        t.run(&e, &e.compile(&looped, &s).unwrap()).unwrap();
        let reference = t.copy_y(&e).unwrap();

        t.poison(&e).unwrap();
        t.run(&e, &e.compile(&gemm, &s).unwrap()).unwrap();
        let c = t.compare_y(&e, &reference).unwrap();
        assert_eq!(c.bad, 0);
        assert!(c.max_want > 0.0 && c.relative_error() < 1e-5, "{c:?}");

        // Finite but wrong: the same kernel on other inputs.
        let other = DeviceTensors::upload(&e, &s, &random_data(s.x_len() as usize, 3), &random_data(s.w_len() as usize, 2), None, None)
            .unwrap();
        other.run(&e, &e.compile(&looped, &s).unwrap()).unwrap();
        let c = other.compare_y(&e, &reference).unwrap();
        assert!(c.bad == 0 && c.relative_error() > 0.1, "{c:?}");

        // Poisoned and never written: every element is NaN where the reference is finite.
        t.poison(&e).unwrap();
        let c = t.compare_y(&e, &reference).unwrap();
        assert_eq!(c.bad as u64, s.y_len());
    }

    /// Runs `pass` over x and w and reads back the scales' words.
    fn max_words(e: &Engine, x: &[f32], w: &[f32], pass: impl Fn(&mut wgpu::CommandEncoder, &PooledBuffer, &PooledBuffer, &PooledBuffer)) -> [u32; 4] {
        let (xb, wb) = (upload_slice(e, OUTPUT, x, None).unwrap(), upload_slice(e, OUTPUT, w, None).unwrap());
        let scales = upload_slice(e, OUTPUT, &[7.0f32; 4], None).unwrap();
        let mut enc = e.device.create_command_encoder(&Default::default());
        pass(&mut enc, &xb, &wb, &scales);
        e.queue.submit([enc.finish()]);
        let mut got = [0f32; 4];
        transfer::download_all(e, &scales, &mut got).unwrap();
        got.map(f32::to_bits)
    }

    #[test]
    fn max_passes_find_the_largest_finite_magnitude_anywhere() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        let checker = e.checker().unwrap();
        // Lengths around the vec4 view's edge and past four vec4s per invocation of the
        // pass (its unrolled rounds); the largest value at the first, a middle and the last
        // (tail) element, beside Inf and NaN that must not count.
        for len in [1usize, 3, 4, 5, 7, 8, 1021, 4099, (1 << 22) + 4 * 1000 + 3] {
            for at in [0, len / 2, len - 1] {
                let mut x = random_data(len, len as u64);
                x[len / 3] = f32::INFINITY;
                x[(2 * len) / 3] = f32::NAN;
                x[at] = -1.5e20;
                let mut w = random_data(len + 2, 9);
                w.iter_mut().for_each(|v| *v *= 1e-3);
                w[len + 1] = f32::NEG_INFINITY;
                let want_w = w.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
                let both = max_words(&e, &x, &w, |enc, xb, wb, sc| checker.maxabs(&e.device, enc, xb.view(), wb.view(), sc, None));
                assert_eq!(both[..2], [1.5e20f32.to_bits(), want_w.to_bits()], "len {len}, at {at}");
            }
        }
    }

    #[test]
    fn uploads_fold_the_largest_finite_magnitude_on_every_copy_path() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        // Written now (under 1 MB), one piece per copy thread (under 16 MB), 4 MiB chunks.
        for len in [5usize, 1000, 1 << 20, (5 << 20) + 3] {
            for at in [0, len / 2, len - 1] {
                let mut x = random_data(len, len as u64);
                x[len / 3] = f32::INFINITY;
                x[(2 * len) / 3] = f32::NAN;
                x[at] = -3.5e7;
                let t = DeviceArray::upload(&e, &x, [1, 1, 1, len]).unwrap();
                assert_eq!(t.known_max(), Some(3.5e7f32.to_bits()), "len {len}, at {at}");
                assert_eq!(t.known_max(), Some(finite_abs_max(&x)));
                t.forget_max();
                assert_eq!(t.known_max(), None);
            }
        }
        let halves = convert::<u16>(&[1.0, -3.0]);
        assert_eq!(DeviceArray::upload(&e, &halves, [1, 1, 1, 2]).unwrap().known_max(), None, "float16 tensors are never scaled");
    }
}
