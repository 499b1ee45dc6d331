//! Choosing a kernel for a problem: [`Plan`] (what runs and why), tuning, and the reports
//! the tuner leaves in the cache.

use crate::autotune::{self, Choice, Mode};
use crate::background::{self, TuningDone, TuningStatus};
use crate::engine::Engine;
use crate::error::{no_panic, Result};
use crate::families::Families;
use crate::kernels::{self, Variant};
use crate::problem::Conv2d;
use crate::runner::DeviceTensors;
use crate::tuner::{self, CandidateResult, TuneReport, TuningPhases};
use std::sync::Arc;
use std::time::Duration;

/// A problem with the kernel variant chosen for it: what [`Engine::encode`] and the
/// host-slice calls run, and, for [`Engine::explain`], why.
#[derive(Clone, Debug)]
pub struct Plan {
    problem: Conv2d,
    pub(crate) variant: Variant,
    choice: Choice,
}

/// Reported to a tuning progress callback before each candidate that is measured, and once
/// at the end (`done == total`, `candidate` empty).
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// Candidates measured so far.
    pub done: usize,
    /// Candidates the run expects to measure.
    pub total: usize,
    /// The variant measured next.
    pub candidate: &'a str,
}

/// A progress callback; an error it returns stops the tuning run with that error.
pub type ProgressFn<'a> = dyn FnMut(Progress<'_>) -> Result<()> + 'a;

/// Options of [`Engine::tune`].
#[derive(Clone, Copy, Debug, Default)]
pub struct TuneOptions {
    /// Seconds of tuning (default: `CONVTUNE_TUNE_BUDGET`, else 1).
    pub budget: Option<f64>,
    /// Tune again even when the cache has the problem.
    pub force: bool,
}

/// What the tuner measured for one problem: the winner, the default, every candidate.
#[derive(Clone, Debug)]
pub struct Report {
    inner: Arc<TuneReport>,
}

/// One candidate of a tuning run.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    inner: &'a CandidateResult,
}

fn progress_bridge<'a, 'f>(f: &'a mut ProgressFn<'f>) -> impl FnMut(&tuner::Progress) -> Result<()> + use<'a, 'f> {
    move |p| f(Progress { done: p.done, total: p.total, candidate: p.name })
}

impl Engine {
    /// The plan a call runs for `problem`: the variant named by `variant` if given (a name
    /// from [`variant_names`]), else as `CONVTUNE_TUNE` says: the cached tuning result,
    /// else a tuning run (`auto`, the default; the result goes to the on-disk cache shared
    /// with Python; on GPUs the call waits for it up to the budget and then takes the best
    /// candidate validated so far while the run finishes in the background, see
    /// `CONVTUNE_TUNE_DETACH` in docs/tuning.md), or the default rule (`off`, or `cached`
    /// without an entry). A failed tuning run falls back to the default rule and says so in
    /// [`Plan::warnings`].
    pub fn choose(&self, problem: &Conv2d, variant: Option<&str>, progress: &mut ProgressFn<'_>) -> Result<Plan> {
        let forced = variant.map(str::parse::<Variant>).transpose()?;
        let choice = no_panic(|| format!("choosing a kernel for {}", problem.label()), || {
            autotune::choose(&self.inner, &problem.shape, problem.precision, forced, &mut progress_bridge(progress))
        })?;
        Ok(Plan { problem: *problem, variant: choice.variant, choice })
    }

    /// [`choose`](Self::choose) where that needs no tuning run (a named variant, the
    /// default rule, a cached result, or the default rule with the problem queued for
    /// background tuning); `None` where it would tune. It never waits for a tuning run, so a
    /// caller holding a lock other calls need (Python's GIL) may run it without letting go.
    pub fn choose_now(&self, problem: &Conv2d, variant: Option<&str>) -> Result<Option<Plan>> {
        let forced = variant.map(str::parse::<Variant>).transpose()?;
        let choice = no_panic(|| format!("choosing a kernel for {}", problem.label()), || {
            autotune::choose_now(&self.inner, &problem.shape, problem.precision, forced)
        })?;
        Ok(choice.map(|choice| Plan { problem: *problem, variant: choice.variant, choice }))
    }

    /// [`choose`](Self::choose) without a forced variant or a progress callback.
    pub fn plan(&self, problem: &Conv2d) -> Result<Plan> {
        self.choose(problem, None, &mut |_| Ok(()))
    }

    /// What a call on `problem` would run and why: [`plan`](Self::plan), whose result
    /// carries the variant, its knobs, where the choice came from, the tuning report with
    /// every candidate and ([`Plan::wgsl`]) the generated shader.
    pub fn explain(&self, problem: &Conv2d) -> Result<Plan> {
        self.plan(problem)
    }

