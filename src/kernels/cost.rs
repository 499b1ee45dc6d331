//! Shared terms of the families' cost estimates: relative costs per fused multiply-add,
//! and how well a dispatch fills the GPU. Only the order of estimates matters.

/// Invocations a GPU needs in flight before it is busy; fewer leave units idle.
pub const BUSY_INVOCATIONS: f64 = 16384.0;
/// Relative cost of a load through the cache hierarchy and of one from workgroup memory,
/// per fused multiply-add.
pub const GLOBAL_LOAD: f64 = 3.0;
pub const SHARED_LOAD: f64 = 1.0;
/// The implicit-GEMM gather recomputes (c, r, s, ih, iw) per staged element.
pub const GATHER_LOAD: f64 = 8.0;
pub const BARRIER: f64 = 20.0;

pub fn ceil_to(v: u64, m: u64) -> u64 {
    v.div_ceil(m.max(1)) * m.max(1)
}

/// Invocations a dispatch keeps busy, relative to what saturates a GPU.
pub fn parallel_efficiency(invocations: u64) -> f64 {
    (invocations as f64 / BUSY_INVOCATIONS).clamp(1e-3, 1.0)
}
