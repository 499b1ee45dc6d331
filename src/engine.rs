//! The public [`Engine`]: convtune's handle on one wgpu device, either opened by convtune on
//! the best adapter or the caller's own.

use crate::device::{self, AdapterDesc};
use crate::error::{Error, Result};
use crate::pool::PoolStats;
use std::sync::Arc;

/// convtune on one wgpu device: compiled kernels, the buffer pool that workspace and
/// host-slice calls draw from, and the device's capabilities. Cheap to clone (a shared
/// handle); safe to use from many threads.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<device::Engine>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("adapter", &self.inner.desc.name).finish_non_exhaustive()
    }
}

impl Engine {
    /// The process-wide engine Python uses: the highest-performance Vulkan adapter (or the
    /// one `CONVTUNE_ADAPTER` names), opened on first use and opened again after a device
    /// loss. Every call returns a handle to the same device until then.
    pub fn shared() -> Result<Engine> {
        device::engine().map(|inner| Engine { inner })
    }

    /// A new engine on its own device, on the adapter [`shared`](Self::shared) would pick.
    pub fn new() -> Result<Engine> {
        device::Engine::create().map(|e| Engine { inner: Arc::new(e) })
    }

    /// An engine on a device the caller opened, so convolutions read and write the
    /// caller's buffers in place. convtune uses whichever of its optional features the
    /// device was opened with ([`OPTIONAL_FEATURES`]: timestamp queries, `SHADER_F16` for
    /// float16 problems, cooperative matrices with subgroup barriers for the tensor-core family,
    /// `MAPPABLE_PRIMARY_BUFFERS`), and needs compute shaders and the limits of
    /// [`wgpu::Limits::default`] for storage buffers per stage (8) and workgroup sizes
    /// (256 invocations): a device without them gives [`Error::Unsupported`] naming each
    /// one. Kernel variants that need more than the device's limits are never chosen. The device's
    /// error handler and lost callback are left as they are. A device opened with
    /// [`memory_hints`] places large buffers as convtune's own devices do (with wgpu's
    /// default hints some kernels measured 25-50% slower, depending on where their buffers
    /// landed).
    ///
    /// [`OPTIONAL_FEATURES`]: crate::OPTIONAL_FEATURES
    /// [`memory_hints`]: crate::memory_hints
    pub fn from_device(adapter: &wgpu::Adapter, device: &wgpu::Device, queue: &wgpu::Queue) -> Result<Engine> {
        device::Engine::on_device(adapter, device, queue).map(|e| Engine { inner: Arc::new(e) })
    }

    /// The wgpu device the engine runs on.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The queue its submissions go to.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    /// The adapter of its device.
    pub fn adapter(&self) -> &wgpu::Adapter {
        &self.inner.adapter
    }

    /// The adapter as convtune reports it (name, backend, driver).
    pub fn adapter_desc(&self) -> &AdapterDesc {
        &self.inner.desc
    }

    /// The device's limits, which decide the kernel variants that fit.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.inner.caps.limits
    }

    /// The optional features convtune uses on this device.
    pub fn features(&self) -> wgpu::Features {
        self.inner.caps.features
    }

    /// `None` where the tensor-core family can run, else why not.
    pub fn tensor_cores_missing(&self) -> Option<&'static str> {
        self.inner.caps.tensor_cores_missing()
    }

    /// Set when convtune had to point the Vulkan loader at NVIDIA's EGL library itself.
    pub fn loader_note(&self) -> Option<&str> {
        self.inner.loader_note.as_deref()
    }

    /// The size of the adapter's largest device-local memory heap, where Vulkan reports it.
    pub fn device_heap_bytes(&self) -> Option<u64> {
        self.inner.device_heap
    }

    /// Whether inputs from host slices are written straight into mapped device memory.
    pub fn direct_inputs(&self) -> bool {
        self.inner.direct_inputs
    }

    /// The largest tensor, in bytes, one kernel binding takes (larger host-slice problems
    /// run in pieces; [`encode`](Self::encode) needs every tensor within it).
    pub fn max_binding(&self) -> u64 {
        self.inner.max_binding()
    }

    /// Bytes held by the engine's buffer pool.
    pub fn memory_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    /// The compiled kernels the engine keeps (at most `CONVTUNE_KERNEL_CACHE`, default 256,
    /// and `CONVTUNE_KERNELS_PER_LAYER`, default 16, of one layer's input sizes; least
    /// recently used dropped first) and how many it dropped.
    pub fn kernel_cache_stats(&self) -> crate::KernelCacheStats {
        self.inner.kernel_cache_stats()
    }

    /// Size-generic kernels held: one per layer (and variant and code form) that has met more
    /// than `CONVTUNE_GENERIC_AFTER` input sizes, 256 at most and 16 a layer, the least
    /// recently used dropped first (docs/limits.md).
    pub fn generic_kernels(&self) -> usize {
        self.inner.generic_modules()
    }

    /// Starts a new peak measurement of [`PoolStats::peak_device`].
    pub fn reset_peak_memory(&self) {
        self.inner.pool.reset_peak();
    }

    /// Whether `other` is a handle to the same engine.
    pub fn same_as(&self, other: &Engine) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// An error once convtune's own device was lost (a caller's device is the caller's to
    /// watch: its lost callback is left alone).
    pub(crate) fn check_lost(&self) -> Result<()> {
        self.inner.check_process()?;
        if self.inner.is_lost() {
            return Err(Error::DeviceLost(format!("{} was lost", self.inner.desc.name)));
        }
        Ok(())
    }
}

/// Every adapter wgpu can see, best first (the order `CONVTUNE_ADAPTER` indexes); an error
/// only in a process forked after the shared engine was opened.
pub fn adapters() -> Result<Vec<AdapterDesc>> {
    device::list_adapters()
}
