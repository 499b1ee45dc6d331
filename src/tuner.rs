//! The autotuner: ranks the variants that can run a shape, times them on the GPU and picks the
//! fastest one whose output matches a trusted reference.
//!
//! The tuner sees kernel families only through `kernels`: the variant list, `fits`, `suits`
//! and each family's own cost estimate.

use crate::check::Comparison;
use crate::compiling::{worker_count, Compiler, StopOnDrop};
use crate::device::{Compiled, Engine};
use crate::error::{Error, Result};
use crate::families::Families;
use crate::first_run::FirstRuns;
use crate::params::ConvShape;
use crate::precision::Precision;
use crate::pool::PooledBuffer;
use crate::runner::{median, DeviceTensors};
use crate::kernels::{self, direct::Direct, Caps, Variant};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Default tuning budget per shape. On the H100 (FMA families, public suite) 1 s found
/// winners as fast as 3 s did on every shape, within 11% of what 20 s found, with first
/// calls of 1.2-1.8 s against 3.5-7 s (benches/results/HISTORY.md, "Tuner: ranking and budget").
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(1);
/// A candidate whose first samples are this much slower than the best so far is dropped.
pub const PRUNE_RATIO: f64 = 1.5;
/// Samples taken before the pruning check.
const PRUNE_AFTER: u32 = 2;
/// Candidates timed again at the end, besides the default: a candidate timed at other
/// clocks, or in a noisy moment, can look a few percent faster than it runs (an H200 run
/// picked a float16 tile at 0.058 ms whose rival, timed earlier, ran 0.052).
const FINALISTS: usize = 3;
/// Turns of the runoff: each finalist is timed once per turn, in order.
const RUNOFF_TURNS: u32 = 3;
/// The runoff's share of the budget, and the runs per finalist per turn it allows at most.
const RUNOFF_SHARE: f64 = 0.1;
const RUNOFF_REPS: u32 = 10;
/// Seeds of the tuning inputs; fixed so results are reproducible.
const SEEDS: (u64, u64, u64) = (0x5EED_0001, 0x5EED_0002, 0x5EED_0003);

/// The trusted variant: plain loops, one output per invocation. Its output is the reference
/// every candidate is checked against, and the fallback when no candidate is valid.
/// Transposed problems have their own family's.
pub fn reference_variant(shape: &ConvShape) -> Variant {
    // A shuffled transposed problem has only its lowered form: the plain loops run that.
    if shape.is_transposed() && shape.pixel_shuffle.is_none() {
        return Variant::Tconv(crate::kernels::tconv::REFERENCE);
    }
    Variant::Direct(Direct { wg_x: 64, wg_y: 1, unroll: 0, tk: 1, tw: 1 })
}

static INJECT_FAULTY: AtomicBool = AtomicBool::new(false);

/// Test hook: when on, every tuning run adds a candidate that runs a real kernel but has half
/// of its output destroyed, as a kernel that writes only part of the output would. It would
/// win on speed if validation ever let it through.
pub fn set_inject_faulty(on: bool) {
    INJECT_FAULTY.store(on, Ordering::SeqCst);
}

pub fn inject_faulty() -> bool {
    INJECT_FAULTY.load(Ordering::SeqCst)
}

/// What happened to one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// Valid and fully timed.
    #[serde(rename = "ok")]
    Ok,
    /// Valid, but its first samples were more than `PRUNE_RATIO` times the best so far.
    #[serde(rename = "pruned")]
    Pruned,
    /// Its output did not match the reference.
    #[serde(rename = "wrong")]
    Wrong,
    #[serde(rename = "compile error")]
    CompileError,
    #[serde(rename = "out of memory")]
    OutOfMemory,
    /// Any other failure while building or running it.
    #[serde(rename = "error")]
    Failed,
    /// The tuning budget ran out before it was reached.
    #[serde(rename = "skipped (budget)")]
    SkippedBudget,
}

impl Status {
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Pruned => "pruned",
            Status::Wrong => "wrong",
            Status::CompileError => "compile error",
            Status::OutOfMemory => "out of memory",
            Status::Failed => "error",
            Status::SkippedBudget => "skipped (budget)",
        }
    }
}

/// One candidate's outcome, as reported and cached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateResult {
    pub name: String,
    pub status: Status,
    /// GPU milliseconds of each timed run, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples_ms: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_ms: Option<f64>,
    /// Why it failed or was dropped (error message, measured error), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Wall milliseconds its compilation took on its own thread (candidates compile in
    /// parallel, so these add up to more than the compile phase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_ms: Option<f64>,
    /// Median GPU milliseconds in the runoff, for the fastest few and the default: timed
    /// again after the others, in turns, and the winner is the fastest there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runoff_ms: Option<f64>,
    /// Seconds from the tuning run's start to this candidate's validation, and the wall
    /// milliseconds of its validation, warm-up and samples: where a run's time went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measure_ms: Option<f64>,
}

impl CandidateResult {
    fn new(name: String, status: Status) -> Self {
        CandidateResult {
            name,
            status,
            samples_ms: Vec::new(),
            median_ms: None,
            detail: None,
            compile_ms: None,
            runoff_ms: None,
            at_s: None,
            measure_ms: None,
        }
    }

    /// The variant it ran; `None` for names that do not parse (the faulty test candidate
    /// parses to the variant it copies).
    pub fn variant(&self) -> Option<Variant> {
        let name = self.name.strip_prefix(FAULTY_PREFIX).unwrap_or(&self.name);
        name.parse().ok()
    }
}

/// The outcome of tuning one shape: what the cache stores and `convtune.tune()` reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneReport {
    pub shape: ConvShape,
    /// The precision mode the winner was validated for.
    #[serde(default)]
    pub precision: Precision,
    pub winner: String,
    pub default: String,
    pub reference: String,
    pub default_ms: Option<f64>,
    pub tuned_ms: Option<f64>,
    /// Wall-clock seconds the tuning took, compilation included.
    pub tuning_s: f64,
    /// Where `tuning_s` went; absent in reports cached before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<TuningPhases>,
    pub budget_s: f64,
    /// UTC, ISO 8601.
    pub tuned_at: String,
    pub adapter: String,
    /// The families `CONVTUNE_FAMILIES` allowed; absent when it allowed all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub families: Option<Vec<String>>,
    pub candidates: Vec<CandidateResult>,
}

/// Wall-clock seconds of a tuning run by phase; they add up to its `tuning_s`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TuningPhases {
    /// Random inputs made and uploaded, the reference kernel compiled and run, the GPU
    /// brought to load clocks.
    pub setup_s: f64,
    /// Waiting for candidates to compile (on a pool of threads, on a GPU while earlier
    /// candidates are measured: wall time not hidden behind other work).
    pub compile_s: f64,
    /// Candidates run once on poisoned outputs and compared with the reference.
    pub validate_s: f64,
    /// Candidates warmed up and timed.
    pub timing_s: f64,
    /// After the last candidate was timed: the compiles still in flight, which a worker
    /// cannot abandon inside the driver.
    #[serde(default)]
    pub finish_s: f64,
    /// Everything else: ranking, bookkeeping.
    pub other_s: f64,
}

impl TuneReport {
    /// default_ms / tuned_ms, when both were measured.
    pub fn speedup(&self) -> Option<f64> {
        match (self.default_ms, self.tuned_ms) {
            (Some(d), Some(t)) if t > 0.0 => Some(d / t),
            _ => None,
        }
    }

    pub fn winner_variant(&self) -> Result<Variant> {
        self.winner.parse()
    }
}

/// Sustained load a GPU needs to reach its load clocks from idle: on an H200, 100 ms of load
/// still timed 3-5x slow; half a second suffices.
const GPU_SPIN_UP: Duration = Duration::from_millis(500);

