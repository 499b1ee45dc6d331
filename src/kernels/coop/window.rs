//! Layout 3: window tiles. Each workgroup computes a TH x TW block of one image's output
//! pixels and stages the block's input patch once per channel block, for every (r, s).

use super::variant::*;
use super::steps::{inner_product, unpack_at};
use crate::kernels::padding::PadIndex;
use crate::params::{ConvShape, Layout, PaddingMode};
use std::fmt::Write as _;

/// Widths a window tile may take (multiples of 16: a 16-pixel matrix row block stays in one
/// row of the tile), and the largest kernel window layout 3 stages.
pub(super) const WINDOW_WIDTHS: [u32; 3] = [64, 32, 16];
pub(super) const WINDOW_MAX_RS: u32 = 3;
/// The most output pixels a window tiling may compute per pixel it stores.
pub(super) const WINDOW_WASTE: f64 = 1.35;
/// Layout 3's tiling: each workgroup's output tile is `th` x `tw` pixels of one image, and
/// reads a `pr` x `pc` patch of x (zeros outside the image).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Window {
    pub(super) th: u32,
    pub(super) tw: u32,
    pub(super) pr: u32,
    pub(super) pc: u32,
    pub(super) tiles_h: u64,
    pub(super) tiles_w: u64,
    /// How the patch reads rows and columns past x's edges.
    pub(super) mode: PaddingMode,
}

impl Window {
    /// The tiling for the width in `WINDOW_WIDTHS` that pads the output least (the wider on
    /// a tie), where layout 3 takes the shape: float16 read in place, one group whose
    /// channels are whole steps, stride and dilation 1, a window of at most 3 x 3, y stored
    /// in place.
    pub(super) fn of(v: &Coop, shape: &ConvShape) -> Option<Window> {
        // Every patch source reads whole runs of 8 channels (`reads_octets`).
        let takes = shape.cg() % 8 == 0
            && shape.groups == 1
            && shape.cg() % v.bk == 0
            && shape.stride == (1, 1)
            && shape.dilation == (1, 1)
            && shape.r <= WINDOW_MAX_RS
            && shape.s <= WINDOW_MAX_RS;
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
                Window { th, tw, pr: th + shape.r - 1, pc: tw + shape.s - 1, tiles_h, tiles_w, mode: shape.padding_mode }
            })
            .min_by_key(|w| (w.tiles_h * w.tiles_w, std::cmp::Reverse(w.tw)))
            // The patch array holds the largest window's patch (`patch_capacity`).
            .filter(|w| w.pr * w.pc <= patch_capacity(v))
    }

    /// Workgroups along the pixels: every image's tiles.
    pub(super) fn tiles(&self, shape: &ConvShape) -> u64 {
        shape.n as u64 * self.tiles_h * self.tiles_w
    }

    /// The kernel's width S (the patch is TW + S - 1 pixels wide).
    pub(super) fn s(&self) -> u32 {
        self.pc - self.tw + 1
    }

    /// Output pixels computed per pixel stored (tile padding at the image's edges).
    pub(super) fn waste(&self, shape: &ConvShape) -> f64 {
        (self.tiles_h * self.th as u64 * self.tiles_w * self.tw as u64) as f64 / (shape.oh() as u64 * shape.ow() as u64) as f64
    }
}

