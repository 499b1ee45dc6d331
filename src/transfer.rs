//! Host <-> GPU copies of float32 tensors through mapped staging buffers from the pool.
//!
//! A transfer is cut into chunks, each with its own staging buffer. Uploads fill chunks on
//! the copy threads (a pool kept for the process) while the GPU copies earlier ones, or,
//! under `PIECEWISE_MAX`, fill one chunk per thread and copy them with one submission;
//! read-backs wait for their chunks in order on the calling thread and the copy threads
//! empty them (see `Download::finish`). Small transfers run on the calling thread.
//!
//! On the host side a tensor is a list of runs `(offset, len)` in elements of a host array;
//! on the GPU side the runs lie back to back from offset 0 (row bands of a split problem).

use crate::dtype::{finite_abs_max, Elem};
use crate::device::Engine;
use crate::error::{no_panic, Error, Result};
use crate::pool::{PooledBuffer, DOWNLOAD, UPLOAD};
use crate::settings::env_usize;
use std::cell::OnceCell;
use std::sync::atomic::{AtomicU32, Ordering};
use crate::wait::{scoped, wait_all, Landing};
use std::sync::{Arc, Mutex, OnceLock};

/// KiB per chunk by default (4 MiB): large enough that a chunk's submission (tens of
/// microseconds) is small against its copy, small enough that a 10 MB tensor still spreads
/// over a few threads.
const CHUNK_KB: usize = 4096;

/// Bytes one host copy job moves between mapped memory and a host array.
const COPY_PIECE: u64 = 512 << 10;

/// Uploads up to this many bytes are cut into one chunk per copy thread (at least
/// `COPY_PIECE` bytes each), written at once and copied with one submission: the host copy is
/// what takes the time (8.8 MB took 0.89 ms on an H100 machine in 4 MiB chunks, one thread
/// each, against 0.16 ms for the GPU's copy). Larger ones go in `CHUNK_KB` chunks, each
/// chunk's copy submitted as soon as it is written, so the GPU copies while the host writes.
const PIECEWISE_MAX: u64 = 16 << 20;

/// Uploads up to this many bytes (one contiguous run) go through `Queue::write_buffer`.
const WRITE_NOW_MAX: u64 = 2 * COPY_PIECE;

/// Elements a copy with a max fold moves before folding them, so they are folded while in
/// the first-level cache.
const FOLD_BLOCK: usize = 4096;

/// Where an upload folds the largest finite |v| it copies (`finite_abs_max`, as float32
/// bits), for kernels that scale float32 inputs by it: the copy threads read every element
/// anyway, where the GPU's max pass would read the tensor again.
pub type MaxFold<'a> = Option<&'a AtomicU32>;

/// Host threads for chunked copies (`CONVTUNE_COPY_THREADS`, read once): half the cores, at
/// most 8. Memory bandwidth stops growing well before that on most transfers, and on a CPU
/// adapter the other half runs the device's own copies.
fn max_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| env_usize("CONVTUNE_COPY_THREADS").unwrap_or((cores() / 2).clamp(1, 8)))
}

/// Threads for transfers of `WIDE_BYTES` or more (`CONVTUNE_COPY_THREADS` sets both): every
/// core, at most 16.
fn wide_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| env_usize("CONVTUNE_COPY_THREADS").unwrap_or(cores().clamp(1, 16)).max(max_threads()))
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Bytes from which one transfer runs on `wide_threads()`: on the H100 machine (16 cores)
/// the EDSR tail's 236 MB upload, with its result's pages touched alongside, took 7.5 ms on
/// 16 threads against 8.3 on 8, and touching a 411 MB result beside a 19 MB upload 14 ms
/// against 19-20; a 103 MB upload gained nothing, and calls moving a few MB lost 0.2-0.4 ms
/// to the busier cores.
const WIDE_BYTES: u64 = 128 << 20;

/// The copy threads a transfer of `bytes` runs on (one of the two pool sizes).
fn crew(bytes: u64) -> usize {
    if bytes >= WIDE_BYTES { wide_threads() } else { max_threads() }
}

