//! The dwise family: depthwise convolution in NHWC (one input and one output channel per
//! group). Each invocation computes `cv` neighbouring channels x `th` output rows x `tw`
//! output columns; its loads of x are vectors of channels, neighbouring lanes holding
//! neighbouring channel blocks of one pixel, so that a subgroup reads whole sectors where
//! `direct` (one channel per lane, lanes along pixels or along channels) reads a few bytes of
//! each. Such layers do few multiply-adds per byte: their bytes set the pace, which float16
//! halves.

use super::cost::{ceil_to, parallel_efficiency, register_occupancy, GLOBAL_LOAD};
use super::padding::PadIndex;
use super::{Family, KernelVariant};
use crate::codegen::{epilogue_vec, render, shape_vars, store_stmt, Kernel, LANES};
use crate::error::{Error, Result};
use crate::params::{ConvShape, Layout};
use std::collections::BTreeSet;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dwise {
    /// Invocations per workgroup.
    pub wg: u32,
    /// Channels per invocation: one vector of 2 or 4, or two vectors of 4.
    pub cv: u32,
    /// Output columns and rows per invocation.
    pub tw: u32,
    pub th: u32,
}

const WG: [u32; 3] = [64, 128, 256];
const CV: [u32; 3] = [2, 4, 8];
const TW: [u32; 3] = [1, 2, 4];
const TH: [u32; 2] = [1, 2];

/// The most vector multiply-adds a variant writes out (tile x window x vectors): a 5x5
/// kernel on the largest tile of two vectors is 400.
const MAX_WRITTEN: u32 = 512;
/// As `direct`'s: time per unit of estimate, against the GEMM family's.
const TIME_PER_COST: f64 = 1.5;
/// A weight load is one per channel and tap for the whole tile, and every invocation of a
/// workgroup reads the same few hundred bytes: cheaper than a load of x.
const WEIGHT_LOAD: f64 = 0.5;

impl Family for Dwise {
    const NAME: &'static str = "dwise";
    const TEMPLATE: &'static str = include_str!("../../shaders/dwise.wgsl");

    fn space() -> Vec<Self> {
        let mut out = Vec::new();
        for &wg in &WG {
            for &cv in &CV {
                for &tw in &TW {
                    for &th in &TH {
                        out.push(Dwise { wg, cv, tw, th });
                    }
                }
            }
        }
        out
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [wg, cv, tw, th] => Some(Dwise { wg, cv, tw, th }),
            _ => None,
        }
    }
}

impl Dwise {
    /// Channels per vector load.
    fn vw(&self) -> u32 {
        self.cv.min(4)
    }
    /// Vectors per invocation.
    fn nv(&self) -> u32 {
        self.cv / self.vw()
    }
    /// The distinct input rows (as offsets from the tile's first) the tile's taps read, and
    /// likewise columns.
    fn offsets(&self, shape: &ConvShape) -> (Vec<u32>, Vec<u32>) {
        let span = |t: u32, stride: u32, taps: u32, d: u32| -> Vec<u32> {
            let set: BTreeSet<u32> = (0..t).flat_map(|i| (0..taps).map(move |r| i * stride + r * d)).collect();
            set.into_iter().collect()
        };
        (span(self.th, shape.stride.0, shape.r, shape.dilation.0), span(self.tw, shape.stride.1, shape.s, shape.dilation.1))
    }
}

impl KernelVariant for Dwise {
    fn family(&self) -> &'static str {
        Self::NAME
    }

    fn name(&self) -> String {
        format!("dwise_wg{}_c{}_w{}h{}", self.wg, self.cv, self.tw, self.th)
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("wg", self.wg), ("cv", self.cv), ("tw", self.tw), ("th", self.th)]
    }

    fn well_formed(&self) -> bool {
        WG.contains(&self.wg) && CV.contains(&self.cv) && TW.contains(&self.tw) && TH.contains(&self.th)
    }

    fn invocations(&self) -> u32 {
        self.wg
    }

    fn workgroup_bytes(&self) -> u32 {
        0
    }

    fn padding_modes(&self) -> bool {
        true
    }

    fn computes(&self, shape: &ConvShape) -> bool {
        shape.layout == Layout::Nhwc
            && shape.cg() == 1
            && shape.kg() == 1
            && shape.scatter.is_none()
            && shape.c % self.cv == 0
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        self.computes(shape)
            && self.tw <= shape.ow().next_power_of_two()
            && self.th <= shape.oh().next_power_of_two()
            && self.th * self.tw * shape.r * shape.s * self.nv() <= MAX_WRITTEN
    }

    /// Multiply-adds executed (tile padding included) times the loads each costs, over how
    /// well the dispatch fills the GPU and how many invocations its registers leave resident.
    fn cost(&self, shape: &ConvShape) -> f64 {
        let (oh, ow) = (shape.oh() as u64, shape.ow() as u64);
        let (th, tw, cv) = (self.th as u64, self.tw as u64, self.cv as u64);
        let invocations = shape.n as u64 * oh.div_ceil(th) * ow.div_ceil(tw) * (shape.c as u64 / cv);
        let taps = (shape.r * shape.s) as f64;
        let fmas = (shape.n as u64 * ceil_to(oh, th) * ceil_to(ow, tw) * shape.c as u64) as f64 * taps;
        let (rows, cols) = self.offsets(shape);
        let x_loads = (rows.len() * cols.len()) as f64 * self.nv() as f64;
        let w_loads = taps * self.cv as f64 * WEIGHT_LOAD;
        let per_invocation = (th * tw * cv) as f64 * taps;
        let loads = (x_loads + w_loads) / per_invocation;
        let registers = (th * tw * cv) as f64 + taps * self.cv as f64 + 2.0 * self.cv as f64;
        fmas * (1.0 + GLOBAL_LOAD * loads) * TIME_PER_COST
            / parallel_efficiency(ceil_to(invocations, self.wg as u64))
            / register_occupancy(registers).sqrt()
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        if !self.computes(shape) {
            return Err(Error::invalid(format!(
                "variant {} cannot run on this shape ({}): the dwise family takes NHWC depthwise convolutions (one input and one output channel per group) whose channels are a multiple of {}",
                self.name(),
                shape.label(),
                self.cv
            )));
        }
        generate(self, shape)
    }
}

