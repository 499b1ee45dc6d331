//! The Winograd family, F(mxm, 3x3) with m = 2 or 4: 3x3 filters at stride 1 (dilated ones
//! as their dilation's phases, `winogemm::tiles`). A prologue transforms the filters (U = G g
//! G^T, p*p values per (k, c), p = m + 2) into workspace; the main kernel transforms pxp
//! input patches (V = B^T d B) as it stages them, runs the p*p element-wise GEMMs over the
//! input channels with register tiles, and applies the inverse transform (A^T M A) and the
//! epilogue in its store. Per mxm outputs and input channel: 16 multiply-adds for 2x2 and 36
//! for 4x4, where the direct method does 36 and 144.

use super::cost::{ceil_to, parallel_efficiency, residency, BARRIER, GATHER_LOAD, GLOBAL_LOAD, SHARED_LOAD};
use super::padding::PadIndex;
use super::{Family, KernelVariant};
use crate::codegen::{render, shape_vars, store_stmt, Kernel, LANES};
use crate::error::{Error, Result};
use crate::params::ConvShape;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Wino {
    /// Workgroup tile: `bt` output mxm tiles x `bn` output channels, `bc` input channels per
    /// staged chunk.
    pub bt: u32,
    pub bn: u32,
    pub bc: u32,
    /// Register tile per invocation: `tt` tiles x `tk` channels, for each of the p*p elements
    /// of the transformed tile (p*p * tt * tk accumulators).
    pub tt: u32,
    pub tk: u32,
    /// Output tile side: 2 for F(2x2, 3x3), 4 for F(4x4, 3x3) (fewer multiply-adds, larger
    /// transforms, rounding a few times a 2x2 tile's).
    pub m: u32,
}

/// (bt, bn, bc, tt, tk, m): 128 or 256 invocations, 64 to 144 accumulators each, at most
/// 32 KiB of workgroup memory. Tiles of 16 output tiles, 8-channel chunks with 2x4 register
/// tiles and the 4x4 tile of 16 ran 1.6-2.4x slower than the best on every 3x3 body the
/// H100 timed (benches/results/HISTORY.md, "Winograd family"), and 2x4 tiles of 32x32 or with 2-channel
/// chunks never beat the 64x32 one: left out, so tuning spends no time on them.
const SPACE: [(u32, u32, u32, u32, u32, u32); 7] = [
    (32, 32, 4, 1, 4, 2),
    (32, 32, 8, 1, 4, 2),
    (64, 32, 4, 2, 4, 2),
    (32, 64, 4, 2, 4, 2),
    (32, 64, 4, 1, 8, 2),
    (32, 32, 2, 1, 4, 4),
    (16, 64, 2, 1, 4, 4),
];

/// Transformed filters beyond this would not fit one binding on every adapter (lavapipe:
/// 128 MiB).
const MAX_WORKSPACE: u64 = 128 << 20;

/// Per input value of a staged patch: the gather's bounds checks and the transform's adds.
const TRANSFORM: f64 = 2.0;
/// Per output of a 2x2 tile: pixel coordinates, the inverse transform's share and the store
/// (the counterpart of gemm's per-output set-up).
const SETUP: f64 = 32.0;
/// The prologue, per (k, c) filter it transforms: nine loads, the transform, 16 stores (for
/// a 2x2 tile; more for 4x4).
const PROLOGUE: f64 = 40.0;
/// The 4x4 tile's longer transforms and 36 products per (tile, channel) pair, beyond what
/// the terms above count: on the H100 its best variant ran 1.2-2.3x slower than the 2x2
/// tile's best on the 3x3 bodies of the public suite (benches/results/HISTORY.md, "Winograd family").
const TILE_4X4: f64 = 1.6;
/// Measured time per unit of this estimate relative to the GEMM family's (H100, FMA-only
/// public suite: benches/results/HISTORY.md, "Tuner: ranking and budget").
const TIME_PER_COST: f64 = 1.5;
/// 128 accumulators per invocation cost occupancy (or spill) where 64 do not, 144 more.
const REGISTERS: [(u32, f64); 2] = [(128, 1.3), (64, 1.15)];

