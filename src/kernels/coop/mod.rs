//! The cooperative-matrix family: implicit GEMM like `gemm`, with the products on 16x16x16
//! f16 tensor-core tiles and f32 accumulators. x and w are scaled by powers of two and
//! converted to f16 while staging; `split = 3` adds the lo parts of a hi/lo split for
//! float32-class accuracy; `splits > 1` splits the reduction of short grids (split-K).
//! Runs only where the adapter has 16x16x16 f16->f32 cooperative matrices on 32-wide
//! subgroups.

use super::cost::{multiprocessor_fill, parallel_efficiency, residency, GATHER_LOAD, LONG_GRID};
use super::implicit::{self, View, PARTIAL, SPLIT_WORKSPACE};
use super::{phases, Family, KernelVariant};
use crate::codegen::{render, shape_vars, Kernel, LANES};
use crate::error::{Error, Result};
use crate::dtype::DType;
use crate::params::{ConvShape, Layout};
use crate::precision::Precision;
use std::fmt::Write as _;

mod direct_store;
mod gather;
mod prologue;
mod variant;
mod steps;
mod store;
mod taps;
mod window;

use gather::{a_setup_channels_last, a_setup_in_place, fetch_channels_last, fetch_in_place, gather, Lean};
use prologue::prologue_vars;
pub(super) use steps::unpack_at;
use steps::{b_register, inner_product, stage_b_packed, stage_step, steps};
use store::{finish_store, phase_quads, store_step};
pub use variant::{Coop, SUBGROUP};
use variant::*;
use window::{window_bounds, window_setup, window_steps, window_weights, PatchSource, Window, WINDOW_WASTE};


/// A tensor-core multiply-add relative to a scalar FMA, per multiply-add it performs.
const MMA: f64 = 0.08;
/// The scale pass and the f16 conversion while staging, per staged element.
const CONVERT: f64 = 2.0;
/// Layout 1's prologue, per element of x and w it copies.
const PROLOGUE: f64 = 6.0;
/// Layout 0's w gathers against its x gathers (the model's unit) in the single-pass tiles:
/// w is read along its contiguous rows, x through each term's window decode and bounds
/// tests, so tiles wide in channels, which reuse each gathered x term more, win. On an H200,
/// "high" 32,128,56,56 -> 128 stride 2: 64x128 0.096 ms against 128x64's 0.136, equal in a
/// symmetric model. The split tiles keep the symmetric weights: with them the 7x7 stem's
/// "highest" winner (256x64, 0.292 ms) fell out of the tiles a 1 s budget times (0.312).
const LAYOUT0_W_GATHER: f64 = 0.5;
/// A workgroup barrier, per multiply-add of the step it closes: a quarter of the FMA
/// families' figure. On the H100, 16-term steps beat 32- and 64-term ones on every long
/// grid measured (EDSR, 32,64,56,56, the 1x1 layers: 7-45%), and lost only where the grid
/// is short (32,256,14,14, where residency does not matter).
const COOP_BARRIER: f64 = 5.0;


/// One k-step's products of a plain GEMM on tiles staged as this family stages them (A
/// column-major, `a_hi[k][m]`, as layout 0 does, or row-major, `a_hi[m][k]`, as layout 1
/// does, in rows of LDA f16; B as `b_hi[n][k]` in rows of LDB), one f16 product per term,
/// into accumulators `acc{i}_{j}` of the subgroup whose tile starts at row `wm` and column
/// `wn`: the tensor-core core other families' GEMMs run on (the Winograd family `wcoop`).
/// `split` 3: the split pair, the lo parts staged as `a_lo` and `b_lo`, the correction terms
/// into `cor{i}_{j}`.
pub(super) fn gemm_step(bm: u32, bn: u32, bk: u32, sgm: u32, sgn: u32, a_row_major: bool, split: u32) -> String {
    let layout = u32::from(a_row_major);
    inner_product(&Coop { bm, bn, bk, sgm, sgn, split, layout, splits: 1 }, None)
}

impl Coop {
    /// Whether the kernel runs as window tiles on `shape` (a window variant whose window fits).
    fn runs_windowed(&self, shape: &ConvShape) -> bool {
        self.windowed() && window::Window::of(self, shape).is_some()
    }

    /// Staged A rows: k (layout 0) or pixels (layouts 1, 2).
    fn a_rows(&self) -> u32 {
        if self.windowed() {
            window::patch_capacity(self)
        } else if self.channels_last() {
            self.bm
        } else {
            self.bk
        }
    }

    /// A split only where the grid leaves at least half the multiprocessors idle, each part
    /// keeps at least two steps, the partials stay small, and binding 5 can hold them as f32
    /// (x read in place, or the f32 copy of float32 data before them).
    fn splits_suit(&self, shape: &ConvShape) -> bool {
        if self.splits == 1 {
            return true;
        }
        // The 4x4-grid split tiles on float16 data only: on float32 data ("high", packed
        // copies) they lost to the unsplit winners on the layers they were measured on
        // (32,512,7,7 0.076 against 0.071 ms; 32,256,14,14 0.078-0.105 against 0.060) and,
        // ranked above those winners, kept them out of a 1 s budget's reach.
        if self.tm() * self.tn() == 16 && shape.dtype != DType::F16 {
            return false;
        }
        let padded = Padded::of(shape);
        // Window tiles split their channel blocks: two at least per part.
        let long_enough = if self.windowed() {
            padded.cp >= 2 * (self.splits * self.bk) as u64
        } else {
            padded.krp >= 2 * (self.splits * self.bk) as u64
        };
        // Half the multiprocessors idle at least: on the H100 split-K won at 52 tiles
        // (32,512,7,7, 0.146 -> 0.091 ms) and lost at 98 (32,256,14,14, 0.079 -> 0.087).
        // The split window tile runs two workgroups per multiprocessor, so half its slots
        // idle up to one workgroup per multiprocessor.
        let resident = if self.windowed() { 2 } else { 1 };
        grid(self, shape).2 * 2 <= LONG_GRID * resident
            && long_enough
            && implicit::partial_bytes(shape, self.splits) <= SPLIT_WORKSPACE
            && split_possible(self, shape)
    }
}

/// A split's partials are f32 in binding 5, after the x copy (f32 for float32 data) or
/// alone (x read in place: NHWC, or float16 NCHW under a window tile), and within the
/// split-K workspace's hard limit.
fn split_possible(v: &Coop, shape: &ConvShape) -> bool {
    (shape.dtype == DType::F32 || reads_x_in_place(shape) || (v.windowed() && window_f16_nchw(shape)))
        && implicit::partial_bytes(shape, v.splits) <= 4 * SPLIT_WORKSPACE
}

impl Family for Coop {
    const NAME: &'static str = "coop";
    const TEMPLATE: &'static str = include_str!("../../../shaders/coop.wgsl");

