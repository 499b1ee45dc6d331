//! The store step: accumulator tiles through the subgroup's scratch to y (with the
//! epilogue, a pixel shuffle's or a transposed convolution's scatter), and split-K's finish.

use super::variant::*;
use crate::kernels::phases;
use crate::params::{ConvShape, Layout};
use std::fmt::Write as _;

/// The barrier between a subgroup's writes to its scratch tile and its lanes' reads of them
/// (and back). A subgroup barrier: the family runs only on adapters whose subgroups are
/// exactly 32 wide (NVIDIA's drivers today), where it is the warp barrier, which orders the
/// warp's shared-memory accesses; a workgroup barrier also waited for the other subgroups,
/// which took 2-4% of the scattered stores' layers' time on an H200 (benches/results/HISTORY.md, "Waits
/// that poll; subgroup barriers around the scratch tile").
const SCRATCH_BARRIER: &str = "    subgroupBarrier();";

/// The store step: each accumulator tile goes through the subgroup's scratch, laid out so
/// that neighbouring lanes write neighbouring elements of y: pixel fastest for NCHW
/// (column-major), channel fastest for NHWC (row-major). Where four neighbours along that
/// axis are always in range together and 16-byte aligned (`vec_y`: whole quads of pixels in
/// every image, or of channels in every group), each lane stores them as one vec4. Split-K
/// variants store unscaled partial sums instead, for the finishing pass.
///
/// Each subgroup's scratch tile is its own, so the barriers around it are subgroup barriers
/// (`SCRATCH_BARRIER`).
pub(super) fn store_step(v: &Coop, shape: &ConvShape, vec_y: bool, window: bool) -> String {
    // Split-K's partial sums go to the workspace unmoved: its finishing pass moves them.
    let moved = shape.moves_y() && v.splits == 1;
    if let Some(sw) = phase_quads(shape).filter(|_| moved) {
        return phase_quad_store(v, shape, sw, window) + &redo(v, shape, window, true);
    }
    let split = v.split == 3;
    let (tm, tn) = (v.tm(), v.tn());
    let pixel_fastest = shape.layout == Layout::Nchw;
    let store_fn = if pixel_fastest { "coopStore" } else { "coopStoreT" };
    let split_at = v.sgm * v.sgn * 256;
    let sum = |at: &str| scratch_sum(v, at);
    let scatter = shape.scatter.is_some() && moved;
    let rounds = if vec_y { 2 } else { 8 };
    // Element e of the tile: (e % 16, e / 16) column-major, (e / 16, e % 16) row-major;
    // quad q holds elements 4q .. 4q + 3 of the same layout.
    let (e_m, e_n) = match (pixel_fastest, vec_y) {
        (true, false) => ("e % 16u", "e / 16u"),
        (false, false) => ("e / 16u", "e % 16u"),
        (true, true) => ("4u * (e % 4u)", "e / 4u"),
        (false, true) => ("e / 4u", "4u * (e % 4u)"),
    };
    // Without a scatter, a lane's pixel in round r does not depend on the tile's column: it
    // is decoded before each row of tiles, with its part of y's index (a division per stored
    // element measured 7-20% of float16 layers on an H200): once per round in NHWC, where
    // rounds advance the pixel, once for all rounds in NCHW, where they advance the channel.
    let pixel_rounds: Vec<u32> = if pixel_fastest { vec![0] } else { (0..rounds).collect() };
    // y's pixel m of the tile's pixel `q` (an i32 expression), for the scatters: a window
    // tile's pixels are a block of one image (m = M past its edge), the others' a run from m0.
    let pixel_of = |q: String| if window { window_pixel(&q) } else { format!("m0 + {q}") };
    // NCHW scatters keep a channel's phases side by side: a round's lanes take the tile's
    // elements phase column fastest, then pixel, so that neighbouring lanes store
    // neighbouring output columns (`sw` of them per pixel).
    let sw = match shape.scatter {
        Some(sc) if scatter && pixel_fastest && !sc.phase_major && 16 % sc.phases.1 == 0 => sc.phases.1,
        _ => 1,
    };
    let m_offsets: Vec<u32> = (0..rounds).map(|r| (r * 32 / sw) % 16).collect();
    let mut store = String::new();
    for i in 0..tm {
        for &r in pixel_rounds.iter().filter(|_| !scatter) {
            let s = &mut store;
            let e_m = e_m.replace('e', &format!("({}u + lane)", r * 32));
            if window {
                // The tile's pixel p is (oh0 + p / TW, ow0 + p % TW) of image `img`; past
                // the image's edge it stores nothing (m = M).
                writeln!(s, "    let yq{i}_{r} = i32(wm) + {} + i32({e_m});", i * 16).unwrap();
                writeln!(s, "    let yh{i}_{r} = oh0 + yq{i}_{r} / TW;\n    let yw{i}_{r} = ow0 + yq{i}_{r} % TW;").unwrap();
                writeln!(s, "    let ym{i}_{r} = select(M, (img * OH + yh{i}_{r}) * OW + yw{i}_{r}, yh{i}_{r} < OH && yw{i}_{r} < OW);").unwrap();
            } else {
                writeln!(s, "    let ym{i}_{r} = m0 + i32(wm) + {} + i32({e_m});", i * 16).unwrap();
            }
            // NHWC: image n's pixel p starts at (n * OHW + p) * K = m * K.
            let pixel = if pixel_fastest { format!("(ym{i}_{r} / OHW) * YSN + (ym{i}_{r} % OHW) * YSP") } else { format!("ym{i}_{r} * YSP") };
            writeln!(s, "    let yp{i}_{r} = {pixel};").unwrap();
        }
        // A scatter's mapping splits into a pixel half and a channel half; the pixel half
        // of each lane's elements is the same for every tile of the row: decoded once here.
        if scatter && pixel_fastest && !vec_y {
            let mut seen = Vec::new();
            for &o in &m_offsets {
                if !seen.contains(&o) {
                    seen.push(o);
                    let q = format!("i32(wm) + {} + i32((lane / {sw}u + {o}u) % 16u)", i * 16);
                    writeln!(store, "    let ypm{i}_{o} = ypix({});", pixel_of(q)).unwrap();
                }
            }
        } else if scatter {
            for r in 0..rounds {
                let e_m = e_m.replace('e', &format!("({}u + lane)", r * 32));
                writeln!(store, "    let ysm{i}_{r} = {};", pixel_of(format!("i32(wm) + {} + i32({e_m})", i * 16))).unwrap();
                writeln!(store, "    let ypr{i}_{r} = ypix(ysm{i}_{r});").unwrap();
            }
        }
        for j in 0..tn {
            let s = &mut store;
            writeln!(s, "{SCRATCH_BARRIER}").unwrap();
            writeln!(s, "    {store_fn}(acc{i}_{j}, &scratch[sbase], 16u);").unwrap();
            if split {
                writeln!(s, "    {store_fn}(cor{i}_{j}, &scratch[{split_at} + sbase], 16u);").unwrap();
            }
            writeln!(s, "{SCRATCH_BARRIER}").unwrap();
            // The channel half of a scatter's mapping, where every round of this lane shares it
            // (NHWC's rounds advance the pixel and keep the channel).
            if scatter && !pixel_fastest {
                let lane_n = if vec_y { "4u * (lane % 4u)" } else { "lane % 16u" };
                writeln!(s, "    let ycn{i}_{j} = ychan(g * KG + n0 + i32(wn) + {} + i32({lane_n}));", j * 16).unwrap();
            }
            for r in 0..rounds {
                writeln!(s, "    {{").unwrap();
                if sw > 1 {
                    // `e` then names the element in the tile's column-major order.
                    writeln!(s, "        let q = {}u + lane;", r * 32).unwrap();
                    writeln!(s, "        let e = ((q / {}u) * {sw}u + q % {sw}u) * 16u + (q / {sw}u) % 16u;", 16 * sw).unwrap();
                } else {
                    writeln!(s, "        let e = {}u + lane;", r * 32).unwrap();
                }
                let rr = if pixel_fastest { 0 } else { r };
                if !scatter {
                    writeln!(s, "        let m = ym{i}_{rr};").unwrap();
                } else if !pixel_fastest {
                    writeln!(s, "        let m = ysm{i}_{r};").unwrap();
                } else {
                    writeln!(s, "        let m = {};", pixel_of(format!("i32(wm) + {} + i32({e_m})", i * 16))).unwrap();
                }
                writeln!(s, "        let n = n0 + i32(wn) + {} + i32({e_n});", j * 16).unwrap();
                writeln!(s, "        if (m < M && n < KG) {{").unwrap();
                writeln!(s, "            let k = g * KG + n;").unwrap();
                let at = format!("yp{i}_{rr} + k * YSK");
                if scatter {
                    let mapped = if pixel_fastest {
                        format!("yscatter(ypm{i}_{}, ychan(k))", m_offsets[r as usize])
                    } else {
                        format!("yscatter(ypr{i}_{r}, ycn{i}_{j})")
                    };
                    writeln!(s, "            let yi = {mapped};").unwrap();
                    writeln!(s, "            if (yi >= 0) {{").unwrap();
                } else if moved {
                    // ystore gives -1 for an output past y's edges (a transposed
                    // convolution's lowered form), and never does otherwise.
                    writeln!(s, "            let yi = ystore({at});").unwrap();
                    writeln!(s, "            if (yi >= 0) {{").unwrap();
                } else {
                    writeln!(s, "            let yi = {at};").unwrap();
                    writeln!(s, "            {{").unwrap();
                }
                // The smaller factor first: an intermediate overflows only if the result does.
                let one = |at: &str, k: &str, yi: &str| {
                    let value = phases::flagged(shape, &format!("({}) * min(ux, uw) * max(ux, uw)", sum(at)));
                    format!("DT(epilogue({value}, {k}, {yi}))")
                };
                if v.splits > 1 && vec_y {
                    // A partial sum, unscaled: the finishing pass adds the parts and applies
                    // the epilogue.
                    let parts: Vec<String> = (0..4)
                        .map(|t| format!("({}) * min(ux, uw) * max(ux, uw)", sum(&format!("sbase + 4u * e + {t}u"))))
                        .collect();
                    writeln!(s, "            xt[PART0 + (sp * YLEN4 + yi) / 4] = part4(vec4<f32>(\n                {}));", parts.join(",\n                ")).unwrap();
                } else if v.splits > 1 {
                    writeln!(s, "            let pi = sp * YLEN4 + yi;").unwrap();
                    writeln!(s, "            xt[PART0 + pi / 4][pi % 4] = part1(({}) * min(ux, uw) * max(ux, uw));", sum("sbase + e")).unwrap();
                } else if vec_y {
                    let parts: Vec<String> = (0..4)
                        .map(|t| {
                            let k = if pixel_fastest || t == 0 { "k".to_string() } else { format!("k + {t}") };
                            one(&format!("sbase + 4u * e + {t}u"), &k, &format!("yi + {t}"))
                        })
                        .collect();
                    writeln!(s, "            y[yi / 4] = vec4<DT>(\n                {});", parts.join(",\n                ")).unwrap();
                } else {
                    writeln!(s, "            y[yi] = {};", one("sbase + e", "k", "yi")).unwrap();
                }
                writeln!(s, "            }}").unwrap();
                writeln!(s, "        }}").unwrap();
                writeln!(s, "    }}").unwrap();
            }
        }
    }
    if super::direct_store::direct(v, shape, window) {
        return super::direct_store::direct_store(v, shape, vec_y, window, &store);
    }
    if v.splits == 1 {
        store += &redo(v, shape, window, vec_y);
    }
    store
}