impl Wino {
    fn threads(&self) -> u32 {
        (self.bt / self.tt) * (self.bn / self.tk)
    }

    /// The input patch side.
    fn p(&self) -> u32 {
        self.m + 2
    }

    /// Elements of a transformed tile: the number of element-wise GEMMs.
    fn xis(&self) -> u32 {
        self.p() * self.p()
    }

    /// (tiles per output row, tiles per image, tiles in all images): a dilated problem's
    /// phases tiled alike, as the Winograd-GEMM family's (`winogemm::tiles`).
    fn tiles(&self, shape: &ConvShape) -> (u64, u64, u64) {
        super::winogemm::tiles(self.m, shape)
    }

    /// The grid: (workgroups along the tiles, along one group's channels, in all).
    fn grid(&self, shape: &ConvShape) -> (u64, u64, u64) {
        let (_, _, tiles) = self.tiles(shape);
        let (t_blocks, n_blocks) = (tiles.div_ceil(self.bt as u64), (shape.kg() as u64).div_ceil(self.bn as u64));
        (t_blocks, n_blocks, t_blocks * n_blocks * shape.groups as u64)
    }

    /// Bytes of the transformed filters, p*p x CG x K floats.
    fn workspace(&self, shape: &ConvShape) -> u64 {
        self.xis() as u64 * shape.cg() as u64 * shape.k as u64 * 4
    }

    /// Whether the shape is a 3x3 convolution at stride 1, dilated ones as their dilation's
    /// phases (`winogemm::applies_dilated`).
    fn applies(shape: &ConvShape) -> bool {
        super::winogemm::applies_dilated(shape)
    }
}

impl Family for Wino {
    const NAME: &'static str = "wino";
    const TEMPLATE: &'static str = include_str!("../../shaders/wino.wgsl");

    fn space() -> Vec<Self> {
        SPACE
            .iter()
            .map(|&(bt, bn, bc, tt, tk, m)| Wino { bt, bn, bc, tt, tk, m })
            .filter(|v| v.well_formed())
            .collect()
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [bt, bn, bc, tt, tk] => Some(Wino { bt, bn, bc, tt, tk, m: 2 }),
            [bt, bn, bc, tt, tk, m] if m != 2 => Some(Wino { bt, bn, bc, tt, tk, m }),
            _ => None,
        }
    }
}

