//! Scattered stores on every family. A transposed problem is computed as its lowered form
//! ([`ConvShape::lowered`]), a stride-1 convolution whose output channels are the stride
//! phases and whose store scatters each phase to its rows and columns; a pixel-shuffled one
//! as the same conv with its channels reordered phase-major ([`ConvShape::shuffle_lowered`]),
//! so that channels-last stores stay contiguous. This module writes the pass that
//! rearranges w into the lowered weights (transposed: (C, K/groups, R, S) into (phases * K,
//! C/groups, ceil(R/SH), ceil(S/SW)); shuffled: w's rows permuted); the families generate the
//! convolution itself on the lowered shape as on any other.

use crate::codegen::{render, shape_vars, WeightPrep};
use crate::error::{Error, Result};
use crate::params::ConvShape;

pub(super) const TEMPLATE: &str = include_str!("../../shaders/phases.wgsl");
pub(super) const SHUFFLE_TEMPLATE: &str = include_str!("../../shaders/shuffle_weights.wgsl");

/// The weight pass for `shape` (transposed, or pixel-shuffled in NHWC), whose scatter form
/// is `lowered`.
pub fn weight_prep(shape: &ConvShape, lowered: &ConvShape, variant: &str) -> Result<WeightPrep> {
    let sc = lowered
        .scatter
        .ok_or_else(|| Error::invalid(format!("{} is not a scatter form", lowered.label())))?;
    let len = lowered.w_len();
    let mut vars = shape_vars(shape, variant);
    vars.retain(|(k, _)| matches!(*k, "VARIANT" | "SHAPE" | "ENABLES" | "DT" | "KG" | "CG" | "R" | "S" | "SH" | "SW"));
    // The scatter's phases and output channels per group, which both passes decode.
    vars.extend([
        ("LEN", len.to_string()),
        ("PHASES_Q", (sc.phases.0 * sc.phases.1).to_string()),
        ("KGF", sc.kg.to_string()),
    ]);
    let template = if sc.shuffle {
        vars.push(("ROW", (lowered.cg() * lowered.r * lowered.s).to_string()));
        SHUFFLE_TEMPLATE
    } else {
        let (phase, cf) = if sc.phase_major { ("n / KGF", "n % KGF") } else { ("n % PQ", "n / PQ") };
        vars.extend([
            ("PHASES", (shape.stride.0 * shape.stride.1).to_string()),
            ("Q", sc.inner.to_string()),
            ("A", lowered.r.to_string()),
            ("B", lowered.s.to_string()),
            ("RE", sc.kernel.0.to_string()),
            ("SE", sc.kernel.1.to_string()),
            ("DH", sc.holes.0.to_string()),
            ("DW", sc.holes.1.to_string()),
            ("PHASE_OF_N", phase.to_string()),
            ("CF_OF_N", cf.to_string()),
        ]);
        TEMPLATE
    };
    Ok(WeightPrep {
        source: render(template, &vars)?,
        workgroups: len.div_ceil(256),
        bytes: lowered.dtype.buffer_bytes(len),
    })
}

