//! The direct family: each invocation computes `tk` output channels x `tw` output columns
//! straight from x and w, no workgroup memory. For tiny C, depthwise and small outputs.

use super::cost::{ceil_to, parallel_efficiency, GLOBAL_LOAD};
use super::padding::PadIndex;
use super::{phases, Family, KernelVariant};
use crate::codegen::{render, shape_vars, store_stmt, Kernel};
use crate::error::Result;
use crate::params::{ConvShape, Layout};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Direct {
    pub wg_x: u32,
    pub wg_y: u32,
    /// How much of the channel x window loop is written out: 0 = both looped,
    /// 1 = the R x S window written out, u > 1 = the window and `u` channels written out.
    pub unroll: u32,
    pub tk: u32,
    pub tw: u32,
}

/// Measured time per unit of this estimate relative to the GEMM family's (H100, FMA-only
/// public suite: benches/results/HISTORY.md, "Tuner: ranking and budget"), so the families rank against
/// each other by time.
const TIME_PER_COST: f64 = 1.5;

/// What one 32-byte sector a store instruction touches costs, in the multiply-add units of
/// `cost` (about 14 ps on the H100 against 0.07 ps a unit). Charged in NHWC only: there,
/// neighbouring invocations along x write different pixels, K elements apart, and the seed
/// shape's direct variants took 33-38 us with 32 sectors a store instruction, 19-21 with 16
/// and 15-18 with 8 (against 13.5-17 us in NCHW, whose own store pattern the rest of the
/// estimate was calibrated on; benches/results/HISTORY.md, "NHWC against NCHW").
const NHWC_STORE_SECTOR: f64 = 200.0;

/// Invocations in a subgroup, as on NVIDIA GPUs; for ranking only.
const SUBGROUP: u32 = 32;

/// Lanes go along x first: (x, 1) shapes put a subgroup's lanes on neighbouring pixels,
/// (1, y) and (2, y) on neighbouring channel tiles, which in NHWC are neighbouring bytes: a
/// depthwise layer's 32 lanes read 32 channels of one pixel where an (8, 8) workgroup's read
/// 4 channels of 8 pixels, C elements apart.
const WG: [(u32, u32); 10] = [(64, 1), (128, 1), (256, 1), (32, 2), (16, 4), (32, 4), (8, 8), (16, 16), (1, 64), (2, 32)];
const UNROLL: [u32; 4] = [0, 1, 2, 4];
const TK: [u32; 4] = [1, 2, 4, 8];
const TW: [u32; 3] = [1, 2, 4];

impl Family for Direct {
    const NAME: &'static str = "direct";
    const TEMPLATE: &'static str = include_str!("../../shaders/direct.wgsl");

    fn space() -> Vec<Self> {
        let mut out = Vec::new();
        for &(wg_x, wg_y) in &WG {
            for &unroll in &UNROLL {
                for &tk in &TK {
                    for &tw in &TW {
                        out.push(Direct { wg_x, wg_y, unroll, tk, tw });
                    }
                }
            }
        }
        out
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [wg_x, wg_y, unroll, tk, tw] => Some(Direct { wg_x, wg_y, unroll, tk, tw }),
            _ => None,
        }
    }
}