    /// Tunes `problem` (or takes the cached result unless `options.force`), ignoring
    /// `CONVTUNE_TUNE`, and stores the result in the on-disk cache.
    pub fn tune(&self, problem: &Conv2d, options: TuneOptions, progress: &mut ProgressFn<'_>) -> Result<Plan> {
        let budget = autotune::budget(options.budget)?;
        let choice = no_panic(|| format!("tuning {}", problem.label()), || {
            autotune::tune(&self.inner, &problem.shape, problem.precision, budget, options.force, &mut progress_bridge(progress))
        })?;
        Ok(Plan { problem: *problem, variant: choice.variant, choice })
    }

    /// The untuned choice for `problem` within the families `CONVTUNE_FAMILIES` allows.
    pub fn default_variant(&self, problem: &Conv2d) -> Result<String> {
        let families = Families::from_env()?;
        Ok(tuner::default_choice(&problem.shape, &self.inner.caps, problem.precision, &families)?.to_string())
    }

    /// GPU seconds of each of `reps` runs of `plan` on pseudo-random inputs (timestamp
    /// queries where the device has them, else wall clock around a queue sync), after
    /// `warmup` runs and, with a warm-up, half a second of load to bring the GPU to its
    /// load clocks.
    pub fn time(&self, plan: &Plan, reps: u32, warmup: u32) -> Result<Vec<f64>> {
        let engine = &*self.inner;
        let shape = &plan.problem.shape;
        let kernel = engine.pipeline(&plan.variant, shape)?;
        let t = DeviceTensors::random(engine, shape, [11, 12, 13, 14])?;
        if warmup > 0 {
            t.time(engine, &kernel, warmup)?;
            t.settle(engine, &kernel, Duration::from_millis(500), Duration::from_secs(2))?;
        }
        t.time(engine, &kernel, reps)
    }
}

impl Plan {
    /// The problem it runs.
    pub fn problem(&self) -> &Conv2d {
        &self.problem
    }

    /// The kernel variant's name.
    pub fn variant(&self) -> String {
        self.variant.to_string()
    }

    /// The variant's kernel family (`direct`, `gemm`, `coop`, `wino`).
    pub fn family(&self) -> &'static str {
        self.variant.family()
    }

    /// The variant's knobs by name.
    pub fn knobs(&self) -> Vec<(&'static str, u32)> {
        self.variant.knobs()
    }

    /// Where the choice came from: `forced`, `default`, `cache` or `tuned`.
    pub fn source(&self) -> &'static str {
        self.choice.source.as_str()
    }

    /// The tuning report behind the choice, when it came from the cache or a tuning run.
    pub fn report(&self) -> Option<Report> {
        self.choice.report.clone().map(|inner| Report { inner })
    }

    /// Recoverable problems met on the way (an unreadable cache, a failed tuning run).
    pub fn warnings(&self) -> &[String] {
        &self.choice.warnings
    }

    /// The families `CONVTUNE_FAMILIES` allowed when the choice was made.
    pub fn families(&self) -> &[&'static str] {
        self.choice.families.allowed()
    }

    /// The families it left out.
    pub fn excluded_families(&self) -> Vec<&'static str> {
        self.choice.families.excluded()
    }

    /// The WGSL source of the kernel.
    pub fn wgsl(&self) -> Result<String> {
        Ok(self.variant.generate(&self.problem.shape)?.source)
    }

    /// The GPU dispatches one run of the kernel makes, in order (`weights`, `max`,
    /// `prologue`, `main`, `finish`; see docs/api.md), and how many chunks repeat them from
    /// the prologue on. A problem larger than one storage binding runs its kernel per piece.
    pub fn dispatches(&self) -> Result<(Vec<&'static str>, u32)> {
        let k = self.variant.generate(&self.problem.shape)?;
        Ok((k.dispatches(), k.chunks))
    }
}

impl Report {
    /// The problem tuned, as a shape spec.
    pub fn shape(&self) -> String {
        self.inner.shape.label()
    }

    /// The precision mode the winner was validated for.
    pub fn precision(&self) -> crate::Precision {
        self.inner.precision
    }

    /// The fastest correct candidate.
    pub fn winner(&self) -> &str {
        &self.inner.winner
    }

    /// The default rule's variant.
    pub fn default_variant(&self) -> &str {
        &self.inner.default
    }

    /// The trusted variant candidates were checked against.
    pub fn reference(&self) -> &str {
        &self.inner.reference
    }

    /// The default variant's median GPU milliseconds.
    pub fn default_ms(&self) -> Option<f64> {
        self.inner.default_ms
    }

    /// The winner's median GPU milliseconds.
    pub fn tuned_ms(&self) -> Option<f64> {
        self.inner.tuned_ms
    }

    /// default_ms / tuned_ms, when both were measured.
    pub fn speedup(&self) -> Option<f64> {
        self.inner.speedup()
    }

