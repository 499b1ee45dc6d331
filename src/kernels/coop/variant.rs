//! The tensor-core family's variant: its knobs, the tile geometry they imply, and what it
//! reads of a problem's shape.

use crate::dtype::DType;
use crate::params::{ConvShape, Layout};

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
pub(super) const TILES: [(u32, u32, u32, u32); 11] = [
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
/// Small tiles for the gathering layouts (0 to 2): the layers of networks at small batch
/// (M = N·OH·OW of 392 to 25,088 rows, 1x1 layers deep in K) give the tiles above a grid
/// of a few dozen workgroups on 132 multiprocessors; 1 and 2 subgroups of 2x2 accumulators
/// fill it (issue "real networks at small batch").
pub(super) const SMALL_TILES: [(u32, u32, u32, u32); 3] = [(32, 32, 1, 1), (64, 32, 2, 1), (32, 64, 1, 2)];
/// Layout 4's tiles (a kernel row per step; 16-term steps), which layout 3 does not take
/// with 16-term steps: on the H200 each ran every 3x3 layer measured at most as long as the
/// same tile on layout 3 (EDSR on 512x64, a 4x4 accumulator grid per subgroup that window
/// tiles can hold for want of A registers: 0.385 ms against 0.411; the 128-channel layers on
/// 256x128 3-7% faster); smaller tiles lost up to 50% (three times the staged weights cost
/// them residency).
pub(super) const WINDOW_ROW_TILES: [(u32, u32, u32, u32); 2] = [(512, 64, 8, 1), (256, 128, 4, 2)];
pub(super) const BK: [u32; 3] = [16, 32, 64];
pub(super) const SPLIT: [u32; 2] = [1, 3];
pub(super) const LAYOUT: [u32; 5] = [0, 1, 2, 3, 4];
pub(super) const SPLITS: [u32; 3] = [1, 2, 4];
/// The tiles split-K is offered for: those that win on deep layers with few output pixels,
/// whose grids leave multiprocessors idle (32,512,7,7 -> 512: 52 tiles of 128x128), and the
/// 4x4-grid tiles (64x64 outputs per subgroup), which run such layers faster per product
/// once the grid fills the GPU: on an H200, batch 128 of 32,512,7,7 in float16 at 155
/// TFLOP/s on 128x256 and 256x128 against 140 on 128x128, and split four ways batch 32 in
/// 0.061 ms against 0.064 for the 128x128 tile split two ways (`benches/results/HISTORY.md`, "Split-K
/// on 4x4 grids").
pub(super) const SPLIT_TILES: [(u32, u32, u32, u32); 7] =
    [(128, 64, 2, 2), (128, 128, 2, 4), (256, 128, 4, 2), (128, 256, 2, 4), (64, 64, 2, 2), (64, 32, 2, 1), (32, 64, 1, 2)];
/// The window tiles split-K is offered for (over channel blocks): the 4-subgroup 4x4 grid,
/// which runs two workgroups per multiprocessor (32,256,14,14 in float16 at batch 64 in
/// 1.25x batch 32's time), so a grid of up to one workgroup per multiprocessor leaves half
/// the GPU idle. The 8-subgroup window tiles gained nothing split (`benches/results/HISTORY.md`, "Tuning
/// runoff; split-K on 4x4 grids").
pub(super) const SPLIT_WINDOW_TILES: [(u32, u32, u32, u32); 1] = [(128, 128, 2, 2)];
/// f16 elements of padding per staged row: 16 bytes, so 16x16 loads spread over banks.
pub(super) const PAD: u32 = 8;
/// Subgroup width the kernel's tile partition assumes.
pub const SUBGROUP: u32 = 32;


impl Coop {
    pub(super) fn threads(&self) -> u32 {
        SUBGROUP * self.sgm * self.sgn
    }
    pub(super) fn tm(&self) -> u32 {
        self.bm / (self.sgm * 16)
    }
    pub(super) fn tn(&self) -> u32 {
        self.bn / (self.sgn * 16)
    }
    /// Layouts 3 and 4 are window tiles (layout 4 stages a kernel row's weights per step).
    pub(super) fn windowed(&self) -> bool {
        self.layout >= 3
    }
    /// Kernel taps whose weights one step stages, for a kernel `s` taps wide: a whole row
    /// for layout 4, else one.
    pub(super) fn taps_per_step(&self, s: u32) -> u32 {
        if self.layout == 4 { s } else { 1 }
    }
    /// Layouts 1 and 2 walk the reduction channels fastest (a pixel's row of terms).
    pub(super) fn channels_last(&self) -> bool {
        self.layout >= 1
    }
    /// Terms of x one A gather loads: 8 (16 bytes of float16) for layout 2, else 4.
    pub(super) fn a_chunk(&self) -> u32 {
        if self.layout >= 2 { 8 } else { 4 }
    }
    /// Terms of w's copy one B gather loads: 8 packed float16 for layout 2, else 4.
    pub(super) fn b_chunk(&self) -> u32 {
        self.a_chunk()
    }
    /// Staged A row length: a k row of the tile (layout 0) or a pixel's row (layouts 1, 2).
    pub(super) fn lda(&self) -> u32 {
        if self.channels_last() { self.bk + PAD } else { self.bm + PAD }
    }
    pub(super) fn ldb(&self) -> u32 {
        self.bk + PAD
    }
    /// Staged copies of each tile: hi, and lo when split.
    pub(super) fn parts(&self) -> u32 {
        if self.split == 3 { 2 } else { 1 }
    }
}

/// Layout 1's channel padding: each group's channels rounded up to a multiple of 4, so a
/// pixel's terms are whole vec4s for any C (no slow path for an unlucky count).
pub(super) struct Padded {
    /// Channels per group, padded.
    pub(super) cp: u64,
    /// A pixel's row in the copy of x: groups * cp.
    pub(super) chp: u64,
    /// A weight row in the copy of w: cp * R * S.
    pub(super) krp: u64,
}

impl Padded {
    pub(super) fn of(shape: &ConvShape) -> Self {
        let cp = (shape.cg() as u64).div_ceil(4) * 4;
        Padded { cp, chp: cp * shape.groups as u64, krp: cp * shape.r as u64 * shape.s as u64 }
    }
    pub(super) fn x_len(&self, shape: &ConvShape) -> u64 {
        shape.n as u64 * shape.h as u64 * shape.w as u64 * self.chp
    }
    pub(super) fn w_len(&self, shape: &ConvShape) -> u64 {
        shape.k as u64 * self.krp
    }
}

/// NCHW x whose output pixels are its own pixels (1x1, stride 1, unpadded), whole quads of
/// them in every image: layout 0 gathers four neighbouring pixels with one 16-byte load.
pub(super) fn pixel_quads(shape: &ConvShape) -> bool {
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
pub(super) fn stores_quads(shape: &ConvShape) -> bool {
    if shape.pixel_shuffle.is_some() {
        return false;
    }
    if let Some(sc) = shape.scatter {
        return shape.layout == Layout::Nhwc && sc.kg % 4 == 0;
    }
    if shape.layout == Layout::Nchw { shape.oh() * shape.ow() % 4 == 0 } else { shape.kg() % 4 == 0 }
}


/// float16 NHWC x whose groups' channels are whole runs of 8: layout 2 reads it in place,
/// 16 bytes per gather.
pub(super) fn wide_x(shape: &ConvShape) -> bool {
    shape.layout == Layout::Nhwc && shape.dtype == DType::F16 && shape.cg() % 8 == 0
}

/// float16 NCHW x whose groups' channels are whole runs of 8: window tiles read it in place,
/// eight channels H·W apart per chunk as they read float32 NCHW x, packing as they load it
/// (without them float16 NCHW data ran slower than float32 in "high": 8,64,56,56 -> 64 3x3
/// on layout 1 in 0.029 ms against a float32 window tile's 0.022 on an H200).
pub(super) fn window_f16_nchw(shape: &ConvShape) -> bool {
    shape.layout == Layout::Nchw && shape.dtype == DType::F16 && shape.cg() % 8 == 0
}

/// Whether layouts 2 to 4 take `shape`'s x, 8 channels at a time: the gathering layout 2
/// reads float16 NHWC x in place or float32 data's packed copy; window tiles read any x whose
/// groups' channels are whole runs of 8 (float16 NHWC 16 bytes at a time, float32 data and
/// float16 NCHW one element at a time).
pub(super) fn reads_octets(v: &Coop, shape: &ConvShape) -> bool {
    if v.windowed() { shape.cg() % 8 == 0 } else { wide_x(shape) || packs_f32(shape) }
}

/// float32 x whose groups' channels are whole runs of 8, in either layout: layouts 2 and 3
/// read a packed float16 copy of it (scaled), 8 channels per gather.
pub(super) fn packs_f32(shape: &ConvShape) -> bool {
    shape.dtype == DType::F32 && shape.cg() % 8 == 0
}

/// How a channels-last gather holds its 16 bytes until staged: layouts 2 and 3 keep the
/// packed float16 as loaded, the others convert to f32. (register type, its zero, the
/// conversion applied to a load.)
pub(super) fn gather_register(layout: u32) -> (&'static str, &'static str, &'static str) {
    if layout >= 2 { ("vec4<u32>", "vec4<u32>(0u)", "") } else { ("vec4<f32>", "vec4<f32>(0.0)", "vec4<f32>") }
}

/// NHWC x whose groups' channels are whole vec4s: layout 1's copy of it would be x itself.
pub(super) fn reads_x_in_place(shape: &ConvShape) -> bool {
    shape.layout == Layout::Nhwc && shape.cg() % 4 == 0
}