/// Per phase of a lowered transposed convolution in phase-major channel order (phase p's
/// channels are `p * KGF ..`), the lowered kernel's taps (bit `a * S + b`) whose weights
/// are not all zero: where the transposed kernel is not a multiple of the stride, a phase
/// reaches fewer taps (a 3x3 kernel at stride 2: 1, 2, 2 and 4 of the 2x2 lowered taps).
/// `None` where every phase has every tap, for other scatters, and past 32 taps.
pub fn live_taps(lowered: &ConvShape) -> Option<Vec<u32>> {
    let sc = lowered.scatter?;
    let (a_n, b_n) = (lowered.r, lowered.s);
    if sc.shuffle || !sc.phase_major || a_n * b_n > 32 {
        return None;
    }
    let q = sc.inner;
    let (sh, sw) = (sc.phases.0 / q, sc.phases.1 / q);
    let masks: Vec<u32> = (0..sc.phases.0 * sc.phases.1)
        .map(|phase| {
            // As shaders/phases.wgsl maps a phase and a lowered tap to the transposed tap.
            let (ph_h, ph_w) = (phase / sc.phases.1, phase % sc.phases.1);
            let mut live = 0;
            for a in 0..a_n {
                for b in 0..b_n {
                    let (r, s) = (ph_h / q + (a_n - 1 - a) * sh, ph_w / q + (b_n - 1 - b) * sw);
                    if r < sc.kernel.0 && s < sc.kernel.1 && r % sc.holes.0 == 0 && s % sc.holes.1 == 0 {
                        live |= 1 << (a * b_n + b);
                    }
                }
            }
            live
        })
        .collect();
    let all = if a_n * b_n == 32 { u32::MAX } else { (1 << (a_n * b_n)) - 1 };
    masks.iter().any(|&m| m != all).then_some(masks)
}

/// Whether the FMA families' stores of `lowered` check for non-finite outputs: a transposed
/// convolution's lowered form multiplies x by its dead taps' zero weights (a phase the kernel
/// does not reach) and by its padding, products the transposed convolution does not have,
/// so one Inf or NaN in x would come out NaN where the reference is finite or infinite.
/// Where an invocation stores an Inf or NaN, it sums those outputs again over the live
/// products in reach only ([`redo`]); a finite output had only finite products, so its dead
/// ones were exact zeros and it never takes that path.
pub fn resums(lowered: &ConvShape) -> bool {
    lowered.scatter.is_some_and(|sc| !sc.shuffle)
}

/// The WGSL behind [`resums`] (empty where it does not apply): `resum_flag(v)` (a store's
/// value, marking the invocation where it is not finite), `resum(v, at, k)` (a single store's
/// value, summed again where it is not finite) and `resum_sum(at, k)`: the live sum of the
/// output at index `at` of the lowered y, lowered channel `k`. `x_at`/`w_at`: x's and w's
/// element `xi`/`wi` as the kernel binds them ([`element`]).
pub fn resum_wgsl(lowered: &ConvShape, x_at: &str, w_at: &str) -> String {
    let Some(sc) = lowered.scatter.filter(|_| resums(lowered)) else {
        return String::new();
    };
    let s = lowered;
    let q = sc.inner;
    let (pq_h, pq_w) = sc.phases;
    let [xsn, xsc, xsh, xsw] = s.x_strides();
    let [ysn, ysk, ysp] = s.y_strides();
    let phase = if sc.phase_major { format!("n / {}", sc.kg) } else { format!("n % {}", pq_h * pq_w) };
    format!(
        "
// Non-finite outputs of the lowered form, summed again over live taps within x only (see
// `kernels::phases::resums`).
var<private> resum_bad: bool = false;
fn resum_nonfinite(v: f32) -> bool {{
    return (bitcast<u32>(v) & 0x7F800000u) == 0x7F800000u;
}}
fn resum_flag(v: f32) -> f32 {{
    if (resum_nonfinite(v)) {{
        resum_bad = true;
    }}
    return v;
}}
fn resum(v: f32, at: i32, k: i32) -> f32 {{
    if (resum_nonfinite(v)) {{
        return resum_sum(at, k);
    }}
    return v;
}}
fn resum_sum(at: i32, k: i32) -> f32 {{
    let img = at / {ysn};
    let p = (at % {ysn} - k * {ysk}) / {ysp};
    let oh = p / {ow};
    let ow = p % {ow};
    let g = k / {kg};
    let n = k % {kg};
    let phase = {phase};
    let rh = (phase / {pq_w}) / {q};
    let rw = (phase % {pq_w}) / {q};
    var acc = 0.0;
    for (var c = 0; c < {cg}; c = c + 1) {{
        for (var a = 0; a < {ka}; a = a + 1) {{
            let ih = oh - {ph} + a * {dh};
            let rt = rh + ({ka} - 1 - a) * {sh};
            if (rt < {kr} && rt % {hh} == 0 && ih >= 0 && ih < {h}) {{
                for (var b = 0; b < {kb}; b = b + 1) {{
                    let iw = ow - {pw} + b * {dw};
                    let st = rw + ({kb} - 1 - b) * {sw};
                    if (st < {ks} && st % {hw} == 0 && iw >= 0 && iw < {w}) {{
                        let xi = img * {xsn} + (g * {cg} + c) * {xsc} + ih * {xsh} + iw * {xsw};
                        let wi = ((k * {cg} + c) * {ka} + a) * {kb} + b;
                        acc = acc + f32({x_at}) * f32({w_at});
                    }}
                }}
            }}
        }}
    }}
    return acc;
}}
",
        ow = s.ow(),
        kg = s.kg(),
        cg = s.cg(),
        ka = s.r,
        kb = s.s,
        ph = s.pad.0,
        pw = s.pad.1,
        // A stride-1 transposed problem's dilation stays in its lowered form.
        dh = s.dilation.0,
        dw = s.dilation.1,
        h = s.h,
        w = s.w,
        sh = pq_h / q,
        sw = pq_w / q,
        kr = sc.kernel.0,
        ks = sc.kernel.1,
        hh = sc.holes.0,
        hw = sc.holes.1,
    )
}

