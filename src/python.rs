//! The Python module `convtune._convtune`. Errors become Python exceptions here and only here.

//!
//! It is a client of the crate's public API like any other (`crate::support` holds the
//! few hidden pieces only Python needs: memory checks before copying numpy arrays, phase
//! timings, test hooks).

use crate::support::{self, Parts, Phases};
use crate::{
    Activation, AdapterDesc, Conv2d, Conv2dBuilder, DType, Element as Elem, Engine, Error, Layout, Padding, PaddingMode, Plan,
    Precision, Progress, Report, Residual, Tensor, TuneOptions, Weights,
};
use numpy::{
    npyffi, Element, PyArray4, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray4,
    PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::ffi::CString;
use std::path::PathBuf;

create_exception!(_convtune, ConvtuneError, PyRuntimeError, "A GPU-side failure in convtune.");
create_exception!(_convtune, NoAdapterError, ConvtuneError, "No usable GPU adapter or Vulkan loader.");
create_exception!(_convtune, OutOfMemoryError, ConvtuneError, "The GPU or the host has not enough memory for this call.");
create_exception!(_convtune, DeviceLostError, ConvtuneError, "The GPU device was lost; the next call opens a new one.");
create_exception!(_convtune, ShaderError, ConvtuneError, "A generated shader failed to compile.");
create_exception!(_convtune, InternalError, ConvtuneError, "A failure inside convtune or a dependency (a Rust panic): the call failed, the next one works.");
create_exception!(_convtune, ConvtuneWarning, PyUserWarning, "A recoverable problem: an unreadable tuning cache, a failed tuning run.");

/// The one place where a convtune error becomes a Python exception.
fn to_pyerr(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::InvalidArgument(_) => PyValueError::new_err(msg),
        Error::InvalidType(_) => PyTypeError::new_err(msg),
        Error::NoAdapter(_) => NoAdapterError::new_err(msg),
        Error::OutOfMemory(_) | Error::MemoryLimit(_) => OutOfMemoryError::new_err(msg),
        Error::DeviceLost(_) => DeviceLostError::new_err(msg),
        Error::Shader { .. } => ShaderError::new_err(msg),
        Error::Internal(_) => InternalError::new_err(msg),
        Error::Gpu(_) | Error::Cache(_) | Error::Cancelled(_) | Error::Unsupported(_) | Error::Forked(_) => {
            ConvtuneError::new_err(msg)
        }
    }
}

thread_local! {
    /// The problem of this thread's call in progress, once its arguments are checked: named
    /// by the error a panic becomes.
    static PROBLEM: std::cell::Cell<Option<Conv2d>> = const { std::cell::Cell::new(None) };
}

/// Kept as it is: its label is worked out only if a panic needs it.
fn note_problem(problem: &Conv2d) {
    PROBLEM.with(|p| p.set(Some(*problem)));
}

/// Runs the body of the Python function `name`, turning a Rust panic in it (convtune's or a
/// dependency's, on this thread) into `convtune.InternalError` naming the call and its
/// problem: pyo3 would raise `PanicException`, a `BaseException` that `except Exception`
/// lets through. Shared state a panic leaves behind is either recovered (poisoned locks are
/// taken over, buffers the pool cannot vouch for are freed) or rebuilt, so the next call works.
fn guarded<T>(name: &str, body: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    PROBLEM.with(|p| p.take());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    let problem = PROBLEM.with(|p| p.take());
    r.unwrap_or_else(|payload| {
        let what = crate::support::panic_message(payload.as_ref());
        let on = problem.map(|p| format!(" on {}", p.label())).unwrap_or_default();
        Err(to_pyerr(Error::Internal(format!("convtune.{name}{on} panicked: {what}"))))
    })
}

trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}

#[derive(FromPyObject)]
enum PadArg {
    Mode(String),
    Pair((i64, i64)),
}

fn padding(p: PadArg) -> Result<Padding, Error> {
    match p {
        PadArg::Pair((h, w)) => Ok(Padding::Explicit(h, w)),
        PadArg::Mode(m) if m == "same" => Ok(Padding::Same),
        PadArg::Mode(m) if m == "valid" => Ok(Padding::Valid),
        PadArg::Mode(m) => Err(Error::invalid(format!(
            "padding must be an int, an (h, w) pair, 'same' or 'valid'; got {m:?}"
        ))),
    }
}

/// Arguments every shape-taking function shares, in the order the Python layer passes them;
/// `x_shape` in the layout's order.
#[allow(clippy::too_many_arguments)]
fn builder_of(
    x_shape: [usize; 4],
    w_shape: [usize; 4],
    stride: (i64, i64),
    pad: PadArg,
    dilation: (i64, i64),
    groups: i64,
    bias_len: Option<usize>,
    layout: Layout,
    dtype: DType,
    output_padding: Option<(i64, i64)>,
    pixel_shuffle: i64,
    padding_mode: Option<&str>,
) -> PyResult<Conv2dBuilder> {
    let b = Conv2d::builder(x_shape, w_shape);
    // `None`: a plain convolution; a pair: a transposed one with that output padding.
    let b = match output_padding {
        Some(op) => b.transposed(op),
        None => b,
    };
    Ok(b
        .stride(stride)
        .padding(padding(pad).py_err()?)
        .dilation(dilation)
        .groups(groups)
        .bias_len(bias_len)
        .layout(layout)
        .dtype(dtype)
        .pixel_shuffle(pixel_shuffle)
        .padding_mode(padding_mode.map_or(Ok(PaddingMode::Zeros), PaddingMode::parse).py_err()?))
}

/// The epilogue as the Python layer normalises it: (alpha1, alpha2, residual, activation,
/// negative_slope, clamp_min, clamp_max).
#[derive(FromPyObject)]
struct EpilogueArg(f32, f32, bool, Option<String>, f32, f32, f32);

impl EpilogueArg {
    fn apply(self, b: Conv2dBuilder) -> PyResult<Conv2dBuilder> {
        let EpilogueArg(alpha1, alpha2, residual, act, slope, lo, hi) = self;
        let act = Activation::parse(act.as_deref(), slope, (lo, hi)).py_err()?;
        let b = b.alpha1(alpha1).activation(act);
        Ok(if residual { b.residual(alpha2) } else { b.alpha2(alpha2) })
    }
}