/// A tuning run that starts this soon after the last one ended (a network's layers tuned one
/// after another) finds the GPU at its load clocks: its spin-up ends as soon as the reference
/// kernel's times hold steady (at most `GPU_SPIN_UP` all the same).
const STILL_LOADED: Duration = Duration::from_secs(1);


/// Least and most busy time before each candidate's samples (see `DeviceTensors::settle`).
const CANDIDATE_WARM_UP: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(300));

/// The most of the budget one candidate's samples may take: runs that long (a CPU adapter's,
/// 70-220 ms on lavapipe) are timed fewer times, down to `PRUNE_AFTER`, instead of pushing
/// the first call far past its budget (16 s on a 1 s budget). A GPU's runs of a few ms or
/// less keep every sample.
const SAMPLING_SHARE: f64 = 0.125;

/// Runs a candidate's measurement takes at least on a CPU adapter, in units of its run: the
/// validating run (with its first-run compile), the warm-up and `PRUNE_AFTER` samples. On
/// lavapipe a ranked candidate timed whatever the budget said could take a second a run
/// (the README demo's first shape: p95 3.8 s on a 1 s budget): there it is started only
/// where the default's run time, scaled by the cost model, and the first-run compile say it
/// ends within the budget.
const CPU_MEASURE_RUNS: f64 = 1.0 + PRUNE_AFTER as f64;

/// Knobs of a tuning run.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    pub budget: Duration,
    /// Timed runs per candidate (the first `PRUNE_AFTER` decide on pruning).
    pub samples: u32,
    /// Top-ranked candidates timed whatever the budget says (the default always is).
    pub must_time: usize,
    /// The families candidates may come from (`CONVTUNE_FAMILIES`).
    pub families: Families,
    /// Variants timed whatever the budget says, right after the default, where they serve the
    /// mode: the winner the other precision mode's tuning found for the shape, so that a
    /// looser mode never settles for a slower kernel than a stricter one found.
    pub also: Vec<Variant>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions { budget: DEFAULT_BUDGET, samples: 7, must_time: 3, families: Families::all(), also: Vec::new() }
    }
}

/// Reported to the progress callback before each candidate that is measured and once at the
/// end (`done == total`, `name` empty).
pub struct Progress<'a> {
    pub done: usize,
    pub total: usize,
    pub name: &'a str,
    /// The fastest candidate validated and timed so far (its pipeline is in the engine's
    /// cache): what a caller that cannot wait for the end may run.
    pub best: Option<Variant>,
}

const FAULTY_PREFIX: &str = "faulty:";

#[derive(Clone, Copy, Debug)]
struct Candidate {
    variant: Variant,
    /// The test-only candidate whose output the tuner corrupts.
    faulty: bool,
    /// Timed even when the budget is spent.
    must: bool,
    /// From the ranked list (not the default or another mode's winner): on a CPU adapter its
    /// `must` gives way to the budget (`CPU_MEASURE_RUNS`).
    ranked: bool,
}

impl Candidate {
    fn name(&self) -> String {
        if self.faulty {
            format!("{FAULTY_PREFIX}{}", self.variant)
        } else {
            self.variant.to_string()
        }
    }
}

// ----------------------------------------------------------------------------------------
// Ranking
// ----------------------------------------------------------------------------------------

/// Costs within this factor of each other are one estimate: variants the model cannot tell
/// apart. Only equal estimates (up to rounding): at 1% apart, on an H200 the "high" 3x3
/// layer 1,64,180,320 -> 1024 ranked its fastest tile (`coop_b256x128x16_s4x2_p1_l4`, 0.355
/// against 0.367 ms by name, 0.3% dearer to the model than the first) 52nd, untimed at the
/// default budget.
const SAME_COST: f64 = 1.0 + 1e-9;

/// Every variant that can run `shape` on this adapter, likeliest winners first.
///
/// Variants of one family the model cannot tell apart (equal estimated cost, e.g. differing
/// only in workgroup shape) are spread out: the first of each of the family's cost levels
/// comes first, the others after, so a short budget still tries many kinds of kernel. A
/// variant of another family with the same estimate is not held back (on an H200,
/// wcoop's fastest tile on 32,256,14,14 in float16 ranked 158th behind a coop tile of
/// nearly its cost, untimed at the default budget).
pub fn ranked_candidates(shape: &ConvShape, caps: &Caps) -> Vec<Variant> {
    let mut scored: Vec<(f64, String, Variant)> = kernels::all_variants()
        .into_iter()
        .filter(|v| v.fits(caps) && v.suits(shape))
        .map(|v| (v.cost(shape), v.to_string(), v))
        .collect();
    // Ties broken by name so the order is the same on every run.
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    // Each family's current cost level.
    let mut levels: std::collections::HashMap<&'static str, f64> = std::collections::HashMap::new();
    for (cost, _, v) in scored {
        let level = levels.entry(v.family()).or_insert(f64::NEG_INFINITY);
        if cost > *level * SAME_COST {
            *level = cost;
            first.push(v);
        } else {
            rest.push(v);
        }
    }
    first.extend(rest);
    first
}

/// Untuned choices already made, by problem, precision, allowed families and adapter limits:
/// ranking every variant takes milliseconds, and `CONVTUNE_TUNE=off` chooses at every call.
type ChoiceKey = (ConvShape, Precision, Vec<&'static str>, [u32; 5]);
static DEFAULT_CHOICES: std::sync::LazyLock<std::sync::Mutex<HashMap<ChoiceKey, Variant>>> =
    std::sync::LazyLock::new(Default::default);
/// Entries kept before the memo starts afresh.
const DEFAULT_CHOICES_KEPT: usize = 4096;

/// The untuned choice: on a GPU the likeliest winner the cost model ranks first among the
/// allowed families' variants that serve `precision` (on an H200 the fixed rule it replaced
/// — a 64x64 FMA GEMM tile or a direct kernel — ran the public suite's layers 1.4-12.8x slower
/// than the tuned winners in "highest", `8e60086`); transposed problems, and every problem on
/// a CPU adapter keep the fixed rule: the model's estimates are fitted to GPU timings, and
/// a CPU adapter's kernels are chosen for what they cost there by tuning.
/// An error when no allowed variant can run `shape` on this adapter at `precision`.
pub fn default_choice(shape: &ConvShape, caps: &Caps, precision: Precision, families: &Families) -> Result<Variant> {
    let precision = precision.for_data(shape.dtype);
    if shape.is_transposed() || caps.cpu {
        let rule = kernels::default_variant(shape, caps);
        if families.allows(rule.family()) {
            return Ok(rule);
        }
    }
    let key: ChoiceKey = (*shape, precision, families.allowed().to_vec(), caps.fit_key());
    let memo = || DEFAULT_CHOICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&v) = memo().get(&key) {
        return Ok(v);
    }
    let allowed = |v: &Variant| families.allows(v.family()) && v.serves(precision);
    if let Some(v) = ranked_candidates(shape, caps).into_iter().find(allowed) {
        let mut m = memo();
        if m.len() >= DEFAULT_CHOICES_KEPT {
            m.clear();
        }
        m.insert(key, v);
        return Ok(v);
    }
    // `suits` keeps tiles far larger than the problem out of tuning, but such a tile still
    // computes the right result, and a restricted set may have nothing else.
    let fallback = kernels::all_variants()
        .into_iter()
        .filter(|v| allowed(v) && v.fits(caps) && v.computes(shape))
        .min_by(|a, b| a.cost(shape).total_cmp(&b.cost(shape)).then_with(|| a.to_string().cmp(&b.to_string())));
    fallback.ok_or_else(|| {
        let why: Vec<String> = families
            .allowed()
            .iter()
            .map(|f| {
                let of_f: Vec<Variant> = kernels::all_variants().into_iter().filter(|v| v.family() == *f).collect();
                let needs_tc = of_f.iter().any(|v| v.needs_tensor_cores());
                match caps.tensor_cores_missing() {
                    Some(missing) if needs_tc => format!("{f}: {missing}"),
                    _ if !of_f.iter().any(|v| v.computes(shape)) => format!("{f}: no variant computes this shape"),
                    _ => format!("{f}: no variant fits this adapter and serves precision {}", precision.as_str()),
                }
            })
            .collect();
        Error::invalid(format!(
            "{}={} leaves no kernel variant that can run {} here ({}); allow more families",
            crate::families::ENV,
            families.allowed().join(","),
            shape.label(),
            why.join("; ")
        ))
    })
}