/// The Winograd families' re-sum of non-finite outputs (`direct_sum`, see
/// `padding::direct_sum`) over a `side` x `side` filter: for a lowered transposed
/// convolution the live taps' sum ([`resum_wgsl`]), since its dead taps' zero weights times
/// an Inf in x would make a NaN the transposed convolution does not have; else the plain
/// direct sum.
pub fn direct_sum(shape: &ConvShape, side: usize) -> String {
    if !resums(shape) {
        return super::padding::direct_sum(shape.padding_mode, shape.dilation, side);
    }
    let [ysn, ysk, ysp] = shape.y_strides();
    format!(
        "{}
fn direct_sum(img: i32, g: i32, k: i32, oh: i32, ow: i32, pad0: f32) -> f32 {{
    return resum_sum(img * {ysn} + k * {ysk} + (oh * {ow} + ow) * {ysp}, k);
}}",
        resum_wgsl(shape, &element("x", false), &element("w", false)),
        ow = shape.ow(),
    )
}

/// Element `{name}i` of binding `name`, bound as scalars or as vec4s.
pub fn element(name: &str, vec4: bool) -> String {
    if vec4 {
        format!("{name}[{name}i / 4][{name}i % 4]")
    } else {
        format!("{name}[{name}i]")
    }
}

/// A store's `value` where the invocation redoes its non-finite outputs (see [`resums`]).
pub fn flagged(lowered: &ConvShape, value: &str) -> String {
    if resums(lowered) {
        format!("resum_flag({value})")
    } else {
        value.to_string()
    }
}

/// `value` through `resum` where `lowered` [`resums`]: for a store that is its invocation's
/// only one.
pub fn resummed(lowered: &ConvShape, value: &str, at: &str, k: &str) -> String {
    if resums(lowered) {
        format!("resum({value}, {at}, {k})")
    } else {
        value.to_string()
    }
}

