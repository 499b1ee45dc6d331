//! `cargo bench`: per shape of the default suite, the default variant against the tuned one,
//! on whatever adapter convtune picks (lavapipe on a CPU-only machine).
//!
//! Times are GPU time from timestamp queries where the adapter has them (else wall clock
//! around a queue sync), so they show kernel speed, not upload and read-back. The tuned
//! variant comes from the tuning cache as `CONVTUNE_TUNE` says (tuning first when needed).

use convtune::autotune;
use convtune::device::{self, Compiled, Engine};
use convtune::params::{ConvShape, Padding};
use convtune::precision::Precision;
use convtune::runner::{random_data, DeviceTensors};
use convtune::families::Families;
use convtune::kernels::Variant;
use convtune::tuner;
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

fn shapes() -> Vec<ConvShape> {
    SUITE
        .iter()
        .filter_map(|&(x, k, rs, stride, pad, groups)| {
            let w = [k, x[1] / groups as usize, rs, rs];
            ConvShape::new(x, w, (stride, stride), Padding::Explicit(pad, pad), (1, 1), groups, None).ok()
        })
        .collect()
}

/// GPU seconds of `iters` runs, in batches the timer accepts.
fn gpu_time(engine: &Engine, t: &DeviceTensors, kernel: &Compiled, iters: u64) -> Duration {
    let mut left = iters;
    let mut total = 0.0;
    while left > 0 {
        let batch = left.min(1024) as u32;
        match t.time(engine, kernel, batch) {
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

fn bench_shape(c: &mut Criterion, engine: &Engine, shape: &ConvShape) {
    // The same untuned choice conv2d makes, within CONVTUNE_FAMILIES.
    let families = match Families::from_env() {
        Ok(f) => f,
        Err(e) => return eprintln!("{e}"),
    };
    let default = match tuner::default_choice(shape, &engine.caps, Precision::default(), &families) {
        Ok(v) => v,
        Err(e) => return eprintln!("{}: {e}", shape.label()),
    };
    let tuned = match autotune::choose(engine, shape, Precision::default(), None, &mut |_| Ok(())) {
        Ok(choice) => choice.variant,
        Err(e) => {
            eprintln!("{}: tuning failed ({e}); benchmarking the default only", shape.label());
            default
        }
    };
    let x = random_data(shape.x_len() as usize, 1);
    let w = random_data(shape.w_len() as usize, 2);
    let tensors = match DeviceTensors::upload(engine, shape, &x, &w, None, None) {
        Ok(t) => t,
        Err(e) => return eprintln!("{}: cannot upload inputs: {e}", shape.label()),
    };
    let mut group = c.benchmark_group(shape.label());
    group.throughput(Throughput::Elements(shape.flops() as u64));
    let runs: [(&str, Variant); 2] = [("default", default), ("tuned", tuned)];
    for (which, variant) in runs {
        let kernel = match engine.pipeline(&variant, shape) {
            Ok(k) => k,
            Err(e) => {
                eprintln!("{}: {variant}: {e}", shape.label());
                continue;
            }
        };
        group.bench_function(BenchmarkId::new(which, variant), |b| {
            b.iter_custom(|iters| gpu_time(engine, &tensors, &kernel, iters))
        });
    }
    group.finish();
}

fn conv2d(c: &mut Criterion) {
    let engine = match device::engine() {
        Ok(e) => e,
        Err(e) => return eprintln!("no GPU adapter ({e}); nothing to benchmark"),
    };
    eprintln!("adapter: {} ({})", engine.desc.name, engine.desc.backend);
    for shape in shapes() {
        bench_shape(c, &engine, &shape);
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