/// Layout 3's set-up: the tile's image and first output row and column, the patch's
/// geometry, and where each of this subgroup's 16-pixel row blocks starts in the patch.
pub(super) fn window_setup(v: &Coop, w: &Window) -> String {
    let mut s = String::new();
    writeln!(s, "    // Window tiles: {} x {} output pixels of one image, a {} x {} patch of x per step's channels.", w.th, w.tw, w.pr, w.pc).unwrap();
    writeln!(s, "    const TW: i32 = {};\n    const PC: i32 = {};", w.tw, w.pc).unwrap();
    // Tile counts from the output's size, not literals: a size-generic module (`generic`)
    // reads that size at run time.
    writeln!(s, "    const TILES_H: i32 = (OH + {th} - 1) / {th};\n    const TILES_W: i32 = (OW + TW - 1) / TW;", th = w.th).unwrap();
    writeln!(s, "    const PATCH_CHUNKS: i32 = {};  // 8-channel chunks of the patch", w.pr * w.pc * v.bk / 8).unwrap();
    let taps = v.taps_per_step(w.s());
    if taps == 1 {
        s.push_str("    const NSTEPS: i32 = CP / BK * R * S;        // channel blocks x (r, s)\n");
    } else {
        writeln!(s, "    const TAPS: i32 = {taps};                   // kernel taps per step").unwrap();
        s.push_str("    const SPB: i32 = R * S / TAPS;              // steps per channel block\n");
        s.push_str("    const NSTEPS: i32 = CP / BK * SPB;\n");
    }
    if v.splits > 1 {
        // Split-K: each part takes a run of channel blocks, all of each block's steps.
        if taps == 1 {
            s.push_str("    const SPB: i32 = R * S;                     // steps per channel block\n");
        }
        s.push_str("    const BPS: i32 = (CP / BK + i32(SPLITS) - 1) / i32(SPLITS);  // channel blocks per part\n");
        s.push_str("    let t_begin = sp * BPS * SPB;\n    let t_end = min(t_begin + BPS * SPB, NSTEPS);\n");
    }
    writeln!(s, "    let img = i32(m_block) / (TILES_H * TILES_W);").unwrap();
    writeln!(s, "    let oh0 = (i32(m_block) / TILES_W) % TILES_H * {};", w.th).unwrap();
    writeln!(s, "    let ow0 = i32(m_block) % TILES_W * TW;").unwrap();
    for i in 0..v.tm() {
        writeln!(s, "    let pf{i} = ((i32(wm) + {o}) / TW) * PC + (i32(wm) + {o}) % TW;", o = i * 16).unwrap();
    }
    s
}

/// The load of patch chunk `q` (an expression) of channel block `c0` into `reg`: outside
/// the image zeros or what `mode` maps there, zeros past the patch.
fn patch_load(s: &mut String, ind: &str, reg: &str, q: &str, c0: &str, x: &PatchSource, whole: bool, mode: PaddingMode) {
    let pad = PadIndex(mode);
    writeln!(s, "{ind}{{").unwrap();
    writeln!(s, "{ind}    let q = {q};").unwrap();
    writeln!(s, "{ind}    let pix = q / (BK / 8);").unwrap();
    writeln!(s, "{ind}    let cc = 8 * (q % (BK / 8));").unwrap();
    writeln!(s, "{ind}    let ih = {};", pad.row("oh0 - PH + pix / PC")).unwrap();
    writeln!(s, "{ind}    let iw = {};", pad.col("ow0 - PW + pix % PC")).unwrap();
    let past = if whole { "" } else { " && q < PATCH_CHUNKS" };
    writeln!(s, "{ind}    let ok = {} && {}{past};", pad.row_ok("ih"), pad.col_ok("iw")).unwrap();
    match x {
        PatchSource::Packed(x_buf) => {
            writeln!(s, "{ind}    {reg} = select(vec4<u32>(0u), {x_buf}[select(0u, u32(((img * H + ih) * W + iw) * CHP + {c0} + cc) >> 3u, ok)], ok);").unwrap();
        }
        PatchSource::Elements(layout) => {
            // Eight channels of one pixel: neighbours in NHWC, H * W apart in NCHW.
            let (at, step) = match layout {
                Layout::Nhwc => ("((img * H + ih) * W + iw) * CH + c", "1"),
                Layout::Nchw => ("((img * CH + c) * H + ih) * W + iw", "H * W"),
            };
            writeln!(s, "{ind}    let c = {c0} + cc;").unwrap();
            writeln!(s, "{ind}    let e = select(0, {at}, ok);").unwrap();
            let term = |j: u32| format!("x_at(e + {j} * {step})");
            writeln!(s, "{ind}    let lo = vec4<f32>({}, {}, {}, {}) * sx;", term(0), term(1), term(2), term(3)).unwrap();
            writeln!(s, "{ind}    let hi = vec4<f32>({}, {}, {}, {}) * sx;", term(4), term(5), term(6), term(7)).unwrap();
            writeln!(s, "{ind}    {reg} = select(vec4<u32>(0u), vec4<u32>(pack2x16float(lo.xy), pack2x16float(lo.zw), pack2x16float(hi.xy), pack2x16float(hi.zw)), ok);").unwrap();
        }
    }
    writeln!(s, "{ind}}}").unwrap();
}

