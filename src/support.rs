//! What the Python module needs beyond the Rust API: the memory checks it makes before
//! copying numpy arrays, phase timings, and test hooks. Public so that the module is a
//! client like any other; hidden from the documentation.

use crate::engine::Engine;
use crate::error::Result;
use crate::memory::{self, Need};
use crate::problem::Conv2d;
use crate::timing;

pub use crate::error::panic_message;
pub use crate::host::set_poison;
pub use crate::timing::Phases;
pub use crate::tuning_cache::forget_cache_memory;

/// Bytes by purpose: (host, device).
pub type Parts = Vec<(String, u64)>;

fn parts(need: Need) -> (Parts, Parts) {
    (need.host, need.device)
}

/// The host and GPU bytes a conv2d call needs, by purpose. `x_on_device`: x is a
/// [`Tensor`](crate::Tensor) and the result stays on the GPU.
pub fn conv2d_footprint(engine: &Engine, problem: &Conv2d, x_on_device: bool) -> Result<(Parts, Parts)> {
    let max = engine.max_binding();
    let need = if x_on_device { memory::conv2d_device(&problem.shape, max) } else { memory::conv2d_host(&problem.shape, max) };
    need.map(parts)
}

/// The bytes timing a problem on random inputs needs (the whole problem at once).
pub fn whole_problem_footprint(engine: &Engine, problem: &Conv2d) -> Result<(Parts, Parts)> {
    memory::whole_problem(&problem.shape, engine.max_binding()).map(parts)
}

/// The host and GPU bytes an upload of `elems` float32 elements needs.
pub fn upload_footprint(engine: &Engine, elems: u64) -> Result<(Parts, Parts)> {
    memory::upload(elems, engine.max_binding()).map(parts)
}

/// The host bytes reading back `elems` elements needs.
pub fn download_footprint(elems: u64) -> (Parts, Parts) {
    parts(memory::download(elems))
}

/// An out-of-memory error, naming the bytes and the limit, when `host` or `device` need
/// more memory than the host or the GPU has.
pub fn check_memory(engine: &Engine, what: &str, host: Parts, device: Parts) -> Result<()> {
    memory::check(&engine.inner, what, &Need { host, device })
}

/// Tests: the `n`-th wait for the GPU from now on panics (0: none), as wgpu-core's own
/// assertions can: every Python entry point must turn it into an error and stay usable.
pub fn inject_panic(n: u32) {
    crate::wait::inject_panic(n);
}

/// Tests: add a fast but wrong candidate to every tuning run.
pub fn inject_faulty_candidate(on: bool) {
    crate::tuner::set_inject_faulty(on);
}

/// The phases of this thread's last host-slice conv2d, seconds each, in the order they ran,
/// and the process's minor page faults during it.
pub fn last_call_timings() -> (Vec<(&'static str, f64)>, Option<u64>) {
    let r = timing::last();
    (r.phases, r.minor_faults)
}
