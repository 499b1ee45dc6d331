//! The implicit-GEMM view of a convolution, shared by the families that tile it (`gemm`,
//! `coop`): M = N*OH*OW output pixels, KG output channels per group, reduction CG*R*S gathered
//! from x on the fly. Sizes for tiling and cost, and the WGSL both families use to gather.

use super::cost::ceil_to;
use crate::params::ConvShape;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug)]
pub struct View {
    pub m: u64,
    pub kg: u64,
    pub groups: u64,
    pub red: u64,
}

impl View {
    pub fn of(shape: &ConvShape) -> View {
        View {
            m: shape.n as u64 * shape.oh() as u64 * shape.ow() as u64,
            kg: shape.kg() as u64,
            groups: shape.groups as u64,
            red: shape.cg() as u64 * shape.r as u64 * shape.s as u64,
        }
    }

    /// Workgroup tiles of `bm` x `bn`: (along M, along N, in all groups).
    pub fn grid(&self, bm: u32, bn: u32) -> (u64, u64, u64) {
        let (mb, nb) = (self.m.div_ceil(bm as u64), self.kg.div_ceil(bn as u64));
        (mb, nb, mb * nb * self.groups)
    }

    /// Multiply-adds a kernel with `bm` x `bn` x `bk` tiles executes, tile padding included.
    pub fn padded_fmas(&self, bm: u32, bn: u32, bk: u32) -> f64 {
        (ceil_to(self.m, bm as u64) * ceil_to(self.kg, bn as u64) * self.groups * ceil_to(self.red, bk as u64))
            as f64
    }

    /// No tile side far beyond the problem's: each at most the problem's size rounded up to
    /// a power of two, or `least` (bm, bn, bk), whichever is larger.
    pub fn tiles_suit(&self, (bm, bn, bk): (u32, u32, u32), least: (u32, u32, u32)) -> bool {
        bn as u64 <= self.kg.next_power_of_two().max(least.1 as u64)
            && bm as u64 <= self.m.next_power_of_two().max(least.0 as u64)
            && bk as u64 <= self.red.next_power_of_two().max(least.2 as u64)
    }

    /// The template values every tiled implicit-GEMM kernel uses.
    pub fn grid_vars(&self, bm: u32, bn: u32) -> Vec<(&'static str, String)> {
        let (mb, nb, blocks) = self.grid(bm, bn);
        vec![
            ("M", self.m.to_string()),
            ("M_BLOCKS", mb.to_string()),
            ("N_BLOCKS", nb.to_string()),
            ("BLOCKS", blocks.to_string()),
        ]
    }
}

/// Split-K (the `gemm` and `coop` families): partial outputs are kept only for problems
/// whose partials stay this small (split-K is for outputs too small to fill the GPU), and
/// never beyond 4x it, which would not fit one binding on every adapter (lavapipe: 128 MiB).
pub const SPLIT_WORKSPACE: u64 = 32 << 20;
/// Per partial output a split-K variant writes and its finishing pass reads back.
pub const PARTIAL: f64 = 16.0;

/// Bytes of `splits` f32 partial outputs of `shape`.
pub fn partial_bytes(shape: &ConvShape, splits: u32) -> u64 {
    shape.y_len() * splits as u64 * 4
}

/// Each split's share of a reduction of `len` terms in whole `bk`-term steps, so only the
/// last part has a tail.
pub fn split_share(len: u64, splits: u32, bk: u32) -> u64 {
    len.div_ceil(splits as u64).div_ceil(bk as u64) * bk as u64
}

/// The test that input row `ih` and column `iw` lie inside the image, as a WGSL `&&` term;
/// empty without padding, where every window lies inside by construction of OH and OW.
pub fn window_check(shape: &ConvShape) -> &'static str {
    if shape.pad == (0, 0) && shape.pad_end == (0, 0) {
        ""
    } else {
        " && ih >= 0 && ih < H && iw >= 0 && iw < W"
    }
}

/// Decodes output pixel `m` (`M - 1` at most, flagged `aok{tag}` when in range) into its
/// top-left input row and column and its base offset in x, given x's strides as template
/// expressions: (image, row, " * column" or "" for a unit column stride).
pub fn write_pixel(s: &mut String, tag: &str, m: &str, (image, row, column): (&str, &str, &str)) {
    write_pixel_position(s, tag, m);
    writeln!(s, "    let abase{tag} = (apix{tag} / OHW) * {image} + x_group + aih{tag} * {row} + aiw{tag}{column};")
        .unwrap();
}

/// Decodes output pixel `m` (`M - 1` at most, flagged `aok{tag}` when in range) into
/// `apix{tag}` and the top-left input row `aih{tag}` and column `aiw{tag}` of its window.
pub fn write_pixel_position(s: &mut String, tag: &str, m: &str) {
    writeln!(s, "    let aok{tag} = {m} < M;").unwrap();
    writeln!(s, "    let apix{tag} = min({m}, M - 1);").unwrap();
    writeln!(s, "    let arem{tag} = apix{tag} % OHW;").unwrap();
    writeln!(s, "    let aih{tag} = (arem{tag} / OW) * SH - PH;").unwrap();
    writeln!(s, "    let aiw{tag} = (arem{tag} % OW) * SW - PW;").unwrap();
}

/// A slot's reduction index, from its flat value `flat`, kept as (channel, row, column)
/// and advanced by carries each step instead of divided out of a flat index.
pub fn write_reduction_index(s: &mut String, slot: u32, flat: &str) {
    writeln!(s, "    var kc{slot}: i32 = ({flat}) / (R * S);").unwrap();
    writeln!(s, "    var kh{slot}: i32 = (({flat}) / S) % R;").unwrap();
    writeln!(s, "    var kw{slot}: i32 = ({flat}) % S;").unwrap();
}

/// Moves slot indices on by `bk`: add bk's (channel, row, column) digits, then carry. Each
/// digit sum stays below twice its base, so one carry per digit suffices.
pub fn write_reduction_advance(s: &mut String, slots: u32, bk: u32, shape: &ConvShape, indent: &str) {
    let (ci, ri, si) = (bk / (shape.r * shape.s), (bk / shape.s) % shape.r, bk % shape.s);
    for i in 0..slots {
        writeln!(s, "{indent}kw{i} = kw{i} + {si};").unwrap();
        writeln!(s, "{indent}kh{i} = kh{i} + {ri};").unwrap();
        writeln!(s, "{indent}kc{i} = kc{i} + {ci};").unwrap();
        writeln!(s, "{indent}if (kw{i} >= S) {{ kw{i} = kw{i} - S; kh{i} = kh{i} + 1; }}").unwrap();
        writeln!(s, "{indent}if (kh{i} >= R) {{ kh{i} = kh{i} - R; kc{i} = kc{i} + 1; }}").unwrap();
    }
}
