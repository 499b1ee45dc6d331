//! The non-fused Winograd family, F(mxm, 3x3) with m = 2, 4 or 6 and F(2x2, 5x5), on FMA
//! units: 3x3 and 5x5 filters at stride 1, dilated ones as their dilation's phases (`tiles`).
//! F(2x2, 5x5) takes F(4x4, 3x3)'s points (one B^T for both; 3.3e-6 of max |y| at C = 256,
//! tests/test_winograd_5x5.py); F(4x4, 5x5) would take F(6x6, 3x3)'s seven, whose rounding
//! passes "highest"'s bound, and is not generated. Three passes over two
//! workspaces, as ncnn's Vulkan winograd shaders (transform_input, gemm, transform_output) do:
//!
//! - `prologue` transforms the filters, U = G g G^T, and the input patches, V = B^T d B, into
//!   workspace 5 (its workgroups split between the two jobs), both zero-padded to whole GEMM
//!   tiles and steps;
//! - `main` runs the (m+2)^2 x groups batched GEMMs M = V U (tiles x input channels times
//!   input channels x output channels) with the gemm family's register tiles, double-buffered
//!   workgroup staging and written-out inner loop (`gemm::write_inner`), into workspace 6;
//! - `finish` applies the inverse transform A^T M A and the fused epilogue (bias, alpha1,
//!   residual z, activation, both layouts, float16 out, pixel shuffle through `ystore`) in
//!   its store, and sums an invocation's outputs again the direct way where one comes out
//!   Inf or NaN.
//!
//! Against the fused family (`wino`) it pays a round trip of V and M through memory, and
//! gains large GEMM tiles with few registers per invocation, whatever m.
//!
//! Chunks: where V and M of every tile would pass the workspace bound (the engine's:
//! `MAX_WORKSPACE` unless `CONVTUNE_MAX_WORKSPACE` sets it, never past the adapter's largest
//! binding; `generate_within`), the passes run once per
//! chunk of TP tiles (whole GEMM tiles, spread evenly over the fewest chunks that fit), all
//! in one kernel (`Kernel::chunks`): each chunk's passes read its index from binding 4 and
//! work on tiles chunk * TP + t, the workspace sized for one chunk; U is transformed by the
//! first chunk's prologue only (later chunks' filter workgroups return at once). The EDSR
//! body at 720p (57,600 F(4x4) tiles, 530 MB of V) runs in 4 chunks with 64-tile GEMMs
//! (on an H200 7% slower than in one, with a bound of 512 MiB: benches/results/HISTORY.md).
//!
//! Transforms: Toom-Cook at the interpolation points
//! - m = 2: 0, 1, -1, infinity (Lavin & Gray 2016);
//! - m = 4: 0, 1, -1, 1/2, -2, infinity, the set Barabasz et al. ("Error analysis and
//!   improving the accuracy of Winograd convolution", 2020) recommend. A search over
//!   {0, +-1} plus two of +-1/4, +-1/2, +-2/3, +-3/4, +-3/2, +-2, +-3, +-4 (a float32
//!   simulation of these passes, C = 48) found nothing clearly better (0, +-1, 2/3, -2 came
//!   out 20% lower there and 30% higher at C = 256), and its error is a third of Lavin's and
//!   ncnn's 0, +-1, +-2 (C = 256: 4.6e-6 against 1.4e-5). Its B^T is denser (26 non-zero
//!   entries against 22), a few more adds in the input transform;
//! - m = 6: 0, 1, -1, 2, -2, 1/2, -1/2, infinity (NNPACK's and ncnn's winograd63; the same
//!   search over four extra points found nothing clearly better),
//!
//! with the scale of each point in G (G's row j is a_j^k / prod_{l != j} (a_j - a_l), sign
//! flipped on row 0 where negative, so B^T has small dyadic entries: wincnn's "fractions in
//! G"); B^T is solved from A^T and G (`transforms`).
//!
//! Accuracy, max |error| / max |y| against the float64 reference, float32 standard normal x
//! and w, 2 x C x 12 x 12 -> 32 channels, padding 0 and 1, 3 seeds, lavapipe:
//!
//! | C   | m = 2  | m = 4  | m = 6  | gemm   | m = 4 at 0, +-1, +-2 (`wino`'s) |
//! |-----|--------|--------|--------|--------|--------------------------------|
//! | 8   | 2.3e-7 | 1.5e-6 | 5.6e-6 | 3.4e-7 | 3.3e-6                         |
//! | 37  | 3.1e-7 | 1.9e-6 | 7.8e-6 | 8.3e-7 | 5.5e-6                         |
//! | 64  | 4.3e-7 | 3.0e-6 | 1.2e-5 | 1.1e-6 | 7.8e-6                         |
//! | 256 | 8.5e-7 | 4.1e-6 | 2.4e-5 | 2.1e-6 | 1.3e-5                         |
//!
//! m = 2 and 4 serve "highest" (1e-5, validated at 5e-6: the tuner still checks each
//! candidate); m = 6 only "high" (4e-3).

use super::cost::{ceil_to, multiprocessor_fill, parallel_efficiency, register_occupancy, GLOBAL_LOAD, SHARED_LOAD};
use super::gemm::{whole_vec4_slots, write_accumulators, write_inner};
use super::wino::lincomb;
use super::padding::PadIndex;
use super::{Family, KernelVariant};
use crate::codegen::{render, scatter_store_stmt, shape_vars, store_stmt, Kernel, MAX_CHUNKS, MAX_WORKSPACE};
use crate::error::{Error, Result};
use crate::params::{ConvShape, Layout, PaddingMode};
use crate::precision::Precision;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WinoGemm {
    /// Output tile side: 2, 4 or 6.
    pub m: u32,
    /// GEMM workgroup tile: `bm` Winograd tiles x `bn` output channels, `bk` input channels
    /// per step.
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    /// Register tile per invocation: `tm` tiles x `tn` channels.
    pub tm: u32,
    pub tn: u32,
}

/// The constants and `finish` both Winograd families' kernels share (`{{WINOGRAD}}`).
pub const TRANSFORMS_TEMPLATE: &str = include_str!("../../shaders/winograd.wgsl");

/// (m, bm, bn, bk, tm, tn): per m a 64x64 and a 32x32 GEMM tile of 4x4 registers and 8-deep
/// steps (the gemm family's fastest shape on the H100, and a smaller one for short grids),
/// plus a 128x64 tile for F(2x2), whose GEMMs have the most rows, and 16-deep ones for
/// F(4x4): at 16 deep every invocation copies whole vec4s of V and U per step, and 64x64x16
/// ran the H200's 3x3 layers 2-5% faster than any other tile of the family (benches/results/HISTORY.md,
/// "Vec4 loads and stores in the FMA GEMMs"). The space is kept small on purpose.
const SPACE: [(u32, u32, u32, u32, u32, u32); 9] = [
    (2, 64, 64, 8, 4, 4),
    (2, 32, 32, 8, 4, 4),
    (2, 128, 64, 8, 8, 4),
    (4, 64, 64, 8, 4, 4),
    (4, 32, 32, 8, 4, 4),
    (4, 64, 32, 16, 4, 4),
    (4, 64, 64, 16, 4, 4),
    (6, 64, 64, 8, 4, 4),
    (6, 32, 32, 8, 4, 4),
];

/// Per value written to a workspace and read back (V and M): memory traffic the GEMMs'
/// multiply-adds do not hide. An H100 does ~10 f32 multiply-adds in the time it moves a
/// byte from DRAM, so a write and a read of an f32 take ~80; the L2 cache keeps part of the
/// workspaces and the traffic overlaps other work: half that. A guess, untimed.
const ROUND_TRIP: f64 = 40.0;
/// Per add of a transform (about 2p per transformed value, in the prologue and finish).
const TRANSFORM_ADD: f64 = 1.0;
/// Per output: tile decoding, the epilogue and the store.
const SETUP: f64 = 8.0;
/// The GEMM's barrier per multiply-add of the step it closes, as in gemm.
const GEMM_BARRIER: f64 = 5.0;
/// Registers besides accumulators, operands and staged loads (as gemm's guess).
const BASE_REGISTERS: f64 = 16.0;
/// The three passes' launches and the dependency between them, in multiply-adds (per
/// chunk).
const PASSES: f64 = 3.0 * 16384.0;

/// How a problem's tiles are split so that each workspace binding stays within a bound: U
/// whole, V and M for `tp` tiles (a multiple of BM) at a time, `chunks` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chunking {
    /// Tiles per chunk, padded to whole GEMM tiles: the GEMMs' TP.
    pub tp: u64,
    pub chunks: u32,
}

/// What both Winograd families' passes depend on: F(m x m) output tiles, the GEMM's
/// workgroup tile (`bm` tiles x `bn` output channels, `bk` input channels per step), the
/// bytes of one transformed value and of one product in the workspaces (f32 on FMA units;
/// f16 values and f32 products on tensor cores, twice each for the split pair) and where U
/// lives: before V in binding 5 (M in binding 6), or alone in binding 6 (`u_apart`, V and
/// M then share binding 5), where a copy kept with resident weights can take its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tiling {
    pub m: u32,
    /// The filter's side r of F(m x m, r x r): 3, or 5 on the FMA family.
    pub r: u32,
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub value_bytes: u64,
    pub m_bytes: u64,
    pub u_apart: bool,
}

