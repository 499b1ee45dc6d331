//! The A side's gathers (pixels x reduction terms) per layout, and the tests a gather
//! needs where tiles can run past the problem's edges.

use super::variant::*;
use crate::codegen::LANES;
use crate::kernels::implicit::{self, View};
use crate::kernels::padding::PadIndex;
use crate::params::ConvShape;
use std::fmt::Write as _;

/// Layout 0's A slots: this invocation's four consecutive pixels 4*am .. 4*am+3 of the tile,
/// the same in every slot because the invocation count is a multiple of the chunks per k
/// row, and each slot's reduction index as (channel, row, column) digits.
pub(super) fn a_setup_in_place(v: &Coop, a_slots: u32) -> String {
    let mut s = String::new();
    let chunks_per_k = v.bm / 4;
    writeln!(s, "    let am = lid % {chunks_per_k};").unwrap();
    for p in 0..4 {
        implicit::write_pixel(&mut s, &p.to_string(), &format!("m0 + 4 * am + {p}"), ("CH * H * W", "W", ""));
    }
    for i in 0..a_slots {
        writeln!(s, "    let ak{i} = (lid + {}) / {chunks_per_k};", i * v.threads()).unwrap();
        implicit::write_reduction_index(&mut s, i, &format!("ak{i}"));
        writeln!(s, "    var pa{i}: vec4<f32>;").unwrap();
    }
    s
}

/// Layout 1's A slots: one pixel each (row `arow{i}` of the tile), and terms 4*acol ..
/// 4*acol+3 of each k-step, the same in every slot for the same reason as above.
pub(super) fn a_setup_channels_last(v: &Coop, a_slots: u32) -> String {
    let mut s = String::new();
    let chunks_per_row = v.bk / v.a_chunk();
    let (reg, _, _) = gather_register(v.layout);
    writeln!(s, "    let acol = lid % {chunks_per_row};").unwrap();
    for i in 0..a_slots {
        writeln!(s, "    let arow{i} = (lid + {}) / {chunks_per_row};", i * v.threads()).unwrap();
        implicit::write_pixel_position(&mut s, &i.to_string(), &format!("m0 + arow{i}"));
        // Where the pixel's window starts in the (N, H, W, C) copy; only used in range.
        writeln!(s, "    let abase{i} = (((apix{i} / OHW) * H + aih{i}) * W + aiw{i}) * CHP + g * CP;").unwrap();
        writeln!(s, "    var pa{i}: {reg};").unwrap();
    }
    s
}

/// A padding mode's gather: the zero-padding index (at row `ih`, column `iw`, both possibly
/// outside x) moved to the row and column the mode reads, in elements of x given one
/// column's (`column`: "" for one element), and the window test it makes needless (every
/// read is inside x); for zero padding, or nothing padded, no move and the window test.
fn mode_gather(shape: &ConvShape, column: &str) -> (String, &'static str) {
    let check = implicit::window_check(shape);
    if shape.padding_mode.is_zeros() || check.is_empty() {
        return (String::new(), check);
    }
    let p = PadIndex(shape.padding_mode);
    (format!(" + (({} - ih) * W + {} - iw){column}", p.row("ih"), p.col("iw")), "")
}

/// Layout 0's gathers: each slot's four pixels at its reduction index, one element each.
pub(super) fn fetch_in_place(s: &mut String, a_slots: u32, shape: &ConvShape, quads: bool) {
    let (shift, check) = mode_gather(shape, "");
    for i in 0..a_slots {
        if quads {
            // A 1x1 window at stride 1: the slot's term is channel kc of the four pixels.
            writeln!(s, "    {{").unwrap();
            writeln!(s, "        let ok = aok0 && kc{i} < CG;").unwrap();
            writeln!(s, "        pa{i} = select(vec4<f32>(0.0), vec4<f32>(x[select(0, (abase0 + kc{i} * H * W) / 4, ok)]), ok);").unwrap();
            writeln!(s, "    }}").unwrap();
            continue;
        }
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let khd = kh{i} * DH;").unwrap();
        writeln!(s, "        let kwd = kw{i} * DW;").unwrap();
        writeln!(s, "        let koff = kc{i} * H * W + khd * W + kwd;").unwrap();
        writeln!(s, "        let kok = kc{i} < CG;").unwrap();
        for (p, lane) in LANES.iter().enumerate() {
            writeln!(s, "        {{").unwrap();
            writeln!(s, "            let ih = aih{p} + khd;").unwrap();
            writeln!(s, "            let iw = aiw{p} + kwd;").unwrap();
            writeln!(s, "            let ok = aok{p} && kok{check};").unwrap();
            writeln!(s, "            pa{i}.{lane} = select(0.0, f32(x[select(0, abase{p} + koff{shift}, ok)]), ok);").unwrap();
            writeln!(s, "        }}").unwrap();
        }
        writeln!(s, "    }}").unwrap();
    }
}

