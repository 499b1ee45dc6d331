//! The stem family: direct convolution over a short reduction (a few input channels: the
//! first layers of image networks). Each invocation computes `tk` output channels x `tw`
//! neighbouring output columns; a workgroup's invocations share their channels, whose
//! weights are staged once in workgroup memory as vec4s of four channels per tap.
//!
//! Where `direct` loads every weight it multiplies from storage (`tk` + `tw` loads per
//! `tk` x `tw` multiply-adds), a stem invocation reads its weights four channels at a time
//! from workgroup memory at the same address as its whole subgroup, and each input value of
//! a kernel row once for all the taps that meet it; its outputs leave as vec4 stores where
//! four neighbours of y lie together. Such layers (32,3,224,224 -> 64) write many bytes per
//! multiply-add, so the store matters as much as the products.

use super::cost::{ceil_to, parallel_efficiency, SHARED_LOAD};
use super::padding::PadIndex;
use super::{phases, Family, KernelVariant};
use crate::codegen::{epilogue_vec, render, LANES, shape_vars, store_stmt, Kernel};
use crate::error::{Error, Result};
use crate::params::{ConvShape, Layout};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stem {
    /// Invocations per workgroup.
    pub wg: u32,
    /// 1: every (channel, kernel row) of the reduction written out; 0: looped over one at a
    /// time; 4: looped over four at a time, the four rows' loads issued first.
    pub unroll: u32,
    /// Output channels per invocation (a multiple of 4: whole vec4s) and neighbouring output
    /// columns per invocation.
    pub tk: u32,
    pub tw: u32,
}

const WG: [u32; 3] = [64, 128, 256];
const UNROLL: [u32; 3] = [0, 1, 4];
const TK: [u32; 3] = [8, 16, 32];
const TW: [u32; 3] = [2, 4, 8];

/// The reductions the family is for: at most this many taps (input channels x kernel
/// window: a 3-channel 7x7 stem's 147, a 1x1 layer of 256 channels), whose weights for `tk`
/// channels a workgroup stages (16 KiB, wgpu's default limit, for 16 channels; 32 KiB for
/// 32, which adapters with less workgroup memory leave out). Deeper ones are the GEMM
/// families'.
const MAX_TAPS: u32 = 256;
/// Rows (input channel, kernel row) a variant with `unroll` 1 writes out, and its written-out
/// multiply-adds (vec4 statements). On an H200 the written-out variants won only the
/// 3-channel 3x3 stem (9 rows); on the 7x7 stem (21 rows) and 1x1 layers they ran 1.1-4x
/// slower than the looped ones, and took seconds to compile where their rows ran to hundreds
/// (`benches/results/HISTORY.md`, "Stem family").
const MAX_WRITTEN_ROWS: u32 = 16;
const MAX_WRITTEN: u32 = 4096;
/// What a cache wavefront of a load costs, per multiply-add: as much as a load from
/// workgroup memory (the same unit serves both).
const WAVEFRONT: f64 = SHARED_LOAD;
/// Accumulators an invocation holds before they cost it residency. On an H200, 64 (16
/// channels x 4 columns) ran the suite's stems and 1x1 layers fastest; 128 ran 1.2-2x
/// slower than 64 on every one (`benches/results/HISTORY.md`, "Stem family").
const FREE_ACCUMULATORS: f64 = 64.0;

impl Family for Stem {
    const NAME: &'static str = "stem";
    const TEMPLATE: &'static str = include_str!("../../shaders/stem.wgsl");

    fn space() -> Vec<Self> {
        let mut out = Vec::new();
        for &wg in &WG {
            for &unroll in &UNROLL {
                for &tk in &TK {
                    for &tw in &TW {
                        let v = Stem { wg, unroll, tk, tw };
                        if v.well_formed() {
                            out.push(v);
                        }
                    }
                }
            }
        }
        out
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [wg, unroll, tk, tw] => Some(Stem { wg, unroll, tk, tw }),
            _ => None,
        }
    }
}

impl Stem {
    /// Input columns one kernel row of an invocation's `tw` outputs reads.
    fn span(&self, shape: &ConvShape) -> u32 {
        (self.tw - 1) * shape.stride.1 + (shape.s - 1) * shape.dilation.1 + 1
    }