impl KernelVariant for Direct {
    fn family(&self) -> &'static str {
        Self::NAME
    }

    fn name(&self) -> String {
        format!("direct_wg{}x{}_u{}_k{}w{}", self.wg_x, self.wg_y, self.unroll, self.tk, self.tw)
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("wg_x", self.wg_x), ("wg_y", self.wg_y), ("unroll", self.unroll), ("tk", self.tk), ("tw", self.tw)]
    }

    fn well_formed(&self) -> bool {
        WG.contains(&(self.wg_x, self.wg_y))
            && UNROLL.contains(&self.unroll)
            && TK.contains(&self.tk)
            && TW.contains(&self.tw)
    }

    fn invocations(&self) -> u32 {
        self.wg_x * self.wg_y
    }

    fn workgroup_bytes(&self) -> u32 {
        0
    }

    fn padding_modes(&self) -> bool {
        true
    }
    fn workgroup_dims(&self) -> (u32, u32) {
        (self.wg_x, self.wg_y)
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        let window = shape.r * shape.s;
        let unrolled_terms = window * self.tk * self.tw * self.unroll.max(1);
        self.tk <= shape.kg().next_power_of_two()
            && self.tw <= shape.ow().next_power_of_two()
            && self.unroll <= shape.cg().next_power_of_two()
            && unrolled_terms <= 2048
    }

    /// Multiply-adds actually executed (tile padding included) times the cost of each,
    /// divided by how well the dispatch fills the GPU.
    fn cost(&self, shape: &ConvShape) -> f64 {
        let (n, oh, ow) = (shape.n as u64, shape.oh() as u64, shape.ow() as u64);
        let (kg, groups) = (shape.kg() as u64, shape.groups as u64);
        let red = shape.cg() as u64 * shape.r as u64 * shape.s as u64;
        let (tk, tw) = (self.tk as u64, self.tw as u64);
        let tiles = groups * kg.div_ceil(tk);
        let threads = n * oh * ow.div_ceil(tw) * tiles;
        // Outputs computed, tile padding included.
        let outputs = (n * oh * ceil_to(ow, tw) * groups * ceil_to(kg, tk)) as f64;
        let fmas = outputs * red as f64;
        // Each step loads tw inputs and tk weights for tk * tw multiply-adds.
        let loads = (tk + tw) as f64 / (tk * tw) as f64;
        // Looped windows redo the padding checks and index math per tap.
        let unroll = match self.unroll {
            0 => 1.3,
            1 => 1.0,
            _ => 0.95,
        };
        let stores = match shape.layout {
            Layout::Nhwc => outputs * NHWC_STORE_SECTOR * self.nhwc_store_sectors(shape) / SUBGROUP as f64,
            Layout::Nchw => 0.0,
        };
        // Lanes along y past the last channel tile hold their slots and do nothing (the seed
        // shape's 4 tiles of 8 channels on 8 lanes ran 1.5x slower in NHWC than 8 tiles of 4).
        let idle = ceil_to(tiles, self.wg_y as u64) as f64 / tiles as f64;
        // No penalty for many live accumulators: up to the space's 8 x 4 they ran fastest.
        (fmas * (1.0 + GLOBAL_LOAD * loads) * unroll + stores) * idle * TIME_PER_COST
            / parallel_efficiency(ceil_to(threads, self.invocations() as u64))
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape)
    }
}

impl Direct {
    /// Whether an NHWC kernel spreads each lane's channels `WG_Y` apart (see `channels`).
    fn interleaves(&self) -> bool {
        self.wg_y > 1 && self.tk > 1
    }

    /// The 32-byte sectors of an NHWC y one subgroup's store instruction touches: its lanes
    /// along x hold pixels `tw` apart, its lanes along y neighbouring channels (`channels`).
    fn nhwc_store_sectors(&self, shape: &ConvShape) -> f64 {
        let elem = shape.dtype.size() as u32;
        let lanes_x = self.wg_x.min(SUBGROUP);
        let lanes_y = (SUBGROUP / lanes_x).min(self.wg_y).max(1);
        let per_pixel = (lanes_y * elem).div_ceil(32);
        let pixel_bytes = shape.k * self.tw * elem;
        let sectors = if pixel_bytes >= 32 { lanes_x * per_pixel } else { (lanes_x * pixel_bytes).div_ceil(32) };
        sectors as f64
    }
}

/// Which output channels an invocation owns. In NCHW its `tk` channels are neighbours; in
/// NHWC the lanes along y own neighbouring channels and each lane's `tk` channels lie
/// `KSTEP` apart, so one store instruction of a subgroup writes whole sectors of a pixel
/// rather than one element every `tk` channels.
fn channels(d: &Direct, shape: &ConvShape) -> &'static str {
    if shape.layout == Layout::Nhwc && d.interleaves() {
        "    // Tiles come in blocks of WG_Y (fewer in a group's last block) covering\n\
         \x20   // WG_Y * TK channels; tile j of a block of nb owns channels j, j + nb, ...\n\
         \x20   let t = kt_all % KT;\n\
         \x20   let blk = t / WG_Y;\n\
         \x20   let KSTEP = i32(min(WG_Y, KT - blk * WG_Y));\n\
         \x20   let kk0 = i32(blk * WG_Y * TK + (t - blk * WG_Y));"
    } else {
        "    const KSTEP: i32 = 1;\n    let kk0 = i32(kt_all % KT * TK);"
    }
}

