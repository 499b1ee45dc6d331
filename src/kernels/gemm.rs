//! The implicit-GEMM family: M = N*OH*OW rows, K columns, reduction C/groups*R*S, gathered
//! from x directly (no im2col buffer) into double-buffered workgroup tiles.

use super::cost::{
    multiprocessor_fill, parallel_efficiency, register_occupancy, BUSY_INVOCATIONS, GATHER_LOAD, SHARED_LOAD,
};
use super::implicit::{self, View, PARTIAL, SPLIT_WORKSPACE};
use super::padding::PadIndex;
use super::{phases, Family, KernelVariant};
use crate::codegen::{epilogue_vec, render, shape_vars, store_stmt, Kernel, LANES};
use crate::error::{Error, Result};
use crate::params::{ConvShape, Layout};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    /// Workgroup tile: `bm` output pixels x `bn` output channels, reduction step `bk`.
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    /// Register tile per invocation: `tm` x `tn` outputs, written out as scalars.
    pub tm: u32,
    pub tn: u32,
    /// Split-K: workgroups sharing one output tile's reduction, each writing a partial
    /// tile to workspace; a second pass adds them in a fixed order (results do not change
    /// from run to run). 1: no split.
    pub splits: u32,
}

const TILES: [(u32, u32); 8] = [(32, 32), (64, 32), (32, 64), (64, 64), (128, 32), (128, 64), (128, 128), (256, 64)];
const BK: [u32; 3] = [8, 16, 32];
const THREAD: [(u32, u32); 4] = [(4, 4), (8, 4), (4, 8), (8, 8)];
const SPLITS: [u32; 3] = [1, 4, 16];

/// A barrier, per multiply-add of the step it closes. Lower than the shared figure: the
/// H100's fastest GEMM tiles take 8-deep steps, twice the barriers of 16-deep ones.
const GEMM_BARRIER: f64 = 5.0;
/// Registers an invocation holds besides its accumulators, operands and staged loads
/// (indices, addresses, loop state): a guess; only the order of costs matters.
const BASE_REGISTERS: f64 = 16.0;

/// Per output of a GEMM tile: pixel coordinates, accumulator set-up and the store, paid
/// once per output however short the reduction; it is what makes GEMM lose on tiny C.
const SETUP: f64 = 32.0;

impl Gemm {
    /// Whether y is stored four outputs at a time: NCHW channel planes of whole vec4s (four
    /// neighbouring pixels of a register tile's rows are four neighbouring values of one
    /// plane), stored in place by this pass (no split-K partials, no moved outputs).
    fn stores_vec4(&self, shape: &ConvShape) -> bool {
        self.splits == 1 && !shape.moves_y() && shape.layout == Layout::Nchw && (shape.oh() * shape.ow()) % 4 == 0
    }

    /// How this variant reads x in rows of the kernel window on `shape`, if it does: its steps
    /// hold whole rows (`bk` a multiple of S) and every invocation copies the same number.
    fn rows(&self, shape: &ConvShape) -> Option<Rows> {
        // A padding mode other than zeros reads the edges' columns from elsewhere in the row.
        if !shape.padding_mode.is_zeros() {
            return None;
        }
        let rows = Rows::of(shape)?;
        let slots = (self.bm / 4) * (self.bk / shape.s);
        (self.bk % shape.s == 0 && slots % self.invocations() == 0).then_some(rows)
    }

    /// Row slots per invocation and step, where x is read in rows: four pixels of BM by
    /// BK / S rows of the reduction.
    fn row_slots(&self, shape: &ConvShape) -> u32 {
        (self.bm / 4) * (self.bk / shape.s) / self.invocations()
    }

    /// Which of x, w and y this variant moves four values at a time on `shape` (a side of
    /// loads only with `whole_vec4_slots`).
    fn vec4_sides(&self, shape: &ConvShape) -> (bool, bool, bool) {
        (
            loads_x_vec4(shape) && shape.padding_mode.is_zeros() && whole_vec4_slots(self.bm * self.bk, self.invocations()),
            loads_w_vec4(shape) && whole_vec4_slots(self.bn * self.bk, self.invocations()),
            self.stores_vec4(shape),
        )
    }

    /// Registers per invocation: accumulators, one step's operands, and the next step's
    /// loads held in flight (counted twice: loaded, then stored to workgroup memory).
    fn registers(&self) -> f64 {
        let staged = (self.bm + self.bn) * self.bk / self.invocations();
        (self.tm * self.tn + self.tm + self.tn + 2 * staged) as f64 + BASE_REGISTERS
    }
}

