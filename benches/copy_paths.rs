//! How fast bytes in pageable host memory (where numpy arrays live) can reach the GPU and
//! come back, by every path Vulkan offers, on the adapter wgpu picks. Prints GB/s; it is the
//! measurement behind the copy paths `transfer.rs` takes and their ceilings in the README.
//!
//!     cargo bench --bench copy_paths            # 9, 64, 236 MiB
//!     COPY_PATHS_MIB=64 cargo bench --no-default-features --bench copy_paths
//!
//! Paths: host memcpy (the reference); host writes into wgpu's MAP_WRITE buffers (device
//! memory behind a resizable BAR where the adapter has one); host writes into host memory of
//! each host-visible memory type, then the GPU's copy; the same pipelined in 4 MiB chunks;
//! read-backs through MAP_READ buffers; and the GPU copying from the array's own pages,
//! imported with VK_EXT_external_memory_host (what the import and its release cost).
//! Best of 5 for each figure.

use ash::vk;
use std::time::Instant;

type Hal = wgpu::hal::api::Vulkan;

const THREADS: [usize; 4] = [1, 4, 8, 16];

fn best(mut f: impl FnMut()) -> f64 {
    (0..5).map(|_| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    })
    .fold(f64::MAX, f64::min)
}

fn gbps(bytes: usize, s: f64) -> String {
    format!("{:6.1} GB/s ({:.3} ms)", bytes as f64 / s / 1e9, s * 1e3)
}

/// Copies `src` into `dst` in one slice per thread.
fn par_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let n = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, from) in dst.chunks_mut(n).zip(src.chunks(n)) {
            s.spawn(move || d.copy_from_slice(from));
        }
    });
}

fn wait(dev: &wgpu::Device) {
    dev.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).expect("poll");
}

fn gpu_copy(dev: &wgpu::Device, q: &wgpu::Queue, from: &wgpu::Buffer, from_off: u64, to: &wgpu::Buffer, to_off: u64, len: u64) {
    let mut e = dev.create_command_encoder(&Default::default());
    e.copy_buffer_to_buffer(from, from_off, to, to_off, len);
    q.submit([e.finish()]);
}

struct Gpu {
    dev: wgpu::Device,
    q: wgpu::Queue,
    /// VK_EXT_external_memory_host, where the device has it, and its pointer alignment.
    import: Option<(ash::ext::external_memory_host::Device, usize)>,
}

/// Opens the default adapter with VK_EXT_external_memory_host enabled where it exists.
fn open() -> Gpu {
    let inst = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = pollster::block_on(inst.request_adapter(&Default::default())).expect("a Vulkan adapter");
    println!("adapter: {}", adapter.get_info().name);
    let name = ash::ext::external_memory_host::NAME;
    let limits = adapter.limits();
    // SAFETY: the device is opened from this adapter with wgpu's own extensions plus one
    // the adapter reports; properties are only read.
    unsafe {
        let hal = adapter.as_hal::<Hal>().expect("a Vulkan adapter");
        let has_import = hal.physical_device_capabilities().supports_extension(name);
        let mut hp = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut hp);
        hal.shared_instance().raw_instance().get_physical_device_properties2(hal.raw_physical_device(), &mut p2);
        let align = hp.min_imported_host_pointer_alignment as usize;
        let p = hal.shared_instance().raw_instance().get_physical_device_memory_properties(hal.raw_physical_device());
        for (i, h) in p.memory_heaps_as_slice().iter().enumerate() {
            println!("heap {i}: {} MiB {:?}", h.size >> 20, h.flags);
        }
        for (i, t) in p.memory_types_as_slice().iter().enumerate() {
            println!("type {i}: heap {} {:?}", t.heap_index, t.property_flags);
        }
        let callback = move |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs| {
            if has_import {
                args.extensions.push(name);
            }
        };
        let open = hal.open_with_callback(wgpu::Features::empty(), &limits, &Default::default(), Some(Box::new(callback))).expect("open");
        drop(hal);
        let desc = wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() };
        let (dev, q) = adapter.create_device_from_hal(open, &desc).expect("device");
        let import = has_import.then(|| {
            let hal = dev.as_hal::<Hal>().expect("vulkan");
            (ash::ext::external_memory_host::Device::new(hal.shared_instance().raw_instance(), hal.raw_device()), align)
        });
        Gpu { dev, q, import }
    }
}