impl KernelVariant for Wino {
    fn family(&self) -> &'static str {
        Self::NAME
    }

    fn name(&self) -> String {
        let name = format!("wino_t{}x{}_c{}_r{}x{}", self.bt, self.bn, self.bc, self.tt, self.tk);
        if self.m == 2 { name } else { format!("{name}_m{}", self.m) }
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("bt", self.bt), ("bn", self.bn), ("bc", self.bc), ("tt", self.tt), ("tk", self.tk), ("m", self.m)]
    }

    fn well_formed(&self) -> bool {
        let t = self.threads();
        SPACE.contains(&(self.bt, self.bn, self.bc, self.tt, self.tk, self.m))
            && self.bt % self.tt == 0
            && self.bn % self.tk == 0
            // Channels in whole vec4s of the staged U.
            && self.tk % 4 == 0
            && (64..=256).contains(&t)
            // Each invocation copies whole slots of the U chunk.
            && (self.xis() * self.bc * self.bn) % t == 0
    }

    fn invocations(&self) -> u32 {
        self.threads()
    }

    fn padding_modes(&self) -> bool {
        true
    }
    fn workgroup_bytes(&self) -> u32 {
        self.xis() * self.bc * (self.bt + self.bn) * 4
    }

    fn computes(&self, shape: &ConvShape) -> bool {
        Self::applies(shape) && self.workspace(shape) <= MAX_WORKSPACE
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        let (_, _, tiles) = self.tiles(shape);
        self.computes(shape)
            && self.bt as u64 <= tiles.next_power_of_two().max(16)
            && self.bn <= shape.kg().next_power_of_two().max(32)
            && self.bc <= shape.cg().next_power_of_two().max(4)
    }

    /// Scaled like gemm's: multiply-adds executed (tile padding included) times the cost of
    /// each, over how well the dispatch fills the GPU, plus the filter transform.
    fn cost(&self, shape: &ConvShape) -> f64 {
        let (_, _, tiles) = self.tiles(shape);
        let (kg, cg, groups) = (shape.kg() as u64, shape.cg() as u64, shape.groups as u64);
        let (_, _, blocks) = self.grid(shape);
        let xis = self.xis() as f64;
        let fmas = xis
            * (ceil_to(tiles, self.bt as u64) * ceil_to(kg, self.bn as u64) * groups * ceil_to(cg, self.bc as u64))
                as f64;
        let (tt, tk) = (self.tt as f64, self.tk as f64);
        // Each staged V value serves bn channels, each staged U value bt tiles.
        let per_fma = 1.0
            + SHARED_LOAD * (tt + tk) / (tt * tk)
            + (GATHER_LOAD + TRANSFORM) / self.bn as f64
            + GLOBAL_LOAD / self.bt as f64
            + BARRIER * 2.0 / (xis * self.bc as f64 * tt * tk)
            + SETUP * (self.m * self.m) as f64 / (xis * cg.max(1) as f64);
        let accumulators = self.xis() * self.tt * self.tk;
        let registers = REGISTERS.iter().find(|&&(n, _)| accumulators > n).map_or(1.0, |&(_, f)| f);
        let tile = if self.m == 4 { TILE_4X4 } else { 1.0 };
        fmas * per_fma * registers * tile * TIME_PER_COST / parallel_efficiency(blocks * self.threads() as u64)
            / residency(self.workgroup_bytes(), self.threads(), blocks)
            + PROLOGUE * xis / 16.0 * (shape.k as u64 * cg) as f64
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape)
    }
}

/// B^T (input transform), G (filter transform) and A^T (inverse transform) of F(mxm, 3x3):
/// the one definition the generator and the tests share. m = 2 interpolates at 0, 1, -1 and
/// infinity; m = 4 at 0, 1, -1, 2, -2 and infinity (Lavin & Gray 2016).
struct Matrices {
    bt: &'static [&'static [f64]],
    g: &'static [[f64; 3]],
    at: &'static [&'static [f64]],
}

const F2: Matrices = Matrices {
    bt: &[&[1.0, 0.0, -1.0, 0.0], &[0.0, 1.0, 1.0, 0.0], &[0.0, -1.0, 1.0, 0.0], &[0.0, 1.0, 0.0, -1.0]],
    g: &[[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]],
    at: &[&[1.0, 1.0, 1.0, 0.0], &[0.0, 1.0, -1.0, -1.0]],
};