/// Elements per chunk (`CONVTUNE_COPY_CHUNK_KB`, read once; tests make it tiny).
fn chunk_elems() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| env_usize("CONVTUNE_COPY_CHUNK_KB").unwrap_or(CHUNK_KB).min(1 << 30) << 8)
}

/// Bytes that `elems` elements of `T` take in a copy: whole 4-byte words, as buffer copies
/// need (a float16 chunk of odd length copies one pad half past its end; buffers are sized
/// in whole words, see `DType::buffer_bytes`).
fn copy_bytes<T: Elem>(elems: usize) -> u64 {
    T::DTYPE.buffer_bytes(elems as u64)
}

/// One chunk: GPU-side elements `start..start + len`, and the host runs they map to as
/// (host offset, offset within the chunk, len).
#[derive(Clone, Debug, PartialEq)]
struct Chunk {
    start: usize,
    len: usize,
    parts: Vec<(usize, usize, usize)>,
}

/// Cuts `runs` (laid back to back on the GPU) into chunks of at most `chunk` elements.
fn chunks(runs: &[(usize, usize)], chunk: usize) -> Vec<Chunk> {
    let total: usize = runs.iter().map(|r| r.1).sum();
    let mut out: Vec<Chunk> = (0..total.div_ceil(chunk))
        .map(|i| Chunk { start: i * chunk, len: chunk.min(total - i * chunk), parts: Vec::new() })
        .collect();
    let mut gpu = 0;
    for &(host, len) in runs {
        let mut done = 0;
        while done < len {
            let c = &mut out[(gpu + done) / chunk];
            let within = gpu + done - c.start;
            let n = (c.len - within).min(len - done);
            c.parts.push((host + done, within, n));
            done += n;
        }
        gpu += len;
    }
    out
}

