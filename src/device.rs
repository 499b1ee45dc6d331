//! The GPU engine: one lazily created wgpu instance, adapter, device and queue per process,
//! shared by all threads, plus the compiled-pipeline cache.
//!
//! Adapter choice: `CONVTUNE_ADAPTER` (an index into `list_adapters()` or a case-insensitive
//! name substring) if set, else the highest-performance Vulkan adapter, else the best
//! adapter of any other backend.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::params::ConvShape;
use crate::kernels::{Caps, Variant};
use crate::resident::key_of;
use crate::kernel_cache::{KernelCache, KernelCacheStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// One adapter as convtune reports it (Python: an entry of `convtune.devices()`).
#[derive(Clone, Debug)]
pub struct AdapterDesc {
    /// Its position in [`adapters`](crate::adapters), best first (`CONVTUNE_ADAPTER`
    /// indexes it); `None` for an engine on the caller's device.
    pub index: Option<usize>,
    /// The adapter's name.
    pub name: String,
    /// The wgpu backend, lower case (`vulkan`, `metal`, `dx12`, `gl`).
    pub backend: String,
    /// wgpu's device type (`DiscreteGpu`, `Cpu`, …).
    pub device_type: String,
    /// The driver's name.
    pub driver: String,
    /// The driver's version or other description.
    pub driver_info: String,
    /// The PCI vendor id.
    pub vendor: u32,
    /// The PCI device id.
    pub device: u32,
}

impl AdapterDesc {
    fn from_info(index: Option<usize>, info: &wgpu::AdapterInfo) -> Self {
        AdapterDesc {
            index,
            name: info.name.clone(),
            backend: format!("{:?}", info.backend).to_lowercase(),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            vendor: info.vendor,
            device: info.device,
        }
    }
}

/// A compiled kernel and the number of workgroups its dispatch needs.
pub struct Compiled {
    pub pipeline: wgpu::ComputePipeline,
    pub workgroups: u64,
    /// Needs the max-|x|, max-|w| pass before it (`Kernel::scaled`).
    pub scaled: bool,
    /// The module's `prologue` entry point and its workgroups (`Kernel::prologue`).
    pub prologue: Option<(wgpu::ComputePipeline, u64)>,
    /// The max pass runs before the prologue (`Kernel::prescale`).
    pub prescale: bool,
    /// Bytes of the workspace buffers (`Kernel::workspace`).
    pub workspace: [u64; 2],
    /// The prologue's trailing workgroups that write w's copy (`Kernel::w_blocks`), and the
    /// key that copy is kept under with resident weights.
    pub w_blocks: u64,
    pub w_key: u64,
    /// The module's `finish` entry point and its workgroups (`Kernel::finish`).
    pub finish: Option<(wgpu::ComputePipeline, u64)>,
    /// The weight pass (`Kernel::wprep`).
    pub wprep: Option<WeightPass>,
    /// Runs of prologue, main and finish, one per chunk (`Kernel::chunks`).
    pub chunks: u32,
    /// The element type of the output it writes (its poison pattern depends on it).
    pub dtype: DType,
    /// Bytes of its WGSL (the tuner predicts compile times from them).
    pub source_bytes: usize,
    /// A size-generic module's binding for sizes and this call's sizes (`generic`).
    pub dims: Option<(u32, Vec<i32>)>,
}

/// A size-generic module (`generic`): its rewrite and its compiled passes.
pub struct GenericModule {
    generic: crate::generic::Generic,
    compiled: Compiled,
}

impl Compiled {
    /// This size-generic module run on the shape `k` was generated for, with its sizes.
    fn for_size(&self, k: &crate::codegen::Kernel, binding: u32, dims: Vec<i32>) -> Compiled {
        Compiled {
            pipeline: self.pipeline.clone(),
            workgroups: k.workgroups,
            scaled: k.scaled,
            prologue: self.prologue.as_ref().zip(k.prologue).map(|((p, _), g)| (p.clone(), g)),
            prescale: k.prescale,
            workspace: k.workspace,
            w_blocks: k.w_blocks,
            w_key: key_of(&k.source),
            finish: self.finish.as_ref().zip(k.finish).map(|((p, _), g)| (p.clone(), g)),
            wprep: None,
            chunks: k.chunks,
            dtype: self.dtype,
            source_bytes: k.source.len(),
            dims: Some((binding, dims)),
        }
    }
}

/// A compiled weight pass (`Kernel::wprep`).
pub struct WeightPass {
    pub pipeline: wgpu::ComputePipeline,
    pub workgroups: u64,
    /// Bytes of the weights it writes.
    pub bytes: u64,
    /// The key its output is kept under with resident weights.
    pub key: u64,
}

/// The features the cooperative-matrix family needs (subgroup barriers guard its scratch
/// tiles: `kernels::coop::store`).
const TENSOR_CORE_FEATURES: wgpu::Features =
    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        .union(wgpu::Features::SHADER_F16)
        .union(wgpu::Features::SUBGROUP)
        .union(wgpu::Features::SUBGROUP_BARRIER);

/// Whether the adapter has what the cooperative-matrix family uses: the features, a
/// 16x16x16 f16 x f16 -> f32 configuration and subgroups of exactly 32 invocations (the
/// kernels split their workgroups into subgroups by invocation index).
/// `CONVTUNE_TENSOR_CORES=0` turns the family off.
fn has_tensor_cores(adapter: &wgpu::Adapter) -> bool {
    if std::env::var("CONVTUNE_TENSOR_CORES").is_ok_and(|v| v.trim() == "0") {
        return false;
    }
    let info = adapter.get_info();
    let f16 = wgpu::CooperativeScalarType::F16;
    let f32 = wgpu::CooperativeScalarType::F32;
    adapter.features().contains(TENSOR_CORE_FEATURES)
        && info.subgroup_min_size == crate::kernels::coop::SUBGROUP
        && info.subgroup_max_size == crate::kernels::coop::SUBGROUP
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == f16 && p.cr_type == f32
        })
}