/// The problem `b` describes with the epilogue, if one was given: shapes and parameters
/// are checked first, then the epilogue, as always.
fn problem_of(b: Conv2dBuilder, precision: Precision, epilogue: Option<EpilogueArg>) -> PyResult<Conv2d> {
    let b = b.precision(precision);
    let plain = b.clone().build().py_err()?;
    let problem = match epilogue {
        Some(e) => e.apply(b)?.build().py_err()?,
        None => plain,
    };
    note_problem(&problem);
    Ok(problem)
}

/// The shape arguments the Python layer passes as one normalised tuple: (x_shape, w_shape,
/// stride, (padding, padding mode), dilation, groups, bias_len, epilogue or None, layout, dtype,
/// output padding or None, pixel shuffle), x_shape in the layout's order; an output padding makes
/// the problem a transposed convolution; a pixel shuffle of 1 is none.
#[derive(FromPyObject)]
struct Spec([usize; 4], [usize; 4], (i64, i64), (PadArg, String), (i64, i64), i64, Option<usize>, Option<EpilogueArg>, String, String, Option<(i64, i64)>, i64);

impl Spec {
    /// The problem, in `precision` (the functions that take none pass the default).
    fn problem(self, precision: Precision) -> PyResult<Conv2d> {
        let Spec(x, w, stride, (pad, mode), dilation, groups, bias_len, epilogue, layout, dtype, transposed, shuffle) = self;
        let layout = Layout::parse(&layout).py_err()?;
        let dtype = DType::parse(&dtype).py_err()?;
        let b = builder_of(x, w, stride, pad, dilation, groups, bias_len, layout, dtype, transposed, shuffle, Some(&mode))?;
        problem_of(b, precision, epilogue)
    }
}

/// The `layout` argument of the conv2d functions.
fn layout_of(layout: Option<&str>) -> PyResult<Layout> {
    layout.map_or(Ok(Layout::Nchw), |l| Layout::parse(l).py_err())
}

/// The residual `z` checked against the output's shape.
fn residual_dims(z: &[usize], problem: &Conv2d) -> PyResult<()> {
    let want = problem.y_dims();
    if z != want {
        return Err(PyValueError::new_err(format!(
            "z must have the output's shape (N, K, OH, OW), after any pixel_shuffle = {want:?}, got {z:?}"
        )));
    }
    Ok(())
}

fn engine() -> PyResult<Engine> {
    Engine::shared().py_err()
}

/// Shows the warnings a choice met as Python warnings (`convtune.ConvtuneWarning`).
fn emit_warnings(py: Python<'_>, warnings: &[String]) -> PyResult<()> {
    let category = py.get_type::<ConvtuneWarning>();
    for w in warnings {
        let msg = CString::new(w.replace('\0', " ")).unwrap_or_default();
        PyErr::warn(py, &category, &msg, 2)?;
    }
    Ok(())
}

/// Bridges the tuner's progress reports to an optional Python callable, holding the GIL only
/// for the call. Tuning runs with the GIL released, so this is also where Ctrl-C gets a
/// chance to stop it.
struct PyProgress {
    callback: Option<Py<PyAny>>,
    label: String,
    /// What the callback (or a signal handler) raised; re-raised once tuning has stopped.
    raised: Option<PyErr>,
}

impl PyProgress {
    fn new(callback: Option<Py<PyAny>>, problem: &Conv2d) -> Self {
        PyProgress { callback, label: problem.label(), raised: None }
    }

    fn report(&mut self, p: Progress<'_>) -> Result<(), Error> {
        Python::attach(|py| {
            py.check_signals()?;
            match &self.callback {
                Some(cb) => cb.call1(py, (p.done, p.total, p.candidate, self.label.as_str())).map(|_| ()),
                None => Ok(()),
            }
        })
        .map_err(|e| {
            self.raised = Some(e);
            Error::Cancelled("the progress callback raised".into())
        })
    }

    /// Turns a result into a Python one, re-raising the callback's own exception.
    fn finish<T>(self, r: Result<T, Error>) -> PyResult<T> {
        match (r, self.raised) {
            (Err(Error::Cancelled(_)), Some(e)) => Err(e),
            (r, _) => r.py_err(),
        }
    }
}

/// The variant a call runs: the one asked for, else what `CONVTUNE_TUNE` says (default rule,
/// cache, or a tuning run). The GIL is released while it works.
fn choose(
    py: Python<'_>,
    engine: &Engine,
    problem: &Conv2d,
    asked: Option<&str>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Plan> {
    // Most calls need no tuning run: they keep the GIL, as handing it to another thread and
    // back costs more than the choice (a tiny Tensor call from 8 threads on an H200:
    // 0.19 ms in this step against 0.004 ms from one thread).
    if let Some(plan) = engine.choose_now(problem, asked).py_err()? {
        emit_warnings(py, plan.warnings())?;
        return Ok(plan);
    }
    let mut bridge = PyProgress::new(progress, problem);
    let r = py.detach(|| engine.choose(problem, asked, &mut |p| bridge.report(p)));
    let plan = bridge.finish(r)?;
    emit_warnings(py, plan.warnings())?;
    Ok(plan)
}

fn dims4(dims: &[usize], what: &str) -> PyResult<[usize; 4]> {
    dims.try_into()
        .map_err(|_| PyValueError::new_err(format!("{what} must be 4-D, got {}-D", dims.len())))
}

fn not_contiguous(e: numpy::AsSliceError) -> PyErr {
    PyValueError::new_err(format!("{e}: arrays must be C-contiguous"))
}

/// A host element type numpy arrays come in: float32, or float16 as its bits (`u16`; the
/// Python layer passes float16 arrays viewed as uint16, and views results back).
trait HostElem: Elem + Element {
    fn of<'a, 'py>(d: &'a Data4<'py>) -> Option<&'a PyReadonlyArray4<'py, Self>>;
}

impl HostElem for f32 {
    fn of<'a, 'py>(d: &'a Data4<'py>) -> Option<&'a PyReadonlyArray4<'py, Self>> {
        match d {
            Data4::F32(a) => Some(a),
            Data4::F16(_) => None,
        }
    }
}

impl HostElem for u16 {
    fn of<'a, 'py>(d: &'a Data4<'py>) -> Option<&'a PyReadonlyArray4<'py, Self>> {
        match d {
            Data4::F16(a) => Some(a),
            Data4::F32(_) => None,
        }
    }
}

/// A 4-D array argument: float32, or float16 viewed as uint16.
#[derive(FromPyObject)]
enum Data4<'py> {
    F32(PyReadonlyArray4<'py, f32>),
    F16(PyReadonlyArray4<'py, u16>),
}

impl Data4<'_> {
    fn dtype(&self) -> DType {
        match self {
            Data4::F32(_) => DType::F32,
            Data4::F16(_) => DType::F16,
        }
    }
    fn dims(&self) -> &[usize] {
        match self {
            Data4::F32(a) => a.shape(),
            Data4::F16(a) => a.shape(),
        }
    }
}

/// `d` as an array of `T`, or a TypeError naming `what`.
fn typed<'a, 'py, T: HostElem>(d: &'a Data4<'py>, what: &str) -> PyResult<&'a PyReadonlyArray4<'py, T>> {
    T::of(d).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what} holds {} data but x holds {}: x, w and z must have the same dtype",
            d.dtype().name(),
            T::DTYPE.name()
        ))
    })
}

