//! Kernel variants: the knobs a generated shader is built with, the space the tuner searches,
//! and the untuned default rule.

use crate::error::{Error, Result};
use crate::params::ConvShape;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Direct convolution: one invocation computes `tk` output channels x `tw` output columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Direct {
    pub wg_x: u32,
    pub wg_y: u32,
    /// How much of the channel x window loop is written out: 0 = both looped,
    /// 1 = the R x S window written out, u > 1 = the window and `u` channels written out.
    pub unroll: u32,
    pub tk: u32,
    pub tw: u32,
}

/// Implicit GEMM: M = N*OH*OW rows, K columns, reduction C/groups*R*S, gathered from x
/// directly (no im2col buffer), staged through workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Gemm {
    /// Workgroup tile: `bm` output pixels x `bn` output channels, reduction step `bk`.
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    /// Register tile per invocation: `tm` x `tn` outputs, written out as scalars.
    pub tm: u32,
    pub tn: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum Variant {
    Direct(Direct),
    Gemm(Gemm),
}

impl Variant {
    pub fn family(&self) -> &'static str {
        match self {
            Variant::Direct(_) => "direct",
            Variant::Gemm(_) => "gemm",
        }
    }

    /// Invocations in one workgroup.
    pub fn invocations(&self) -> u32 {
        match self {
            Variant::Direct(d) => d.wg_x * d.wg_y,
            Variant::Gemm(g) => (g.bm / g.tm) * (g.bn / g.tn),
        }
    }

    /// Bytes of workgroup memory the variant declares.
    pub fn workgroup_bytes(&self) -> u32 {
        match self {
            Variant::Direct(_) => 0,
            // Two stages of the A and B tiles (double buffering).
            Variant::Gemm(g) => 2 * 4 * g.bk * (g.bm + g.bn),
        }
    }

    /// The knobs as (name, value) pairs, for reports.
    pub fn knobs(&self) -> Vec<(&'static str, u32)> {
        match *self {
            Variant::Direct(d) => vec![
                ("wg_x", d.wg_x), ("wg_y", d.wg_y), ("unroll", d.unroll), ("tk", d.tk), ("tw", d.tw),
            ],
            Variant::Gemm(g) => vec![
                ("bm", g.bm), ("bn", g.bn), ("bk", g.bk), ("tm", g.tm), ("tn", g.tn),
            ],
        }
    }

    /// Whether the adapter can run it at all.
    pub fn fits(&self, limits: &wgpu::Limits) -> bool {
        let wg_dims_ok = match *self {
            Variant::Direct(d) => {
                d.wg_x <= limits.max_compute_workgroup_size_x
                    && d.wg_y <= limits.max_compute_workgroup_size_y
            }
            Variant::Gemm(g) => (g.bm / g.tm) * (g.bn / g.tn) <= limits.max_compute_workgroup_size_x,
        };
        wg_dims_ok
            && self.invocations() <= limits.max_compute_invocations_per_workgroup
            && self.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Variant::Direct(d) => write!(
                f, "direct_wg{}x{}_u{}_k{}w{}", d.wg_x, d.wg_y, d.unroll, d.tk, d.tw
            ),
            Variant::Gemm(g) => write!(
                f, "gemm_b{}x{}x{}_t{}x{}", g.bm, g.bn, g.bk, g.tm, g.tn
            ),
        }
    }
}

fn numbers(s: &str) -> Vec<u32> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .filter_map(|t| t.parse().ok())
        .collect()
}

impl FromStr for Variant {
    type Err = Error;

    /// Parses the names `Display` writes, e.g. `direct_wg64x1_u1_k4w1`, `gemm_b64x64x8_t4x4`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "unknown variant name {s:?}; expected e.g. 'direct_wg64x1_u1_k4w1' or 'gemm_b64x64x8_t4x4'"
            ))
        };
        let v = if let Some(rest) = s.strip_prefix("direct_wg") {
            match numbers(rest)[..] {
                [wg_x, wg_y, unroll, tk, tw] => Variant::Direct(Direct { wg_x, wg_y, unroll, tk, tw }),
                _ => return Err(bad()),
            }
        } else if let Some(rest) = s.strip_prefix("gemm_b") {
            match numbers(rest)[..] {
                [bm, bn, bk, tm, tn] => Variant::Gemm(Gemm { bm, bn, bk, tm, tn }),
                _ => return Err(bad()),
            }
        } else {
            return Err(bad());
        };
        if v.to_string() != s || !v.well_formed() {
            return Err(bad());
        }
        Ok(v)
    }
}

const DIRECT_WG: [(u32, u32); 8] =
    [(64, 1), (128, 1), (256, 1), (32, 2), (16, 4), (32, 4), (8, 8), (16, 16)];
const DIRECT_UNROLL: [u32; 4] = [0, 1, 2, 4];
const DIRECT_TK: [u32; 4] = [1, 2, 4, 8];
const DIRECT_TW: [u32; 3] = [1, 2, 4];

