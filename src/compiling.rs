//! Compiling tuning candidates on a pool of threads while the GPU times the ones before.
//!
//! Shader compilation is CPU work the driver does per pipeline (5 ms to 1.5 s per candidate
//! on an H200), and tuning time is mostly compile time. Workers take candidates in ranked
//! order as soon as one is free, so one slow compile holds up only its own thread, not a
//! whole batch. They run at a lower CPU priority than the thread that times candidates: with
//! 16 busy compile threads on 16 cores, validating and timing each EDSR candidate took 8x as
//! long on an H200 (the submitting thread starved, the GPU idled between runs).

use crate::device::Compiled;
use crate::error::Result;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// A compiled candidate and how long its compilation took on its own thread.
pub type Built = (Result<Compiled>, Duration);

enum Slot {
    Pending,
    /// Not compiled: the budget did not allow it.
    Skipped,
    Done(Built),
    Taken,
}

struct State {
    /// The next candidate a worker takes.
    next: usize,
    /// Workers take candidates below this index only (see `Compiler::next`).
    allowed: usize,
    slots: Vec<Slot>,
    /// The slowest compile seen, in seconds per byte of WGSL.
    rate: Option<f64>,
    stop: bool,
    /// Candidates a worker is compiling now.
    busy: usize,
}

/// The shared state of one tuning run's compile workers.
pub struct Compiler {
    state: Mutex<State>,
    changed: Condvar,
    threads: usize,
    overlap: bool,
}