    fn taps(shape: &ConvShape) -> u32 {
        shape.cg() * shape.r * shape.s
    }

    /// The cache wavefronts (128 bytes each) a subgroup's loads of one kernel row take: its
    /// lanes' spans lie `tw x SW` columns apart, so a scalar load touches that many
    /// wavefronts (up to 32) and a vec4 load four times a quarter of it, at least four.
    fn x_wavefronts(&self, shape: &ConvShape) -> f64 {
        let apart = self.tw * shape.stride.1;
        if self.loads_vec4(shape) {
            (self.vec4_span(shape).1 * apart.max(4)) as f64
        } else {
            (self.span(shape) * apart.min(32)) as f64
        }
    }

    /// What holding more than `FREE_ACCUMULATORS` costs, as a factor on the time.
    fn residency_cost(&self) -> f64 {
        1.0 + ((self.tk * self.tw) as f64 - FREE_ACCUMULATORS).max(0.0) / (2.0 * FREE_ACCUMULATORS)
    }

    /// Whether x's rows are read as whole vec4s: NCHW rows of whole vec4s, and each
    /// invocation's first column (`ow0 * SW - PW`) the same distance past a vec4 boundary
    /// for every invocation. A vec4 of such a row lies wholly inside it or wholly in its
    /// padding, and a subgroup's load carries four columns per lane where a scalar load
    /// carries one at the same cost in cache wavefronts (lanes `tw` columns apart).
    fn loads_vec4(&self, shape: &ConvShape) -> bool {
        // A padding mode other than zeros reads the edges' columns from elsewhere in the row:
        // one column at a time.
        shape.layout == Layout::Nchw && shape.w % 4 == 0 && (self.tw * shape.stride.1) % 4 == 0 && shape.padding_mode.is_zeros()
    }

    /// With `loads_vec4`: how far an invocation's first column lies past its vec4's start,
    /// and the vec4s a kernel row's span takes.
    fn vec4_span(&self, shape: &ConvShape) -> (u32, u32) {
        let lead = (4 - shape.pad.1 % 4) % 4;
        (lead, (lead + self.span(shape)).div_ceil(4))
    }

    /// Whether y is stored four neighbours at a time: a row's columns in NCHW (whole vec4s
    /// of every row, `tw` whole vec4s), a pixel's channels in NHWC; never where a pixel
    /// shuffle or a lowered transposed convolution moves the outputs apart.
    fn stores_vec4(&self, shape: &ConvShape) -> bool {
        !shape.moves_y()
            && match shape.layout {
                Layout::Nchw => shape.ow() % 4 == 0 && self.tw % 4 == 0,
                Layout::Nhwc => shape.k % 4 == 0,
            }
    }
}

impl KernelVariant for Stem {
    fn family(&self) -> &'static str {
        Self::NAME
    }
    fn padding_modes(&self) -> bool {
        true
    }

    fn name(&self) -> String {
        format!("stem_wg{}_u{}_k{}w{}", self.wg, self.unroll, self.tk, self.tw)
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("wg", self.wg), ("unroll", self.unroll), ("tk", self.tk), ("tw", self.tw)]
    }

    fn well_formed(&self) -> bool {
        WG.contains(&self.wg)
            && UNROLL.contains(&self.unroll)
            && TK.contains(&self.tk)
            && TW.contains(&self.tw)
            && (16..=128).contains(&(self.tk * self.tw))
    }

    fn invocations(&self) -> u32 {
        self.wg
    }

    fn workgroup_bytes(&self) -> u32 {
        MAX_TAPS * self.tk * 4
    }

    /// One group, and at most `MAX_TAPS` taps.
    fn computes(&self, shape: &ConvShape) -> bool {
        shape.groups == 1 && Self::taps(shape) <= MAX_TAPS
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        let rows = shape.cg() * shape.r;
        let written = rows * shape.s * (self.tk / 4) * self.tw;
        self.computes(shape)
            && self.tk <= shape.kg().next_power_of_two().max(8)
            && self.tw <= shape.ow().next_power_of_two().max(2)
            && match self.unroll {
                1 => written <= MAX_WRITTEN && rows <= MAX_WRITTEN_ROWS,
                0 => true,
                u => rows >= 2 * u,
            }
    }

    /// Multiply-adds executed (tile padding included) times what each costs with its share
    /// of loads, over how well the dispatch fills the GPU, times what many accumulators cost.
    fn cost(&self, shape: &ConvShape) -> f64 {
        let (n, oh, ow, k) = (shape.n as u64, shape.oh() as u64, shape.ow() as u64, shape.k as u64);
        let (tk, tw) = (self.tk as u64, self.tw as u64);
        let outputs = (n * oh * ceil_to(ow, tw) * ceil_to(k, tk)) as f64;
        let fmas = outputs * Self::taps(shape) as f64;
        // A kernel row's loads of x, in cache wavefronts, feed s x tw x tk multiply-adds; a
        // vec4 of weights, one wavefront (a broadcast), feeds 4 x tw.
        let row_fmas = (shape.s as u64 * tw * tk) as f64;
        let per_fma = 1.0 + WAVEFRONT * self.x_wavefronts(shape) / row_fmas + WAVEFRONT / (4 * tw) as f64;
        let unroll = match self.unroll {
            1 => 1.0,
            0 => 1.05,
            _ => 1.02,
        };
        let invocations = n * oh * ow.div_ceil(tw) * k.div_ceil(tk);
        fmas * per_fma * unroll
            / parallel_efficiency(ceil_to(invocations, self.wg as u64))
            * self.residency_cost()
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape)
    }
}