/// An array of `T` as Python sees it: float16 bits viewed as float16.
fn public<'py, T: HostElem>(a: Bound<'py, PyArray4<T>>) -> PyResult<Bound<'py, PyAny>> {
    match T::DTYPE {
        DType::F32 => Ok(a.into_any()),
        DType::F16 => a.call_method1("view", ("float16",)),
    }
}

/// A new, uninitialised array of `T`. numpy's own constructor in the `numpy` crate panics
/// when the allocation fails; this raises the MemoryError numpy set instead.
fn new_output<'py, T: Element>(py: Python<'py>, dims: [usize; 4]) -> PyResult<Bound<'py, PyArray4<T>>> {
    let mut shape = dims.map(|d| d as npyffi::npy_intp);
    // SAFETY: the arguments describe a fresh C-ordered array of `dims` elements of T that
    // numpy allocates itself; the descriptor reference is stolen by the call, as it expects.
    let ptr = unsafe {
        npyffi::PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            T::get_dtype(py).into_dtype_ptr(),
            4,
            shape.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a non-null result is a new reference to the 4-D array of T just made.
    unsafe { Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked()) }
}

/// The weights and the optional bias as slices (the Python layer made them C-contiguous).
fn weight_slices<'a, T: HostElem>(
    w: &'a PyReadonlyArray4<'_, T>,
    bias: &'a Option<PyReadonlyArray1<'_, f32>>,
) -> PyResult<(&'a [T], Option<&'a [f32]>)> {
    let ws = w.as_slice().map_err(not_contiguous)?;
    let bs = match bias {
        Some(b) => Some(b.as_slice().map_err(not_contiguous)?),
        None => None,
    };
    Ok((ws, bs))
}

#[pyfunction]
#[pyo3(signature = (x, w, bias, stride, padding, dilation, groups, variant=None, progress=None, precision=None, epilogue=None, z=None, layout=None, output_padding=None, pixel_shuffle=1, padding_mode=None))]
#[allow(clippy::too_many_arguments)]
fn conv2d<'py>(
    py: Python<'py>,
    x: Data4<'py>,
    w: Data4<'py>,
    bias: Option<PyReadonlyArray1<'py, f32>>,
    stride: (i64, i64),
    padding: PadArg,
    dilation: (i64, i64),
    groups: i64,
    variant: Option<&str>,
    progress: Option<Py<PyAny>>,
    precision: Option<&str>,
    epilogue: Option<EpilogueArg>,
    z: Option<Data4<'py>>,
    layout: Option<&str>,
    output_padding: Option<(i64, i64)>,
    pixel_shuffle: i64,
    padding_mode: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    guarded("conv2d", || {
        let args = (stride, padding, dilation, groups, variant, progress, precision, epilogue, layout, output_padding, pixel_shuffle, padding_mode);
        match x.dtype() {
            DType::F32 => conv2d_typed::<f32>(py, &x, &w, bias, z.as_ref(), args),
            DType::F16 => conv2d_typed::<u16>(py, &x, &w, bias, z.as_ref(), args),
        }
    })
}

/// conv2d's arguments other than the arrays (the last two: an output padding, for a
/// transposed convolution, and the pixel shuffle, 1 for none).
type CallArgs<'a> = ((i64, i64), PadArg, (i64, i64), i64, Option<&'a str>, Option<Py<PyAny>>, Option<&'a str>, Option<EpilogueArg>, Option<&'a str>, Option<(i64, i64)>, i64, Option<&'a str>);

fn conv2d_typed<'py, T: HostElem>(
    py: Python<'py>,
    x: &Data4<'py>,
    w: &Data4<'py>,
    bias: Option<PyReadonlyArray1<'py, f32>>,
    z: Option<&Data4<'py>>,
    (stride, padding, dilation, groups, variant, progress, precision, epilogue, layout, output_padding, pixel_shuffle, padding_mode): CallArgs<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut ph = Phases::start();
    let (x, w) = (typed::<T>(x, "x")?, typed::<T>(w, "w")?);
    let z = z.map(|z| typed::<T>(z, "z")).transpose()?;
    let precision = Precision::resolve(precision).py_err()?;
    let layout = layout_of(layout)?;
    let b = builder_of(
        dims4(x.shape(), "x")?,
        dims4(w.shape(), "w")?,
        stride,
        padding,
        dilation,
        groups,
        bias.as_ref().map(|b| b.len()),
        layout,
        T::DTYPE,
        output_padding,
        pixel_shuffle,
        padding_mode,
    )?;
    let problem = problem_of(b, precision, epilogue)?;
    if let Some(z) = &z {
        residual_dims(z.shape(), &problem)?;
    }
    let zs = z.as_ref().map(|z| z.as_slice().map_err(not_contiguous)).transpose()?;
    if zs.is_some() != problem.has_residual() {
        return Err(PyValueError::new_err("z and the epilogue's residual flag disagree"));
    }
    let xs = x.as_slice().map_err(not_contiguous)?;
    let (ws, bs) = weight_slices(&w, &bias)?;
    let eng = engine()?;
    ph.mark("native_args");
    let plan = choose(py, &eng, &problem, variant, progress)?;
    ph.mark("choose");
    // Every element is written before the array is returned (the kernels write all
    // outputs; an error drops the array).
    let out = new_output::<T>(py, problem.y_dims())?;
    let dst = unsafe { out.as_slice_mut() }.map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    ph.mark("output_alloc");
    let ph = py
        .detach(|| eng.conv2d_timed(&plan, xs, ws, bs, zs, dst, &mut ph).map(|_| ph))
        .py_err()?;
    ph.finish();
    public(out)
}

