//! Waiting for the GPU, safely from any number of threads at once.
//!
//! A wait first polls for up to the engine's spin time (`device::spin_time`: a lone caller
//! wakes at once instead of late on a slowed core), then blocks on the driver's fence.
//!
//! The polling never asks wgpu to wait for a submission with no time left: wgpu-core 30's
//! `Device::maintain` reads the fence once and asserts, when the queue is empty, that the
//! value it read covers the index waited for; another thread's maintenance (every
//! `Queue::submit` runs one) can empty the queue in between, and the assertion panics.
//! Polls here are `PollType::Poll`, which waits for nothing and asserts nothing; completion
//! comes from a callback (a work-done callback, or a mapping's own), which the poll that
//! sees the work finish runs, on whichever thread polled. One thread polls at a time; the
//! others watch their own flags. A blocking wait reads the fence only after the wait has
//! succeeded, so it cannot trip the assertion.
//!
//! Polling pays only for a lone waiter: where other threads already wait, a wait blocks at
//! once. Threads that spin beside a poller take CPU and device locks from the threads
//! that are submitting work, and with several calls queued the GPU is busy anyway.

use crate::device::Engine;
use crate::error::{Error, Result};
use crate::pool::PooledBuffer;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long one wait for the GPU may take before the call gives up with an error.
pub const GPU_WAIT: Duration = Duration::from_secs(600);

/// Waits left before a test's injected panic (`support::inject_panic`); 0: none.
static PANIC_IN: AtomicU32 = AtomicU32::new(0);

pub fn inject_panic(n: u32) {
    PANIC_IN.store(n, Ordering::SeqCst);
}

/// Panics if a test asked for it at this wait.
fn injected_panic() {
    let fire = PANIC_IN.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok_and(|n| n == 1);
    if fire {
        panic!("a panic injected by a test (convtune._convtune._inject_panic)");
    }
}

/// A submission, and the flag its work-done callback sets (none where waits never poll).
pub struct Submitted {
    pub idx: wgpu::SubmissionIndex,
    done: Option<Arc<AtomicBool>>,
}

/// Runs `f` inside out-of-memory and validation error scopes (per thread, so every copy
/// thread opens its own) and turns what they caught into an error.
pub fn scoped<T>(engine: &Engine, f: impl FnOnce() -> T) -> Result<T> {
    let oom = engine.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let val = engine.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let out = f();
    let val_err = pollster::block_on(val.pop());
    let oom_err = pollster::block_on(oom.pop());
    if let Some(e) = oom_err {
        return Err(Error::OutOfMemory(e.to_string()));
    }
    if let Some(e) = val_err {
        return Err(Error::from(e));
    }
    Ok(out)
}

/// Submits `commands`, with what other threads submit at the same moment (`submit`), and
/// asks to be told when they are done: the callback, asked for right after the submission,
/// fires once it (and anything submitted before it) is done. A GPU error at submission is
/// caught on the submitting thread and is the error of every call the submission carried.
pub fn submit(engine: &Engine, commands: impl IntoIterator<Item = wgpu::CommandBuffer>) -> Result<Submitted> {
    let (idx, done) = engine
        .submits
        .submit(commands, |all| {
            scoped(engine, || (engine.queue.submit(all), (!engine.spin.is_zero()).then(|| work_done_flag(engine))))
                .map_err(|e| format!("GPU error at submission: {e}"))
        })
        .map_err(Error::Gpu)?;
    Ok(Submitted { idx, done })
}

/// A flag set once all work submitted so far is done.
fn work_done_flag(engine: &Engine) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    engine.queue.on_submitted_work_done(move || flag.store(true, Ordering::Release));
    done
}

/// Waits for `s` to finish, bounded so a hung GPU gives an error.
pub fn wait(engine: &Engine, s: &Submitted) -> Result<()> {
    settle(engine, s.done.as_deref(), Some(s.idx.clone()))
}

/// Waits for all work submitted so far.
pub fn wait_all(engine: &Engine) -> Result<()> {
    let done = (!engine.spin.is_zero()).then(|| work_done_flag(engine));
    settle(engine, done.as_deref(), None)
}

