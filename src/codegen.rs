//! Expands the WGSL templates in `shaders/` into one source per (variant, shape).
//!
//! Templates hold the readable skeleton of each kernel family; this module writes out the
//! register-level parts (accumulators, loads, FMAs) with constant indices, because NVIDIA's
//! Vulkan compiler spills loop-indexed register arrays to local memory.

use crate::error::{Error, Result};
use crate::params::ConvShape;
use crate::variants::{Direct, Gemm, Variant};
use std::fmt::Write as _;

pub const DIRECT_TEMPLATE: &str = include_str!("../shaders/direct.wgsl");
pub const GEMM_TEMPLATE: &str = include_str!("../shaders/gemm.wgsl");

/// Generated WGSL for one variant and shape, plus the dispatch it needs.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub source: String,
    /// Total workgroups; the launcher folds them into a 2D grid.
    pub workgroups: u64,
}

/// Replaces every `{{NAME}}` in `template`; a placeholder left without a value is an error.
pub fn render(template: &str, vars: &[(&str, String)]) -> Result<String> {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| Error::Gpu("unterminated placeholder in shader template".into()))?;
        let name = &after[..end];
        let value = vars
            .iter()
            .find(|(k, _)| *k == name)
            .ok_or_else(|| Error::Gpu(format!("shader template placeholder {{{{{name}}}}} has no value")))?;
        out.push_str(&value.1);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Placeholders shared by every family: the shape, baked in as constants.
fn shape_vars(shape: &ConvShape, variant: &Variant) -> Vec<(&'static str, String)> {
    let s = shape;
    vec![
        ("VARIANT", variant.to_string()),
        ("SHAPE", s.label()),
        ("N", s.n.to_string()),
        ("C", s.c.to_string()),
        ("H", s.h.to_string()),
        ("W", s.w.to_string()),
        ("K", s.k.to_string()),
        ("R", s.r.to_string()),
        ("S", s.s.to_string()),
        ("OH", s.oh().to_string()),
        ("OW", s.ow().to_string()),
        ("SH", s.stride.0.to_string()),
        ("SW", s.stride.1.to_string()),
        ("PH", s.pad.0.to_string()),
        ("PW", s.pad.1.to_string()),
        ("DH", s.dilation.0.to_string()),
        ("DW", s.dilation.1.to_string()),
        ("CG", s.cg().to_string()),
        ("KG", s.kg().to_string()),
        ("GROUPS", s.groups.to_string()),
    ]
}

/// Generates the WGSL for `variant` on `shape`.
pub fn generate(variant: &Variant, shape: &ConvShape) -> Result<Kernel> {
    if !variant.well_formed() {
        return Err(Error::invalid(format!("variant {variant} is not in the generator's space")));
    }
    match variant {
        Variant::Direct(d) => direct(d, variant, shape),
        Variant::Gemm(g) => gemm(g, variant, shape),
    }
}