impl Compiler {
    /// `n` candidates compiled by `threads` workers (`run_worker`). With `overlap`, workers
    /// run up to `LOOKAHEAD` x `threads` candidates ahead of the timing; without, a batch of
    /// `threads` compiles only while nothing is timed (a CPU adapter: compile threads would
    /// compete with the device for the cores).
    pub fn new(n: usize, threads: usize, overlap: bool) -> Self {
        let threads = threads.max(1);
        Compiler {
            state: Mutex::new(State {
                next: 0,
                allowed: if overlap { LOOKAHEAD * threads } else { 0 },
                slots: (0..n).map(|_| Slot::Pending).collect(),
                rate: None,
                stop: false,
                busy: 0,
            }),
            changed: Condvar::new(),
            threads,
            overlap,
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One worker's loop: compiles the next candidate that `want` (given the slowest rate
    /// so far) agrees to, until every candidate is taken or `stop`.
    pub fn run_worker(&self, want: impl Fn(usize, Option<f64>) -> bool, compile: impl Fn(usize) -> Built) {
        lower_priority();
        loop {
            let (i, rate) = {
                let mut s = self.lock();
                loop {
                    if s.stop || s.next >= s.slots.len() {
                        return;
                    }
                    if s.next < s.allowed {
                        break;
                    }
                    s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                }
                s.next += 1;
                s.busy += 1;
                (s.next - 1, s.rate)
            };
            let built = want(i, rate).then(|| compile(i));
            let mut s = self.lock();
            s.busy -= 1;
            if let Some((Ok(k), took)) = &built {
                let r = took.as_secs_f64() / k.source_bytes.max(1) as f64;
                s.rate = Some(s.rate.map_or(r, |old| old.max(r)));
            }
            s.slots[i] = built.map_or(Slot::Skipped, Slot::Done);
            self.changed.notify_all();
        }
    }

    /// The next candidate to time: the first in ranked order that is compiled (or skipped
    /// for the budget: `None`), so that a slow compile holds up neither the workers nor the
    /// timing. Without overlap, a batch of `threads` opens once every candidate before it is
    /// taken and is handed out only when all of it is compiled. `Ok(None)` once every
    /// candidate is taken. While it waits, `idle` runs (a GPU kept at load clocks) when
    /// given; an error from it ends the wait.
    /// After `stop`, only the candidates compiled since, and `Ok(None)` once no worker is
    /// compiling any more.
    pub fn next(&self, mut idle: Option<&mut dyn FnMut() -> Result<()>>) -> Result<Option<(usize, Option<Built>)>> {
        let mut s = self.lock();
        loop {
            if s.stop {
                if let Some(i) = s.slots.iter().position(|slot| matches!(slot, Slot::Done(_))) {
                    if let Slot::Done(built) = std::mem::replace(&mut s.slots[i], Slot::Taken) {
                        return Ok(Some((i, Some(built))));
                    }
                }
                if s.busy == 0 {
                    return Ok(None);
                }
            }
            let Some(first) = s.slots.iter().position(|slot| !matches!(slot, Slot::Taken)) else {
                return Ok(None);
            };
            let n = s.slots.len();
            if self.overlap && s.allowed < first + LOOKAHEAD * self.threads {
                s.allowed = first + LOOKAHEAD * self.threads;
                self.changed.notify_all();
            } else if !self.overlap && first >= s.allowed {
                s.allowed = (first + self.threads).min(n);
                self.changed.notify_all();
            }
            let handed_out = self.overlap || s.slots[..s.allowed.min(n)].iter().all(|slot| !matches!(slot, Slot::Pending));
            if handed_out {
                if let Some(i) = s.slots.iter().position(|slot| matches!(slot, Slot::Done(_) | Slot::Skipped)) {
                    return Ok(Some(match std::mem::replace(&mut s.slots[i], Slot::Taken) {
                        Slot::Done(built) => (i, Some(built)),
                        _ => (i, None),
                    }));
                }
            }
            match idle.as_mut() {
                Some(f) => {
                    drop(s);
                    f()?;
                    s = self.lock();
                }
                None => s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// Workers finish the compile in hand and take no more.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }

    /// Whether a worker is still compiling.
    pub fn busy(&self) -> bool {
        self.lock().busy > 0
    }
}

/// Stops the workers when dropped: on every way out of a tuning run, so that the scope
/// joining them does not wait for the rest of the candidates.
pub struct StopOnDrop<'a>(pub &'a Compiler);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Compile workers for a tuning run: one per core but the timing thread's, 2 to 16.
pub fn worker_count() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().saturating_sub(1)).clamp(2, 16)
}

/// How far ahead of the timing workers compile, in multiples of their number: enough that a
/// slow compile is hidden, few enough that candidates the budget never times are not built.
const LOOKAHEAD: usize = 2;

/// The calling thread yields the CPU to the timing thread (Linux: a thread's nice value is
/// its own). Elsewhere the workers keep the default priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's id changes only its scheduling priority.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// Every candidate comes back once, compiled or skipped as `want` says, whatever the
    /// threads and overlap; a slow compile holds up neither the other workers nor the
    /// candidates after it (with overlap), and without overlap batches come back whole.
    #[test]
    fn candidates_come_back_in_order() {
        for overlap in [true, false] {
            let c = Compiler::new(23, 4, overlap);
            let order = Mutex::new(Vec::new());
            let got = std::thread::scope(|scope| {
                for _ in 0..c.threads() {
                    scope.spawn(|| {
                        c.run_worker(
                            |i, _| i % 5 != 3,
                            |i| {
                                std::thread::sleep(Duration::from_millis(if i == 1 { 60 } else { 2 }));
                                order.lock().unwrap().push(i);
                                (Err(Error::Gpu(format!("{i}"))), Duration::from_millis(1))
                            },
                        )
                    });
                }
                let _stop = StopOnDrop(&c);
                let mut got = Vec::new();
                while let Some((i, built)) = c.next(None).unwrap() {
                    got.push((i, built.map(|(r, _)| r.err().unwrap().to_string())));
                }
                got
            });
            let mut seen: Vec<usize> = got.iter().map(|g| g.0).collect();
            let handed = seen.clone();
            seen.sort();
            assert_eq!(seen, (0..23).collect::<Vec<_>>());
            for (i, g) in &got {
                assert_eq!(g.is_none(), i % 5 == 3, "{i}");
                if let Some(msg) = g {
                    assert!(msg.ends_with(&format!("{i}")), "{msg}");
                }
            }
            let at = handed.iter().position(|&i| i == 1).unwrap();
            if overlap {
                // Candidate 1's slow compile came back after later ones.
                assert!(at > 1, "{handed:?}");
            } else {
                // The first batch (0..4) comes back whole and in order.
                assert_eq!(&handed[..4], &[0, 1, 2, 3], "{handed:?}");
            }
        }
    }

    /// After a stop, `next` hands out what the workers had in hand and then ends, without
    /// the candidates never started.
    #[test]
    fn a_stop_drains_the_compiles_under_way() {
        let c = Compiler::new(100, 3, true);
        let got = std::thread::scope(|scope| {
            for _ in 0..c.threads() {
                scope.spawn(|| {
                    c.run_worker(
                        |_, _| true,
                        |i| {
                            std::thread::sleep(Duration::from_millis(30));
                            (Err(Error::Gpu(format!("{i}"))), Duration::ZERO)
                        },
                    )
                });
            }
            let _stop = StopOnDrop(&c);
            let first = c.next(None).unwrap().unwrap().0;
            c.stop();
            let mut rest = Vec::new();
            while let Some((i, built)) = c.next(None).unwrap() {
                assert!(built.is_some(), "{i}");
                rest.push(i);
            }
            assert!(!c.busy());
            (first, rest)
        });
        // Three workers: at most the two others' first candidates and their next ones were
        // under way when the first came back.
        assert!(got.1.len() <= 2 * c.threads(), "{got:?}");
        assert!(!got.1.contains(&got.0), "{got:?}");
    }

    /// Stopping ends the workers without compiling the rest.
    #[test]
    fn stop_ends_the_workers() {
        let c = Compiler::new(1000, 2, true);
        let compiled = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    c.run_worker(
                        |_, _| true,
                        |_| {
                            compiled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(1));
                            (Err(Error::Gpu("x".into())), Duration::ZERO)
                        },
                    )
                });
            }
            let _stop = StopOnDrop(&c);
            c.next(None).unwrap();
        });
        assert!(compiled.load(std::sync::atomic::Ordering::SeqCst) < 1000);
    }
}
