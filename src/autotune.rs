//! Which variant a call runs: forced by the caller, the default rule, a cached tuning result,
//! or a fresh tuning run, as `CONVTUNE_TUNE` says. Every environment variable is read at
//! call time.

use crate::background;
use crate::deadline::{self, Run, Waited};
use crate::cache::{Cache, CacheKey, Entry};
use crate::device::Engine;
use crate::error::{Error, Result};
use crate::families::Families;
use crate::dtype::DType;
use crate::params::ConvShape;
use crate::split;
use crate::precision::Precision;
use crate::tuner::{self, Progress, TuneOptions, TuneReport};
use crate::kernels::Variant;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `CONVTUNE_TUNE`, or what `set_mode` set for this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Tune a shape the first time it is seen, then use the cache.
    Auto,
    /// The default rule only.
    Off,
    /// The cache when it has the shape, else the default rule; never tune.
    Cached,
    /// The cache when it has the shape, else the default rule while the shape is tuned on
    /// a worker thread (`background`); later calls use its result.
    Background,
}

/// The process's own mode (`set_mode`), over `CONVTUNE_TUNE`.
static PROCESS_MODE: Mutex<Option<Mode>> = Mutex::new(None);

impl Mode {
    pub fn parse(v: &str, what: &str) -> Result<Mode> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Mode::Auto),
            "off" => Ok(Mode::Off),
            "cached" => Ok(Mode::Cached),
            "background" => Ok(Mode::Background),
            _ => Err(Error::invalid(format!("{what} must be 'auto', 'background', 'cached' or 'off', got {v:?}"))),
        }
    }

    /// The mode calls run in: `set_mode`'s, else `CONVTUNE_TUNE`'s, else auto.
    pub fn current() -> Result<Mode> {
        if let Some(m) = *PROCESS_MODE.lock().unwrap_or_else(|e| e.into_inner()) {
            return Ok(m);
        }
        match std::env::var("CONVTUNE_TUNE") {
            Err(_) => Ok(Mode::Auto),
            Ok(v) => Mode::parse(&v, "CONVTUNE_TUNE"),
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Off => "off",
            Mode::Cached => "cached",
            Mode::Background => "background",
        }
    }
}

/// Sets this process's mode over `CONVTUNE_TUNE` (`None`: back to the variable).
pub fn set_mode(mode: Option<Mode>) {
    *PROCESS_MODE.lock().unwrap_or_else(|e| e.into_inner()) = mode;
}

/// Where a choice came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Forced,
    Default,
    Cache,
    Tuned,
    /// The default rule's pick while the problem is tuned in the background.
    Queued,
    /// The fastest candidate validated within the budget, while the tuning run goes on in
    /// the background (`auto` mode on GPUs, `deadline`).
    Interim,
    /// The reference kernel, where nothing was validated within the budget.
    Fallback,
    /// The reference kernel at once, the problem's run queued behind another problem's
    /// (`auto` mode on GPUs): the call does not wait a budget for a run that has not begun.
    Behind,
    /// A layer past the size switch-over: the kernel its sizes share (`generic`).
    Generic,
}

impl Source {
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Forced => "forced",
            Source::Default => "default",
            Source::Cache => "cache",
            Source::Tuned => "tuned",
            Source::Queued => "default, tuning in the background",
            Source::Interim => "best within the budget, tuning goes on in the background",
            Source::Fallback => "reference kernel, tuning goes on in the background",
            Source::Behind => "reference kernel, tuning queued behind another problem's",
            Source::Generic => "size-generic: the layer's kernel for every size",
        }
    }
}

/// A decision, with the tuning report behind it when there is one and any warnings met on
/// the way (for the caller to show).
#[derive(Clone, Debug)]
pub struct Choice {
    pub variant: Variant,
    pub source: Source,
    /// The families `CONVTUNE_FAMILIES` allowed when the choice was made.
    pub families: Families,
    pub report: Option<Arc<TuneReport>>,
    pub warnings: Vec<String>,
}

