//! Tuning that keeps its budget (`auto` mode on GPUs): a new problem's tuning runs on the
//! background worker while the calling thread waits for it until the budget is spent. A run
//! that ends in time is used as before; one that does not leaves the caller with the fastest
//! candidate validated so far (or, before any, the reference kernel the run compiled first)
//! and goes on to its end on the worker, which stores its winner for the calls that follow. Compiles are what overran:
//! a tensor-core candidate compiles for 1-3 s on an H200 (`benches/first_call.py`).
//!
//! The caller forwards the run's progress to its own progress function, on its own thread;
//! an error from it (a Python callback raising) cancels the run.

use crate::error::{Error, Result};
use crate::kernels::Variant;
use crate::tuner::{Progress, TuneReport};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a run has told its callers so far.
#[derive(Default)]
struct Told {
    /// The latest progress: done, total, candidate.
    progress: Option<(usize, usize, String)>,
    /// Bumped at each progress report, so each caller forwards each report once.
    reports: u64,
    best: Option<Variant>,
    /// The run's end: its report, or why it failed.
    outcome: Option<std::result::Result<Arc<TuneReport>, String>>,
    cancelled: bool,
}

/// One problem's tuning run, shared by every caller that meets the problem meanwhile.
pub struct Run {
    told: Mutex<Told>,
    changed: Condvar,
}

/// How a caller's wait ended.
pub enum Waited {
    Done(std::result::Result<Arc<TuneReport>, String>),
    /// The budget was spent first: the best so far, if any candidate was validated.
    Late(Option<Variant>),
}

static RUNS: Mutex<Option<HashMap<String, Arc<Run>>>> = Mutex::new(None);

fn runs() -> MutexGuard<'static, Option<HashMap<String, Arc<Run>>>> {
    RUNS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Run {
    /// The run for `key` and whether it is new (the caller then starts it).
    pub fn for_key(key: &str) -> (Arc<Run>, bool) {
        let mut guard = runs();
        let map = guard.get_or_insert_with(HashMap::new);
        if let Some(r) = map.get(key) {
            return (r.clone(), false);
        }
        let r = Arc::new(Run { told: Mutex::new(Told::default()), changed: Condvar::new() });
        map.insert(key.to_string(), r.clone());
        (r, true)
    }

    /// Forgets the run for `key` (it ended, or could not start): later callers find the
    /// cache, or start another.
    pub fn forget(key: &str) {
        if let Some(map) = runs().as_mut() {
            map.remove(key);
        }
    }

    fn told(&self) -> MutexGuard<'_, Told> {
        self.told.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run's side: records a progress report; an error once a caller cancelled.
    pub fn report(&self, p: &Progress) -> Result<()> {
        let mut t = self.told();
        if t.cancelled {
            return Err(Error::Cancelled("tuning cancelled by the progress callback".into()));
        }
        t.progress = Some((p.done, p.total, p.name.to_string()));
        t.reports += 1;
        t.best = p.best.or(t.best);
        self.changed.notify_all();
        Ok(())
    }

    /// The run's side: its end.
    pub fn finish(&self, outcome: std::result::Result<Arc<TuneReport>, String>) {
        self.told().outcome = Some(outcome);
        self.changed.notify_all();
    }

    /// Records a failure as the run's end unless it has one.
    pub fn finish_unless_done(&self, why: String) {
        let mut t = self.told();
        if t.outcome.is_none() {
            t.outcome = Some(Err(why));
            self.changed.notify_all();
        }
    }

    /// The caller's side: waits until the run ends or `deadline`, forwarding each progress
    /// report to `progress`; its error cancels the run and is returned.
    pub fn wait(&self, deadline: Instant, progress: &mut dyn FnMut(&Progress) -> Result<()>) -> Result<Waited> {
        let mut seen = 0;
        let mut t = self.told();
        loop {
            if t.reports != seen {
                seen = t.reports;
                if let Some((done, total, name)) = t.progress.clone() {
                    let best = t.best;
                    drop(t);
                    if let Err(e) = progress(&Progress { done, total, name: &name, best }) {
                        self.told().cancelled = true;
                        return Err(e);
                    }
                    t = self.told();
                    continue;
                }
            }
            if let Some(outcome) = &t.outcome {
                return Ok(Waited::Done(outcome.clone()));
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                return Ok(Waited::Late(t.best));
            };
            t = self.changed.wait_timeout(t, left.min(Duration::from_millis(100))).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Whether `auto` mode tunes this way: `CONVTUNE_TUNE_DETACH` (`1` or `0`), else on GPUs
/// only. On a CPU adapter the run would share the few cores with the caller's own calls;
/// there the tuner's first-run estimates keep the budget instead.
pub fn detaches(cpu: bool) -> bool {
    match std::env::var("CONVTUNE_TUNE_DETACH").as_deref().map(str::trim) {
        Ok("1") => true,
        Ok("0") => false,
        _ => !cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(done: usize, best: Option<Variant>) -> Progress<'static> {
        Progress { done, total: 4, name: "candidate", best }
    }

    /// Callers waiting on one run at once: before its end each gets the best so far at its
    /// deadline and sees every report once; after it, its report.
    #[test]
    fn waiters_get_the_best_so_far_at_their_deadline_and_the_end_after_it() {
        let key = "deadline test run";
        let (run, fresh) = Run::for_key(key);
        assert!(fresh && !Run::for_key(key).1, "a second caller shares the run");
        let best: Variant = "direct_wg64x1_u0_k1w1".parse().unwrap();
        run.report(&progress(0, None)).unwrap();
        run.report(&progress(1, Some(best))).unwrap();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let run = Run::for_key(key).0;
                std::thread::spawn(move || {
                    let mut seen = Vec::new();
                    let w = run.wait(Instant::now() + Duration::from_millis(50), &mut |p| {
                        seen.push(p.done);
                        Ok(())
                    });
                    (matches!(w, Ok(Waited::Late(Some(v))) if v == best), seen)
                })
            })
            .collect();
        for w in waiters {
            let (late_with_best, seen) = w.join().unwrap();
            assert!(late_with_best);
            assert_eq!(seen, [1], "the latest report, once");
        }
        Run::forget(key);
        run.finish(Err("test end".into()));
        let w = run.wait(Instant::now() + Duration::from_secs(5), &mut |_| Ok(())).unwrap();
        assert!(matches!(w, Waited::Done(Err(e)) if e == "test end"));
        assert!(Run::for_key(key).1, "a forgotten run leaves the next caller a new one");
        Run::forget(key);
    }

    /// A caller's progress error cancels the run: its next report fails.
    #[test]
    fn a_progress_error_cancels_the_run() {
        let key = "deadline test cancel";
        let (run, _) = Run::for_key(key);
        run.report(&progress(0, None)).unwrap();
        let r = run.wait(Instant::now() + Duration::from_secs(5), &mut |_| Err(Error::Cancelled("stop".into())));
        assert!(matches!(r, Err(Error::Cancelled(_))));
        assert!(matches!(run.report(&progress(1, None)), Err(Error::Cancelled(_))));
        Run::forget(key);
    }
}