/// Where a lane of the subgroup stored an Inf or NaN of a transposed convolution's lowered
/// form (`phases::resums`), the subgroup's outputs summed again over live taps, each by one
/// lane, through `ystore` one element at a time (however the store step moved them).
/// `y_vec4`: y is bound as vec4s.
fn redo(v: &Coop, shape: &ConvShape, window: bool, y_vec4: bool) -> String {
    let (tm, tn) = (v.tm(), v.tn());
    phases::redo(shape, "subgroupAny(resum_bad)", || {
        let q = format!("i32(wm) + i32(tile / {tn}u) * 16 + i32(e % 16u)");
        let m = if window { window_pixel(&q) } else { format!("m0 + {q}") };
        let y_at = if y_vec4 { "y[yi / 4][yi % 4]" } else { "y[yi]" };
        format!(
            "{SCRATCH_BARRIER}
        for (var t = 0u; t < {rounds}u; t = t + 1u) {{
            let e = (t * 32u + lane) % 256u;
            let tile = (t * 32u + lane) / 256u;
            let m = {m};
            let n = n0 + i32(wn) + i32(tile % {tn}u) * 16 + i32(e / 16u);
            if (m < M && n < KG) {{
                let k = g * KG + n;
                let at = (m / OHW) * YSN + (m % OHW) * YSP + k * YSK;
                let yi = ystore(at);
                if (yi >= 0) {{
                    {y_at} = DT(epilogue(resum_sum(at, k), k, yi));
                }}
            }}
        }}
",
            rounds = tm * tn * 256 / 32,
        )
    })
}