/// The order candidates are tried in: the default (the baseline every speed-up is measured
/// against, and the first bar for pruning), the faulty test candidate when injected, the
/// other mode's winner (`TuneOptions::also`), then the ranked list. The default and the top `must_time` ranked ones ignore the budget. Only
/// families `opts.families` allows take part.
fn timing_order(
    shape: &ConvShape,
    precision: Precision,
    caps: &Caps,
    opts: &TuneOptions,
    faulty: bool,
) -> Result<Vec<Candidate>> {
    let families = &opts.families;
    let default = default_choice(shape, caps, precision, families)?;
    let mut order = vec![Candidate { variant: default, faulty: false, must: true, ranked: false }];
    if faulty {
        order.push(Candidate { variant: default, faulty: true, must: true, ranked: false });
    }
    let mut also: Vec<Variant> = Vec::new();
    for &v in &opts.also {
        let runs = v.serves(precision) && families.allows(v.family()) && v.fits(caps) && v.computes(shape);
        if runs && v != default && !also.contains(&v) {
            also.push(v);
        }
    }
    order.extend(also.iter().map(|&variant| Candidate { variant, faulty: false, must: true, ranked: false }));
    let ranked = ranked_candidates(shape, caps)
        .into_iter()
        .filter(|v| *v != default && !also.contains(v) && v.serves(precision) && families.allows(v.family()));
    // Each family's likeliest winner first (in rank order), then the rest: one batch then
    // compares the families even where the model ranks one family's many variants above
    // another's best (the families' estimates are calibrated against each other on one GPU).
    let (mut leaders, mut rest) = (Vec::new(), Vec::new());
    for v in ranked {
        if leaders.iter().any(|l: &Variant| l.family() == v.family()) {
            rest.push(v);
        } else {
            leaders.push(v);
        }
    }
    leaders.extend(rest);
    for (i, variant) in leaders.into_iter().enumerate() {
        order.push(Candidate { variant, faulty: false, must: i < opts.must_time, ranked: true });
    }
    // The reference is the fallback; make sure it is in the report even if it does not suit.
    let reference = reference_variant(shape);
    let allowed = families.allows(reference.family());
    if allowed && !order.iter().any(|c| c.variant == reference && !c.faulty) && reference.fits(caps) {
        order.push(Candidate { variant: reference, faulty: false, must: false, ranked: true });
    }
    Ok(order)
}

// ----------------------------------------------------------------------------------------
// Validation
// ----------------------------------------------------------------------------------------

/// Max |got - want| / max |want| over elements where the reference is a number; an error
/// message if a candidate leaves a non-number where the reference has a number, or exceeds
/// the tolerance.
pub fn check_against(got: &[f32], want: &[f32], tolerance: f64) -> std::result::Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("output has {} elements, reference {}", got.len(), want.len()));
    }
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs() as f64))
        .max(f64::from(f32::MIN_POSITIVE));
    let mut worst = 0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            continue;
        }
        if !g.is_finite() && g != w {
            return Err(format!("element {i} is {g} where the reference is {w}"));
        }
        if w.is_finite() {
            worst = worst.max((g as f64 - w as f64).abs() / scale);
        }
    }
    if worst > tolerance {
        return Err(format!("max relative error {worst:.2e} exceeds {tolerance:.0e}"));
    }
    Ok(worst)
}

/// The host check's verdict (`check_against`) from a GPU-side comparison.
fn verdict(c: &Comparison, tolerance: f64) -> std::result::Result<(), String> {
    if c.bad > 0 {
        return Err(format!("{} elements are not finite where the reference is", c.bad));
    }
    let worst = c.relative_error();
    // Written so that a NaN error fails.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(worst <= tolerance) {
        return Err(format!("max relative error {worst:.2e} exceeds {tolerance:.0e}"));
    }
    Ok(())
}

/// What a kernel writing only the first half of the output would leave behind.
fn corrupt(out: &mut [f32]) {
    let half = out.len() / 2;
    for v in &mut out[half..] {
        *v = f32::from_bits(crate::check::POISON_BITS);
    }
    if let Some(first) = out.first_mut() {
        *first += 1.0;
    }
}

// ----------------------------------------------------------------------------------------
// Measuring
// ----------------------------------------------------------------------------------------

/// Errors that end the whole tuning run instead of just one candidate.
fn is_fatal(e: &Error) -> bool {
    matches!(e, Error::DeviceLost(_) | Error::Cancelled(_))
}

fn failure(name: String, e: &Error) -> CandidateResult {
    let status = match e {
        Error::Shader { .. } => Status::CompileError,
        Error::OutOfMemory(_) => Status::OutOfMemory,
        _ => Status::Failed,
    };
    CandidateResult { detail: Some(e.to_string()), ..CandidateResult::new(name, status) }
}

/// Shared state of one tuning run.
struct Bench<'a> {
    engine: &'a Engine,
    tensors: DeviceTensors,
    /// The reference output on the host, where the faulty test candidate is checked (else
    /// empty), and on the GPU.
    reference: Vec<f32>,
    reference_gpu: PooledBuffer,
    /// The precision mode's error bound.
    tolerance: f64,
    /// The run's budget (each candidate's samples get `SAMPLING_SHARE` of it at most).
    budget: Duration,
    /// A CPU adapter: no clocks to bring up before timing.
    cpu: bool,
    /// Time spent validating and timing candidates so far.
    validating: Duration,
    timing: Duration,
    /// The wall time of the last validation run: on lavapipe it holds the shader's
    /// compile to machine code, which the driver does at the first dispatch.
    last_run: Duration,
}

