//! GPU buffer reuse: calls take buffers from a pool and give them back when dropped, so a
//! stream of calls does not allocate on every call, and idle memory stays under a cap.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of idle buffers the pool keeps at least (`CONVTUNE_POOL_MB` overrides).
const DEFAULT_CAP: u64 = 1 << 30;
/// And at most, on a GPU with a large heap (see `default_cap`).
const MAX_CAP: u64 = 16 << 30;

/// The idle cap for an adapter: an eighth of a discrete GPU's device-local heap, between 1
/// and 16 GiB. Chained calls on EDSR-size tensors (236 MB each) keep about 1 GiB idle
/// between calls; with a 1 GiB cap every call freed one buffer and allocated another, 3-6 ms
/// per call on an H100. A CPU adapter's "device" memory is the host's: 1 GiB there.
pub fn default_cap(device_heap: Option<u64>, cpu: bool) -> u64 {
    match device_heap {
        Some(heap) if !cpu => (heap / 8).clamp(DEFAULT_CAP, MAX_CAP),
        _ => DEFAULT_CAP,
    }
}

/// Host-visible buffers the host writes and the GPU copies from. wgpu's `write_buffer`
/// allocates (and the driver pins) a fresh one of these per call; pooled ones are kept
/// mapped while idle, so a call writes into them at once.
pub const UPLOAD: wgpu::BufferUsages = wgpu::BufferUsages::MAP_WRITE.union(wgpu::BufferUsages::COPY_SRC);
/// Kernel inputs the host writes in place: storage buffers in device memory that the host
/// can map, where an adapter has it (see `Engine::direct_inputs`). Kept mapped while idle,
/// like `UPLOAD` buffers.
pub const INPUT_MAPPED: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::MAP_WRITE);
/// Host-visible buffers the GPU copies results into for the host to read.
pub const DOWNLOAD: wgpu::BufferUsages = wgpu::BufferUsages::MAP_READ.union(wgpu::BufferUsages::COPY_DST);

/// Where a host-visible buffer's mapping stands, as its last map or unmap left it: kept
/// beside the buffer because wgpu has no query for it, and set only by `PooledBuffer`'s own
/// map and unmap methods and their callbacks.
type MapState = Arc<AtomicU8>;
const UNMAPPED: u8 = 0;
/// A map is asked for and its callback has not run.
const PENDING: u8 = 1;
const MAPPED: u8 = 2;

/// The state a host-visible buffer of `usage` must be in to rest in the pool: mapped for
/// the buffers the host writes (the next call writes at once), unmapped for read-backs (the
/// next call's GPU copy writes them, and a submission may not use a mapped buffer).
fn resting_state(usage: wgpu::BufferUsages) -> u8 {
    if host_written(usage) { MAPPED } else { UNMAPPED }
}

fn host_visible(usage: wgpu::BufferUsages) -> bool {
    usage.intersects(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE)
}

/// An idle buffer; a host-visible one carries its mapping state.
struct Idle {
    buf: wgpu::Buffer,
    state: Option<MapState>,
}

pub struct Pool {
    device: wgpu::Device,
    /// Set where `CONVTUNE_POISON_BUFFERS` asks every buffer a call takes to come filled with
    /// NaN bytes, for tests: a kernel that reads memory no one wrote (a size class's tail,
    /// padding a pass should have zeroed) then shows, even where it multiplies it by zero.
    poison: Option<wgpu::Queue>,
    free: Mutex<HashMap<(u32, u64), Vec<Idle>>>,
    idle: AtomicU64,
    live: AtomicU64,
    /// Live bytes in device-local buffers (read-back staging lives in host memory) and their
    /// high-water mark since the last reset.
    live_device: AtomicU64,
    peak_device: AtomicU64,
    allocations: AtomicU64,
    cap: u64,
    /// The process that made the pool: a forked child leaves its buffers alone.
    pid: u32,
}

fn is_device_local(usage: wgpu::BufferUsages) -> bool {
    usage.contains(wgpu::BufferUsages::STORAGE) || !usage.intersects(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE)
}

/// Buffers the host writes: they start mapped and are kept mapped while idle.
fn host_written(usage: wgpu::BufferUsages) -> bool {
    usage.contains(wgpu::BufferUsages::MAP_WRITE)
}

/// Sizes are rounded up to one of eight steps per power of two: at most 12.5% waste, and
/// nearby shapes share buffers.
pub fn size_class(size: u64) -> u64 {
    let size = size.max(16);
    let e = 63 - size.leading_zeros() as u64;
    if e < 4 {
        return size.next_multiple_of(4);
    }
    let step = (1u64 << (e - 3)).max(4);
    size.next_multiple_of(step)
}