/// The tile's sum at scratch element `at`: the split variants add the correction terms'
/// scratch, 2^11 times smaller, to the products'.
fn scratch_sum(v: &Coop, at: &str) -> String {
    if v.split == 3 {
        format!("scratch[{at}] + scratch[{} + {at}] / LO", v.sgm * v.sgn * 256)
    } else {
        format!("scratch[{at}]")
    }
}

/// The column phases of an NCHW pixel shuffle (PyTorch's channel order) whose outputs a
/// lane stores four at a time: `sw` phase columns of 4 / sw neighbouring pixels are four
/// neighbouring columns of one output row, 16-byte aligned where the lowered rows are whole
/// runs of 4 / sw pixels (shuffles by 2 and 4).
pub(super) fn phase_quads(shape: &ConvShape) -> Option<u32> {
    let sc = shape.scatter?;
    let sw = sc.phases.1;
    let fits = shape.layout == Layout::Nchw
        && sc.shuffle
        && !sc.phase_major
        && matches!(sw, 2 | 4)
        && 16 % (sc.phases.0 * sw) == 0
        && shape.ow() % (4 / sw) == 0;
    fits.then_some(sw)
}

/// The store step of `phase_quads` problems: per tile, two rounds in which lane u of 64
/// takes channel group u / (16 / P) (sw phase columns of one output row) and pixels P (u %
/// (16 / P)) onwards, P = 4 / sw, and stores them as one vec4.
fn phase_quad_store(v: &Coop, shape: &ConvShape, sw: u32, window: bool) -> String {
    let p = 4 / sw;
    let per_group = 16 / p;
    let split_at = v.sgm * v.sgn * 256;
    let mut s = String::new();
    for i in 0..v.tm() {
        // The pixel half of the mapping, once per round for the row's tiles.
        for r in 0..2 {
            let q = format!("i32(wm) + {} + i32((({}u + lane) % {per_group}u) * {p}u)", i * 16, r * 32);
            let m = if window { window_pixel(&q) } else { format!("m0 + {q}") };
            writeln!(s, "    let ysm{i}_{r} = {m};").unwrap();
            writeln!(s, "    let ypr{i}_{r} = ypix(ysm{i}_{r});").unwrap();
        }
        for j in 0..v.tn() {
            writeln!(s, "{SCRATCH_BARRIER}").unwrap();
            writeln!(s, "    coopStore(acc{i}_{j}, &scratch[sbase], 16u);").unwrap();
            if v.split == 3 {
                writeln!(s, "    coopStore(cor{i}_{j}, &scratch[{split_at} + sbase], 16u);").unwrap();
            }
            writeln!(s, "{SCRATCH_BARRIER}").unwrap();
            for r in 0..2 {
                writeln!(s, "    {{").unwrap();
                writeln!(s, "        let u = {}u + lane;", r * 32).unwrap();
                writeln!(s, "        let c0 = (u / {per_group}u) * {sw}u;").unwrap();
                writeln!(s, "        let p0 = (u % {per_group}u) * {p}u;").unwrap();
                writeln!(s, "        let n = n0 + i32(wn) + {} + i32(c0);", j * 16).unwrap();
                writeln!(s, "        if (ysm{i}_{r} < M && n < KG) {{").unwrap();
                writeln!(s, "            let k = g * KG + n;").unwrap();
                writeln!(s, "            let yi = yscatter(ypr{i}_{r}, ychan(k));").unwrap();
                // Element t: phase column t % sw of pixel p0 + t / sw (the scratch holds the
                // tile column-major: channel c's pixels from 16c on).
                let parts: Vec<String> = (0..4)
                    .map(|t| {
                        let at = format!("sbase + (c0 + {}u) * 16u + p0 + {}u", t % sw, t / sw);
                        let value = phases::flagged(shape, &format!("({}) * min(ux, uw) * max(ux, uw)", scratch_sum(v, &at)));
                        format!("DT(epilogue({value}, k + {}, yi + {t}))", t % sw)
                    })
                    .collect();
                writeln!(s, "            y[yi / 4] = vec4<DT>(\n                {});", parts.join(",\n                ")).unwrap();
                writeln!(s, "        }}\n    }}").unwrap();
            }
        }
    }
    s
}