/// The tuning budget: the argument if given, else `CONVTUNE_TUNE_BUDGET` seconds, else the
/// default.
pub fn budget(arg: Option<f64>) -> Result<Duration> {
    let (secs, what) = match arg {
        Some(s) => (s, "budget".to_string()),
        None => match std::env::var("CONVTUNE_TUNE_BUDGET") {
            Ok(v) if !v.trim().is_empty() => {
                let s = v.trim().parse::<f64>().map_err(|_| {
                    Error::invalid(format!("CONVTUNE_TUNE_BUDGET must be a number of seconds, got {v:?}"))
                })?;
                (s, "CONVTUNE_TUNE_BUDGET".to_string())
            }
            _ => return Ok(tuner::DEFAULT_BUDGET),
        },
    };
    if !(0.0..=1e6).contains(&secs) {
        return Err(Error::invalid(format!("{what} must be between 0 and 1e6 seconds, got {secs}")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// One tuning run at a time per process: runs would disturb each other's timings, and two
/// threads meeting the same new shape should tune it once.
static TUNING: Mutex<()> = Mutex::new(());

/// A cached report is used only if its winner is still a variant this build and adapter can
/// run, for this very shape and precision, of a family allowed now. The key already holds
/// the families; checking the winner too keeps a hand-edited or imported entry from
/// smuggling in an excluded one.
fn usable(
    report: &TuneReport,
    shape: &ConvShape,
    precision: Precision,
    families: &Families,
    engine: &Engine,
) -> Option<Variant> {
    let v = report.winner_variant().ok()?;
    let tuned_on = |s: &ConvShape| *s == *shape || tuning_shape(engine, shape).is_ok_and(|t| t == *s);
    let ok = tuned_on(&report.shape)
        && report.precision == precision
        && families.allows(v.family())
        && v.fits(&engine.caps)
        && v.serves(precision);
    ok.then_some(v)
}

fn cached(
    engine: &Engine,
    shape: &ConvShape,
    precision: Precision,
    families: &Families,
    cache: &Cache,
    warnings: &mut Vec<String>,
) -> Option<Choice> {
    let key = CacheKey::new(&engine.desc, shape, precision, families);
    let report = cache.get(&key, warnings)?;
    match usable(&report, shape, precision, families, engine) {
        Some(variant) => Some(Choice {
            variant,
            source: Source::Cache,
            families: families.clone(),
            report: Some(report),
            warnings: Vec::new(),
        }),
        None => {
            let excluded = report.winner_variant().is_ok_and(|v| !families.allows(v.family()));
            warnings.push(format!(
                "cached winner {:?} for {} cannot run here{}; ignoring the entry",
                report.winner,
                shape.label(),
                if excluded { " (its family is excluded by CONVTUNE_FAMILIES)" } else { "" }
            ));
            None
        }
    }
}

fn print_line(report: &TuneReport) {
    let on = std::env::var("CONVTUNE_PRINT_TUNING").is_ok_and(|v| !matches!(v.trim(), "" | "0"));
    if !on {
        return;
    }
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |m| format!("{m:.3} ms"));
    let speedup = report.speedup().map_or("-".to_string(), |s| format!("{s:.2}x"));
    eprintln!(
        "convtune: tuned {}: {} {} ({} over default {} {}), tuning {:.2} s",
        report.shape.label(),
        report.winner,
        ms(report.tuned_ms),
        speedup,
        report.default,
        ms(report.default_ms),
        report.tuning_s
    );
}

/// The shape a problem is tuned on: itself, or where it runs in pieces (more than one storage
/// binding: a 4K frame of 64 channels), its first piece, a shape its kernels run on. The
/// report is cached under the whole problem.
fn tuning_shape(engine: &Engine, shape: &ConvShape) -> Result<ConvShape> {
    let pieces = split::plan(shape, engine.max_binding())?;
    Ok(pieces.iter().find_map(|p| p.shape).unwrap_or(*shape))
}

/// The other problems tuned apart from this one whose winners can run it: the other
/// precision mode of a float32 problem (every kernel that serves "highest" serves "high"),
/// and for float16 data the same problem on float32 data in both modes (the families read
/// both), so a looser mode or narrower type never settles for a slower kernel than the other
/// tuning found.
fn related(precision: Precision, shape: &ConvShape) -> Vec<(ConvShape, Precision)> {
    match (shape.dtype, precision) {
        (DType::F16, _) => {
            let f32 = shape.with_dtype(DType::F32);
            vec![(f32, Precision::High), (f32, Precision::Highest)]
        }
        (DType::F32, Precision::Highest) => vec![(*shape, Precision::High)],
        (DType::F32, Precision::High) => vec![(*shape, Precision::Highest)],
    }
}

/// Tunes `shape` and stores the result. Must be called holding `TUNING`.
#[allow(clippy::too_many_arguments)]
fn tune_and_store(
    engine: &Engine,
    shape: &ConvShape,
    precision: Precision,
    families: &Families,
    budget: Duration,
    cache: &Cache,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
    warnings: &mut Vec<String>,
) -> Result<Arc<TuneReport>> {
    // The related problems' cached winners are timed too (see `related`), whatever the
    // budget; a winner that cannot run this problem is left out by the tuner.
    let also = related(precision, shape)
        .into_iter()
        .filter_map(|(s, p)| cached(engine, &s, p, families, cache, &mut Vec::new()))
        .map(|c| c.variant)
        .collect();
    let opts = TuneOptions { budget, families: families.clone(), also, ..TuneOptions::default() };
    let report = Arc::new(tuner::tune(engine, &tuning_shape(engine, shape)?, precision, &opts, progress)?);
    print_line(&report);
    let key = CacheKey::new(&engine.desc, shape, precision, families);
    let entry = Entry { key, report: (*report).clone() };
    if let Err(e) = cache.put(vec![entry], warnings) {
        warnings.push(format!("{e}; the result is kept for this process only"));
    }
    Ok(report)
}

/// `convtune.tune()`: the cached report unless `force`, else a fresh tuning run. Ignores
/// `CONVTUNE_TUNE`: the caller asked for tuning. Honours `CONVTUNE_FAMILIES`.
pub fn tune(
    engine: &Engine,
    shape: &ConvShape,
    precision: Precision,
    budget: Duration,
    force: bool,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<Choice> {
    let precision = precision.for_data(shape.dtype);
    let families = Families::from_env()?;
    let cache = Cache::from_env();
    let mut warnings = Vec::new();
    let _one = TUNING.lock().unwrap_or_else(|e| e.into_inner());
    if !force {
        if let Some(mut c) = cached(engine, shape, precision, &families, &cache, &mut warnings) {
            c.warnings = warnings;
            return Ok(c);
        }
    }
    let report = tune_and_store(engine, shape, precision, &families, budget, &cache, progress, &mut warnings)?;
    let variant = report.winner_variant()?;
    Ok(Choice { variant, source: Source::Tuned, families, report: Some(report), warnings })
}

/// The variant a conv2d call runs. Tuning failures never fail the call: they are reported as
/// warnings and the default rule is used (cancellation and device loss do propagate). A
/// variant asked for by name runs even if `CONVTUNE_FAMILIES` leaves its family out; the
/// variable is still read, so a bad value is reported whatever the call.
pub fn choose(
    engine: &Arc<Engine>,
    shape: &ConvShape,
    precision: Precision,
    forced: Option<Variant>,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<Choice> {
    let start = Instant::now();
    if let Some(c) = choose_now(engine, shape, precision, forced)? {
        return Ok(c);
    }
    let precision = precision.for_data(shape.dtype);
    let families = Families::from_env()?;
    let budget = budget(None)?;
    if deadline::detaches(engine.caps.cpu) {
        if let Some(c) = choose_within(engine, shape, precision, &families, budget, start + budget, progress)? {
            return Ok(c);
        }
    }
    let cache = Cache::from_env();
    let mut warnings = Vec::new();
    let _one = TUNING.lock().unwrap_or_else(|e| e.into_inner());
    // Another thread may have tuned this shape while this one waited.
    if let Some(mut c) = cached(engine, shape, precision, &families, &cache, &mut warnings) {
        c.warnings = warnings;
        return Ok(c);
    }
    match tune_and_store(engine, shape, precision, &families, budget, &cache, progress, &mut warnings) {
        Ok(report) => {
            let variant = report.winner_variant()?;
            engine.layers.keep_variant(shape, precision, variant, crate::generic::after());
            Ok(Choice { variant, source: Source::Tuned, families, report: Some(report), warnings })
        }
        Err(e @ (Error::Cancelled(_) | Error::DeviceLost(_))) => Err(e),
        Err(e) => {
            warnings.push(format!("tuning {} failed ({e}); using the default variant", shape.label()));
            // Where the allowed families cannot run the shape at all, this is the error
            // that says so.
            default_choice(engine, shape, precision, families, Source::Default, warnings)
        }
    }
}

/// `choose`'s tuning run on the background worker, waited for until `until` (see
/// `deadline`); `None` where the worker cannot take it (the caller then tunes itself).
fn choose_within(
    engine: &Arc<Engine>,
    shape: &ConvShape,
    precision: Precision,
    families: &Families,
    budget: Duration,
    until: Instant,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<Option<Choice>> {
    let key = job_key(shape, precision);
    let (run, fresh) = Run::for_key(&key);
    if fresh {
        let (engine, shape, families, job_run, job_key) = (Arc::clone(engine), *shape, families.clone(), run.clone(), key.clone());
        let queued = background::enqueue_fresh(key.clone(), Box::new(move |gate| {
            // Whatever ends the job (a panic too), its callers hear of it.
            let ended = Ended { run: &job_run, key: &job_key };
            let out = tune_job(&engine, &shape, precision, &families, budget, &mut |p| {
                job_run.report(p)?;
                gate()
            });
            // Callers from now on find the cache (stored by the job), not the run.
            Run::forget(ended.key);
            ended.run.finish(out.as_ref().map(Arc::clone).map_err(|e| e.to_string()));
            out.map(|r| r.winner.clone())
        }));
        if !queued {
            Run::forget(&key);
            return Ok(None);
        }
    }
    let families = families.clone();
    // A run queued behind another problem's (a network's next layer while the last one's run
    // goes on past its budget) would leave the call waiting its whole budget for a run that
    // has not begun: a network's first pass took a budget per layer (ResNet-50: 35-53 s on an
    // H200), each layer then running the reference kernel all the same. It takes that at once.
    let behind = background::ahead_of(&key);
    let until = if behind { Instant::now() } else { until };
    match run.wait(until, progress)? {
        Waited::Done(Ok(report)) => {
            let variant = report.winner_variant()?;
            engine.layers.keep_variant(shape, precision, variant, crate::generic::after());
            Ok(Some(Choice { variant, source: Source::Tuned, families, report: Some(report), warnings: Vec::new() }))
        }
        Waited::Done(Err(e)) => {
            let warnings = vec![format!("tuning {} failed ({e}); using the default variant", shape.label())];
            default_choice(engine, shape, precision, families, Source::Default, warnings).map(Some)
        }
        Waited::Late(late) => {
            // What runs while the tuning goes on: the best validated so far, else the reference
            // kernel, which compiles in a moment where a tensor-core default can take seconds.
            // Past the size switch-over it is the bucket's until the winner comes
            // (`tune_job`), so that the bucket's next sizes neither tune nor compile.
            let choice = match late {
                Some(variant) => Choice { variant, source: Source::Interim, families, report: None, warnings: Vec::new() },
                None => match tuner::reference_variant(&tuning_shape(engine, shape)?) {
                    r if families.allows(r.family()) => {
                        let source = if behind { Source::Behind } else { Source::Fallback };
                        Choice { variant: r, source, families, report: None, warnings: Vec::new() }
                    }
                    _ => default_choice(engine, shape, precision, families, Source::Queued, Vec::new())?,
                },
            };
            engine.layers.keep_variant(shape, precision, choice.variant, crate::generic::after());
            Ok(Some(choice))
        }
    }
}

/// Ends a detached run when its job ends, however: callers waiting get an outcome (a
/// failure if the job did not give one), and later callers find the cache, not the run.
struct Ended<'a> {
    run: &'a Run,
    key: &'a str,
}

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        Run::forget(self.key);
        self.run.finish_unless_done("the tuning run ended without a result".into());
    }
}

/// `choose` where it needs no tuning run: a forced variant, the default rule, a cached
/// result, or (in the background mode) the default rule with the problem queued; `None`
/// where the call must tune first. Takes no lock that is held while tuning, so a caller may
/// run it without letting go of what it holds (Python's GIL).
pub fn choose_now(engine: &Arc<Engine>, shape: &ConvShape, precision: Precision, forced: Option<Variant>) -> Result<Option<Choice>> {
    let precision = precision.for_data(shape.dtype);
    let families = Families::from_env()?;
    if let Some(variant) = forced {
        return Ok(Some(Choice { variant, source: Source::Forced, families, report: None, warnings: Vec::new() }));
    }
    let mode = Mode::current()?;
    // A layer that has met many sizes: its new sizes run the kernel its first size past the
    // switch-over chose, as a size-generic module, and are not tuned (`generic`); a size
    // tuned before keeps its result.
    let after = crate::generic::after();
    if after > 0 {
        engine.layers.record(shape);
    }
    let generic = engine.layers.switched(shape, after);
    let layer_variant = || engine.layers.variant(shape, precision).filter(|_| generic);
    let as_generic = |variant, families| Choice { variant, source: Source::Generic, families, report: None, warnings: Vec::new() };
    let keep = |c: Choice| {
        engine.layers.keep_variant(shape, precision, c.variant, after);
        c
    };
    if mode == Mode::Off {
        if let Some(v) = layer_variant() {
            return Ok(Some(as_generic(v, families)));
        }
        return default_choice(engine, shape, precision, families, Source::Default, Vec::new()).map(keep).map(Some);
    }
    let cache = Cache::from_env();
    let mut warnings = Vec::new();
    if let Some(mut c) = cached(engine, shape, precision, &families, &cache, &mut warnings) {
        c.warnings = warnings;
        return Ok(Some(keep(c)));
    }
    if let Some(v) = layer_variant() {
        return Ok(Some(as_generic(v, families)));
    }
    match mode {
        Mode::Cached => default_choice(engine, shape, precision, families, Source::Default, warnings).map(keep).map(Some),
        Mode::Background => {
            let source = if queue(engine, shape, precision, &families)? { Source::Queued } else { Source::Default };
            default_choice(engine, shape, precision, families, source, warnings).map(keep).map(Some)
        }
        Mode::Auto | Mode::Off => Ok(None),
    }
}

fn default_choice(
    engine: &Engine,
    shape: &ConvShape,
    precision: Precision,
    families: Families,
    source: Source,
    warnings: Vec<String>,
) -> Result<Choice> {
    let variant = tuner::default_choice(shape, &engine.caps, precision, &families)?;
    Ok(Choice { variant, source, families, report: None, warnings })
}

/// Queues `shape` for the background worker (`background`), which tunes it at the budget
/// of the moment and stores the result as a call's tuning would; its candidates start only
/// while no convtune call runs. Returns whether the worker has it (queued now or before).
fn queue(engine: &Arc<Engine>, shape: &ConvShape, precision: Precision, families: &Families) -> Result<bool> {
    let budget = budget(None)?;
    let (engine, shape, families) = (Arc::clone(engine), *shape, families.clone());
    Ok(background::enqueue(job_key(&shape, precision), Box::new(move |gate| {
        let report = tune_job(&engine, &shape, precision, &families, budget, &mut |_| gate())?;
        Ok(report.winner.clone())
    })))
}

/// A problem's name on the background worker (its queue keeps one job per name).
fn job_key(shape: &ConvShape, precision: Precision) -> String {
    format!("{} {}", shape.label(), precision.as_str())
}

/// A background job's tuning run, as a call's own would be (one at a time, stored in the
/// cache): the cached report where another run stored one meanwhile.
fn tune_job(
    engine: &Engine,
    shape: &ConvShape,
    precision: Precision,
    families: &Families,
    budget: Duration,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<Arc<TuneReport>> {
    let cache = Cache::from_env();
    let mut warnings = Vec::new();
    let _one = TUNING.lock().unwrap_or_else(|e| e.into_inner());
    let report = match cached(engine, shape, precision, families, &cache, &mut warnings).and_then(|c| c.report) {
        Some(report) => report,
        None => tune_and_store(engine, shape, precision, families, budget, &cache, progress, &mut warnings)?,
    };
    // The caller that queued it ran another kernel meanwhile; where its layer has switched
    // over to size-generic kernels, the bucket's later sizes run the winner, or another of
    // the fastest whose module runs faster.
    if let Ok(winner) = report.winner_variant() {
        let after = crate::generic::after();
        let variant = if engine.layers.switched(shape, after) { bucket_variant(engine, shape, &report, winner, progress) } else { winner };
        engine.layers.prefer_variant(shape, precision, variant, after);
    }
    Ok(report)
}

/// Of the run's three fastest candidates (the winner first), the one whose size-generic
/// module runs `shape` fastest: what the bucket's other sizes will run. A winner's module
/// can lose a third of its exact kernel's speed where another's loses little (on an H200 the
/// stem family's 3x3 ran 1.49x its exact kernel, the tensor-core tiles 1.01-1.36x:
/// `benches/generic_speed.py`). Only where no caller waits (a worker's job): the modules
/// compile and run here, each timing after `progress` (the job's gate: in the background
/// mode, no timing while a convtune call runs). The winner where none has a module, a
/// timing fails or the job is cancelled.
fn bucket_variant(
    engine: &Engine,
    shape: &ConvShape,
    report: &TuneReport,
    winner: Variant,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Variant {
    let mut timed: Vec<(f64, Variant)> = report
        .candidates
        .iter()
        .filter(|c| c.status == tuner::Status::Ok)
        .filter_map(|c| Some((c.runoff_ms.or(c.median_ms)?, c.name.parse::<Variant>().ok()?)))
        .filter(|(_, v)| *v != winner)
        .collect();
    timed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let finalists = std::iter::once(winner).chain(timed.into_iter().map(|(_, v)| v).take(2));
    let Ok(tensors) = crate::runner::DeviceTensors::random(engine, shape, [11, 12, 13, 14]) else {
        return winner;
    };
    let mut best: Option<(f64, Variant)> = None;
    let mut tried = Vec::new();
    for (i, v) in finalists.enumerate() {
        let name = format!("{v} (size-generic)");
        if progress(&Progress { done: i, total: 3, name: &name, best: None }).is_err() {
            return winner;
        }
        let Some(kernel) = engine.generic_kernel(&v, shape) else { continue };
        tried.push(v);
        // One run first: a driver may finish compiling at the first dispatch.
        let Ok(times) = tensors.time(engine, &kernel, 1).and_then(|_| tensors.time(engine, &kernel, 10)) else { continue };
        let Some(median) = crate::runner::median(&times) else { continue };
        if best.is_none_or(|(b, _)| median < b) {
            best = Some((median, v));
        }
    }
    let pick = best.map_or(winner, |(_, v)| v);
    for v in tried.iter().filter(|v| **v != pick) {
        engine.drop_generic(v, shape);
    }
    pick
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_argument_is_checked() {
        assert_eq!(budget(Some(0.5)).unwrap(), Duration::from_millis(500));
        assert!(budget(Some(-1.0)).is_err());
        assert!(budget(Some(f64::NAN)).is_err());
    }
}