/// A pool of `threads` copy threads (`crew`'s sizes), started once per process and kept,
/// since starting them for each call cost about 0.1 ms (eight threads) on a short call. A
/// forked child, which has none of its parent's threads, starts its own. `None` where the
/// system would not start them: copies then run on the calling thread.
fn copy_pool(threads: usize) -> Option<Arc<rayon::ThreadPool>> {
    type Pools = Vec<(usize, Arc<rayon::ThreadPool>)>;
    static POOLS: Mutex<Option<(u32, Pools)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_some_and(|(owner, _)| *owner != pid) {
        // The parent's pools: their threads are not in this process, and dropping them
        // would wait on them.
        std::mem::forget(slot.take());
    }
    let (_, pools) = slot.get_or_insert_with(|| (pid, Vec::new()));
    if let Some((_, pool)) = pools.iter().find(|(n, _)| *n == threads) {
        return Some(pool.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("convtune-copy-{i}"))
        .build()
        .ok()
        .map(Arc::new)?;
    pools.push((threads, pool.clone()));
    Some(pool)
}

/// `f`, with a panic on a copy thread turned into an error.
fn unless_panicked<R>(f: impl FnOnce() -> R) -> Result<R> {
    no_panic(|| "a copy thread".into(), || Ok(f()))
}

/// Runs `work` on every chunk index, spread over up to `max_threads()` copy threads
/// (thread t takes chunks t, t + T, ...: early chunks finish first, so the GPU's copies
/// start early). The first error wins.
fn spread<T: Send>(n: usize, work: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
    spread_over(max_threads(), n, work)
}

/// `spread` over a pool of `threads` copy threads.
fn spread_over<T: Send>(threads: usize, n: usize, work: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
    let pool_size = threads;
    let threads = threads.min(n);
    let Some(pool) = (threads > 1).then(|| copy_pool(pool_size)).flatten() else {
        return (0..n).map(&work).collect();
    };
    let slots: Vec<Mutex<Option<Result<T>>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let (work, slots_ref) = (&work, &slots);
    unless_panicked(|| {
        pool.scope(|s| {
            for t in 0..threads {
                s.spawn(move |_| {
                    for i in (t..n).step_by(threads) {
                        let r = work(i);
                        let failed = r.is_err();
                        *slots_ref[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                        // A thread stops at its first error; its later slots stay empty and
                        // come after that error in index order.
                        if failed {
                            break;
                        }
                    }
                });
            }
        })
    })?;
    slots
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(|| Err(Error::Gpu("a copy job never ran".into()))))
        .collect()
}

/// Copies `runs` of `src` into `dst` (back to back from offset 0) through mapped staging
/// buffers, one per chunk (see `PIECEWISE_MAX` for the two ways they are filled). Returns the staging
/// buffers: keep them until a wait has covered these submissions, so that the pool gets
/// them back mapped (dropped earlier they are freed instead, which is safe but slower).
pub fn upload<T: Elem>(engine: &Engine, dst: &wgpu::Buffer, src: &[T], runs: &[(usize, usize)], max: MaxFold<'_>) -> Result<Vec<PooledBuffer>> {
    let plan = chunks(runs, chunk_elems());
    let bytes = copy_bytes::<T>(runs.iter().map(|r| r.1).sum());
    if let [c] = plan.as_slice() {
        if let [(host, 0, n)] = c.parts.as_slice() {
            let data = &src[*host..*host + *n];
            if bytes <= WRITE_NOW_MAX && write_now(engine, dst, c.start, data)? {
                if let Some(m) = max {
                    m.fetch_max(finite_abs_max(data), Ordering::Relaxed);
                }
                return Ok(Vec::new());
            }
        }
    }
    if bytes <= PIECEWISE_MAX {
        return upload_pieces(engine, dst, src, runs, max);
    }
    spread_over(crew(bytes), plan.len(), |i| upload_chunk(engine, dst, src, &plan[i], max))
}

/// Elements per chunk when `runs` are cut into one chunk per copy thread: at least
/// `COPY_PIECE` bytes, and a whole multiple of 1024 elements, so that every chunk starts
/// where GPU copies (4 bytes) and mapped ranges (8 bytes) may start for any element size (a
/// float16 chunk of odd length put the next one's copy at a misaligned offset).
fn per_thread<T>(runs: &[(usize, usize)], threads: usize) -> usize {
    let total: usize = runs.iter().map(|r| r.1).sum();
    let piece = COPY_PIECE as usize / std::mem::size_of::<T>();
    total.div_ceil(threads).next_multiple_of(1024).max(piece)
}

/// Writes the staging buffers of chunks small enough for every copy thread to get one
/// (at least `COPY_PIECE` bytes each), then submits all their GPU copies together.
fn upload_pieces<T: Elem>(engine: &Engine, dst: &wgpu::Buffer, src: &[T], runs: &[(usize, usize)], max: MaxFold<'_>) -> Result<Vec<PooledBuffer>> {
    let plan = chunks(runs, per_thread::<T>(runs, max_threads()).min(chunk_elems()));
    let staging = spread(plan.len(), |i| fill_chunk(engine, src, &plan[i], max))?;
    scoped(engine, || {
        let mut enc = engine.device.create_command_encoder(&Default::default());
        for (b, c) in staging.iter().zip(&plan) {
            enc.copy_buffer_to_buffer(b, 0, dst, (c.start * std::mem::size_of::<T>()) as u64, copy_bytes::<T>(c.len));
        }
        engine.queue.submit([enc.finish()]);
    })?;
    for b in &staging {
        b.remap_upload();
    }
    Ok(staging)
}

/// A small contiguous upload through `Queue::write_buffer`: wgpu stages it and copies it
/// ahead of the next submission (the kernel's), so it costs no submission and no wait of
/// its own; a call on short kernels made several (0.1-0.3 ms each on an H100). `false`
/// where the bytes are not whole 4-byte words (an odd float16 count): the caller stages it.
fn write_now<T: Elem>(engine: &Engine, dst: &wgpu::Buffer, start: usize, data: &[T]) -> Result<bool> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    if bytes.len() % wgpu::COPY_BUFFER_ALIGNMENT as usize != 0 {
        return Ok(false);
    }
    scoped(engine, || engine.queue.write_buffer(dst, (start * std::mem::size_of::<T>()) as u64, bytes))?;
    Ok(true)
}