fn adapter_dict<'py>(py: Python<'py>, d: &AdapterDesc) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("index", d.index)?;
    out.set_item("name", &d.name)?;
    out.set_item("backend", &d.backend)?;
    out.set_item("type", &d.device_type)?;
    out.set_item("driver", &d.driver)?;
    out.set_item("driver_info", &d.driver_info)?;
    out.set_item("vendor_id", d.vendor)?;
    out.set_item("device_id", d.device)?;
    Ok(out)
}

/// Every adapter wgpu sees, best first (the order `CONVTUNE_ADAPTER` indexes).
#[pyfunction]
fn devices(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    guarded("devices", || {
        let list = py.detach(crate::adapters).py_err()?;
        list.iter().map(|d| adapter_dict(py, d)).collect()
    })
}

/// The adapter convtune uses, with the limits and features that matter for conv kernels.
#[pyfunction]
fn adapter_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    guarded("adapter_info", || {
        let eng = py.detach(Engine::shared).py_err()?;
        let d = adapter_dict(py, eng.adapter_desc())?;
        let l = eng.limits();
        let limits = PyDict::new(py);
        limits.set_item("max_compute_invocations_per_workgroup", l.max_compute_invocations_per_workgroup)?;
        limits.set_item("max_compute_workgroup_size_x", l.max_compute_workgroup_size_x)?;
        limits.set_item("max_compute_workgroup_size_y", l.max_compute_workgroup_size_y)?;
        limits.set_item("max_compute_workgroup_storage_size", l.max_compute_workgroup_storage_size)?;
        limits.set_item("max_compute_workgroups_per_dimension", l.max_compute_workgroups_per_dimension)?;
        limits.set_item("max_storage_buffer_binding_size", l.max_storage_buffer_binding_size)?;
        limits.set_item("max_buffer_size", l.max_buffer_size)?;
        limits.set_item("min_storage_buffer_offset_alignment", l.min_storage_buffer_offset_alignment)?;
        d.set_item("limits", limits)?;
        let f = eng.adapter().features();
        let features = PyDict::new(py);
        features.set_item("shader_f16", f.contains(wgpu::Features::SHADER_F16))?;
        features.set_item("cooperative_matrix", f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX))?;
        features.set_item("tensor_cores", eng.tensor_cores_missing().is_none())?;
        features.set_item("subgroup", f.contains(wgpu::Features::SUBGROUP))?;
        features.set_item("timestamp_query", f.contains(wgpu::Features::TIMESTAMP_QUERY))?;
        features.set_item(
            "timestamp_query_inside_passes",
            f.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
        )?;
        d.set_item("features", features)?;
        d.set_item("loader_note", eng.loader_note())?;
        d.set_item("device_heap_bytes", eng.device_heap_bytes())?;
        d.set_item("direct_inputs", eng.direct_inputs())?;
        Ok(d)
    })
}

/// The kernel families `CONVTUNE_FAMILIES` allows now and the ones it leaves out.
#[pyfunction]
fn families() -> PyResult<(Vec<&'static str>, Vec<&'static str>)> {
    guarded("families", || {
        crate::families().py_err()
    })
}

/// Every variant name the generator can emit.
#[pyfunction]
fn variant_space() -> Vec<String> {
    crate::variant_names()
}

/// The knobs of a variant, by name.
#[pyfunction]
fn variant_knobs<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    guarded("variant_knobs", || {
        knobs_dict(py, crate::variant_knobs(name).py_err()?)
    })
}

/// The untuned choice for this shape, within the families `CONVTUNE_FAMILIES` allows.
#[pyfunction]
#[pyo3(signature = (spec, precision=None))]
fn default_variant(
    py: Python<'_>,
    spec: Spec,
    precision: Option<&str>,
) -> PyResult<String> {
    guarded("default_variant", || {
        let precision = Precision::resolve(precision).py_err()?;
        let problem = spec.problem(precision)?;
        crate::families().py_err()?;
        let eng = py.detach(Engine::shared).py_err()?;
        eng.default_variant(&problem).py_err()
    })
}

/// The WGSL source convtune generates for `variant` on this shape.
#[pyfunction]
#[pyo3(signature = (variant, spec))]
fn wgsl(
    variant: &str,
    spec: Spec,
) -> PyResult<String> {
    guarded("wgsl", || {
        spec.problem(Precision::default())?.wgsl(variant).py_err()
    })
}

/// GPU seconds of `reps` runs of a variant on random data (timestamp queries when available).
#[pyfunction]
#[pyo3(signature = (variant, spec, reps=10, warmup=2, precision=None))]
fn time_variant(
    py: Python<'_>,
    variant: Option<&str>,
    spec: Spec,
    reps: u32,
    warmup: u32,
    precision: Option<&str>,
) -> PyResult<(String, Vec<f64>)> {
    guarded("time_variant", || {
        let precision = Precision::resolve(precision).py_err()?;
        let problem = spec.problem(precision)?;
        let eng = py.detach(Engine::shared).py_err()?;
        let (host, device) = support::whole_problem_footprint(&eng, &problem).py_err()?;
        support::check_memory(&eng, "time_variant", host, device).py_err()?;
        let plan = choose(py, &eng, &problem, variant, None)?;
        let times = py.detach(|| eng.time(&plan, reps, warmup)).py_err()?;
        Ok((plan.variant(), times))
    })
}

fn knobs_dict<'py>(py: Python<'py>, (family, knobs): (&str, Vec<(&str, u32)>)) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("family", family)?;
    for (k, val) in knobs {
        d.set_item(k, val)?;
    }
    Ok(d)
}