/// Column masks and offsets (the same for every channel and kernel row) and accumulators.
fn setup(v: &Stem, shape: &ConvShape) -> String {
    let mut s = String::new();
    if v.loads_vec4(shape) {
        let (lead, quads) = v.vec4_span(shape);
        writeln!(s, "    let first = iw_left - {lead};").unwrap();
        for i in 0..quads {
            writeln!(s, "    let cok{i} = first + {} >= 0 && first + {} < W;", 4 * i, 4 * i).unwrap();
            writeln!(s, "    let co{i} = select(0, (first + {}) / 4, cok{i});", 4 * i).unwrap();
        }
    } else {
        let pad = PadIndex(shape.padding_mode);
        for q in 0..v.span(shape) {
            let col = format!("iw_left + {q}");
            writeln!(s, "    let cok{q} = {};", pad.col_ok(&col)).unwrap();
            writeln!(s, "    let co{q} = select(0, ({}) * XSW, cok{q});", pad.col(&col)).unwrap();
        }
    }
    for m in 0..v.tk / 4 {
        for j in 0..v.tw {
            writeln!(s, "    var a{m}_{j} = vec4<f32>(0.0);").unwrap();
        }
    }
    s
}

/// The inputs of kernel row `r` of input channel `c`, loaded once for every tap of the row,
/// as `xv{t}_{q}` (column q of the row's span); `t` tells apart rows loaded together.
fn row_loads(v: &Stem, shape: &ConvShape, c: &str, r: &str, t: u32, out: &mut String, ind: &str) {
    let pad = PadIndex(shape.padding_mode);
    writeln!(out, "{ind}let ih{t} = {};", pad.row(&format!("ih_top + {r} * DH"))).unwrap();
    writeln!(out, "{ind}let rok{t} = {};", pad.row_ok(&format!("ih{t}"))).unwrap();
    writeln!(out, "{ind}let xr{t} = xn + {c} * XSC + select(0, ih{t} * XSH, rok{t});").unwrap();
    if v.loads_vec4(shape) {
        let (lead, quads) = v.vec4_span(shape);
        for i in 0..quads {
            writeln!(out, "{ind}let xq{t}_{i} = select(vec4<f32>(pad0), vec4<f32>(x[xr{t} / 4 + co{i}]), rok{t} && cok{i});").unwrap();
        }
        for q in 0..v.span(shape) {
            writeln!(out, "{ind}let xv{t}_{q} = xq{t}_{}.{};", (lead + q) / 4, LANES[((lead + q) % 4) as usize]).unwrap();
        }
    } else {
        for q in 0..v.span(shape) {
            writeln!(out, "{ind}let xv{t}_{q} = select(pad0, f32(x[xr{t} + co{q}]), rok{t} && cok{q});").unwrap();
        }
    }
}