pub struct Engine {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub desc: AdapterDesc,
    /// The adapter's limits and the optional features the device was opened with.
    pub caps: Caps,
    /// Set when convtune had to point the Vulkan loader at NVIDIA's EGL library itself.
    pub loader_note: Option<String>,
    pub bind_layout: wgpu::BindGroupLayout,
    pub pipeline_layout: wgpu::PipelineLayout,
    /// A stand-in for the bias of calls without bias: storage bindings may not be empty.
    pub no_input: wgpu::Buffer,
    /// The same for the writable bindings a kernel does not use (scales, workspace).
    pub no_scratch: wgpu::Buffer,
    /// The u32s 0, 1, ..., `MAX_CHUNKS` - 1: a chunked kernel's runs copy their index from
    /// here (`runner::encode`).
    pub chunk_indices: wgpu::Buffer,
    /// Compiled kernels by variant, shape and the workspace bound they were generated for,
    /// the least recently used dropped past a bound (`kernel_cache`).
    pipelines: KernelCache<(Variant, ConvShape, u64), Compiled>,
    /// Size-generic modules and the sizes each layer has met (`generic`).
    pub(crate) layers: crate::generic::Layers<GenericModule>,
    lost: Arc<AtomicBool>,
    pub pool: Arc<crate::pool::Pool>,
    /// The output-check kernels, compiled on first use.
    checker: Mutex<Option<Arc<crate::check::Checker>>>,
    /// The size of the adapter's largest device-local memory heap, where it can be read.
    pub device_heap: Option<u64>,
    /// Inputs from host arrays are written straight into mapped device memory
    /// (`pool::INPUT_MAPPED`) instead of through staging buffers and GPU copies.
    pub direct_inputs: bool,
    /// naga's run-time bounds/division checks in generated kernels (`CONVTUNE_RUNTIME_CHECKS=1`).
    pub runtime_checks: bool,
    /// Each thread's last Tensor call's submission, not waited for yet (see
    /// `runner::conv2d_device`).
    pub in_flight: Mutex<HashMap<std::thread::ThreadId, crate::wait::Submitted>>,
    /// How long a wait for the GPU polls before blocking (`spin_time`).
    pub spin: Duration,
    /// Held by the one thread polling the device at a time (`wait::spin`).
    pub poller: Mutex<()>,
    /// The queue's submissions, grouped across threads (`submit`); each carries its
    /// work-done flag where waits poll.
    pub submits: crate::submit::Batcher<Option<Arc<AtomicBool>>>,
    /// Threads waiting for the GPU now: only a lone waiter polls (`wait::Waiting`).
    pub waiting: std::sync::atomic::AtomicU32,
    /// The process that opened the device: a forked child has the parent's handles but
    /// none of its driver threads, and any wait there would hang.
    pid: u32,
    /// When the last tuning run ended: the GPU was at load clocks then (see `tuner::tune`).
    pub last_tuned: Mutex<Option<std::time::Instant>>,
}

/// How long a wait polls the device before it blocks on the fence (`CONVTUNE_SPIN_US`, read
/// once). On an H200 a thread blocked on the driver's fence woke late and on a slowed core: a
/// tiny Tensor call and its wait took 0.089 ms blocking and 0.057 polling, and the device
/// round trip of the 1.1 ms "highest" upsampler 1.80 ms against 1.27 (CUDA spins by default
/// for the same reason). None on CPU adapters, whose device threads need the cores.
pub fn spin_time(cpu: bool) -> Duration {
    static VAR: OnceLock<Option<String>> = OnceLock::new();
    spin_setting(VAR.get_or_init(|| std::env::var("CONVTUNE_SPIN_US").ok()).as_deref(), cpu)
}

/// The polling time `CONVTUNE_SPIN_US` (`var`, microseconds) asks for, else the default.
fn spin_setting(var: Option<&str>, cpu: bool) -> Duration {
    match (var.and_then(|v| v.trim().parse().ok()), cpu) {
        (Some(us), _) => Duration::from_micros(us),
        (None, true) => Duration::ZERO,
        (None, false) => DEFAULT_SPIN,
    }
}

/// The default polling time on GPUs: a wait shorter than this polls; a longer one costs a
/// core this long, then blocks.
const DEFAULT_SPIN: Duration = Duration::from_millis(5);

static ENGINE: Mutex<Option<Arc<Engine>>> = Mutex::new(None);
/// Serialises instance creation and the loader fallback, which sets process environment.
static INIT: Mutex<()> = Mutex::new(());
static LOADER_NOTE: OnceLock<String> = OnceLock::new();

fn backend_rank(b: wgpu::Backend) -> u32 {
    match b {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal | wgpu::Backend::Dx12 => 1,
        _ => 2,
    }
}

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if std::env::var_os("WGPU_BACKEND").is_none() {
        desc.backends = backends;
    }
    wgpu::Instance::new(desc)
}