/// A staging buffer holding chunk `c` of `src`, unmapped for its GPU copy.
fn fill_chunk<T: Elem>(engine: &Engine, src: &[T], c: &Chunk, max: MaxFold<'_>) -> Result<PooledBuffer> {
    let bytes = copy_bytes::<T>(c.len);
    let staging = engine.pool.take(UPLOAD, bytes)?;
    write_parts(&staging, 0, src, c, max)?;
    staging.unmap();
    Ok(staging)
}

/// Writes chunk `c` of `src` into the mapped bytes of `buf` from `offset` on, folding the
/// largest finite |v| into `max` where asked.
fn write_parts<T: Elem>(buf: &wgpu::Buffer, offset: u64, src: &[T], c: &Chunk, max: MaxFold<'_>) -> Result<()> {
    let size = std::mem::size_of::<T>();
    let mut view = buf
        .slice(offset..offset + copy_bytes::<T>(c.len))
        .get_mapped_range_mut()
        .map_err(|e| Error::Gpu(format!("writing a mapped buffer failed: {e}")))?;
    let mut largest = 0;
    for &(host, within, n) in &c.parts {
        let part = &src[host..host + n];
        if max.is_none() {
            view.slice(within * size..(within + n) * size).copy_from_slice(bytemuck::cast_slice(part));
            continue;
        }
        for (i, block) in part.chunks(FOLD_BLOCK).enumerate() {
            let at = (within + i * FOLD_BLOCK) * size;
            view.slice(at..at + std::mem::size_of_val(block)).copy_from_slice(bytemuck::cast_slice(block));
            largest = largest.max(finite_abs_max(block));
        }
    }
    if let Some(m) = max {
        m.fetch_max(largest, Ordering::Relaxed);
    }
    Ok(())
}

/// Writes `runs` of `src` straight into `dst`, back to back from offset 0, spread over the
/// copy threads, and unmaps it for the kernels: `dst` is a pooled buffer of device memory
/// the host maps (`pool::INPUT_MAPPED`, see `Engine::direct_inputs`), so there is no staging
/// buffer and no GPU copy. Call `remap_upload` on it once the submissions reading it are
/// queued.
pub fn write_direct<T: Elem>(dst: &PooledBuffer, src: &[T], runs: &[(usize, usize)], max: MaxFold<'_>) -> Result<()> {
    let threads = crew(copy_bytes::<T>(runs.iter().map(|r| r.1).sum()));
    let plan = chunks(runs, per_thread::<T>(runs, threads));
    let size = std::mem::size_of::<T>() as u64;
    spread_over(threads, plan.len(), |i| write_parts(dst, plan[i].start as u64 * size, src, &plan[i], max))?;
    dst.unmap();
    Ok(())
}

fn upload_chunk<T: Elem>(engine: &Engine, dst: &wgpu::Buffer, src: &[T], c: &Chunk, max: MaxFold<'_>) -> Result<PooledBuffer> {
    let size = std::mem::size_of::<T>();
    let bytes = copy_bytes::<T>(c.len);
    let staging = fill_chunk(engine, src, c, max)?;
    scoped(engine, || {
        let mut enc = engine.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&staging, 0, dst, (c.start * size) as u64, bytes);
        engine.queue.submit([enc.finish()]);
    })?;
    staging.remap_upload();
    Ok(staging)
}