/// Every tap of row `cr` (= c * R + r) on the inputs `row_loads` gave as `xv{t}_*`.
fn row_fmas(v: &Stem, shape: &ConvShape, cr: &str, t: u32, out: &mut String, ind: &str) {
    for s in 0..shape.s {
        writeln!(out, "{ind}{{").unwrap();
        for m in 0..v.tk / 4 {
            writeln!(out, "{ind}    let wv{m} = wsh[u32(({cr}) * S + {s}) * TK4 + {m}u];").unwrap();
        }
        for j in 0..v.tw {
            let q = j * shape.stride.1 + s * shape.dilation.1;
            for m in 0..v.tk / 4 {
                writeln!(out, "{ind}    a{m}_{j} = fma(vec4<f32>(xv{t}_{q}), wv{m}, a{m}_{j});").unwrap();
            }
        }
        writeln!(out, "{ind}}}").unwrap();
    }
}

/// One row, its loads then its taps.
fn row(v: &Stem, shape: &ConvShape, c: &str, r: &str, cr: &str, out: &mut String, ind: &str) {
    writeln!(out, "{ind}{{").unwrap();
    row_loads(v, shape, c, r, 0, out, &format!("{ind}    "));
    row_fmas(v, shape, cr, 0, out, &format!("{ind}    "));
    writeln!(out, "{ind}}}").unwrap();
}

/// The loop over rows one at a time, from `cr` as `init` leaves it to the last row.
fn one_row_loop(v: &Stem, shape: &ConvShape, init: &str, out: &mut String) {
    out.push_str(&format!("    for ({init}; cr < CG * R; cr = cr + 1) {{\n        let c = cr / R;\n        let r = cr - c * R;\n"));
    row(v, shape, "c", "r", "cr", out, "        ");
    out.push_str("    }\n");
}

fn main_loop(v: &Stem, shape: &ConvShape) -> String {
    let mut s = String::new();
    match v.unroll {
        1 => {
            for c in 0..shape.cg() {
                for r in 0..shape.r {
                    row(v, shape, &c.to_string(), &r.to_string(), &(c * shape.r + r).to_string(), &mut s, "    ");
                }
            }
        }
        0 => one_row_loop(v, shape, "var cr: i32 = 0", &mut s),
        u => {
            // `u` rows per iteration, every row's loads issued before the first row's taps
            // (in flight together, where one row at a time waits on each load), then the
            // rows left over one at a time.
            writeln!(s, "    var cr: i32 = 0;\n    for (; cr + {u} <= CG * R; cr = cr + {u}) {{").unwrap();
            for t in 0..u {
                writeln!(s, "        let cr{t} = cr + {t};\n        let c{t} = cr{t} / R;").unwrap();
                row_loads(v, shape, &format!("c{t}"), &format!("(cr{t} - c{t} * R)"), t, &mut s, "        ");
            }
            for t in 0..u {
                row_fmas(v, shape, &format!("cr{t}"), t, &mut s, "        ");
            }
            s.push_str("    }\n");
            one_row_loop(v, shape, "", &mut s);
        }
    }
    s
}

/// For each of an invocation's channels (accumulator `m`, lane `lane`), `body` within `k`'s
/// scope and its bound check.
fn per_channel(v: &Stem, s: &mut String, body: impl Fn(&mut String, u32, &str)) {
    for m in 0..v.tk / 4 {
        for (e, lane) in LANES.iter().enumerate() {
            writeln!(s, "    {{\n        let k = k0 + {};", 4 * m + e as u32).unwrap();
            writeln!(s, "        if (k < K) {{").unwrap();
            body(s, m, lane);
            writeln!(s, "        }}\n    }}").unwrap();
        }
    }
}