fn generate(d: &Direct, shape: &ConvShape) -> Result<Kernel> {
    let (tk, tw) = (d.tk, d.tw);
    let owt = (shape.ow() as u64).div_ceil(tw as u64);
    let kt = (shape.kg() as u64).div_ceil(tk as u64);
    let sp_blocks = (shape.oh() as u64 * owt).div_ceil(d.wg_x as u64);
    let k_blocks = (shape.groups as u64 * kt).div_ceil(d.wg_y as u64);

    let pad = PadIndex(shape.padding_mode);
    let mut setup = String::new();
    writeln!(setup, "    let xg = i32(n) * XSN + g * CG * XSC;").unwrap();
    for i in 0..tk {
        writeln!(setup, "    let wb{i} = (g * KG + min(kk0 + {i} * KSTEP, KG - 1)) * CG * R * S;").unwrap();
    }
    for i in 0..tk {
        for j in 0..tw {
            writeln!(setup, "    var a{i}_{j}: f32 = 0.0;").unwrap();
        }
    }
    // With the window written out, the padding masks and offsets do not depend on the
    // channel and are computed once, outside the channel loop.
    if d.unroll >= 1 {
        for r in 0..shape.r {
            writeln!(setup, "    let ih{r} = {};", pad.row(&format!("ih_top + {r} * DH"))).unwrap();
            writeln!(setup, "    let rok{r} = {};", pad.row_ok(&format!("ih{r}"))).unwrap();
        }
        for j in 0..tw {
            for s in 0..shape.s {
                writeln!(setup, "    let iw{j}_{s} = {};", pad.col(&format!("(ow0 + {j}) * SW - PW + {s} * DW"))).unwrap();
                writeln!(setup, "    let cok{j}_{s} = {};", pad.col_ok(&format!("iw{j}_{s}"))).unwrap();
                for r in 0..shape.r {
                    writeln!(setup, "    let m{r}_{j}_{s} = rok{r} && cok{j}_{s};").unwrap();
                    writeln!(
                        setup,
                        "    let o{r}_{j}_{s} = select(0, ih{r} * XSH + iw{j}_{s} * XSW, m{r}_{j}_{s});"
                    )
                    .unwrap();
                }
            }
        }
    }

    let fmas = |out: &mut String, indent: &str| {
        for j in 0..tw {
            for i in 0..tk {
                writeln!(out, "{indent}a{i}_{j} = fma(xv{j}, wv{i}, a{i}_{j});").unwrap();
            }
        }
    };
    // One channel's worth of the written-out window, for channel expression `c`.
    let window_body = |out: &mut String, c: &str, indent: &str| {
        writeln!(out, "{indent}{{").unwrap();
        writeln!(out, "{indent}    let xc = xg + ({c}) * XSC;").unwrap();
        writeln!(out, "{indent}    let wc = ({c}) * R * S;").unwrap();
        for r in 0..shape.r {
            for s in 0..shape.s {
                writeln!(out, "{indent}    {{").unwrap();
                for j in 0..tw {
                    writeln!(
                        out,
                        "{indent}        let xv{j} = select(pad0, f32(x[xc + o{r}_{j}_{s}]), m{r}_{j}_{s});"
                    )
                    .unwrap();
                }
                for i in 0..tk {
                    writeln!(out, "{indent}        let wv{i} = f32(w[wb{i} + wc + {}]);", r * shape.s + s)
                        .unwrap();
                }
                fmas(out, &format!("{indent}        "));
                writeln!(out, "{indent}    }}").unwrap();
            }
        }
        writeln!(out, "{indent}}}").unwrap();
    };

    let mut main = String::new();
    if d.unroll == 0 {
        main.push_str(
            "    for (var c: i32 = 0; c < CG; c = c + 1) {\n\
             \x20       let xc = xg + c * XSC;\n\
             \x20       let wc = c * R * S;\n\
             \x20       for (var r: i32 = 0; r < R; r = r + 1) {\n",
        );
        writeln!(main, "            let ih = {};", pad.row("ih_top + r * DH")).unwrap();
        writeln!(main, "            let rok = {};", pad.row_ok("ih")).unwrap();
        main.push_str("            for (var s: i32 = 0; s < S; s = s + 1) {\n");
        for j in 0..tw {
            let ind = "                ";
            writeln!(main, "{ind}let iw{j} = {};", pad.col(&format!("(ow0 + {j}) * SW - PW + s * DW"))).unwrap();
            writeln!(main, "{ind}let ok{j} = rok && {};", pad.col_ok(&format!("iw{j}"))).unwrap();
            writeln!(main, "{ind}let xv{j} = select(pad0, f32(x[select(0, xc + ih * XSH + iw{j} * XSW, ok{j})]), ok{j});")
                .unwrap();
        }
        for i in 0..tk {
            writeln!(main, "                let wv{i} = f32(w[wb{i} + wc + r * S + s]);").unwrap();
        }
        fmas(&mut main, "                ");
        main.push_str("            }\n        }\n    }\n");
    } else {
        let u = d.unroll;
        writeln!(main, "    var c: i32 = 0;").unwrap();
        writeln!(main, "    for (; c + {u} <= CG; c = c + {u}) {{").unwrap();
        for cu in 0..u {
            window_body(&mut main, &format!("c + {cu}"), "        ");
        }
        writeln!(main, "    }}").unwrap();
        if u > 1 {
            writeln!(main, "    for (; c < CG; c = c + 1) {{").unwrap();
            window_body(&mut main, "c", "        ");
            writeln!(main, "    }}").unwrap();
        }
    }

    let mut store = String::new();
    for i in 0..tk {
        writeln!(store, "    if (kk0 + {i} * KSTEP < KG) {{").unwrap();
        writeln!(store, "        let k = g * KG + kk0 + {i} * KSTEP;").unwrap();
        writeln!(store, "        let yrow = i32(n) * YSN + k * YSK + oh * OW * YSP;").unwrap();
        for j in 0..tw {
            let put = store_stmt(shape, &format!("yrow + (ow0 + {j}) * YSP"), &phases::flagged(shape, &format!("a{i}_{j}")), "k");
            writeln!(store, "        if (ow0 + {j} < OW) {{ {put} }}").unwrap();
        }
        writeln!(store, "    }}").unwrap();
    }
    store += &phases::redo(shape, "resum_bad", || {
        let put = store_stmt(shape, "at", "resum_sum(at, k)", "k");
        format!(
            "        for (var i = 0; i < {tk}; i = i + 1) {{
            for (var j = 0; j < {tw}; j = j + 1) {{
                if (kk0 + i * KSTEP < KG && ow0 + j < OW) {{
                    let k = g * KG + kk0 + i * KSTEP;
                    let at = i32(n) * YSN + k * YSK + (oh * OW + ow0 + j) * YSP;
                    {put}
                }}
            }}
        }}
"
        )
    });

    let mut vars = shape_vars(shape, &d.name());
    vars.extend([
        ("TK", tk.to_string()),
        ("TW", tw.to_string()),
        ("WG_X", d.wg_x.to_string()),
        ("WG_Y", d.wg_y.to_string()),
        ("OWT", owt.to_string()),
        ("KT", kt.to_string()),
        ("SP_BLOCKS", sp_blocks.to_string()),
        ("K_BLOCKS", k_blocks.to_string()),
        ("SETUP", setup),
        ("MAIN_LOOP", main),
        ("STORE", store),
        ("CHANNELS", channels(d, shape).to_string()),
        ("PAD_INDEX", pad.wgsl()),
        ("RESUM", phases::resum_wgsl(shape, &phases::element("x", false), &phases::element("w", false))),
    ]);
    Ok(Kernel::plain(render(Direct::TEMPLATE, &vars)?, sp_blocks * k_blocks * shape.n as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::KernelVariant;
    use crate::params::Padding;

    fn seed() -> ConvShape {
        ConvShape::new([1, 3, 225, 225], [32, 3, 3, 3], (1, 1), Padding::Explicit(0, 0), (1, 1), 1, None).unwrap()
    }

    fn likeliest(shape: &ConvShape) -> Direct {
        let mut all = Direct::space();
        all.retain(|d| d.suits(shape));
        all.sort_by(|a, b| a.cost(shape).total_cmp(&b.cost(shape)).then_with(|| a.name().cmp(&b.name())));
        all[0]
    }

    #[test]
    fn nhwc_stores_favour_channel_tiles_across_the_subgroup() {
        // Measured on the H100 (seed shape, NHWC): 32 sectors a store took 33-38 us, 8 took
        // 15-18; in NCHW the likeliest winner keeps its pixel-wide workgroup.
        let nhwc = seed().with_layout(Layout::Nhwc);
        let d = likeliest(&nhwc);
        assert!(d.wg_x <= 8 && d.wg_y == 8 && d.tk == 4, "{}", d.name());
        assert_eq!(d.nhwc_store_sectors(&nhwc), 8.0);
        let wide = Direct { wg_x: 128, wg_y: 1, unroll: 1, tk: 8, tw: 4 };
        assert_eq!(wide.nhwc_store_sectors(&nhwc), 32.0);
        assert!(likeliest(&seed()).wg_x >= 32);
        // The store term is what separates the layouts: without it NHWC and NCHW estimates
        // are the same.
        assert!(wide.cost(&nhwc) > wide.cost(&seed()));
    }

    #[test]
    fn idle_channel_lanes_cost() {
        // The seed shape's 32 channels in tiles of 8 leave 4 of a workgroup's 8 lanes along y
        // idle: 23.0 us against 14.7 for tiles of 4 (H100, NHWC); in NCHW the pixel-wide
        // workgroups keep their tiles of 8.
        let nhwc = seed().with_layout(Layout::Nhwc);
        let k8 = Direct { wg_x: 8, wg_y: 8, unroll: 2, tk: 8, tw: 4 };
        let k4 = Direct { tk: 4, ..k8 };
        assert!(k8.cost(&nhwc) > 1.5 * k4.cost(&nhwc));
        assert_eq!(likeliest(&seed()).tk, 8);
    }

    #[test]
    fn narrow_pixels_share_sectors() {
        // K = 4 floats: a pixel is 16 bytes, so lanes along x share sectors.
        let s = ConvShape::new([1, 3, 64, 64], [4, 3, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
            .unwrap()
            .with_layout(Layout::Nhwc);
        let d = Direct { wg_x: 64, wg_y: 1, unroll: 1, tk: 4, tw: 1 };
        assert_eq!(d.nhwc_store_sectors(&s), 16.0);
    }
}
