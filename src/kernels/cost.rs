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

/// A multiprocessor's workgroup memory, what each resident workgroup costs on top of its
/// own, and its invocation slots, as on NVIDIA's Hopper; for ranking only.
const SM_SHARED: f64 = 228.0 * 1024.0;
const SM_RESERVED: u32 = 1024;
const SM_INVOCATIONS: f64 = 2048.0;
/// A multiprocessor's 32-bit registers, as on every NVIDIA GPU since Kepler.
const SM_REGISTERS: f64 = 65536.0;
/// Workgroups beyond which residency sets the pace (one per multiprocessor of an H100).
pub const LONG_GRID: u64 = 132;

/// The share of a multiprocessor's invocation slots a kernel's workgroups can fill, as far
/// as workgroup memory decides it, when the grid has more workgroups than multiprocessors.
/// Kernels that wait on gathers hide the wait behind other resident workgroups: on the H100,
/// tensor-core tiles whose staging left fewer workgroups resident ran up to 2.5x slower
/// (benches/results/HISTORY.md, "Tensor-core k-step and workgroup memory").
pub fn residency(workgroup_bytes: u32, invocations: u32, workgroups: u64) -> f64 {
    if workgroups < LONG_GRID {
        return 1.0;
    }
    let resident = (SM_SHARED / (workgroup_bytes + SM_RESERVED) as f64).floor();
    (resident * invocations as f64 / SM_INVOCATIONS).clamp(0.1, 1.0)
}

/// The share of a multiprocessor's invocation slots a kernel can fill, as far as its
/// registers per invocation decide it. FMA kernels hide their loads behind other resident
/// invocations: on the H100, GEMM tiles of 4x4 outputs per invocation and 8-deep steps beat
/// 8x8 outputs or 16-deep steps by 1.2-1.5x on most of the public suite, the opposite of
/// what counting loads per multiply-add says (benches/results/HISTORY.md, "Tuner: ranking and budget").
pub fn register_occupancy(registers: f64) -> f64 {
    (SM_REGISTERS / registers.max(1.0) / SM_INVOCATIONS).min(1.0)
}

/// The share of multiprocessors a grid keeps busy: one workgroup runs on one multiprocessor,
/// so a grid of fewer workgroups than there are leaves the rest idle however many
/// invocations each has.
pub fn multiprocessor_fill(workgroups: u64) -> f64 {
    (workgroups as f64 / LONG_GRID as f64).clamp(1e-3, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_falls_with_registers_and_fill_with_short_grids() {
        // 32 registers per invocation fill all 2048 slots; 64 fill half; more, less.
        assert_eq!(register_occupancy(32.0), 1.0);
        assert_eq!(register_occupancy(64.0), 0.5);
        assert!(register_occupancy(128.0) < register_occupancy(96.0));
        assert_eq!(multiprocessor_fill(LONG_GRID), 1.0);
        assert_eq!(multiprocessor_fill(10 * LONG_GRID), 1.0);
        assert!((multiprocessor_fill(LONG_GRID / 2) - 0.5).abs() < 0.01);
    }
}