    /// Wall-clock seconds the tuning took, compilation included.
    pub fn tuning_s(&self) -> f64 {
        self.inner.tuning_s
    }

    /// Where the tuning time went (absent in reports cached before it was recorded).
    pub fn phases(&self) -> Option<TuningPhases> {
        self.inner.phases
    }

    /// The budget of the run, seconds.
    pub fn budget_s(&self) -> f64 {
        self.inner.budget_s
    }

    /// When it ran (UTC, ISO 8601).
    pub fn tuned_at(&self) -> &str {
        &self.inner.tuned_at
    }

    /// The adapter it ran on.
    pub fn adapter(&self) -> &str {
        &self.inner.adapter
    }

    /// The families `CONVTUNE_FAMILIES` allowed; `None` when it allowed all.
    pub fn families(&self) -> Option<&[String]> {
        self.inner.families.as_deref()
    }

    /// Every candidate, in the order they were tried.
    pub fn candidates(&self) -> Vec<Candidate<'_>> {
        self.inner.candidates.iter().map(|inner| Candidate { inner }).collect()
    }
}

impl Candidate<'_> {
    /// The variant's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The variant's knobs, `None` for a name this build does not know.
    pub fn knobs(&self) -> Option<(&'static str, Vec<(&'static str, u32)>)> {
        self.inner.variant().map(|v| (v.family(), v.knobs()))
    }

    /// `ok`, `wrong`, `compile_error`, `pruned`, … : how the candidate fared.
    pub fn status(&self) -> &'static str {
        self.inner.status.as_str()
    }

    /// Median GPU milliseconds, when it was timed.
    pub fn median_ms(&self) -> Option<f64> {
        self.inner.median_ms
    }

    /// GPU milliseconds of each timed run, in order.
    pub fn samples_ms(&self) -> &[f64] {
        &self.inner.samples_ms
    }

    /// Why it failed or was dropped, if it did.
    pub fn detail(&self) -> Option<&str> {
        self.inner.detail.as_deref()
    }

    /// Wall milliseconds its compilation took.
    pub fn compile_ms(&self) -> Option<f64> {
        self.inner.compile_ms
    }

    /// Seconds from the tuning run's start to its validation (`None` where it was not run).
    pub fn at_s(&self) -> Option<f64> {
        self.inner.at_s
    }

    /// Wall milliseconds of its validation, warm-up and samples.
    pub fn measure_ms(&self) -> Option<f64> {
        self.inner.measure_ms
    }

    /// Median GPU milliseconds in the runoff that decides between the fastest few and the
    /// default, timed again in turns after the others; `None` for the rest.
    pub fn runoff_ms(&self) -> Option<f64> {
        self.inner.runoff_ms
    }
}

/// Every variant name the generator can emit.
pub fn variant_names() -> Vec<String> {
    kernels::all_variants().iter().map(|v| v.to_string()).collect()
}

/// A variant's family and knobs, by name.
pub fn variant_knobs(name: &str) -> Result<(&'static str, Vec<(&'static str, u32)>)> {
    let v: Variant = name.parse()?;
    Ok((v.family(), v.knobs()))
}

/// The kernel families `CONVTUNE_FAMILIES` allows now, and those it leaves out.
pub fn families() -> Result<(Vec<&'static str>, Vec<&'static str>)> {
    let f = Families::from_env()?;
    Ok((f.allowed().to_vec(), f.excluded()))
}

/// The tuning mode calls run in now: `auto`, `background`, `cached` or `off`
/// ([`set_tune_mode`]'s, else `CONVTUNE_TUNE`'s).
pub fn tune_mode() -> Result<&'static str> {
    Mode::current().map(|m| m.as_str())
}

/// Sets this process's tuning mode over `CONVTUNE_TUNE` (one of [`tune_mode`]'s values);
/// `None` goes back to the variable.
pub fn set_tune_mode(mode: Option<&str>) -> Result<()> {
    autotune::set_mode(mode.map(|m| Mode::parse(m, "the tuning mode")).transpose()?);
    Ok(())
}

/// Blocks until the background tuning worker has nothing queued or running, or `timeout`
/// passes. Returns the problems it finished since the previous `wait_tuning` that returned
/// them, or `None` on timeout.
pub fn wait_tuning(timeout: Option<std::time::Duration>) -> Option<Vec<TuningDone>> {
    background::wait(timeout)
}

/// What the background tuning worker has queued, is tuning and has finished.
pub fn tuning_status() -> TuningStatus {
    background::status()
}

/// Stops background tuning for good (at exit): drops the queue, cancels the running
/// problem at its next candidate (nothing is stored for it) and waits up to `grace` for
/// the worker to end.
pub fn stop_tuning(grace: std::time::Duration) {
    background::stop(grace)
}
