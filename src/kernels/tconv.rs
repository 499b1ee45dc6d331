//! The transposed-convolution family (`tconv_wg{X}x{Y}_k{TK}w{TW}`): PyTorch's
//! `conv_transpose2d` as a gather. Each invocation computes `tk` output channels x `tw`
//! output columns of one stride phase, visiting only the taps that phase receives, so no
//! zero-inserted copy of x is made and no product with an inserted zero is computed. It is the
//! only family that takes transposed problems (and takes nothing else).

use super::cost::{ceil_to, parallel_efficiency, GLOBAL_LOAD};
use super::{Family, KernelVariant, Variant};
use crate::codegen::{render, shape_vars, Kernel};
use crate::error::{Error, Result};
use crate::params::ConvShape;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tconv {
    pub wg_x: u32,
    pub wg_y: u32,
    pub tk: u32,
    pub tw: u32,
}

/// Time per unit of the estimate against the other families'; like the direct family's, whose
/// inner loop this one's resembles.
const TIME_PER_COST: f64 = 1.5;

const WG: [(u32, u32); 6] = [(64, 1), (128, 1), (256, 1), (32, 2), (16, 4), (8, 8)];
const TK: [u32; 4] = [1, 2, 4, 8];
const TW: [u32; 3] = [1, 2, 4];

/// The trusted variant for transposed problems: one output per invocation.
pub const REFERENCE: Tconv = Tconv { wg_x: 64, wg_y: 1, tk: 1, tw: 1 };

impl Family for Tconv {
    const NAME: &'static str = "tconv";
    const TEMPLATE: &'static str = include_str!("../../shaders/tconv.wgsl");

    fn space() -> Vec<Self> {
        let mut out = Vec::new();
        for &(wg_x, wg_y) in &WG {
            for &tk in &TK {
                for &tw in &TW {
                    out.push(Tconv { wg_x, wg_y, tk, tw });
                }
            }
        }
        out
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [wg_x, wg_y, tk, tw] => Some(Tconv { wg_x, wg_y, tk, tw }),
            _ => None,
        }
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Taps of one stride phase apart along an axis: stride / gcd(stride, dilation).
fn tap_step(stride: u32, dilation: u32) -> u32 {
    stride / gcd(stride, dilation)
}

/// Output columns of the widest column phase.
fn phase_columns(shape: &ConvShape) -> u32 {
    shape.ow().div_ceil(shape.stride.1)
}

/// The untuned choice for a transposed problem: channel tiles where there are channels to
/// tile, one column per invocation so neighbouring lanes write neighbouring columns.
pub fn default_variant(shape: &ConvShape) -> Variant {
    let tk = if shape.kg() >= 4 { 4 } else { 1 };
    Variant::Tconv(Tconv { wg_x: 64, wg_y: 1, tk, tw: 1 })
}

impl KernelVariant for Tconv {
    fn family(&self) -> &'static str {
        Self::NAME
    }

    fn name(&self) -> String {
        format!("tconv_wg{}x{}_k{}w{}", self.wg_x, self.wg_y, self.tk, self.tw)
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("wg_x", self.wg_x), ("wg_y", self.wg_y), ("tk", self.tk), ("tw", self.tw)]
    }

    fn well_formed(&self) -> bool {
        WG.contains(&(self.wg_x, self.wg_y)) && TK.contains(&self.tk) && TW.contains(&self.tw)
    }

    fn invocations(&self) -> u32 {
        self.wg_x * self.wg_y
    }

    fn workgroup_bytes(&self) -> u32 {
        0
    }

    fn workgroup_dims(&self) -> (u32, u32) {
        (self.wg_x, self.wg_y)
    }

    fn transposed(&self) -> bool {
        true
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        self.computes(shape)
            && self.tk <= shape.kg().next_power_of_two()
            && self.tw <= phase_columns(shape).next_power_of_two()
    }

    /// A pixel shuffle after the transposed convolution runs in its lowered form, on the
    /// other families.
    fn computes(&self, shape: &ConvShape) -> bool {
        shape.pixel_shuffle.is_none()
    }

    /// Multiply-adds executed (tile padding included) times the cost of each, over how well
    /// the dispatch fills the GPU.
    fn cost(&self, shape: &ConvShape) -> f64 {
        let (n, oh) = (shape.n as u64, shape.oh() as u64);
        let (kg, groups, sw) = (shape.kg() as u64, shape.groups as u64, shape.stride.1 as u64);
        let (tk, tw) = (self.tk as u64, self.tw as u64);
        let tiles = groups * kg.div_ceil(tk);
        let qt = (phase_columns(shape) as u64).div_ceil(tw);
        let threads = n * oh * sw * qt * tiles;
        let outputs = (n * oh * sw * qt * tw * groups * ceil_to(kg, tk)) as f64;
        // Taps an output visits: about R / stride rows and S / stride columns of the window.
        let per_axis = |k: u32, st: u32| (k as f64 / st as f64).max(1.0);
        let taps = per_axis(shape.r, shape.stride.0) * per_axis(shape.s, shape.stride.1);
        let fmas = outputs * shape.cg() as f64 * taps;
        let loads = (tk + tw) as f64 / (tk * tw) as f64;
        let idle = ceil_to(tiles, self.wg_y as u64) as f64 / tiles as f64;
        fmas * (1.0 + GLOBAL_LOAD * loads) * idle * TIME_PER_COST
            / parallel_efficiency(ceil_to(threads, self.invocations() as u64))
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape)
    }
}