const GEMM_TILES: [(u32, u32); 8] =
    [(32, 32), (64, 32), (32, 64), (64, 64), (128, 32), (128, 64), (128, 128), (256, 64)];
const GEMM_BK: [u32; 3] = [8, 16, 32];
const GEMM_THREAD: [(u32, u32); 4] = [(4, 4), (8, 4), (4, 8), (8, 8)];

impl Variant {
    /// Structural sanity, independent of any shape or adapter.
    pub fn well_formed(&self) -> bool {
        match *self {
            Variant::Direct(d) => {
                DIRECT_WG.contains(&(d.wg_x, d.wg_y))
                    && DIRECT_UNROLL.contains(&d.unroll)
                    && DIRECT_TK.contains(&d.tk)
                    && DIRECT_TW.contains(&d.tw)
            }
            Variant::Gemm(g) => {
                GEMM_TILES.contains(&(g.bm, g.bn))
                    && GEMM_BK.contains(&g.bk)
                    && GEMM_THREAD.contains(&(g.tm, g.tn))
                    && g.bm % g.tm == 0
                    && g.bn % g.tn == 0
                    // Each invocation loads whole rows of the staged tiles.
                    && (g.bm * g.bk) % self.invocations() == 0
                    && (g.bn * g.bk) % self.invocations() == 0
                    && (64..=256).contains(&self.invocations())
            }
        }
    }
}

/// Every variant the generator can emit, over all families.
pub fn all_variants() -> Vec<Variant> {
    let mut out = Vec::new();
    for &(wg_x, wg_y) in &DIRECT_WG {
        for &unroll in &DIRECT_UNROLL {
            for &tk in &DIRECT_TK {
                for &tw in &DIRECT_TW {
                    out.push(Variant::Direct(Direct { wg_x, wg_y, unroll, tk, tw }));
                }
            }
        }
    }
    for &(bm, bn) in &GEMM_TILES {
        for &bk in &GEMM_BK {
            for &(tm, tn) in &GEMM_THREAD {
                let v = Variant::Gemm(Gemm { bm, bn, bk, tm, tn });
                if v.well_formed() {
                    out.push(v);
                }
            }
        }
    }
    out
}

/// Whether a variant makes sense for this shape: no tile far larger than the problem, and
/// no written-out loop that bloats the shader beyond reason.
pub fn suits(v: &Variant, shape: &ConvShape) -> bool {
    match *v {
        Variant::Direct(d) => {
            let window = shape.r * shape.s;
            let unrolled_terms = window * d.tk * d.tw * d.unroll.max(1);
            d.tk <= shape.kg().next_power_of_two()
                && d.tw <= shape.ow().next_power_of_two()
                && d.unroll <= shape.cg().next_power_of_two()
                && unrolled_terms <= 2048
        }
        Variant::Gemm(g) => {
            let m = shape.n as u64 * shape.oh() as u64 * shape.ow() as u64;
            let red = shape.cg() * shape.r * shape.s;
            g.bn <= shape.kg().next_power_of_two().max(32)
                && (g.bm as u64) <= m.next_power_of_two().max(32)
                && g.bk <= red.next_power_of_two().max(8)
        }
    }
}

/// The untuned choice: a rule on the shape and the adapter's limits.
pub fn default_variant(shape: &ConvShape, limits: &wgpu::Limits) -> Variant {
    let m = shape.n as u64 * shape.oh() as u64 * shape.ow() as u64;
    let red = shape.cg() * shape.r * shape.s;
    // GEMM tiles pay off once both the pixel and the channel side fill a tile and the
    // reduction is deep enough to amortise staging through workgroup memory.
    if shape.kg() >= 32 && m >= 4096 && red >= 32 {
        let g = Variant::Gemm(Gemm { bm: 64, bn: 64, bk: 16, tm: 4, tn: 4 });
        if g.fits(limits) {
            return g;
        }
    }
    let tk = if shape.kg() >= 4 { 4 } else { 1 };
    let unroll = if shape.r * shape.s <= 49 { 1 } else { 0 };
    let v = Variant::Direct(Direct { wg_x: 64, wg_y: 1, unroll, tk, tw: 1 });
    debug_assert!(v.fits(limits));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for v in all_variants() {
            assert_eq!(v.to_string().parse::<Variant>().unwrap(), v);
        }
        assert!("direct_wg64x1_u3_k4w1".parse::<Variant>().is_err());
        assert!("gemm_b64x64".parse::<Variant>().is_err());
        assert!("nonsense".parse::<Variant>().is_err());
    }

    #[test]
    fn space_has_both_families() {
        let all = all_variants();
        assert!(all.iter().any(|v| v.family() == "direct"));
        assert!(all.iter().any(|v| v.family() == "gemm"));
        assert!(all.iter().all(|v| v.well_formed()));
    }
}