fn report_dict<'py>(py: Python<'py>, r: &Report, source: &str) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", r.shape())?;
    d.set_item("precision", r.precision().as_str())?;
    d.set_item("winner", r.winner())?;
    d.set_item("default", r.default_variant())?;
    d.set_item("reference", r.reference())?;
    d.set_item("default_ms", r.default_ms())?;
    d.set_item("tuned_ms", r.tuned_ms())?;
    d.set_item("speedup", r.speedup())?;
    d.set_item("tuning_s", r.tuning_s())?;
    match &r.phases() {
        Some(p) => {
            let pd = PyDict::new(py);
            pd.set_item("setup", p.setup_s)?;
            pd.set_item("compile", p.compile_s)?;
            pd.set_item("validate", p.validate_s)?;
            pd.set_item("timing", p.timing_s)?;
            pd.set_item("finish", p.finish_s)?;
            pd.set_item("other", p.other_s)?;
            d.set_item("phases", pd)?;
        }
        None => d.set_item("phases", py.None())?,
    }
    d.set_item("budget_s", r.budget_s())?;
    d.set_item("tuned_at", r.tuned_at())?;
    d.set_item("adapter", r.adapter())?;
    d.set_item("families", r.families())?;
    d.set_item("source", source)?;
    let all = r.candidates();
    let mut candidates = Vec::with_capacity(all.len());
    for c in all {
        let cd = PyDict::new(py);
        cd.set_item("name", c.name())?;
        match c.knobs() {
            Some(k) => cd.set_item("knobs", knobs_dict(py, k)?)?,
            None => cd.set_item("knobs", PyDict::new(py))?,
        }
        cd.set_item("status", c.status())?;
        cd.set_item("median_ms", c.median_ms())?;
        cd.set_item("samples", c.samples_ms())?;
        cd.set_item("detail", c.detail())?;
        cd.set_item("compile_ms", c.compile_ms())?;
        cd.set_item("runoff_ms", c.runoff_ms())?;
        cd.set_item("at_s", c.at_s())?;
        cd.set_item("measure_ms", c.measure_ms())?;
        candidates.push(cd);
    }
    d.set_item("candidates", candidates)?;
    Ok(d)
}

/// Tunes one shape (or returns its cached report unless `force`); ignores `CONVTUNE_TUNE`.
#[pyfunction]
#[pyo3(signature = (spec, budget=None, force=false, progress=None, precision=None))]
fn tune<'py>(
    py: Python<'py>,
    spec: Spec,
    budget: Option<f64>,
    force: bool,
    progress: Option<Py<PyAny>>,
    precision: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    guarded("tune", || {
        let precision = Precision::resolve(precision).py_err()?;
        let problem = spec.problem(precision)?;
        let eng = py.detach(Engine::shared).py_err()?;
        let mut bridge = PyProgress::new(progress, &problem);
        let options = TuneOptions { budget, force };
        let r = py.detach(|| eng.tune(&problem, options, &mut |p| bridge.report(p)));
        let plan = bridge.finish(r)?;
        emit_warnings(py, plan.warnings())?;
        let report = plan.report().ok_or_else(|| ConvtuneError::new_err("tuning produced no report"))?;
        report_dict(py, &report, plan.source())
    })
}

/// What conv2d would run for this shape and why, with the generated WGSL.
#[pyfunction]
#[pyo3(signature = (spec, variant=None, progress=None, precision=None))]
fn explain<'py>(
    py: Python<'py>,
    spec: Spec,
    variant: Option<&str>,
    progress: Option<Py<PyAny>>,
    precision: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    guarded("explain", || {
        let precision = Precision::resolve(precision).py_err()?;
        let problem = spec.problem(precision)?;
        let mode = crate::tune_mode().py_err()?;
        let eng = py.detach(Engine::shared).py_err()?;
        let plan = choose(py, &eng, &problem, variant, progress)?;
        let d = PyDict::new(py);
        d.set_item("variant", plan.variant())?;
        d.set_item("family", plan.family())?;
        // The mode the call runs in: float16 data always runs as "high".
        d.set_item("precision", problem.precision().as_str())?;
        d.set_item("tensor_cores", eng.tensor_cores_missing().unwrap_or("available"))?;
        d.set_item("source", plan.source())?;
        d.set_item("mode", mode)?;
        d.set_item("shape", problem.label())?;
        d.set_item("knobs", knobs_dict(py, (plan.family(), plan.knobs()))?)?;
        d.set_item("wgsl", plan.wgsl().py_err()?)?;
        let (dispatches, chunks) = plan.dispatches().py_err()?;
        d.set_item("dispatches", dispatches)?;
        d.set_item("chunks", chunks)?;
        d.set_item("adapter", &eng.adapter_desc().name)?;
        d.set_item("families", plan.families().to_vec())?;
        d.set_item("excluded", plan.excluded_families())?;
        match plan.report() {
            Some(r) => d.set_item("report", report_dict(py, &r, plan.source())?)?,
            None => d.set_item("report", py.None())?,
        }
        Ok(d)
    })
}

/// Sets this process's tuning mode over CONVTUNE_TUNE (None: back to the variable).
#[pyfunction]
#[pyo3(signature = (mode=None))]
fn set_tuning(mode: Option<&str>) -> PyResult<()> {
    crate::set_tune_mode(mode).py_err()
}

/// The tuning mode calls run in now.
#[pyfunction]
fn tuning_mode() -> PyResult<&'static str> {
    crate::tune_mode().py_err()
}

fn tuning_done_dict<'py>(py: Python<'py>, d: &crate::TuningDone) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("problem", &d.key)?;
    match &d.outcome {
        Ok(winner) => {
            out.set_item("winner", winner)?;
            out.set_item("error", py.None())?;
        }
        Err(e) => {
            out.set_item("winner", py.None())?;
            out.set_item("error", e)?;
        }
    }
    out.set_item("seconds", d.seconds)?;
    Ok(out)
}

/// Blocks until background tuning has nothing queued or running; the problems finished
/// since the last wait_tuning that returned them. TimeoutError after `timeout` seconds.
#[pyfunction]
#[pyo3(signature = (timeout=None))]
fn wait_tuning<'py>(py: Python<'py>, timeout: Option<f64>) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let timeout = match timeout {
        Some(t) if !(0.0..=1e9).contains(&t) => {
            return Err(PyValueError::new_err(format!("timeout must be between 0 and 1e9 seconds, got {t}")))
        }
        t => t.map(std::time::Duration::from_secs_f64),
    };
    match py.detach(|| crate::wait_tuning(timeout)) {
        Some(done) => done.iter().map(|d| tuning_done_dict(py, d)).collect(),
        None => {
            let st = crate::tuning_status();
            Err(pyo3::exceptions::PyTimeoutError::new_err(format!(
                "background tuning still has {} problem(s) queued{} after {:.3} s",
                st.queued.len(),
                st.running.map(|r| format!(" and is tuning {r}")).unwrap_or_default(),
                timeout.unwrap_or_default().as_secs_f64()
            )))
        }
    }
}