impl Family for Gemm {
    const NAME: &'static str = "gemm";
    const TEMPLATE: &'static str = include_str!("../../shaders/gemm.wgsl");

    fn space() -> Vec<Self> {
        let mut out = Vec::new();
        for &(bm, bn) in &TILES {
            for &bk in &BK {
                for &(tm, tn) in &THREAD {
                    for &splits in &SPLITS {
                        let g = Gemm { bm, bn, bk, tm, tn, splits };
                        if g.well_formed() {
                            out.push(g);
                        }
                    }
                }
            }
        }
        out
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [bm, bn, bk, tm, tn] => Some(Gemm { bm, bn, bk, tm, tn, splits: 1 }),
            [bm, bn, bk, tm, tn, splits] => Some(Gemm { bm, bn, bk, tm, tn, splits }),
            _ => None,
        }
    }
}

impl KernelVariant for Gemm {
    fn family(&self) -> &'static str {
        Self::NAME
    }
    fn padding_modes(&self) -> bool {
        true
    }

    fn name(&self) -> String {
        let name = format!("gemm_b{}x{}x{}_t{}x{}", self.bm, self.bn, self.bk, self.tm, self.tn);
        // Unsplit variants keep the names they had before split-K, so caches stay valid.
        if self.splits == 1 { name } else { format!("{name}_k{}", self.splits) }
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("bm", self.bm), ("bn", self.bn), ("bk", self.bk), ("tm", self.tm), ("tn", self.tn), ("splits", self.splits)]
    }

    fn well_formed(&self) -> bool {
        TILES.contains(&(self.bm, self.bn))
            && BK.contains(&self.bk)
            && THREAD.contains(&(self.tm, self.tn))
            && self.bm % self.tm == 0
            && self.bn % self.tn == 0
            // Each invocation loads whole rows of the staged tiles.
            && (self.bm * self.bk) % self.invocations() == 0
            && (self.bn * self.bk) % self.invocations() == 0
            && (64..=256).contains(&self.invocations())
            && SPLITS.contains(&self.splits)
            // Splits only on the mid-size tiles with 16-deep steps: enough to fill a GPU
            // without multiplying the variant space.
            && (self.splits == 1 || (self.bk == 16 && self.bm * self.bn <= 64 * 64))
    }

    fn invocations(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    fn workgroup_bytes(&self) -> u32 {
        // Two stages of the A and B tiles (double buffering); at most, with A's rows padded
        // by one vec4 (1x1 NHWC problems).
        2 * 4 * self.bk * (self.bm + 4 + self.bn)
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        let view = View::of(shape);
        // A split needs at least two steps of reduction per part, and few enough tiles
        // that the GPU would otherwise idle.
        let split_ok = self.splits == 1
            || (view.red >= 2 * (self.splits * self.bk) as u64
                && implicit::partial_bytes(shape, self.splits) <= SPLIT_WORKSPACE
                && view.grid(self.bm, self.bn).2 * (self.invocations() as u64) < 4 * BUSY_INVOCATIONS as u64);
        split_ok && view.tiles_suit((self.bm, self.bn, self.bk), (32, 32, 8))
    }

    fn cost(&self, shape: &ConvShape) -> f64 {
        let view = View::of(shape);
        let (_, _, tiles) = view.grid(self.bm, self.bn);
        let (tm, tn) = (self.tm as f64, self.tn as f64);
        // A side read as vec4s computes one address and issues one load per four values.
        let (vec_x, vec_w, _) = self.vec4_sides(shape);
        let gather = |vec: bool| if vec { 0.25 } else { 1.0 };
        // Rows: `count` vec4 loads per four outputs' S taps.
        let x_gather = match self.rows(shape) {
            Some(rows) => rows.count as f64 / (4 * shape.s) as f64,
            None => gather(vec_x),
        };
        // Residency hides the x gathers' latency: the fewer load instructions a step issues
        // for x, the less it matters (occupancy^(0.5 * sqrt(g)) for g load instructions per
        // value of x: as before for pixel-wise gathers, g = 1). On the H200, layers whose x
        // is read as vec4s ran fastest on larger register tiles, which the plain square root
        // of the occupancy ranked 15th to 26th in the family; this ranks them 3rd to 7th. An
        // exponent of 0.5 * g^0.75 ranked them 1st to 5th but tuned the 1x1 stride-2
        // projection slower (its fastest tile then fell within 1% of a cheaper one's cost and
        // waited as a near-twin): benches/results/HISTORY.md, "Rows of the kernel window in the gemm family".
        let per_fma = 1.0
            + SHARED_LOAD * (tm + tn) / (tm * tn)
            + GATHER_LOAD * (gather(vec_w) / self.bm as f64 + x_gather / self.bn as f64)
            + GEMM_BARRIER * 2.0 / (self.bk as f64 * tm * tn)
            + SETUP / view.red.max(1) as f64;
        // Each split writes its partial tile and the finishing pass reads them all back.
        let partials = if self.splits > 1 { PARTIAL * (self.splits as u64 * shape.y_len()) as f64 } else { 0.0 };
        let workgroups = tiles * self.splits as u64;
        view.padded_fmas(self.bm, self.bn, self.bk * self.splits) * per_fma
            / parallel_efficiency(workgroups * self.invocations() as u64)
            / register_occupancy(self.registers()).powf(0.5 * x_gather.sqrt())
            / multiprocessor_fill(workgroups)
            + partials
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape)
    }
}

