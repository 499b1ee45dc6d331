//! What a candidate's first run costs on a CPU adapter (lavapipe), which compiles a kernel to
//! machine code at its first dispatch, beyond the run itself: seconds per byte of WGSL,
//! learned per family from the candidates validated so far. On lavapipe (2 cores) kernels of
//! 4-60 KB of WGSL took 4-25 ms per KB, more for larger ones and for the Winograd families;
//! a family not yet seen is priced at `UNSEEN` times the dearest rate seen (a `wino` kernel
//! started on the `direct` default's rate ran a first call 0.6 s past its budget), and
//! before any rate is known at `PRIOR`, the middle of that range. The default's first run is
//! not learned from: it also carries the run's first use of its buffers and passes (200 ms
//! of a 5 KB kernel's).

use std::collections::HashMap;
use std::time::Duration;

/// A family not yet seen compiles at this multiple of the dearest rate seen.
const UNSEEN: f64 = 2.5;
/// Seconds per byte before any rate is known (12 ms per KB), for kernels up to `PRIOR_BYTES`.
const PRIOR: f64 = 12e-6;
const PRIOR_BYTES: usize = 16 << 10;

#[derive(Default)]
pub struct FirstRuns {
    /// Per family: seconds per byte of WGSL, the dearest seen, and the largest kernel seen.
    rates: HashMap<&'static str, (f64, usize)>,
}

impl FirstRuns {
    /// Seconds a first run of `bytes` of WGSL of `family` is expected to take beyond the run.
    /// Past the largest kernel seen the rate grows with the size: on lavapipe a `direct`
    /// kernel of 13 KB took 4.4 ms per KB, one of 37 KB 24.5.
    pub fn estimate(&self, family: &str, bytes: usize) -> f64 {
        let dearest = self.rates.values().copied().reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)));
        let (rate, seen) = match (self.rates.get(family), dearest) {
            (Some(&r), _) => r,
            (None, Some((r, seen))) => (UNSEEN * r, seen),
            (None, None) => (PRIOR, PRIOR_BYTES),
        };
        rate * bytes as f64 * (bytes as f64 / seen.max(1) as f64).max(1.0)
    }

    /// A validated candidate's first run (`first`, wall time) and its median run; the
    /// default's (`default`) is not learned from.
    pub fn record(&mut self, family: &'static str, bytes: usize, first: Duration, run_ms: Option<f64>, default: bool) {
        if bytes == 0 || default {
            return;
        }
        let compile = (first.as_secs_f64() - run_ms.unwrap_or(0.0) / 1e3).max(0.0);
        let (rate, seen) = self.rates.entry(family).or_insert((0.0, 0));
        *rate = rate.max(compile / bytes as f64);
        *seen = (*seen).max(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_family_not_yet_seen_is_priced_above_the_dearest_seen() {
        let mut f = FirstRuns::default();
        assert!(close(f.estimate("direct", 10_000), PRIOR * 10_000.0));
        f.record("direct", 10_000, Duration::from_secs(2), None, true);
        assert!(close(f.estimate("direct", 10_000), PRIOR * 10_000.0), "the default is not learned from");
        // 0.15 s of first run of which 0.05 s was the run: 10 us per byte.
        f.record("direct", 10_000, Duration::from_millis(150), Some(50.0), false);
        assert!(close(f.estimate("direct", 5_000), 0.05));
        assert!(close(f.estimate("wino", 5_000), UNSEEN * 0.05));
        // The dearest rate of a family is kept; nothing is learned from an unsized kernel.
        f.record("direct", 10_000, Duration::from_millis(60), None, false);
        f.record("gemm", 0, Duration::from_secs(5), None, false);
        assert!(close(f.estimate("direct", 10_000), 0.1));
        assert!(close(f.estimate("gemm", 10_000), UNSEEN * 0.1));
    }

    #[test]
    fn kernels_larger_than_any_seen_cost_more_per_byte() {
        let mut f = FirstRuns::default();
        f.record("direct", 10_000, Duration::from_millis(100), None, false);
        // Twice the largest seen: twice the bytes at twice the rate.
        assert!(close(f.estimate("direct", 20_000), 0.4));
        assert!(close(f.estimate("direct", PRIOR_BYTES * 2) / f.estimate("direct", PRIOR_BYTES), 4.0));
        assert!(close(FirstRuns::default().estimate("gemm", 2 * PRIOR_BYTES), 4.0 * PRIOR * PRIOR_BYTES as f64));
    }
}