/// After an invocation's stores: where `when` holds (one was not finite: `resum_bad`), `outputs`
/// (a family's loop over the invocation's outputs that stores `resum_sum(at, k)` for each);
/// nothing where `lowered` does not [`resums`]. One loop per kernel, not one sum per store:
/// lavapipe's compiler writes small loops out, and a sum per store took it minutes per kernel.
pub fn redo(lowered: &ConvShape, when: &str, outputs: impl FnOnce() -> String) -> String {
    if resums(lowered) {
        format!("    if ({when}) {{\n{}    }}\n", outputs())
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transposed(x: [usize; 4], w: [usize; 4], st: i64, p: i64, op: i64, groups: i64) -> ConvShape {
        ConvShape::new_transposed(x, w, (st, st), (p, p), (op, op), (1, 1), groups, None).unwrap()
    }

    /// The lowered convolution, its weights rearranged and its outputs scattered as the WGSL
    /// does, gives the transposed convolution's float64 result, across strides, paddings,
    /// output paddings, kernel sizes past and short of a stride multiple, and groups.
    #[test]
    fn lowered_form_computes_the_transposed_convolution() {
        let cases = [
            ([2, 4, 5, 6], [4, 3, 4, 4], 2, 1, 0, 1),
            ([1, 3, 4, 4], [3, 2, 3, 3], 2, 1, 1, 1),
            ([1, 2, 3, 5], [2, 3, 2, 2], 2, 0, 0, 1),
            ([1, 4, 4, 3], [4, 1, 5, 5], 3, 2, 2, 2),
            ([1, 2, 6, 6], [2, 2, 3, 3], 1, 1, 0, 1),
            ([2, 6, 3, 4], [6, 2, 4, 4], 4, 0, 3, 3),
            ([1, 1, 2, 2], [1, 1, 7, 7], 2, 3, 1, 1),
        ];
        for (x, w, st, p, op, g) in cases {
            let t = transposed(x, w, st, p, op, g);
            let xs: Vec<f64> = (0..t.x_len()).map(|i| ((i * 7919) % 23) as f64 - 11.0).collect();
            let ws: Vec<f64> = (0..t.w_len()).map(|i| ((i * 104729) % 19) as f64 - 9.0).collect();
            let want = transposed_f64(&t, &xs, &ws);
            // Both channel orders (channels-first and channels-last problems use one each;
            // the arithmetic does not depend on the layout).
            for phase_major in [false, true] {
                let lo = with_order(t.lowered().unwrap_or_else(|| panic!("{} has no lowered form", t.label())), phase_major);
                let wl = lowered_weights(&t, &lo, &ws);
                let got_lo = conv_f64(&lo, &xs, &wl);
                let mut got = vec![f64::NAN; t.y_len() as usize];
                for (i, v) in got_lo.iter().enumerate() {
                    if let Some(at) = scatter_index(&lo, i as u64) {
                        got[at as usize] = *v;
                    }
                }
                assert_eq!(got, want, "{} phase_major {phase_major}", t.label());
            }
        }
    }

    /// `live_taps` marks exactly the taps whose lowered weights are not all zero, per
    /// phase, with and without a pixel shuffle after the transposed convolution; kernels that
    /// are stride multiples have none dead.
    #[test]
    fn live_taps_are_the_lowered_weights_that_are_not_zero() {
        let cases = [
            (transposed([8, 4, 5, 5], [4, 3, 3, 3], 2, 1, 1, 1), 1),
            (transposed([1, 4, 4, 3], [4, 2, 5, 5], 3, 2, 2, 2), 1),
            (transposed([1, 2, 3, 5], [2, 3, 3, 2], 2, 0, 0, 1), 1),
            (transposed([1, 4, 3, 4], [4, 8, 3, 3], 2, 1, 1, 1), 2),
        ];
        for (t, shuffle) in cases {
            let s = if shuffle > 1 { t.with_pixel_shuffle(shuffle).unwrap() } else { t };
            let lo = with_order(s.lowered().unwrap(), true);
            let sc = lo.scatter.unwrap();
            let ws: Vec<f64> = (0..t.w_len()).map(|i| (i % 7) as f64 + 1.0).collect();
            let wl = lowered_weights(&t, &lo, &ws);
            let masks = live_taps(&lo).unwrap_or_else(|| panic!("{}", s.label()));
            let (taps, row) = ((lo.r * lo.s) as usize, (lo.cg() * lo.r * lo.s) as usize);
            for (kl, w_row) in wl.chunks(row).enumerate() {
                let phase = (kl % lo.kg() as usize) / sc.kg as usize;
                for tap in 0..taps {
                    let nonzero = w_row.iter().skip(tap).step_by(taps).any(|&v| v != 0.0);
                    assert_eq!(masks[phase] >> tap & 1 == 1, nonzero, "{} phase {phase} tap {tap}", s.label());
                }
            }
        }
        let even = with_order(transposed([1, 4, 5, 5], [4, 3, 4, 4], 2, 1, 0, 1).lowered().unwrap(), true);
        assert_eq!(live_taps(&even), None);
        assert_eq!(live_taps(&with_order(even, false)), None);
    }

    /// A transposed convolution followed by a pixel shuffle, in one lowered form: the shuffle
    /// folded into the scatter's phases and the weight pass, both channel orders.
    #[test]
    fn lowered_form_folds_a_pixel_shuffle_after_the_transposed_convolution() {
        for (x, w, st, p, op, g) in [([1, 4, 3, 4], [4, 8, 4, 4], 2, 1, 0, 1), ([2, 4, 3, 3], [2, 8, 3, 3], 2, 1, 1, 2)] {
            let x = if g == 2 { [x[0], 4, x[2], x[3]] } else { x };
            let w = if g == 2 { [4, w[1], w[2], w[3]] } else { w };
            let t = transposed(x, w, st, p, op, g);
            let s = t.with_pixel_shuffle(2).unwrap();
            let xs: Vec<f64> = (0..t.x_len()).map(|i| ((i * 7919) % 23) as f64 - 11.0).collect();
            let ws: Vec<f64> = (0..t.w_len()).map(|i| ((i * 104729) % 19) as f64 - 9.0).collect();
            let mut want = vec![f64::NAN; t.y_len() as usize];
            for (i, v) in transposed_f64(&t, &xs, &ws).iter().enumerate() {
                want[s.y_store_index(i as u64) as usize] = *v;
            }
            for phase_major in [false, true] {
                let lo = with_order(s.lowered().unwrap(), phase_major);
                assert_eq!(lo.scatter.unwrap().inner, 2);
                let wl = lowered_weights(&t, &lo, &ws);
                let mut got = vec![f64::NAN; t.y_len() as usize];
                for (i, v) in conv_f64(&lo, &xs, &wl).iter().enumerate() {
                    if let Some(at) = scatter_index(&lo, i as u64) {
                        got[at as usize] = *v;
                    }
                }
                assert_eq!(got, want, "{} phase_major {phase_major}", s.label());
            }
        }
    }

    /// Every family's kernel for a transposed problem validates with the re-summing of its
    /// non-finite outputs (every store path: scalar, vec4, phase quads, split-K finishes,
    /// float16, both layouts, a pixel shuffle after), and only those have it.
    #[test]
    fn lowered_forms_resum_non_finite_outputs_and_validate() {
        use crate::dtype::DType;
        use crate::params::Layout;
        let shapes = [
            transposed([8, 64, 16, 16], [64, 32, 3, 3], 2, 1, 1, 1),
            transposed([2, 32, 12, 12], [32, 16, 4, 4], 2, 1, 0, 1),
            transposed([1, 16, 9, 9], [16, 8, 3, 3], 1, 1, 0, 2),
            ConvShape::new_transposed([1, 16, 6, 6], [16, 32, 3, 3], (2, 2), (1, 1), (1, 1), (1, 1), 1, None)
                .unwrap()
                .with_pixel_shuffle(2)
                .unwrap(),
        ];
        let mut checked = 0;
        for (i, base) in shapes.iter().enumerate() {
            for (layout, dtype) in [(Layout::Nchw, DType::F32), (Layout::Nhwc, DType::F16), (Layout::Nhwc, DType::F32), (Layout::Nchw, DType::F16)] {
                let shape = base.with_layout(layout).with_dtype(dtype);
                for v in crate::kernels::swept_variants().into_iter().skip(i % 2).step_by(2) {
                    let Ok(k) = v.generate(&shape) else { continue };
                    crate::codegen::validate(&k.source).unwrap_or_else(|e| panic!("{v} on {}: {e}", shape.label()));
                    let lowered = v.family() != "tconv";
                    // The Winograd families' re-sum (`direct_sum`) is the live sum too.
                    assert_eq!(k.source.contains("fn resum_sum("), lowered, "{v} on {}", shape.label());
                    checked += 1;
                }
            }
        }
        assert!(checked > 100, "{checked}");
    }

    /// A pixel shuffle's scatter form, its rows permuted as shaders/shuffle_weights.wgsl
    /// does and its outputs scattered as `ystore` does, stores what the shuffle does.
    #[test]
    fn shuffle_form_stores_the_pixel_shuffle() {
        use crate::params::Padding;
        for (x, w, r, g) in [([2, 4, 5, 3], [8, 4, 3, 3], 2, 1), ([1, 6, 3, 4], [36, 3, 1, 2], 3, 2)] {
            let s = ConvShape::new(x, w, (1, 1), Padding::Explicit(1, 0), (1, 1), g, None).unwrap().with_pixel_shuffle(r).unwrap();
            let xs: Vec<f64> = (0..s.x_len()).map(|i| ((i * 7919) % 23) as f64 - 11.0).collect();
            let ws: Vec<f64> = (0..s.w_len()).map(|i| ((i * 104729) % 19) as f64 - 9.0).collect();
            let plain = ConvShape { pixel_shuffle: None, ..s };
            let mut want = vec![f64::NAN; s.y_len() as usize];
            for (i, v) in conv_f64(&plain, &xs, &ws).iter().enumerate() {
                want[s.y_store_index(i as u64) as usize] = *v;
            }
            for phase_major in [false, true] {
                let lo = with_order(s.shuffle_lowered().unwrap(), phase_major);
                let sc = lo.scatter.unwrap();
                assert_eq!(sc.rearranges_w(), phase_major);
                let (kg, kgf, p, row) = (lo.kg() as u64, sc.kg as u64, (r * r) as u64, (lo.cg() * lo.r * lo.s) as u64);
                // PyTorch's order needs no weight pass; the phase-major one permutes rows.
                let wl: Vec<f64> = if !phase_major {
                    ws.clone()
                } else {
                    (0..lo.w_len())
                        .map(|e| {
                            let kl = e / row;
                            let (gi, phase, c) = (kl / kg, (kl % kg) / kgf, kl % kgf);
                            ws[((gi * kg + c * p + phase) * row + e % row) as usize]
                        })
                        .collect()
                };
                let mut got = vec![f64::NAN; s.y_len() as usize];
                for (i, v) in conv_f64(&lo, &xs, &wl).iter().enumerate() {
                    got[scatter_index(&lo, i as u64).unwrap() as usize] = *v;
                }
                assert_eq!(got, want, "{} phase_major {phase_major}", s.label());
            }
        }
    }

    fn with_order(lo: ConvShape, phase_major: bool) -> ConvShape {
        let sc = lo.scatter.unwrap();
        ConvShape { scatter: Some(crate::params::Scatter { phase_major, ..sc }), ..lo }
    }

    /// PyTorch's conv_transpose2d by its definition (each input scatters into the outputs its
    /// taps reach), NCHW.
    fn transposed_f64(t: &ConvShape, x: &[f64], w: &[f64]) -> Vec<f64> {
        let (oh, ow, cg, kg) = (t.oh() as i64, t.ow() as i64, t.cg() as usize, t.kg() as usize);
        let (h, wd, r, s) = (t.h as i64, t.w as i64, t.r as usize, t.s as usize);
        let mut y = vec![0f64; t.y_len() as usize];
        for n in 0..t.n as usize {
            for c in 0..t.c as usize {
                let g = c / cg;
                for ih in 0..h {
                    for iw in 0..wd {
                        let xv = x[((n * t.c as usize + c) * h as usize + ih as usize) * wd as usize + iw as usize];
                        for kk in 0..kg {
                            for a in 0..r {
                                for b in 0..s {
                                    let oy = ih * t.stride.0 as i64 - t.pad.0 as i64 + a as i64;
                                    let ox = iw * t.stride.1 as i64 - t.pad.1 as i64 + b as i64;
                                    if oy < 0 || ox < 0 || oy >= oh || ox >= ow {
                                        continue;
                                    }
                                    let k = g * kg + kk;
                                    let yi = ((n * t.k as usize + k) * oh as usize + oy as usize) * ow as usize + ox as usize;
                                    y[yi] += xv * w[((c * kg + kk) * r + a) * s + b];
                                }
                            }
                        }
                    }
                }
            }
        }
        y
    }

    /// A plain convolution (the lowered forms are plain) by the crate's float64 reference,
    /// which ignores the scatter; the test data are small integers, exact in float32.
    fn conv_f64(l: &ConvShape, x: &[f64], w: &[f64]) -> Vec<f64> {
        let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let problem = crate::problem::Conv2d::from_shape(*l, crate::precision::Precision::Highest);
        crate::reference::conv2d_f64(&problem, &f32s(x), &f32s(w), None, None).unwrap()
    }

    /// What shaders/phases.wgsl computes, on the host.
    fn lowered_weights(t: &ConvShape, lo: &ConvShape, w: &[f64]) -> Vec<f64> {
        let (p, kg, cg, a, b) = ((t.stride.0 * t.stride.1) as u64, t.kg() as u64, t.cg() as u64, lo.r as u64, lo.s as u64);
        let (r, s, sh, sw) = (t.r as u64, t.s as u64, t.stride.0 as u64, t.stride.1 as u64);
        (0..lo.w_len())
            .map(|e| {
                let (bb, aa, c, kl) = (e % b, (e / b) % a, (e / (a * b)) % cg, e / (a * b * cg));
                let sc = lo.scatter.unwrap();
                let (q, kgf, pq) = (sc.inner as u64, sc.kg as u64, (sc.phases.0 * sc.phases.1) as u64);
                let (g, n) = (kl / (p * kg), kl % (p * kg));
                let (phase, cf) = if sc.phase_major { (n / kgf, n % kgf) } else { (n % pq, n / pq) };
                let (ph_h, ph_w) = (phase / (sw * q), phase % (sw * q));
                let kk = (cf * q + ph_h % q) * q + ph_w % q;
                let (rr, ss) = (ph_h / q + (a - 1 - aa) * sh, ph_w / q + (b - 1 - bb) * sw);
                if rr < r && ss < s { w[((((g * cg + c) * kg + kk) * r + rr) * s + ss) as usize] } else { 0.0 }
            })
            .collect()
    }

    /// What `ystore` (codegen's scatter) computes, on the host: NCHW only.
    fn scatter_index(lo: &ConvShape, yi: u64) -> Option<u64> {
        let sc = lo.scatter.unwrap();
        let (k, oh, ow) = (lo.k as i64, lo.oh() as i64, lo.ow() as i64);
        let (gk, kgf) = (lo.kg() as i64, sc.kg as i64);
        let yi = yi as i64;
        let (img, off) = (yi / (k * oh * ow), yi % (k * oh * ow));
        let (ch, p) = (off / (oh * ow), off % (oh * ow));
        let phases = (sc.phases.0 * sc.phases.1) as i64;
        let n = ch % gk;
        let (phase, cc) = if sc.phase_major { (n / kgf, n % kgf) } else { (n % phases, n / phases) };
        let c = (ch / gk) * kgf + cc;
        let row = (p / ow) * sc.phases.0 as i64 + phase / sc.phases.1 as i64 - sc.off.0 as i64;
        let col = (p % ow) * sc.phases.1 as i64 + phase % sc.phases.1 as i64 - sc.off.1 as i64;
        let (fh, fw) = (sc.out.0 as i64, sc.out.1 as i64);
        if row < 0 || row >= fh || col < 0 || col >= fw {
            return None;
        }
        let kf = kgf * lo.groups as i64;
        Some((img * kf * fh * fw + (c * fh + row) * fw + col) as u64)
    }
}