const F4: Matrices = Matrices {
    bt: &[
        &[4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
        &[0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
        &[0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
        &[0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
        &[0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
        &[0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
    ],
    g: &[
        [1.0 / 4.0, 0.0, 0.0],
        [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
        [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
        [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
        [0.0, 0.0, 1.0],
    ],
    at: &[
        &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
        &[0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
        &[0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
        &[0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
    ],
};

fn matrices(m: u32) -> &'static Matrices {
    if m == 4 { &F4 } else { &F2 }
}

/// A WGSL linear combination of the variables `name(j)` with `coeffs`, zero terms left out.
pub(super) fn lincomb(coeffs: &[f64], name: impl Fn(usize) -> String) -> String {
    let mut s = String::new();
    for (j, &c) in coeffs.iter().enumerate().filter(|(_, c)| **c != 0.0) {
        let sign = if c < 0.0 { "-" } else { "+" };
        let term = if c.abs() == 1.0 { name(j) } else { format!("{:?} * {}", c.abs(), name(j)) };
        if s.is_empty() {
            s = if c < 0.0 { format!("-{term}") } else { term };
        } else {
            s += &format!(" {sign} {term}");
        }
    }
    s
}

/// Decodes tile `tile` (`TILES - 1` at most, flagged `{tag}ok` when in range) into `{tag}tile`
/// and the top-left output row `{tag}oh` and column `{tag}ow` of its mxm outputs (a dilated
/// problem's tiles go phase by phase, their outputs `dilation` apart).
fn write_tile_position(s: &mut String, tag: &str, tile: &str, dilation: (u32, u32)) {
    writeln!(s, "    let {tag}ok = {tile} < TILES;").unwrap();
    writeln!(s, "    let {tag}tile = min({tile}, TILES - 1);").unwrap();
    let [oh, ow] = super::winogemm::tile_corner(&format!("{tag}tile"), dilation, ["0", "0"]);
    writeln!(s, "    let {tag}oh = {oh};\n    let {tag}ow = {ow};").unwrap();
}

fn generate(v: &Wino, shape: &ConvShape) -> Result<Kernel> {
    let m = v.m;
    if !v.computes(shape) {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape: Winograd F({m}x{m}, 3x3) takes 3x3 filters at stride 1, \
             with at most {} MiB of transformed filters",
            v.name(),
            MAX_WORKSPACE >> 20
        )));
    }
    let threads = v.threads();
    let (p, xis, mat) = (v.p(), v.xis(), matrices(v.m));
    // A dilated problem's patches take every DH-th row and DW-th column of x.
    let (dh, dw) = shape.dilation;
    let dilated = (dh, dw) != (1, 1);
    let (tx, ty) = (v.bt / v.tt, v.bn / v.tk);
    let (tiles_w, tiles_hw, tiles) = v.tiles(shape);
    let (t_blocks, n_blocks, blocks) = v.grid(shape);
    let v_slots = (v.bt * v.bc).div_ceil(threads);
    let u_slots = xis * v.bc * v.bn / threads;

    // Gather slots: consecutive invocations take consecutive tiles of one channel. A padding
    // mode other than zeros reads the patch's padded rows and columns from x as it maps them.
    let pad = PadIndex(shape.padding_mode);
    let modes = !shape.padding_mode.is_zeros();
    let mut v_setup = String::new();
    for i in 0..v_slots {
        let s = &mut v_setup;
        writeln!(s, "    let vt{i} = (lid + {}) % BT;", i * threads).unwrap();
        writeln!(s, "    let vc{i} = (lid + {}) / BT;", i * threads).unwrap();
        write_tile_position(s, &format!("v{i}"), &format!("t0 + vt{i}"), shape.dilation);
        writeln!(s, "    let vin{i} = v{i}ok && vc{i} < BC;").unwrap();
        writeln!(s, "    let vih{i} = v{i}oh - PH;").unwrap();
        writeln!(s, "    let viw{i} = v{i}ow - PW;").unwrap();
        writeln!(s, "    let vbase{i} = (v{i}tile / THW) * XSN + g * CG * XSC + vih{i} * XSH + viw{i} * XSW;").unwrap();
        for a in 0..p {
            let row = format!("vih{i} + {}", a * dh);
            writeln!(s, "    let vrok{i}_{a} = vin{i} && {};", pad.row_ok(&row)).unwrap();
            if modes {
                // vbase includes the patch's first row and column; the mode's rows replace them.
                writeln!(s, "    let vrow{i}_{a} = ({} - vih{i}) * XSH;", pad.row(&row)).unwrap();
            }
        }
        for b in 0..p {
            let col = format!("viw{i} + {}", b * dw);
            writeln!(s, "    let vcok{i}_{b} = {};", pad.col_ok(&col)).unwrap();
            if modes {
                writeln!(s, "    let vcol{i}_{b} = ({} - viw{i}) * XSW;", pad.col(&col)).unwrap();
            }
        }
    }
    // U slots: consecutive invocations take consecutive channels k (contiguous in `ut`).
    let mut u_setup = String::new();
    for i in 0..u_slots {
        let s = &mut u_setup;
        writeln!(s, "    let uk{i} = (lid + {}) % BN;", i * threads).unwrap();
        writeln!(s, "    let ur{i} = (lid + {}) / BN;", i * threads).unwrap();
        writeln!(s, "    let ukok{i} = n0 + uk{i} < KG;").unwrap();
        writeln!(s, "    let ubase{i} = (ur{i} / BC) * CG * K + g * KG + n0 + uk{i};").unwrap();
    }
    let mut acc = String::new();
    for i in 0..v_slots {
        for a in 0..p {
            for b in 0..p {
                writeln!(acc, "    var d{i}_{a}{b}: f32;").unwrap();
            }
        }
    }
    for i in 0..u_slots {
        writeln!(acc, "    var pu{i}: f32;").unwrap();
    }
    for i in 0..v.tt {
        for j in 0..v.tk {
            for xi in 0..xis {
                writeln!(acc, "    var acc{i}_{j}_{xi}: f32 = 0.0;").unwrap();
            }
        }
    }

    // Fetching a chunk into registers (issued before the previous chunk's products, so the
    // loads' latency hides behind them): each gather slot's raw pxp patch, and the U slots.
    let mut fetch = String::new();
    for i in 0..v_slots {
        let s = &mut fetch;
        writeln!(s, "        {{").unwrap();
        writeln!(s, "            let c = c_next + vc{i};").unwrap();
        writeln!(s, "            let xb = vbase{i} + c * XSC;").unwrap();
        writeln!(s, "            let cok = c < CG;").unwrap();
        for a in 0..p {
            for b in 0..p {
                writeln!(s, "            {{").unwrap();
                writeln!(s, "                let ok = cok && vrok{i}_{a} && vcok{i}_{b};").unwrap();
                let at = if modes { format!("xb + vrow{i}_{a} + vcol{i}_{b}") } else { format!("xb + {} * XSH + {} * XSW", a * dh, b * dw) };
                writeln!(s, "                d{i}_{a}{b} = select(0.0, f32(x[select(0, {at}, ok)]), ok);").unwrap();
                writeln!(s, "            }}").unwrap();
            }
        }
        writeln!(s, "        }}").unwrap();
    }
    for i in 0..u_slots {
        let s = &mut fetch;
        writeln!(s, "        {{").unwrap();
        writeln!(s, "            let c = c_next + ur{i} % BC;").unwrap();
        writeln!(s, "            let ok = ukok{i} && c < CG;").unwrap();
        writeln!(s, "            pu{i} = select(0.0, ut[select(0, ubase{i} + c * K, ok)], ok);").unwrap();
        writeln!(s, "        }}").unwrap();
    }
    // Staging the fetched chunk: each patch transformed in registers, then U as it is.
    let mut stage = String::new();
    for i in 0..v_slots {
        let s = &mut stage;
        writeln!(s, "        {{").unwrap();
        // B^T d: rows, then (B^T d) B: columns.
        for (a, row) in mat.bt.iter().enumerate() {
            for b in 0..p {
                writeln!(s, "            let e{a}{b} = {};", lincomb(row, |r| format!("d{i}_{r}{b}"))).unwrap();
            }
        }
        // Tiles past the end stage zeros; slots past the chunk (when the invocations outnumber
        // its patches) stage nothing.
        writeln!(s, "            if (vc{i} < BC) {{").unwrap();
        for a in 0..p as usize {
            for (b, col) in mat.bt.iter().enumerate() {
                let xi = p as usize * a + b;
                writeln!(
                    s,
                    "                v_s[{} + vc{i} * BT + vt{i}] = {};",
                    xi as u32 * v.bc * v.bt,
                    lincomb(col, |c| format!("e{a}{c}"))
                )
                .unwrap();
            }
        }
        writeln!(s, "            }}").unwrap();
        writeln!(s, "        }}").unwrap();
    }
    for i in 0..u_slots {
        writeln!(stage, "        u_s[ur{i} * (BN / 4) + uk{i} / 4][uk{i} % 4] = pu{i};").unwrap();
    }

    // The chunk's p*p GEMM steps per channel, all written out (a loop over the chunk's
    // channels indexes no register): register (i, j) holds tile tx + TX*i and channel
    // 4*ty + 4*TY*(j/4) + j%4 (conflict-free reads, as in gemm).
    let mut inner = String::new();
    writeln!(inner, "        for (var cc: i32 = 0; cc < BC; cc = cc + 1) {{").unwrap();
    writeln!(inner, "            let vrow = cc * BT + tx;").unwrap();
    writeln!(inner, "            let urow = cc * (BN / 4) + ty;").unwrap();
    for xi in 0..xis {
        let s = &mut inner;
        writeln!(s, "            {{").unwrap();
        for i in 0..v.tt {
            writeln!(s, "                let v{i} = v_s[vrow + {}];", xi * v.bc * v.bt + i * tx).unwrap();
        }
        for q in 0..v.tk / 4 {
            writeln!(s, "                let u{q} = u_s[urow + {}];", xi * v.bc * v.bn / 4 + q * ty).unwrap();
        }
        for i in 0..v.tt {
            for j in 0..v.tk {
                writeln!(
                    s,
                    "                acc{i}_{j}_{xi} = fma(v{i}, u{}.{}, acc{i}_{j}_{xi});",
                    j / 4,
                    LANES[(j % 4) as usize]
                )
                .unwrap();
            }
        }
        writeln!(s, "            }}").unwrap();
    }
    writeln!(inner, "        }}").unwrap();

    // The store: A^T M A per (tile, channel), each of the mxm outputs where it exists.
    let mut store = String::new();
    for i in 0..v.tt {
        let s = &mut store;
        write_tile_position(s, &format!("s{i}"), &format!("t0 + tx + {}", i * tx), shape.dilation);
        writeln!(s, "    let sy{i} = (s{i}tile / THW) * YSN + (s{i}oh * OW + s{i}ow) * YSP;").unwrap();
        // A dilated problem's short phases have tiles past the output's edge: their first
        // outputs are guarded too.
        for a in u32::from(!dilated)..m {
            writeln!(s, "    let srow{i}_{a} = s{i}oh + {} < OH;", a * dh).unwrap();
            writeln!(s, "    let scol{i}_{a} = s{i}ow + {} < OW;", a * dw).unwrap();
        }
    }
    for j in 0..v.tk {
        let s = &mut store;
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let n = n0 + {} + 4 * ty;", (j / 4) * 4 * ty + j % 4).unwrap();
        writeln!(s, "        let k = g * KG + n;").unwrap();
        for i in 0..v.tt {
            writeln!(s, "        if (n < KG && s{i}ok) {{").unwrap();
            // A^T M: rows, then (A^T M) A: columns.
            for (a, row) in mat.at.iter().enumerate() {
                for b in 0..p {
                    let sum = lincomb(row, |r| format!("acc{i}_{j}_{}", p as usize * r + b as usize));
                    writeln!(s, "            let m{a}{b} = {sum};").unwrap();
                }
            }
            for a in 0..m as usize {
                for (b, col) in mat.at.iter().enumerate() {
                    let sum = lincomb(col, |c| format!("m{a}{c}"));
                    let guards: Vec<String> = [(a, "srow"), (b, "scol")]
                        .iter()
                        .filter(|(d, _)| *d > 0 || dilated)
                        .map(|(d, what)| format!("{what}{i}_{d}"))
                        .collect();
                    let put = store_stmt(shape, &format!("sy{i} + k * YSK + ({} * OW + {}) * YSP", a as u32 * dh, b as u32 * dw), "v", "k");
                    let body = format!("let v = {sum}; bad = bad || nonfinite(v); {put}");
                    if guards.is_empty() {
                        writeln!(s, "            {{ {body} }}").unwrap();
                    } else {
                        writeln!(s, "            if ({}) {{ {body} }}", guards.join(" && ")).unwrap();
                    }
                }
            }
            writeln!(s, "        }}").unwrap();
        }
        writeln!(s, "    }}").unwrap();
    }

    // U = (G g) G^T for the prologue's one filter.
    let mut filter = String::new();
    for r in 0..3 {
        for c in 0..3 {
            writeln!(filter, "    let g{r}{c} = f32(w[src + {}]);", 3 * r + c).unwrap();
        }
    }
    for (a, row) in mat.g.iter().enumerate() {
        for c in 0..3 {
            writeln!(filter, "    let h{a}{c} = {};", lincomb(row, |r| format!("g{r}{c}"))).unwrap();
        }
    }
    for a in 0..p as usize {
        for (b, col) in mat.g.iter().enumerate() {
            let xi = p as usize * a + b;
            writeln!(filter, "    ut[({xi} * CG + c) * K + k] = {};", lincomb(col, |c| format!("h{a}{c}"))).unwrap();
        }
    }

    let filters = shape.k as u64 * shape.cg() as u64;
    let prologue_blocks = filters.div_ceil(256);
    let words_per_block = threads.div_ceil(32) as u64;
    let mark_words = blocks * words_per_block;
    let mut vars = shape_vars(shape, &v.name());
    vars.push(("DIRECT_SUM", super::phases::direct_sum(shape, 3)));
    let [redo_oh, redo_ow] = super::winogemm::tile_corner("tile", shape.dilation, ["a", "b"]);
    vars.push(("REDO_OH", redo_oh));
    vars.push(("REDO_OW", redo_ow));
    vars.push(("PAD_INDEX", pad.wgsl()));
    vars.extend([
        ("TILES_W", tiles_w.to_string()),
        ("TILES_HW", tiles_hw.to_string()),
        ("TILES", tiles.to_string()),
        ("MT", m.to_string()),
        ("P", p.to_string()),
        ("XIS", xis.to_string()),
        ("BT", v.bt.to_string()),
        ("BN", v.bn.to_string()),
        ("BC", v.bc.to_string()),
        ("TT", v.tt.to_string()),
        ("TK", v.tk.to_string()),
        ("TX", tx.to_string()),
        ("TY", ty.to_string()),
        ("THREADS", threads.to_string()),
        ("T_BLOCKS", t_blocks.to_string()),
        ("N_BLOCKS", n_blocks.to_string()),
        ("BLOCKS", blocks.to_string()),
        ("R_BLOCKS", prologue_blocks.to_string()),
        ("WPB", words_per_block.to_string()),
        ("MARK_WORDS", mark_words.to_string()),
        ("V_TILE", (xis * v.bc * v.bt).to_string()),
        ("U_TILE", (xis * v.bc * v.bn / 4).to_string()),
        ("V_SETUP", v_setup),
        ("U_SETUP", u_setup),
        ("ACC_DECL", acc),
        ("FETCH", fetch),
        ("STAGE", stage),
        ("INNER", inner),
        ("STORE", store),
        ("FILTER_TRANSFORM", filter),
    ]);
    let mut kernel = Kernel::plain(render(Wino::TEMPLATE, &vars)?, blocks);
    kernel.prologue = Some(prologue_blocks);
    kernel.workspace = [mark_words * 4, v.workspace(shape)];
    kernel.finish = Some(blocks);
    Ok(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Padding;

    /// `rows` times the vector `v`.
    fn apply(rows: &[&[f64]], v: &[f64]) -> Vec<f64> {
        rows.iter().map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum()).collect()
    }

    /// One tile of F(mxm, 3x3) on the CPU through the matrices the generator writes out,
    /// against the direct 3x3 correlation of the patch.
    #[test]
    fn transforms_compute_one_tile_exactly() {
        for m in [2usize, 4] {
            let mat = matrices(m as u32);
            let p = m + 2;
            let d: Vec<Vec<f64>> = (0..p).map(|a| (0..p).map(|b| ((a * 7 + b * 3) % 11) as f64 - 5.25).collect()).collect();
            let g: [[f64; 3]; 3] = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75], [-2.0, 1.0, 3.0]];
            let g_rows: Vec<&[f64]> = mat.g.iter().map(|r| &r[..]).collect();
            let col = |mat: &Vec<Vec<f64>>, j: usize| -> Vec<f64> { mat.iter().map(|r| r[j]).collect() };
            // X -> L X L^T for L given by its rows: columns first, then rows.
            let sandwich = |rows: &[&[f64]], x: &Vec<Vec<f64>>| -> Vec<Vec<f64>> {
                let cols: Vec<Vec<f64>> = (0..x[0].len()).map(|j| apply(rows, &col(x, j))).collect();
                (0..rows.len()).map(|a| apply(rows, &cols.iter().map(|c| c[a]).collect::<Vec<_>>())).collect()
            };
            let u = sandwich(&g_rows, &g.iter().map(|r| r.to_vec()).collect());
            let v = sandwich(mat.bt, &d);
            let prod: Vec<Vec<f64>> = (0..p).map(|a| (0..p).map(|b| u[a][b] * v[a][b]).collect()).collect();
            let y = sandwich(mat.at, &prod);
            for a in 0..m {
                for b in 0..m {
                    let want: f64 = (0..3).flat_map(|r| (0..3).map(move |s| (r, s))).map(|(r, s)| d[a + r][b + s] * g[r][s]).sum();
                    assert!((y[a][b] - want).abs() < 1e-9, "m={m}: y[{a}][{b}] = {}, want {want}", y[a][b]);
                }
            }
        }
    }

    #[test]
    fn suits_only_3x3_stride_1() {
        for v in Wino::space() {
            let ok = ConvShape::new([2, 16, 9, 8], [32, 16, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
            assert!(v.computes(&ok));
            // Dilated ones too, as their dilation's phases.
            let dilated = ConvShape::new([2, 16, 9, 8], [32, 16, 3, 3], (1, 1), Padding::Explicit(2, 2), (2, 2), 1, None).unwrap();
            assert!(v.computes(&dilated));
            let strided = ConvShape::new([2, 16, 9, 8], [32, 16, 3, 3], (2, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
            let five = ConvShape::new([2, 16, 9, 8], [32, 16, 5, 5], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
            for s in [strided, five] {
                assert!(!v.suits(&s) && !v.computes(&s));
                assert!(v.generate(&s).unwrap_err().to_string().contains("cannot run on this shape"));
            }
        }
    }

    #[test]
    fn space_is_small_and_fits_32k() {
        let space = Wino::space();
        assert_eq!(space.len(), SPACE.len());
        assert!(space.len() <= 12);
        assert!(space.iter().all(|v| v.workgroup_bytes() <= 32 << 10 && v.threads() <= 256));
        // 2x2 tiles keep the names they had before 4x4 ones existed.
        assert!(space.iter().any(|v| v.name() == "wino_t32x32_c4_r1x4"));
        assert!(space.iter().any(|v| v.name() == "wino_t32x32_c2_r1x4_m4"));
    }
}