/// Where the gathers of a channels-last variant may leave tests out: problems without a
/// kernel window to test (no padding), unsplit. On the GEMM of 8192^3 as a 1x1 float16
/// convolution (H200) this took 128x256x32 tiles from 128 to 252 TFLOP/s (the tests' registers
/// had pushed the 4x4 accumulator grids out of registers); with windows to test it measured
/// 0-20% slower, so those keep every test.
pub(super) struct Lean {
    pub(super) on: bool,
    /// Every pixel tile whole (M a multiple of BM), every channel tile (KG of BN), every
    /// reduction step (KL of BK; the gathers past the last step are then skipped).
    pub(super) m: bool,
    pub(super) n: bool,
    pub(super) k: bool,
}

impl Lean {
    pub(super) fn of(v: &Coop, shape: &ConvShape) -> Self {
        let on = v.channels_last() && !v.windowed() && v.splits == 1 && implicit::window_check(shape).is_empty();
        Lean {
            on,
            m: on && View::of(shape).m % v.bm as u64 == 0,
            n: on && shape.kg() as u64 % v.bn as u64 == 0,
            k: on && Padded::of(shape).krp % v.bk as u64 == 0,
        }
    }

    /// The tests `parts` (each left out where its flag says no tile fails it) and `rest`
    /// (" && ..." or empty) joined by &&; empty when none is left.
    pub(super) fn conj(&self, parts: &[(&str, bool)], rest: &str) -> String {
        let mut terms: Vec<&str> = parts.iter().filter(|(_, whole)| !whole).map(|(t, _)| *t).collect();
        let rest = rest.trim_start_matches(" && ");
        if !rest.is_empty() {
            terms.push(rest);
        }
        terms.join(" && ")
    }
}

/// One lean gather of `chunk` terms at term index `at` of `buf` into register `reg`: an
/// unsigned shift for the index (`at` is never negative where it is used), zeros unless `ok`
/// (no test at all when `ok` is empty). Layout 2 keeps the 16 bytes as loaded.
pub(super) fn gather(s: &mut String, reg: &str, layout: u32, buf: &str, at: &str, chunk: u32, ok: &str) {
    let shift = chunk.trailing_zeros();
    let (_, zero, load) = gather_register(layout);
    if ok.is_empty() {
        writeln!(s, "        {reg} = {load}({buf}[u32({at}) >> {shift}u]);").unwrap();
    } else {
        writeln!(s, "        {reg} = select({zero}, {load}({buf}[select(0u, u32({at}) >> {shift}u, {ok})]), {ok});").unwrap();
    }
}

/// Layout 1's gathers: the step's four terms (channels c .. c+3 of one (r, s), decoded once
/// per step) for each slot's pixel, one 16-byte load each.
pub(super) fn fetch_channels_last(s: &mut String, v: &Coop, a_slots: u32, shape: &ConvShape, x_buf: &str) {
    let chunk = v.a_chunk();
    let lean = Lean::of(v, shape);
    let (shift, check) = mode_gather(shape, " * CHP");
    let (_, zero, load) = gather_register(v.layout);
    writeln!(s, "    {{").unwrap();
    writeln!(s, "        let kr = k_next + {chunk} * acol;").unwrap();
    writeln!(s, "        let krs = kr / CP;").unwrap();
    writeln!(s, "        let khd = (krs / S) * DH;").unwrap();
    writeln!(s, "        let kwd = (krs % S) * DW;").unwrap();
    writeln!(s, "        let koff = (khd * W + kwd) * CHP + kr % CP;").unwrap();
    writeln!(s, "        let kok = kr < k_end;").unwrap();
    for i in 0..a_slots {
        writeln!(s, "        {{").unwrap();
        writeln!(s, "            let ih = aih{i} + khd;").unwrap();
        writeln!(s, "            let iw = aiw{i} + kwd;").unwrap();
        if lean.on {
            let aok = format!("aok{i}");
            let ok = lean.conj(&[(&aok, lean.m), ("kok", lean.k)], implicit::window_check(shape));
            gather(s, &format!("pa{i}"), v.layout, x_buf, &format!("abase{i} + koff"), chunk, &ok);
            writeln!(s, "        }}").unwrap();
            continue;
        }
        writeln!(s, "            let ok = aok{i} && kok{check};").unwrap();
        writeln!(s, "            pa{i} = select({zero}, {load}({x_buf}[select(0, (abase{i} + koff{shift}) / {chunk}, ok)]), ok);").unwrap();
        writeln!(s, "        }}").unwrap();
    }
    writeln!(s, "    }}").unwrap();
}