/// GPU memory held by an engine's buffer pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolStats {
    /// Bytes in buffers handed out and not yet returned.
    pub live: u64,
    /// Bytes in buffers kept for reuse.
    pub idle: u64,
    /// Bytes in device-local buffers handed out and not yet returned.
    pub live_device: u64,
    /// Buffers created since the engine started.
    pub allocations: u64,
    /// Most bytes of device-local buffers in use at once since the last `reset_peak`.
    pub peak_device: u64,
}

impl Pool {
    pub fn new(device: wgpu::Device, queue: &wgpu::Queue, default_cap: u64) -> Arc<Pool> {
        let cap = std::env::var("CONVTUNE_POOL_MB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(default_cap, |mb| mb << 20);
        let poison = std::env::var("CONVTUNE_POISON_BUFFERS").is_ok_and(|v| !v.is_empty() && v != "0");
        Arc::new(Pool {
            device,
            poison: poison.then(|| queue.clone()),
            free: Mutex::new(HashMap::new()),
            idle: AtomicU64::new(0),
            live: AtomicU64::new(0),
            live_device: AtomicU64::new(0),
            peak_device: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            cap,
            pid: std::process::id(),
        })
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            live: self.live.load(Ordering::Relaxed),
            idle: self.idle.load(Ordering::Relaxed),
            live_device: self.live_device.load(Ordering::Relaxed),
            allocations: self.allocations.load(Ordering::Relaxed),
            peak_device: self.peak_device.load(Ordering::Relaxed),
        }
    }

    pub fn reset_peak(&self) {
        self.peak_device.store(self.live_device.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Drops every idle buffer (after an out-of-memory error, or on request).
    pub fn trim(&self) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for (_, bufs) in free.drain() {
            for b in bufs {
                self.idle.fetch_sub(b.buf.size(), Ordering::Relaxed);
                b.buf.destroy();
            }
        }
    }

    fn reuse(&self, key: (u32, u64)) -> Option<Idle> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let idle = free.get_mut(&key)?.pop()?;
        self.idle.fetch_sub(idle.buf.size(), Ordering::Relaxed);
        Some(idle)
    }

    fn create(&self, usage: wgpu::BufferUsages, size: u64) -> Result<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("convtune"),
            size,
            usage,
            // Buffers the host writes start mapped, as idle ones are kept.
            mapped_at_creation: host_written(usage),
        });
        match pollster::block_on(scope.pop()) {
            None => {
                self.allocations.fetch_add(1, Ordering::Relaxed);
                Ok(buf)
            }
            Some(e) => Err(Error::OutOfMemory(format!("allocating {size} bytes: {e}"))),
        }
    }

    /// A buffer of at least `size` bytes with `usage`; one the host writes comes mapped.
    pub fn take(self: &Arc<Self>, usage: wgpu::BufferUsages, size: u64) -> Result<PooledBuffer> {
        let class = size_class(size);
        let key = (usage.bits(), class);
        let idle = match self.reuse(key) {
            Some(b) => b,
            None => {
                let buf = match self.create(usage, class) {
                    Ok(b) => b,
                    // Idle buffers may be what fills the GPU: free them and try once more.
                    Err(_) => {
                        self.trim();
                        self.create(usage, class)?
                    }
                };
                let state = host_visible(usage).then(|| Arc::new(AtomicU8::new(resting_state(usage))));
                Idle { buf, state }
            }
        };
        let Idle { buf, state } = idle;
        if let Some(queue) = &self.poison {
            poison(queue, &buf, host_written(usage));
        }
        self.live.fetch_add(class, Ordering::Relaxed);
        if is_device_local(usage) {
            let now = self.live_device.fetch_add(class, Ordering::Relaxed) + class;
            self.peak_device.fetch_max(now, Ordering::Relaxed);
        }
        Ok(PooledBuffer { buf: Some(buf), size, pool: self.clone(), state })
    }

    fn give_back(&self, buf: wgpu::Buffer, state: Option<MapState>) {
        if std::process::id() != self.pid {
            // A forked child dropping a copy of its parent's objects: the device and the
            // pool's lock are the parent's (a parent's thread may have held it at the fork).
            std::mem::forget(buf);
            return;
        }
        let size = buf.size();
        self.live.fetch_sub(size, Ordering::Relaxed);
        if is_device_local(buf.usage()) {
            self.live_device.fetch_sub(size, Ordering::Relaxed);
        }
        // Only a buffer in its resting state goes back: an upload buffer whose mapping has not
        // come back cannot be written by the next call, and a read-back buffer still mapped,
        // or with a map pending (an error or a panic cut its call short), would fail the next
        // call's submission ("still mapped"). Those are freed instead.
        let unusable = state.as_ref().is_some_and(|m| m.load(Ordering::Acquire) != resting_state(buf.usage()));
        if unusable || self.idle.load(Ordering::Relaxed) + size > self.cap {
            buf.destroy();
            return;
        }
        self.idle.fetch_add(size, Ordering::Relaxed);
        let key = (buf.usage().bits(), size);
        let idle = Idle { buf, state };
        self.free.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().push(idle);
    }
}