impl Tiling {
    /// The transformed tile's side, m + r - 1.
    pub fn p(&self) -> u32 {
        self.m + self.r - 1
    }

    pub fn p2(&self) -> u32 {
        self.p() * self.p()
    }

    /// (tiles per output row, tiles per image, tiles in all images). A dilated problem's
    /// output is its dilation's phases (rows a, a + DH, ..., columns b, b + DW, ...), each a
    /// stride-1 problem on x's rows and columns of that phase: each phase is tiled alike, its
    /// rows per tile row.
    pub fn tiles(&self, shape: &ConvShape) -> (u64, u64, u64) {
        tiles(self.m, shape)
    }

    /// The GEMMs' padded sizes: (tiles TP, input channels CP, output channels NP).
    pub fn padded(&self, shape: &ConvShape) -> (u64, u64, u64) {
        let (_, _, tiles) = self.tiles(shape);
        (ceil_to(tiles, self.bm as u64), ceil_to(shape.cg() as u64, self.bk as u64), ceil_to(shape.kg() as u64, self.bn as u64))
    }

    /// Bytes of the two workspaces for `tp` tiles at a time: U and V, then M; or V and M,
    /// then U (`u_apart`).
    pub fn workspace(&self, shape: &ConvShape, tp: u64) -> [u64; 2] {
        let (_, cp, np) = self.padded(shape);
        let planes = shape.groups as u64 * self.p2() as u64;
        let (u, v, m) = (planes * cp * np * self.value_bytes, planes * cp * tp * self.value_bytes, planes * np * tp * self.m_bytes);
        if self.u_apart {
            [v + m, u]
        } else {
            [u + v, m]
        }
    }

    /// The chunks that keep each workspace within `cap` bytes: all tiles at once where they
    /// fit, else the fewest chunks of whole GEMM tiles (BM tiles) that do, their tiles spread
    /// evenly (the last chunk's padding is less than BM tiles per chunk). `None` where U and
    /// one GEMM tile of V do not fit (or more than `MAX_CHUNKS` chunks would be needed).
    pub fn chunking(&self, shape: &ConvShape, cap: u64) -> Option<Chunking> {
        let (tp_all, _, _) = self.padded(shape);
        let (_, _, tiles) = self.tiles(shape);
        let bm = self.bm as u64;
        // Each binding: a part for U (whatever the tiles) and a part per tile.
        let (fixed, one) = (self.workspace(shape, 0), self.workspace(shape, 1));
        let mut most = u64::MAX;
        for (f, o) in fixed.into_iter().zip(one) {
            let room = cap.checked_sub(f)?;
            if o > f {
                most = most.min(room / (o - f));
            }
        }
        let most = most / bm * bm;
        if most == 0 {
            return None;
        }
        if tp_all <= most {
            return Some(Chunking { tp: tp_all, chunks: 1 });
        }
        let chunks = tp_all.div_ceil(most);
        let tp = ceil_to(tiles.div_ceil(chunks), bm);
        let chunks = tiles.div_ceil(tp);
        (chunks <= MAX_CHUNKS as u64).then_some(Chunking { tp, chunks: chunks as u32 })
    }

    /// Workgroups of one chunk's GEMMs: its tiles x output channels x groups x planes.
    pub fn gemm_workgroups(&self, shape: &ConvShape, tp: u64) -> u64 {
        let (_, _, np) = self.padded(shape);
        (tp / self.bm as u64) * (np / self.bn as u64) * shape.groups as u64 * self.p2() as u64
    }

    /// The workspaces' round trips, the transforms' adds, the outputs' set-up and the
    /// passes' launches (three per chunk, at the default workspace bound): what the
    /// GEMMs' cost leaves out.
    pub fn overhead(&self, shape: &ConvShape, chunking: Chunking) -> f64 {
        let (_, cp, np) = self.padded(shape);
        let (_, _, tiles) = self.tiles(shape);
        let tp = chunking.tp * chunking.chunks as u64;
        let (groups, p2, p) = (shape.groups as u64, self.p2() as f64, self.p() as f64);
        let v = p2 * (groups * cp * tp) as f64;
        let m = p2 * (groups * np * tp) as f64;
        let outputs = (tiles * (self.m * self.m) as u64 * shape.k as u64) as f64;
        let u = p2 * (groups * cp * np) as f64;
        // The round trips scale with the bytes of V's and M's values.
        ROUND_TRIP * (v * self.value_bytes as f64 + m * self.m_bytes as f64) / 4.0 + TRANSFORM_ADD * 2.0 * p * (v + m + u) + SETUP * outputs + PASSES * chunking.chunks as f64
    }
}

/// m x m output tiles of `shape`: (tiles per output row, tiles per image, tiles in all
/// images), a dilated problem's phases tiled alike (`Tiling::tiles`).
pub(super) fn tiles(m: u32, shape: &ConvShape) -> (u64, u64, u64) {
    let m = m as u64;
    let (dh, dw) = (shape.dilation.0 as u64, shape.dilation.1 as u64);
    let tw = (shape.ow() as u64).div_ceil(dw).div_ceil(m);
    let thw = dh * dw * (shape.oh() as u64).div_ceil(dh).div_ceil(m) * tw;
    (tw, thw, shape.n as u64 * thw)
}

/// Whether the shape is a 3x3 at stride 1, dilated or not (a dilated one not scattered): its
/// dilation's phases are stride-1 3x3 problems (`Tiling::tiles`).
pub(super) fn applies_dilated(shape: &ConvShape) -> bool {
    (shape.r, shape.s) == (3, 3) && stride_one(shape)
}

/// `applies_dilated`, or the same with 5x5 filters: what F(m x m, r x r) on FMA units takes.
pub(super) fn applies_fma(shape: &ConvShape) -> bool {
    shape.r == shape.s && (shape.r == 3 || shape.r == 5) && stride_one(shape)
}

/// Whether F(m x m, r x r) on FMA units computes the shape: `applies_fma`, 5x5 filters with
/// m = 2 only (F(4x4, 5x5) would take F(6x6, 3x3)'s seven points, whose rounding passes
/// "highest"'s bound).
fn fma_computes(m: u32, shape: &ConvShape) -> bool {
    applies_fma(shape) && (shape.r == 3 || m == 2)
}

/// Stride 1 (a dilated problem's phases are tiled alike; a dilated scatter is a stride-1
/// transposed problem's, one phase: `ConvShape::lowered`).
fn stride_one(shape: &ConvShape) -> bool {
    shape.stride == (1, 1) && (shape.dilation == (1, 1) || shape.scatter.is_none_or(|sc| sc.phases == (1, 1)))
}

impl WinoGemm {
    /// The tiling on `shape`: F(m x m, r x r) for its r x r filters.
    pub(super) fn tiling(&self, shape: &ConvShape) -> Tiling {
        Tiling { m: self.m, r: shape.r, bm: self.bm, bn: self.bn, bk: self.bk, value_bytes: 4, m_bytes: 4, u_apart: false }
    }

    /// The tiling a kernel on `shape` runs with: U in a binding of its own (so a weight Tensor
    /// keeps it) wherever that takes no more chunks than U sharing V's binding (V and M then
    /// share the other: the EDSR body at 720p would take 8 chunks instead of 4).
    fn tiling_for(&self, shape: &ConvShape, cap: u64) -> Tiling {
        let t = self.tiling(shape);
        let apart = Tiling { u_apart: true, ..t };
        match (t.chunking(shape, cap), apart.chunking(shape, cap)) {
            (Some(a), Some(b)) if b.chunks <= a.chunks => apart,
            _ => t,
        }
    }

    fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    fn tiles(&self, shape: &ConvShape) -> (u64, u64, u64) {
        self.tiling(shape).tiles(shape)
    }

    fn padded(&self, shape: &ConvShape) -> (u64, u64, u64) {
        self.tiling(shape).padded(shape)
    }

    fn workspace(&self, shape: &ConvShape, tp: u64) -> [u64; 2] {
        self.tiling(shape).workspace(shape, tp)
    }

    fn chunking(&self, shape: &ConvShape, cap: u64) -> Option<Chunking> {
        self.tiling(shape).chunking(shape, cap)
    }

    /// Registers per invocation, as gemm counts them.
    fn registers(&self) -> f64 {
        let staged = (self.bm + self.bn) * self.bk / self.threads();
        (self.tm * self.tn + self.tm + self.tn + 2 * staged) as f64 + BASE_REGISTERS
    }
}

impl Family for WinoGemm {
    const NAME: &'static str = "wgemm";
    const TEMPLATE: &'static str = include_str!("../../shaders/winogemm.wgsl");