/// Whether a staged step of `values` is copied as vec4s: only where every one of `threads`
/// invocations copies the same number of them (with a last slot of vec4s for some invocations
/// only, `gemm_b128x64x8_t4x8` ran the stride-2 layer of the public suite in 0.44 ms where
/// scalar w loads take 0.29; wgemm's 7x7-layer tiles lost 7-11%).
pub(crate) fn whole_vec4_slots(values: u32, threads: u32) -> bool {
    (values / 4) % threads == 0
}

/// Whether w's rows (one output channel's reduction, contiguous) are read four terms at a
/// time: rows of whole vec4s.
fn loads_w_vec4(shape: &ConvShape) -> bool {
    View::of(shape).red % 4 == 0
}

/// Whether x is read four output pixels at a time: a 1x1 NCHW problem at stride 1 without
/// padding, whose channel planes are whole vec4s, so four neighbouring output pixels read
/// four neighbouring values of one plane.
fn loads_x_vec4(shape: &ConvShape) -> bool {
    shape.layout == Layout::Nchw
        && (shape.r, shape.s) == (1, 1)
        && shape.stride == (1, 1)
        && shape.pad == (0, 0)
        && shape.pad_end == (0, 0)
        && (shape.h * shape.w) % 4 == 0
}

/// x read in rows of the kernel window (NCHW): a load slot is four neighbouring output
/// pixels of one output row and one (channel, kernel row) of the reduction; the S taps of
/// those four pixels lie in one stretch of an input row, read as `count` aligned vec4s from
/// vec4 `first` of the quad's first column (ow * SW, a multiple of 4), and staged as S rows
/// of the A tile, where pixel-wise gathers load each value alone at addresses SW apart: a 1x1
/// kernel at stride 2 takes two vec4s per four pixels, 2x2 at stride 2 two for eight values,
/// a 4x4 patch at stride 4 four for sixteen. The family's steps (8, 16, 32 terms) hold whole
/// rows of 1, 2, 4 or 8 taps; 3-tap rows keep the gathers (steps of 12, 24 and 48 terms ran
/// the 3x3 stride-2 layer of the public suite no faster than its 8-deep gathers: benches/results/HISTORY.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rows {
    first: i64,
    count: u32,
}

impl Rows {
    /// Where x's rows are whole vec4s and output rows whole quads (so a quad's pixels share
    /// a row and its stretch starts on a vec4), and the stretch is at most twice the values
    /// used. Not where the 1x1 path reads four pixels of a plane at once already.
    fn of(shape: &ConvShape) -> Option<Rows> {
        if shape.layout != Layout::Nchw || loads_x_vec4(shape) || shape.w % 4 != 0 || shape.ow() % 4 != 0 {
            return None;
        }
        let (sw, dw, pw) = (shape.stride.1 as i64, shape.dilation.1 as i64, shape.pad.1 as i64);
        let (lo, hi) = (-pw, 3 * sw + (shape.s as i64 - 1) * dw - pw);
        let first = lo.div_euclid(4);
        let count = (hi.div_euclid(4) - first + 1) as u32;
        (count <= 2 * shape.s).then_some(Rows { first, count })
    }

    /// The loaded vec4 and lane holding pixel `j` of the quad at tap `tap`.
    fn lane(&self, shape: &ConvShape, j: u32, tap: u32) -> (i64, &'static str) {
        let at = (j * shape.stride.1 + tap * shape.dilation.1) as i64 - shape.pad.1 as i64 - 4 * self.first;
        (at / 4, LANES[(at % 4) as usize])
    }
}