/// `upload` of a whole slice, for buffers filled outside a conv2d: waits for the GPU's copies
/// where they went through pooled staging buffers, so that the pool gets them back mapped. A
/// small upload that `Queue::write_buffer` took needs no wait (wgpu copies it ahead of the
/// next submission, whoever makes it): waiting there also waited for every other thread's
/// work in flight.
pub fn upload_now<T: Elem>(engine: &Engine, dst: &wgpu::Buffer, src: &[T], max: MaxFold<'_>) -> Result<()> {
    let staging = upload(engine, dst, src, &[(0, src.len())], max)?;
    if !staging.is_empty() {
        wait_all(engine)?;
    }
    drop(staging);
    Ok(())
}

/// Outputs larger than this get their pages touched before the read-back (`prefault`):
/// glibc's largest mmap threshold. Smaller arrays come from the heap, mostly in pages an
/// earlier array left mapped; larger ones are fresh mappings whose every page faults at
/// its first write (59 MB took 5.3 ms to read back into a fresh array on an H100 machine
/// and 1.5 ms into touched pages; touching cost 0.05-0.1 ms where pages were mapped already).
const PREFAULT_MIN: usize = 32 << 20;

/// Whether `prefault` does anything for `out`.
pub fn worth_prefaulting<T>(out: &[T]) -> bool {
    std::mem::size_of_val(out) > PREFAULT_MIN
}

/// Writes one byte of every page of a large `out` on the copy threads, so that the
/// read-back's copies land in pages already there: done beside the upload, the page faults
/// of a fresh array are off the read-back's path.
pub fn prefault<T: Elem>(out: &mut [T]) {
    if !worth_prefaulting(out) {
        return;
    }
    let bytes = bytemuck::cast_slice_mut::<T, u8>(out);
    // Beside an upload (`alongside`) it shares the upload's pool, whatever its size.
    if rayon::current_thread_index().is_some() {
        return touch_pages(bytes);
    }
    if let Some(pool) = copy_pool(max_threads()) {
        pool.install(|| touch_pages(bytes));
    }
}

/// Writes one byte of every page of `bytes`, in parallel on the current pool.
fn touch_pages(bytes: &mut [u8]) {
    use rayon::prelude::*;
    const PAGE: usize = 4096;
    bytes.par_chunks_mut(COPY_PIECE as usize).for_each(|c| {
        for i in (0..c.len()).step_by(PAGE) {
            // Volatile: the write must happen now, though the read-back overwrites it.
            // SAFETY: `i` is within `c`.
            unsafe { std::ptr::write_volatile(c.as_mut_ptr().add(i), 0) };
        }
    });
}

/// Runs `a` and `b` at once on the copy threads of a transfer of `bytes` (one after the
/// other here where there are none), and returns what `a` returns.
pub fn alongside<A: Send>(bytes: u64, a: impl FnOnce() -> A + Send, b: impl FnOnce() + Send) -> A {
    match copy_pool(crew(bytes)) {
        Some(pool) => pool.join(a, b).0,
        None => {
            b();
            a()
        }
    }
}

/// A disjoint piece of the host output and where its elements sit in a chunk.
struct Dest<'a, T> {
    within: usize,
    out: &'a mut [T],
}

impl<T> Dest<'_, T> {
    /// The bytes of its chunk's mapped `view` that it receives.
    fn source<'v>(&self, view: &'v [u8]) -> &'v [u8] {
        let size = std::mem::size_of::<T>();
        &view[self.within * size..(self.within + self.out.len()) * size]
    }
}

/// The mapped bytes of a read-back chunk.
fn view_of(staging: &PooledBuffer, bytes: u64) -> Result<wgpu::BufferView> {
    staging.get_mapped_range(..bytes).map_err(|e| Error::Gpu(format!("mapping the output failed: {e}")))
}