fn store(v: &Stem, shape: &ConvShape) -> String {
    let mut s = String::new();
    let pixel = |j: &str| format!("(oh * OW + ow0 + {j}) * YSP");
    if !v.stores_vec4(shape) {
        per_channel(v, &mut s, |s, m, lane| {
            for j in 0..v.tw {
                let at = format!("n * YSN + k * YSK + {}", pixel(&j.to_string()));
                let put = store_stmt(shape, &at, &phases::flagged(shape, &format!("a{m}_{j}.{lane}")), "k");
                writeln!(s, "            if (ow0 + {j} < OW) {{ {put} }}").unwrap();
            }
        });
        s += &phases::redo(shape, "resum_bad", || {
            let put = store_stmt(shape, "at", "resum_sum(at, k)", "k");
            format!(
                "        for (var k = k0; k < min(k0 + {tk}, K); k = k + 1) {{
            for (var j = 0; j < {tw}; j = j + 1) {{
                if (ow0 + j < OW) {{
                    let at = n * YSN + k * YSK + {at};
                    {put}
                }}
            }}
        }}
",
                tk = v.tk,
                tw = v.tw,
                at = pixel("j"),
            )
        });
        return s;
    }
    match shape.layout {
        // Four columns of one row per vec4: OW and the column tiles are whole vec4s.
        Layout::Nchw => per_channel(v, &mut s, |s, m, lane| {
            for jq in 0..v.tw / 4 {
                let values = [0, 1, 2, 3].map(|d| format!("a{m}_{}.{lane}", 4 * jq + d));
                let ks = [0, 1, 2, 3].map(|_| "k".to_string());
                writeln!(s, "            if (ow0 + {} < OW) {{", 4 * jq).unwrap();
                writeln!(s, "                let yi = n * YSN + k * YSK + {};", pixel(&(4 * jq).to_string())).unwrap();
                writeln!(s, "                y[yi / 4] = {};", epilogue_vec(&values, &ks, "yi")).unwrap();
                writeln!(s, "            }}").unwrap();
            }
        }),
        // Four channels of one pixel per vec4: K and the channel tiles are whole vec4s.
        Layout::Nhwc => {
            for j in 0..v.tw {
                writeln!(s, "    if (ow0 + {j} < OW) {{").unwrap();
                for m in 0..v.tk / 4 {
                    let values = LANES.map(|lane| format!("a{m}_{j}.{lane}"));
                    let ks = [0, 1, 2, 3].map(|d| format!("k + {d}"));
                    writeln!(s, "        {{\n            let k = k0 + {};", 4 * m).unwrap();
                    writeln!(s, "            if (k < K) {{").unwrap();
                    writeln!(s, "                let yi = n * YSN + k * YSK + {};", pixel(&j.to_string())).unwrap();
                    writeln!(s, "                y[yi / 4] = {};", epilogue_vec(&values, &ks, "yi")).unwrap();
                    writeln!(s, "            }}\n        }}").unwrap();
                }
                writeln!(s, "    }}").unwrap();
            }
        }
    }
    s
}