/// The A side's WGSL read in rows (`Rows`): per slot its quad and row decoded once, each
/// step's `count` vec4 loads, and the S staged rows they fill.
fn write_row_slots(gm: &Gemm, shape: &ConvShape, rows: Rows, (setup, fetch, stage_store): (&mut String, &mut String, &mut String)) {
    let threads = gm.invocations();
    writeln!(setup, "    // x read in rows of the kernel window: {} vec4s per four pixels' {} taps.", rows.count, shape.s).unwrap();
    for i in 0..gm.row_slots(shape) {
        let off = i * threads;
        writeln!(setup, "    let aq{i} = (lid + {off}) % (BM / 4);\n    let ar{i} = (lid + {off}) / (BM / 4);").unwrap();
        implicit::write_pixel_position(setup, &i.to_string(), &format!("m0 + 4 * aq{i}"));
        writeln!(setup, "    let acol{i} = aiw{i} + PW;").unwrap();
        writeln!(setup, "    let arow{i} = (apix{i} / OHW) * XSN + x_group + acol{i};").unwrap();
        for v in 0..rows.count {
            let col = 4 * (rows.first + v as i64);
            writeln!(setup, "    let vok{i}_{v} = acol{i} + {col} >= 0 && acol{i} + {col} < W;").unwrap();
            writeln!(setup, "    var pa{i}_{v}: vec4<f32>;").unwrap();
        }
        // (channel, kernel row) of the slot's row of the reduction, advanced by carries.
        writeln!(setup, "    var rc{i}: i32 = (k_begin / S + ar{i}) / R;\n    var rr{i}: i32 = (k_begin / S + ar{i}) % R;").unwrap();
        writeln!(fetch, "    {{").unwrap();
        writeln!(fetch, "        let ih = aih{i} + rr{i} * DH;").unwrap();
        writeln!(fetch, "        let ok = aok{i} && rc{i} < CG && ih >= 0 && ih < H;").unwrap();
        writeln!(fetch, "        let at = (arow{i} + rc{i} * XSC + ih * XSH) / 4 + {};", rows.first).unwrap();
        for v in 0..rows.count {
            writeln!(
                fetch,
                "        pa{i}_{v} = select(vec4<f32>(pad0), vec4<f32>(x[select(0, at + {v}, ok && vok{i}_{v})]), ok && vok{i}_{v});"
            )
            .unwrap();
        }
        writeln!(fetch, "    }}").unwrap();
        for tap in 0..shape.s {
            let lanes: Vec<String> = (0..4)
                .map(|j| {
                    let (v, lane) = rows.lane(shape, j, tap);
                    format!("pa{i}_{v}.{lane}")
                })
                .collect();
            writeln!(
                stage_store,
                "    a_tile[stage * A_STAGE + (ar{i} * S + {tap}) * A_ROW + aq{i}] = vec4<f32>({});",
                lanes.join(", ")
            )
            .unwrap();
        }
    }
}

/// Moves row slots on by a step's `rows` rows of the reduction (channel, kernel row).
fn write_row_advance(s: &mut String, slots: u32, rows: u32, shape: &ConvShape) {
    let (ci, ri) = (rows / shape.r, rows % shape.r);
    for i in 0..slots {
        writeln!(s, "        rr{i} = rr{i} + {ri};\n        rc{i} = rc{i} + {ci};").unwrap();
        writeln!(s, "        if (rr{i} >= R) {{ rr{i} = rr{i} - R; rc{i} = rc{i} + 1; }}").unwrap();
    }
}