/// Carves `out` into the pieces the chunks fill, each a separate `&mut` (chunk parts
/// cover disjoint host ranges, in increasing order when the runs are).
fn carve<'a, T>(plan: &[Chunk], out: &'a mut [T]) -> Result<Vec<Vec<Dest<'a, T>>>> {
    let mut parts: Vec<(usize, usize, usize, usize)> = plan
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.parts.iter().map(move |&(host, within, n)| (host, i, within, n)))
        .collect();
    parts.sort_unstable_by_key(|p| p.0);
    let mut per_chunk: Vec<Vec<Dest<'a, T>>> = (0..plan.len()).map(|_| Vec::new()).collect();
    let mut rest = out;
    let mut at = 0;
    for (host, chunk, within, n) in parts {
        if host < at || host + n > at + rest.len() {
            return Err(Error::invalid("read-back runs overlap or leave the output"));
        }
        let tail = std::mem::take(&mut rest).split_at_mut(host - at).1;
        let (piece, tail) = tail.split_at_mut(n);
        rest = tail;
        at = host + n;
        per_chunk[chunk].push(Dest { within, out: piece });
    }
    Ok(per_chunk)
}

/// Copies `src` (back to back from offset 0) into `runs` of `out`: `start_download`, then
/// `Download::finish`.
pub fn download<T: Elem>(engine: &Engine, src: &wgpu::Buffer, out: &mut [T], runs: &[(usize, usize)]) -> Result<()> {
    start_download::<T>(engine, src, runs)?.finish(engine, out)
}

/// A read-back whose GPU copies are queued.
pub struct Download<T> {
    plan: Vec<Chunk>,
    pending: Vec<Pending>,
    elem: std::marker::PhantomData<T>,
}

/// Queues the GPU copies of every chunk of `src` (laid out as `runs` on the host), each
/// with its own staging buffer, submission and mapping. Queued right behind a kernel, they
/// start as soon as it ends, without a round trip through the host.
pub fn start_download<T: Elem>(engine: &Engine, src: &wgpu::Buffer, runs: &[(usize, usize)]) -> Result<Download<T>> {
    let plan = chunks(runs, chunk_elems());
    let pending = plan.iter().map(|c| submit_download::<T>(engine, src, c)).collect::<Result<_>>()?;
    Ok(Download { plan, pending, elem: std::marker::PhantomData })
}

/// A read-back whose first chunk's copy is recorded into a kernel's own command encoder
/// (`stage_download`): a small call then makes one submission instead of two, and each
/// submission takes the queue's locks and runs its maintenance.
pub struct Staged<T> {
    plan: Vec<Chunk>,
    first: Option<(PooledBuffer, u64)>,
    elem: std::marker::PhantomData<T>,
}

/// Records the copy of `src`'s first chunk (laid out as `runs` on the host) into `enc`;
/// `Staged::start` queues the others once `enc`'s submission is made.
pub fn stage_download<T: Elem>(engine: &Engine, src: &wgpu::Buffer, runs: &[(usize, usize)], enc: &mut wgpu::CommandEncoder) -> Result<Staged<T>> {
    let plan = chunks(runs, chunk_elems());
    let first = match plan.first() {
        Some(c) => {
            let bytes = copy_bytes::<T>(c.len);
            let staging = engine.pool.take(DOWNLOAD, bytes)?;
            enc.copy_buffer_to_buffer(src, (c.start * std::mem::size_of::<T>()) as u64, &staging, 0, bytes);
            Some((staging, bytes))
        }
        None => None,
    };
    Ok(Staged { plan, first, elem: std::marker::PhantomData })
}

impl<T: Elem> Staged<T> {
    /// The download, once the submission that carried the first chunk's copy is `idx`.
    pub fn start(self, engine: &Engine, src: &wgpu::Buffer, idx: wgpu::SubmissionIndex) -> Result<Download<T>> {
        let mut pending = Vec::with_capacity(self.plan.len());
        if let Some((staging, bytes)) = self.first {
            let landing = Landing::map_read(&staging, bytes);
            pending.push(Pending { staging, bytes, idx, landing });
        }
        for c in self.plan.iter().skip(1) {
            pending.push(submit_download::<T>(engine, src, c)?);
        }
        Ok(Download { plan: self.plan, pending, elem: std::marker::PhantomData })
    }
}