    fn space() -> Vec<Self> {
        SPACE
            .iter()
            .map(|&(m, bm, bn, bk, tm, tn)| WinoGemm { m, bm, bn, bk, tm, tn })
            .filter(|v| v.well_formed())
            .collect()
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [m, bm, bn, bk, tm, tn] => Some(WinoGemm { m, bm, bn, bk, tm, tn }),
            _ => None,
        }
    }
}

impl KernelVariant for WinoGemm {
    fn family(&self) -> &'static str {
        Self::NAME
    }
    fn padding_modes(&self) -> bool {
        true
    }

    fn name(&self) -> String {
        format!("wgemm_m{}_b{}x{}x{}_t{}x{}", self.m, self.bm, self.bn, self.bk, self.tm, self.tn)
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("m", self.m), ("bm", self.bm), ("bn", self.bn), ("bk", self.bk), ("tm", self.tm), ("tn", self.tn)]
    }

    fn well_formed(&self) -> bool {
        let t = self.threads();
        SPACE.contains(&(self.m, self.bm, self.bn, self.bk, self.tm, self.tn))
            && self.bm % self.tm == 0
            && self.bn % self.tn == 0
            // Registers in whole vec4s of the staged tiles.
            && self.tm % 4 == 0
            && self.tn % 4 == 0
            && (64..=256).contains(&t)
            // Each invocation copies whole slots of a staged step.
            && (self.bm * self.bk) % t == 0
            && (self.bn * self.bk) % t == 0
    }

    fn invocations(&self) -> u32 {
        self.threads()
    }

    fn workgroup_bytes(&self) -> u32 {
        2 * 4 * self.bk * (self.bm + self.bn)
    }

    /// F(6x6)'s transforms round the most (entries up to 21/4 and 32 over 8 terms): its error
    /// on float32 data grows with the channels past "highest"'s 1e-5 (1.2e-5 at C = 64, see
    /// the module's table); F(2x2) and F(4x4) stay within it (4.1e-6 at C = 256).
    fn serves(&self, precision: Precision) -> bool {
        self.m <= 4 || precision == Precision::High
    }

    /// 3x3 at stride 1, dilated too, and 5x5 likewise with F(2x2) (F(4x4, 5x5)'s seven points
    /// round as F(6x6, 3x3)'s do), where U and one GEMM tile's V and M fit the default
    /// workspace bound (larger problems run in chunks of tiles).
    fn computes(&self, shape: &ConvShape) -> bool {
        fma_computes(self.m, shape) && self.chunking(shape, MAX_WORKSPACE).is_some()
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        let (_, _, tiles) = self.tiles(shape);
        self.computes(shape)
            && self.bm as u64 <= tiles.next_power_of_two().max(32)
            && self.bn <= shape.kg().next_power_of_two().max(32)
            && self.bk <= shape.cg().next_power_of_two().max(8)
    }

    /// The GEMMs scaled as gemm's are (multiply-adds executed, padding included, times the
    /// cost of each, over how well each chunk's dispatch fills the GPU), plus the workspaces'
    /// round trips, the transforms' adds, the outputs' set-up and the passes' launches (three
    /// per chunk, at the default workspace bound).
    fn cost(&self, shape: &ConvShape) -> f64 {
        let (_, cp, np) = self.padded(shape);
        let Some(chunking) = self.chunking(shape, MAX_WORKSPACE) else {
            return f64::INFINITY;
        };
        let tp = chunking.tp * chunking.chunks as u64;
        let fmas = self.tiling(shape).p2() as f64 * (tp * np * cp * shape.groups as u64) as f64;
        let (tm, tn) = (self.tm as f64, self.tn as f64);
        let per_fma = 1.0
            + SHARED_LOAD * (tm + tn) / (tm * tn)
            + GLOBAL_LOAD * (1.0 / self.bm as f64 + 1.0 / self.bn as f64)
            + GEMM_BARRIER * 2.0 / (self.bk as f64 * tm * tn);
        let workgroups = self.tiling(shape).gemm_workgroups(shape, chunking.tp);
        let gemm = fmas * per_fma
            / parallel_efficiency(workgroups * self.threads() as u64)
            / register_occupancy(self.registers()).sqrt()
            / multiprocessor_fill(workgroups);
        gemm + self.tiling(shape).overhead(shape, chunking)
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape, MAX_WORKSPACE)
    }

    fn generate_within(&self, shape: &ConvShape, max_workspace: u64) -> Result<Kernel> {
        generate(self, shape, max_workspace)
    }
}

/// The finite interpolation points of F(mxm, rxr), m + r - 2 of them, infinity implicit (the
/// last row of B^T and G, the last column of A^T): F(2x2, 3x3)'s three, F(4x4, 3x3)'s and
/// F(2x2, 5x5)'s five (one B^T for both), F(6x6, 3x3)'s seven.
fn points(finite: u32) -> &'static [f64] {
    match finite {
        3 => &[0.0, 1.0, -1.0],
        5 => &[0.0, 1.0, -1.0, 0.5, -2.0],
        _ => &[0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5],
    }
}

/// B^T (p x p), G (p x r) and A^T (m x p) of F(mxm, rxr), p = m + r - 1, by Toom-Cook at
/// `points(m + r - 2)`.
#[derive(Debug)]
pub(super) struct Transforms {
    bt: Vec<Vec<f64>>,
    g: Vec<Vec<f64>>,
    at: Vec<Vec<f64>>,
}

/// A^T[i][j] = a_j^i and G[j][k] = a_j^k / f_j (f_j = prod_{l != j} (a_j - a_l), sign made
/// positive on row 0), with infinity's column (row) picking the highest power. Then
/// sum_j A^T[i][j] G[j][k] B^T[j][l] must be [l == i + k]; the product of A^T's and G's
/// terms depends on s = i + k only, E[s][j], so B^T = E^-1. Its entries are dyadic for
/// these points: they are snapped to multiples of 1/64 to undo the inversion's rounding.
fn transforms(m: u32, r: u32) -> Transforms {
    let a = points(m + r - 2);
    let (p, r) = (a.len() + 1, r as usize);
    let mut f: Vec<f64> = (0..p - 1).map(|j| (0..p - 1).filter(|&l| l != j).map(|l| a[j] - a[l]).product()).collect();
    f[0] = f[0].abs();
    let at: Vec<Vec<f64>> = (0..m as usize)
        .map(|i| (0..p).map(|j| if j < p - 1 { a[j].powi(i as i32) } else { f64::from(u8::from(i == m as usize - 1)) }).collect())
        .collect();
    let g: Vec<Vec<f64>> = (0..p)
        .map(|j| (0..r).map(|k| if j < p - 1 { a[j].powi(k as i32) / f[j] } else { f64::from(u8::from(k == r - 1)) }).collect())
        .collect();
    let e: Vec<Vec<f64>> = (0..p)
        .map(|s| (0..p).map(|j| if j < p - 1 { a[j].powi(s as i32) / f[j] } else { f64::from(u8::from(s == p - 1)) }).collect())
        .collect();
    let bt = invert(e)
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|v| {
                    let q = (v * 64.0).round() / 64.0;
                    if (v - q).abs() < 1e-9 { q } else { v }
                })
                .collect()
        })
        .collect();
    Transforms { bt, g, at }
}

/// The inverse of a square matrix, by Gauss-Jordan elimination with partial pivoting.
fn invert(mut a: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
    let n = a.len();
    let mut inv: Vec<Vec<f64>> = (0..n).map(|i| (0..n).map(|j| f64::from(u8::from(i == j))).collect()).collect();
    for col in 0..n {
        let piv = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs())).unwrap();
        a.swap(col, piv);
        inv.swap(col, piv);
        let d = a[col][col];
        for j in 0..n {
            a[col][j] /= d;
            inv[col][j] /= d;
        }
        for i in (0..n).filter(|&i| i != col) {
            let factor = a[i][col];
            if factor != 0.0 {
                for j in 0..n {
                    a[i][j] -= factor * a[col][j];
                    inv[i][j] -= factor * inv[col][j];
                }
            }
        }
    }
    inv
}

/// Why a Winograd variant named `name` cannot run on `shape`.
pub(super) fn refusal(name: &str, t: &Tiling, shape: &ConvShape, cap: u64, fma: bool) -> Error {
    let m = t.m;
    let why = if fma && applies_fma(shape) && shape.r == 5 && m != 2 {
        format!("5x5 filters take F(2x2, 5x5) only (F({m}x{m}, 5x5)'s transforms round past float32's bounds)")
    } else if applies_dilated(shape) || (fma && applies_fma(shape)) {
        format!(
            "its transformed filters and the transformed inputs of {} tiles need more than {cap} bytes of \
             workspace (the largest binding it may take here)",
            t.bm
        )
    } else {
        format!("Winograd F({m}x{m}, rxr) takes {} at stride 1, any dilation", if fma { "3x3 (or, with m = 2, 5x5) filters" } else { "3x3 filters" })
    };
    Error::invalid(format!("variant {name} cannot run on this shape ({}): {why}", shape.label()))
}

