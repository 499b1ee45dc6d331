//! `cargo bench`: per shape of the default suite, the default variant against the tuned one,
//! on whatever adapter convtune picks (lavapipe on a CPU-only machine).
//!
//! Times are GPU time from timestamp queries where the adapter has them (else wall clock
//! around a queue sync), so they show kernel speed, not upload and read-back. The tuned
//! variant comes from the tuning cache as `CONVTUNE_TUNE` says (tuning first when needed).

use convtune::{Conv2d, Engine, Plan};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;

/// The default suite of `python -m convtune` (python/convtune/__main__.py): x shape, K, R=S,
/// stride, padding, groups.
const SUITE: [([usize; 4], usize, usize, i64, i64, i64); 6] = [
    ([1, 3, 225, 225], 32, 3, 1, 0, 1),
    ([1, 3, 64, 64], 16, 7, 2, 3, 1),
    ([1, 16, 32, 32], 32, 3, 1, 1, 1),
    ([2, 32, 16, 16], 64, 1, 1, 0, 1),
    ([1, 32, 28, 28], 32, 3, 1, 1, 32),
    ([1, 16, 32, 32], 16, 5, 2, 2, 1),
];

fn problems() -> Vec<Conv2d> {
    SUITE
        .iter()
        .filter_map(|&(x, k, rs, stride, pad, groups)| {
            let w = [k, x[1] / groups as usize, rs, rs];
            Conv2d::builder(x, w).stride(stride).padding(pad).groups(groups).build().ok()
        })
        .collect()
}

/// GPU seconds of `iters` runs, in batches the timer accepts.
fn gpu_time(engine: &Engine, plan: &Plan, iters: u64) -> Duration {
    let mut left = iters;
    let mut total = 0.0;
    while left > 0 {
        let batch = left.min(1024) as u32;
        match engine.time(plan, batch, 0) {
            Ok(times) => total += times.iter().sum::<f64>(),
            Err(e) => {
                eprintln!("timing failed: {e}");
                return Duration::MAX / 4;
            }
        }
        left -= batch as u64;
    }
    Duration::from_secs_f64(total)
}

fn bench_shape(c: &mut Criterion, engine: &Engine, problem: &Conv2d) {
    let label = problem.label();
    // The same untuned choice conv2d makes, within CONVTUNE_FAMILIES.
    let default = match engine.default_variant(problem).and_then(|v| engine.choose(problem, Some(&v), &mut |_| Ok(()))) {
        Ok(p) => p,
        Err(e) => return eprintln!("{label}: {e}"),
    };
    let tuned = match engine.plan(problem) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{label}: tuning failed ({e}); benchmarking the default only");
            default.clone()
        }
    };
    let mut group = c.benchmark_group(&label);
    group.throughput(Throughput::Elements(problem.flops() as u64));
    for (which, plan) in [("default", default), ("tuned", tuned)] {
        group.bench_function(BenchmarkId::new(which, plan.variant()), |b| b.iter_custom(|iters| gpu_time(engine, &plan, iters)));
    }
    group.finish();
}

fn conv2d(c: &mut Criterion) {
    let engine = match Engine::shared() {
        Ok(e) => e,
        Err(e) => return eprintln!("no GPU adapter ({e}); nothing to benchmark"),
    };
    eprintln!("adapter: {} ({})", engine.adapter_desc().name, engine.adapter_desc().backend);
    for problem in problems() {
        bench_shape(c, &engine, &problem);
    }
}

criterion_group! {
    name = benches;
    // Kernels on a CPU driver take up to ~100 ms; keep each benchmark to a few seconds.
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = conv2d
}
criterion_main!(benches);