impl<T: Elem> Download<T> {
    /// Waits for the chunks in order on this thread and hands each, once mapped, to copy
    /// threads in pieces of `COPY_PIECE` bytes, which fill `out` while later chunks land.
    /// Only this thread polls the device: with several threads each polling for its own
    /// chunk, a 24 MB read-back on an H100 took 10.8 ms instead of 2.5. The copies run on
    /// several threads because one thread writing fresh numpy pages managed 3.5 GB/s there
    /// (59 MB in 16.7 ms), and in pieces because a chunk copied by one thread left a short
    /// call waiting on it (0.6 ms for a 6.4 MB output in two chunks).
    pub fn finish(self, engine: &Engine, out: &mut [T]) -> Result<()> {
        let dests = carve(&self.plan, out)?;
        let bytes: u64 = self.pending.iter().map(|p| p.bytes).sum();
        let crew = crew(bytes);
        let threads = crew.min(bytes.div_ceil(COPY_PIECE) as usize);
        let Some(pool) = (threads > 1).then(|| copy_pool(crew)).flatten() else {
            return self.finish_here(engine, dests);
        };
        let size = std::mem::size_of::<T>();
        let piece = (COPY_PIECE as usize / size).max(1);
        // Mapped views, set as their chunks land and kept until the copies are done.
        let views: Vec<OnceCell<wgpu::BufferView>> = self.pending.iter().map(|_| OnceCell::new()).collect();
        // This thread waits for the chunks in order and hands out their pieces; waiting stops
        // at the first error, and the scope ends once the pieces handed out are copied.
        let result = unless_panicked(|| {
            pool.in_place_scope(|s| {
                self.pending.iter().zip(dests).zip(&views).try_for_each(|((p, d), slot)| -> Result<()> {
                    p.landing.wait(engine, p.idx.clone())?;
                    let view = view_of(&p.staging, p.bytes)?;
                    let src: &[u8] = slot.get_or_init(|| view);
                    for dest in d {
                        let from = dest.source(src);
                        for (to, from) in dest.out.chunks_mut(piece).zip(from.chunks(piece * size)) {
                            s.spawn(move |_| bytemuck::cast_slice_mut::<T, u8>(to).copy_from_slice(from));
                        }
                    }
                    Ok(())
                })
            })
        })
        .and_then(|r| r);
        // Only chunks that were mapped (an error stops the waiting early) are unmapped.
        for (p, view) in self.pending.iter().zip(views) {
            if let Some(view) = view.into_inner() {
                drop(view);
                p.staging.unmap();
            }
        }
        result
    }
}

impl<T: Elem> Download<T> {
    /// `finish` on the calling thread alone.
    fn finish_here(self, engine: &Engine, dests: Vec<Vec<Dest<'_, T>>>) -> Result<()> {
        for (p, mut d) in self.pending.iter().zip(dests) {
            p.landing.wait(engine, p.idx.clone())?;
            copy_out(&p.staging, p.bytes, &mut d)?;
        }
        Ok(())
    }
}

/// A chunk's read-back in flight: its staging buffer, submission and mapping result.
struct Pending {
    staging: PooledBuffer,
    bytes: u64,
    idx: wgpu::SubmissionIndex,
    landing: Arc<Landing>,
}

fn submit_download<T: Elem>(engine: &Engine, src: &wgpu::Buffer, c: &Chunk) -> Result<Pending> {
    let bytes = copy_bytes::<T>(c.len);
    let staging = engine.pool.take(DOWNLOAD, bytes)?;
    // Recorded under this thread's error scopes (the submission's are the submitting
    // thread's), then submitted with other threads' read-backs and kernels.
    let commands = scoped(engine, || {
        let mut enc = engine.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, (c.start * std::mem::size_of::<T>()) as u64, &staging, 0, bytes);
        enc.finish()
    })?;
    let idx = crate::wait::submit(engine, [commands])?.idx;
    let landing = Landing::map_read(&staging, bytes);
    Ok(Pending { staging, bytes, idx, landing })
}