fn direct(d: &Direct, variant: &Variant, shape: &ConvShape) -> Result<Kernel> {
    let (tk, tw) = (d.tk, d.tw);
    let owt = div_ceil(shape.ow() as u64, tw as u64);
    let kt = div_ceil(shape.kg() as u64, tk as u64);
    let sp_blocks = div_ceil(shape.oh() as u64 * owt, d.wg_x as u64);
    let k_blocks = div_ceil(shape.groups as u64 * kt, d.wg_y as u64);

    let mut setup = String::new();
    writeln!(setup, "    let xg = (i32(n) * C + g * CG) * H * W;").unwrap();
    for i in 0..tk {
        writeln!(setup, "    let wb{i} = (g * KG + min(kk0 + {i}, KG - 1)) * CG * R * S;").unwrap();
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
            writeln!(setup, "    let ih{r} = ih_top + {r} * DH;").unwrap();
            writeln!(setup, "    let rok{r} = ih{r} >= 0 && ih{r} < H;").unwrap();
        }
        for j in 0..tw {
            for s in 0..shape.s {
                writeln!(setup, "    let iw{j}_{s} = (ow0 + {j}) * SW - PW + {s} * DW;").unwrap();
                writeln!(setup, "    let cok{j}_{s} = iw{j}_{s} >= 0 && iw{j}_{s} < W;").unwrap();
                for r in 0..shape.r {
                    writeln!(setup, "    let m{r}_{j}_{s} = rok{r} && cok{j}_{s};").unwrap();
                    writeln!(
                        setup,
                        "    let o{r}_{j}_{s} = select(0, ih{r} * W + iw{j}_{s}, m{r}_{j}_{s});"
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
        writeln!(out, "{indent}    let xc = xg + ({c}) * H * W;").unwrap();
        writeln!(out, "{indent}    let wc = ({c}) * R * S;").unwrap();
        for r in 0..shape.r {
            for s in 0..shape.s {
                writeln!(out, "{indent}    {{").unwrap();
                for j in 0..tw {
                    writeln!(
                        out,
                        "{indent}        let xv{j} = select(pad0, x[xc + o{r}_{j}_{s}], m{r}_{j}_{s});"
                    )
                    .unwrap();
                }
                for i in 0..tk {
                    writeln!(out, "{indent}        let wv{i} = w[wb{i} + wc + {}];", r * shape.s + s)
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
             \x20       let xc = xg + c * H * W;\n\
             \x20       let wc = c * R * S;\n\
             \x20       for (var r: i32 = 0; r < R; r = r + 1) {\n\
             \x20           let ih = ih_top + r * DH;\n\
             \x20           let rok = ih >= 0 && ih < H;\n\
             \x20           for (var s: i32 = 0; s < S; s = s + 1) {\n",
        );
        for j in 0..tw {
            let ind = "                ";
            writeln!(main, "{ind}let iw{j} = (ow0 + {j}) * SW - PW + s * DW;").unwrap();
            writeln!(main, "{ind}let ok{j} = rok && iw{j} >= 0 && iw{j} < W;").unwrap();
            writeln!(main, "{ind}let xv{j} = select(pad0, x[select(0, xc + ih * W + iw{j}, ok{j})], ok{j});")
                .unwrap();
        }
        for i in 0..tk {
            writeln!(main, "                let wv{i} = w[wb{i} + wc + r * S + s];").unwrap();
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
        writeln!(store, "    if (kk0 + {i} < KG) {{").unwrap();
        writeln!(store, "        let k = g * KG + kk0 + {i};").unwrap();
        let bias = if shape.bias { "bias[k]" } else { "0.0" };
        writeln!(store, "        let bv = {bias};").unwrap();
        writeln!(store, "        let yrow = ((i32(n) * K + k) * OH + oh) * OW;").unwrap();
        for j in 0..tw {
            writeln!(store, "        if (ow0 + {j} < OW) {{ y[yrow + ow0 + {j}] = a{i}_{j} + bv; }}")
                .unwrap();
        }
        writeln!(store, "    }}").unwrap();
    }

    let mut vars = shape_vars(shape, variant);
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
    ]);
    Ok(Kernel {
        source: render(DIRECT_TEMPLATE, &vars)?,
        workgroups: sp_blocks * k_blocks * shape.n as u64,
    })
}

fn gemm(gm: &Gemm, variant: &Variant, shape: &ConvShape) -> Result<Kernel> {
    let threads = variant.invocations();
    let (tx, ty) = (gm.bm / gm.tm, gm.bn / gm.tn);
    let m = shape.n as u64 * shape.oh() as u64 * shape.ow() as u64;
    let m_blocks = div_ceil(m, gm.bm as u64);
    let n_blocks = div_ceil(shape.kg() as u64, gm.bn as u64);
    let blocks = m_blocks * n_blocks * shape.groups as u64;
    let a_slots = gm.bm * gm.bk / threads;
    let b_slots = gm.bn * gm.bk / threads;

    // A slots: consecutive invocations take consecutive pixels (coalesced gathers, and
    // conflict-free scalar stores into the staged tile).
    let mut a_setup = String::new();
    for i in 0..a_slots {
        let off = i * threads;
        let s = &mut a_setup;
        writeln!(s, "    let am{i} = (lid + {off}) % BM;").unwrap();
        writeln!(s, "    let ak{i} = (lid + {off}) / BM;").unwrap();
        writeln!(s, "    let aok{i} = m0 + am{i} < M;").unwrap();
        writeln!(s, "    let apix{i} = min(m0 + am{i}, M - 1);").unwrap();
        writeln!(s, "    let arem{i} = apix{i} % OHW;").unwrap();
        writeln!(s, "    let aih{i} = (arem{i} / OW) * SH - PH;").unwrap();
        writeln!(s, "    let aiw{i} = (arem{i} % OW) * SW - PW;").unwrap();
        writeln!(s, "    let abase{i} = (apix{i} / OHW) * C * H * W + x_group + aih{i} * W + aiw{i};").unwrap();
        // The slot's reduction index, kept as (channel, row, column) and advanced by
        // carries each step instead of divided out of a flat index.
        writeln!(s, "    var kc{i}: i32 = ak{i} / (R * S);").unwrap();
        writeln!(s, "    var kh{i}: i32 = (ak{i} / S) % R;").unwrap();
        writeln!(s, "    var kw{i}: i32 = ak{i} % S;").unwrap();
        writeln!(s, "    var pa{i}: f32;").unwrap();
    }
    // B slots: consecutive invocations take consecutive reduction indices of one weight
    // row, which is contiguous in w.
    let mut b_setup = String::new();
    for i in 0..b_slots {
        let off = i * threads;
        let s = &mut b_setup;
        writeln!(s, "    let bk{i} = (lid + {off}) % BK;").unwrap();
        writeln!(s, "    let bn{i} = (lid + {off}) / BK;").unwrap();
        writeln!(s, "    let bok{i} = n0 + bn{i} < KG;").unwrap();
        writeln!(s, "    let bbase{i} = (g * KG + min(n0 + bn{i}, KG - 1)) * KR;").unwrap();
        writeln!(s, "    var pb{i}: f32;").unwrap();
    }
    let mut acc = String::new();
    for i in 0..gm.tm {
        for j in 0..gm.tn {
            writeln!(acc, "    var acc{i}_{j}: f32 = 0.0;").unwrap();
        }
    }
    let mut fetch = String::new();
    for i in 0..a_slots {
        let s = &mut fetch;
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let ih = aih{i} + kh{i} * DH;").unwrap();
        writeln!(s, "        let iw = aiw{i} + kw{i} * DW;").unwrap();
        writeln!(s, "        let ok = aok{i} && kc{i} < CG && ih >= 0 && ih < H && iw >= 0 && iw < W;").unwrap();
        writeln!(s, "        let idx = abase{i} + kc{i} * H * W + kh{i} * DH * W + kw{i} * DW;").unwrap();
        writeln!(s, "        pa{i} = select(pad0, x[select(0, idx, ok)], ok);").unwrap();
        writeln!(s, "    }}").unwrap();
    }
    for i in 0..b_slots {
        let s = &mut fetch;
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let kr = k_next + bk{i};").unwrap();
        writeln!(s, "        let ok = bok{i} && kr < KR;").unwrap();
        writeln!(s, "        pb{i} = select(0.0, w[select(0, bbase{i} + kr, ok)], ok);").unwrap();
        writeln!(s, "    }}").unwrap();
    }
    // Moving a slot's reduction index on by BK: add BK's (channel, row, column) digits, then
    // carry. Each digit sum stays below twice its base, so one carry per digit suffices.
    let mut advance = String::new();
    let (ci, ri, si) = (gm.bk / (shape.r * shape.s), (gm.bk / shape.s) % shape.r, gm.bk % shape.s);
    for i in 0..a_slots {
        let s = &mut advance;
        writeln!(s, "    kw{i} = kw{i} + {si};").unwrap();
        writeln!(s, "    kh{i} = kh{i} + {ri};").unwrap();
        writeln!(s, "    kc{i} = kc{i} + {ci};").unwrap();
        writeln!(s, "    if (kw{i} >= S) {{ kw{i} = kw{i} - S; kh{i} = kh{i} + 1; }}").unwrap();
        writeln!(s, "    if (kh{i} >= R) {{ kh{i} = kh{i} - R; kc{i} = kc{i} + 1; }}").unwrap();
    }
    let mut stage_store = String::new();
    for i in 0..a_slots {
        writeln!(
            stage_store,
            "    a_tile[stage * A_STAGE + ak{i} * (BM / 4) + am{i} / 4][am{i} % 4] = pa{i};"
        )
        .unwrap();
    }
    for i in 0..b_slots {
        writeln!(
            stage_store,
            "    b_tile[stage * B_STAGE + bk{i} * (BN / 4) + bn{i} / 4][bn{i} % 4] = pb{i};"
        )
        .unwrap();
    }
    // The reduction over one staged step, written out: register index = 4 * group + lane.
    let lanes = ["x", "y", "z", "w"];
    let mut inner = String::new();
    for kk in 0..gm.bk {
        let s = &mut inner;
        writeln!(s, "        {{").unwrap();
        for q in 0..gm.tm / 4 {
            writeln!(s, "            let a{q} = a_tile[a_base + {} + tx];", kk * gm.bm / 4 + q * tx).unwrap();
        }
        for q in 0..gm.tn / 4 {
            writeln!(s, "            let b{q} = b_tile[b_base + {} + ty];", kk * gm.bn / 4 + q * ty).unwrap();
        }
        for i in 0..gm.tm {
            for j in 0..gm.tn {
                writeln!(
                    s,
                    "            acc{i}_{j} = fma(a{}.{}, b{}.{}, acc{i}_{j});",
                    i / 4,
                    lanes[(i % 4) as usize],
                    j / 4,
                    lanes[(j % 4) as usize]
                )
                .unwrap();
            }
        }
        writeln!(s, "        }}").unwrap();
    }
    // Register (i, j) holds pixel m0 + 4*TX*(i/4) + 4*tx + i%4 and channel likewise.
    let mut store = String::new();
    for i in 0..gm.tm {
        let s = &mut store;
        writeln!(s, "    let om{i} = m0 + {} + 4 * tx;", (i / 4) * 4 * tx + i % 4).unwrap();
        writeln!(s, "    let ym{i} = (om{i} / OHW) * K * OHW + om{i} % OHW;").unwrap();
    }
    for j in 0..gm.tn {
        let s = &mut store;
        writeln!(s, "    {{").unwrap();
        writeln!(s, "        let n = n0 + {} + 4 * ty;", (j / 4) * 4 * ty + j % 4).unwrap();
        writeln!(s, "        if (n < KG) {{").unwrap();
        writeln!(s, "            let k = g * KG + n;").unwrap();
        let bias = if shape.bias { "bias[k]" } else { "0.0" };
        writeln!(s, "            let bv = {bias};").unwrap();
        for i in 0..gm.tm {
            writeln!(s, "            if (om{i} < M) {{ y[ym{i} + k * OHW] = acc{i}_{j} + bv; }}").unwrap();
        }
        writeln!(s, "        }}").unwrap();
        writeln!(s, "    }}").unwrap();
    }

    let mut vars = shape_vars(shape, variant);
    vars.extend([
        ("M", m.to_string()),
        ("BM", gm.bm.to_string()),
        ("BN", gm.bn.to_string()),
        ("BK", gm.bk.to_string()),
        ("TM", gm.tm.to_string()),
        ("TN", gm.tn.to_string()),
        ("THREADS", threads.to_string()),
        ("TX", tx.to_string()),
        ("TY", ty.to_string()),
        ("M_BLOCKS", m_blocks.to_string()),
        ("N_BLOCKS", n_blocks.to_string()),
        ("BLOCKS", blocks.to_string()),
        ("A_TILE", (2 * gm.bk * gm.bm / 4).to_string()),
        ("B_TILE", (2 * gm.bk * gm.bn / 4).to_string()),
        ("A_SETUP", a_setup),
        ("B_SETUP", b_setup),
        ("ACC_DECL", acc),
        ("FETCH", fetch),
        ("ADVANCE", advance),
        ("STAGE_STORE", stage_store),
        ("INNER", inner),
        ("STORE", store),
    ]);
    Ok(Kernel { source: render(GEMM_TEMPLATE, &vars)?, workgroups: blocks })
}

/// Parses and validates WGSL with naga, the front end wgpu itself uses.
pub fn validate(source: &str) -> std::result::Result<(), String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Padding;
    use crate::variants::all_variants;

    #[test]
    fn render_fills_and_rejects_missing() {
        assert_eq!(render("a {{X}} b", &[("X", "1".into())]).unwrap(), "a 1 b");
        assert!(render("a {{Y}} b", &[("X", "1".into())]).is_err());
    }

    /// Every generatable variant passes naga validation, on shapes that exercise padding,
    /// stride, dilation, groups and bias.
    #[test]
    fn every_variant_validates() {
        let shapes = [
            ConvShape::new([2, 6, 9, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 2, Some(4)).unwrap(),
            ConvShape::new([1, 3, 5, 5], [5, 3, 1, 1], (1, 1), Padding::Valid, (1, 1), 1, None).unwrap(),
        ];
        for shape in &shapes {
            for v in all_variants() {
                let k = generate(&v, shape).unwrap();
                if let Err(e) = validate(&k.source) {
                    panic!("{v} on {}: {e}", shape.label());
                }
            }
        }
    }
}