fn generate(d: &Dwise, shape: &ConvShape) -> Result<Kernel> {
    let (vw, nv) = (d.vw(), d.nv());
    let taps = shape.r * shape.s;
    let pad = PadIndex(shape.padding_mode);

    let mut weights = String::new();
    writeln!(weights, "    // Each channel's R x S weights, once per invocation.").unwrap();
    for t in 0..taps {
        for v in 0..nv {
            let parts: Vec<String> = (0..vw).map(|e| format!("f32(w[(c0 + {}) * {taps} + {t}])", v * vw + e)).collect();
            writeln!(weights, "    let w{t}_{v} = FV({});", parts.join(", ")).unwrap();
        }
    }
    for i in 0..d.th {
        for j in 0..d.tw {
            for v in 0..nv {
                writeln!(weights, "    var a{i}_{j}_{v} = FV();").unwrap();
            }
        }
    }

    // Every input vector the tile reads, loaded once, feeds each output whose tap meets it.
    let (rows, cols) = d.offsets(shape);
    let mut main = String::new();
    writeln!(main, "    let cv0 = i32(cb) * {nv};").unwrap();
    for &co in &cols {
        writeln!(main, "    let col{co} = {};", pad.col(&format!("iw0 + {co}"))).unwrap();
        writeln!(main, "    let cok{co} = {};", pad.col_ok(&format!("col{co}"))).unwrap();
    }
    for &ro in &rows {
        writeln!(main, "    {{").unwrap();
        writeln!(main, "        let ih = {};", pad.row(&format!("ih0 + {ro}"))).unwrap();
        writeln!(main, "        let rok = {};", pad.row_ok("ih")).unwrap();
        writeln!(main, "        let xr = (xn + ih) * W;").unwrap();
        for &co in &cols {
            let uses: Vec<(u32, u32, u32)> = (0..d.th)
                .flat_map(|i| (0..d.tw).map(move |j| (i, j)))
                .filter_map(|(i, j)| {
                    let r = tap_of(ro, i * shape.stride.0, shape.dilation.0, shape.r)?;
                    let s = tap_of(co, j * shape.stride.1, shape.dilation.1, shape.s)?;
                    Some((i, j, r * shape.s + s))
                })
                .collect();
            if uses.is_empty() {
                continue;
            }
            writeln!(main, "        {{").unwrap();
            writeln!(main, "            let ok = rok && cok{co};").unwrap();
            writeln!(main, "            let at = select(0, (xr + col{co}) * CVEC + cv0, ok);").unwrap();
            for v in 0..nv {
                writeln!(main, "            let xv{v} = select(pad0, FV(x[at + {v}]), ok);").unwrap();
            }
            for &(i, j, t) in &uses {
                for v in 0..nv {
                    writeln!(main, "            a{i}_{j}_{v} = fma(xv{v}, w{t}_{v}, a{i}_{j}_{v});").unwrap();
                }
            }
            writeln!(main, "        }}").unwrap();
        }
        writeln!(main, "    }}").unwrap();
    }

    // y leaves as vectors unless a pixel shuffle moves its elements apart.
    let vec_store = !shape.moves_y();
    let mut store = String::new();
    for i in 0..d.th {
        for j in 0..d.tw {
            writeln!(store, "    if (oh0 + {i} < OH && ow0 + {j} < OW) {{").unwrap();
            writeln!(store, "        let yp = i32(n) * YSN + ((oh0 + {i}) * OW + ow0 + {j}) * YSP;").unwrap();
            for v in 0..nv {
                writeln!(store, "        {{").unwrap();
                writeln!(store, "            let k = c0 + {};", v * vw).unwrap();
                writeln!(store, "            let base = yp + k * YSK;").unwrap();
                let acc = format!("a{i}_{j}_{v}");
                if vec_store {
                    let lanes = &LANES[..vw as usize];
                    let values: Vec<String> = lanes.iter().map(|l| format!("{acc}.{l}")).collect();
                    let ks: Vec<String> = (0..vw).map(|e| format!("k + {e}")).collect();
                    writeln!(store, "            y[base / {vw}] = {};", epilogue_vec(&values, &ks, "base")).unwrap();
                } else {
                    for (e, lane) in LANES.iter().enumerate().take(vw as usize) {
                        let put = store_stmt(shape, &format!("base + {e}"), &format!("{acc}.{lane}"), &format!("k + {e}"));
                        writeln!(store, "            {{ {put} }}").unwrap();
                    }
                }
                writeln!(store, "        }}").unwrap();
            }
            writeln!(store, "    }}").unwrap();
        }
    }

    let owt = shape.ow().div_ceil(d.tw);
    let oht = shape.oh().div_ceil(d.th);
    let cb = shape.c / d.cv;
    let invocations = shape.n as u64 * oht as u64 * owt as u64 * cb as u64;
    let mut vars = shape_vars(shape, &d.name());
    vars.extend([
        ("CV", d.cv.to_string()),
        ("VW", vw.to_string()),
        ("TW", d.tw.to_string()),
        ("TH", d.th.to_string()),
        ("WG", d.wg.to_string()),
        ("CVEC", (shape.c / vw).to_string()),
        ("CB", cb.to_string()),
        ("OWT", owt.to_string()),
        ("OHT", oht.to_string()),
        ("Y_ELEM", if vec_store { format!("vec{vw}<DT>") } else { "DT".to_string() }),
        ("WEIGHTS", weights),
        ("MAIN", main),
        ("STORE", store),
        ("PAD_INDEX", pad.wgsl()),
    ]);
    Ok(Kernel::plain(render(Dwise::TEMPLATE, &vars)?, invocations.div_ceil(d.wg as u64)))
}