/// Copies a mapped chunk into its pieces of the output and unmaps it.
fn copy_out<T: Elem>(staging: &PooledBuffer, bytes: u64, dests: &mut [Dest<'_, T>]) -> Result<()> {
    {
        let view = view_of(staging, bytes)?;
        for d in dests.iter_mut() {
            let from = d.source(&view);
            bytemuck::cast_slice_mut::<T, u8>(d.out).copy_from_slice(from);
        }
    }
    staging.unmap();
    Ok(())
}

/// `download` of a whole buffer into `out`.
pub fn download_all<T: Elem>(engine: &Engine, src: &wgpu::Buffer, out: &mut [T]) -> Result<()> {
    let len = out.len();
    if len == 0 {
        return Ok(());
    }
    download(engine, src, out, &[(0, len)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_runs_in_order_without_gaps() {
        let runs = [(100, 5), (200, 7), (300, 1)];
        let plan = chunks(&runs, 4);
        assert_eq!(plan.len(), 4);
        assert_eq!(plan.iter().map(|c| c.len).sum::<usize>(), 13);
        assert_eq!(plan[0].parts, [(100, 0, 4)]);
        assert_eq!(plan[1].parts, [(104, 0, 1), (200, 1, 3)]);
        assert_eq!(plan[2].parts, [(203, 0, 4)]);
        assert_eq!(plan[3].parts, [(300, 0, 1)]);
        assert!(chunks(&[], 4).is_empty());
    }

    #[test]
    fn carving_gives_each_chunk_its_part_of_the_output() {
        let runs = [(1, 3), (6, 3)];
        let plan = chunks(&runs, 4);
        let mut out = vec![0f32; 10];
        {
            let dests = carve(&plan, &mut out).unwrap();
            assert_eq!(dests.iter().map(|d| d.len()).collect::<Vec<_>>(), [2, 1]);
            for (i, ds) in dests.into_iter().enumerate() {
                for d in ds {
                    d.out.fill((i + 1) as f32 * 10.0 + d.within as f32);
                }
            }
        }
        assert_eq!(out, [0., 10., 10., 10., 0., 0., 13., 20., 20., 0.]);
        assert!(carve(&chunks(&[(8, 3)], 4), &mut [0f32; 10]).is_err());
    }

    #[test]
    fn spread_keeps_order_and_reports_errors() {
        for threads in [1, 3, 8] {
            let v = spread_over(threads, 37, |i| Ok(i * 2)).unwrap();
            assert_eq!(v, (0..37).map(|i| i * 2).collect::<Vec<_>>());
            let failing = |i| if i % 7 == 5 { Err(Error::invalid(format!("job {i}"))) } else { Ok(i) };
            // The first failing job in index order is the error reported.
            let e = spread_over(threads, 30, failing).unwrap_err().to_string();
            assert!(e.contains("job 5"), "{threads} threads: {e}");
        }
    }

    #[test]
    fn pools_are_kept_per_size_and_share_work_with_what_runs_beside() {
        let (a, b) = (copy_pool(2).unwrap(), copy_pool(3).unwrap());
        assert!(Arc::ptr_eq(&a, &copy_pool(2).unwrap()) && !Arc::ptr_eq(&a, &b));
        assert_eq!((a.current_num_threads(), b.current_num_threads()), (2, 3));
        assert_eq!(crew(WIDE_BYTES - 1), max_threads());
        assert_eq!(crew(WIDE_BYTES), wide_threads());
        assert!(wide_threads() >= max_threads());
        // The page touching beside an upload runs on the upload's pool and reaches every page.
        let mut out = vec![f32::from_bits(0x3F80_0001); PREFAULT_MIN / 2];
        let got = alongside(WIDE_BYTES, || spread_over(wide_threads(), 5, Ok).unwrap(), || prefault(&mut out));
        assert_eq!(got, [0, 1, 2, 3, 4]);
        // Each page's first byte (an element's low byte) was zeroed.
        assert!(out.iter().step_by(1024).all(|v| v.to_bits() == 0x3F80_0000));
        assert_eq!(out[1].to_bits(), 0x3F80_0001);
    }
}