/// A copy source/destination buffer in the first memory type with exactly these host flags,
/// mapped for good; `None` where the adapter has no such type.
fn raw_buffer(g: &Gpu, size: u64, cached: bool, device_local: bool) -> Option<(wgpu::Buffer, *mut u8)> {
    // SAFETY: a buffer and its memory made on wgpu's device and handed to it whole.
    unsafe {
        let hal = g.dev.as_hal::<Hal>()?;
        let d = hal.raw_device();
        let props = hal.shared_instance().raw_instance().get_physical_device_memory_properties(hal.raw_physical_device());
        let usage = vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST;
        let b = d.create_buffer(&vk::BufferCreateInfo::default().size(size).usage(usage), None).ok()?;
        let req = d.get_buffer_memory_requirements(b);
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let Some(idx) = (0..props.memory_type_count).find(|&i| {
            let f = props.memory_types[i as usize].property_flags;
            req.memory_type_bits & (1 << i) != 0
                && f.contains(host)
                && f.contains(vk::MemoryPropertyFlags::HOST_CACHED) == cached
                && f.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL) == device_local
        }) else {
            d.destroy_buffer(b, None);
            return None;
        };
        let info = vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(idx);
        let mem = d.allocate_memory(&info, None).ok()?;
        d.bind_buffer_memory(b, mem, 0).ok()?;
        let ptr = d.map_memory(mem, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()).ok()? as *mut u8;
        let hb = <Hal as wgpu::hal::Api>::Buffer::from_raw_managed(b, mem, 0, req.size);
        drop(hal);
        let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let buf = g.dev.create_buffer_from_hal::<Hal>(hb, &wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
        Some((buf, ptr))
    }
}

/// The pages holding `len` bytes at `ptr`, imported as a buffer; with the offset of `ptr` in it.
fn import(g: &Gpu, ptr: *const u8, len: usize) -> Result<(wgpu::Buffer, u64), String> {
    let (ext, align) = g.import.as_ref().ok_or("no VK_EXT_external_memory_host")?;
    let start = ptr as usize / align * align;
    let size = ((ptr as usize + len).next_multiple_of(*align) - start) as u64;
    let ht = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
    // SAFETY: the pages are mapped (they hold the caller's bytes) and outlive the buffer.
    unsafe {
        let hal = g.dev.as_hal::<Hal>().ok_or("not Vulkan")?;
        let d = hal.raw_device();
        let mut props = vk::MemoryHostPointerPropertiesEXT::default();
        let r = (ext.fp().get_memory_host_pointer_properties_ext)(d.handle(), ht, start as *const _, &mut props);
        if r != vk::Result::SUCCESS {
            return Err(format!("{r:?}"));
        }
        let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(ht);
        let usage = vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST;
        let b = d.create_buffer(&vk::BufferCreateInfo::default().size(size).usage(usage).push_next(&mut ext_info), None).map_err(|e| e.to_string())?;
        let bits = props.memory_type_bits & d.get_buffer_memory_requirements(b).memory_type_bits;
        let mut imp = vk::ImportMemoryHostPointerInfoEXT::default().handle_type(ht).host_pointer(start as *mut _);
        let info = vk::MemoryAllocateInfo::default().allocation_size(size).memory_type_index(bits.trailing_zeros()).push_next(&mut imp);
        let mem = d.allocate_memory(&info, None).map_err(|e| e.to_string())?;
        d.bind_buffer_memory(b, mem, 0).map_err(|e| e.to_string())?;
        let hb = <Hal as wgpu::hal::Api>::Buffer::from_raw_managed(b, mem, 0, size);
        drop(hal);
        let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let buf = g.dev.create_buffer_from_hal::<Hal>(hb, &wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
        Ok((buf, (ptr as usize - start) as u64))
    }
}

fn staged_paths(g: &Gpu, src: &[u8], dst: &mut [u8], device: &wgpu::Buffer) {
    let len = src.len();
    let size = len as u64;
    let usage = wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC;
    let up = g.dev.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: true });
    for t in THREADS {
        let s = best(|| {
            let n = len.div_ceil(t).next_multiple_of(4096);
            std::thread::scope(|sc| {
                for a in (0..len).step_by(n) {
                    let (b, up) = ((a + n).min(len), &up);
                    sc.spawn(move || up.slice(a as u64..b as u64).get_mapped_range_mut().expect("mapped").copy_from_slice(&src[a..b]));
                }
            });
        });
        println!("host -> MAP_WRITE buffer, {t:2} threads: {}", gbps(len, s));
    }
    up.unmap();
    println!("GPU copy MAP_WRITE buffer -> device:   {}", gbps(len, best(|| { gpu_copy(&g.dev, &g.q, &up, 0, device, 0, size); wait(&g.dev) })));
    let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
    let down = g.dev.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
    println!("GPU copy device -> MAP_READ buffer:    {}", gbps(len, best(|| { gpu_copy(&g.dev, &g.q, device, 0, &down, 0, size); wait(&g.dev) })));
    down.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    wait(&g.dev);
    let view = down.get_mapped_range(..).expect("mapped");
    for t in THREADS {
        println!("MAP_READ buffer -> host, {t:2} threads:  {}", gbps(len, best(|| par_copy(dst, &view, t))));
    }
}