fn can_load(lib: &str) -> bool {
    // SAFETY: loading a system library runs its initialisers; these are the same libraries
    // the Vulkan loader itself would load moments later.
    unsafe { libloading::Library::new(lib).is_ok() }
}

/// Headless NVIDIA machines and containers often ship an ICD manifest naming
/// libGLX_nvidia.so.0, which cannot create an instance without an X server; the same
/// driver's EGL library exports the Vulkan entry points and works. Returns a note when
/// the fallback was applied.
fn apply_nvidia_egl_fallback() -> Option<String> {
    if cfg!(not(target_os = "linux"))
        || std::env::var_os("VK_ICD_FILENAMES").is_some()
        || std::env::var_os("VK_DRIVER_FILES").is_some()
        || !can_load("libEGL_nvidia.so.0")
    {
        return None;
    }
    let path = std::env::temp_dir().join(format!("convtune-nvidia-egl-icd-{}.json", std::process::id()));
    let manifest = r#"{ "file_format_version": "1.0.1", "ICD": { "library_path": "libEGL_nvidia.so.0", "api_version": "1.3.0" } }"#;
    std::fs::write(&path, manifest).ok()?;
    // The loader reads these when the next instance is created; instance creation is
    // serialised by INIT, and nothing else in convtune reads the environment concurrently.
    std::env::set_var("VK_DRIVER_FILES", &path);
    std::env::set_var("VK_ICD_FILENAMES", &path);
    Some(format!(
        "no Vulkan adapter was found with the system ICD manifest; convtune pointed the Vulkan \
         loader at libEGL_nvidia.so.0 ({})",
        path.display()
    ))
}

/// The instance and its adapters, in the order `CONVTUNE_ADAPTER` indexes them: best first.
fn instance_and_adapters() -> (wgpu::Instance, Vec<wgpu::Adapter>) {
    // GL is a last resort: even creating a GL instance initialises EGL, which is slow and
    // prints errors on headless machines.
    let native = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    let mut instance = new_instance(native);
    let mut all = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    if all.is_empty() {
        instance = new_instance(wgpu::Backends::GL);
        all = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    }
    all.sort_by_key(|a| {
        let i = a.get_info();
        (backend_rank(i.backend), type_rank(i.device_type))
    });
    (instance, all)
}

fn has_vulkan(list: &[wgpu::Adapter]) -> bool {
    list.iter().any(|a| a.get_info().backend == wgpu::Backend::Vulkan)
}

/// Creates the instance and lists adapters, applying the headless-NVIDIA fallback when the
/// Vulkan loader finds no adapter on its own.
fn discover() -> (wgpu::Instance, Vec<wgpu::Adapter>) {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    // Mesa's implicit device-select layer probes Wayland/X at instance creation and prints
    // errors on headless machines; convtune picks its adapter itself, so switch it off.
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    let (instance, list) = instance_and_adapters();
    if has_vulkan(&list) || LOADER_NOTE.get().is_some() {
        return (instance, list);
    }
    match apply_nvidia_egl_fallback() {
        Some(note) => {
            let _ = LOADER_NOTE.set(note);
            instance_and_adapters()
        }
        None => (instance, list),
    }
}

fn no_adapter_error(list_empty: bool) -> Error {
    let loader_present = !cfg!(target_os = "linux") || can_load("libvulkan.so.1");
    no_adapter_message(loader_present, list_empty)
}

/// What to tell the user when no adapter could be used, naming what to install.
fn no_adapter_message(loader_present: bool, list_empty: bool) -> Error {
    if !loader_present {
        return Error::NoAdapter(
            "the Vulkan loader (libvulkan.so.1) is not installed: install it with \
             `apt-get install libvulkan1` (Debian/Ubuntu) or your distribution's vulkan-loader \
             package; for a CPU-only machine also install `mesa-vulkan-drivers` (lavapipe)"
                .into(),
        );
    }
    if list_empty {
        Error::NoAdapter(
            "no GPU adapter found: the Vulkan loader is present but reports no device. Install \
             your GPU's Vulkan driver, or `mesa-vulkan-drivers` for the CPU driver (lavapipe)"
                .into(),
        )
    } else {
        Error::NoAdapter("CONVTUNE_ADAPTER matches no adapter; see convtune.devices()".into())
    }
}

/// Every adapter wgpu can see, best first.
pub fn list_adapters() -> Result<Vec<AdapterDesc>> {
    not_forked()?;
    let (_instance, list) = discover();
    Ok(list.iter().enumerate().map(|(i, a)| AdapterDesc::from_info(Some(i), &a.get_info())).collect())
}

/// The adapter `selector` (`CONVTUNE_ADAPTER`: an index or a name substring) names, else
/// the first (best) one.
fn pick(list: Vec<wgpu::Adapter>, selector: Option<String>) -> Result<(usize, wgpu::Adapter)> {
    let empty = list.is_empty();
    let chosen = match selector {
        Some(sel) if !sel.trim().is_empty() => {
            let sel = sel.trim();
            match sel.parse::<usize>() {
                Ok(idx) => list.into_iter().enumerate().nth(idx),
                Err(_) => {
                    let needle = sel.to_lowercase();
                    list.into_iter()
                        .enumerate()
                        .find(|(_, a)| a.get_info().name.to_lowercase().contains(&needle))
                }
            }
        }
        _ => list.into_iter().enumerate().next(),
    };
    chosen.ok_or_else(|| no_adapter_error(empty))
}