    fn space() -> Vec<Self> {
        let mut out = Vec::new();
        for &layout in &LAYOUT {
            for &split in &SPLIT {
                for &(bm, bn, sgm, sgn) in &all_tiles() {
                    for &bk in &BK {
                        for &splits in &SPLITS {
                            let v = Coop { bm, bn, bk, sgm, sgn, split, layout, splits };
                            if v.well_formed() {
                                out.push(v);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [bm, bn, bk, sgm, sgn, split] => Some(Coop { bm, bn, bk, sgm, sgn, split, layout: 0, splits: 1 }),
            [bm, bn, bk, sgm, sgn, split, layout] => Some(Coop { bm, bn, bk, sgm, sgn, split, layout, splits: 1 }),
            [bm, bn, bk, sgm, sgn, split, layout, splits] => Some(Coop { bm, bn, bk, sgm, sgn, split, layout, splits }),
            _ => None,
        }
    }
}

impl KernelVariant for Coop {
    fn family(&self) -> &'static str {
        Self::NAME
    }

    fn name(&self) -> String {
        let name = format!("coop_b{}x{}x{}_s{}x{}_p{}", self.bm, self.bn, self.bk, self.sgm, self.sgn, self.split);
        // Layout 0 and unsplit variants keep the names they had before layouts and splits
        // existed, so caches stay valid.
        let name = if self.layout == 0 { name } else { format!("{name}_l{}", self.layout) };
        if self.splits == 1 { name } else { format!("{name}_k{}", self.splits) }
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![
            ("bm", self.bm), ("bn", self.bn), ("bk", self.bk),
            ("sgm", self.sgm), ("sgn", self.sgn), ("split", self.split), ("layout", self.layout),
            ("splits", self.splits),
        ]
    }

    fn well_formed(&self) -> bool {
        let t = self.threads();
        let tile = (self.bm, self.bn, self.sgm, self.sgn);
        let tile_ok = match self.layout {
            4 => self.bk == 16 && WINDOW_ROW_TILES.contains(&tile),
            3 => TILES.contains(&tile) && !(self.bk == 16 && WINDOW_ROW_TILES.contains(&tile)),
            _ => TILES.contains(&tile) || SMALL_TILES.contains(&tile),
        };
        tile_ok
            && BK.contains(&self.bk)
            && SPLIT.contains(&self.split)
            && LAYOUT.contains(&self.layout)
            // Each invocation stages whole chunks of four, with the same four pixels
            // (layout 0) or the same four reduction terms (layout 1) in every A slot, and
            // every slot count is whole.
            && t % (if self.channels_last() { self.bk / self.a_chunk() } else { self.bm / 4 }) == 0
            && (self.bm * self.bk / self.a_chunk()) % t == 0
            // Layouts 2 and 3 are the single pass on float16 data, which has no lo part.
            && (self.layout < 2 || self.split == 1)
            // The window tile: 16- or 32-term steps (the patch must fit).
            && (!self.windowed() || self.bk <= 32)
            // Whole B slots, or (layout 2's 8-term chunks on a narrow tile) fewer chunks
            // than invocations, which the first ones gather.
            && ((self.bn * self.bk / self.b_chunk()) % t == 0 || (self.layout >= 2 && self.bn * self.bk / 8 < t))
            // The large-k-step variants only where the tile stays small enough to pay off.
            && (self.bk <= 32 || self.bm * self.bn <= 128 * 128)
            // Split-K on channels-last tiles that win deep layers, with 16- and 64-term steps,
            // and on the 4x4-grid window tiles (over channel blocks).
            && SPLITS.contains(&self.splits)
            && (self.splits == 1
                || (self.channels_last() && !self.windowed() && self.bk != 32 && SPLIT_TILES.contains(&tile))
                || (self.windowed() && SPLIT_WINDOW_TILES.contains(&tile)))
    }

    fn invocations(&self) -> u32 {
        self.threads()
    }

    fn workgroup_bytes(&self) -> u32 {
        let taps = self.taps_per_step(window::WINDOW_MAX_RS);
        let staged = (self.a_rows() * self.lda() + taps * self.bn * self.ldb()) * 2 * self.parts();
        let scratch = self.sgm * self.sgn * 256 * 4 * self.parts();
        staged + scratch
    }

    fn needs_tensor_cores(&self) -> bool {
        true
    }

    /// The single pass serves "high"; the split serves "highest" (it would serve "high" too,
    /// at three times the work, so tuning for "high" does not spend its budget on it).
    fn serves(&self, precision: Precision) -> bool {
        matches!((self.split, precision), (1, Precision::High) | (3, Precision::Highest))
    }

    /// Stores that move y's elements (pixel shuffle, a lowered transposed convolution) go
    /// through `ystore`: in the store step, or for split-K in the finishing pass.
    fn computes(&self, _shape: &ConvShape) -> bool {
        true
    }
    fn padding_modes(&self) -> bool {
        true
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        if !self.computes(shape) {
            return false;
        }
        // Layout 1 takes NHWC x (in place where its pixel rows are whole vec4s, else through
        // a padded copy); layout 0 gathers along NCHW's rows.
        let layout_ok = (shape.layout == Layout::Nchw || self.channels_last())
            // Layouts 2 to 4 read x 8 channels at a time (`reads_octets`).
            && (self.layout < 2 || reads_octets(self, shape));
        // float16 data has no lo part: the split would triple the work for nothing.
        let split_ok = self.split == 1 || shape.dtype == DType::F32;
        // The window tile where its padding at image edges stays small, on kernels wider than
        // 1x1 (a 1x1 kernel reads each term once: nothing to share).
        let window_ok = !self.windowed()
            || Window::of(self, shape).is_some_and(|w| w.waste(shape) <= WINDOW_WASTE && shape.r * shape.s > 1);
        layout_ok && split_ok && window_ok && self.splits_suit(shape) && View::of(shape).tiles_suit((self.bm, self.bn, self.bk), (64, 64, 32))
    }

    fn cost(&self, shape: &ConvShape) -> f64 {
        let view = View::of(shape);
        let (_, _, tiles) = grid(self, shape);
        // Layout 3 stages each x term of its patch once for all R*S taps (plus the halo), and
        // computes the pixels its tiles pad the image with.
        let (a_share, waste) = match (self.layout, Window::of(self, shape)) {
            (3 | 4, Some(w)) => ((w.pr * w.pc) as f64 / ((w.th * w.tw) as f64 * (shape.r * shape.s) as f64), w.waste(shape)),
            _ => (1.0, 1.0),
        };
        // Layout 1 gathers four terms per load and index computation, after a prologue
        // that reads x and w once and writes them once.
        let (gather, prologue, padded) = if self.channels_last() {
            let p = Padded::of(shape);
            // float32 data: layout 2 gathers a packed copy of x; window tiles read x in place
            // (every x they take).
            let copied_x = match (self.layout, shape.dtype) {
                (3 | 4, _) => false,
                (2, DType::F32) => true,
                _ => !reads_x_in_place(shape),
            };
            let x_copied = if copied_x { p.x_len(shape) } else { 0 };
            let copied = (x_copied + p.w_len(shape)) as f64;
            (GATHER_LOAD / self.a_chunk() as f64, PROLOGUE * copied, p.krp as f64 / view.red as f64)
        } else if pixel_quads(shape) {
            (GATHER_LOAD / 4.0, 0.0, 1.0)
        } else {
            (GATHER_LOAD, 0.0, 1.0)
        };
        let w_share = if self.channels_last() || pixel_quads(shape) || self.split > 1 { 1.0 } else { LAYOUT0_W_GATHER };
        let per_fma = MMA * self.split as f64
            + (gather + CONVERT * self.parts() as f64) * (w_share / self.bm as f64 + a_share / self.bn as f64)
            // Layout 4 closes a step after a kernel row of taps.
            + COOP_BARRIER * 2.0 / (self.bk as f64 * 16.0 * self.taps_per_step(shape.s) as f64);
        // A split is credited with the multiprocessors it fills beyond its unsplit tile's
        // grid (the unsplit ranking is fitted without a fill term) and pays for its partials.
        // Window tiles are not charged for their workgroup memory: their accumulator grids,
        // not it, bound what stays resident (on the H200 layout 4's 512x64 tile, 49 KB, ran
        // EDSR in 0.385 ms where layout 3's 256x64, 43 KB, took 0.54).
        let resident = if self.windowed() { 1.0 } else { residency(self.workgroup_bytes(), self.threads(), tiles) };
        let (fill, partials) = if self.splits > 1 {
            let gain = multiprocessor_fill(tiles * self.splits as u64) / multiprocessor_fill(tiles);
            (gain, PARTIAL * (self.splits as u64 * shape.y_len()) as f64)
        } else {
            (1.0, 0.0)
        };
        view.padded_fmas(self.bm, self.bn, self.bk * self.splits) * padded * waste * taps::live_share(self, shape, self.runs_windowed(shape)) * per_fma
            / parallel_efficiency(tiles * self.invocations() as u64)
            / resident
            / fill
            + prologue
            + partials
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape)
    }
}

/// Every tile shape some layout takes, once each.
fn all_tiles() -> Vec<(u32, u32, u32, u32)> {
    let mut tiles = TILES.to_vec();
    for t in WINDOW_ROW_TILES.iter().chain(&SMALL_TILES) {
        if !tiles.contains(t) {
            tiles.push(*t);
        }
    }
    tiles
}

/// Workgroups along the pixels and channels, and in all: window tiles (layouts 3, 4) tile each image.
fn grid(v: &Coop, shape: &ConvShape) -> (u64, u64, u64) {
    let view = View::of(shape);
    let (mb, nb, blocks) = view.grid(v.bm, v.bn);
    match (v.layout, Window::of(v, shape)) {
        (3 | 4, Some(w)) => (w.tiles(shape), nb, w.tiles(shape) * nb * view.groups),
        _ => (mb, nb, blocks),
    }
}








fn generate(v: &Coop, shape: &ConvShape) -> Result<Kernel> {
    if shape.layout != Layout::Nchw && !v.channels_last() {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: NHWC takes the channels-last variants (_l1 to _l4)",
            v.name()
        )));
    }
    if v.layout >= 2 && !reads_octets(v, shape) {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: layouts 2 to 4 read x 8 channels at a time: float16 NHWC x in place or a packed float16 copy of float32 x, and window tiles any x in place (channels per group a multiple of 8)",
            v.name()
        )));
    }
    let window = Window::of(v, shape);
    if v.windowed() && window.is_none() {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: layouts 3 and 4 stage the input window of float16 NHWC x or of float32 x (either layout) with one group, channels a multiple of 8 and of its step, stride and dilation 1 (a transposed convolution's lowered form counts) and a window of at most 3x3",
            v.name()
        )));
    }
    let window = window.filter(|_| v.windowed());
    // float32 data on layouts 2 to 4: the prologue writes w (and for layout 2 x) as packed float16 copies,
    // scaled by the max pass that runs before it.
    let packed = v.layout >= 2 && shape.dtype == DType::F32;
    // Layouts 2 to 4 gather a 1x1 kernel's w in place (8 neighbouring channels, two 16-byte
    // loads), scaling and packing it as they load it: no weight pass, which cost ~10 us a
    // call on an H200. Wider kernels keep the pass: 8 single loads R*S apart per gather
    // measured 1.3-2.4x slower on 3x3 layers.
    let w_in_place = v.layout >= 2 && shape.r * shape.s == 1;
    let x_vec4 = reads_x_in_place(shape);
    // Window tiles read float32 x in place (either layout), scaling and packing their patch
    // as they load it; the gathering layouts read a packed copy.
    // float16 NCHW x read in place by the window tiles, element by element.
    let f16_nchw = window_f16_nchw(shape) && window.is_some();
    let in_place = (x_vec4 && !packed) || (packed && window.is_some()) || f16_nchw;
    let quads = pixel_quads(shape);
    let lean = Lean::of(v, shape);
    let dt = shape.dtype.wgsl();
    let scaled = shape.dtype == DType::F32;
    // float16 data is copied as float16 (half the bytes to gather); registers stay f32 (f16
    // registers measured no faster on the H100).
    let ct = if scaled { "f32" } else { "f16" };
    let t = v.threads();
    let (tm, tn) = (v.tm(), v.tn());
    let (lda, ldb) = (v.lda(), v.ldb());
    let split = v.split == 3;
    let view = View::of(shape);
    let (m_blocks, n_blocks, blocks) = grid(v, shape);
    // Layout 3 stages its patch with a loop of its own: no A slots.
    let a_slots = if window.is_some() { 0 } else { v.bm * v.bk / v.a_chunk() / t };
    let b_chunks_per_n = v.bk / v.b_chunk();
    let b_total = v.bn * v.bk / v.b_chunk();
    let b_slots = b_total.div_ceil(t);
    // Fewer B chunks than invocations: the rest skip the gather and the staging store.
    let b_guard = if b_total < t { format!(" && lid < {b_total}") } else { String::new() };
    let parts: &[&str] = if split { &["hi", "lo"] } else { &["hi"] };

    // Window tiles stage the weights of every tap a step takes.
    let taps = window.map_or(1, |w| v.taps_per_step(w.s()));
    let mut smem = String::new();
    for p in parts {
        writeln!(smem, "var<workgroup> a_{p}: array<vec4<f16>, {}>;", v.a_rows() * lda / 4).unwrap();
        writeln!(smem, "var<workgroup> b_{p}: array<vec4<f16>, {}>;", taps * v.bn * ldb / 4).unwrap();
    }

    let a_setup = match window {
        Some(w) => window_setup(v, &w),
        None if v.channels_last() => a_setup_channels_last(v, a_slots),
        None => a_setup_in_place(v, a_slots),
    };
    let mut b_setup = String::new();
    for i in 0..b_slots {
        let s = &mut b_setup;
        writeln!(s, "    let bk{i} = {} * ((lid + {}) % {b_chunks_per_n});", v.b_chunk(), i * t).unwrap();
        writeln!(s, "    let bn{i} = (lid + {}) / {b_chunks_per_n};", i * t).unwrap();
        writeln!(s, "    let bok{i} = n0 + bn{i} < KG;").unwrap();
        writeln!(s, "    let bbase{i} = (g * KG + min(n0 + bn{i}, KG - 1)) * KL;").unwrap();
        // Layout 2 holds each gather's 8 packed float16 values as the 16 bytes it loaded.
        writeln!(s, "    var pb{i}: {};", gather_register(v.layout).0).unwrap();
    }
    let mut acc = String::new();
    for i in 0..tm {
        for j in 0..tn {
            writeln!(acc, "    var acc{i}_{j}: MatC;").unwrap();
            if split {
                writeln!(acc, "    var cor{i}_{j}: MatC;").unwrap();
            }
        }
    }
    // A split window tile's first step is its first channel block's.
    let first_k = match window {
        Some(_) if v.splits > 1 => "(t_begin / SPB) * BK",
        _ => "k_begin",
    };
    writeln!(acc, "    var k_next: i32 = {first_k};").unwrap();
    // A lowered transposed convolution's dead taps: the steps skip them, the first gathers
    // are the first live step's.
    let live = taps::live_units(v, shape, window.is_some());
    if let (Some(masks), Some(sc)) = (&live, shape.scatter) {
        smem.push_str(taps::NEXT_LIVE);
        acc.push_str(&taps::live_decl(masks, sc.kg));
        match window {
            Some(_) => {
                let (from, to) = window_bounds(v);
                let rows = taps::row_steps(v, shape, true);
                writeln!(acc, "    let t0 = {};\n    k_next = {};", taps::next_live(v, from, to, rows), window_weights("t0", rows)).unwrap();
            }
            None => writeln!(acc, "    k_next = {};", taps::next_live(v, "k_next", "k_end", false)).unwrap(),
        }
    }

    // Weight rows of a multiple of four values are bound as vec4s; layout 1 reads its
    // channels-last copy, whose rows are always whole vec4s.
    let vec_w = view.red % 4 == 0;
    let w_buf = if v.channels_last() { "wt" } else { "w" };
    let mut fetch = String::new();
    if window.is_some() {
        // The patch is staged by the steps themselves.
    } else if v.channels_last() {
        fetch_channels_last(&mut fetch, v, a_slots, shape, if in_place { "x" } else { "xt" });
    } else {
        fetch_in_place(&mut fetch, a_slots, shape, quads);
    }
    // The B gathers of the step's kernel tap `tap`: its weights `tap` x CP terms on in w's
    // copy (only layout 4 gathers more than tap 0).
    let fetch_b = |s: &mut String, tap: u32| {
        let k = if tap == 0 { "k_next".to_string() } else { format!("k_next + {tap} * CP") };
        for i in 0..b_slots {
            let pb = b_register(tap, i);
            writeln!(s, "    {{").unwrap();
            writeln!(s, "        let kr = {k} + bk{i};").unwrap();
            if vec_w || v.channels_last() {
                // Whole chunks of a weight row, 16-byte aligned: one load each.
                let bok = format!("bok{i}");
                let ok = lean.conj(&[(&bok, lean.n), ("kr < k_end", lean.k)], &b_guard);
                if w_in_place {
                    // One tap: term kr is channel kr of the weight row.
                    let at = format!("bbase{i} + kr");
                    if ok.is_empty() {
                        writeln!(s, "        {pb} = w_chunk({at}, sw);").unwrap();
                    } else {
                        writeln!(s, "        let ok = {ok};").unwrap();
                        writeln!(s, "        {pb} = select(vec4<u32>(0u), w_chunk(select(0, {at}, ok), sw), ok);").unwrap();
                    }
                    writeln!(s, "    }}").unwrap();
                    continue;
                }
                if lean.on {
                    gather(s, &pb, v.layout, "wt", &format!("bbase{i} + kr"), v.b_chunk(), &ok);
                    writeln!(s, "    }}").unwrap();
                    continue;
                }
                writeln!(s, "        let ok = {ok};").unwrap();
                if v.layout >= 2 {
                    writeln!(s, "        {pb} = select(vec4<u32>(0u), wt[select(0, (bbase{i} + kr) / 8, ok)], ok);").unwrap();
                } else {
                    writeln!(s, "        {pb} = select(vec4<f32>(0.0), vec4<f32>({w_buf}[select(0, (bbase{i} + kr) / 4, ok)]), ok);").unwrap();
                }
                writeln!(s, "    }}").unwrap();
                continue;
            }
            for (q, lane) in LANES.iter().enumerate() {
                writeln!(s, "        {{").unwrap();
                writeln!(s, "            let ok = bok{i} && kr + {q} < k_end;").unwrap();
                writeln!(s, "            {pb}.{lane} = select(0.0, f32(w[select(0, bbase{i} + kr + {q}, ok)]), ok);").unwrap();
                writeln!(s, "        }}").unwrap();
            }
            writeln!(s, "    }}").unwrap();
        }
    };
    fetch_b(&mut fetch, 0);

    let mut advance = match live {
        Some(_) => format!("        k_next = {};\n", taps::next_live(v, "k0 + BK", "k_end", false)),
        None => String::from("        k_next = k0 + BK;\n"),
    };
    if v.layout == 0 {
        implicit::write_reduction_advance(&mut advance, a_slots, v.bk, shape, "        ");
    }

    let mut stage = stage_step(v, a_slots, b_slots, b_total < t);
    // Layout 4's further taps of a step: the same B slots in registers of their own.
    for tap in 1..taps {
        fetch_b(&mut fetch, tap);
        for i in 0..b_slots {
            stage.push_str(&stage_b_packed(v, i, b_total < t, tap));
            writeln!(b_setup, "    var {}: vec4<u32>;", b_register(tap, i)).unwrap();
        }
    }
    let steps = match window {
        Some(w) => {
            let x = match (packed, in_place) {
                (true, _) => PatchSource::Elements(shape.layout),
                _ if f16_nchw => PatchSource::Elements(shape.layout),
                (false, true) => PatchSource::Packed("x"),
                (false, false) => PatchSource::Packed("xt"),
            };
            window_steps(v, &w, &stage, &fetch, &x, live.is_some())
        }
        None => steps(&stage, &advance, &fetch, &inner_product(v, None), lean.on, live.is_some()),
    };

    // A window tile's four neighbouring NCHW pixels share an output row only where the rows
    // are whole quads: elsewhere a quad would run into the next row (and off its alignment).
    // Split-K's partial sums lie unmoved (the finishing pass moves them): their quads are
    // the unmoved output's.
    let moved = shape.moves_y();
    let unmoved = ConvShape { pixel_shuffle: None, scatter: None, ..*shape };
    let quads_of = if v.splits > 1 { &unmoved } else { shape };
    let vec_y = stores_quads(quads_of) && !(window.is_some() && shape.layout == Layout::Nchw && shape.ow() % 4 != 0);
    let store = store_step(v, shape, vec_y, window.is_some());
    // y is bound as vec4s where every store to it writes four neighbours: the store step's
    // quads or phase quads, or a finishing pass's in-place quads.
    let y_quads = if v.splits > 1 { vec_y && !moved } else { vec_y || phase_quads(shape).is_some() };
    let finish_store = finish_store(shape, y_quads, moved && v.splits > 1);

    let mut vars = shape_vars(shape, &v.name());
    vars.extend([
        ("M", view.m.to_string()),
        ("M_BLOCKS", m_blocks.to_string()),
        ("N_BLOCKS", n_blocks.to_string()),
        ("BLOCKS", blocks.to_string()),
    ]);
    let padded = Padded::of(shape);
    let (prologue_vars, prologue_blocks, w_blocks) = prologue_vars(shape, &padded, vec_w, in_place, scaled, v.b_chunk(), packed, w_in_place);
    vars.extend(prologue_vars);
    let kl = if v.channels_last() { padded.krp } else { view.red };
    // Window tiles split their steps over channel blocks (`window_setup`): k_end stays KL.
    let ks = if window.is_some() { kl } else { implicit::split_share(kl, v.splits, v.bk) };
    let x_copy = if in_place { 0 } else { padded.x_len(shape) };
    // The partials' first element of binding 5: after the x copy (f32 values, or float32
    // data's packed float16 copy, 8 values per element).
    let part0 = if packed { x_copy / 8 } else { x_copy / 4 };
    let xt_scalar = if in_place { "f32" } else if packed { "u32" } else { ct };
    let xt_elem = format!("vec4<{xt_scalar}>");
    let as_bits = packed && !in_place;
    vars.extend([
        ("BM", v.bm.to_string()),
        ("BN", v.bn.to_string()),
        ("BK", v.bk.to_string()),
        ("LDA", lda.to_string()),
        ("LDB", ldb.to_string()),
        ("TM", tm.to_string()),
        ("TN", tn.to_string()),
        ("SGN", v.sgn.to_string()),
        ("WM", (tm * 16).to_string()),
        ("WN", (tn * 16).to_string()),
        ("SUBGROUPS", (v.sgm * v.sgn).to_string()),
        ("SPLIT", v.split.to_string()),
        ("LAYOUT", v.layout.to_string()),
        ("CP", padded.cp.to_string()),
        ("CHP", padded.chp.to_string()),
        ("KL", kl.to_string()),
        ("THREADS", t.to_string()),
        ("CT", ct.to_string()),
        // Binding 5 holds the x copy, then (split-K) the f32 partials; x read in place
        // leaves it to the partials alone.
        ("XT_SCALAR", xt_scalar.to_string()),
        ("PART4", if as_bits { "bitcast<vec4<u32>>".to_string() } else { xt_elem.clone() }),
        ("PART1", if as_bits { "bitcast<u32>" } else { xt_scalar }.to_string()),
        ("UNPART4", if as_bits { "bitcast<vec4<f32>>" } else { "vec4<f32>" }.to_string()),
        ("XT_ELEM", xt_elem),
        ("SPLITS", v.splits.to_string()),
        ("KS", ks.to_string()),
        ("YLEN", shape.y_len().to_string()),
        ("YLEN4", (shape.y_len().div_ceil(4) * 4).to_string()),
        ("PART0", part0.to_string()),
        ("FINISH_STORE", finish_store),
        ("Y_ELEM", if y_quads { format!("vec4<{dt}>") } else { dt.to_string() }),
        ("WT_ELEM", if v.layout >= 2 { "vec4<u32>".to_string() } else { format!("vec4<{ct}>") }),
        ("W_ELEM", if vec_w { format!("vec4<{dt}>") } else { dt.to_string() }),
        ("RESUM", phases::resum_wgsl(shape, "x_at(xi)", &phases::element("w", vec_w))),
        ("PAD_INDEX", crate::kernels::padding::PadIndex(shape.padding_mode).wgsl()),
        // float16 NCHW x read by window tiles one element at a time is bound as scalars (a
        // 16-byte load per 2-byte element cost 1.2x on 8,64,56,56 on an H200).
        ("X_ELEM", if v.layout >= 2 && !packed && !f16_nchw { "vec4<u32>".to_string() } else if x_vec4 || quads { format!("vec4<{dt}>") } else { dt.to_string() }),
        ("X_AT", if v.layout >= 2 && !packed && !f16_nchw {
            "    return unpack2x16float(x[i / 8][(i % 8) / 2])[i % 2];"
        } else if x_vec4 || quads {
            "    return f32(x[i / 4][i % 4]);"
        } else {
            "    return f32(x[i]);"
        }.to_string()),
        ("EX", if scaled { "scale_exp(atomicLoad(&scales[0]))" } else { "0" }.to_string()),
        ("EW", if scaled { "scale_exp(atomicLoad(&scales[1]))" } else { "0" }.to_string()),
        ("SMEM", smem),
        ("SCRATCH", (v.sgm * v.sgn * 256 * v.parts()).to_string()),
        ("A_SETUP", a_setup),
        ("B_SETUP", b_setup),
        ("ACC_DECL", acc),
        // A workgroup whose phase reaches no tap (a kernel shorter than the stride) has no
        // first step to gather: its gathers would read past w's row and x's window.
        ("FETCH", if live.is_some() && window.is_none() { format!("    if (k_next < k_end) {{\n{fetch}    }}\n") } else { fetch }),
        ("STEPS", steps),
        ("STORE", store),
    ]);
    // What a split cannot do without (where it would merely be slow, `suits` says so).
    if v.splits > 1 && !split_possible(v, shape) {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: split-K needs outputs stored four at a time and f32 room for its partials",
            v.name()
        )));
    }
    let mut kernel = Kernel::plain(render(Coop::TEMPLATE, &vars)?, blocks * v.splits as u64);
    kernel.scaled = scaled;
    kernel.prescale = packed;
    if v.channels_last() {
        kernel.prologue = Some(prologue_blocks).filter(|&b| b > 0);
        // The copies' element size: float16 for float16 data and for the packed copies.
        let bytes = if packed { 2 } else { shape.dtype.size() };
        let partials = if v.splits > 1 { v.splits as u64 * shape.y_len().div_ceil(4) * 16 } else { 0 };
        let w_copy = if w_in_place { 0 } else { padded.w_len(shape) * bytes };
        kernel.workspace = [x_copy * bytes + partials, w_copy];
        kernel.w_blocks = w_blocks;
    }
    if v.splits > 1 {
        kernel.finish = Some(shape.y_len().div_ceil(4).div_ceil(256));
    }
    Ok(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 rounding the kernel does, emulated on the CPU: scale by 2^(14 - e), split
    /// into hi and a 2^11-scaled lo, multiply as the tensor cores do (exact products,
    /// f32 sums), unscale.
    fn f16(v: f32) -> f32 {
        half_round(v)
    }

    /// Round to the nearest f16 value (ties to even), as a float32, with f16's subnormals.
    fn half_round(v: f32) -> f32 {
        if !v.is_finite() || v == 0.0 {
            return v;
        }
        let e = v.abs().log2().floor().max(-14.0);
        let ulp = (e - 10.0).exp2();
        let q = v / ulp;
        let r = q.round_ties_even();
        let out = r * ulp;
        if out.abs() > 65504.0 { f32::INFINITY.copysign(v) } else { out }
    }

    fn scale_exp(max: f32) -> i32 {
        let e = if max > 0.0 { max.log2().floor() as i32 + 1 } else { 0 };
        (14 - e).clamp(-126, 126)
    }

    fn dot(x: &[f32], w: &[f32], split: bool) -> f64 {
        let mx = x.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
        let mw = w.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
        let (ex, ew) = (scale_exp(mx), scale_exp(mw));
        let (sx, sw) = (2f32.powi(ex), 2f32.powi(ew));
        let (mut acc, mut cor) = (0f32, 0f32);
        for (&a, &b) in x.iter().zip(w) {
            let (a, b) = (a * sx, b * sw);
            // The split keeps hi as v's top 11 significant bits, as the kernel masks them.
            let hi = |v: f32| if split { f16(f32::from_bits(v.to_bits() & 0xFFFF_E000)) } else { f16(v) };
            let (ah, bh) = (hi(a), hi(b));
            acc += ah * bh;
            if split {
                let (al, bl) = (f16((a - ah) * 2048.0), f16((b - bh) * 2048.0));
                cor += ah * bl + al * bh;
            }
        }
        ((acc + cor / 2048.0) as f64) * 2f64.powi(-ex) * 2f64.powi(-ew)
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The split scheme reaches float32-class error, the single pass TF32-class, on inputs
    /// of any overall scale.
    #[test]
    fn emulated_split_meets_the_precision_bounds_at_any_scale() {
        let mut seed = 7;
        for &(xs, ws) in &[(1.0f32, 1.0f32), (1e-30, 1e30), (1e20, 1e-25), (3e-38, 1.0), (1e15, 1e15)] {
            for len in [9usize, 64, 576, 2304] {
                let x: Vec<f32> = (0..len).map(|_| lcg(&mut seed) * xs).collect();
                let w: Vec<f32> = (0..len).map(|_| lcg(&mut seed) * ws).collect();
                let exact: f64 = x.iter().zip(&w).map(|(&a, &b)| a as f64 * b as f64).sum();
                // Relative to the sum of magnitudes: the scale the tuner's bound is about.
                let mag: f64 = x.iter().zip(&w).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let e3 = (dot(&x, &w, true) - exact).abs() / mag;
                let e1 = (dot(&x, &w, false) - exact).abs() / mag;
                assert!(e3 < Precision::Highest.tolerance(), "split, scale {xs}x{ws}, len {len}: {e3:e}");
                assert!(e1 < Precision::High.tolerance(), "single, scale {xs}x{ws}, len {len}: {e1:e}");
                assert!(e1 > e3 || e1 == 0.0);
            }
        }
    }

    /// On a long grid the model ranks tiles by how many workgroups stay resident: EDSR's
    /// 128x64 tile with a 16-term step ahead of the same tile with a 64-term step (H100:
    /// 0.77 against 1.93 ms on float16 data); on a short grid the longer step stays ahead.
    #[test]
    fn long_grids_rank_small_staging_first() {
        use crate::params::Padding;
        let tile = |bk| Coop { bm: 128, bn: 64, bk, sgm: 2, sgn: 2, split: 1, layout: 1, splits: 1 };
        let mut edsr = ConvShape::new([1, 64, 720, 1280], [64, 64, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        edsr.layout = Layout::Nhwc;
        assert!(tile(16).cost(&edsr) < tile(32).cost(&edsr));
        assert!(tile(32).cost(&edsr) < tile(64).cost(&edsr));
        let deep = ConvShape::new([32, 512, 7, 7], [512, 512, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        assert!(tile(64).cost(&deep) < tile(16).cost(&deep));
    }

    #[test]
    fn half_rounding_matches_f16_steps() {
        assert_eq!(half_round(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(half_round(1.0 + 3.0 / 4096.0), 1.0 + 1.0 / 1024.0);
        assert_eq!(half_round(65504.0), 65504.0);
        assert_eq!(half_round(1e6), f32::INFINITY);
        assert_eq!(half_round(2f32.powi(-24)), 2f32.powi(-24));
    }
}

#[cfg(test)]
mod lean_tests {
    use super::*;
    use crate::params::Padding;

    fn nhwc(x: [usize; 4], w: [usize; 4], pad: Padding, dtype: DType) -> ConvShape {
        ConvShape::new(x, w, (1, 1), pad, (1, 1), 1, None).unwrap().with_layout(Layout::Nhwc).with_dtype(dtype)
    }

    /// Without a kernel window, gathers on whole tiles carry no test (and pass naga); partial
    /// tiles keep theirs; a padded window keeps every test.
    #[test]
    fn lean_gathers_test_only_the_edges_a_shape_cuts() {
        let v = |layout| Coop { bm: 128, bn: 64, bk: 32, sgm: 2, sgn: 2, split: 1, layout, splits: 1 };
        let whole = nhwc([1, 64, 16, 16], [128, 64, 1, 1], Padding::Valid, DType::F16);
        let ragged = nhwc([1, 64, 15, 15], [72, 64, 1, 1], Padding::Valid, DType::F16);
        let padded = nhwc([1, 64, 16, 16], [128, 64, 3, 3], Padding::Explicit(1, 1), DType::F16);
        let f32_whole = nhwc([1, 64, 16, 16], [128, 64, 1, 1], Padding::Valid, DType::F32);
        for (shape, layout) in [(&whole, 2), (&ragged, 2), (&padded, 2), (&f32_whole, 1)] {
            let src = v(layout).generate(shape).unwrap().source;
            crate::codegen::validate(&src).unwrap_or_else(|e| panic!("{e}"));
            let lean = src.contains("if (k_next < k_end)");
            assert_eq!(lean, shape.pad == (0, 0));
            let tested = src.contains("select(0u, u32(abase0 + koff)");
            assert_eq!(tested, shape == &ragged, "A test on {shape:?}");
        }
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;
    use crate::params::Padding;

    fn f16_nhwc(x: [usize; 4], w: [usize; 4], pad: i64) -> ConvShape {
        ConvShape::new(x, w, (1, 1), Padding::Explicit(pad, pad), (1, 1), 1, Some(w[0]))
            .unwrap()
            .with_layout(Layout::Nhwc)
            .with_dtype(DType::F16)
    }

    /// Layout 4 stages a kernel row's weights per step: S taps' B tiles in workgroup memory
    /// (within 48 KiB for both its tiles), R steps per channel block on a 3x3 kernel, each
    /// tap's weights CP terms on in w's copy; a 3x2 kernel takes two taps a step.
    #[test]
    fn layout_4_stages_a_kernel_row_per_step() {
        for &(bm, bn, sgm, sgn) in &WINDOW_ROW_TILES {
            let v = Coop { bm, bn, bk: 16, sgm, sgn, split: 1, layout: 4, splits: 1 };
            assert!(v.well_formed() && v.workgroup_bytes() <= 49152, "{}: {}", v.name(), v.workgroup_bytes());
            assert!(!Coop { layout: 3, ..v }.well_formed(), "{}: layout 3 keeps it", v.name());
            let k = v.generate(&f16_nhwc([1, 64, 40, 70], [64, 64, 3, 3], 1)).unwrap();
            assert!(k.source.contains(&format!("var<workgroup> b_hi: array<vec4<f16>, {}>;", 3 * bn * v.ldb() / 4)));
            assert!(k.source.contains("const TAPS: i32 = 3;") && k.source.contains("k_next + 2 * CP + bk0"));
            let k = v.generate(&f16_nhwc([1, 64, 40, 70], [64, 64, 3, 2], 0)).unwrap();
            assert!(k.source.contains("const TAPS: i32 = 2;") && !k.source.contains("k_next + 2 * CP"));
        }
    }

    /// Tiles follow the image: EDSR's 1280-wide rows take 64-wide tiles, 56-wide ones the
    /// width that pads least; shapes outside layout 3's reach are refused with a reason.
    #[test]
    fn window_tiles_follow_the_image() {
        let v = Coop { bm: 256, bn: 64, bk: 16, sgm: 4, sgn: 2, split: 1, layout: 3, splits: 1 };
        let edsr = f16_nhwc([1, 64, 720, 1280], [64, 64, 3, 3], 1);
        let w = Window::of(&v, &edsr).unwrap();
        assert_eq!((w.th, w.tw, w.pr, w.pc, w.tiles_h, w.tiles_w), (4, 64, 6, 66, 180, 20));
        assert_eq!(grid(&v, &edsr), (3600, 1, 3600));
        let r56 = f16_nhwc([32, 64, 56, 56], [64, 64, 3, 3], 1);
        let w = Window::of(&v, &r56).unwrap();
        assert_eq!((w.th, w.tw, w.tiles_h * w.th as u64 * w.tiles_w * w.tw as u64), (4, 64, 56 * 64));
        assert!(v.suits(&r56) && v.suits(&edsr));
        let strided = ConvShape::new([1, 64, 32, 32], [64, 64, 3, 3], (2, 2), Padding::Explicit(1, 1), (1, 1), 1, None)
            .unwrap()
            .with_layout(Layout::Nhwc)
            .with_dtype(DType::F16);
        assert!(!v.suits(&strided));
        assert!(v.generate(&strided).is_err());
        let five = f16_nhwc([1, 64, 32, 32], [64, 64, 5, 5], 2);
        assert!(Window::of(&v, &five).is_none());
        // 7x7 images pad a 256-pixel tile far past the waste bound.
        assert!(!v.suits(&f16_nhwc([32, 512, 7, 7], [512, 512, 3, 3], 1)));
    }

    /// Every window tile (layouts 3, 4) passes naga on the shapes it takes: padded and not, ragged
    /// image edges, partial channel tiles, a bias and an epilogue.
    #[test]
    fn window_variants_validate() {
        let shapes = [
            f16_nhwc([2, 64, 19, 23], [40, 64, 3, 3], 1),
            f16_nhwc([1, 32, 16, 64], [64, 32, 1, 1], 0),
            f16_nhwc([2, 64, 9, 70], [72, 64, 3, 2], 0)
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap()),
            f16_nhwc([2, 64, 19, 23], [40, 64, 3, 3], 1).with_padding_mode(crate::params::PaddingMode::Reflect).unwrap(),
        ];
        let mut seen = 0;
        for shape in &shapes {
            for v in Coop::space().into_iter().filter(|v| v.windowed()) {
                let Ok(k) = v.generate(shape) else { continue };
                crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{}: {e}", v.name()));
                // The patch's rows and columns past x's edges read where the mode maps them.
                let mode = !shape.padding_mode.is_zeros();
                assert_eq!(k.source.contains("let ih = pad_row(oh0 - PH + pix / PC);"), mode, "{}", v.name());
                seen += 1;
            }
        }
        assert!(seen > 20, "{seen} window tile kernels generated");
    }

    /// A 3x3 stride-2 decoder's lowered form (9 of 16 products count): every channels-last
    /// tile whose channel block lies in one phase skips the dead taps' products (by the
    /// step's tap for layouts 1 and 2, by the window step's for layouts 3 and 4), and each
    /// kernel passes naga, channels-last and (phase-major there too) NCHW; a 4x4 kernel at
    /// stride 2 has no dead taps, so none skips.
    #[test]
    fn dead_taps_of_a_lowered_decoder_skip_their_products() {
        use crate::kernels::Variant;
        let decoder = |r: usize, layout: Layout| {
            ConvShape::new_transposed([8, 512, 16, 16], [512, 256, r, r], (2, 2), (1, 1), (1, 1), (1, 1), 1, None)
                .unwrap()
                .with_layout(layout)
                .with_dtype(if layout == Layout::Nhwc { DType::F16 } else { DType::F32 })
        };
        let (mut skipping, mut windows) = (0, 0);
        // A 1x1 kernel at stride 2: phases 1 to 3 reach no tap at all, and their workgroups
        // gather nothing (the first gathers wait for a live step).
        let one = ConvShape::new_transposed([8, 512, 16, 16], [512, 256, 1, 1], (2, 2), (0, 0), (1, 1), (1, 1), 1, None)
            .unwrap()
            .with_layout(Layout::Nhwc)
            .with_dtype(DType::F16);
        assert_eq!(crate::kernels::phases::live_taps(&one.lowered().unwrap()), Some(vec![1, 0, 0, 0]));
        for c in Coop::space() {
            let v = Variant::Coop(c);
            if let Ok(k) = v.generate(&one) {
                crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{v} on {}: {e}", one.label()));
                let guarded = k.source.contains("    if (k_next < k_end) {\n");
                assert_eq!(guarded, c.layout == 1 || c.layout == 2, "{v}");
            }
            for (r, dead, layout) in [(3, true, Layout::Nhwc), (4, false, Layout::Nhwc), (3, true, Layout::Nchw)] {
                let shape = decoder(r, layout);
                let Ok(k) = v.generate(&shape) else { continue };
                crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{v} on {}: {e}", shape.label()));
                let skips = k.source.contains("fn next_live(");
                assert_eq!(skips, dead && c.layout > 0, "{v} on {}", shape.label());
                assert_eq!(taps::live_share(&c, &shape.lowered().unwrap(), c.runs_windowed(&shape.lowered().unwrap())), if !skips { 1.0 } else if c.layout == 4 { 0.75 } else { 9.0 / 16.0 }, "{v}");
                if skips {
                    // Taps (layouts 1 to 3): phase 0 reaches all four, phase 3 tap 3 only; kernel
                    // rows (layout 4): phases 2 and 3 reach row 1 only.
                    let masks = if c.layout == 4 { "select(select(select(3u, 3u, phase == 1), 2u, phase == 2), 2u, phase == 3)" } else { "select(select(select(15u, 10u, phase == 1), 12u, phase == 2), 8u, phase == 3)" };
                    assert!(k.source.contains(&format!("let live = {masks};")), "{v}");
                    skipping += 1;
                    windows += c.windowed() as usize;
                }
            }
        }
        assert!(skipping > 40 && windows > 10, "{skipping} skipping, {windows} window tiles");
    }

    /// Every tile stores moved outputs, window tiles too, split-K ones in their finishing
    /// pass: a pixel shuffle (float16 NHWC and float32 NCHW, through its scatter form) and a
    /// lowered transposed convolution; each kernel passes naga, and the tuner offers some
    /// window tiles.
    #[test]
    fn tiles_store_moved_outputs() {
        use crate::kernels::Variant;
        let shuffled = f16_nhwc([1, 64, 24, 40], [256, 64, 3, 3], 1).with_pixel_shuffle(2).unwrap();
        let nchw = ConvShape::new([1, 32, 32, 64], [288, 32, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
            .unwrap()
            .with_pixel_shuffle(3)
            .unwrap();
        let nchw2 = ConvShape::new([1, 32, 32, 64], [128, 32, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
            .unwrap()
            .with_pixel_shuffle(2)
            .unwrap();
        let nchw4 = ConvShape { pixel_shuffle: None, ..nchw2 }.with_pixel_shuffle(4).unwrap();
        for (s, sw) in [(&nchw2, 2), (&nchw4, 4)] {
            assert_eq!(store::phase_quads(&s.shuffle_lowered().unwrap()), Some(sw));
        }
        assert_eq!(store::phase_quads(&nchw.shuffle_lowered().unwrap()), None, "a shuffle by 3 stores one element per lane");
        let decoder = ConvShape::new_transposed([2, 64, 20, 24], [64, 32, 4, 4], (2, 2), (1, 1), (0, 0), (1, 1), 1, None)
            .unwrap()
            .with_layout(Layout::Nhwc)
            .with_dtype(DType::F16);
        for shape in [&shuffled, &nchw, &nchw2, &nchw4, &decoder] {
            let (mut seen, mut windows, mut offered, mut split) = (0, 0, 0, 0);
            for c in Coop::space() {
                let v = Variant::Coop(c);
                let Ok(k) = v.generate(shape) else { continue };
                crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{v} on {}: {e}", shape.label()));
                if c.splits > 1 {
                    assert!(k.finish.is_some() && k.source.contains("let yi = ystore(4 * i"), "{v}");
                    split += 1;
                    continue;
                }
                assert!(k.source.contains("yscatter(") || k.source.contains("ystore("), "{v}");
                if shape.pixel_shuffle.is_some_and(|r| r != 3) && shape.layout == Layout::Nchw {
                    assert!(k.source.contains("y[yi / 4] = vec4<DT>("), "{v}: phase quads");
                }
                seen += 1;
                windows += c.windowed() as usize;
                offered += (c.windowed() && v.suits(shape)) as usize;
            }
            assert!(seen > 50 && windows > 5 && offered > 0 && split > 5, "{}: {seen} generated, {windows} windows, {offered} offered, {split} split", shape.label());
        }
    }
}

#[cfg(test)]
mod packed_tests {
    use super::*;
    use crate::params::Padding;

    /// float32 data on layouts 2 and 3: the prologue writes scaled packed float16 copies of
    /// x (either layout) and w after the max pass (`prescale`), every such kernel passes naga,
    /// and the tuner offers them.
    #[test]
    fn float32_data_runs_layouts_2_and_3_on_packed_copies() {
        let nchw = ConvShape::new([2, 32, 13, 37], [24, 32, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, Some(24)).unwrap();
        let nhwc = nchw.with_layout(Layout::Nhwc);
        let (mut seen, mut offered) = (0, 0);
        for shape in [&nchw, &nhwc] {
            for v in Coop::space().into_iter().filter(|v| v.layout >= 2 && v.splits == 1) {
                let k = match v.generate(shape) {
                    Ok(k) => k,
                    Err(e) => panic!("{}: {e}", v.name()),
                };
                crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{}: {e}", v.name()));
                assert!(k.scaled && k.prescale && k.prologue.is_some(), "{}", v.name());
                // Layout 2 gathers a packed copy of x; window tiles read float32 x in place.
                let x_copy = if v.layout == 2 { 2 * shape.x_len() } else { 0 };
                assert_eq!(k.workspace, [x_copy, 2 * 24 * 32 * 9], "{}", v.name());
                offered += v.suits(shape) as usize;
                seen += 1;
            }
        }
        assert!(seen > 40, "{seen}");
        assert!(offered > 10, "{offered} of {seen} offered");
        // Channels that are not whole runs of 8, and split-K, are refused.
        let c12 = ConvShape::new([2, 12, 9, 9], [8, 12, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        let l2 = Coop { bm: 128, bn: 64, bk: 16, sgm: 2, sgn: 2, split: 1, layout: 2, splits: 1 };
        assert!(l2.generate(&c12).is_err());
        // Split-K keeps its f32 partials after the packed copy of x, as u32 bits.
        let k = Coop { splits: 2, ..l2 }.generate(&nchw).unwrap();
        crate::codegen::validate(&k.source).unwrap();
        assert!(k.source.contains("return bitcast<vec4<u32>>(v);") && (k.source.contains("= part4(vec4<f32>(") || k.source.contains("= part1(")));
        assert!(k.finish.is_some());
        let partials = 2 * nchw.y_len().div_ceil(4) * 16;
        assert_eq!(k.workspace, [2 * nchw.x_len() + partials, 2 * 24 * 32 * 9]);
    }

    /// float16 NCHW x with whole runs of 8 channels: the window tiles read it in place, eight
    /// channels H·W apart per chunk, with no copy of x (the prologue writes w's alone); the
    /// gathering layouts 2 keep refusing it, and the tuner offers the window tiles.
    #[test]
    fn window_tiles_read_float16_nchw_in_place() {
        let shape = ConvShape::new([2, 32, 16, 32], [24, 32, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, Some(24))
            .unwrap()
            .with_dtype(DType::F16);
        let (mut seen, mut offered) = (0, 0);
        for v in Coop::space().into_iter().filter(|v| v.layout >= 2 && v.splits == 1) {
            let Ok(k) = v.generate(&shape) else {
                assert_eq!(v.layout, 2, "{}", v.name());
                continue;
            };
            assert!(v.windowed(), "{}", v.name());
            crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{}: {e}", v.name()));
            assert!(k.source.contains("x_at(e + 7 * H * W)") && !k.scaled, "{}", v.name());
            assert_eq!(k.workspace[0], 0, "{}: no copy of x", v.name());
            assert_eq!(k.prologue, Some(k.w_blocks), "{}: the prologue writes w alone", v.name());
            offered += v.suits(&shape) as usize;
            seen += 1;
        }
        assert!(seen > 10 && offered > 0, "{seen} generated, {offered} offered");
        // Channels that are not whole runs of 8 take no window tile.
        let c12 = ConvShape::new([2, 12, 9, 9], [8, 12, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap().with_dtype(DType::F16);
        assert!(Coop { bm: 128, bn: 64, bk: 16, sgm: 2, sgn: 2, split: 1, layout: 3, splits: 1 }.generate(&c12).is_err());
    }

    /// Only a prologue that finds the maxima itself (layout 1 on float32 data) folds them into
    /// the run's scale words, and not where the runner wrote them before the run (word 2);
    /// the packing copies (maxima known before them) and float16 data's prologues never
    /// touch those words: their workgroups' same-address atomics were most of the packing
    /// copies' time on an H200.
    #[test]
    fn only_prologues_that_find_the_maxima_fold_them() {
        let nchw = ConvShape::new([2, 32, 13, 37], [24, 32, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, Some(24)).unwrap();
        let f16 = nchw.with_layout(Layout::Nhwc).with_dtype(DType::F16);
        let fold = "atomicMax(&scales[";
        let mut checked = 0;
        for shape in [&nchw, &nchw.with_layout(Layout::Nhwc), &f16] {
            for v in Coop::space().into_iter().filter(|v| v.layout >= 1 && v.splits == 1) {
                let Ok(k) = v.generate(shape) else { continue };
                let finds = v.layout == 1 && shape.dtype == DType::F32;
                assert_eq!(k.source.contains(fold), finds, "{} on {}", v.name(), shape.label());
                if finds {
                    assert!(k.source.contains("if (lidx == 0u && atomicLoad(&scales[2]) == 0u) {"), "{}", v.name());
                }
                checked += 1;
            }
        }
        assert!(checked > 100, "{checked}");
    }

    /// Layouts 2 to 4 gather a 1x1 kernel's w in place: no weight pass (float16 NHWC x read in
    /// place then needs no prologue at all), no copy of w, and every such kernel passes naga;
    /// wider kernels keep the packed copy.
    #[test]
    fn one_by_one_kernels_gather_w_in_place() {
        let f16 = ConvShape::new([2, 32, 9, 12], [24, 32, 1, 1], (1, 1), Padding::Valid, (1, 1), 1, None)
            .unwrap()
            .with_layout(Layout::Nhwc)
            .with_dtype(DType::F16);
        let f32 = ConvShape::new([2, 32, 9, 12], [24, 32, 1, 1], (1, 1), Padding::Valid, (1, 1), 1, None).unwrap();
        let mut seen = 0;
        for (shape, prologue) in [(&f16, false), (&f32, true)] {
            for v in Coop::space().into_iter().filter(|v| v.layout >= 2) {
                let Ok(k) = v.generate(shape) else { continue };
                crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{}: {e}", v.name()));
                assert!(k.source.contains("w_chunk(bbase0 + kr, sw)") || k.source.contains("w_chunk(select(0, bbase0 + kr, ok), sw)"), "{}", v.name());
                assert_eq!(k.workspace[1], 0, "{}", v.name());
                // Layout 2 still gets float32 x's packed copy from the prologue; window tiles
                // read it in place.
                assert_eq!(k.prologue.is_some(), prologue && v.layout == 2, "{}", v.name());
                seen += 1;
            }
        }
        assert!(seen > 30, "{seen}");
        let three = ConvShape::new([2, 32, 9, 12], [24, 32, 3, 3], (1, 1), Padding::Valid, (1, 1), 1, None)
            .unwrap()
            .with_layout(Layout::Nhwc)
            .with_dtype(DType::F16);
        let l2 = Coop { bm: 128, bn: 64, bk: 16, sgm: 2, sgn: 2, split: 1, layout: 2, splits: 1 };
        let k = l2.generate(&three).unwrap();
        assert!(!k.source.contains("w_chunk(") && k.prologue.is_some() && k.workspace[1] > 0);
    }

    /// A window tile stores NCHW y four pixels at a time only where output rows are whole
    /// quads: 12 x 10 outputs (120 per image, whole quads) would otherwise write a row's last
    /// two pixels over the next row's first two.
    #[test]
    fn window_tiles_store_nchw_quads_only_on_whole_rows() {
        let l3 = Coop { bm: 128, bn: 64, bk: 16, sgm: 2, sgn: 2, split: 1, layout: 3, splits: 1 };
        for (w, quads) in [(10, false), (12, true)] {
            let shape = ConvShape::new([2, 16, 12, w], [24, 16, 1, 1], (1, 1), Padding::Valid, (1, 1), 1, Some(24)).unwrap();
            let k = l3.generate(&shape).unwrap();
            assert_eq!(k.source.contains("y[yi / 4] = vec4"), quads, "width {w}");
        }
    }
}
