//! The cooperative-matrix family: implicit GEMM like `gemm`, with the products on 16x16x16
//! f16 tensor-core tiles and f32 accumulators. x and w are scaled by powers of two and
//! converted to f16 while staging; `split = 3` adds the lo parts of a hi/lo split for
//! float32-class accuracy; `splits > 1` splits the reduction of short grids (split-K).
//! Runs only where the adapter has 16x16x16 f16->f32 cooperative matrices on 32-wide
//! subgroups.

use super::cost::{multiprocessor_fill, parallel_efficiency, residency, GATHER_LOAD, LONG_GRID};
use super::implicit::{self, View, PARTIAL, SPLIT_WORKSPACE};
use super::{Family, KernelVariant};
use crate::codegen::{render, shape_vars, Kernel};
use crate::error::{Error, Result};
use crate::dtype::DType;
use crate::params::{ConvShape, Layout};
use crate::precision::Precision;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Coop {
    /// Workgroup tile: `bm` output pixels x `bn` output channels, reduction step `bk`.
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    /// Subgroups along the pixel and channel sides of the tile.
    pub sgm: u32,
    pub sgn: u32,
    /// 1: one f16 product per term; 3: hi*hi + hi*lo + lo*hi.
    pub split: u32,
    /// 0: gather x in place (N, C, H, W); 1: gather from a channels-last copy a prologue
    /// makes (16-byte loads, each group's channels zero-padded to a multiple of 4; workspace
    /// of x's size); 2: layout 1 for float16 NHWC x with C/groups a multiple of 8, read in
    /// place, x and w's copy gathered 8 values (16 bytes) at a time. 3: layout 2 with the
    /// input window staged: each workgroup's output tile is a TH x TW block of one image's
    /// pixels, whose input patch (TH + R - 1) x (TW + S - 1) x BK is staged once per channel
    /// block and read by every (r, s) of the kernel in place (3x3 and smaller, stride 1).
    pub layout: u32,
    /// Split-K: workgroups sharing one output tile's reduction, each writing its partial
    /// tile; a finishing pass adds them in a fixed order (results do not change from run
    /// to run). 1: no split.
    pub splits: u32,
}

/// (bm, bn, sgm, sgn): accumulator grids of 2x2 to 4x4 per subgroup, 4 or 8 subgroups.
/// (4x4 grids on 64-channel tiles with 2 or 4 subgroups, 128x64 and 256x64, ran 6-60%
/// slower than 128x64 with 4 subgroups on every H100 shape tried.) The tall tiles of 64
/// channels (2x4 and 4x2 grids) are for narrow layers: EDSR's 64 output channels.
const TILES: [(u32, u32, u32, u32); 11] = [
    (128, 64, 4, 1),
    (256, 64, 4, 2),
    (256, 64, 8, 1),
    (64, 64, 2, 2),
    (128, 64, 2, 2),
    (64, 128, 2, 2),
    (128, 128, 2, 2),
    (128, 128, 2, 4),
    (128, 128, 4, 2),
    (256, 128, 4, 2),
    (128, 256, 2, 4),
];
const BK: [u32; 3] = [16, 32, 64];
const SPLIT: [u32; 2] = [1, 3];
const LAYOUT: [u32; 4] = [0, 1, 2, 3];
/// Widths a window tile may take (multiples of 16: a 16-pixel matrix row block stays in one
/// row of the tile), and the largest kernel window layout 3 stages.
const WINDOW_WIDTHS: [u32; 3] = [64, 32, 16];
const WINDOW_MAX_RS: u32 = 3;
/// The most output pixels a window tiling may compute per pixel it stores.
const WINDOW_WASTE: f64 = 1.35;
const SPLITS: [u32; 3] = [1, 2, 4];
/// The tiles split-K is offered for: those that win on deep layers with few output pixels,
/// whose grids leave multiprocessors idle (32,512,7,7 -> 512: 52 tiles of 128x128).
const SPLIT_TILES: [(u32, u32, u32, u32); 2] = [(128, 64, 2, 2), (128, 128, 2, 4)];
/// f16 elements of padding per staged row: 16 bytes, so 16x16 loads spread over banks.
const PAD: u32 = 8;
/// Subgroup width the kernel's tile partition assumes.
pub const SUBGROUP: u32 = 32;

/// A tensor-core multiply-add relative to a scalar FMA, per multiply-add it performs.
const MMA: f64 = 0.08;
/// The scale pass and the f16 conversion while staging, per staged element.
const CONVERT: f64 = 2.0;
/// Layout 1's prologue, per element of x and w it copies.
const PROLOGUE: f64 = 6.0;
/// A workgroup barrier, per multiply-add of the step it closes: a quarter of the FMA
/// families' figure. On the H100, 16-term steps beat 32- and 64-term ones on every long
/// grid measured (EDSR, 32,64,56,56, the 1x1 layers: 7-45%), and lost only where the grid
/// is short (32,256,14,14, where residency does not matter).
const COOP_BARRIER: f64 = 5.0;

impl Coop {
    fn threads(&self) -> u32 {
        SUBGROUP * self.sgm * self.sgn
    }
    fn tm(&self) -> u32 {
        self.bm / (self.sgm * 16)
    }
    fn tn(&self) -> u32 {
        self.bn / (self.sgn * 16)
    }
    /// Layouts 1 and 2 walk the reduction channels fastest (a pixel's row of terms).
    fn channels_last(&self) -> bool {
        self.layout >= 1
    }
    /// Terms of x one A gather loads: 8 (16 bytes of float16) for layout 2, else 4.
    fn a_chunk(&self) -> u32 {
        if self.layout >= 2 { 8 } else { 4 }
    }
    /// Terms of w's copy one B gather loads: 8 packed float16 for layout 2, else 4.
    fn b_chunk(&self) -> u32 {
        self.a_chunk()
    }
    /// Staged A row length: a k row of the tile (layout 0) or a pixel's row (layouts 1, 2).
    fn lda(&self) -> u32 {
        if self.channels_last() { self.bk + PAD } else { self.bm + PAD }
    }
    /// Layout 3: the staged patch's pixels for the largest window, over the tile widths it
    /// may take (the patch array has this fixed size).
    fn patch_capacity(&self) -> u32 {
        WINDOW_WIDTHS
            .iter()
            .filter(|&&tw| tw <= self.bm)
            .map(|&tw| (self.bm / tw + WINDOW_MAX_RS - 1) * (tw + WINDOW_MAX_RS - 1))
            .max()
            .unwrap_or(0)
    }
    /// Staged A rows: k (layout 0) or pixels (layouts 1, 2).
    fn a_rows(&self) -> u32 {
        if self.layout == 3 {
            self.patch_capacity()
        } else if self.channels_last() {
            self.bm
        } else {
            self.bk
        }
    }
    fn ldb(&self) -> u32 {
        self.bk + PAD
    }
    /// Staged copies of each tile: hi, and lo when split.
    fn parts(&self) -> u32 {
        if self.split == 3 { 2 } else { 1 }
    }
}

impl Coop {
    /// A split only where the grid leaves at least half the multiprocessors idle, each part
    /// keeps at least two steps, the partials stay small, and binding 5 can hold them as f32
    /// (x read in place, or the f32 copy of float32 data before them).
    fn splits_suit(&self, shape: &ConvShape) -> bool {
        if self.splits == 1 {
            return true;
        }
        let view = View::of(shape);
        let kl = Padded::of(shape).krp;
        // Half the multiprocessors idle at least: on the H100 split-K won at 52 tiles
        // (32,512,7,7, 0.146 -> 0.091 ms) and lost at 98 (32,256,14,14, 0.079 -> 0.087).
        view.grid(self.bm, self.bn).2 * 2 <= LONG_GRID
            && kl >= 2 * (self.splits * self.bk) as u64
            && implicit::partial_bytes(shape, self.splits) <= SPLIT_WORKSPACE
            && split_possible(self, shape)
    }
}