/// What background tuning has queued, is tuning and has finished.
#[pyfunction]
fn tuning_status(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let st = crate::tuning_status();
    let d = PyDict::new(py);
    d.set_item("mode", crate::tune_mode().py_err()?)?;
    d.set_item("queued", st.queued)?;
    d.set_item("in_progress", st.running)?;
    let done = st.done.iter().map(|x| tuning_done_dict(py, x)).collect::<PyResult<Vec<_>>>()?;
    d.set_item("done", done)?;
    Ok(d)
}

/// At interpreter exit: drops queued background tuning and cancels the running problem.
#[pyfunction]
fn _stop_tuning(py: Python<'_>, grace: f64) {
    py.detach(|| crate::stop_tuning(std::time::Duration::from_secs_f64(grace.clamp(0.0, 60.0))))
}

/// The tuning cache file `CONVTUNE_CACHE_DIR` (or the user cache directory) names now.
#[pyfunction]
fn cache_path() -> Option<PathBuf> {
    crate::cache_path()
}

/// Runs a cache operation with the GIL released and shows the warnings it met.
fn with_warnings<T: Send>(
    py: Python<'_>,
    f: impl FnOnce(&mut Vec<String>) -> Result<T, Error> + Send,
) -> PyResult<T> {
    let mut warnings = Vec::new();
    let r = py.detach(|| f(&mut warnings));
    emit_warnings(py, &warnings)?;
    r.py_err()
}

/// Writes every cache entry (all adapters) to `path`; returns how many.
#[pyfunction]
fn cache_export(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    guarded("cache_export", || {
        with_warnings(py, |w| crate::cache_export(&path, w))
    })
}

/// Merges an exported file into the cache; returns how many entries it held.
#[pyfunction]
fn cache_import(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    guarded("cache_import", || {
        with_warnings(py, |w| crate::cache_import(&path, w))
    })
}

/// Deletes the cache file and forgets its entries.
#[pyfunction]
fn cache_clear(py: Python<'_>) -> PyResult<()> {
    guarded("cache_clear", || {
        with_warnings(py, |_| crate::cache_clear())
    })
}

/// Tests: forget what this process remembers of any cache file.
#[pyfunction]
fn _reset_tuning_state() {
    support::forget_cache_memory();
}

/// Tests: add a fast but wrong candidate to every tuning run.
/// Tests: the next `n`-th wait for the GPU in this process panics (0: none).
#[pyfunction]
fn _inject_panic(n: u32) {
    support::inject_panic(n);
}

#[pyfunction]
fn _inject_faulty_candidate(on: bool) {
    support::inject_faulty_candidate(on);
}

/// A float32 NCHW tensor resident on the GPU. `conv2d` takes it as `x` and then returns one,
/// so chained convolutions skip the host round trip. `.numpy()` copies it to the host.
#[pyclass(name = "Tensor", module = "convtune", frozen)]
struct PyTensor {
    inner: Tensor,
    /// How its axes are meant: conv2d reads it, and writes its output, in this layout.
    layout: Layout,
    /// Uploaded from an unbatched array (a batch of one without its batch axis, as PyTorch
    /// takes it): its shape and `numpy()` leave the batch axis out, and so do the outputs of
    /// the calls it is the x of.
    unbatched: bool,
}

#[pymethods]
impl PyTensor {
    #[getter]
    fn layout(&self) -> &'static str {
        self.layout.name()
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.visible_dims())
    }

    /// The 4-D shape the kernels see (a batch of one for an unbatched tensor).
    #[getter(_dims)]
    fn dims(&self) -> (usize, usize, usize, usize) {
        let d = self.inner.dims();
        (d[0], d[1], d[2], d[3])
    }

    #[getter]
    fn unbatched(&self) -> bool {
        self.unbatched
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.len() * self.inner.dtype().size() as usize
    }

    /// Copies the tensor into a new numpy array of its dtype.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        guarded("numpy", || {
            let out = match self.inner.dtype() {
                DType::F32 => self.read::<f32>(py),
                DType::F16 => self.read::<u16>(py),
            }?;
            if self.unbatched {
                out.get_item(0)
            } else {
                Ok(out)
            }
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "convtune.Tensor(shape=({}), layout={}, dtype={}, device={:?})",
            self.visible_dims().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
            self.layout.name(),
            self.inner.dtype().name(),
            self.inner.engine().adapter_desc().name
        )
    }
}

impl PyTensor {
    /// Its dims as Python sees them: without the batch axis where unbatched.
    fn visible_dims(&self) -> Vec<usize> {
        self.inner.dims()[usize::from(self.unbatched)..].to_vec()
    }

    fn read<'py, T: HostElem>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (host, device) = support::download_footprint(self.inner.len() as u64);
        support::check_memory(self.inner.engine(), "Tensor.numpy()", host, device).py_err()?;
        // Fully written by the read below, or dropped on error.
        let out = new_output::<T>(py, self.inner.dims())?;
        let dst = unsafe { out.as_slice_mut() }.map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        py.detach(|| self.inner.read(dst)).py_err()?;
        public(out)
    }
}

/// Uploads a C-contiguous float32 (or float16, viewed as uint16) 4-D array to the GPU.
#[pyfunction]
#[pyo3(signature = (x, layout=None, unbatched=false))]
fn to_device(py: Python<'_>, x: Data4<'_>, layout: Option<&str>, unbatched: bool) -> PyResult<PyTensor> {
    guarded("to_device", || {
        let layout = layout_of(layout)?;
        let dims = dims4(x.dims(), "x")?;
        let eng = engine()?;
        let inner = match x.dtype() {
            DType::F32 => upload_tensor::<f32>(py, &eng, &x, dims)?,
            DType::F16 => upload_tensor::<u16>(py, &eng, &x, dims)?,
        };
        Ok(PyTensor { inner, layout, unbatched: unbatched && dims[0] == 1 })
    })
}