/// What Vulkan reports of an adapter's memory that wgpu has no portable query for (its
/// limits only bound single buffers), read through wgpu's Vulkan backend.
#[derive(Clone, Copy, Debug, Default)]
struct DeviceMemory {
    /// The size of the largest device-local heap.
    heap: Option<u64>,
    /// Whether buffers the host maps for writing land in that heap: wgpu's Vulkan backend
    /// places them in the first memory type that is device-local, host-visible and
    /// host-coherent, and here that type's heap is the largest device-local one (all of a
    /// GPU's memory mapped through a resizable BAR, or a CPU or unified-memory adapter)
    /// rather than a 256 MiB window or host memory.
    host_maps_heap: bool,
}

#[cfg(all(not(target_arch = "wasm32"), any(windows, all(unix, not(target_vendor = "apple")))))]
fn device_memory(adapter: &wgpu::Adapter) -> DeviceMemory {
    // SAFETY: reads properties of the physical device only; nothing is created or destroyed.
    let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else { return DeviceMemory::default() };
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance, which the adapter keeps alive.
    let props = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    const DEVICE_LOCAL: u32 = 0x1; // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
    const MAPPED_DEVICE: u32 = DEVICE_LOCAL | 0x2 | 0x4; // | HOST_VISIBLE_BIT | HOST_COHERENT_BIT
    let heaps = props.memory_heaps_as_slice();
    let heap = heaps.iter().filter(|h| h.flags.as_raw() & DEVICE_LOCAL != 0).map(|h| h.size).max();
    let mapped = props.memory_types_as_slice().iter().find(|t| t.property_flags.as_raw() & MAPPED_DEVICE == MAPPED_DEVICE);
    let host_maps_heap = match (mapped, heap) {
        (Some(t), Some(largest)) => heaps.get(t.heap_index as usize).is_some_and(|h| h.size == largest),
        _ => false,
    };
    DeviceMemory { heap, host_maps_heap }
}

#[cfg(not(all(not(target_arch = "wasm32"), any(windows, all(unix, not(target_vendor = "apple"))))))]
fn device_memory(_adapter: &wgpu::Adapter) -> DeviceMemory {
    DeviceMemory::default()
}

/// Whether kernel inputs from host arrays are written in place (`CONVTUNE_DIRECT_UPLOAD=0`
/// turns it off): where the host maps the device's memory, writing there directly saves
/// a staging buffer and a GPU copy per input.
fn direct_inputs(adapter: &wgpu::Adapter, memory: DeviceMemory) -> bool {
    !std::env::var("CONVTUNE_DIRECT_UPLOAD").is_ok_and(|v| v.trim() == "0")
        && adapter.features().contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
        && memory.host_maps_heap
}

/// Features convtune can use and never requires: timestamps time kernels (else wall clock
/// around a queue sync), 16-bit floats run float16 problems, cooperative matrices run the
/// tensor-core family, and mappable device buffers let inputs be written in place.
pub const OPTIONAL_FEATURES: wgpu::Features = wgpu::Features::TIMESTAMP_QUERY
    .union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    .union(wgpu::Features::SHADER_F16)
    .union(TENSOR_CORE_FEATURES)
    .union(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);

/// The bindings one conv dispatch uses (see the bind group layout in `Engine::assemble`).
pub const STORAGE_BINDINGS: u32 = 8;

/// The memory hints convtune opens its own devices with: 32 MiB blocks, where wgpu's default
/// is 256, so that a buffer larger than a block gets device memory of its own. Suballocated
/// from a shared 256 MiB block, a float16 1x1 layer's 51 MB output made the same kernel
/// 25-50% slower on an H200 in some allocation orders; with 4, 16 or 32 MiB blocks it never
/// was, and the other kernels measured stayed within 1% (benches/results/HISTORY.md, "Buffers of their
/// own"). An application opening its own device for [`Engine::from_device`] can pass these.
///
/// [`Engine::from_device`]: crate::Engine::from_device
pub fn memory_hints() -> wgpu::MemoryHints {
    const BLOCK: u64 = 32 << 20;
    wgpu::MemoryHints::Manual { suballocated_device_memory_block_size: BLOCK..BLOCK }
}

/// What a device lacks that every kernel needs, one item each; empty when it has all.
pub fn missing_requirements(device: &wgpu::Device, downlevel: &wgpu::DownlevelCapabilities) -> Vec<String> {
    let mut missing = Vec::new();
    if !downlevel.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
        missing.push("compute shaders (DownlevelFlags::COMPUTE_SHADERS)".to_string());
    }
    let l = device.limits();
    let mut at_least = |name: &str, have: u64, need: u64| {
        if have < need {
            missing.push(format!("limit {name} >= {need} (the device has {have})"));
        }
    };
    at_least("max_storage_buffers_per_shader_stage", l.max_storage_buffers_per_shader_stage.into(), STORAGE_BINDINGS.into());
    at_least("max_bind_groups", l.max_bind_groups.into(), 1);
    // The output checks and max-|x| passes run 256-wide workgroups.
    at_least("max_compute_invocations_per_workgroup", l.max_compute_invocations_per_workgroup.into(), 256);
    at_least("max_compute_workgroup_size_x", l.max_compute_workgroup_size_x.into(), 256);
    at_least("max_compute_workgroups_per_dimension", l.max_compute_workgroups_per_dimension.into(), 1);
    missing
}