fn generate(v: &Stem, shape: &ConvShape) -> Result<Kernel> {
    if !v.computes(shape) {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape ({}): the stem family takes one group and at most {} \
             taps (input channels x R x S: its weights are staged in workgroup memory)",
            v.name(),
            shape.label(),
            MAX_TAPS
        )));
    }
    let owt = (shape.ow() as u64).div_ceil(v.tw as u64);
    let k_blocks = (shape.k as u64).div_ceil(v.tk as u64);
    let pixels = shape.n as u64 * shape.oh() as u64 * owt;
    let staged = Stem::taps(shape) * v.tk / 4;
    let mut vars = shape_vars(shape, &v.name());
    vars.extend([
        ("TK", v.tk.to_string()),
        ("TK4", (v.tk / 4).to_string()),
        ("TW", v.tw.to_string()),
        ("WG", v.wg.to_string()),
        ("TAPS", Stem::taps(shape).to_string()),
        ("OWT", owt.to_string()),
        ("K_BLOCKS", k_blocks.to_string()),
        ("PIXELS", pixels.to_string()),
        ("STAGED", staged.to_string()),
        ("PAD_INDEX", PadIndex(shape.padding_mode).wgsl()),
        ("RESUM", phases::resum_wgsl(shape, &phases::element("x", v.loads_vec4(shape)), &phases::element("w", false))),
        ("X_ELEM", if v.loads_vec4(shape) { "vec4<DT>".to_string() } else { "DT".to_string() }),
        ("Y_ELEM", if v.stores_vec4(shape) { "vec4<DT>".to_string() } else { "DT".to_string() }),
        ("SETUP", setup(v, shape)),
        ("MAIN_LOOP", main_loop(v, shape)),
        ("STORE", store(v, shape)),
    ]);
    Ok(Kernel::plain(render(Stem::TEMPLATE, &vars)?, pixels.div_ceil(v.wg as u64) * k_blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::validate;
    use crate::dtype::DType;
    use crate::kernels::square_shape as shape;
    use crate::params::Padding;

    #[test]
    fn swept_variants_validate_on_stems_in_both_layouts_and_types() {
        // Rows of scalars, rows of vec4s at stride 1 and 2.
        let stems =
            [shape([2, 3, 17, 18], [10, 3, 3, 3], 1, 1), shape([2, 3, 9, 16], [8, 3, 3, 3], 1, 1), shape([1, 3, 23, 24], [16, 3, 7, 7], 2, 3)];
        for base in stems {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                for dtype in [DType::F32, DType::F16] {
                    let s = base.with_layout(layout).with_dtype(dtype);
                    for v in crate::kernels::swept(&Stem::space(), |_| "stem") {
                        if !v.computes(&s) {
                            continue;
                        }
                        let k = v.generate(&s).unwrap();
                        validate(&k.source).unwrap_or_else(|e| panic!("{} on {}: {e}", v.name(), s.label()));
                    }
                }
            }
        }
    }

    #[test]
    fn vec4_stores_where_neighbours_lie_together() {
        let s = shape([1, 3, 32, 32], [64, 3, 3, 3], 1, 1);
        let v = Stem { wg: 128, unroll: 1, tk: 16, tw: 4 };
        assert!(v.stores_vec4(&s) && v.stores_vec4(&s.with_layout(Layout::Nhwc)));
        assert!(!Stem { tw: 2, ..v }.stores_vec4(&s), "two columns are half a vec4");
        let odd = shape([1, 3, 31, 31], [6, 3, 3, 3], 1, 0);
        assert!(!v.stores_vec4(&odd) && !v.stores_vec4(&odd.with_layout(Layout::Nhwc)));
        assert!(v.generate(&s).unwrap().source.contains("y: array<vec4<DT>>"));
        // Rows of x as vec4s: whole vec4s of every row, the same lead for every invocation.
        assert!(v.loads_vec4(&s) && !v.loads_vec4(&s.with_layout(Layout::Nhwc)));
        assert!(v.generate(&s).unwrap().source.contains("x: array<vec4<DT>>"));
        assert_eq!(v.vec4_span(&s), (3, 3), "columns ow0 - 1 .. ow0 + 4 from the vec4 at ow0 - 4");
        let stem7 = shape([1, 3, 32, 32], [64, 3, 7, 7], 2, 3);
        assert_eq!(Stem { tw: 2, ..v }.vec4_span(&stem7), (1, 3));
        assert!(!Stem { tw: 2, ..v }.loads_vec4(&s), "two columns at stride 1 start mid-vec4");
    }

    #[test]
    fn deep_reductions_and_groups_are_left_to_other_families() {
        let v = Stem { wg: 128, unroll: 0, tk: 16, tw: 4 };
        assert!(v.suits(&shape([8, 3, 224, 224], [64, 3, 7, 7], 2, 3)));
        assert!(!v.suits(&shape([8, 64, 56, 56], [64, 64, 3, 3], 1, 1)));
        assert!(v.suits(&shape([8, 256, 56, 56], [64, 256, 1, 1], 1, 0)), "a 1x1 layer's 256 taps");
        assert!(!Stem { unroll: 1, ..v }.suits(&shape([8, 256, 56, 56], [64, 256, 1, 1], 1, 0)), "256 rows written out");
        assert!(Stem { unroll: 1, ..v }.suits(&shape([8, 3, 224, 224], [64, 3, 3, 3], 1, 1)));
        assert!(Stem { unroll: 4, ..v }.suits(&shape([8, 256, 56, 56], [64, 256, 1, 1], 1, 0)));
        assert!(!Stem { unroll: 4, ..v }.suits(&shape([8, 3, 56, 56], [64, 3, 1, 1], 1, 0)), "3 rows");
        let grouped = ConvShape::new([1, 6, 8, 8], [6, 3, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 2, None).unwrap();
        assert!(!v.computes(&grouped) && v.generate(&grouped).is_err());
        // 6 channels of 7x7: 294 taps, more than a workgroup stages.
        assert!(!v.computes(&shape([1, 6, 32, 32], [64, 6, 7, 7], 2, 3)));
        assert_eq!(Stem { tk: 16, ..v }.workgroup_bytes(), 16384);
    }
}
