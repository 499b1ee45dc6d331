//! Tuning in the background (`CONVTUNE_TUNE=background`): a call on a problem without a
//! tuning result runs the default rule's pick at once and queues the problem here; one
//! worker thread runs the queued jobs in order. A job starts each candidate only while no
//! convtune call of this process is running (`busy`), so neither the callers' kernels nor
//! the timings wait for each other; what a job finds is published by the job itself (to the
//! in-memory choice and the disk cache), where the next call finds it.
//!
//! The queue knows nothing of tuning: a job is a closure that takes the gate to call
//! before each candidate (its error cancels the job) and returns the winner's name.

use crate::error::{no_panic, Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A job's work: given the gate, the winner's name.
pub type Work = Box<dyn FnOnce(&mut dyn FnMut() -> Result<()>) -> Result<String> + Send>;

/// A problem waiting for the worker.
struct Job {
    /// Names the problem in status reports; jobs with the same key are queued once.
    key: String,
    work: Work,
}

/// A problem the background worker finished with.
#[derive(Clone, Debug, PartialEq)]
pub struct TuningDone {
    /// The problem: its shape label and precision mode.
    pub key: String,
    /// The winner's name, or why tuning failed (the problem stays on the default rule).
    pub outcome: std::result::Result<String, String>,
    /// Seconds from the job's start to its end, waits for quiet included.
    pub seconds: f64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    running: Option<String>,
    /// Every job finished in this process, oldest first, and how many of them `wait` has
    /// already returned.
    done: Vec<TuningDone>,
    returned: usize,
    worker: bool,
    /// Set at interpreter exit: the queue is dropped and the running job cancelled.
    stopping: bool,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Finished jobs' records kept for `status` and `wait`.
pub const DONE_KEPT: usize = 4096;
/// The process whose worker thread the state describes (0: none started). A process forked
/// after that has the state but not the thread, and maybe the lock as the fork left it:
/// it never touches either (`forked`).
static WORKER_PID: AtomicU32 = AtomicU32::new(0);

fn forked() -> bool {
    let pid = WORKER_PID.load(Ordering::SeqCst);
    pid != 0 && pid != std::process::id()
}
static CHANGED: Condvar = Condvar::new();
/// convtune calls running now (`busy`).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    f(state().get_or_insert_with(State::default))
}

/// Marks a convtune call as running until dropped: the worker starts no candidate meanwhile.
pub struct Busy(());

pub fn busy() -> Busy {
    ACTIVE.fetch_add(1, Ordering::SeqCst);
    Busy(())
}

impl Drop for Busy {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Queues a job unless one with its key is queued or running. Returns whether the worker
/// has the job (queued now or before); false in a process that is exiting or forked, or
/// where no thread could be started.
pub fn enqueue(key: String, work: Work) -> bool {
    push(key, work).is_some()
}

/// Queues a job; whether this very job was queued (false where one with its key was
/// queued or running already, or where `enqueue` would say no).
pub fn enqueue_fresh(key: String, work: Work) -> bool {
    push(key, work) == Some(true)
}

/// `enqueue`'s work: `Some(true)` if the job was queued, `Some(false)` if one with its key
/// was, `None` if none can be.
fn push(key: String, work: Work) -> Option<bool> {
    if forked() {
        return None;
    }
    let mut guard = state();
    let st = guard.get_or_insert_with(State::default);
    if st.stopping {
        return None;
    }
    if st.running.as_deref() == Some(key.as_str()) || st.queue.iter().any(|j| j.key == key) {
        return Some(false);
    }
    st.queue.push_back(Job { key, work });
    if !st.worker {
        st.worker = true;
        WORKER_PID.store(std::process::id(), Ordering::SeqCst);
        let started = std::thread::Builder::new().name("convtune-tuning".into()).spawn(worker);
        if started.is_err() {
            // No thread to run it: the problem stays on the default rule's pick.
            st.worker = false;
            st.queue.clear();
            return None;
        }
    }
    CHANGED.notify_all();
    Some(true)
}

/// The gate a job calls before each candidate: waits while a convtune call is running;
/// an error once the process is exiting.
fn gate() -> Result<()> {
    loop {
        if with_state(|st| st.stopping) {
            return Err(Error::Cancelled("the process is exiting".into()));
        }
        if ACTIVE.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn worker() {
    loop {
        let job = {
            let mut guard = state();
            loop {
                let st = guard.get_or_insert_with(State::default);
                if st.stopping {
                    st.worker = false;
                    st.queue.clear();
                    CHANGED.notify_all();
                    return;
                }
                if let Some(job) = st.queue.pop_front() {
                    st.running = Some(job.key.clone());
                    break job;
                }
                guard = CHANGED.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
        };
        let start = Instant::now();
        let Job { key, work } = job;
        let outcome = no_panic(|| format!("tuning {key} in the background"), || work(&mut gate)).map_err(|e| e.to_string());
        with_state(|st| {
            st.running = None;
            st.done.push(TuningDone { key, outcome, seconds: start.elapsed().as_secs_f64() });
            // A service meeting ever new problems keeps the latest records only.
            if st.done.len() > DONE_KEPT {
                let cut = st.done.len() - DONE_KEPT;
                st.done.drain(..cut);
                st.returned = st.returned.saturating_sub(cut);
            }
        });
        CHANGED.notify_all();
    }
}

/// Blocks until no job is queued or running, or `timeout` passes. Returns the jobs finished
/// since the previous `wait` that returned them, or `None` on timeout (they stay for the
/// next one).
pub fn wait(timeout: Option<Duration>) -> Option<Vec<TuningDone>> {
    if forked() {
        return Some(Vec::new());
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut guard = state();
    loop {
        let st = guard.get_or_insert_with(State::default);
        if st.queue.is_empty() && st.running.is_none() {
            let new = st.done[st.returned..].to_vec();
            st.returned = st.done.len();
            return Some(new);
        }
        let left = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => left,
                _ => return None,
            },
            None => Duration::from_secs(3600),
        };
        guard = CHANGED.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// What the background worker has.
#[derive(Clone, Debug, Default)]
pub struct TuningStatus {
    /// Problems waiting, in the order they will be tuned.
    pub queued: Vec<String>,
    /// The problem being tuned now.
    pub running: Option<String>,
    /// The problems finished in this process (the latest `DONE_KEPT`), oldest first.
    pub done: Vec<TuningDone>,
}

/// Whether the worker has a job other than `key` running or queued before it (`key` queued
/// or not).
pub fn ahead_of(key: &str) -> bool {
    with_state(|st| {
        st.running.as_deref().is_some_and(|r| r != key) || st.queue.iter().take_while(|j| j.key != key).next().is_some()
    })
}

pub fn status() -> TuningStatus {
    if forked() {
        return TuningStatus::default();
    }
    with_state(|st| TuningStatus {
        queued: st.queue.iter().map(|j| j.key.clone()).collect(),
        running: st.running.clone(),
        done: st.done.clone(),
    })
}

/// At interpreter exit: drops the queue, cancels the running job at its next candidate and
/// waits up to `grace` for the worker to end. A cancelled job stores nothing, so the cache
/// stays as it was.
pub fn stop(grace: Duration) {
    if forked() {
        return;
    }
    let deadline = Instant::now() + grace;
    let mut guard = state();
    let Some(st) = guard.as_mut() else { return };
    st.stopping = true;
    st.queue.clear();
    CHANGED.notify_all();
    while guard.as_ref().is_some_and(|st| st.worker) {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else { return };
        guard = CHANGED.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs run in order, once per key, only while no call is running; `wait` returns each
    /// finished job once.
    #[test]
    fn jobs_run_once_each_and_wait_for_quiet() {
        let call = busy();
        let ran = std::sync::Arc::new(AtomicUsize::new(0));
        for k in ["a", "b", "a"] {
            let ran = ran.clone();
            enqueue(format!("test {k}"), Box::new(move |gate| {
                gate()?;
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(format!("winner of {k}"))
            }));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a job passed the gate during a call");
        assert!(wait(Some(Duration::from_millis(10))).is_none());
        drop(call);
        let done = wait(Some(Duration::from_secs(10))).unwrap();
        let mine: Vec<_> = done.iter().filter(|d| d.key.starts_with("test ")).collect();
        assert_eq!(mine.len(), 2);
        assert_eq!(mine[0].outcome, Ok("winner of a".to_string()));
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        assert!(wait(Some(Duration::from_secs(1))).unwrap().is_empty());
    }
}