/// Where a window tile's patch comes from: float16 NHWC data (or a packed copy) as 16-byte
/// chunks of the named binding, or x read in place one element at a time (float32 data in
/// either layout, float16 NCHW), scaled and packed while loaded.
pub(super) enum PatchSource<'a> {
    Packed(&'a str),
    Elements(Layout),
}

/// The store of patch chunk `q` from `reg` into the staged patch.
fn patch_store(s: &mut String, ind: &str, reg: &str, q: &str, whole: bool) {
    let guard = if whole { String::new() } else { format!("if ({q} < PATCH_CHUNKS) ") };
    writeln!(s, "{ind}{guard}{{").unwrap();
    writeln!(s, "{ind}    let q = {q};").unwrap();
    writeln!(s, "{ind}    let at = (u32(q / (BK / 8)) * LDA + u32(8 * (q % (BK / 8)))) / 4u;").unwrap();
    unpack_at(s, &format!("{ind}    "), "a_hi", reg);
    writeln!(s, "{ind}}}").unwrap();
}

/// Stages channel block `c0`'s patch: each invocation loads all its chunks, then stores them.
fn stage_patch(s: &mut String, v: &Coop, w: &Window, x: &PatchSource) {
    let t = v.threads();
    let chunks = w.pr * w.pc * v.bk / 8;
    let per = chunks.div_ceil(t);
    let whole = |i: u32| (i + 1) * t <= chunks;
    for i in 0..per {
        writeln!(s, "            var pp{i} = vec4<u32>(0u);").unwrap();
    }
    for i in 0..per {
        patch_load(s, "            ", &format!("pp{i}"), &format!("i32(lid) + {}", i * t), "c0", x, whole(i), w.mode);
    }
    for i in 0..per {
        patch_store(s, "            ", &format!("pp{i}"), &format!("i32(lid) + {}", i * t), whole(i));
    }
}

/// Layout 3's steps, over channel blocks and, within each, the kernel's (r, s): at a block's
/// first step the patch is staged (zeros outside the image), then every step stages its
/// weights and multiplies the patch read at the (r, s) offset, as the other layouts do.
/// Each invocation issues all its patch loads before it stores any: on an H200 that took
/// EDSR 0.468 -> 0.411 ms and the other 3x3 layers 3-12% against a load-store loop, and
/// loading the next channel block's patch during this block's steps gained 0-3% more on
/// three layers and lost up to 19% on others.
/// `live`: the steps skip the taps (kernel rows) the workgroup's phase never reaches
/// (`taps`): the patch is staged at a block's first live step.
pub(super) fn window_steps(v: &Coop, w: &Window, stage_b: &str, fetch_b: &str, x: &PatchSource, live: bool) -> String {
    let taps = v.taps_per_step(w.s());
    if taps > 1 {
        return window_row_steps(v, w, stage_b, fetch_b, x, taps, live);
    }
    let first = if live { "first_live" } else { "0" };
    let mut s = step_loop(v, live, false);
    s.push_str("        let rs = t % (R * S);\n");
    s.push_str("        // Everyone is done reading the staged tiles of the previous step.\n");
    s.push_str("        workgroupBarrier();\n");
    writeln!(s, "        if (rs == {first}) {{").unwrap();
    s.push_str("            let c0 = (t / (R * S)) * BK;\n");
    stage_patch(&mut s, v, w, x);
    s.push_str("        }\n");
    s.push_str(stage_b);
    s.push_str("        workgroupBarrier();\n");
    s.push_str("        // The next step's weights: channel block, then (r, s), as w's copy is ordered.\n");
    writeln!(s, "        k_next = {};", window_weights(&next_step(v, live, false), false)).unwrap();
    s.push_str(fetch_b);
    s.push_str("        let tap = (rs / S) * PC + rs % S;\n");
    s.push_str(&inner_product(v, None));
    s.push_str("    }\n");
    s
}