/// Fills a buffer with 0xFF bytes (NaN as float32 and float16): a mapped one through its
/// mapping, a storage buffer by a queue write that lands before the next submission.
fn poison(queue: &wgpu::Queue, buf: &wgpu::Buffer, mapped: bool) {
    if mapped {
        if let Ok(mut view) = buf.slice(..).get_mapped_range_mut() {
            view.copy_from_slice(&vec![0xFF; buf.size() as usize]);
        }
    } else if buf.usage().contains(wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST) {
        queue.write_buffer(buf, 0, &vec![0xFF; buf.size() as usize]);
    }
}

/// A buffer on loan from the pool; returned when dropped.
pub struct PooledBuffer {
    buf: Option<wgpu::Buffer>,
    /// The bytes asked for (the buffer may be larger).
    pub size: u64,
    pool: Arc<Pool>,
    /// Host-visible buffers: where the mapping stands.
    state: Option<MapState>,
}

impl PooledBuffer {
    /// Unmaps the buffer if it is mapped or has a map pending (whose callback then gets an
    /// error), e.g. an upload buffer so a submission can copy from it; shadows
    /// `wgpu::Buffer::unmap`, so the pool always knows the state.
    pub fn unmap(&self) {
        let was = self.state.as_ref().map_or(MAPPED, |s| s.swap(UNMAPPED, Ordering::AcqRel));
        if was != UNMAPPED {
            self.buffer().unmap();
        }
    }

    /// Maps `..bytes` for reading once the submissions using the buffer are done; `done`
    /// gets the result, on whichever thread polls the device then.
    pub fn map_read(&self, bytes: u64, done: impl FnOnce(std::result::Result<(), wgpu::BufferAsyncError>) + Send + 'static) {
        self.map(wgpu::MapMode::Read, ..bytes, done);
    }

    /// Asks for an upload buffer's mapping back once the submissions using it are done
    /// (call after submitting them); the pool reuses it only if the mapping came back by
    /// the time it is dropped, which a wait on those submissions ensures.
    pub fn remap_upload(&self) {
        if self.state.is_some() {
            self.map(wgpu::MapMode::Write, .., |_| ());
        }
    }

    /// `map_async`, with the state kept.
    fn map<R: std::ops::RangeBounds<u64>>(
        &self,
        mode: wgpu::MapMode,
        range: R,
        done: impl FnOnce(std::result::Result<(), wgpu::BufferAsyncError>) + Send + 'static,
    ) {
        let state = self.state.clone();
        if let Some(s) = &state {
            s.store(PENDING, Ordering::Release);
        }
        self.buffer().map_async(mode, range, move |r| {
            if let Some(s) = state {
                // Only a pending map may settle the state: an unmap that cancelled it
                // has already set it.
                let _ = s.compare_exchange(PENDING, if r.is_ok() { MAPPED } else { UNMAPPED }, Ordering::AcqRel, Ordering::Acquire);
            }
            done(r);
        });
    }

    fn buffer(&self) -> &wgpu::Buffer {
        self.buf.as_ref().expect("a pooled buffer is present until drop")
    }

    /// The bytes asked for, as a kernel binds them.
    pub fn view(&self) -> View<'_> {
        View { buffer: self, offset: 0, size: self.size }
    }

    /// A binding of exactly the bytes asked for.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        self.view().binding()
    }
}

/// A byte range of a buffer that one kernel binding covers: a pooled buffer whole, or a
/// range of a buffer the caller owns (`Engine::encode`).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl<'a> View<'a> {
    pub fn binding(&self) -> wgpu::BindingResource<'a> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: self.buffer,
            offset: self.offset,
            size: std::num::NonZeroU64::new(self.size),
        })
    }
}

impl std::fmt::Debug for PooledBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuffer({} bytes)", self.size)
    }
}

impl Deref for PooledBuffer {
    type Target = wgpu::Buffer;
    fn deref(&self) -> &wgpu::Buffer {
        self.buffer()
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give_back(b, self.state.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{default_cap, size_class};

    #[test]
    fn cap_follows_the_heap_within_bounds() {
        assert_eq!(default_cap(None, false), 1 << 30);
        assert_eq!(default_cap(Some(80 << 30), true), 1 << 30);
        assert_eq!(default_cap(Some(80 << 30), false), 10 << 30);
        assert_eq!(default_cap(Some(2 << 30), false), 1 << 30);
        assert_eq!(default_cap(Some(1 << 40), false), 16 << 30);
    }

    #[test]
    fn size_classes_waste_at_most_an_eighth() {
        for s in [1u64, 4, 17, 100, 1000, 4097, 123_456_789, 1 << 30] {
            let c = size_class(s);
            assert!(c >= s && c % 4 == 0);
            assert!(c as f64 <= (s.max(16) as f64) * 1.125 + 4.0, "{s} -> {c}");
        }
    }
}