/// Polls until `done` is set (where there is a flag to poll for), else blocks on the fence
/// until `idx` (or all work) is done.
fn settle(engine: &Engine, done: Option<&AtomicBool>, idx: Option<wgpu::SubmissionIndex>) -> Result<()> {
    entered(engine)?;
    let waiting = Waiting::enter(engine);
    if let Some(done) = done.filter(|_| waiting.alone) {
        if spin(engine, || done.load(Ordering::Acquire))? {
            return Ok(());
        }
    }
    block(engine, idx)
}

/// What every wait checks first: that this process may use the device, and a test's
/// injected panic.
fn entered(engine: &Engine) -> Result<()> {
    engine.check_process()?;
    injected_panic();
    Ok(())
}

/// A thread's presence among the waiters (`Engine::waiting`) while it waits.
struct Waiting<'a> {
    engine: &'a Engine,
    /// No other thread was waiting when this one began.
    alone: bool,
}

impl<'a> Waiting<'a> {
    fn enter(engine: &'a Engine) -> Self {
        let before = engine.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting { engine, alone: before == 0 }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.engine.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Polls while `ready` says no, for up to the engine's spin time; whether it said yes.
pub fn spin(engine: &Engine, ready: impl Fn() -> bool) -> Result<bool> {
    let start = Instant::now();
    loop {
        if let Ok(_one_poller) = engine.poller.try_lock() {
            engine.device.poll(wgpu::PollType::Poll).map_err(|e| Error::DeviceLost(e.to_string()))?;
        }
        if ready() {
            return Ok(true);
        }
        if start.elapsed() >= engine.spin {
            return Ok(false);
        }
        std::thread::yield_now();
    }
}

/// Blocks on the fence until `idx` (or all work) is done.
pub fn block(engine: &Engine, idx: Option<wgpu::SubmissionIndex>) -> Result<()> {
    engine
        .device
        .poll(wgpu::PollType::Wait { submission_index: idx, timeout: Some(GPU_WAIT) })
        .map(|_| ())
        .map_err(|e| match e {
            wgpu::PollError::Timeout => Error::Gpu(format!("the GPU did not finish within {} s", GPU_WAIT.as_secs())),
            other => Error::DeviceLost(other.to_string()),
        })
}

/// The outcome of a buffer mapping, set by its callback on whichever thread polled.
pub struct Landing {
    result: Mutex<Option<std::result::Result<(), wgpu::BufferAsyncError>>>,
    set: Condvar,
}

impl Landing {
    /// Maps `..bytes` of the read-back buffer `staging` once its copy is done; the landing
    /// receives the mapping's outcome.
    pub fn map_read(staging: &PooledBuffer, bytes: u64) -> Arc<Landing> {
        let landing = Arc::new(Landing { result: Mutex::new(None), set: Condvar::new() });
        let on_map = landing.clone();
        staging.map_read(bytes, move |r| on_map.land(r));
        landing
    }

    /// The callback's half: records `r` and wakes the waiter.
    fn land(&self, r: std::result::Result<(), wgpu::BufferAsyncError>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.set.notify_all();
    }

    fn landed(&self) -> bool {
        self.result.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Waits for the mapping of a read-back whose copy is submission `idx`: polls until its
    /// callback runs, else blocks on the fence, then for the callback (another thread's
    /// poll may be running it).
    pub fn wait(&self, engine: &Engine, idx: wgpu::SubmissionIndex) -> Result<()> {
        entered(engine)?;
        let waiting = Waiting::enter(engine);
        if engine.spin.is_zero() || !waiting.alone || !spin(engine, || self.landed())? {
            block(engine, Some(idx))?;
        }
        let guard = self.result.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self
            .set
            .wait_timeout_while(guard, GPU_WAIT, |r| r.is_none())
            .unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            None => Err(Error::Gpu("read-back of the output never completed".into())),
            Some(Err(e)) => Err(Error::Gpu(format!("mapping the output failed: {e}"))),
            Some(Ok(())) => Ok(()),
        }
    }
}