/// A window tile's output pixel m for its pixel `q`: (oh0 + q / TW, ow0 + q % TW) of image
/// `img`, or M past the image's edge (as the unscattered store's `ym`).
fn window_pixel(q: &str) -> String {
    let (h, w) = (format!("oh0 + ({q}) / TW"), format!("ow0 + ({q}) % TW"));
    format!("select(M, (img * OH + {h}) * OW + {w}, {h} < OH && {w} < OW)")
}

/// The finishing pass's store (split-K): the summed parts of four neighbouring outputs, as
/// one vec4 where y's rows are whole quads, else one element at a time within y, or moved
/// through `ystore` (a pixel shuffle's or a lowered transposed convolution's place; -1 for
/// none).
pub(super) fn finish_store(shape: &ConvShape, vec_y: bool, moved: bool) -> String {
    let k_of = |e: &str| format!("({e} / YSK) % K");
    if moved {
        let mut f = String::new();
        for t in 0..4 {
            let (at, k) = (format!("4 * i + {t}"), k_of(&format!("(4 * i + {t})")));
            writeln!(f, "    if ({at} < YLEN) {{\n        let yi = ystore({at});").unwrap();
            writeln!(f, "        if (yi >= 0) {{ y[yi] = DT(epilogue({}, {k}, yi)); }}\n    }}", phases::resummed(shape, &format!("sum[{t}]"), &at, &k)).unwrap();
        }
        return f;
    }
    if vec_y {
        let parts: Vec<String> = (0..4)
            .map(|t| format!("DT(epilogue(sum[{t}], {}, 4 * i + {t}))", k_of(&format!("(4 * i + {t})"))))
            .collect();
        format!("    y[i] = vec4<DT>(\n        {});\n", parts.join(",\n        "))
    } else {
        let mut f = String::new();
        for t in 0..4 {
            writeln!(f, "    if (4 * i + {t} < YLEN) {{ y[4 * i + {t}] = DT(epilogue(sum[{t}], {}, 4 * i + {t})); }}", k_of(&format!("(4 * i + {t})"))).unwrap();
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::coop::Coop;
    use crate::kernels::{Family, Variant};
    use crate::params::{ConvShape, Layout, Padding};

    /// The scratch tiles are guarded by subgroup barriers; the staging of the main loop,
    /// shared by the whole workgroup, keeps workgroup barriers.
    #[test]
    fn scratch_tiles_wait_for_their_subgroup_only() {
        let base = ConvShape::new([1, 64, 18, 32], [256, 64, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        let shuffled = base.with_pixel_shuffle(2).unwrap();
        let (mut checked, mut scattered) = (0, 0);
        for shape in [base, shuffled, shuffled.with_layout(Layout::Nhwc)] {
            for c in Coop::space().into_iter().step_by(7) {
                let Ok(k) = Variant::Coop(c).generate(&shape) else { continue };
                let (main, rest) = k.source.split_once("let sbase").expect("a store step");
                // To the end of the kernel's function (a prologue's may follow).
                let store = rest.split("\n}\n").next().unwrap_or(rest);
                assert!(main.contains("workgroupBarrier()"), "{c:?}");
                assert!(store.contains("subgroupBarrier()") && !store.contains("workgroupBarrier()"), "{c:?} on {}", shape.label());
                checked += 1;
                scattered += usize::from(store.contains("yscatter("));
            }
        }
        assert!(checked > 20 && scattered > 10, "{checked} kernels, {scattered} scattered");
    }
}