/// Layout 4's steps, `taps` kernel taps (a kernel row) per step: each step stages the
/// weights of all of them, then multiplies the patch at each tap's offset (a third of layout
/// 3's barriers on a 3x3 kernel).
fn window_row_steps(v: &Coop, w: &Window, stage_b: &str, fetch_b: &str, x: &PatchSource, taps: u32, live: bool) -> String {
    let first = if live { "first_live" } else { "0" };
    let mut s = step_loop(v, live, true);
    s.push_str("        let st = t % SPB;\n");
    s.push_str("        workgroupBarrier();\n");
    writeln!(s, "        if (st == {first}) {{").unwrap();
    s.push_str("            let c0 = (t / SPB) * BK;\n");
    stage_patch(&mut s, v, w, x);
    s.push_str("        }\n");
    s.push_str(stage_b);
    s.push_str("        workgroupBarrier();\n");
    s.push_str("        // The next step's first tap's weights: channel block, then (r, s).\n");
    writeln!(s, "        k_next = {};", window_weights(&next_step(v, live, true), true)).unwrap();
    s.push_str(fetch_b);
    for tp in 0..taps {
        writeln!(s, "        {{").unwrap();
        writeln!(s, "        let rs = st * TAPS + {tp};").unwrap();
        s.push_str("        let tap = (rs / S) * PC + rs % S;\n");
        s.push_str(&inner_product(v, Some(tp * v.bn)));
        writeln!(s, "        }}").unwrap();
    }
    s.push_str("    }\n");
    s
}

/// The first and the end of this workgroup's steps: every step, or a split part's
/// (`window_setup`).
pub(super) fn window_bounds(v: &Coop) -> (&'static str, &'static str) {
    if v.splits > 1 { ("t_begin", "t_end") } else { ("0", "NSTEPS") }
}

/// Where step `t`'s (first tap's) weights start in w's copy: channel block, then (r, s);
/// `rows`: a step takes a kernel row (layout 4 on kernels wider than one tap).
pub(super) fn window_weights(t: &str, rows: bool) -> String {
    if rows {
        format!("(({t}) % SPB) * TAPS * CP + (({t}) / SPB) * BK")
    } else {
        format!("(({t}) % (R * S)) * CP + (({t}) / (R * S)) * BK")
    }
}

/// The step after `t`: the next, or (`live`) the next live one.
fn next_step(v: &Coop, live: bool, rows: bool) -> String {
    let (_, to) = window_bounds(v);
    if live { super::taps::next_live(v, "t + 1", to, rows) } else { "t + 1".to_string() }
}

/// The head of the step loop: every step, or a split part's; with `live`, the live ones.
fn step_loop(v: &Coop, live: bool, rows: bool) -> String {
    let (from, to) = window_bounds(v);
    if live {
        let next = super::taps::next_live(v, "t + 1", to, rows);
        format!("    for (var t: i32 = {}; t < {to}; t = {next}) {{\n", super::taps::next_live(v, from, to, rows))
    } else {
        format!("    for (var t: i32 = {from}; t < {to}; t = t + 1) {{\n")
    }
}

/// Layout 3: the staged patch's pixels for the largest window, over the tile widths it
/// may take (the patch array has this fixed size).
pub(super) fn patch_capacity(v: &Coop) -> u32 {
    WINDOW_WIDTHS
        .iter()
        .filter(|&&tw| tw <= v.bm)
        .map(|&tw| (v.bm / tw + WINDOW_MAX_RS - 1) * (tw + WINDOW_MAX_RS - 1))
        .max()
        .unwrap_or(0)
}