fn host_memory_paths(g: &Gpu, src: &[u8], dst: &mut [u8], device: &wgpu::Buffer) {
    let len = src.len();
    let size = len as u64;
    for (name, cached, local) in [("host-cached", true, false), ("host-uncached", false, false), ("device (BAR)", false, true)] {
        let Some((buf, ptr)) = raw_buffer(g, size, cached, local) else {
            println!("{name}: no such memory type");
            continue;
        };
        // SAFETY: `ptr` maps all `len` bytes of `buf`, which lives until the end of this loop.
        let mapped = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        for t in THREADS {
            println!("host -> {name}, {t:2} threads: {}", gbps(len, best(|| par_copy(mapped, src, t))));
        }
        println!("GPU copy {name} -> device: {}", gbps(len, best(|| { gpu_copy(&g.dev, &g.q, &buf, 0, device, 0, size); wait(&g.dev) })));
        println!("GPU copy device -> {name}: {}", gbps(len, best(|| { gpu_copy(&g.dev, &g.q, device, 0, &buf, 0, size); wait(&g.dev) })));
        if !local {
            for t in [4, 8, 16] {
                println!("{name} -> host, {t} threads: {}", gbps(len, best(|| par_copy(dst, mapped, t))));
            }
        }
        // The host fills 4 MiB chunks on `t` threads; each is copied as soon as it is full.
        const CHUNK: usize = 4 << 20;
        for t in [4, 8, 16] {
            let s = best(|| {
                let n = len.div_ceil(CHUNK);
                let (tx, rx) = std::sync::mpsc::channel::<usize>();
                let at = ptr as usize;
                std::thread::scope(|sc| {
                    for k in 0..t {
                        let tx = tx.clone();
                        sc.spawn(move || {
                            for i in (k..n).step_by(t) {
                                let (a, b) = (i * CHUNK, ((i + 1) * CHUNK).min(len));
                                // SAFETY: chunk i of the mapping, written by this thread only.
                                let to = unsafe { std::slice::from_raw_parts_mut((at as *mut u8).add(a), b - a) };
                                to.copy_from_slice(&src[a..b]);
                                tx.send(i).expect("receiver");
                            }
                        });
                    }
                    drop(tx);
                    for i in rx {
                        let (a, b) = ((i * CHUNK) as u64, ((i + 1) * CHUNK).min(len) as u64);
                        gpu_copy(&g.dev, &g.q, &buf, a, device, a, b - a);
                    }
                });
                wait(&g.dev);
            });
            println!("host -> {name} -> device, pipelined, {t} threads: {}", gbps(len, s));
        }
    }
}

fn import_paths(g: &Gpu, len: usize, device: &wgpu::Buffer) {
    for touched in [true, false] {
        let mut host: Vec<u8> = Vec::with_capacity(len + 64);
        if touched {
            host.resize(len + 64, 3);
        }
        // numpy's data pointers sit a few bytes into their first page.
        let ptr = host.as_ptr().wrapping_add(16);
        let t = Instant::now();
        let (buf, off) = match import(g, ptr, len) {
            Ok(v) => v,
            Err(e) => {
                println!("import: {e}");
                return;
            }
        };
        let t_import = t.elapsed().as_secs_f64();
        let up = best(|| { gpu_copy(&g.dev, &g.q, &buf, off & !3, device, 0, len as u64); wait(&g.dev) });
        let down = best(|| { gpu_copy(&g.dev, &g.q, device, 0, &buf, off & !3, len as u64); wait(&g.dev) });
        let t = Instant::now();
        drop(buf);
        wait(&g.dev);
        let t_release = t.elapsed().as_secs_f64();
        let pages = if touched { "touched pages" } else { "fresh pages" };
        println!(
            "imported host array ({pages}): import {:.3} ms, GPU copy up {}, down {}, release {:.3} ms",
            t_import * 1e3, gbps(len, up), gbps(len, down), t_release * 1e3
        );
        std::hint::black_box(&host);
    }
}

fn main() {
    // `cargo bench` passes harness flags (e.g. --bench); nothing here takes arguments.
    let g = open();
    let sizes: Vec<usize> = std::env::var("COPY_PATHS_MIB")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![9, 64, 236]);
    println!("cores: {}", std::thread::available_parallelism().map_or(1, |n| n.get()));
    for mib in sizes {
        let len = mib << 20;
        println!("\n== {mib} MiB");
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        let mut dst = vec![1u8; len];
        for t in THREADS {
            println!("host -> host, {t:2} threads: {}", gbps(len, best(|| par_copy(&mut dst, &src, t))));
        }
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let device = g.dev.create_buffer(&wgpu::BufferDescriptor { label: None, size: len as u64, usage, mapped_at_creation: false });
        staged_paths(&g, &src, &mut dst, &device);
        host_memory_paths(&g, &src, &mut dst, &device);
        import_paths(&g, len, &device);
    }
}