fn upload_tensor<T: HostElem>(py: Python<'_>, eng: &Engine, x: &Data4<'_>, dims: [usize; 4]) -> PyResult<Tensor> {
    let xs = typed::<T>(x, "x")?.as_slice().map_err(not_contiguous)?;
    py.detach(|| eng.upload(xs, dims)).py_err()
}

#[pyfunction]
#[pyo3(signature = (x, w, bias, stride, padding, dilation, groups, variant=None, progress=None, precision=None, epilogue=None, z=None, z_tensor=None, layout=None, output_padding=None, pixel_shuffle=1, w_tensor=None, padding_mode=None))]
#[allow(clippy::too_many_arguments)]
fn conv2d_tensor(
    py: Python<'_>,
    x: &PyTensor,
    w: Option<Data4<'_>>,
    bias: Option<PyReadonlyArray1<'_, f32>>,
    stride: (i64, i64),
    padding: PadArg,
    dilation: (i64, i64),
    groups: i64,
    variant: Option<&str>,
    progress: Option<Py<PyAny>>,
    precision: Option<&str>,
    epilogue: Option<EpilogueArg>,
    z: Option<Data4<'_>>,
    z_tensor: Option<PyRef<'_, PyTensor>>,
    layout: Option<&str>,
    output_padding: Option<(i64, i64)>,
    pixel_shuffle: i64,
    w_tensor: Option<PyRef<'_, PyTensor>>,
    padding_mode: Option<&str>,
) -> PyResult<PyTensor> {
    guarded("conv2d_tensor", || {
        let args = (stride, padding, dilation, groups, variant, progress, precision, epilogue, layout, output_padding, pixel_shuffle, padding_mode);
        let w = match (&w, w_tensor.as_deref()) {
            (Some(a), None) => WeightsArg::Host(a),
            (None, Some(t)) => WeightsArg::Tensor(t),
            _ => return Err(PyValueError::new_err("w must be given once: as an array or as a Tensor")),
        };
        match x.inner.dtype() {
            DType::F32 => conv2d_tensor_typed::<f32>(py, x, w, bias, z.as_ref(), z_tensor, args),
            DType::F16 => conv2d_tensor_typed::<u16>(py, x, w, bias, z.as_ref(), z_tensor, args),
        }
    })
}