fn generate(gm: &Gemm, shape: &ConvShape) -> Result<Kernel> {
    if gm.splits > 1 && implicit::partial_bytes(shape, gm.splits) > 4 * SPLIT_WORKSPACE {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: its {} partial outputs would take {} bytes of workspace",
            gm.name(),
            gm.splits,
            implicit::partial_bytes(shape, gm.splits)
        )));
    }
    let threads = gm.invocations();
    let (tx, ty) = (gm.bm / gm.tm, gm.bn / gm.tn);
    let view = View::of(shape);
    let (_, _, blocks) = view.grid(gm.bm, gm.bn);
    let a_slots = gm.bm * gm.bk / threads;
    let b_slots = gm.bn * gm.bk / threads;

    let nhwc = shape.layout == Layout::Nhwc;
    // A slots: consecutive invocations take consecutive pixels (coalesced gathers from NCHW
    // x, and conflict-free scalar stores into the staged tile); for a 1x1 NHWC problem,
    // where a pixel's channels are contiguous and pixels C elements apart, consecutive
    // reduction indices of one pixel instead.
    let channel_lanes = nhwc && shape.r * shape.s == 1;
    // Their stores into the staged tile would hit one bank per pixel BK ways over (0.172 ->
    // 0.152 ms with the padding on 32,256,56,56 -> 64 NHWC, H100); NCHW tiles, stored
    // along pixels, ran 3% slower padded and keep whole rows.
    let a_row = gm.bm / 4 + u32::from(channel_lanes);
    let (vec_x, vec_w, vec_y) = gm.vec4_sides(shape);
    let mut a_setup = String::new();
    let mut fetch = String::new();
    let mut stage_store = String::new();
    let rows = gm.rows(shape);
    if let Some(rows) = rows {
        write_row_slots(gm, shape, rows, (&mut a_setup, &mut fetch, &mut stage_store));
    } else if vec_x {
        // A slots of four neighbouring pixels of one channel plane (M is whole vec4s: every
        // image's plane is), their reduction index (the channel) k_next + ak.
        let quads = gm.bm * gm.bk / 4;
        for i in 0..quads / threads {
            let off = i * threads;
            writeln!(a_setup, "    let aq{i} = (lid + {off}) % (BM / 4);\n    let ak{i} = (lid + {off}) / (BM / 4);").unwrap();
            implicit::write_pixel(&mut a_setup, &i.to_string(), &format!("m0 + 4 * aq{i}"), ("XSN", "XSH", " * XSW"));
            writeln!(a_setup, "    var pa{i}: vec4<f32>;").unwrap();
            writeln!(
                fetch,
                "    {{\n        let kc = k_next + ak{i};\n        let ok = aok{i} && kc < CG;\n        \
                 pa{i} = select(vec4<f32>(pad0), vec4<f32>(x[select(0, abase{i} + kc * XSC, ok) / 4]), ok);\n    }}"
            )
            .unwrap();
            writeln!(stage_store, "    a_tile[stage * A_STAGE + ak{i} * A_ROW + aq{i}] = pa{i};").unwrap();
        }
    } else {
        for i in 0..a_slots {
            let off = i * threads;
            let s = &mut a_setup;
            if channel_lanes {
                writeln!(s, "    let am{i} = (lid + {off}) / BK;").unwrap();
                writeln!(s, "    let ak{i} = (lid + {off}) % BK;").unwrap();
            } else {
                writeln!(s, "    let am{i} = (lid + {off}) % BM;").unwrap();
                writeln!(s, "    let ak{i} = (lid + {off}) / BM;").unwrap();
            }
            implicit::write_pixel(s, &i.to_string(), &format!("m0 + am{i}"), ("XSN", "XSH", " * XSW"));
            implicit::write_reduction_index(s, i, &format!("ak{i} + k_begin"));
            writeln!(s, "    var pa{i}: f32;").unwrap();
        }
        for i in 0..a_slots {
            let s = &mut fetch;
            writeln!(s, "    {{").unwrap();
            writeln!(s, "        let ih = aih{i} + kh{i} * DH;").unwrap();
            writeln!(s, "        let iw = aiw{i} + kw{i} * DW;").unwrap();
            if shape.padding_mode.is_zeros() {
                writeln!(s, "        let ok = aok{i} && kc{i} < CG{};", implicit::window_check(shape)).unwrap();
                writeln!(s, "        let idx = abase{i} + kc{i} * XSC + kh{i} * DH * XSH + kw{i} * DW * XSW;").unwrap();
            } else {
                // abase includes the window's first row and column; the mode's replace them.
                let pad = PadIndex(shape.padding_mode);
                writeln!(s, "        let ok = aok{i} && kc{i} < CG;").unwrap();
                writeln!(
                    s,
                    "        let idx = abase{i} - aih{i} * XSH - aiw{i} * XSW + kc{i} * XSC + {} * XSH + {} * XSW;",
                    pad.row("ih"),
                    pad.col("iw")
                )
                .unwrap();
            }
            writeln!(s, "        pa{i} = select(pad0, f32(x[select(0, idx, ok)]), ok);").unwrap();
            writeln!(s, "    }}").unwrap();
            writeln!(
                stage_store,
                "    a_tile[stage * A_STAGE + ak{i} * A_ROW + am{i} / 4][am{i} % 4] = pa{i};"
            )
            .unwrap();
        }
    }
    // B slots: consecutive invocations take consecutive reduction indices of one weight
    // row, which is contiguous in w (four at a time where its rows are whole vec4s).
    let mut b_setup = String::new();
    let (b_width, b_rounds) = if vec_w { (gm.bk / 4, gm.bn * gm.bk / 4 / threads) } else { (gm.bk, b_slots) };
    for i in 0..b_rounds {
        let off = i * threads;
        let s = &mut b_setup;
        writeln!(s, "    let bk{i} = (lid + {off}) % {b_width};").unwrap();
        writeln!(s, "    let bn{i} = (lid + {off}) / {b_width};").unwrap();
        writeln!(s, "    let bok{i} = n0 + bn{i} < KG;").unwrap();
        writeln!(s, "    let bbase{i} = (g * KG + min(n0 + bn{i}, KG - 1)) * KR;").unwrap();
        writeln!(s, "    var pb{i}: {};", if vec_w { "vec4<f32>" } else { "f32" }).unwrap();
        let b_at = |k: &str| format!("b_tile[stage * B_STAGE + ({k}) * (BN / 4) + bn{i} / 4][bn{i} % 4]");
        if vec_w {
            writeln!(
                fetch,
                "    {{\n        let kr = k_next + 4 * bk{i};\n        let ok = bok{i} && kr < KR;\n        \
                 pb{i} = select(vec4<f32>(0.0), vec4<f32>(w[select(0, bbase{i} + kr, ok) / 4]), ok);\n    }}"
            )
            .unwrap();
            let stores: Vec<String> =
                LANES.iter().enumerate().map(|(e, l)| format!("{} = pb{i}.{l};", b_at(&format!("4 * bk{i} + {e}")))).collect();
            writeln!(stage_store, "    {}", stores.join(" ")).unwrap();
        } else {
            writeln!(
                fetch,
                "    {{\n        let kr = k_next + bk{i};\n        let ok = bok{i} && kr < KR;\n        \
                 pb{i} = select(0.0, f32(w[select(0, bbase{i} + kr, ok)]), ok);\n    }}"
            )
            .unwrap();
            writeln!(stage_store, "    {} = pb{i};", b_at(&format!("bk{i}"))).unwrap();
        }
    }
    let mut acc = String::new();
    write_accumulators(&mut acc, gm.tm, gm.tn);
    let mut advance = String::new();
    match rows {
        Some(_) => write_row_advance(&mut advance, gm.row_slots(shape), gm.bk / shape.s, shape),
        None => implicit::write_reduction_advance(&mut advance, if vec_x { 0 } else { a_slots }, gm.bk, shape, "    "),
    }
    // The reduction over one staged step, written out.
    let mut inner = String::new();
    write_inner(&mut inner, gm.bk, (gm.tm, gm.tn), (tx, ty), a_row, gm.bn);
    // Register (i, j) holds pixel m0 + 4*TX*(i/4) + 4*tx + i%4 and channel likewise.
    let mut store = String::new();
    for i in 0..gm.tm {
        let s = &mut store;
        writeln!(s, "    let om{i} = m0 + {} + 4 * tx;", (i / 4) * 4 * tx + i % 4).unwrap();
        writeln!(s, "    let ym{i} = (om{i} / OHW) * YSN + (om{i} % OHW) * YSP;").unwrap();
    }
    for j in 0..gm.tn {
        let s = &mut store;
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let n = n0 + {} + 4 * ty;", (j / 4) * 4 * ty + j % 4).unwrap();
        writeln!(s, "        if (n < KG) {{").unwrap();
        writeln!(s, "            let k = g * KG + n;").unwrap();
        if gm.splits > 1 {
            // A partial sum: the finishing pass applies the epilogue.
            for i in 0..gm.tm {
                writeln!(s, "            if (om{i} < M) {{ ws[sp * YLEN + ym{i} + k * YSK] = acc{i}_{j}; }}").unwrap();
            }
        } else if vec_y {
            // Rows 4q..4q+3: four neighbouring pixels of one image (its plane is whole vec4s).
            for q in 0..gm.tm / 4 {
                let i = 4 * q;
                let values: [String; 4] = std::array::from_fn(|e| format!("acc{}_{j}", i + e as u32));
                let quad = epilogue_vec(&values, &["k", "k", "k", "k"].map(String::from), "yi");
                writeln!(s, "            if (om{i} < M) {{ let yi = ym{i} + k * YSK; y[yi / 4] = {quad}; }}").unwrap();
            }
        } else {
            for i in 0..gm.tm {
                let put = store_stmt(shape, &format!("ym{i} + k * YSK"), &phases::flagged(shape, &format!("acc{i}_{j}")), "k");
                writeln!(s, "            if (om{i} < M) {{ {put} }}").unwrap();
            }
        }
        writeln!(s, "        }}").unwrap();
        writeln!(s, "    }}").unwrap();
    }
    if gm.splits == 1 {
        // (Split-K partial sums are checked once summed, in `finish`.)
        store += &phases::redo(shape, "resum_bad", || {
            let put = store_stmt(shape, "at", "resum_sum(at, k)", "k");
            format!(
                "        for (var i = 0; i < {tm}; i = i + 1) {{
            let om = m0 + (i / 4) * {xs} + i % 4 + 4 * tx;
            for (var j = 0; j < {tn}; j = j + 1) {{
                let n = n0 + (j / 4) * {ys} + j % 4 + 4 * ty;
                if (om < M && n < KG) {{
                    let k = g * KG + n;
                    let at = (om / OHW) * YSN + (om % OHW) * YSP + k * YSK;
                    {put}
                }}
            }}
        }}
",
                tm = gm.tm,
                tn = gm.tn,
                xs = 4 * tx,
                ys = 4 * ty,
            )
        });
    }

    let mut vars = shape_vars(shape, &gm.name());
    vars.extend(view.grid_vars(gm.bm, gm.bn));
    // Each split's share of the reduction, whole steps, so only the last one has a tail.
    let ks = implicit::split_share(view.red, gm.splits, gm.bk);
    let finish_groups = shape.y_len().div_ceil(256);
    let elem = |vec: bool| if vec { "vec4<DT>" } else { "DT" }.to_string();
    vars.extend([
        ("X_ELEM", elem(vec_x || rows.is_some())),
        ("W_ELEM", elem(vec_w)),
        ("PAD_INDEX", PadIndex(shape.padding_mode).wgsl()),
        ("RESUM", phases::resum_wgsl(shape, &phases::element("x", vec_x || rows.is_some()), &phases::element("w", vec_w))),
        ("FINISHED", phases::resummed(shape, "sum", "i", "(i / YSK) % K")),
        ("Y_ELEM", elem(vec_y)),
        // `finish` (split-K only, never with vec4 stores) stays valid WGSL either way.
        ("Y_AT", if vec_y { "y[yi / 4][yi % 4]" } else { "y[yi]" }.to_string()),
        ("SPLITS", gm.splits.to_string()),
        ("KS", ks.to_string()),
        ("YLEN", shape.y_len().to_string()),
        ("BM", gm.bm.to_string()),
        ("BN", gm.bn.to_string()),
        ("BK", gm.bk.to_string()),
        ("TM", gm.tm.to_string()),
        ("TN", gm.tn.to_string()),
        ("THREADS", threads.to_string()),
        // Neighbouring invocations hold neighbouring pixels of the output tile, or in NHWC,
        // where a pixel's channels are contiguous in y, neighbouring channels.
        (
            "LANES",
            if nhwc { "    let ty = lid % TY;\n    let tx = lid / TY;" } else { "    let tx = lid % TX;\n    let ty = lid / TX;" }
                .to_string(),
        ),
        ("TX", tx.to_string()),
        ("TY", ty.to_string()),
        ("A_ROW", a_row.to_string()),
        ("A_TILE", (2 * gm.bk * a_row).to_string()),
        ("B_TILE", (2 * gm.bk * gm.bn / 4).to_string()),
        ("A_SETUP", a_setup),
        ("B_SETUP", b_setup),
        ("ACC_DECL", acc),
        ("FETCH", fetch),
        ("ADVANCE", advance),
        ("STAGE_STORE", stage_store),
        ("INNER", inner),
        ("STORE", store),
    ]);
    let mut kernel = Kernel::plain(render(Gemm::TEMPLATE, &vars)?, blocks * gm.splits as u64);
    if gm.splits > 1 {
        kernel.workspace = [shape.y_len() * gm.splits as u64 * 4, 0];
        kernel.finish = Some(finish_groups);
    }
    Ok(kernel)
}