impl Engine {
    pub(crate) fn create() -> Result<Engine> {
        let (_instance, list) = discover();
        let (index, adapter) = pick(list, std::env::var("CONVTUNE_ADAPTER").ok())?;
        let (device, queue, memory) = Self::open(&adapter)?;
        // wgpu's default handler panics; a GPU error must never take the process down.
        // Errors that matter are caught by error scopes around each operation.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            log::warn!("convtune: uncaptured GPU error: {e}");
        }));
        let lost = Arc::new(AtomicBool::new(false));
        let lost_flag = lost.clone();
        device.set_device_lost_callback(move |_reason, _msg| {
            lost_flag.store(true, Ordering::SeqCst);
        });
        Self::assemble(adapter, device, queue, Some(index), memory, lost)
    }

    /// An engine on a device the caller opened: nothing of the device's own settings
    /// (error handler, lost callback) is changed. Fails naming what the device lacks.
    pub fn on_device(adapter: &wgpu::Adapter, device: &wgpu::Device, queue: &wgpu::Queue) -> Result<Engine> {
        let missing = missing_requirements(device, &adapter.get_downlevel_capabilities());
        if !missing.is_empty() {
            return Err(Error::Unsupported(format!(
                "{} cannot run convtune's kernels; it lacks: {}",
                adapter.get_info().name,
                missing.join(", ")
            )));
        }
        let memory = device_memory(adapter);
        let (device, queue) = (device.clone(), queue.clone());
        Self::assemble(adapter.clone(), device, queue, None, memory, Arc::new(AtomicBool::new(false)))
    }

    /// Opens a device on `adapter` with every optional feature it has that convtune uses.
    fn open(adapter: &wgpu::Adapter) -> Result<(wgpu::Device, wgpu::Queue, DeviceMemory)> {
        let info = adapter.get_info();
        let tensor_cores = has_tensor_cores(adapter);
        // SHADER_F16 wherever the adapter has it: kernels on float16 data declare it.
        let mut wanted = wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::SHADER_F16;
        if tensor_cores {
            wanted |= TENSOR_CORE_FEATURES;
        }
        let memory = device_memory(adapter);
        if direct_inputs(adapter, memory) {
            wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("convtune"),
            required_features: adapter.features() & wanted,
            required_limits: adapter.limits(),
            // SAFETY: wgpu refuses its experimental features without this token. The one
            // used, cooperative matrices, is only requested where the adapter reports the
            // configuration the kernels use, and those kernels are validated by naga and
            // checked against the reference like every other candidate.
            experimental_features: if tensor_cores {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: memory_hints(),
            ..Default::default()
        }))
        .map_err(|e| Error::NoAdapter(format!("could not open {}: {e}", info.name)))?;
        Ok((device, queue, memory))
    }

    /// The engine's own objects on an open device: the caps come from what the device was
    /// opened with, so optional features it lacks are simply not used.
    fn assemble(
        adapter: wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        index: Option<usize>,
        memory: DeviceMemory,
        lost: Arc<AtomicBool>,
    ) -> Result<Engine> {
        let info = adapter.get_info();
        let features = device.features() & OPTIONAL_FEATURES;
        let limits = device.limits();
        let tensor_cores = has_tensor_cores(&adapter) && features.contains(TENSOR_CORE_FEATURES);
        let direct_inputs = direct_inputs(&adapter, memory) && features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        let entry = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let bind_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("convtune conv2d"),
            // 0: x, 1: w, 2: bias, 3: y, 4: the run's words (max |x| and max |w| for kernels
            // that scale, the chunk's index for chunked kernels: `codegen::CHUNK_WORD`),
            // 5 and 6: workspace a kernel's prologue fills (rearranged copies of x and w),
            // 7: the epilogue's residual z (y's shape).
            entries: &[
                entry(0, true),
                entry(1, true),
                entry(2, true),
                entry(3, false),
                entry(4, false),
                entry(5, false),
                entry(6, false),
                entry(7, true),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("convtune conv2d"),
            bind_group_layouts: &[Some(&bind_layout)],
            immediate_size: 0,
        });
        let no_input = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("convtune no-bias"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let no_scratch = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("convtune no-scratch"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let chunk_indices = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("convtune chunk indices"),
            size: crate::codegen::MAX_CHUNKS as u64 * 4,
            usage: wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        {
            let indices: Vec<u8> = (0..crate::codegen::MAX_CHUNKS).flat_map(u32::to_le_bytes).collect();
            let mut view = chunk_indices
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| Error::Gpu(format!("writing the chunk indices failed: {e}")))?;
            view.copy_from_slice(&indices);
        }
        chunk_indices.unmap();
        let device_heap = memory.heap;
        let cpu = info.device_type == wgpu::DeviceType::Cpu;
        let pool = crate::pool::Pool::new(device.clone(), &queue, crate::pool::default_cap(device_heap, cpu));
        Ok(Engine {
            adapter,
            device,
            queue,
            desc: AdapterDesc::from_info(index, &info),
            caps: Caps { limits, features, tensor_cores, cpu },
            loader_note: LOADER_NOTE.get().cloned(),
            bind_layout,
            pipeline_layout,
            no_input,
            no_scratch,
            chunk_indices,
            pipelines: KernelCache::from_env(layer_of),
            layers: crate::generic::Layers::default(),
            lost,
            pool,
            checker: Mutex::new(None),
            device_heap,
            direct_inputs,
            runtime_checks: std::env::var("CONVTUNE_RUNTIME_CHECKS").is_ok_and(|v| v == "1"),
            in_flight: Mutex::new(HashMap::new()),
            spin: spin_time(cpu),
            poller: Mutex::new(()),
            submits: Default::default(),
            waiting: std::sync::atomic::AtomicU32::new(0),
            pid: std::process::id(),
            last_tuned: Mutex::new(None),
        })
    }

    /// An error in a process forked after this device was opened (see `forked_error`).
    pub fn check_process(&self) -> Result<()> {
        match std::process::id() {
            pid if pid == self.pid => Ok(()),
            _ => Err(forked_error()),
        }
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The largest buffer a kernel can bind (`CONVTUNE_MAX_BINDING` lowers it, for tests).
    pub fn max_binding(&self) -> u64 {
        let adapter = self.caps.limits.max_storage_buffer_binding_size.min(self.caps.limits.max_buffer_size);
        let forced = std::env::var("CONVTUNE_MAX_BINDING").ok().and_then(|v| v.parse::<u64>().ok());
        // Bindings are whole f32 elements.
        forced.map_or(adapter, |f| f.min(adapter)).max(16) / 4 * 4
    }

    /// The most bytes a kernel's workspace binding may take: `CONVTUNE_MAX_WORKSPACE` where
    /// set (lower, for tests of chunked kernels on small problems; higher, to trade memory
    /// for fewer chunks), else the default bound (`codegen::MAX_WORKSPACE`, 128 MiB); never
    /// past the adapter's largest binding.
    pub fn max_workspace(&self) -> u64 {
        let adapter = self.caps.limits.max_storage_buffer_binding_size.min(self.caps.limits.max_buffer_size);
        let forced = std::env::var("CONVTUNE_MAX_WORKSPACE").ok().and_then(|v| v.trim().parse::<u64>().ok());
        workspace_bound(forced, adapter)
    }

    pub fn checker(&self) -> Result<Arc<crate::check::Checker>> {
        let mut slot = self.checker.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = Arc::new(crate::check::Checker::new(&self.device)?);
        *slot = Some(c.clone());
        Ok(c)
    }

    pub fn has_timestamps(&self) -> bool {
        self.caps.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// The compiled pipeline for (variant, shape), compiling it on first use.
    pub fn pipeline(&self, variant: &Variant, shape: &ConvShape) -> Result<Arc<Compiled>> {
        let max_workspace = self.max_workspace();
        let key = (*variant, *shape, max_workspace);
        if let Some(p) = self.pipelines.get(&key) {
            return Ok(p);
        }
        // Compiling outside the cache's lock lets other threads use cached pipelines meanwhile.
        let pipeline = match self.generic_run(variant, shape, max_workspace) {
            Some(p) => p,
            None => Arc::new(self.compile_within(variant, shape, max_workspace)?),
        };
        self.pipelines.insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// `variant`'s size-generic module run on `shape` (as `pipeline` runs it once the layer
    /// has switched over), whatever kernel of (variant, shape) is cached; `None` where it has
    /// none.
    pub fn generic_kernel(&self, variant: &Variant, shape: &ConvShape) -> Option<Arc<Compiled>> {
        self.generic_run(variant, shape, self.max_workspace())
    }

    /// Drops `variant`'s size-generic module of `shape`'s layer unless one of the layer's
    /// buckets runs it (a bucket's timing's losers).
    pub fn drop_generic(&self, variant: &Variant, shape: &ConvShape) {
        let workspace = self.max_workspace();
        if let Ok(kernel) = variant.generate_within(shape, workspace) {
            self.layers.drop_module(variant, shape, workspace, crate::generic::skeleton(&kernel.source));
        }
    }

    /// A size-generic module's run on `shape` where its layer has met more than
    /// `generic::after()` sizes and the variant's module takes this size (`generic`); `None`
    /// where the call compiles its exact-size kernel as before.
    fn generic_run(&self, variant: &Variant, shape: &ConvShape, workspace: u64) -> Option<Arc<Compiled>> {
        if !self.layers.note(shape, crate::generic::after()) {
            return None;
        }
        let kernel = variant.generate_within(shape, workspace).ok()?;
        if kernel.chunks != 1 || kernel.wprep.is_some() {
            return None;
        }
        let skeleton = crate::generic::skeleton(&kernel.source);
        let module = match self.layers.module(variant, shape, workspace, skeleton) {
            Some(m) => m?,
            None => {
                let m = self.generic_module(variant, &kernel, shape, workspace).map(Arc::new);
                self.layers.keep_module(variant, shape, workspace, skeleton, m.clone());
                m?
            }
        };
        let dims = module.generic.values(&kernel.source)?;
        Some(Arc::new(module.compiled.for_size(&kernel, module.generic.binding, dims)))
    }

    /// The size-generic module of `variant` made from `kernel` (one size) and other sizes of
    /// its layer; `None` where they differ in more than sizes, or it fails to compile (the
    /// layer then keeps compiling per size).
    fn generic_module(&self, variant: &Variant, kernel: &crate::codegen::Kernel, shape: &ConvShape, workspace: u64) -> Option<GenericModule> {
        // The layer's other sizes and sizes that differ from this one in N, H and W all, so
        // that every constant that follows from them shows (one size alone may agree with
        // this one on a count by chance); those whose generator picks other code are skipped
        // (`Generic::of`). Generators pick code by divisibility (vector stores where the
        // output's pixels come in fours, direct stores where tiles fit whole images): of the
        // last four, two keep the output's pixel count modulo 4 and two keep it whole, so that
        // a size of such a form finds siblings too (a module made with the last two alone
        // takes other batch sizes only: `Generic::values` holds the rest to this size's).
        let (n, h, w) = (shape.n, shape.h, shape.w);
        let (sh, sw) = shape.stride;
        let probes = [
            ConvShape { n: n + 1, h: h + 1, w: w + 1, ..*shape },
            ConvShape { n: 2 * n + 1, h: 2 * h + 3, w: 2 * w + 5, ..*shape },
            ConvShape { n: n + 2, h: h + 4, w: w + 4, ..*shape },
            ConvShape { n: 3 * n, h: 3 * h + 4, w: 3 * w + 8, ..*shape },
            ConvShape { n: n + 1, h: h + 4 * sh, w: w + 8 * sw, ..*shape },
            ConvShape { n: n + 2, h: h + 12 * sh, w: w + 4 * sw, ..*shape },
            ConvShape { n: n + 1, ..*shape },
            ConvShape { n: 2 * n + 1, ..*shape },
        ];
        let kept = self.layers.kept(shape);
        let sources: Vec<String> = probes
            .iter()
            .chain(kept.iter().filter(|k| *k != shape))
            .filter_map(|p| variant.generate_within(p, workspace).ok())
            .map(|k| k.source)
            .collect();
        let refs: Vec<&str> = sources.iter().map(String::as_str).collect();
        let generic = crate::generic::Generic::of(&kernel.source, &refs)?;
        let source = crate::codegen::Kernel { source: generic.source.clone(), wprep: None, ..kernel.clone() };
        let compiled = self.compile_kernel(&format!("{variant} (size-generic)"), &source, shape.dtype).ok()?;
        Some(GenericModule { generic, compiled })
    }

    /// Size-generic modules held.
    pub fn generic_modules(&self) -> usize {
        self.layers.modules()
    }

    /// Keeps a kernel compiled elsewhere (the tuner's winner) as `pipeline` would keep its
    /// own: the call that follows a tuning run then neither compiles it again nor, on a
    /// driver that finishes compiling at the first dispatch (lavapipe), pays that again.
    pub fn keep_pipeline(&self, variant: &Variant, shape: &ConvShape, kernel: Arc<Compiled>) {
        self.pipelines.insert((*variant, *shape, self.max_workspace()), kernel);
    }

    /// Drops the kept kernel of (variant, shape): a tuner's earlier best, superseded.
    pub fn drop_pipeline(&self, variant: &Variant, shape: &ConvShape) {
        self.pipelines.remove(&(*variant, *shape, self.max_workspace()));
    }

    /// How many compiled kernels the engine keeps, its bound, and how many it dropped.
    pub fn kernel_cache_stats(&self) -> KernelCacheStats {
        self.pipelines.stats()
    }

    /// Compiles (variant, shape) without caching the result: the tuner compiles dozens of
    /// candidates per shape and only the winner is worth keeping.
    pub fn compile(&self, variant: &Variant, shape: &ConvShape) -> Result<Compiled> {
        self.compile_within(variant, shape, self.max_workspace())
    }

    /// `compile` with each workspace binding held to `max_workspace` bytes.
    pub fn compile_within(&self, variant: &Variant, shape: &ConvShape, max_workspace: u64) -> Result<Compiled> {
        if let Some(why) = variant.unfit(&self.caps) {
            return Err(Error::invalid(why));
        }
        if shape.dtype == DType::F16 && !self.caps.features.contains(wgpu::Features::SHADER_F16) {
            return Err(Error::invalid(format!(
                "float16 data needs an adapter with 16-bit shader floats (shader_f16); {} has none",
                self.desc.name
            )));
        }
        let kernel = variant.generate_within(shape, max_workspace)?;
        if kernel.chunks == 0 || kernel.chunks > crate::codegen::MAX_CHUNKS {
            return Err(Error::Gpu(format!("variant {variant} asks for {} chunks", kernel.chunks)));
        }
        self.compile_kernel(&variant.to_string(), &kernel, shape.dtype)
    }

    /// Compiles a generated kernel (`name`: its variant, for errors).
    pub(crate) fn compile_kernel(&self, name: &str, kernel: &crate::codegen::Kernel, dtype: DType) -> Result<Compiled> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.shader_module(&kernel.source);
        let wprep_module = kernel.wprep.as_ref().map(|p| self.shader_module(&p.source));
        let entry_of = |module: &wgpu::ShaderModule, name: &str| {
            self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("convtune conv2d"),
                layout: Some(&self.pipeline_layout),
                module,
                entry_point: Some(name),
                // Every kernel writes workgroup memory before reading it.
                compilation_options: wgpu::PipelineCompilationOptions {
                    zero_initialize_workgroup_memory: self.runtime_checks,
                    ..Default::default()
                },
                cache: None,
            })
        };
        let entry = |name: &str| entry_of(&module, name);
        let pipeline = entry("main");
        let prologue = kernel.prologue.map(|groups| (entry("prologue"), groups));
        let finish = kernel.finish.map(|groups| (entry("finish"), groups));
        let wprep = kernel
            .wprep
            .as_ref()
            .zip(wprep_module.as_ref())
            .map(|(p, m)| WeightPass { pipeline: entry_of(m, "main"), workgroups: p.workgroups, bytes: p.bytes, key: key_of(&p.source) });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(Error::Shader { variant: name.to_string(), message: err.to_string() });
        }
        Ok(Compiled {
            pipeline,
            workgroups: kernel.workgroups,
            scaled: kernel.scaled,
            prologue,
            prescale: kernel.prescale,
            workspace: kernel.workspace,
            w_blocks: kernel.w_blocks,
            w_key: key_of(&kernel.source),
            finish,
            wprep,
            chunks: kernel.chunks,
            dtype,
            source_bytes: kernel.source.len() + kernel.wprep.as_ref().map_or(0, |p| p.source.len()),
            dims: None,
        })
    }

    /// A shader module of generated WGSL.
    fn shader_module(&self, source: &str) -> wgpu::ShaderModule {
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some("convtune conv2d"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        if self.runtime_checks {
            self.device.create_shader_module(desc)
        } else {
            // SAFETY: generated kernels index in bounds by construction: every global read
            // goes through `select(0, idx, in_range)`, every write is guarded by the output
            // bounds, workgroup indices are bounded by the tile constants, and divisions are
            // by non-zero constants. The tests run every variant against a reference with
            // poisoned outputs. naga's checks would otherwise clamp every access in the
            // inner loops.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        }
    }
}

/// The process that opened the process-wide engine; 0 before it is opened.
static OWNER: AtomicU32 = AtomicU32::new(0);

/// The layer a kernel-cache key belongs to: its problem but for the batch, height and
/// width (a layer fed many input sizes compiles one kernel per size).
fn layer_of((_, shape, _): &(Variant, ConvShape, u64)) -> u64 {
    crate::generic::layer_of(shape)
}

/// What a process forked after convtune opened its device gets from every call: the GPU
/// device, its driver's threads and convtune's own locks do not survive `fork` (PyTorch
/// says the same of CUDA), and a wait there would never end.
pub fn forked_error() -> Error {
    Error::Forked(
        "this process was forked after convtune opened its GPU device, and the device cannot be \
         used in a forked child: start worker processes with the 'spawn' or 'forkserver' \
         method (multiprocessing.set_start_method / get_context('spawn'), or a data loader's \
         multiprocessing_context), or fork before convtune's first call"
            .into(),
    )
}

/// An error in a process forked after the process-wide engine was opened. Checked before
/// any lock: a parent's thread may have held it when the process forked.
pub fn not_forked() -> Result<()> {
    let owner = OWNER.load(Ordering::Acquire);
    if owner != 0 && owner != std::process::id() {
        return Err(forked_error());
    }
    Ok(())
}

/// The process-wide engine, created on first use and recreated after a device loss.
pub fn engine() -> Result<Arc<Engine>> {
    not_forked()?;
    let mut slot = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = slot.as_ref() {
        if !e.is_lost() {
            return Ok(e.clone());
        }
    }
    let e = Arc::new(Engine::create()?);
    OWNER.store(e.pid, Ordering::Release);
    *slot = Some(e.clone());
    Ok(e)
}

/// The workspace bound for a setting of `CONVTUNE_MAX_WORKSPACE` (`forced`) on an adapter
/// whose largest binding is `adapter` bytes: whole f32 elements, at least one.
fn workspace_bound(forced: Option<u64>, adapter: u64) -> u64 {
    forced.unwrap_or(crate::codegen::MAX_WORKSPACE).min(adapter).max(16) / 4 * 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_pieces_name_the_package_to_install() {
        let msg = no_adapter_message(false, true).to_string();
        assert!(msg.contains("libvulkan.so.1") && msg.contains("apt-get install libvulkan1"), "{msg}");
        assert!(msg.contains("mesa-vulkan-drivers"), "{msg}");
        let msg = no_adapter_message(true, true).to_string();
        assert!(msg.contains("no GPU adapter") && msg.contains("mesa-vulkan-drivers"), "{msg}");
        let msg = no_adapter_message(true, false).to_string();
        assert!(msg.contains("CONVTUNE_ADAPTER"), "{msg}");
    }

    #[test]
    fn waits_poll_on_gpus_unless_told_otherwise() {
        assert_eq!(spin_setting(None, false), DEFAULT_SPIN);
        assert_eq!(spin_setting(None, true), Duration::ZERO);
        assert_eq!(spin_setting(Some("0"), false), Duration::ZERO);
        assert_eq!(spin_setting(Some(" 250 "), true), Duration::from_micros(250));
        assert_eq!(spin_setting(Some("soon"), false), DEFAULT_SPIN);
    }

    #[test]
    fn the_workspace_bound_is_the_setting_within_the_adapter() {
        let default = crate::codegen::MAX_WORKSPACE;
        assert_eq!(workspace_bound(None, 2 << 30), default);
        assert_eq!(workspace_bound(None, 64 << 20), 64 << 20);
        assert_eq!(workspace_bound(Some(1 << 20), 2 << 30), 1 << 20);
        // Raised past the default (fewer chunks, more memory), up to the adapter's binding.
        assert_eq!(workspace_bound(Some(512 << 20), 2 << 30), 512 << 20);
        assert_eq!(workspace_bound(Some(8 << 30), 2 << 30), 2 << 30);
        assert_eq!(workspace_bound(Some(0), 2 << 30), 16);
        assert_eq!(workspace_bound(Some(1023), 2 << 30), 1020);
    }

    #[test]
    fn adapter_selector_that_matches_nothing_is_an_error() {
        assert!(matches!(pick(Vec::new(), Some("no such adapter".into())), Err(Error::NoAdapter(_))));
        assert!(matches!(pick(Vec::new(), None), Err(Error::NoAdapter(_))));
    }
}