fn generate(t: &Tconv, shape: &ConvShape) -> Result<Kernel> {
    if shape.pixel_shuffle.is_some() {
        return Err(Error::invalid(format!(
            "variant {} cannot run on this shape ({}): a pixel shuffle after a transposed convolution runs in its lowered form, on the other families",
            t.name(),
            shape.label()
        )));
    }
    let (tk, tw) = (t.tk, t.tw);
    let qt = (phase_columns(shape) as u64).div_ceil(tw as u64);
    let kt = (shape.kg() as u64).div_ceil(tk as u64);
    let sp_blocks = (shape.oh() as u64 * qt * shape.stride.1 as u64).div_ceil(t.wg_x as u64);
    let k_blocks = (shape.groups as u64 * kt).div_ceil(t.wg_y as u64);

    let mut setup = String::new();
    for i in 0..tk {
        // Channels past the group's last tile read its last channel and are not stored.
        writeln!(setup, "    let wk{i} = min(kk0 + {i}, KG - 1) * R * S;").unwrap();
    }
    for i in 0..tk {
        for j in 0..tw {
            writeln!(setup, "    var a{i}_{j}: f32 = 0.0;").unwrap();
        }
    }
    let mut tap = String::new();
    for j in 0..tw {
        writeln!(tap, "            let iw{j} = iwq + {j};").unwrap();
        writeln!(tap, "            let ok{j} = iw{j} >= 0 && iw{j} < W;").unwrap();
        writeln!(tap, "            let xo{j} = select(0, iw{j} * XSW, ok{j});").unwrap();
    }
    // A column outside x has no input: its term is left out, not added as 0 * w (which a
    // NaN or infinite weight would turn into NaN, unlike PyTorch's scatter).
    let mut inner = String::new();
    let ind = "                ";
    for j in 0..tw {
        writeln!(inner, "{ind}let xv{j} = f32(x[xc + xo{j}]);").unwrap();
    }
    for i in 0..tk {
        writeln!(inner, "{ind}let wv{i} = f32(w[wc + wk{i}]);").unwrap();
    }
    for j in 0..tw {
        for i in 0..tk {
            writeln!(inner, "{ind}a{i}_{j} = select(a{i}_{j}, fma(xv{j}, wv{i}, a{i}_{j}), ok{j});").unwrap();
        }
    }
    let mut store = String::new();
    for i in 0..tk {
        writeln!(store, "    if (kk0 + {i} < KG) {{").unwrap();
        writeln!(store, "        let k = g * KG + kk0 + {i};").unwrap();
        writeln!(store, "        let yrow = i32(n) * YSN + k * YSK + oh * OW * YSP;").unwrap();
        for j in 0..tw {
            writeln!(store, "        {{ let ow = phase + (q * {tw} + {j}) * SW;").unwrap();
            writeln!(store, "          if (ow < OW) {{ let yi = ystore(yrow + ow * YSP); y[yi] = DT(epilogue(a{i}_{j}, k, yi)); }} }}")
                .unwrap();
        }
        writeln!(store, "    }}").unwrap();
    }

    let mut vars = shape_vars(shape, &t.name());
    vars.extend([
        ("TK", tk.to_string()),
        ("TW", tw.to_string()),
        ("WG_X", t.wg_x.to_string()),
        ("WG_Y", t.wg_y.to_string()),
        ("QT", qt.to_string()),
        ("KT", kt.to_string()),
        ("RSTEP", tap_step(shape.stride.0, shape.dilation.0).to_string()),
        ("SSTEP", tap_step(shape.stride.1, shape.dilation.1).to_string()),
        ("SP_BLOCKS", sp_blocks.to_string()),
        ("K_BLOCKS", k_blocks.to_string()),
        ("SETUP", setup),
        ("TAP", tap),
        ("INNER", inner),
        ("STORE", store),
    ]);
    Ok(Kernel::plain(render(Tconv::TEMPLATE, &vars)?, sp_blocks * k_blocks * shape.n as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_taps_step_by_stride_over_the_common_divisor() {
        assert_eq!(tap_step(2, 1), 2);
        assert_eq!(tap_step(4, 2), 2);
        assert_eq!(tap_step(3, 3), 1);
        assert_eq!(tap_step(1, 5), 1);
    }
}
