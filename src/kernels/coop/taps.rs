//! Dead taps of a lowered transposed convolution. Where the kernel is not a multiple of the
//! stride, some phases reach fewer of the lowered kernel's taps (a 3x3 kernel at stride 2:
//! 9 of the 16 lowered products count); their weights are zero. With phase-major channels
//! and each workgroup's channels within one phase, the k-steps skip the taps (for layout 4,
//! the kernel rows) the workgroup's phase never reaches. The skipping is in the step loop's
//! bounds (each step finds the next live one), not in a branch around the products:
//! cooperative matrix operations need control flow naga can prove uniform, and it counts a
//! loop variable as non-uniform.

use super::variant::*;
use crate::kernels::phases;
use crate::params::ConvShape;
use std::fmt::Write as _;

/// How a kernel's steps map to the units that are live or dead: step s is unit
/// `(s / per) % span`, and the next unit starts at `(s / per + 1) * per` (WGSL).
pub(super) struct Units {
    pub(super) per: &'static str,
    pub(super) span: &'static str,
}

/// Layouts 1 and 2 step over reduction terms, a tap's CP channels at a time; window tiles
/// over (channel block, tap), or (`rows`: layout 4 on kernels wider than a tap) over
/// (channel block, kernel row).
pub(super) fn units(v: &Coop, rows: bool) -> Units {
    match (v.layout, rows) {
        (1 | 2, _) => Units { per: "CP", span: "R * S" },
        (_, false) => Units { per: "1", span: "R * S" },
        (_, true) => Units { per: "1", span: "SPB" },
    }
}

/// Whether a step takes a kernel row rather than a tap: layout 4's window tiles on kernels
/// wider than one tap (`windowed`: the kernel runs as window tiles).
pub(super) fn row_steps(v: &Coop, shape: &ConvShape, windowed: bool) -> bool {
    windowed && v.taps_per_step(shape.s) > 1
}

/// Per phase, the mask of live units (taps r * S + s, or kernel rows for layout 4), where
/// this kernel can skip the others: channels-last layouts (layouts 1 and 2 where a step is one
/// tap's run of channels, the padded channels whole steps), a phase's channels whole tiles.
pub(super) fn live_units(v: &Coop, shape: &ConvShape, windowed: bool) -> Option<Vec<u32>> {
    let sc = shape.scatter?;
    let whole_steps = windowed || Padded::of(shape).cp % v.bk as u64 == 0;
    if v.layout == 0 || sc.kg % v.bn != 0 || !whole_steps {
        return None;
    }
    let taps = phases::live_taps(shape)?;
    if !row_steps(v, shape, windowed) {
        return Some(taps);
    }
    // A row is live where one of its taps is.
    let row = (1u32 << shape.s) - 1;
    Some(taps.iter().map(|m| (0..shape.r).filter(|r| m >> (r * shape.s) & row != 0).map(|r| 1 << r).sum()).collect())
}

/// The share of the steps a kernel takes: its live units over all, averaged over the phases
/// (1 where it skips none); `windowed`: the kernel runs as window tiles. The cost counts the
/// products done; where the grid is one wave, the phases reaching the most taps set the
/// time instead.
pub(super) fn live_share(v: &Coop, shape: &ConvShape, windowed: bool) -> f64 {
    let Some(masks) = live_units(v, shape, windowed) else {
        return 1.0;
    };
    let units = if row_steps(v, shape, windowed) { shape.r } else { shape.r * shape.s };
    let live: u32 = masks.iter().map(|m| m.count_ones()).sum();
    live as f64 / (masks.len() as f64 * units as f64)
}

/// The module's `next_live`: the first step from `t` on (before `end`) whose unit is live.
pub(super) const NEXT_LIVE: &str = "
// The first step from t on (before end) whose tap, or kernel row, this workgroup's phase
// reaches (`live`): step s is unit (s / per) % span.
fn next_live(t: i32, end: i32, live: u32, per: i32, span: i32) -> i32 {
    var s = t;
    loop {
        if (s >= end || ((live >> u32((s / per) % span)) & 1u) != 0u) {
            break;
        }
        s = (s / per + 1) * per;
    }
    return s;
}
";

/// The workgroup's phase, its live units (`live`, picked by a chain of selects: naga counts an
/// indexed constant array as non-uniform) and the first of them (`first_live`).
pub(super) fn live_decl(masks: &[u32], kgf: u32) -> String {
    let mut pick = format!("{}u", masks[0]);
    for (p, m) in masks.iter().enumerate().skip(1) {
        pick = format!("select({pick}, {m}u, phase == {p})");
    }
    let mut s = String::new();
    writeln!(s, "    // This workgroup's phase (its channels are one phase's: phase-major, {kgf} each), the").unwrap();
    writeln!(s, "    // lowered taps (layout 4: kernel rows) it reaches, and the first of them.").unwrap();
    writeln!(s, "    let phase = n0 / {kgf};\n    let live = {pick};\n    let first_live = i32(firstTrailingBit(live));").unwrap();
    s
}

/// `next_live` from step `t` to `end` over `v`'s units (`rows`: see `units`).
pub(super) fn next_live(v: &Coop, t: &str, end: &str, rows: bool) -> String {
    let u = units(v, rows);
    format!("next_live({t}, {end}, live, {}, {})", u.per, u.span)
}