/// A split's partials are f32 in binding 5, after the x copy (f32 for float32 data) or
/// alone (x read in place), and within the split-K workspace's hard limit.
fn split_possible(v: &Coop, shape: &ConvShape) -> bool {
    (shape.dtype == DType::F32 || reads_x_in_place(shape))
        && implicit::partial_bytes(shape, v.splits) <= 4 * SPLIT_WORKSPACE
}

impl Family for Coop {
    const NAME: &'static str = "coop";
    const TEMPLATE: &'static str = include_str!("../../shaders/coop.wgsl");

    fn space() -> Vec<Self> {
        let mut out = Vec::new();
        for &layout in &LAYOUT {
            for &split in &SPLIT {
                for &(bm, bn, sgm, sgn) in &TILES {
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
        TILES.contains(&(self.bm, self.bn, self.sgm, self.sgn))
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
            // The window tile: unsplit, 16- or 32-term steps (the patch must fit).
            && (self.layout != 3 || (self.splits == 1 && self.bk <= 32))
            // Whole B slots, or (layout 2's 8-term chunks on a narrow tile) fewer chunks
            // than invocations, which the first ones gather.
            && ((self.bn * self.bk / self.b_chunk()) % t == 0 || (self.layout >= 2 && self.bn * self.bk / 8 < t))
            // The large-k-step variants only where the tile stays small enough to pay off.
            && (self.bk <= 32 || self.bm * self.bn <= 128 * 128)
            // Split-K on channels-last tiles that win deep layers, with 16- and 64-term steps.
            && SPLITS.contains(&self.splits)
            && (self.splits == 1
                || (self.channels_last() && self.bk != 32 && SPLIT_TILES.contains(&(self.bm, self.bn, self.sgm, self.sgn))))
    }

    fn invocations(&self) -> u32 {
        self.threads()
    }

    fn workgroup_bytes(&self) -> u32 {
        let staged = (self.a_rows() * self.lda() + self.bn * self.ldb()) * 2 * self.parts();
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
    /// through `ystore` in the store step; the split-K finishing pass has no such store.
    fn computes(&self, shape: &ConvShape) -> bool {
        self.splits == 1 || !moves_y(shape)
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        if !self.computes(shape) {
            return false;
        }
        // Layout 1 takes NHWC x (in place where its pixel rows are whole vec4s, else through
        // a padded copy); layout 0 gathers along NCHW's rows.
        let layout_ok = (shape.layout == Layout::Nchw || self.channels_last())
            && (self.layout < 2 || wide_x(shape));
        // float16 data has no lo part: the split would triple the work for nothing.
        let split_ok = self.split == 1 || shape.dtype == DType::F32;
        // The window tile where its padding at image edges stays small.
        // The window tile where its padding at image edges stays small, on kernels wider than
        // 1x1 (a 1x1 kernel reads each term once: nothing to share).
        let window_ok = self.layout != 3
            || Window::of(self, shape).is_some_and(|w| w.waste(shape) <= WINDOW_WASTE && shape.r * shape.s > 1);
        layout_ok && split_ok && window_ok && self.splits_suit(shape) && View::of(shape).tiles_suit((self.bm, self.bn, self.bk), (64, 64, 32))
    }

    fn cost(&self, shape: &ConvShape) -> f64 {
        let view = View::of(shape);
        let (_, _, tiles) = grid(self, shape);
        // Layout 3 stages each x term of its patch once for all R*S taps (plus the halo), and
        // computes the pixels its tiles pad the image with.
        let (a_share, waste) = match (self.layout, Window::of(self, shape)) {
            (3, Some(w)) => ((w.pr * w.pc) as f64 / ((w.th * w.tw) as f64 * (shape.r * shape.s) as f64), w.waste(shape)),
            _ => (1.0, 1.0),
        };
        // Layout 1 gathers four terms per load and index computation, after a prologue
        // that reads x and w once and writes them once.
        let (gather, prologue, padded) = if self.channels_last() {
            let p = Padded::of(shape);
            let x_copied = if reads_x_in_place(shape) { 0 } else { p.x_len(shape) };
            let copied = (x_copied + p.w_len(shape)) as f64;
            (GATHER_LOAD / self.a_chunk() as f64, PROLOGUE * copied, p.krp as f64 / view.red as f64)
        } else if pixel_quads(shape) {
            (GATHER_LOAD / 4.0, 0.0, 1.0)
        } else {
            (GATHER_LOAD, 0.0, 1.0)
        };
        let per_fma = MMA * self.split as f64
            + (gather + CONVERT * self.parts() as f64) * (1.0 / self.bm as f64 + a_share / self.bn as f64)
            + COOP_BARRIER * 2.0 / (self.bk as f64 * 16.0);
        // A split is credited with the multiprocessors it fills beyond its unsplit tile's
        // grid (the unsplit ranking is fitted without a fill term) and pays for its partials.
        let (fill, partials) = if self.splits > 1 {
            let gain = multiprocessor_fill(tiles * self.splits as u64) / multiprocessor_fill(tiles);
            (gain, PARTIAL * (self.splits as u64 * shape.y_len()) as f64)
        } else {
            (1.0, 0.0)
        };
        view.padded_fmas(self.bm, self.bn, self.bk * self.splits) * padded * waste * per_fma
            / parallel_efficiency(tiles * self.invocations() as u64)
            / residency(self.workgroup_bytes(), self.threads(), tiles)
            / fill
            + prologue
            + partials
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape)
    }
}

/// Layout 3's tiling: each workgroup's output tile is `th` x `tw` pixels of one image, and
/// reads a `pr` x `pc` patch of x (zeros outside the image).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Window {
    th: u32,
    tw: u32,
    pr: u32,
    pc: u32,
    tiles_h: u64,
    tiles_w: u64,
}

impl Window {
    /// The tiling for the width in `WINDOW_WIDTHS` that pads the output least (the wider on
    /// a tie), where layout 3 takes the shape: float16 NHWC read in place, one group whose
    /// channels are whole steps, stride and dilation 1, a window of at most 3 x 3, y stored
    /// in place.
    fn of(v: &Coop, shape: &ConvShape) -> Option<Window> {
        let takes = wide_x(shape)
            && shape.groups == 1
            && shape.cg() % v.bk == 0
            && shape.stride == (1, 1)
            && shape.dilation == (1, 1)
            && shape.r <= WINDOW_MAX_RS
            && shape.s <= WINDOW_MAX_RS
            && !moves_y(shape);
        if !takes {
            return None;
        }
        let (oh, ow) = (shape.oh() as u64, shape.ow() as u64);
        WINDOW_WIDTHS
            .iter()
            .filter(|&&tw| tw <= v.bm)
            .map(|&tw| {
                let th = v.bm / tw;
                let (tiles_h, tiles_w) = (oh.div_ceil(th as u64), ow.div_ceil(tw as u64));
                Window { th, tw, pr: th + shape.r - 1, pc: tw + shape.s - 1, tiles_h, tiles_w }
            })
            .min_by_key(|w| (w.tiles_h * w.tiles_w, std::cmp::Reverse(w.tw)))
    }

    /// Workgroups along the pixels: every image's tiles.
    fn tiles(&self, shape: &ConvShape) -> u64 {
        shape.n as u64 * self.tiles_h * self.tiles_w
    }

    /// Output pixels computed per pixel stored (tile padding at the image's edges).
    fn waste(&self, shape: &ConvShape) -> f64 {
        (self.tiles_h * self.th as u64 * self.tiles_w * self.tw as u64) as f64 / (shape.oh() as u64 * shape.ow() as u64) as f64
    }
}

/// Workgroups along the pixels and channels, and in all: layout 3 tiles each image.
fn grid(v: &Coop, shape: &ConvShape) -> (u64, u64, u64) {
    let view = View::of(shape);
    let (mb, nb, blocks) = view.grid(v.bm, v.bn);
    match (v.layout, Window::of(v, shape)) {
        (3, Some(w)) => (w.tiles(shape), nb, w.tiles(shape) * nb * view.groups),
        _ => (mb, nb, blocks),
    }
}

/// Layout 1's channel padding: each group's channels rounded up to a multiple of 4, so a
/// pixel's terms are whole vec4s for any C (no slow path for an unlucky count).
struct Padded {
    /// Channels per group, padded.
    cp: u64,
    /// A pixel's row in the copy of x: groups * cp.
    chp: u64,
    /// A weight row in the copy of w: cp * R * S.
    krp: u64,
}

impl Padded {
    fn of(shape: &ConvShape) -> Self {
        let cp = (shape.cg() as u64).div_ceil(4) * 4;
        Padded { cp, chp: cp * shape.groups as u64, krp: cp * shape.r as u64 * shape.s as u64 }
    }
    fn x_len(&self, shape: &ConvShape) -> u64 {
        shape.n as u64 * shape.h as u64 * shape.w as u64 * self.chp
    }
    fn w_len(&self, shape: &ConvShape) -> u64 {
        shape.k as u64 * self.krp
    }
}

/// NCHW x whose output pixels are its own pixels (1x1, stride 1, unpadded), whole quads of
/// them in every image: layout 0 gathers four neighbouring pixels with one 16-byte load.
fn pixel_quads(shape: &ConvShape) -> bool {
    shape.layout == Layout::Nchw
        && (shape.r, shape.s, shape.stride) == (1, 1, (1, 1))
        && shape.pad == (0, 0)
        && shape.pad_end == (0, 0)
        && (shape.h * shape.w) % 4 == 0
}

/// Whether the store step writes y four neighbours at a time: whole quads of pixels in
/// every image (NCHW) or of channels in every group (NHWC), 16-byte aligned either way. A
/// pixel shuffle moves neighbours apart; a lowered transposed convolution keeps an NHWC
/// quad together where each phase's channels are whole quads.
fn stores_quads(shape: &ConvShape) -> bool {
    if shape.pixel_shuffle.is_some() {
        return false;
    }
    if let Some(sc) = shape.scatter {
        return shape.layout == Layout::Nhwc && sc.kg % 4 == 0;
    }
    if shape.layout == Layout::Nchw { shape.oh() * shape.ow() % 4 == 0 } else { shape.kg() % 4 == 0 }
}

/// Whether y's elements move on the way out (`ystore`): a pixel shuffle or a lowered
/// transposed convolution's scatter.
fn moves_y(shape: &ConvShape) -> bool {
    shape.pixel_shuffle.is_some() || shape.scatter.is_some()
}

/// float16 NHWC x whose groups' channels are whole runs of 8: layout 2 reads it in place,
/// 16 bytes per gather.
fn wide_x(shape: &ConvShape) -> bool {
    shape.layout == Layout::Nhwc && shape.dtype == DType::F16 && shape.cg() % 8 == 0
}

/// NHWC x whose groups' channels are whole vec4s: layout 1's copy of it would be x itself.
fn reads_x_in_place(shape: &ConvShape) -> bool {
    shape.layout == Layout::Nhwc && shape.cg() % 4 == 0
}

fn generate(v: &Coop, shape: &ConvShape) -> Result<Kernel> {
    if moves_y(shape) && v.splits > 1 {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: split-K variants of the tensor-core family do not fuse a pixel shuffle or a transposed convolution's scatter",
            v.name()
        )));
    }
    if shape.layout != Layout::Nchw && !v.channels_last() {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: NHWC takes the channels-last variants (_l1, _l2)",
            v.name()
        )));
    }
    if v.layout >= 2 && !wide_x(shape) {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: layout 2 reads float16 NHWC x in place, 8 channels at a time (channels per group a multiple of 8)",
            v.name()
        )));
    }
    let window = Window::of(v, shape);
    if v.layout == 3 && window.is_none() {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: layout 3 stages the input window of float16 NHWC problems with one group, channels a multiple of its step, stride and dilation 1, a window of at most 3x3 and y stored in place",
            v.name()
        )));
    }
    let window = window.filter(|_| v.layout == 3);
    let in_place = reads_x_in_place(shape);
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

    let mut smem = String::new();
    for p in parts {
        writeln!(smem, "var<workgroup> a_{p}: array<vec4<f16>, {}>;", v.a_rows() * lda / 4).unwrap();
        writeln!(smem, "var<workgroup> b_{p}: array<vec4<f16>, {}>;", v.bn * ldb / 4).unwrap();
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
        writeln!(s, "    var pb{i}: vec4<{}>;", if v.layout >= 2 { "u32" } else { "f32" }).unwrap();
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
    acc.push_str("    var k_next: i32 = k_begin;\n");

    let lanes = ["x", "y", "z", "w"];
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
    for i in 0..b_slots {
        let s = &mut fetch;
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let kr = k_next + bk{i};").unwrap();
        if vec_w || v.channels_last() {
            // Whole chunks of a weight row, 16-byte aligned: one load each.
            let bok = format!("bok{i}");
            let ok = lean.conj(&[(&bok, lean.n), ("kr < k_end", lean.k)], &b_guard);
            if lean.on {
                gather(s, &format!("pb{i}"), v.layout, "wt", &format!("bbase{i} + kr"), v.b_chunk(), &ok);
                writeln!(s, "    }}").unwrap();
                continue;
            }
            writeln!(s, "        let ok = {ok};").unwrap();
            if v.layout >= 2 {
                writeln!(s, "        pb{i} = select(vec4<u32>(0u), wt[select(0, (bbase{i} + kr) / 8, ok)], ok);").unwrap();
            } else {
                writeln!(s, "        pb{i} = select(vec4<f32>(0.0), vec4<f32>({w_buf}[select(0, (bbase{i} + kr) / 4, ok)]), ok);").unwrap();
            }
            writeln!(s, "    }}").unwrap();
            continue;
        }
        for (q, lane) in lanes.iter().enumerate() {
            writeln!(s, "        {{").unwrap();
            writeln!(s, "            let ok = bok{i} && kr + {q} < k_end;").unwrap();
            writeln!(s, "            pb{i}.{lane} = select(0.0, f32(w[select(0, bbase{i} + kr + {q}, ok)]), ok);").unwrap();
            writeln!(s, "        }}").unwrap();
        }
        writeln!(s, "    }}").unwrap();
    }

    let mut advance = String::from("        k_next = k0 + BK;\n");
    if v.layout == 0 {
        implicit::write_reduction_advance(&mut advance, a_slots, v.bk, shape, "        ");
    }

    let stage = stage_step(v, a_slots, b_slots, b_total < t);
    let steps = match window {
        Some(_) => window_steps(v, &stage, &fetch),
        None => steps(&stage, &advance, &fetch, &inner_product(v), lean.on),
    };

    let vec_y = stores_quads(shape);
    let store = store_step(v, shape, vec_y, window.is_some());
    let finish_store = finish_store(vec_y);

    let mut vars = shape_vars(shape, &v.name());
    vars.extend([
        ("M", view.m.to_string()),
        ("M_BLOCKS", m_blocks.to_string()),
        ("N_BLOCKS", n_blocks.to_string()),
        ("BLOCKS", blocks.to_string()),
    ]);
    let padded = Padded::of(shape);
    let (prologue_vars, prologue_blocks) = prologue_vars(shape, &padded, vec_w, in_place, scaled, v.b_chunk());
    vars.extend(prologue_vars);
    let kl = if v.channels_last() { padded.krp } else { view.red as u64 };
    let ks = implicit::split_share(kl, v.splits, v.bk);
    let x_copy = if in_place { 0 } else { padded.x_len(shape) };
    // The partials' first vec4 in binding 5: after the x copy (f32 whenever a split runs).
    let part0 = x_copy / 4;
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
        ("XT_ELEM", if in_place { "vec4<f32>".to_string() } else { format!("vec4<{ct}>") }),
        ("SPLITS", v.splits.to_string()),
        ("KS", ks.to_string()),
        ("YLEN", shape.y_len().to_string()),
        ("YLEN4", (shape.y_len().div_ceil(4) * 4).to_string()),
        ("PART0", part0.to_string()),
        ("FINISH_STORE", finish_store),
        ("Y_ELEM", if vec_y { format!("vec4<{dt}>") } else { dt.to_string() }),
        ("WT_ELEM", if v.layout >= 2 { "vec4<u32>".to_string() } else { format!("vec4<{ct}>") }),
        ("W_ELEM", if vec_w { format!("vec4<{dt}>") } else { dt.to_string() }),
        ("X_ELEM", if v.layout >= 2 { "vec4<u32>".to_string() } else if in_place || quads { format!("vec4<{dt}>") } else { dt.to_string() }),
        ("X_AT", if v.layout >= 2 {
            "    return unpack2x16float(x[i / 8][(i % 8) / 2])[i % 2];"
        } else if in_place || quads {
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
        ("FETCH", fetch),
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
    if v.channels_last() {
        kernel.prologue = Some(prologue_blocks);
        let bytes = shape.dtype.size();
        let partials = if v.splits > 1 { v.splits as u64 * shape.y_len().div_ceil(4) * 16 } else { 0 };
        kernel.workspace = [x_copy * bytes + partials, padded.w_len(shape) * bytes];
    }
    if v.splits > 1 {
        kernel.finish = Some(shape.y_len().div_ceil(4).div_ceil(256));
    }
    Ok(kernel)
}

/// One k-step's staging: each slot's registers scaled, converted to f16 and stored in
/// workgroup memory; for the split also the scaled remainder.
fn stage_step(v: &Coop, a_slots: u32, b_slots: u32, b_partial: bool) -> String {
    let split = v.split == 3;
    let mut stage = String::new();
    let stage_one = |s: &mut String, tile: &str, reg: &str, scale: &str, at: String| {
        writeln!(s, "        {{").unwrap();
        writeln!(s, "            let v = {reg} * {scale};").unwrap();
        if split {
            // hi keeps v's top 11 significant bits by masking, so v - hi is exact and no
            // compiler can fold a float round trip away (converting through f16 and back did
            // leave lo zero on the GPU). Inf and NaN go into hi whole (a mask could turn a
            // NaN into Inf) with a zero lo (Inf - Inf would make a NaN of an Inf result).
            writeln!(s, "            let bits = bitcast<vec4<u32>>(v);").unwrap();
            writeln!(s, "            let fin = (bits & vec4<u32>(0x7F800000u)) != vec4<u32>(0x7F800000u);").unwrap();
            writeln!(s, "            let h32 = select(v, bitcast<vec4<f32>>(bits & vec4<u32>(0xFFFFE000u)), fin);").unwrap();
            writeln!(s, "            {tile}_hi[{at}] = vec4<f16>(h32);").unwrap();
            writeln!(s, "            {tile}_lo[{at}] = vec4<f16>(select(vec4<f32>(0.0), (v - h32) * LO, fin));").unwrap();
        } else {
            writeln!(s, "            {tile}_hi[{at}] = vec4<f16>(v);").unwrap();
        }
        writeln!(s, "        }}").unwrap();
    };
    for i in 0..a_slots {
        if v.layout >= 2 {
            stage_packed(&mut stage, "a", &format!("pa{i}"), &format!("(u32(arow{i}) * LDA) / 4u + 2u * u32(acol)"));
            continue;
        }
        let at = if v.channels_last() {
            format!("(u32(arow{i}) * LDA) / 4u + u32(acol)")
        } else {
            format!("(u32(ak{i}) * LDA) / 4u + u32(am)")
        };
        stage_one(&mut stage, "a", &format!("pa{i}"), "sx", at);
    }
    for i in 0..b_slots {
        let at = format!("(u32(bn{i}) * LDB + u32(bk{i})) / 4u");
        if v.layout >= 2 {
            // A partial slot (see `b_guard`): only the invocations that gathered store.
            let guard = if b_partial { "if (lid < BN * BK / 8) " } else { "" };
            writeln!(stage, "        {guard}{{").unwrap();
            stage_packed(&mut stage, "b", &format!("pb{i}"), &at);
            writeln!(stage, "        }}").unwrap();
            continue;
        }
        stage_one(&mut stage, "b", &format!("pb{i}"), "sw", at);
    }
    stage
}

/// Layout 2's staging of one gather: 8 float16 values loaded as four u32s, stored as two
/// vec4s of the staged row starting at vec4 `at` (not scaled: float16 data).
fn stage_packed(s: &mut String, tile: &str, reg: &str, at: &str) {
    writeln!(s, "        {{").unwrap();
    writeln!(s, "            let at = {at};").unwrap();
    writeln!(s, "            {tile}_hi[at] = vec4<f16>(vec2<f16>(unpack2x16float({reg}.x)), vec2<f16>(unpack2x16float({reg}.y)));").unwrap();
    writeln!(s, "            {tile}_hi[at + 1u] = vec4<f16>(vec2<f16>(unpack2x16float({reg}.z)), vec2<f16>(unpack2x16float({reg}.w)));").unwrap();
    writeln!(s, "        }}").unwrap();
}

/// One k-step's products: per 16-term slice, the subgroup's A and B tiles loaded from
/// workgroup memory and multiplied into its accumulators (and, for the split, the
/// correction terms into theirs).
fn inner_product(v: &Coop) -> String {
    let split = v.split == 3;
    let (tm, tn) = (v.tm(), v.tn());
    let parts: &[&str] = if split { &["hi", "lo"] } else { &["hi"] };
    let mut inner = String::new();
    for kk in 0..v.bk / 16 {
        let s = &mut inner;
        writeln!(s, "        {{").unwrap();
        for p in parts {
            for i in 0..tm {
                // Layout 1 holds A row-major (a pixel's terms together), layout 0 column-major.
                let load = if v.layout == 3 {
                    format!("coopLoadT<MatA>(&a_{p}[(u32(pf{i} + tap) * LDA + {}u) / 4u], LDA / 4u)", kk * 16)
                } else if v.channels_last() {
                    format!("coopLoadT<MatA>(&a_{p}[((wm + {}u) * LDA + {}u) / 4u], LDA / 4u)", i * 16, kk * 16)
                } else {
                    format!("coopLoad<MatA>(&a_{p}[({} * LDA + wm + {}u) / 4u], LDA / 4u)", kk * 16, i * 16)
                };
                writeln!(s, "            let a{p}{i} = {load};").unwrap();
            }
            for j in 0..tn {
                writeln!(
                    s,
                    "            let b{p}{j} = coopLoad<MatB>(&b_{p}[((wn + {}u) * LDB + {}u) / 4u], LDB / 4u);",
                    j * 16,
                    kk * 16
                )
                .unwrap();
            }
        }
        for i in 0..tm {
            for j in 0..tn {
                writeln!(s, "            acc{i}_{j} = coopMultiplyAdd(ahi{i}, bhi{j}, acc{i}_{j});").unwrap();
                if split {
                    writeln!(s, "            cor{i}_{j} = coopMultiplyAdd(ahi{i}, blo{j}, cor{i}_{j});").unwrap();
                    writeln!(s, "            cor{i}_{j} = coopMultiplyAdd(alo{i}, bhi{j}, cor{i}_{j});").unwrap();
                }
            }
        }
        writeln!(s, "        }}").unwrap();
    }
    inner
}

/// The store step: each accumulator tile goes through the subgroup's scratch, laid out so
/// that neighbouring lanes write neighbouring elements of y: pixel fastest for NCHW
/// (column-major), channel fastest for NHWC (row-major). Where four neighbours along that
/// axis are always in range together and 16-byte aligned (`vec_y`: whole quads of pixels in
/// every image, or of channels in every group), each lane stores them as one vec4. Split-K
/// variants store unscaled partial sums instead, for the finishing pass.
fn store_step(v: &Coop, shape: &ConvShape, vec_y: bool, window: bool) -> String {
    let split = v.split == 3;
    let (tm, tn) = (v.tm(), v.tn());
    let pixel_fastest = shape.layout == Layout::Nchw;
    let store_fn = if pixel_fastest { "coopStore" } else { "coopStoreT" };
    let split_at = v.sgm * v.sgn * 256;
    let sum = |at: &str| {
        if split {
            format!("scratch[{at}] + scratch[{split_at} + {at}] / LO")
        } else {
            format!("scratch[{at}]")
        }
    };
    let mut store = String::new();
    for i in 0..tm {
        for j in 0..tn {
            let s = &mut store;
            writeln!(s, "    workgroupBarrier();").unwrap();
            writeln!(s, "    {store_fn}(acc{i}_{j}, &scratch[sbase], 16u);").unwrap();
            if split {
                writeln!(s, "    {store_fn}(cor{i}_{j}, &scratch[{split_at} + sbase], 16u);").unwrap();
            }
            writeln!(s, "    workgroupBarrier();").unwrap();
            // Element e of the tile: (e % 16, e / 16) column-major, (e / 16, e % 16) row-major;
            // quad q holds elements 4q .. 4q + 3 of the same layout.
            let (e_m, e_n) = match (pixel_fastest, vec_y) {
                (true, false) => ("e % 16u", "e / 16u"),
                (false, false) => ("e / 16u", "e % 16u"),
                (true, true) => ("4u * (e % 4u)", "e / 4u"),
                (false, true) => ("e / 4u", "4u * (e % 4u)"),
            };
            let rounds = if vec_y { 2 } else { 8 };
            // A scatter's mapping splits into a pixel half and a channel half: the half that
            // every round of this lane shares is computed once (NCHW's one-at-a-time rounds
            // keep the pixel, NHWC's the channel).
            let scatter = shape.scatter.is_some();
            // NCHW scatters keep a channel's phases side by side: a round's lanes take the
            // tile's elements phase column fastest, then pixel, so that neighbouring lanes
            // store neighbouring output columns (`sw` of them per pixel).
            let sw = match shape.scatter {
                Some(sc) if pixel_fastest && !sc.phase_major && 16 % sc.phases.1 == 0 => sc.phases.1,
                _ => 1,
            };
            let m_offsets: Vec<u32> = (0..rounds).map(|r| (r * 32 / sw) % 16).collect();
            if scatter && pixel_fastest && !vec_y {
                let mut seen = Vec::new();
                for &o in &m_offsets {
                    if !seen.contains(&o) {
                        seen.push(o);
                        writeln!(s, "    let ypm{i}_{j}_{o} = ypix(m0 + i32(wm) + {} + i32((lane / {sw}u + {o}u) % 16u));", i * 16).unwrap();
                    }
                }
            } else if scatter && !pixel_fastest {
                let lane_n = if vec_y { "4u * (lane % 4u)" } else { "lane % 16u" };
                writeln!(s, "    let ycn{i}_{j} = ychan(g * KG + n0 + i32(wn) + {} + i32({lane_n}));", j * 16).unwrap();
            }
            for r in 0..rounds {
                writeln!(s, "    {{").unwrap();
                if sw > 1 {
                    // `e` then names the element in the tile's column-major order.
                    writeln!(s, "        let q = {}u + lane;", r * 32).unwrap();
                    writeln!(s, "        let e = ((q / {}u) * {sw}u + q % {sw}u) * 16u + (q / {sw}u) % 16u;", 16 * sw).unwrap();
                } else {
                    writeln!(s, "        let e = {}u + lane;", r * 32).unwrap();
                }
                if window {
                    // The tile's pixel p is (oh0 + p / TW, ow0 + p % TW) of image `img`; past
                    // the image's edge it stores nothing (m = M).
                    writeln!(s, "        let p = i32(wm) + {} + i32({e_m});", i * 16).unwrap();
                    writeln!(s, "        let oh = oh0 + p / TW;\n        let ow = ow0 + p % TW;").unwrap();
                    writeln!(s, "        let m = select(M, (img * OH + oh) * OW + ow, oh < OH && ow < OW);").unwrap();
                } else {
                    writeln!(s, "        let m = m0 + i32(wm) + {} + i32({e_m});", i * 16).unwrap();
                }
                writeln!(s, "        let n = n0 + i32(wn) + {} + i32({e_n});", j * 16).unwrap();
                writeln!(s, "        if (m < M && n < KG) {{").unwrap();
                writeln!(s, "            let k = g * KG + n;").unwrap();
                let at = "(m / OHW) * YSN + k * YSK + (m % OHW) * YSP";
                if scatter {
                    let mapped = if pixel_fastest {
                        format!("yscatter(ypm{i}_{j}_{}, ychan(k))", m_offsets[r as usize])
                    } else {
                        format!("yscatter(ypix(m), ycn{i}_{j})")
                    };
                    writeln!(s, "            let yi = {mapped};").unwrap();
                    writeln!(s, "            if (yi >= 0) {{").unwrap();
                } else if moves_y(shape) {
                    // ystore gives -1 for an output past y's edges (a transposed
                    // convolution's lowered form), and never does otherwise.
                    writeln!(s, "            let yi = ystore({at});").unwrap();
                    writeln!(s, "            if (yi >= 0) {{").unwrap();
                } else {
                    writeln!(s, "            let yi = {at};").unwrap();
                    writeln!(s, "            {{").unwrap();
                }
                // The smaller factor first: an intermediate overflows only if the result does.
                let one = |at: &str, k: &str, yi: &str| {
                    format!("DT(epilogue(({}) * min(ux, uw) * max(ux, uw), {k}, {yi}))", sum(at))
                };
                if v.splits > 1 && vec_y {
                    // A partial sum, unscaled: the finishing pass adds the parts and applies
                    // the epilogue.
                    let parts: Vec<String> = (0..4)
                        .map(|t| format!("({}) * min(ux, uw) * max(ux, uw)", sum(&format!("sbase + 4u * e + {t}u"))))
                        .collect();
                    writeln!(s, "            xt[PART0 + (sp * YLEN4 + yi) / 4] = vec4<f32>(\n                {});", parts.join(",\n                ")).unwrap();
                } else if v.splits > 1 {
                    writeln!(s, "            let pi = sp * YLEN4 + yi;").unwrap();
                    writeln!(s, "            xt[PART0 + pi / 4][pi % 4] = ({}) * min(ux, uw) * max(ux, uw);", sum("sbase + e")).unwrap();
                } else if vec_y {
                    let parts: Vec<String> = (0..4)
                        .map(|t| {
                            let k = if pixel_fastest || t == 0 { "k".to_string() } else { format!("k + {t}") };
                            one(&format!("sbase + 4u * e + {t}u"), &k, &format!("yi + {t}"))
                        })
                        .collect();
                    writeln!(s, "            y[yi / 4] = vec4<DT>(\n                {});", parts.join(",\n                ")).unwrap();
                } else {
                    writeln!(s, "            y[yi] = {};", one("sbase + e", "k", "yi")).unwrap();
                }
                writeln!(s, "            }}").unwrap();
                writeln!(s, "        }}").unwrap();
                writeln!(s, "    }}").unwrap();
            }
        }
    }
    store
}

/// The finishing pass's store (split-K): the summed parts of four neighbouring outputs, as
/// one vec4 where y's rows are whole quads, else one element at a time within y.
fn finish_store(vec_y: bool) -> String {
    let k_of = |e: &str| format!("({e} / YSK) % K");
    if vec_y {
        let parts: Vec<String> = (0..4)
            .map(|t| format!("DT(epilogue(sum[{t}], {}, 4 * i + {t}))", k_of(&format!("(4 * i + {t})"))))
            .collect();
        format!("    y[i] = vec4<DT>(\n        {});\n", parts.join(",\n        "))
    } else {
        let mut f = String::new();
        for t in 0..4 {
            writeln!(f, "    if (4 * i + {t} < YLEN) {{ y[4 * i + {t}] = DT(epilogue(sum[{t}], {}, 4 * i + {t})); }}", k_of(&format!("(4 * i + {t})"))).unwrap();
        }
        f
    }
}

/// Layout 0's A slots: this invocation's four consecutive pixels 4*am .. 4*am+3 of the tile,
/// the same in every slot because the invocation count is a multiple of the chunks per k
/// row, and each slot's reduction index as (channel, row, column) digits.
fn a_setup_in_place(v: &Coop, a_slots: u32) -> String {
    let mut s = String::new();
    let chunks_per_k = v.bm / 4;
    writeln!(s, "    let am = lid % {chunks_per_k};").unwrap();
    for p in 0..4 {
        implicit::write_pixel(&mut s, &p.to_string(), &format!("m0 + 4 * am + {p}"), ("CH * H * W", "W", ""));
    }
    for i in 0..a_slots {
        writeln!(s, "    let ak{i} = (lid + {}) / {chunks_per_k};", i * v.threads()).unwrap();
        implicit::write_reduction_index(&mut s, i, &format!("ak{i}"));
        writeln!(s, "    var pa{i}: vec4<f32>;").unwrap();
    }
    s
}

/// Layout 1's A slots: one pixel each (row `arow{i}` of the tile), and terms 4*acol ..
/// 4*acol+3 of each k-step, the same in every slot for the same reason as above.
fn a_setup_channels_last(v: &Coop, a_slots: u32) -> String {
    let mut s = String::new();
    let chunks_per_row = v.bk / v.a_chunk();
    // Layout 2 holds each gather's 8 float16 values as the 16 bytes it loaded.
    let reg = if v.layout >= 2 { "vec4<u32>" } else { "vec4<f32>" };
    writeln!(s, "    let acol = lid % {chunks_per_row};").unwrap();
    for i in 0..a_slots {
        writeln!(s, "    let arow{i} = (lid + {}) / {chunks_per_row};", i * v.threads()).unwrap();
        implicit::write_pixel_position(&mut s, &i.to_string(), &format!("m0 + arow{i}"));
        // Where the pixel's window starts in the (N, H, W, C) copy; only used in range.
        writeln!(s, "    let abase{i} = (((apix{i} / OHW) * H + aih{i}) * W + aiw{i}) * CHP + g * CP;").unwrap();
        writeln!(s, "    var pa{i}: {reg};").unwrap();
    }
    s
}

/// Layout 0's gathers: each slot's four pixels at its reduction index, one element each.
fn fetch_in_place(s: &mut String, a_slots: u32, shape: &ConvShape, quads: bool) {
    let lanes = ["x", "y", "z", "w"];
    for i in 0..a_slots {
        if quads {
            // A 1x1 window at stride 1: the slot's term is channel kc of the four pixels.
            writeln!(s, "    {{").unwrap();
            writeln!(s, "        let ok = aok0 && kc{i} < CG;").unwrap();
            writeln!(s, "        pa{i} = select(vec4<f32>(0.0), vec4<f32>(x[select(0, (abase0 + kc{i} * H * W) / 4, ok)]), ok);").unwrap();
            writeln!(s, "    }}").unwrap();
            continue;
        }
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let khd = kh{i} * DH;").unwrap();
        writeln!(s, "        let kwd = kw{i} * DW;").unwrap();
        writeln!(s, "        let koff = kc{i} * H * W + khd * W + kwd;").unwrap();
        writeln!(s, "        let kok = kc{i} < CG;").unwrap();
        for (p, lane) in lanes.iter().enumerate() {
            writeln!(s, "        {{").unwrap();
            writeln!(s, "            let ih = aih{p} + khd;").unwrap();
            writeln!(s, "            let iw = aiw{p} + kwd;").unwrap();
            writeln!(s, "            let ok = aok{p} && kok{};", implicit::window_check(shape)).unwrap();
            writeln!(s, "            pa{i}.{lane} = select(0.0, f32(x[select(0, abase{p} + koff, ok)]), ok);").unwrap();
            writeln!(s, "        }}").unwrap();
        }
        writeln!(s, "    }}").unwrap();
    }
}

/// Where the gathers of a channels-last variant may leave tests out: problems without a
/// kernel window to test (no padding), unsplit. On the GEMM of 8192^3 as a 1x1 float16
/// convolution (H200) this took 128x256x32 tiles from 128 to 252 TFLOP/s (the tests' registers
/// had pushed the 4x4 accumulator grids out of registers); with windows to test it measured
/// 0-20% slower, so those keep every test.
struct Lean {
    on: bool,
    /// Every pixel tile whole (M a multiple of BM), every channel tile (KG of BN), every
    /// reduction step (KL of BK; the gathers past the last step are then skipped).
    m: bool,
    n: bool,
    k: bool,
}

impl Lean {
    fn of(v: &Coop, shape: &ConvShape) -> Self {
        let on = v.channels_last() && v.layout != 3 && v.splits == 1 && implicit::window_check(shape).is_empty();
        Lean {
            on,
            m: on && View::of(shape).m % v.bm as u64 == 0,
            n: on && shape.kg() as u64 % v.bn as u64 == 0,
            k: on && Padded::of(shape).krp % v.bk as u64 == 0,
        }
    }

    /// The tests `parts` (each left out where its flag says no tile fails it) and `rest`
    /// (" && ..." or empty) joined by &&; empty when none is left.
    fn conj(&self, parts: &[(&str, bool)], rest: &str) -> String {
        let mut terms: Vec<&str> = parts.iter().filter(|(_, whole)| !whole).map(|(t, _)| *t).collect();
        let rest = rest.trim_start_matches(" && ");
        if !rest.is_empty() {
            terms.push(rest);
        }
        terms.join(" && ")
    }
}

/// One lean gather of `chunk` terms at term index `at` of `buf` into register `reg`: an
/// unsigned shift for the index (`at` is never negative where it is used), zeros unless `ok`
/// (no test at all when `ok` is empty). Layout 2 keeps the 16 bytes as loaded.
fn gather(s: &mut String, reg: &str, layout: u32, buf: &str, at: &str, chunk: u32, ok: &str) {
    let shift = chunk.trailing_zeros();
    let (zero, load) = if layout >= 2 { ("vec4<u32>(0u)", "") } else { ("vec4<f32>(0.0)", "vec4<f32>") };
    if ok.is_empty() {
        writeln!(s, "        {reg} = {load}({buf}[u32({at}) >> {shift}u]);").unwrap();
    } else {
        writeln!(s, "        {reg} = select({zero}, {load}({buf}[select(0u, u32({at}) >> {shift}u, {ok})]), {ok});").unwrap();
    }
}

/// The k-step loop: barrier, stage, barrier, gather ahead, multiply. Lean variants skip the
/// gathers past the last step (a uniform branch) instead of testing each.
fn steps(stage: &str, advance: &str, fetch: &str, inner: &str, lean: bool) -> String {
    let mut s = String::from("    for (var k0: i32 = k_begin; k0 < k_end; k0 = k0 + BK) {\n");
    s.push_str("        // Everyone is done reading the staged tiles of the previous step.\n");
    s.push_str("        workgroupBarrier();\n");
    s.push_str(stage);
    s.push_str("        workgroupBarrier();\n");
    s.push_str(advance);
    if lean {
        s.push_str(&format!("        if (k_next < k_end) {{\n{fetch}        }}\n"));
    } else {
        s.push_str(fetch);
    }
    s.push_str(inner);
    s.push_str("    }\n");
    s
}

/// Layout 3's set-up: the tile's image and first output row and column, the patch's
/// geometry, and where each of this subgroup's 16-pixel row blocks starts in the patch.
fn window_setup(v: &Coop, w: &Window) -> String {
    let mut s = String::new();
    writeln!(s, "    // Window tiles: {} x {} output pixels of one image, a {} x {} patch of x per step's channels.", w.th, w.tw, w.pr, w.pc).unwrap();
    writeln!(s, "    const TW: i32 = {};\n    const PC: i32 = {};", w.tw, w.pc).unwrap();
    writeln!(s, "    const TILES_H: i32 = {};\n    const TILES_W: i32 = {};", w.tiles_h, w.tiles_w).unwrap();
    writeln!(s, "    const PATCH_CHUNKS: i32 = {};  // 8-channel chunks of the patch", w.pr * w.pc * v.bk / 8).unwrap();
    writeln!(s, "    const NSTEPS: i32 = {};        // channel blocks x (r, s)", "CP / BK * R * S").unwrap();
    writeln!(s, "    let img = i32(m_block) / (TILES_H * TILES_W);").unwrap();
    writeln!(s, "    let oh0 = (i32(m_block) / TILES_W) % TILES_H * {};", w.th).unwrap();
    writeln!(s, "    let ow0 = i32(m_block) % TILES_W * TW;").unwrap();
    for i in 0..v.tm() {
        writeln!(s, "    let pf{i} = ((i32(wm) + {o}) / TW) * PC + (i32(wm) + {o}) % TW;", o = i * 16).unwrap();
    }
    s
}

/// Layout 3's steps, over channel blocks and, within each, the kernel's (r, s): at a block's
/// first step the patch is staged (zeros outside the image), then every step stages its
/// weights and multiplies the patch read at the (r, s) offset, as the other layouts do.
fn window_steps(v: &Coop, stage_b: &str, fetch_b: &str) -> String {
    let mut s = String::from("    for (var t: i32 = 0; t < NSTEPS; t = t + 1) {\n");
    s.push_str("        let rs = t % (R * S);\n");
    s.push_str("        // Everyone is done reading the staged tiles of the previous step.\n");
    s.push_str("        workgroupBarrier();\n");
    s.push_str("        if (rs == 0) {\n");
    s.push_str("            let c0 = (t / (R * S)) * BK;\n");
    writeln!(s, "            for (var q = lid; q < PATCH_CHUNKS; q = q + {}) {{", v.threads()).unwrap();
    s.push_str("                let pix = q / (BK / 8);\n");
    s.push_str("                let cc = 8 * (q % (BK / 8));\n");
    s.push_str("                let ih = oh0 - PH + pix / PC;\n");
    s.push_str("                let iw = ow0 - PW + pix % PC;\n");
    s.push_str("                let ok = ih >= 0 && ih < H && iw >= 0 && iw < W;\n");
    s.push_str("                let v = select(vec4<u32>(0u), x[select(0u, u32(((img * H + ih) * W + iw) * CHP + c0 + cc) >> 3u, ok)], ok);\n");
    s.push_str("                let at = (u32(pix) * LDA + u32(cc)) / 4u;\n");
    s.push_str("                a_hi[at] = vec4<f16>(vec2<f16>(unpack2x16float(v.x)), vec2<f16>(unpack2x16float(v.y)));\n");
    s.push_str("                a_hi[at + 1u] = vec4<f16>(vec2<f16>(unpack2x16float(v.z)), vec2<f16>(unpack2x16float(v.w)));\n");
    s.push_str("            }\n        }\n");
    s.push_str(stage_b);
    s.push_str("        workgroupBarrier();\n");
    s.push_str("        // The next step's weights: channel block, then (r, s), as w's copy is ordered.\n");
    s.push_str("        k_next = ((t + 1) % (R * S)) * CP + ((t + 1) / (R * S)) * BK;\n");
    s.push_str(fetch_b);
    s.push_str("        let tap = (rs / S) * PC + rs % S;\n");
    s.push_str(&inner_product(v));
    s.push_str("    }\n");
    s
}

/// Layout 1's gathers: the step's four terms (channels c .. c+3 of one (r, s), decoded once
/// per step) for each slot's pixel, one 16-byte load each.
fn fetch_channels_last(s: &mut String, v: &Coop, a_slots: u32, shape: &ConvShape, x_buf: &str) {
    let chunk = v.a_chunk();
    let lean = Lean::of(v, shape);
    let (zero, load) = if v.layout >= 2 { ("vec4<u32>(0u)", "") } else { ("vec4<f32>(0.0)", "vec4<f32>") };
    writeln!(s, "    {{").unwrap();
    writeln!(s, "        let kr = k_next + {chunk} * acol;").unwrap();
    writeln!(s, "        let krs = kr / CP;").unwrap();
    writeln!(s, "        let khd = (krs / S) * DH;").unwrap();
    writeln!(s, "        let kwd = (krs % S) * DW;").unwrap();
    writeln!(s, "        let koff = (khd * W + kwd) * CHP + kr % CP;").unwrap();
    writeln!(s, "        let kok = kr < k_end;").unwrap();
    for i in 0..a_slots {
        writeln!(s, "        {{").unwrap();
        writeln!(s, "            let ih = aih{i} + khd;").unwrap();
        writeln!(s, "            let iw = aiw{i} + kwd;").unwrap();
        if lean.on {
            let aok = format!("aok{i}");
            let ok = lean.conj(&[(&aok, lean.m), ("kok", lean.k)], implicit::window_check(shape));
            gather(s, &format!("pa{i}"), v.layout, x_buf, &format!("abase{i} + koff"), chunk, &ok);
            writeln!(s, "        }}").unwrap();
            continue;
        }
        writeln!(s, "            let ok = aok{i} && kok{};", implicit::window_check(shape)).unwrap();
        writeln!(s, "            pa{i} = select({zero}, {load}({x_buf}[select(0, (abase{i} + koff) / {chunk}, ok)]), ok);").unwrap();
        writeln!(s, "        }}").unwrap();
    }
    writeln!(s, "    }}").unwrap();
}

/// The prologue's template values (it is in every coop module; only layout 1 runs it) and
/// its workgroup count.
fn prologue_vars(shape: &ConvShape, padded: &Padded, vec_w: bool, in_place: bool, scaled: bool, wv: u32) -> (Vec<(&'static str, String)>, u64) {
    let hw = shape.h as u64 * shape.w as u64;
    let (p_tiles, c_tiles) = (hw.div_ceil(32), padded.chp.div_ceil(32));
    let x_vec4s = shape.x_len() / 4;
    let padded_vec4s = padded.x_len(shape) / 4;
    let (x_blocks, prologue_x) = match (shape.layout, in_place) {
        // x read in place needs no pass of its own unless its scale is wanted.
        (Layout::Nhwc, true) if !scaled => (0, PROLOGUE_X_NONE),
        // A few workgroups striding over x: one vec4 per invocation made a 100 MB x pay a
        // workgroup's atomics and barriers 25,000 times.
        (Layout::Nhwc, true) => (x_vec4s.div_ceil(256).min(MAX_BLOCKS), PROLOGUE_X_MAX),
        (Layout::Nhwc, false) => (padded_vec4s.div_ceil(256), PROLOGUE_X_PAD),
        (Layout::Nchw, _) => (shape.n as u64 * p_tiles * c_tiles, PROLOGUE_X_COPY),
    };
    let w_blocks = (padded.w_len(shape) / wv as u64).div_ceil(256);
    let w_at = if vec_w { "    return f32(w[i / 4][i % 4]);" } else { "    return f32(w[i]);" };
    let vars = vec![
        ("P_TILES", p_tiles.to_string()),
        ("C_TILES", c_tiles.to_string()),
        ("X_BLOCKS", x_blocks.to_string()),
        ("W_BLOCKS", w_blocks.to_string()),
        ("WV", wv.to_string()),
        ("WT_WRITE", if wv == 8 { WT_WRITE_PACKED } else { WT_WRITE }.to_string()),
        ("W_AT", w_at.to_string()),
        ("X_VEC4S", x_vec4s.to_string()),
        ("PROLOGUE_X", prologue_x.to_string()),
        ("XP_VEC4S", padded_vec4s.to_string()),
    ];
    (vars, x_blocks + w_blocks)
}

/// The prologue's write of four channels of w's copy.
const WT_WRITE: &str = "            wt[i] = vec4<CT>(v);";

/// Layout 2's: eight float16 channels packed into 16 bytes (float16 data is never scaled:
/// the max below, of the first four, goes unused).
const WT_WRITE_PACKED: &str = r#"            let u = vec4<f32>(w_or_zero(src + 4 * R * S, c + 4), w_or_zero(src + 5 * R * S, c + 5),
                              w_or_zero(src + 6 * R * S, c + 6), w_or_zero(src + 7 * R * S, c + 7));
            wt[i] = vec4<u32>(pack2x16float(v.xy), pack2x16float(v.zw), pack2x16float(u.xy), pack2x16float(u.zw));"#;

/// Workgroups of the prologue's max pass over x read in place, as in `check`'s.
const MAX_BLOCKS: u64 = 1024;

/// The prologue's x part for NCHW x: transpose a 32-channel x 32-pixel tile into `xt`.
const PROLOGUE_X_COPY: &str = r#"        let p0 = i32(block % P_TILES) * 32;
        let c0 = i32((block / P_TILES) % C_TILES) * 32;
        let n = i32(block / (P_TILES * C_TILES));
        var mx = 0u;
        for (var i = 0; i < 4; i = i + 1) {
            let cy = lid / 32 + 8 * i;
            let p = p0 + lid % 32;
            // Padded channel c0 + cy is channel cc of group cg; past CG it is padding (zero).
            let cg = (c0 + cy) / CP;
            let cc = (c0 + cy) % CP;
            let ok = c0 + cy < CHP && cc < CG && p < HW;
            let v = select(0.0, x_at(select(0, (n * CH + cg * CG + cc) * HW + p, ok)), ok);
            mx = max(mx, finite_abs_bits(v));
            tile[cy * 33 + lid % 32] = v;
        }
        atomicMax(&tile_max[0], mx);
        workgroupBarrier();
        let py = lid / 8;
        let c4 = 4 * (lid % 8);
        if (p0 + py < HW && c0 + c4 < CHP) {
            xt[((n * HW + p0 + py) * CHP + c0 + c4) / 4] = vec4<CT>(vec4<f32>(
                tile[c4 * 33 + py], tile[(c4 + 1) * 33 + py],
                tile[(c4 + 2) * 33 + py], tile[(c4 + 3) * 33 + py]));
        }"#;

/// The prologue's x part for NHWC x whose groups' channels are not whole vec4s: copy it with
/// each group's channels zero-padded to CP, one vec4 of the copy per invocation.
const PROLOGUE_X_PAD: &str = r#"        let i = i32(block) * 256 + lid;
        var mx = 0u;
        if (i < XP_VEC4S) {
            let pix = (4 * i) / CHP;
            let c0 = (4 * i) % CHP;
            var v = vec4<f32>(0.0);
            for (var j = 0; j < 4; j = j + 1) {
                // Padded channel c0 + j is channel cc of group cg; past CG it is padding.
                let cg = (c0 + j) / CP;
                let cc = (c0 + j) % CP;
                let ok = cc < CG;
                v[j] = select(0.0, x_at(select(0, pix * CH + cg * CG + cc, ok)), ok);
                mx = max(mx, finite_abs_bits(v[j]));
            }
            xt[i] = vec4<CT>(v);
        }
        atomicMax(&tile_max[0], mx);"#;

/// The prologue's x part for float16 NHWC x read in place: nothing (no copy, no scale), and
/// no workgroup takes this branch.
const PROLOGUE_X_NONE: &str = "        // float16 x read in place: no copy, no scale.";

/// The prologue's x part for NHWC x, which the kernel reads in place: its max only.
const PROLOGUE_X_MAX: &str = r#"        var mx = 0u;
        for (var i = i32(block) * 256 + lid; i < X_VEC4S; i = i + i32(X_BLOCKS) * 256) {
            let b = bitcast<vec4<u32>>(vec4<f32>(x[i])) & vec4<u32>(0x7FFFFFFFu);
            let f = select(vec4<u32>(0u), b, b < vec4<u32>(0x7F800000u));
            mx = max(mx, max(max(f.x, f.y), max(f.z, f.w)));
        }
        atomicMax(&tile_max[0], mx);"#;

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

    /// Every layout 3 variant passes naga on the shapes it takes: padded and not, ragged
    /// image edges, partial channel tiles, a bias and an epilogue.
    #[test]
    fn window_variants_validate() {
        let shapes = [
            f16_nhwc([2, 64, 19, 23], [40, 64, 3, 3], 1),
            f16_nhwc([1, 32, 16, 64], [64, 32, 1, 1], 0),
            f16_nhwc([2, 64, 9, 70], [72, 64, 3, 2], 0)
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap()),
        ];
        let mut seen = 0;
        for shape in &shapes {
            for v in Coop::space().into_iter().filter(|v| v.layout == 3) {
                let Ok(k) = v.generate(shape) else { continue };
                crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{}: {e}", v.name()));
                seen += 1;
            }
        }
        assert!(seen > 20, "{seen} layout 3 kernels generated");
    }
}