/// The tap (< `taps`) of an output `first` rows into the tile that reads input row `offset`
/// of the tile's span, taps `dilation` apart, if one does.
fn tap_of(offset: u32, first: u32, dilation: u32, taps: u32) -> Option<u32> {
    let rel = offset.checked_sub(first)?;
    (rel % dilation == 0 && rel / dilation < taps).then_some(rel / dilation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::validate;
    use crate::dtype::DType;
    use crate::params::Padding;

    fn depthwise(c: usize, hw: usize, r: usize, stride: i64, dilation: i64) -> ConvShape {
        let p = dilation * (r as i64 - 1) / 2;
        ConvShape::new([2, c, hw, hw], [c, 1, r, r], (stride, stride), Padding::Explicit(p, p), (dilation, dilation), c as i64, None)
            .unwrap()
            .with_layout(Layout::Nhwc)
    }

    #[test]
    fn every_variant_generates_valid_wgsl_for_the_shapes_it_takes() {
        let shapes = [depthwise(16, 9, 3, 1, 1), depthwise(8, 11, 5, 2, 1), depthwise(24, 10, 3, 1, 2)];
        for s in shapes {
            for dt in [DType::F32, DType::F16] {
                let s = s.with_dtype(dt);
                for v in Dwise::space().into_iter().filter(|v| v.computes(&s)) {
                    let k = v.generate(&s).unwrap();
                    validate(&k.source).unwrap_or_else(|e| panic!("{} on {}: {e}", v.name(), s.label()));
                }
            }
        }
    }

    #[test]
    fn takes_nhwc_depthwise_only() {
        let v = Dwise { wg: 64, cv: 4, tw: 2, th: 1 };
        assert!(v.computes(&depthwise(16, 9, 3, 1, 1)));
        assert!(!v.computes(&depthwise(16, 9, 3, 1, 1).with_layout(Layout::Nchw)));
        assert!(!v.computes(&depthwise(18, 9, 3, 1, 1)), "channels not a multiple of cv");
        let grouped = ConvShape::new([1, 16, 8, 8], [16, 2, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 8, None)
            .unwrap()
            .with_layout(Layout::Nhwc);
        assert!(!v.computes(&grouped));
        assert!(v.generate(&grouped).unwrap_err().to_string().contains("cannot run on this shape"));
    }

    #[test]
    fn each_input_vector_is_loaded_once_per_tile() {
        // A 2x4 tile of a 3x3 stride-1 kernel reads 4 rows x 6 columns of x.
        let v = Dwise { wg: 64, cv: 4, tw: 4, th: 2 };
        let s = depthwise(16, 9, 3, 1, 1);
        let (rows, cols) = v.offsets(&s);
        assert_eq!((rows.len(), cols.len()), (4, 6));
        let src = v.generate(&s).unwrap().source;
        assert_eq!(src.matches("FV(x[").count(), 24);
        assert_eq!(src.matches("= fma(").count(), 2 * 4 * 9);
    }
}