impl Bench<'_> {
    /// One poisoned run and its output; this is also the warm-up, so first-run costs stay
    /// out of the samples.
    fn run_checked(&mut self, kernel: &Compiled) -> Result<()> {
        self.tensors.poison(self.engine)?;
        self.tensors.run(self.engine, kernel)
    }

    fn time_ms(&self, kernel: &Compiled, reps: u32) -> Result<Vec<f64>> {
        Ok(self.tensors.time(self.engine, kernel, reps)?.into_iter().map(|s| s * 1e3).collect())
    }

    /// Brings the GPU back to load clocks after the compile that preceded this candidate (a
    /// CPU adapter has none: its validation run was the warm-up).
    fn warm(&self, kernel: &Compiled) -> Result<()> {
        if self.cpu {
            return Ok(());
        }
        self.tensors.settle(self.engine, kernel, CANDIDATE_WARM_UP.0, CANDIDATE_WARM_UP.1)
    }

    /// Validates and times one compiled candidate. `Err` only for errors that end tuning.
    fn measure(
        &mut self,
        c: &Candidate,
        compiled: Result<Compiled>,
        best_ms: Option<f64>,
        opts: &TuneOptions,
    ) -> Result<(CandidateResult, Option<Compiled>)> {
        let name = c.name();
        let kernel = match compiled {
            Ok(k) => k,
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => return Ok((failure(name, &e), None)),
        };
        let t0 = Instant::now();
        let verdict = self.validate(&kernel, c.faulty);
        self.validating += t0.elapsed();
        match verdict {
            Ok((Ok(()), run)) => self.last_run = run,
            Ok((Err(why), _)) => {
                return Ok((CandidateResult { detail: Some(why), ..CandidateResult::new(name, Status::Wrong) }, None))
            }
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => return Ok((failure(name, &e), None)),
        }
        let t0 = Instant::now();
        let sampled = self.sample(&kernel, best_ms, opts);
        self.timing += t0.elapsed();
        match sampled {
            Ok((status, samples)) => Ok((
                CandidateResult {
                    median_ms: median(&samples),
                    samples_ms: samples,
                    detail: (status == Status::Pruned).then(|| {
                        format!("more than {PRUNE_RATIO}x the best so far after {PRUNE_AFTER} samples")
                    }),
                    ..CandidateResult::new(name, status)
                },
                Some(kernel),
            )),
            Err(e) if is_fatal(&e) => Err(e),
            Err(e) => Ok((failure(name, &e), None)),
        }
    }

    /// The verdict (`Err(why)` when the output is wrong) and the wall time of the run.
    fn validate(&mut self, kernel: &Compiled, faulty: bool) -> Result<(std::result::Result<(), String>, Duration)> {
        let t0 = Instant::now();
        self.run_checked(kernel)?;
        let run = t0.elapsed();
        if faulty {
            // The test-only candidate is corrupted on the host, so it takes the host check.
            let mut out = self.tensors.read_y_f32(self.engine)?;
            corrupt(&mut out);
            return Ok((check_against(&out, &self.reference, self.tolerance).map(|_| ()), run));
        }
        // On the GPU: a read-back of a large output would cost more than the run itself.
        Ok((verdict(&self.tensors.compare_y(self.engine, &self.reference_gpu)?, self.tolerance), run))
    }

    fn sample(&self, kernel: &Compiled, best_ms: Option<f64>, opts: &TuneOptions) -> Result<(Status, Vec<f64>)> {
        self.warm(kernel)?;
        let first = PRUNE_AFTER.min(opts.samples.max(1));
        let mut samples = self.time_ms(kernel, first)?;
        if let (Some(best), Some(now)) = (best_ms, median(&samples)) {
            if now > PRUNE_RATIO * best {
                return Ok((Status::Pruned, samples));
            }
        }
        // The rest of the samples, as many as `SAMPLING_SHARE` of the budget allows.
        let run_ms = median(&samples).unwrap_or(0.0).max(1e-6);
        let share_ms = self.budget.as_secs_f64() * 1e3 * SAMPLING_SHARE;
        let more = opts.samples.saturating_sub(first).min(((share_ms / run_ms) as u32).saturating_sub(first));
        if more > 0 {
            samples.extend(self.time_ms(kernel, more)?);
        }
        Ok((Status::Ok, samples))
    }
}

/// `Bench::measure`, with a panic anywhere below it (a generator bug for one unusual
/// variant and shape, say) recorded as that candidate's failure instead of ending tuning.
fn measure_guarded(
    bench: &mut Bench,
    c: &Candidate,
    compiled: Result<Compiled>,
    best_ms: Option<f64>,
    opts: &TuneOptions,
) -> Result<(CandidateResult, Option<Compiled>)> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bench.measure(c, compiled, best_ms, opts))) {
        Ok(r) => r,
        Err(payload) => {
            let msg = crate::error::panic_message(payload.as_ref());
            Ok((CandidateResult { detail: Some(format!("panicked: {msg}")), ..CandidateResult::new(c.name(), Status::Failed) }, None))
        }
    }
}

/// A candidate kept for the runoff: its index in the timing order, its median and kernel.
struct Finalist {
    index: usize,
    ms: f64,
    kernel: Arc<Compiled>,
}

/// Adds a validated, timed candidate to the finalists, which keep the default (index 0)
/// and the `FINALISTS` fastest others.
fn keep_finalist(finalists: &mut Vec<Finalist>, f: Finalist) {
    finalists.push(f);
    finalists.sort_by(|a, b| (a.index != 0).cmp(&(b.index != 0)).then(a.ms.total_cmp(&b.ms)));
    let has_default = finalists.first().is_some_and(|f| f.index == 0);
    finalists.truncate(FINALISTS + has_default as usize);
}

/// Times the finalists again in turns (so that clock changes and noise fall on all of
/// them alike) within `RUNOFF_SHARE` of the budget; their median GPU ms, by index.
/// Where even one run of each finalist would take more than that share (a CPU adapter's long
/// runs), there is no runoff: the first times decide.
fn runoff(bench: &mut Bench, finalists: &[Finalist], budget: Duration) -> Result<Vec<(usize, f64)>> {
    let slowest = finalists.iter().map(|f| f.ms).fold(0.0, f64::max).max(1e-3);
    // Runs of the slowest finalist the share allows, per finalist.
    let allowed = (budget.as_secs_f64() * 1e3 * RUNOFF_SHARE / slowest) as u32 / finalists.len().max(1) as u32;
    if allowed == 0 {
        return Ok(Vec::new());
    }
    let turns = allowed.min(RUNOFF_TURNS);
    let reps = (allowed / turns).clamp(1, RUNOFF_REPS);
    let t0 = Instant::now();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); finalists.len()];
    for _ in 0..turns {
        for (f, s) in finalists.iter().zip(&mut samples) {
            s.extend(bench.time_ms(&f.kernel, reps)?);
        }
    }
    bench.timing += t0.elapsed();
    Ok(finalists.iter().zip(&samples).filter_map(|(f, s)| median(s).map(|m| (f.index, m))).collect())
}

/// Compiles a candidate; a panic in the generator becomes an error of that candidate only.
/// Also returns how long it took.
fn compile_guarded(engine: &Engine, c: &Candidate, shape: &ConvShape) -> (Result<Compiled>, Duration) {
    let t0 = Instant::now();
    let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.compile(&c.variant, shape))) {
        Ok(r) => r,
        Err(_) => Err(Error::Gpu(format!("generating {} panicked", c.name()))),
    };
    (r, t0.elapsed())
}

/// The size of a candidate's WGSL: what its compile time grows with. 0 where it cannot be
/// generated (or the generator panics): compiling it then records why.
fn source_bytes(c: &Candidate, shape: &ConvShape) -> usize {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.variant.generate(shape).map_or(0, |k| k.source.len())))
        .unwrap_or(0)
}

/// Whether a batch compiles while the one before is measured: `CONVTUNE_TUNE_OVERLAP` (`1` or
/// `0`), else on GPUs only: on a CPU adapter the compile threads would compete with the
/// device itself for the cores and disturb its timings.
fn overlap_compiles(on_gpu: bool) -> bool {
    match std::env::var("CONVTUNE_TUNE_OVERLAP").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => on_gpu,
    }
}

/// While a GPU waits for the CPU (compiling), the reference kernel keeps it at load clocks,
/// so the next candidates are not timed at idle clocks.
const BUSY_STEP: Duration = Duration::from_millis(20);