/// The `tm` x `tn` scalar accumulators `acc{i}_{j}` of a register tile, zeroed.
pub(crate) fn write_accumulators(s: &mut String, tm: u32, tn: u32) {
    for i in 0..tm {
        for j in 0..tn {
            writeln!(s, "    var acc{i}_{j}: f32 = 0.0;").unwrap();
        }
    }
}

/// The reduction over one staged step of `bk` terms, written out (no WGSL loop indexes a
/// register): `a_tile` holds rows of `a_row` vec4s from `a_base`, `b_tile` rows of `bn / 4`
/// from `b_base`, four consecutive rows (columns) per vec4. Invocation (tx, ty) of (TX, TY) reads
/// vec4 q of a row at q * TX + tx (q * TY + ty), so register (i, j) holds row
/// 4*TX*(i/4) + 4*tx + i%4 and column 4*TY*(j/4) + 4*ty + j%4 of the tile: conflict-free
/// vec4 reads. The `gemm` family's inner loop, and the batched GEMMs of `wgemm`'s.
pub(crate) fn write_inner(s: &mut String, bk: u32, (tm, tn): (u32, u32), (tx, ty): (u32, u32), a_row: u32, bn: u32) {
    for kk in 0..bk {
        writeln!(s, "        {{").unwrap();
        for q in 0..tm / 4 {
            writeln!(s, "            let a{q} = a_tile[a_base + {} + tx];", kk * a_row + q * tx).unwrap();
        }
        for q in 0..tn / 4 {
            writeln!(s, "            let b{q} = b_tile[b_base + {} + ty];", kk * bn / 4 + q * ty).unwrap();
        }
        for i in 0..tm {
            for j in 0..tn {
                writeln!(
                    s,
                    "            acc{i}_{j} = fma(a{}.{}, b{}.{}, acc{i}_{j});",
                    i / 4,
                    LANES[(i % 4) as usize],
                    j / 4,
                    LANES[(j % 4) as usize]
                )
                .unwrap();
            }
        }
        writeln!(s, "        }}").unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::square_shape as shape;

    #[test]
    fn rows_of_the_window_take_a_few_vec4s_where_rows_are_whole() {
        let s2 = shape([32, 128, 56, 56], [128, 128, 3, 3], 2, 1);
        // Columns -1 .. 7 of the quad's first: vec4s -1, 0 and 1, twelve values used.
        assert_eq!(Rows::of(&s2), Some(Rows { first: -1, count: 3 }));
        assert_eq!(Rows::of(&shape([1, 8, 16, 16], [8, 8, 3, 3], 1, 1)), Some(Rows { first: -1, count: 3 }));
        assert_eq!(Rows::of(&shape([1, 3, 224, 224], [64, 3, 7, 7], 2, 3)), Some(Rows { first: -1, count: 4 }));
        // Rows of scalars (W 14), output rows off quads (OW 27), channels-last x, and 1x1
        // planes read four pixels at a time already.
        assert_eq!(Rows::of(&shape([1, 8, 14, 14], [8, 8, 3, 3], 1, 1)), None);
        assert_eq!(Rows::of(&shape([1, 8, 56, 56], [8, 8, 3, 3], 2, 0)), None);
        assert_eq!(Rows::of(&s2.with_layout(Layout::Nhwc)), None);
        assert_eq!(Rows::of(&shape([1, 8, 16, 16], [8, 8, 1, 1], 1, 0)), None);
        // Pixel j at tap t of the stride-2 quad: column 2j + t - 1, from vec4 -1.
        let rows = Rows::of(&s2).unwrap();
        assert_eq!(rows.lane(&s2, 0, 0), (0, "w"));
        assert_eq!(rows.lane(&s2, 3, 2), (2, "w"));
    }

    /// Every unsplit tile of the family timed by name on the H200 ("highest",
    /// `benches/results/fma/gemm_sweep_450284e_h200.txt`): where x is read as vec4s (rows of the window, or 1x1
    /// planes), the fastest ranks among the seven cheapest (15th to 26th with the occupancy's
    /// plain square root), where the default budget times it.
    #[test]
    fn the_cost_ranks_the_fastest_tile_early_where_x_is_read_as_vec4s() {
        let layers = [
            (shape([32, 256, 56, 56], [512, 256, 1, 1], 2, 0), "gemm_b128x128x8_t8x8"),
            (shape([32, 96, 56, 56], [192, 96, 2, 2], 2, 0), "gemm_b128x64x8_t8x8"),
            (shape([32, 256, 56, 56], [64, 256, 1, 1], 1, 0), "gemm_b128x64x16_t4x8"),
        ];
        for (s, fastest) in layers {
            let mut ranked: Vec<Gemm> = Gemm::space().into_iter().filter(|g| g.splits == 1 && g.suits(&s)).collect();
            ranked.sort_by(|a, b| a.cost(&s).total_cmp(&b.cost(&s)));
            let rank = ranked.iter().position(|g| g.name() == fastest).unwrap();
            assert!(rank < 7, "{}: {fastest} ranked {rank}", s.label());
        }
    }

    #[test]
    fn steps_of_whole_rows_read_them_and_rank_early() {
        // ResNet-50's 1x1 stride-2 projection: rows of one tap, every step whole.
        let proj = shape([32, 256, 56, 56], [512, 256, 1, 1], 2, 0);
        let space = Gemm::space();
        let mut ranked: Vec<&Gemm> = space.iter().filter(|g| g.suits(&proj)).collect();
        assert!(ranked.iter().filter(|g| g.rows(&proj).is_some()).count() >= 20);
        ranked.sort_by(|a, b| a.cost(&proj).total_cmp(&b.cost(&proj)));
        assert!(ranked[..5].iter().any(|g| g.rows(&proj).is_some()));
        // 3-tap rows never fit 8, 16 or 32-term steps.
        let s2 = shape([32, 128, 56, 56], [128, 128, 3, 3], 2, 1);
        assert!(space.iter().all(|g| g.rows(&s2).is_none()));
    }
}