/// What both Winograd families' kernels share: the placeholders of `shaders/winograd.wgsl`
/// (rendered into `{{WINOGRAD}}`: the constants, `finish` with the inverse transform) and
/// the ones the families' own passes read alike, the chunks, and the dispatches.
pub(super) struct Passes {
    pub vars: Vec<(&'static str, String)>,
    pub chunking: Chunking,
    pub tr: Transforms,
    /// Workgroups of one chunk's GEMMs and of `finish`.
    pub gemm: u64,
    pub finish: u64,
    /// Whether M is [tile][n] (NHWC y: `finish` goes along channels) rather than [n][tile].
    pub nhwc: bool,
}

/// `scaled`: the transforms take x and w scaled by powers of two (`scale_exp` of the maxima
/// in binding 4's words 0 and 1, which a pass before writes), and `finish` scales M's
/// outputs back, the smaller factor first (an intermediate overflows only if the result
/// does).
/// `split`: M holds the products' f32 sums and, after them, the split pair's correction
/// terms, 2^11 times smaller, which `finish` adds.
/// `fma`: the FMA family's passes, which take 5x5 filters too (`applies_fma`; the filter's
/// side is the tiling's r); the tensor-core family's take 3x3 ones (`applies_dilated`).
pub(super) fn passes(name: &str, t: &Tiling, shape: &ConvShape, cap: u64, scaled: bool, split: bool, fma: bool) -> Result<Passes> {
    let takes = shape.r == t.r && if fma { fma_computes(t.m, shape) } else { applies_dilated(shape) };
    let chunking = if takes { t.chunking(shape, cap) } else { None };
    let Some(chunking @ Chunking { tp, chunks }) = chunking else {
        return Err(refusal(name, t, shape, cap, fma));
    };
    let (dh, dw) = (shape.dilation.0 as usize, shape.dilation.1 as usize);
    let (m, p, p2) = (t.m as usize, t.p() as usize, t.p2());
    let tr = transforms(t.m, t.r);
    let (tiles_w, tiles_hw, tiles) = t.tiles(shape);
    let (_, cp, np) = t.padded(shape);
    // Tiles finish decodes per chunk: all of them in one chunk, else the chunk's (padded).
    let ct = if chunks == 1 { tiles } else { tp };
    let groups = shape.groups as u64;
    let (m_blocks, n_blocks) = (tp / t.bm as u64, np / t.bn as u64);
    let nhwc = shape.layout == Layout::Nhwc;

    // The inverse transform: M's values, s = A^T M (rows), then (A^T M) A (columns).
    let mut output = String::new();
    // A scatter's (pixel shuffle, lowered transposed convolution) mapping in halves: the
    // tile's channel and its origin pixel once, each output's pixel an offset of the origin's.
    if shape.scatter.is_some() {
        writeln!(output, "    let cq = ychan(k);\n    let po = ypix((o.x * OH + o.y) * OW + o.z);").unwrap();
    }
    if scaled {
        writeln!(output, "    let ux = ldexp(1.0, -scale_exp(run[0]));\n    let uw = ldexp(1.0, -scale_exp(run[1]));").unwrap();
    }
    let unscale = if scaled { " * min(ux, uw) * max(ux, uw)" } else { "" };
    for a in 0..p {
        for b in 0..p {
            // Offsets in the module's constants, not literals: a size-generic module
            // (`generic`) sets those from the call's sizes.
            let at = format!("{} * MSX", p * a + b);
            if split {
                // The correction terms follow every plane's products.
                writeln!(output, "    let m{a}{b} = mval(src + {at}) + mval(src + {groups} * P2 * MSX + {at}) / 2048.0;").unwrap();
            } else {
                writeln!(output, "    let m{a}{b} = mval(src + {at});").unwrap();
            }
        }
    }
    left_product(&mut output, "    ", &tr.at, p, |r, b| format!("m{r}{b}"), |a, b| format!("s{a}_{b}"));
    for a in 0..m {
        for (b, col) in tr.at.iter().enumerate() {
            let sum = or_zero(lincomb(col, |c| format!("s{a}_{c}")));
            // A dilated problem's phases with fewer rows or columns than the first have tiles
            // past the output's edge: their first outputs are guarded too.
            let mut guards = Vec::new();
            if a > 0 || dh > 1 {
                guards.push(format!("o.y + {} < OH", a * dh));
            }
            if b > 0 || dw > 1 {
                guards.push(format!("o.z + {} < OW", b * dw));
            }
            let put = match shape.scatter {
                Some(sc) => {
                    let pixel = format!("po + vec3<i32>(0, {}, {})", (a * dh) as u32 * sc.phases.0, (b * dw) as u32 * sc.phases.1);
                    scatter_store_stmt(shape, &pixel, "cq", "v", "k")
                }
                None => store_stmt(shape, &format!("yb + ({} * OW + {}) * YSP", a * dh, b * dw), "v", "k"),
            };
            let body = format!("let v = ({sum}){unscale}; bad = bad || nonfinite(v); {put}");
            if guards.is_empty() {
                writeln!(output, "    {{ {body} }}").unwrap();
            } else {
                writeln!(output, "    if ({}) {{ {body} }}", guards.join(" && ")).unwrap();
            }
        }
    }

    // M's layout and the order of finish's invocations follow y's: along tiles for NCHW
    // (neighbouring outputs of one channel), along channels for NHWC (one pixel's channels
    // are contiguous), so the GEMM's stores and finish's loads and stores are coalesced. An
    // NCHW scatter in PyTorch's channel order (a pixel shuffle) puts a row's neighbouring
    // outputs in its `sw` phase columns: their channels go fastest, then the tiles.
    let sw = match shape.scatter {
        Some(sc) if !nhwc && !sc.phase_major && sc.phases.1 > 1 && shape.kg() % sc.phases.1 == 0 => sc.phases.1,
        _ => 1,
    };
    let (msn, mst, decode) = if nhwc {
        (1, np, "    let n = i % KG;\n    let t = (i / KG) % CT;\n    let g = i / (KG * CT);".to_string())
    } else {
        let decode = if sw > 1 {
            format!("    let t = (i / {sw}) % CT;\n    let n = ((i / ({sw} * CT)) % (KG / {sw})) * {sw} + i % {sw};\n    let g = i / (CT * KG);")
        } else {
            "    let t = i % CT;\n    let n = (i / CT) % KG;\n    let g = i / (CT * KG);".to_string()
        };
        (tp, 1, decode)
    };

    let o_jobs = groups * shape.kg() as u64 * ct;
    // One chunk: the passes' tiles are the problem's. Several: the runner writes the chunk's
    // index into binding 4's word CHUNK_WORD before each run of the passes. A scaled kernel
    // reads the maxima from words 0 and 1.
    let words = if chunks > 1 || scaled {
        "// The run's words: max |x| and max |w| (a scaled kernel's), the chunk these passes compute.\n\
         @group(0) @binding(4) var<storage, read_write> run: array<u32, 4>;\n"
    } else {
        ""
    };
    let chunk = if chunks == 1 {
        format!("{words}fn chunk_base() -> i32 {{\n    return 0;\n}}\n")
    } else {
        format!("{words}fn chunk_base() -> i32 {{\n    return i32(run[{}]) * TP;\n}}\n", crate::codegen::CHUNK_WORD)
    };
    let gemm = t.gemm_workgroups(shape, tp);
    let mut vars = shape_vars(shape, name);
    vars.push(("DIRECT_SUM", super::phases::direct_sum(shape, t.r as usize)));
    vars.push(("TILE_ORIGIN", tile_origin(shape)));
    // The re-sum's outputs of a tile, its dilation apart.
    vars.push(("DIL_ROWS", if dh == 1 { String::new() } else { format!(" * {dh}") }));
    vars.push(("DIL_COLS", if dw == 1 { String::new() } else { format!(" * {dw}") }));
    vars.push(("PAD_INDEX", PadIndex(shape.padding_mode).wgsl()));
    vars.extend([
        ("MT", t.m.to_string()),
        ("P", p.to_string()),
        ("P2", p2.to_string()),
        ("TILES_W", tiles_w.to_string()),
        ("TILES_HW", tiles_hw.to_string()),
        ("TILES", tiles.to_string()),
        ("CT", ct.to_string()),
        ("CHUNKS", chunks.to_string()),
        ("CHUNK", chunk),
        ("CP", cp.to_string()),
        ("NP", np.to_string()),
        ("TP", tp.to_string()),
        // V after U (both parts of the split pair's U), or first (`u_apart`).
        ("VOFF", if t.u_apart { 0 } else { (1 + u64::from(split)) * groups * p2 as u64 * cp * np }.to_string()),
        ("MSN", msn.to_string()),
        ("MST", mst.to_string()),
        ("O_JOBS", o_jobs.to_string()),
        ("O_DECODE", decode),
        ("OUTPUT_TRANSFORM", output),
        ("BM", t.bm.to_string()),
        ("BN", t.bn.to_string()),
        ("BK", t.bk.to_string()),
        ("M_BLOCKS", m_blocks.to_string()),
        ("N_BLOCKS", n_blocks.to_string()),
        ("BLOCKS", gemm.to_string()),
    ]);
    let shared = render(TRANSFORMS_TEMPLATE, &vars)?;
    vars.push(("WINOGRAD", shared));
    Ok(Passes { vars, chunking, tr, gemm, finish: o_jobs.div_ceil(256), nhwc })
}

/// `tile_origin(t)`: tile t's image and first output row and column. A dilated problem's
/// tiles go phase by phase (`tiles`), each phase's outputs DH rows and DW columns apart.
fn tile_origin(shape: &ConvShape) -> String {
    if shape.dilation == (1, 1) {
        return "fn tile_origin(t: i32) -> vec3<i32> {\n    let r = t % THW;\n    return vec3<i32>(t / THW, MT * (r / TW), MT * (r % TW));\n}".to_string();
    }
    let [oh, ow] = tile_corner("t", shape.dilation, ["0", "0"]);
    format!("fn tile_origin(t: i32) -> vec3<i32> {{\n    return vec3<i32>(t / THW, {oh}, {ow});\n}}")
}

/// Output row and column `within` (row, column) of tile `tile`'s top-left output (WGSL
/// expressions): a dilated problem's tiles go phase by phase (`tiles`), their outputs
/// `dilation` apart.
pub(super) fn tile_corner(tile: &str, (dh, dw): (u32, u32), within: [&str; 2]) -> [String; 2] {
    let plus = |w: &str| if w == "0" { String::new() } else { format!(" + {w}") };
    if (dh, dw) == (1, 1) {
        return [format!("MT * (({tile} % THW) / TW){}", plus(within[0])), format!("MT * (({tile} % THW) % TW){}", plus(within[1]))];
    }
    let phase = format!("(THW / {})", dh * dw);
    let (f, q) = (format!("(({tile} % THW) / {phase})"), format!("(({tile} % THW) % {phase})"));
    [format!("{f} / {dw} + {dh} * (MT * ({q} / TW){})", plus(within[0])), format!("{f} % {dw} + {dw} * (MT * ({q} % TW){})", plus(within[1]))]
}

/// The filter transform of one filter: `u{lane}_{xi}` = (G g G^T)[xi] for each plane xi,
/// g's r x r values read from `w[src{lane} + ..]` where `ok{lane}` (zero elsewhere), times
/// `scale` where given.
pub(super) fn filter_transform(tr: &Transforms, lane: &str, scale: Option<&str>) -> String {
    let times = scale.map_or(String::new(), |s| format!(" * {s}"));
    let (p, side) = (tr.g.len(), tr.g[0].len());
    let mut s = String::new();
    for r in 0..side {
        for c in 0..side {
            writeln!(s, "        let g{lane}{r}{c} = select(0.0, f32(w[src{lane} + {}]){times}, ok{lane});", side * r + c).unwrap();
        }
    }
    let h = |a: usize, c: usize| format!("h{lane}{a}{c}");
    left_product(&mut s, "        ", &tr.g, side, |r, c| format!("g{lane}{r}{c}"), h);
    right_product(&mut s, "        ", &tr.g, p, h, |a, b| format!("u{lane}_{}", p * a + b));
    s
}

/// The input transform of one patch: `v{lane}_{xi}` = (B^T d B)[xi], d the p x p patch at
/// rows `ih{lane}`.. and columns `iw{lane}`.. of x from `xb{lane}` on (zero outside the
/// image, or read as `mode` maps the padding, and zero where `tok{lane}` is false), times
/// `scale` where given.
pub(super) fn input_transform(tr: &Transforms, lane: &str, scale: Option<&str>, mode: PaddingMode, dilation: (u32, u32)) -> String {
    let times = scale.map_or(String::new(), |s| format!(" * {s}"));
    let p = tr.bt.len();
    let pad = PadIndex(mode);
    // A dilated problem's patch takes every DH-th row and DW-th column (`Tiling::tiles`).
    let (dh, dw) = (dilation.0 as usize, dilation.1 as usize);
    let mut s = String::new();
    for a in 0..p {
        let row = format!("ih{lane} + {}", a * dh);
        writeln!(s, "    let r{lane}{a} = tok{lane} && {};", pad.row_ok(&row)).unwrap();
        if !mode.is_zeros() {
            // xb includes the patch's first row and column; the mode's rows replace them.
            writeln!(s, "    let rr{lane}{a} = ({} - ih{lane}) * XSH;", pad.row(&row)).unwrap();
        }
    }
    for b in 0..p {
        let col = format!("iw{lane} + {}", b * dw);
        writeln!(s, "    let c{lane}{b} = {};", pad.col_ok(&col)).unwrap();
        if !mode.is_zeros() {
            writeln!(s, "    let cc{lane}{b} = ({} - iw{lane}) * XSW;", pad.col(&col)).unwrap();
        }
    }
    for a in 0..p {
        for b in 0..p {
            let ok = format!("r{lane}{a} && c{lane}{b}");
            let at = if mode.is_zeros() { format!("xb{lane} + {} * XSH + {} * XSW", a * dh, b * dw) } else { format!("xb{lane} + rr{lane}{a} + cc{lane}{b}") };
            writeln!(s, "    let d{lane}{a}{b} = select(0.0, f32(x[select(0, {at}, {ok})]){times}, {ok});").unwrap();
        }
    }
    let e = |a: usize, b: usize| format!("e{lane}{a}_{b}");
    left_product(&mut s, "    ", &tr.bt, p, |r, b| format!("d{lane}{r}{b}"), e);
    right_product(&mut s, "    ", &tr.bt, p, e, |a, b| format!("v{lane}_{}", p * a + b));
    s
}

/// `let {out(a, c)} = (L X)[a][c]` for every row a of `l` and column c < `cols` of X, X's
/// entries named by `x(r, c)`: the left side of a transform L X L^T.
fn left_product(s: &mut String, ind: &str, l: &[Vec<f64>], cols: usize, x: impl Fn(usize, usize) -> String, out: impl Fn(usize, usize) -> String) {
    for (a, row) in l.iter().enumerate() {
        for c in 0..cols {
            writeln!(s, "{ind}let {} = {};", out(a, c), or_zero(lincomb(row, |r| x(r, c)))).unwrap();
        }
    }
}

/// `let {out(a, b)} = (Y L^T)[a][b]` for rows a < `rows` of Y and every row b of `l`, Y's
/// entries named by `y(a, c)`: the right side of a transform L X L^T.
fn right_product(s: &mut String, ind: &str, l: &[Vec<f64>], rows: usize, y: impl Fn(usize, usize) -> String, out: impl Fn(usize, usize) -> String) {
    for a in 0..rows {
        for (b, col) in l.iter().enumerate() {
            writeln!(s, "{ind}let {} = {};", out(a, b), or_zero(lincomb(col, |c| y(a, c)))).unwrap();
        }
    }
}

fn generate(v: &WinoGemm, shape: &ConvShape, cap: u64) -> Result<Kernel> {
    let t = v.tiling_for(shape, cap);
    let Passes { mut vars, chunking: Chunking { tp, chunks }, tr, gemm, finish, nhwc } = passes(&v.name(), &t, shape, cap, false, false, true)?;
    let p2 = t.p2() as u64;
    let threads = v.threads();
    let (tx, ty) = (v.bm / v.tm, v.bn / v.tn);
    let (_, cp, np) = t.padded(shape);
    let groups = shape.groups as u64;

    // Where U and M live: U before V in `ws` and M in `mw`, or (`u_apart`) U in `uw` and M
    // after V in `ws`, from MOFF on.
    let groups_planes = groups * p2;
    let m_off = groups_planes * cp * tp;
    // The GEMM pass may read U and V and write M as vec4s (every row of them starts on a
    // vec4: NP, TP and CP are whole tiles, VOFF and MOFF whole planes) through vec4 views of
    // the workspaces, `*v`, bound at the same bindings as the scalar views the transforms
    // use (one value per invocation); a buffer's vec4 view is its name and `v`.
    let (u_buf, m_buf, m_at, workspaces) = if t.u_apart {
        let decl = format!(
            "// The chunk's V (GROUPS x P2 x CP x TP), written by `prologue`, then from MOFF on its M\n\
             // (GROUPS x P2, each NP x TP), written by `main`, read by `finish`.\n\
             @group(0) @binding(5) var<storage, read_write> ws: array<f32>;\n\
             @group(0) @binding(5) var<storage, read_write> wsv: array<vec4<f32>>;\n\
             // U (GROUPS x P2 x CP x NP): alone in its binding, where a copy kept with resident\n\
             // weights may stand in for it.\n\
             @group(0) @binding(6) var<storage, read_write> uw: array<f32>;\n\
             @group(0) @binding(6) var<storage, read_write> uwv: array<vec4<f32>>;\n\
             const MOFF: i32 = {m_off};\n\n\
             // M's value i, as `finish` reads it.\n\
             fn mval(i: i32) -> f32 {{\n    return ws[MOFF + i];\n}}\n"
        );
        ("uw", "ws", "MOFF + ", decl)
    } else {
        let decl = "// U (GROUPS x P2 x CP x NP) then the chunk's V (GROUPS x P2 x CP x TP), written by `prologue`.\n\
                    @group(0) @binding(5) var<storage, read_write> ws: array<f32>;\n\
                    @group(0) @binding(5) var<storage, read_write> wsv: array<vec4<f32>>;\n\
                    // M (GROUPS x P2, each NP x TP), written by `main`, read by `finish`.\n\
                    @group(0) @binding(6) var<storage, read_write> mw: array<f32>;\n\
                    @group(0) @binding(6) var<storage, read_write> mwv: array<vec4<f32>>;\n\n\
                    // M's value i, as `finish` reads it.\n\
                    fn mval(i: i32) -> f32 {\n    return mw[i];\n}\n";
        ("ws", "mw", "", decl.to_string())
    };

    // The transforms, each plane's value stored at its own place in U's or V's workspace.
    let mut filter = filter_transform(&tr, "", None);
    let mut input = input_transform(&tr, "", None, shape.padding_mode, shape.dilation);
    for xi in 0..p2 {
        writeln!(filter, "        {u_buf}[dst + {}] = u_{xi};", xi * cp * np).unwrap();
        writeln!(input, "    ws[dst + {xi} * CP * TP] = v_{xi};").unwrap();
    }

    // The GEMMs: A = V [c][tile], B = U [c][n], both read along rows (coalesced), in the
    // staged tiles' own order: four values at a time where every invocation copies the same
    // number of vec4s of a step, else one.
    // One entry point may not use both views of a binding: binding 5 holds V, and U or M.
    let whole = |width: u32| whole_vec4_slots(width * v.bk, threads);
    let ws_vec = whole(v.bm) && (t.u_apart || whole(v.bn));
    let b_vec = if t.u_apart { whole(v.bn) } else { ws_vec };
    let m_vec = !t.u_apart || ws_vec;
    let mut setup = String::new();
    let mut fetch = String::new();
    let mut stage_store = String::new();
    for (side, vec, width, row, src, buf, tile, stage) in [
        ("a", ws_vec, v.bm, "TP", "a_src", "ws", "a_tile", "A_STAGE"),
        ("b", b_vec, v.bn, "NP", "b_src", u_buf, "b_tile", "B_STAGE"),
    ] {
        let quads = width * v.bk / 4;
        if vec {
            writeln!(setup, "    let {side}_src4 = {src} / 4;").unwrap();
            for i in 0..quads / threads {
                let slot = format!("lid + {}", i * threads);
                writeln!(setup, "    let {side}q{i} = ({slot}) % {};\n    let {side}k{i} = ({slot}) / {};", width / 4, width / 4).unwrap();
                writeln!(setup, "    var p{side}{i}: vec4<f32>;").unwrap();
                writeln!(fetch, "    p{side}{i} = {buf}v[{side}_src4 + (k_next + {side}k{i}) * ({row} / 4) + {side}q{i}];").unwrap();
                writeln!(stage_store, "    {tile}[stage * {stage} + {side}k{i} * {} + {side}q{i}] = p{side}{i};", width / 4).unwrap();
            }
        } else {
            for i in 0..width * v.bk / threads {
                let slot = format!("lid + {}", i * threads);
                writeln!(setup, "    let {side}m{i} = ({slot}) % {width};\n    let {side}k{i} = ({slot}) / {width};").unwrap();
                writeln!(setup, "    var p{side}{i}: f32;").unwrap();
                writeln!(fetch, "    p{side}{i} = {buf}[{src} + (k_next + {side}k{i}) * {row} + {side}m{i}];").unwrap();
                writeln!(stage_store, "    {tile}[stage * {stage} + {side}k{i} * {} + {side}m{i} / 4][{side}m{i} % 4] = p{side}{i};", width / 4)
                    .unwrap();
            }
        }
    }
    let mut acc = String::new();
    write_accumulators(&mut acc, v.tm, v.tn);
    let a_row = v.bm / 4;
    let mut inner = String::new();
    write_inner(&mut inner, v.bk, (v.tm, v.tn), (tx, ty), a_row, v.bn);
    // Register (i, j) holds tile m0 + 4*TX*(i/4) + 4*tx + i%4 and channel n0 + 4*TY*(j/4) +
    // 4*ty + j%4: four neighbouring tiles of a channel (NCHW: M along tiles) or four
    // neighbouring channels of a tile (NHWC: M along channels) go out as one vec4.
    let mut store = String::new();
    let quad = |s: &mut String, at: &str, values: [String; 4]| {
        writeln!(s, "        {m_buf}v[({m_at}{at}) >> 2u] = vec4<f32>({});", values.join(", ")).unwrap();
    };
    if !m_vec {
        for i in 0..v.tm {
            writeln!(store, "    let st{i} = (m0 + {} + 4 * tx) * MST;", (i / 4) * 4 * tx + i % 4).unwrap();
        }
        for j in 0..v.tn {
            writeln!(store, "    {{\n        let sn = m_dst + (n0 + {} + 4 * ty) * MSN;", (j / 4) * 4 * ty + j % 4).unwrap();
            for i in 0..v.tm {
                writeln!(store, "        {m_buf}[{m_at}sn + st{i}] = acc{i}_{j};").unwrap();
            }
            writeln!(store, "    }}").unwrap();
        }
    } else if nhwc {
        for i in 0..v.tm {
            writeln!(store, "    {{\n        let st = (m0 + {} + 4 * tx) * MST;", (i / 4) * 4 * tx + i % 4).unwrap();
            for q in 0..v.tn / 4 {
                let at = format!("m_dst + st + n0 + {} + 4 * ty", q * 4 * ty);
                quad(&mut store, &at, std::array::from_fn(|e| format!("acc{i}_{}", 4 * q + e as u32)));
            }
            writeln!(store, "    }}").unwrap();
        }
    } else {
        for j in 0..v.tn {
            writeln!(store, "    {{\n        let sn = m_dst + (n0 + {} + 4 * ty) * MSN;", (j / 4) * 4 * ty + j % 4).unwrap();
            for q in 0..v.tm / 4 {
                let at = format!("sn + m0 + {} + 4 * tx", q * 4 * tx);
                quad(&mut store, &at, std::array::from_fn(|e| format!("acc{}_{j}", 4 * q + e as u32)));
            }
            writeln!(store, "    }}").unwrap();
        }
    }
    // The GEMM's invocations go along M's fastest axis.
    let lanes = if nhwc { "    let ty = lid % TY;\n    let tx = lid / TY;" } else { "    let tx = lid % TX;\n    let ty = lid / TX;" };

    let f_jobs = groups * cp * np;
    let f_blocks = f_jobs.div_ceil(256);
    let v_jobs = groups * cp * tp;
    let v_blocks = v_jobs.div_ceil(256);
    vars.extend([
        ("WORKSPACES", workspaces),
        ("F_JOBS", f_jobs.to_string()),
        ("V_JOBS", v_jobs.to_string()),
        ("V_BLOCKS", v_blocks.to_string()),
        ("TM", v.tm.to_string()),
        ("TN", v.tn.to_string()),
        ("TX", tx.to_string()),
        ("TY", ty.to_string()),
        ("A_ROW", a_row.to_string()),
        ("A_TILE", (2 * v.bk * a_row).to_string()),
        ("B_TILE", (2 * v.bk * v.bn / 4).to_string()),
        ("THREADS", threads.to_string()),
        ("LANES", lanes.to_string()),
        ("FILTER_TRANSFORM", filter),
        ("INPUT_TRANSFORM", input),
        ("SETUP", setup),
        ("ACC_DECL", acc),
        ("FETCH", fetch),
        ("STAGE_STORE", stage_store),
        ("INNER", inner),
        ("STORE", store),
    ]);
    let mut kernel = Kernel::plain(render(WinoGemm::TEMPLATE, &vars)?, gemm);
    kernel.prologue = Some(v_blocks + f_blocks);
    // U's workgroups, the prologue's last: left out where U is kept with resident weights.
    kernel.w_blocks = if t.u_apart { f_blocks } else { 0 };
    kernel.workspace = t.workspace(shape, tp);
    kernel.finish = Some(finish);
    kernel.chunks = chunks;
    Ok(kernel)
}

/// A linear combination, or `0.0` where every coefficient is zero.
fn or_zero(s: String) -> String {
    if s.is_empty() { "0.0".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Padding;

    fn shape(x: [usize; 4], w: [usize; 4], stride: i64, pad: i64, groups: i64) -> ConvShape {
        ConvShape::new(x, w, (stride, stride), Padding::Explicit(pad, pad), (1, 1), groups, None).unwrap()
    }

    /// `rows` times the vector `v`.
    fn apply(rows: &[Vec<f64>], v: &[f64]) -> Vec<f64> {
        rows.iter().map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum()).collect()
    }

    /// X -> L X L^T for L given by its rows.
    fn sandwich(rows: &[Vec<f64>], x: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let cols: Vec<Vec<f64>> = (0..x[0].len()).map(|j| apply(rows, &x.iter().map(|r| r[j]).collect::<Vec<_>>())).collect();
        (0..rows.len()).map(|a| apply(rows, &cols.iter().map(|c| c[a]).collect::<Vec<_>>())).collect()
    }

    /// One tile of F(mxm, rxr) in float64 through the matrices the generator writes out,
    /// against the direct rxr correlation of the patch.
    #[test]
    fn transforms_compute_one_tile_exactly() {
        for (m, r) in [(2usize, 3usize), (4, 3), (6, 3), (2, 5), (4, 5)] {
            let tr = transforms(m as u32, r as u32);
            let p = m + r - 1;
            assert_eq!((tr.bt.len(), tr.g.len(), tr.g[0].len(), tr.at.len()), (p, p, r, m));
            let d: Vec<Vec<f64>> = (0..p).map(|a| (0..p).map(|b| ((a * 7 + b * 3) % 11) as f64 - 5.25).collect()).collect();
            let g: Vec<Vec<f64>> = (0..r).map(|a| (0..r).map(|b| ((a * 5 + b * 2) % 7) as f64 * 0.75 - 2.0).collect()).collect();
            let u = sandwich(&tr.g, &g);
            let v = sandwich(&tr.bt, &d);
            let prod: Vec<Vec<f64>> = (0..p).map(|a| (0..p).map(|b| u[a][b] * v[a][b]).collect()).collect();
            let y = sandwich(&tr.at, &prod);
            for a in 0..m {
                for b in 0..m {
                    let want: f64 = (0..r).flat_map(|i| (0..r).map(move |j| (i, j))).map(|(i, j)| d[a + i][b + j] * g[i][j]).sum();
                    assert!((y[a][b] - want).abs() < 1e-9, "F({m}, {r}): y[{a}][{b}] = {}, want {want}", y[a][b]);
                }
            }
        }
    }

    /// The points give the published matrices (Lavin's F(2x2), NNPACK's F(6x6)) and, for
    /// F(4x4), Barabasz et al.'s; B^T's entries are exact in binary (snapped).
    #[test]
    fn transforms_are_the_published_ones() {
        // Infinity's row of B^T has the opposite sign of Lavin's, whose A^T has -1 in its
        // column where this one has +1: the same products.
        let t2 = transforms(2, 3);
        assert_eq!(t2.bt, vec![vec![1.0, 0.0, -1.0, 0.0], vec![0.0, 1.0, 1.0, 0.0], vec![0.0, -1.0, 1.0, 0.0], vec![0.0, -1.0, 0.0, 1.0]]);
        let t4 = transforms(4, 3);
        assert_eq!(t4.bt[0], vec![1.0, -1.5, -2.0, 1.5, 1.0, 0.0]);
        assert_eq!(t4.bt[4], vec![0.0, 0.5, -1.0, -0.5, 1.0, 0.0]);
        assert_eq!(t4.bt[5], vec![0.0, 1.0, -1.5, -2.0, 1.5, 1.0]);
        assert!((t4.g[1][0] - 1.0 / 3.0).abs() < 1e-15 && (t4.g[3][0] + 16.0 / 15.0).abs() < 1e-15);
        assert_eq!(t4.at[3], vec![0.0, 1.0, -1.0, 0.125, -8.0, 1.0]);
        let t6 = transforms(6, 3);
        assert_eq!(t6.bt[0], vec![1.0, 0.0, -5.25, 0.0, 5.25, 0.0, -1.0, 0.0]);
        assert_eq!(t6.bt[3], vec![0.0, 0.5, 0.25, -2.5, -1.25, 2.0, 1.0, 0.0]);
        assert_eq!(t6.bt[7], vec![0.0, -1.0, 0.0, 5.25, 0.0, -5.25, 0.0, 1.0]);
        assert!((t6.g[5][0] - 32.0 / 45.0).abs() < 1e-15 && (t6.g[1][1] + 2.0 / 9.0).abs() < 1e-15);
        assert_eq!(t6.at[5], vec![0.0, 1.0, -1.0, 32.0, -32.0, 1.0 / 32.0, -1.0 / 32.0, 1.0]);
        // F(2x2, 5x5) at F(4x4, 3x3)'s points: the same B^T.
        assert_eq!(transforms(2, 5).bt, t4.bt);
    }

    #[test]
    fn computes_only_3x3_and_5x5_stride_1_and_bounded_workspaces() {
        // Dilated ones too, as their dilation's phases (`Tiling::tiles`).
        let ok = shape([2, 16, 9, 8], [32, 16, 3, 3], 1, 1, 1);
        let strided = shape([2, 16, 9, 8], [32, 16, 3, 3], 2, 1, 1);
        let dilated = ConvShape::new([2, 16, 9, 8], [32, 16, 3, 3], (1, 1), Padding::Explicit(1, 1), (2, 2), 1, None).unwrap();
        let five = shape([2, 16, 9, 8], [32, 16, 5, 5], 1, 2, 1);
        let seven = shape([2, 16, 9, 8], [32, 16, 7, 7], 1, 3, 1);
        let five_by_three = shape([2, 16, 9, 8], [32, 16, 5, 3], 1, 1, 1);
        // 8 x 256 x 112 x 112: V alone is over 128 MiB for every m; it runs in chunks.
        let huge = shape([8, 256, 112, 112], [256, 256, 3, 3], 1, 1, 1);
        // 2048 -> 2048 channels: U alone is 256 MiB or more for every m, nothing to chunk.
        let wide = shape([1, 2048, 8, 8], [2048, 2048, 3, 3], 1, 1, 1);
        for v in WinoGemm::space() {
            assert!(v.computes(&ok), "{}", v.name());
            // 32x32 tiles suit it; 64 output channels are past its 32.
            assert!(v.suits(&ok) || v.bn > 32 || v.bm > 32, "{}", v.name());
            assert!(!v.suits(&ok) || v.bn == 32, "{}", v.name());
            assert_eq!(v.generate(&ok).unwrap().chunks, 1);
            assert!(v.computes(&huge) && v.generate(&huge).unwrap().chunks > 1, "{}", v.name());
            assert!(v.computes(&dilated), "{}", v.name());
            // 5x5 with F(2x2) only: F(4x4, 5x5) would round as F(6x6, 3x3) does.
            assert_eq!(v.computes(&five), v.m == 2, "{}", v.name());
            if v.m == 2 {
                assert_eq!(v.generate(&five).unwrap().chunks, 1);
            }
            for s in [&strided, &seven, &five_by_three, &wide] {
                assert!(!v.suits(s) && !v.computes(s));
                assert!(v.generate(s).unwrap_err().to_string().contains("cannot run on this shape"));
            }
            let err = v.generate(&wide).unwrap_err().to_string();
            assert!(err.contains("bytes of workspace"), "{err}");
        }
    }

    /// The EDSR body at 720p (1 x 64 x 720 x 1280 -> 64, 3x3, padding 1): every variant
    /// computes it in chunks of whole GEMM tiles, each workspace within 128 MiB, and within a
    /// lower adapter bound in more chunks; the chunked WGSL validates.
    #[test]
    fn large_bodies_run_in_chunks_within_the_bound() {
        let edsr = shape([1, 64, 720, 1280], [64, 64, 3, 3], 1, 1, 1);
        for v in WinoGemm::space() {
            let (_, _, tiles) = v.tiles(&edsr);
            assert!(v.computes(&edsr), "{}", v.name());
            for cap in [MAX_WORKSPACE, 48 << 20] {
                let c = v.chunking(&edsr, cap).unwrap();
                let k = v.generate_within(&edsr, cap).unwrap();
                assert!(c.chunks > 1 && k.chunks == c.chunks, "{}: {c:?}", v.name());
                assert_eq!(k.workspace, v.workspace(&edsr, c.tp));
                assert!(k.workspace.iter().all(|&b| b <= cap), "{}: {:?}", v.name(), k.workspace);
                // Whole GEMM tiles; every tile in some chunk, the last chunk not empty.
                assert_eq!(c.tp % v.bm as u64, 0);
                assert!(c.tp * c.chunks as u64 >= tiles && c.tp * (c.chunks as u64 - 1) < tiles);
                // The dispatches are one chunk's.
                assert_eq!(k.workgroups, c.tp / v.bm as u64 * (64u64.div_ceil(v.bn as u64)) * v.tiling(&edsr).p2() as u64);
                if let Err(e) = crate::codegen::validate(&k.source) {
                    panic!("{}: {e}", v.name());
                }
            }
            assert!(v.chunking(&edsr, 48 << 20).unwrap().chunks > v.chunking(&edsr, MAX_WORKSPACE).unwrap().chunks);
            assert!(v.cost(&edsr).is_finite() && v.cost(&edsr) > 0.0);
        }
        // F(4x4), 64-tile GEMMs: 57,600 tiles of 36 x 64 x 4 B of V (and M) each, U 576 KiB:
        // 14,464 tiles fit 128 MiB, so 4 chunks of 14,400.
        let f4 = WinoGemm { m: 4, bm: 64, bn: 64, bk: 8, tm: 4, tn: 4 };
        assert_eq!(f4.chunking(&edsr, MAX_WORKSPACE), Some(Chunking { tp: 14400, chunks: 4 }));
        // A bound raised past the default (CONVTUNE_MAX_WORKSPACE) takes fewer chunks: V of
        // the whole EDSR body (530 MB) in one.
        assert_eq!(f4.generate_within(&edsr, MAX_WORKSPACE).unwrap().chunks, 4);
        assert_eq!(f4.generate_within(&edsr, 1 << 30).unwrap().chunks, 1);
        let one = shape([1, 64, 360, 640], [64, 64, 3, 3], 1, 1, 1);
        assert_eq!(f4.chunking(&one, MAX_WORKSPACE).unwrap().chunks, 1);
    }

    /// Chunked kernels on lavapipe, the workspace bound set so that each chunk holds one GEMM
    /// tile of tiles (the last one partial), against the float64 reference with poisoned
    /// outputs: three images, groups, bias, odd output sizes; GPU timing brackets them all.
    #[test]
    fn chunked_kernels_compute_the_reference() {
        use crate::runner::tests::{max_rel_err, reference};
        use crate::runner::{random_data, DeviceTensors};
        let e = crate::device::engine().expect("a Vulkan adapter (lavapipe in CI)");
        let s = ConvShape::new([3, 6, 19, 17], [10, 3, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 2, Some(10)).unwrap();
        let x = random_data(s.x_len() as usize, 1);
        let w = random_data(s.w_len() as usize, 2);
        let b = random_data(10, 3);
        let want = reference(&s, &x, &w, Some(&b));
        let t = DeviceTensors::upload(&e, &s, &x, &w, Some(&b), None).unwrap();
        for v in WinoGemm::space().into_iter().filter(|v| v.bm == 32) {
            let (_, _, tiles) = v.tiles(&s);
            let cap = v.workspace(&s, v.bm as u64).into_iter().max().unwrap();
            let c = v.chunking(&s, cap).unwrap();
            assert_eq!(c, Chunking { tp: v.bm as u64, chunks: tiles.div_ceil(v.bm as u64) as u32 });
            assert!(c.chunks > 1 && tiles % v.bm as u64 != 0, "{}: {tiles} tiles", v.name());
            let variant = super::super::Variant::Wgemm(v);
            let k = e.compile_within(&variant, &s, cap).unwrap();
            assert_eq!(k.chunks, c.chunks);
            t.poison(&e).unwrap();
            t.run(&e, &k).unwrap();
            let got = t.read_y_f32(&e).unwrap();
            // The poison is NaN, which max_rel_err passes over.
            assert!(got.iter().all(|v| v.is_finite()), "{}: outputs left unwritten", v.name());
            let err = max_rel_err(&got, &want);
            let bound = if v.m == 6 { 1e-4 } else { 1e-5 };
            assert!(err <= bound, "{} in {} chunks: max relative error {err}", v.name(), c.chunks);
            let times = t.time(&e, &k, 2).unwrap();
            assert!(times.len() == 2 && times.iter().all(|t| t.is_finite() && *t >= 0.0));
            // A word less than one GEMM tile's worth: refused.
            let err = e.compile_within(&variant, &s, cap - 4).err().unwrap().to_string();
            assert!(err.contains("cannot run on this shape"), "{err}");
        }
    }

    /// A transposed convolution in its lowered form (a weight pass, then the chunks; stores
    /// through the scatter, cropped): 6x6 at stride 2 is 3x3 per stride phase.
    #[test]
    fn chunked_kernels_compute_a_lowered_transposed_convolution() {
        use crate::runner::tests::{max_rel_err, reference};
        use crate::runner::{random_data, DeviceTensors};
        let e = crate::device::engine().expect("a Vulkan adapter (lavapipe in CI)");
        let s = ConvShape::new_transposed([2, 4, 23, 20], [4, 3, 6, 6], (2, 2), (1, 2), (1, 0), (1, 1), 1, Some(3)).unwrap();
        let low = s.lowered().unwrap();
        assert!(applies_dilated(&low) && low.dilation == (1, 1) && low.scatter.is_some_and(|sc| sc.crops()), "{}", low.label());
        let x = random_data(s.x_len() as usize, 4);
        let w = random_data(s.w_len() as usize, 5);
        let b = random_data(3, 6);
        let want = reference(&s, &x, &w, Some(&b));
        let t = DeviceTensors::upload(&e, &s, &x, &w, Some(&b), None).unwrap();
        for v in WinoGemm::space().into_iter().filter(|v| v.bm == 32) {
            let (_, _, tiles) = v.tiles(&low);
            let cap = v.workspace(&low, v.bm as u64).into_iter().max().unwrap();
            let chunks = v.chunking(&low, cap).unwrap().chunks;
            assert!(chunks > 1 && tiles % v.bm as u64 != 0, "{}: {tiles} tiles", v.name());
            let k = e.compile_within(&super::super::Variant::Wgemm(v), &s, cap).unwrap();
            assert!(k.chunks == chunks && k.wprep.is_some());
            t.poison(&e).unwrap();
            t.run(&e, &k).unwrap();
            let got = t.read_y_f32(&e).unwrap();
            assert!(got.iter().all(|v| v.is_finite()), "{}: outputs left unwritten", v.name());
            let err = max_rel_err(&got, &want);
            assert!(err <= if v.m == 6 { 1e-4 } else { 1e-5 }, "{} in {chunks} chunks: max relative error {err}", v.name());
        }
    }

    #[test]
    fn space_is_small_well_formed_and_names_round_trip() {
        let space = WinoGemm::space();
        assert_eq!(space.len(), SPACE.len());
        assert!(space.iter().all(|v| v.workgroup_bytes() <= 16 << 10 && v.threads() <= 256));
        for m in [2, 4, 6] {
            assert!(space.iter().any(|v| v.m == m));
        }
        for v in &space {
            let name = v.name();
            let parsed: super::super::Variant = name.parse().unwrap();
            assert_eq!(parsed.to_string(), name);
        }
        assert!(space.iter().any(|v| v.name() == "wgemm_m4_b64x64x8_t4x4"));
    }

    #[test]
    fn f6_serves_high_only() {
        for v in WinoGemm::space() {
            assert!(v.serves(Precision::High));
            assert_eq!(v.serves(Precision::Highest), v.m != 6, "{}", v.name());
        }
    }

    /// Workspaces: U, V and M padded to whole tiles and steps, U in a binding of its own (its
    /// workgroups the prologue's last, for a weight Tensor to keep it) where that takes no more
    /// chunks, else before V; the dispatches cover every job.
    #[test]
    fn workspaces_and_dispatches() {
        let s = shape([3, 37, 11, 7], [41, 37, 3, 3], 1, 0, 1);
        let v = WinoGemm { m: 4, bm: 32, bn: 32, bk: 8, tm: 4, tn: 4 };
        // OH 9, OW 5: 3 x 2 tiles per image, 18 in all -> TP 32; CP 40, NP 64.
        assert_eq!(v.padded(&s), (32, 40, 64));
        let k = v.generate(&s).unwrap();
        assert_eq!(k.workspace, [36 * 32 * (40 + 64) * 4, 36 * 40 * 64 * 4]);
        assert_eq!(k.workgroups, 36 * 2);
        assert_eq!(k.prologue, Some((40 * 64u64).div_ceil(256) + (40 * 32u64).div_ceil(256)));
        assert_eq!(k.w_blocks, (40 * 64u64).div_ceil(256));
        assert!(k.source.contains("uw[dst + 0] = u_0;"));
        assert!(k.source.contains("wsv[(MOFF + sn + m0 + 0 + 4 * tx) >> 2u] = vec4<f32>(acc0_0, acc1_0, acc2_0, acc3_0);"));
        assert_eq!(k.finish, Some((41 * 18u64).div_ceil(256)));
        // The EDSR body at 720p: U apart would take 8 chunks where U before V takes 4.
        let edsr = shape([1, 64, 720, 1280], [64, 64, 3, 3], 1, 1, 1);
        let f4 = WinoGemm { m: 4, bm: 64, bn: 64, bk: 8, tm: 4, tn: 4 };
        let k = f4.generate(&edsr).unwrap();
        assert_eq!((k.chunks, k.w_blocks), (4, 0));
        assert!(k.source.contains("mwv[(sn + m0 + 0 + 4 * tx) >> 2u] = vec4<f32>(acc0_0, acc1_0, acc2_0, acc3_0);"));
    }

    /// Each family's likeliest variant on a large 3x3 body: F(4x4) or F(6x6) ranks ahead of
    /// F(2x2) (fewer multiply-adds per output), and the GEMMs' workspace round trips make a
    /// small problem cheaper elsewhere.
    #[test]
    fn cost_prefers_larger_tiles_on_large_problems() {
        let big = shape([8, 256, 28, 28], [256, 256, 3, 3], 1, 1, 1);
        let best = WinoGemm::space().into_iter().min_by(|a, b| a.cost(&big).total_cmp(&b.cost(&big))).unwrap();
        assert!(best.m >= 4, "{}", best.name());
        for v in WinoGemm::space() {
            assert!(v.cost(&big).is_finite() && v.cost(&big) > 0.0);
        }
    }
}