/// Output of the reference variant on the tuning inputs, on the GPU and (`host`: only the
/// faulty test candidate is checked there) on the host, and the compiled reference kernel.
fn reference_output(engine: &Engine, tensors: &DeviceTensors, host: bool) -> Result<(Vec<f32>, PooledBuffer, Compiled)> {
    let kernel = engine.compile(&reference_variant(&tensors.shape), &tensors.shape)?;
    tensors.poison(engine)?;
    tensors.run(engine, &kernel)?;
    let out = if host { tensors.read_y_f32(engine)? } else { Vec::new() };
    Ok((out, tensors.copy_y(engine)?, kernel))
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn iso_utc(secs: u64) -> String {
    // Days to civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn now_iso() -> String {
    iso_utc(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

/// Tunes `shape` on `engine`. Candidates that fail in any way are recorded and skipped; the
/// winner is always a candidate whose output matched the reference, else the reference
/// itself. `progress` is called before each candidate; an error from it cancels tuning.
/// Errors: the inputs or the reference could not be set up, the device was lost, or
/// `progress` cancelled.
pub fn tune(
    engine: &Engine,
    shape: &ConvShape,
    precision: Precision,
    opts: &TuneOptions,
    progress: &mut dyn FnMut(&Progress) -> Result<()>,
) -> Result<TuneReport> {
    let start = Instant::now();
    let precision = precision.for_data(shape.dtype);
    // Before the inputs are made: a shape too large for one binding must not cost gigabytes
    // of random data first.
    crate::memory::check(engine, "tuning", &crate::memory::whole_problem(shape, engine.max_binding())?)?;
    let order = timing_order(shape, precision, &engine.caps, opts, inject_faulty())?;
    let on_gpu = engine.desc.device_type != "Cpu";
    let overlap = overlap_compiles(on_gpu);
    // A candidate is compiled while it can be expected to compile within the budget, at the
    // slowest rate per byte of WGSL seen so far (compile time grows with the unrolled code:
    // 5 ms to 1.5 s per candidate on an H200); the must-time candidates always are.
    // On a GPU the budget is for candidates: its clock starts when the set-up (inputs,
    // reference, GPU spin-up) is done, and until then it is all left. A CPU adapter's set-up
    // (0.1-0.3 s on lavapipe, its reference kernel compiled at its first run) counts: there
    // the first call is held to the budget as a whole.
    let clock: OnceLock<Instant> = OnceLock::new();
    let spent = || clock.get().map_or(Duration::ZERO, |t| t.elapsed());
    // Bytes of each candidate's WGSL, generated once for the compile and first-run estimates.
    let sizes: Vec<OnceLock<usize>> = (0..order.len()).map(|_| OnceLock::new()).collect();
    let bytes_of = |i: usize| *sizes[i].get_or_init(|| source_bytes(&order[i], shape));
    let want = |i: usize, rate: Option<f64>| -> bool {
        let c = &order[i];
        let left = opts.budget.as_secs_f64() - spent().as_secs_f64();
        // Past the budget nothing is generated: hundreds of candidates are skipped.
        c.must || (left >= 0.0 && rate.is_none_or(|r| r * bytes_of(i) as f64 <= left))
    };
    let compile = |i: usize| compile_guarded(engine, &order[i], shape);
    let total = order.len();
    let compiler = Compiler::new(total, worker_count(), overlap);
    let mut measured: Vec<Option<CandidateResult>> = (0..total).map(|_| None).collect();
    let mut best: Option<(usize, f64)> = None;
    let mut finalists: Vec<Finalist> = Vec::new();
    let mut compiling = Duration::ZERO;
    let (setup, validating, timing, last) = std::thread::scope(|scope| -> Result<(Duration, Duration, Duration, Instant)> {
        // With overlap the workers start at once: the first candidates compile while the
        // inputs and the reference are set up and the GPU spins up.
        for _ in 0..compiler.threads() {
            scope.spawn(|| compiler.run_worker(want, compile));
        }
        let _stop = StopOnDrop(&compiler);
        let tensors = DeviceTensors::random(engine, shape, [SEEDS.0, SEEDS.1, SEEDS.2, SEEDS.2 ^ 0x2])?;
        let host_reference = order.iter().any(|c| c.faulty);
        let (reference, reference_gpu, reference_kernel) = reference_output(engine, &tensors, host_reference)?;
        // Until a candidate is validated, the reference kernel is the best a caller that
        // cannot wait may run (`Progress::best`): kept compiled while the run lasts.
        let reference_kernel = Arc::new(reference_kernel);
        let fallback = opts.families.allows(reference_variant(shape).family()).then(|| {
            engine.keep_pipeline(&reference_variant(shape), shape, reference_kernel.clone());
            reference_variant(shape)
        });
        if on_gpu {
            // A GPU that idled before tuning runs the first candidates (the default among
            // them) at low clocks for a while; bring it to load clocks first (see `settle`).
            let loaded = engine.last_tuned.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|t| t.elapsed() < STILL_LOADED);
            tensors.settle(engine, &reference_kernel, if loaded { Duration::ZERO } else { GPU_SPIN_UP }, GPU_SPIN_UP)?;
        }
        let mut bench = Bench {
            engine,
            tensors,
            reference,
            reference_gpu,
            tolerance: precision.validation_bound(shape.dtype),
            budget: opts.budget,
            cpu: !on_gpu,
            validating: Duration::ZERO,
            timing: Duration::ZERO,
            last_run: Duration::ZERO,
        };
        let setup = start.elapsed();
        let _ = clock.set(if on_gpu { Instant::now() } else { start });
        // Candidates are timed as they come out of the compile pool (ranked order where
        // compiles keep up); past the budget only the must-time ones still are, and then
        // (`draining`) those compiled while the compiles already under way finish, which
        // the run waits for anyway.
        let musts = order.iter().filter(|c| c.must).count();
        let (mut musts_seen, mut done, mut draining) = (0, 0, false);
        let mut first_runs = FirstRuns::default();
        // A CPU adapter's ms per unit of the cost model, from the default's run.
        let mut ms_per_cost: Option<f64> = None;
        let measure_s = |i: usize, scale: Option<f64>| scale.map_or(0.0, |k| k * order[i].variant.cost(shape) * CPU_MEASURE_RUNS / 1e3);
        loop {
            if !draining && spent() > opts.budget && musts_seen >= musts {
                compiler.stop();
                draining = true;
            }
            let t0 = Instant::now();
            let next = {
                // While the CPU compiles, the reference kernel keeps a GPU at load clocks.
                let mut busy = || bench.tensors.settle(engine, &reference_kernel, Duration::ZERO, BUSY_STEP);
                compiler.next(on_gpu.then_some(&mut busy as &mut dyn FnMut() -> Result<()>))?
            };
            compiling += t0.elapsed();
            let Some((i, built)) = next else { break };
            let c = &order[i];
            musts_seen += c.must as usize;
            // On a CPU adapter (lavapipe) a first run compiles the shader to machine code,
            // up to a second for the largest (`FirstRuns` estimates it), and beyond the
            // must-time candidates none starts one that would end past the budget.
            let bytes = if on_gpu || built.is_none() { 0 } else { bytes_of(i) };
            let first_run = first_runs.estimate(c.variant.family(), bytes);
            let fits = spent().as_secs_f64() + first_run + measure_s(i, ms_per_cost) <= opts.budget.as_secs_f64();
            let must = c.must && (on_gpu || !c.ranked || fits);
            let timed = must || (fits && (spent() <= opts.budget || (draining && compiler.busy())));
            let Some((k, took)) = built.filter(|_| timed) else { continue };
            progress(&Progress { done, total, name: &c.name(), best: best.map(|(b, _)| order[b].variant).or(fallback) })?;
            done += 1;
            bench.last_run = Duration::ZERO;
            let at = start.elapsed();
            let (mut r, kernel) = measure_guarded(&mut bench, c, k, best.map(|b| b.1), opts)?;
            r.at_s = Some(at.as_secs_f64());
            r.measure_ms = Some((start.elapsed() - at).as_secs_f64() * 1e3);
            first_runs.record(c.variant.family(), bytes, bench.last_run, r.median_ms, i == 0);
            r.compile_ms = Some(took.as_secs_f64() * 1e3);
            if let (false, 0, Some(ms)) = (on_gpu, i, r.median_ms) {
                let cost = c.variant.cost(shape);
                ms_per_cost = (cost.is_finite() && cost > 0.0).then(|| ms / cost);
            }
            if let (Status::Ok, Some(ms), false, Some(kernel)) = (r.status, r.median_ms, c.faulty, kernel) {
                let kernel = Arc::new(kernel);
                if best.is_none_or(|(_, b)| ms < b) {
                    // The best so far is kept compiled for a caller that cannot wait for
                    // the end (`Progress::best`); the one it replaces is dropped.
                    if let Some((b, _)) = best {
                        engine.drop_pipeline(&order[b].variant, shape);
                    }
                    best = Some((i, ms));
                    engine.keep_pipeline(&c.variant, shape, kernel.clone());
                }
                keep_finalist(&mut finalists, Finalist { index: i, ms, kernel });
            }
            measured[i] = Some(r);
        }
        // A runoff that fails (but for a lost device) leaves the first times to decide.
        match (finalists.len() > 1).then(|| runoff(&mut bench, &finalists, opts.budget)) {
            Some(Ok(times)) => {
                for &(i, ms) in &times {
                    if let Some(r) = measured[i].as_mut() {
                        r.runoff_ms = Some(ms);
                    }
                }
                let first = best;
                best = times.into_iter().min_by(|a, b| a.1.total_cmp(&b.1)).or(best);
                if let (Some((was, _)), Some((now, _))) = (first, best) {
                    if was != now {
                        engine.drop_pipeline(&order[was].variant, shape);
                    }
                }
            }
            Some(Err(e)) if is_fatal(&e) => return Err(e),
            _ => {}
        }
        if let (Some(r), Some((b, _))) = (fallback, best) {
            if order[b].variant != r {
                engine.drop_pipeline(&r, shape);
            }
        }
        Ok((setup, bench.validating, bench.timing, Instant::now()))
    })?;
    // The scope has joined the workers: what they still had in hand took this long.
    let finishing = last.elapsed();
    if let Some(f) = best.and_then(|(i, _)| finalists.into_iter().find(|f| f.index == i)) {
        engine.keep_pipeline(&order[f.index].variant, shape, f.kernel);
    }
    *engine.last_tuned.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    progress(&Progress { done: total, total, name: "", best: best.map(|(i, _)| order[i].variant) })?;
    // In ranked order; what was not timed was skipped for the budget.
    let results: Vec<CandidateResult> = measured
        .into_iter()
        .zip(&order)
        .map(|(r, c)| r.unwrap_or_else(|| CandidateResult::new(c.name(), Status::SkippedBudget)))
        .collect();

    let default = order[0].variant;
    let winner = match best {
        Some((i, _)) => order[i].variant,
        // The reference checks candidates whatever the families, but wins only if allowed.
        None if opts.families.allows(reference_variant(shape).family()) => reference_variant(shape),
        None => {
            return Err(Error::Gpu(format!(
                "no candidate of the kernel families {}={} allows ran {} correctly",
                crate::families::ENV,
                opts.families.allowed().join(","),
                shape.label()
            )))
        }
    };
    // The runoff's times where it ran (the default ran in it whenever it ran correctly).
    let timed = |v: Variant| {
        results.iter().find(|r| r.name == v.to_string()).and_then(|r| r.runoff_ms.or(r.median_ms))
    };
    Ok(TuneReport {
        shape: *shape,
        precision,
        winner: winner.to_string(),
        default: default.to_string(),
        reference: reference_variant(shape).to_string(),
        default_ms: timed(default),
        tuned_ms: timed(winner),
        tuning_s: start.elapsed().as_secs_f64(),
        phases: Some(phases(start.elapsed(), [setup, compiling, validating, timing, finishing])),
        budget_s: opts.budget.as_secs_f64(),
        tuned_at: now_iso(),
        adapter: engine.desc.name.clone(),
        families: (!opts.families.is_all()).then(|| opts.families.allowed().iter().map(|f| f.to_string()).collect()),
        candidates: results,
    })
}

/// `known`: set-up, compile waits, validation, timing and finishing, in that order.
fn phases(total: Duration, known: [Duration; 5]) -> TuningPhases {
    let [setup, compile, validate, timing, finish] = known.map(|d| d.as_secs_f64());
    TuningPhases {
        setup_s: setup,
        compile_s: compile,
        validate_s: validate,
        timing_s: timing,
        finish_s: finish,
        other_s: total.saturating_sub(known.iter().sum()).as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::engine;
    use crate::params::Padding;

    /// An H100's limits as its Vulkan driver reports them (no cooperative matrices here).
    fn h100_caps() -> Caps {
        Caps::from_limits(wgpu::Limits {
            max_compute_workgroup_storage_size: 49152,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroup_size_x: 1024,
            max_compute_workgroup_size_y: 1024,
            ..wgpu::Limits::default()
        })
    }

    fn shape(x: [usize; 4], w: [usize; 4], pad: i64, groups: i64) -> ConvShape {
        ConvShape::new(x, w, (1, 1), Padding::Explicit(pad, pad), (1, 1), groups, None).unwrap()
    }

    /// Within a family, a variant whose estimate equals an earlier one's waits until every cost level of
    /// every family has had its first; a variant of another family is never held back by it.
    #[test]
    fn only_a_familys_own_near_twins_are_held_back() {
        let mut caps = h100_caps();
        caps.tensor_cores = true;
        let s = shape([32, 256, 14, 14], [256, 256, 3, 3], 1, 1).with_layout(crate::params::Layout::Nhwc).with_dtype(crate::dtype::DType::F16);
        let ranked = ranked_candidates(&s, &caps);
        let costs: Vec<f64> = ranked.iter().map(|v| v.cost(&s)).collect();
        // Where the order leaves cost order, the later-placed variant has a cheaper sibling
        // of its own family within SAME_COST placed before the fall.
        let held = ranked.iter().zip(&costs).enumerate().skip_while(|(i, _)| *i == 0 || costs[*i] >= costs[*i - 1]).map(|(i, _)| i).next().unwrap();
        for (i, (v, &c)) in ranked.iter().zip(&costs).enumerate().skip(held) {
            let twin = ranked[..held].iter().any(|u| u.family() == v.family() && c <= u.cost(&s) * SAME_COST && u.cost(&s) <= c);
            assert!(twin, "{i}: {v} ({c:.4e}) held back without a twin of its family");
        }
        // wcoop's two 128x128 tiles differ only in subgroups: one comes early, one waits.
        let pos = |name: &str| ranked.iter().position(|v| v.to_string() == name).unwrap();
        let (a, b) = (pos("wcoop_m2_b128x128x32_s2x2_p1"), pos("wcoop_m2_b128x128x32_s2x4_p1"));
        assert!(a.min(b) < held && a.max(b) >= held, "{a} {b} {held}");
    }

    /// A variant a hair dearer than another of its family is not held back with the equal
    /// ones: on an H200 `coop_b256x128x16_s4x2_p1_l4` ran the "high" 1024-channel 3x3 layer
    /// 3% faster than the cheapest-ranked tile, 0.3% away, which had pushed it 52nd.
    #[test]
    fn a_variant_a_hair_dearer_is_not_held_back() {
        let mut caps = h100_caps();
        caps.tensor_cores = true;
        let s = shape([1, 64, 180, 320], [1024, 64, 3, 3], 1, 1);
        let ranked: Vec<String> = ranked_candidates(&s, &caps).iter().map(|v| v.to_string()).filter(|n| n.contains("_p1")).collect();
        let pos = |name: &str| ranked.iter().position(|n| n == name).unwrap();
        assert!(pos("coop_b512x64x16_s8x1_p1_l4") < 2 && pos("coop_b256x128x16_s4x2_p1_l4") < 2, "{:?}", &ranked[..8]);
    }

    #[test]
    fn iso_dates() {
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn check_rejects_nan_and_large_errors() {
        let want = [1.0f32, -2.0, 4.0];
        assert!(check_against(&[1.0, -2.0, 4.0], &want, 1e-5).is_ok());
        assert!(check_against(&[1.0, -2.0, 4.00001], &want, 1e-5).is_ok());
        assert!(check_against(&[1.0, f32::NAN, 4.0], &want, 1e-5).is_err());
        assert!(check_against(&[1.0, -2.0, 4.01], &want, 1e-5).is_err());
        // Where the reference itself is NaN, the candidate is not judged.
        assert!(check_against(&[1.0, 0.0, 4.0], &[1.0, f32::NAN, 4.0], 1e-5).is_ok());
        let mut out = vec![1.0f32; 8];
        corrupt(&mut out);
        assert!(check_against(&out, &[1.0; 8], 1e-5).is_err());
    }

    #[test]
    fn ranking_prefers_wino_or_gemm_for_large_problems_and_direct_for_depthwise() {
        let caps = Caps::from_limits(wgpu::Limits::default());
        // Large 3x3 stride-1 problems go to a Winograd family (16 multiply-adds per 2x2
        // outputs fused, 36 per 4x4 in the non-fused one, where GEMM does 36 per output),
        // other large ones to GEMM.
        let big = shape([8, 256, 28, 28], [256, 256, 3, 3], 1, 1);
        assert!(["wino", "wgemm"].contains(&ranked_candidates(&big, &caps)[0].family()));
        // 1x1 layers of up to 256 channels: the stem family's broadcast weights (on an H200
        // 0.114 ms on 32,64,56,56 -> 256 against GEMM's 0.183).
        let pointwise = shape([8, 256, 28, 28], [256, 256, 1, 1], 0, 1);
        assert_eq!(ranked_candidates(&pointwise, &caps)[0].family(), "stem");
        let deep_pointwise = shape([8, 512, 28, 28], [256, 512, 1, 1], 0, 1);
        assert_eq!(ranked_candidates(&deep_pointwise, &caps)[0].family(), "gemm");
        let dw = shape([1, 64, 56, 56], [64, 1, 3, 3], 1, 64);
        assert_eq!(ranked_candidates(&dw, &caps)[0].family(), "direct");
        // In NHWC the dwise family, two channels per invocation and a 2x4 tile first: on an
        // H200 (`da91210`) `dwise_wg128_c2_w4h2` won MobileNetV2's 3x3 and EfficientNet's 5x5
        // depthwise layers in float16, the other winners c2 (or c4) variants of 1x1-2x4 tiles.
        let mobilenet = shape([32, 144, 56, 56], [144, 1, 3, 3], 1, 144).with_layout(crate::params::Layout::Nhwc);
        for dt in [crate::dtype::DType::F16, crate::dtype::DType::F32] {
            assert_eq!(ranked_candidates(&mobilenet.with_dtype(dt), &caps)[0].to_string(), "dwise_wg128_c2_w4h2");
        }
        let first_layer = shape([8, 3, 224, 224], [64, 3, 3, 3], 1, 1);
        assert_eq!(ranked_candidates(&first_layer, &caps)[0].family(), "stem");
        // On a large problem gathered pixel by pixel GEMM's first candidate keeps registers
        // few (4x4 outputs per invocation, 8-deep steps), as the H100's fastest did:
        // occupancy hides the gathers. Where x is read as vec4s (1x1 at stride 1), larger
        // register tiles, as the H200's fastest were.
        let gemm_first = |s: &ConvShape| ranked_candidates(s, &caps).into_iter().find(|v| v.family() == "gemm").unwrap();
        let knob = |v: &Variant, name: &str| v.knobs().into_iter().find(|&(k, _)| k == name).unwrap().1;
        let first = gemm_first(&big);
        assert_eq!((knob(&first, "tm") * knob(&first, "tn"), knob(&first, "bk")), (16, 8), "{first}");
        let first = gemm_first(&pointwise);
        assert!(knob(&first, "tm") * knob(&first, "tn") > 16, "{first}");
    }

    /// Not a test of speed: prints the ranking of the FMA families for the public suite, one
    /// line per shape, for comparing with measured candidate times (benches/tuner_budget.py)
    /// (`cargo test --release --no-default-features -- --ignored --nocapture ranking_report`).
    #[test]
    #[ignore]
    fn ranking_report() {
        // RANK_PRECISION=high|highest|float16 ranks with the H100's tensor cores; unset, the
        // FMA families for "highest" as on an adapter without them.
        let mode = std::env::var("RANK_PRECISION").ok();
        let mut caps = h100_caps();
        caps.tensor_cores = mode.is_some();
        let precision = match mode.as_deref() {
            Some("high") | Some("float16") => Precision::High,
            _ => Precision::Highest,
        };
        let suite: [([usize; 4], [usize; 4], i64, i64); 10] = [
            ([32, 3, 224, 224], [64, 3, 7, 7], 2, 3),
            ([32, 3, 224, 224], [64, 3, 3, 3], 1, 1),
            ([32, 64, 56, 56], [64, 64, 3, 3], 1, 1),
            ([32, 128, 56, 56], [128, 128, 3, 3], 2, 1),
            ([32, 256, 14, 14], [256, 256, 3, 3], 1, 1),
            ([32, 512, 7, 7], [512, 512, 3, 3], 1, 1),
            ([32, 256, 56, 56], [64, 256, 1, 1], 1, 0),
            ([32, 64, 56, 56], [256, 64, 1, 1], 1, 0),
            ([1, 64, 720, 1280], [64, 64, 3, 3], 1, 1),
            ([1, 3, 225, 225], [32, 3, 3, 3], 1, 0),
        ];
        for (x, w, stride, p) in suite {
            let mut s = ConvShape::new(x, w, (stride, stride), Padding::Explicit(p, p), (1, 1), 1, None).unwrap();
            if mode.as_deref() == Some("float16") {
                s = s.with_layout(crate::params::Layout::Nhwc).with_dtype(crate::dtype::DType::F16);
            }
            // RANK_LAYOUT=NHWC ranks the channels-last problems.
            if std::env::var("RANK_LAYOUT").as_deref() == Ok("NHWC") {
                s = s.with_layout(crate::params::Layout::Nhwc);
            }
            let order = timing_order(&s, precision.for_data(s.dtype), &caps, &TuneOptions::default(), false).unwrap();
            let names: Vec<String> = order.iter().map(|c| format!("{}:{:.4e}", c.variant, c.variant.cost(&s))).collect();
            println!("RANK {}\t{}", s.label(), names.join(" "));
        }
    }

    #[test]
    fn each_family_is_tried_with_its_likeliest_winner_right_after_the_default() {
        let caps = h100_caps();
        let s = shape([8, 64, 56, 56], [64, 64, 3, 3], 1, 1);
        let order = timing_order(&s, Precision::Highest, &caps, &TuneOptions::default(), false).unwrap();
        let ranked: Vec<Variant> = ranked_candidates(&s, &caps)
            .into_iter()
            .filter(|v| *v != order[0].variant && v.serves(Precision::Highest))
            .collect();
        let mut families: Vec<&str> = ranked.iter().map(|v| v.family()).collect();
        families.sort_unstable();
        families.dedup();
        assert!(families.len() >= 3, "{families:?}");
        let leaders = &order[1..1 + families.len()];
        for f in &families {
            let first = ranked.iter().find(|v| v.family() == *f).unwrap();
            assert!(leaders.iter().any(|c| c.variant == *first), "{f}: {first} is not among the leaders");
        }
        // Then the rest, in rank order.
        let rest: Vec<Variant> = order[1 + families.len()..].iter().map(|c| c.variant).filter(|v| ranked.contains(v)).collect();
        let expected: Vec<Variant> = ranked.iter().copied().filter(|v| !leaders.iter().any(|c| c.variant == *v)).collect();
        assert_eq!(rest, expected);
    }

    #[test]
    fn candidates_fit_and_suit() {
        let caps = Caps::from_limits(wgpu::Limits::downlevel_defaults());
        let s = shape([1, 3, 32, 32], [8, 3, 3, 3], 0, 1);
        let c = ranked_candidates(&s, &caps);
        assert!(!c.is_empty());
        assert!(c.iter().all(|v| v.fits(&caps) && v.suits(&s)));
        let order = timing_order(&s, Precision::Highest, &caps, &TuneOptions::default(), true).unwrap();
        // The default is the model's likeliest winner, timed first.
        assert_eq!(order[0].variant, c[0]);
        assert_eq!(order[0].variant, default_choice(&s, &caps, Precision::Highest, &Families::all()).unwrap());
        assert!(order[1].faulty && order[1].must);
        assert_eq!(order.iter().filter(|c| c.must).count(), 2 + 3);
    }

    /// The other mode's winner is timed right after the default whatever the budget, once,
    /// and only where it serves the mode being tuned.
    #[test]
    fn the_other_modes_winner_is_timed_where_it_serves() {
        let caps = Caps::from_limits(wgpu::Limits::downlevel_defaults());
        let s = shape([2, 16, 20, 20], [32, 16, 3, 3], 1, 1);
        let default = kernels::default_variant(&s, &caps);
        // A late-ranked FMA variant, as a "highest" tuning run may have found it.
        let late = *ranked_candidates(&s, &caps).iter().rev().find(|v| v.family() != default.family()).unwrap();
        let opts = TuneOptions { also: vec![late, late], must_time: 0, ..TuneOptions::default() };
        let order = timing_order(&s, Precision::High, &caps, &opts, false).unwrap();
        assert_eq!((order[1].variant, order[1].must), (late, true));
        assert_eq!(order.iter().filter(|c| c.variant == late).count(), 1);
        // A split tensor-core kernel serves "highest" only: "high" does not time it.
        let split = "coop_b64x64x16_s2x2_p3".parse::<Variant>().unwrap();
        let opts = TuneOptions { also: vec![split], ..TuneOptions::default() };
        let order = timing_order(&s, Precision::High, &caps, &opts, false).unwrap();
        assert!(order.iter().all(|c| c.variant != split));
    }

    #[test]
    fn a_family_restriction_holds_for_the_default_and_every_candidate() {
        let caps = Caps::from_limits(wgpu::Limits::downlevel_defaults());
        // The rule picks a direct kernel here; with gemm alone the default is a gemm one.
        let s = shape([1, 3, 32, 32], [8, 3, 3, 3], 0, 1);
        assert_eq!(kernels::default_variant(&s, &caps).family(), "direct");
        let gemm = Families::parse("gemm").unwrap();
        assert_eq!(default_choice(&s, &caps, Precision::Highest, &gemm).unwrap().family(), "gemm");
        let opts = TuneOptions { families: gemm, ..TuneOptions::default() };
        let order = timing_order(&s, Precision::Highest, &caps, &opts, false).unwrap();
        assert!(order.len() > 1 && order.iter().all(|c| c.variant.family() == "gemm"));
        // Tensor-core kernels cannot run without cooperative matrices: a clear error, no panic.
        let coop = Families::parse("coop").unwrap();
        let e = default_choice(&s, &caps, Precision::High, &coop).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
        assert!(e.to_string().contains("CONVTUNE_FAMILIES=coop") && e.to_string().contains("cooperative"), "{e}");
    }

    /// With tensor cores at hand, pixel-shuffled and transposed problems are tuned on the
    /// tensor-core family too (its stores, and split-K's finishing pass, go through
    /// `ystore`), split-K only where the grid leaves half the GPU idle, as for any problem;
    /// a dilated transposed problem (no lowered form) stays on its own family.
    #[test]
    fn moved_outputs_reach_tensor_cores_and_split_k_only_on_short_grids() {
        let mut caps = h100_caps();
        caps.tensor_cores = true;
        let split = |v: &Variant| matches!(v, Variant::Coop(c) if c.splits > 1);
        let t = ConvShape::new_transposed([8, 64, 32, 32], [64, 64, 4, 4], (2, 2), (1, 1), (0, 0), (1, 1), 1, None).unwrap();
        for n in [8, 32] {
            let plain = shape([n, 64, 32, 32], [256, 64, 3, 3], 1, 1);
            let tn = ConvShape::new_transposed([n, 64, 32, 32], [64, 64, 4, 4], (2, 2), (1, 1), (0, 0), (1, 1), 1, None).unwrap();
            for s in [plain.with_pixel_shuffle(2).unwrap(), tn] {
                let ranked = ranked_candidates(&s, &caps);
                assert!(ranked.iter().any(|v| v.family() == "coop"), "{}", s.label());
                // 32 images of 32x32 outputs (or of the lowered 33x33) fill the grid of every tile.
                assert!(n == 8 || !ranked.iter().any(split), "{}", s.label());
            }
        }
        assert!(ranked_candidates(&t, &caps).iter().any(|v| v.family() == "tconv"));
        // Dilated past stride 1: its spread-out kernel's lowered form on the FMA and
        // tensor-core families competes with tconv.
        let dilated = ConvShape::new_transposed([8, 64, 32, 32], [64, 64, 3, 3], (2, 2), (1, 1), (0, 0), (2, 2), 1, None).unwrap();
        let ranked = ranked_candidates(&dilated, &caps);
        assert!(ranked.iter().any(|v| v.family() == "tconv") && ranked.iter().any(|v| v.family() == "gemm"));
        assert!(ranked.iter().any(|v| v.needs_tensor_cores()));
    }

    #[test]
    fn tuning_picks_a_valid_winner_and_never_the_faulty_candidate() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        let s = shape([1, 4, 12, 12], [8, 4, 3, 3], 1, 1);
        set_inject_faulty(true);
        let opts = TuneOptions { budget: Duration::from_millis(300), samples: 3, must_time: 2, ..TuneOptions::default() };
        let mut calls = 0;
        let report = tune(&e, &s, Precision::Highest, &opts, &mut |_| {
            calls += 1;
            Ok(())
        });
        set_inject_faulty(false);
        let report = report.unwrap();
        let skipped = report.candidates.iter().filter(|c| c.status == Status::SkippedBudget).count();
        assert_eq!(calls, report.candidates.len() - skipped + 1);
        let faulty = report.candidates.iter().find(|c| c.name.starts_with(FAULTY_PREFIX)).unwrap();
        assert_eq!(faulty.status, Status::Wrong);
        assert!(!report.winner.starts_with(FAULTY_PREFIX));
        let win = report.candidates.iter().find(|c| c.name == report.winner).unwrap();
        assert_eq!(win.status, Status::Ok);
        assert!(report.tuned_ms.unwrap() <= report.default_ms.unwrap());
        assert!(report.candidates.iter().any(|c| c.status == Status::SkippedBudget));
    }

    #[test]
    fn a_cancelling_callback_stops_tuning() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        let s = shape([1, 2, 6, 6], [2, 2, 3, 3], 0, 1);
        let r = tune(&e, &s, Precision::High, &TuneOptions::default(), &mut |p| {
            if p.done == 1 { Err(Error::Cancelled("stop".into())) } else { Ok(()) }
        });
        assert!(matches!(r, Err(Error::Cancelled(_))));
    }
}