/// A Tensor call's weights as Python gave them.
#[derive(Clone, Copy)]
enum WeightsArg<'a, 'py> {
    Host(&'a Data4<'py>),
    Tensor(&'a PyTensor),
}

fn conv2d_tensor_typed<T: HostElem>(
    py: Python<'_>,
    x: &PyTensor,
    w: WeightsArg<'_, '_>,
    bias: Option<PyReadonlyArray1<'_, f32>>,
    z: Option<&Data4<'_>>,
    z_tensor: Option<PyRef<'_, PyTensor>>,
    (stride, padding, dilation, groups, variant, progress, precision, epilogue, layout, output_padding, pixel_shuffle, padding_mode): CallArgs<'_>,
) -> PyResult<PyTensor> {
    let mut ph = Phases::start();
    // w's dims and the weights the engine takes: a host array (of T) or the Tensor itself.
    let (w_dims, weights) = match w {
        WeightsArg::Host(a) => {
            let a = typed::<T>(a, "w")?;
            (a.shape().to_vec(), Weights::Host(a.as_slice().map_err(not_contiguous)?))
        }
        WeightsArg::Tensor(t) => (t.inner.dims().to_vec(), Weights::Tensor(&t.inner)),
    };
    let w_tensor = match w {
        WeightsArg::Tensor(t) => Some(t),
        WeightsArg::Host(_) => None,
    };
    let z = z.map(|z| typed::<T>(z, "z")).transpose()?;
    for (name, t) in [("w", w_tensor), ("z", z_tensor.as_deref())] {
        if let Some(t) = t.filter(|t| t.inner.dtype() != T::DTYPE) {
            return Err(PyTypeError::new_err(format!(
                "{name} is a {} Tensor but x is {}: x, w and z must have the same dtype",
                t.inner.dtype().name(),
                T::DTYPE.name()
            )));
        }
    }
    if w_tensor.is_some_and(|t| t.layout != Layout::Nchw) {
        return Err(PyValueError::new_err(
            "w is an NHWC Tensor: weights keep their (K, C/groups, R, S) order in every layout; upload them with to_device(w)",
        ));
    }
    let precision = Precision::resolve(precision).py_err()?;
    // A Tensor's own layout unless the call names one; naming another is an error.
    let layout = layout.map_or(Ok(x.layout), |l| Layout::parse(l).py_err())?;
    for (name, t) in [("x", Some(x)), ("z", z_tensor.as_deref())] {
        if let Some(t) = t.filter(|t| t.layout != layout) {
            return Err(PyValueError::new_err(format!(
                "{name} is an {} Tensor but the call's layout is {}",
                t.layout.name(),
                layout.name()
            )));
        }
    }
    let b = builder_of(
        x.inner.dims(),
        dims4(&w_dims, "w")?,
        stride,
        padding,
        dilation,
        groups,
        bias.as_ref().map(|b| b.len()),
        layout,
        T::DTYPE,
        output_padding,
        pixel_shuffle,
        padding_mode,
    )?;
    let problem = problem_of(b, precision, epilogue)?;
    let bs = bias.as_ref().map(|b| b.as_slice().map_err(not_contiguous)).transpose()?;
    let eng = engine()?;
    let lost = |t: &PyTensor| !t.inner.engine().same_as(&eng);
    if lost(x) || z_tensor.as_deref().is_some_and(lost) || w_tensor.is_some_and(lost) {
        return Err(DeviceLostError::new_err(
            "this Tensor lives on a GPU device that was lost; upload it again with to_device()",
        ));
    }
    let residual = match (&z, &z_tensor) {
        (Some(z), None) => {
            residual_dims(z.shape(), &problem)?;
            Some(Residual::Host(z.as_slice().map_err(not_contiguous)?))
        }
        (None, Some(t)) => {
            residual_dims(&t.inner.dims(), &problem)?;
            Some(Residual::Tensor(&t.inner))
        }
        (None, None) => None,
        (Some(_), Some(_)) => return Err(PyValueError::new_err("z given twice")),
    };
    if residual.is_some() != problem.has_residual() {
        return Err(PyValueError::new_err("z and the epilogue's residual flag disagree"));
    }
    ph.mark("native_args");
    let plan = choose(py, &eng, &problem, variant, progress)?;
    ph.mark("choose");
    let inner = py.detach(|| eng.conv2d_tensor_timed(&plan, &x.inner, weights, bs, residual, &mut ph)).py_err()?;
    ph.finish();
    Ok(PyTensor { inner, layout, unbatched: x.unbatched })
}

/// Waits until every queued GPU call has finished (Tensor calls return with their kernel
/// queued). Errors of those calls surface here.
#[pyfunction]
fn synchronize(py: Python<'_>) -> PyResult<()> {
    guarded("synchronize", || {
        let eng = py.detach(Engine::shared).py_err()?;
        py.detach(|| eng.synchronize()).py_err()
    })
}

/// GPU memory held by convtune's buffer pool: bytes in use, bytes kept for reuse, how many
/// buffers were created since the device was opened, and the most device-local bytes in use
/// at once since the last reset (`reset_peak=True` starts a new measurement after reading).
#[pyfunction]
#[pyo3(signature = (reset_peak=false))]
fn memory_stats(py: Python<'_>, reset_peak: bool) -> PyResult<Bound<'_, PyDict>> {
    guarded("memory_stats", || {
        let eng = py.detach(Engine::shared).py_err()?;
        let s = eng.memory_stats();
        if reset_peak {
            eng.reset_peak_memory();
        }
        let d = PyDict::new(py);
        d.set_item("live_bytes", s.live)?;
        d.set_item("idle_bytes", s.idle)?;
        d.set_item("allocations", s.allocations)?;
        d.set_item("peak_device_bytes", s.peak_device)?;
        let k = eng.kernel_cache_stats();
        d.set_item("kernels_cached", k.entries)?;
        d.set_item("kernel_cache_limit", k.limit)?;
        d.set_item("kernels_per_layer", k.per_layer)?;
        d.set_item("kernel_evictions", k.evictions)?;
        d.set_item("generic_kernels", eng.generic_kernels())?;
        Ok(d)
    })
}

/// The host and GPU bytes a conv2d needs, by purpose, worked out from the shapes alone (the
/// shape is validated first). `x_on_device`: `x` is a Tensor and the result stays on the GPU.
#[pyfunction]
#[pyo3(signature = (spec, x_on_device))]
fn conv2d_footprint(py: Python<'_>, spec: Spec, x_on_device: bool) -> PyResult<(Parts, Parts)> {
    guarded("conv2d_footprint", || {
        let problem = spec.problem(Precision::default())?;
        let eng = py.detach(Engine::shared).py_err()?;
        support::conv2d_footprint(&eng, &problem, x_on_device).py_err()
    })
}

/// The host and GPU bytes `to_device` needs for an array of this shape.
#[pyfunction]
fn upload_footprint(py: Python<'_>, shape: Vec<usize>) -> PyResult<(Parts, Parts)> {
    guarded("upload_footprint", || {
        let elems = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        let elems = elems.ok_or_else(|| PyValueError::new_err(format!("shape {shape:?} has too many elements")))?;
        let eng = py.detach(Engine::shared).py_err()?;
        support::upload_footprint(&eng, elems).py_err()
    })
}

/// Raises OutOfMemoryError, naming the bytes and the limit, when `host` or `device` (bytes
/// by purpose) need more memory than the host or the GPU has.
#[pyfunction]
fn check_memory(py: Python<'_>, what: &str, host: Parts, device: Parts) -> PyResult<()> {
    guarded("check_memory", || {
        let eng = py.detach(Engine::shared).py_err()?;
        support::check_memory(&eng, what, host, device).py_err()
    })
}

/// The phases of this thread's last host-array conv2d, in seconds, in the order they ran,
/// and the process's minor page faults during it (`None` where they cannot be read).
#[pyfunction]
fn _last_call_timings() -> (Vec<(&'static str, f64)>, Option<u64>) {
    support::last_call_timings()
}

#[pyfunction]
fn _set_poison(on: bool) {
    support::set_poison(on);
}

#[pymodule]
fn _convtune(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ConvtuneError", py.get_type::<ConvtuneError>())?;
    m.add("NoAdapterError", py.get_type::<NoAdapterError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("DeviceLostError", py.get_type::<DeviceLostError>())?;
    m.add("ShaderError", py.get_type::<ShaderError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add("ConvtuneWarning", py.get_type::<ConvtuneWarning>())?;
    m.add_function(wrap_pyfunction!(conv2d, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(adapter_info, m)?)?;
    m.add_function(wrap_pyfunction!(variant_space, m)?)?;
    m.add_function(wrap_pyfunction!(families, m)?)?;
    m.add_function(wrap_pyfunction!(variant_knobs, m)?)?;
    m.add_function(wrap_pyfunction!(default_variant, m)?)?;
    m.add_function(wrap_pyfunction!(wgsl, m)?)?;
    m.add_function(wrap_pyfunction!(time_variant, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(set_tuning, m)?)?;
    m.add_function(wrap_pyfunction!(tuning_mode, m)?)?;
    m.add_function(wrap_pyfunction!(wait_tuning, m)?)?;
    m.add_function(wrap_pyfunction!(tuning_status, m)?)?;
    m.add_function(wrap_pyfunction!(_stop_tuning, m)?)?;
    m.add_function(wrap_pyfunction!(cache_path, m)?)?;
    m.add_function(wrap_pyfunction!(cache_export, m)?)?;
    m.add_function(wrap_pyfunction!(cache_import, m)?)?;
    m.add_function(wrap_pyfunction!(cache_clear, m)?)?;
    m.add_function(wrap_pyfunction!(_set_poison, m)?)?;
    m.add_function(wrap_pyfunction!(_last_call_timings, m)?)?;
    m.add_function(wrap_pyfunction!(_reset_tuning_state, m)?)?;
    m.add_function(wrap_pyfunction!(_inject_faulty_candidate, m)?)?;
    m.add_function(wrap_pyfunction!(_inject_panic, m)?)?;
    m.add_class::<PyTensor>()?;
    m.add_function(wrap_pyfunction!(to_device, m)?)?;
    m.add_function(wrap_pyfunction!(conv2d_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(conv2d_footprint, m)?)?;
    m.add_function(wrap_pyfunction!(upload_footprint, m)?)?;
    m.add_function(wrap_pyfunction!(check_memory, m)?)?;
    Ok(())
}
