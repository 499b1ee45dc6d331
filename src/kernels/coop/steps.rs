//! The k-step: staging the gathered terms in workgroup memory and the tensor-core
//! products on them.

use super::variant::*;
use std::fmt::Write as _;

/// One k-step's staging: each slot's registers scaled, converted to f16 and stored in
/// workgroup memory; for the split also the scaled remainder.
pub(super) fn stage_step(v: &Coop, a_slots: u32, b_slots: u32, b_partial: bool) -> String {
    let split = v.split == 3;
    let mut stage = String::new();
    let stage_one = |s: &mut String, tile: &str, reg: &str, scale: &str, at: String| {
        writeln!(s, "        {{").unwrap();
        writeln!(s, "            let v = {reg} * {scale};").unwrap();
        if split {
            // hi keeps v's top 11 significant bits by masking, so v - hi is exact and no
            // compiler can fold a float round trip away (converting through f16 and back did
            // leave lo zero on the GPU). Inf and NaN go into hi whole (a mask could turn a
            // NaN into Inf) with a zero lo (Inf - Inf would make a NaN of an Inf result).
            writeln!(s, "            let bits = bitcast<vec4<u32>>(v);").unwrap();
            writeln!(s, "            let fin = (bits & vec4<u32>(0x7F800000u)) != vec4<u32>(0x7F800000u);").unwrap();
            writeln!(s, "            let h32 = select(v, bitcast<vec4<f32>>(bits & vec4<u32>(0xFFFFE000u)), fin);").unwrap();
            writeln!(s, "            {tile}_hi[{at}] = vec4<f16>(h32);").unwrap();
            // A nonzero value whose lo part is zero (float16 data, small integers, Inf) gets
            // f16's least normal magnitude with v's sign instead: the other operand's Inf
            // times that lo keeps the Inf's sign where a zero made the correction NaN (an Inf
            // result came out NaN); the bias, 2^-25 of the other operand (float32 data is
            // scaled to a largest value near 2^14), is far below the split's error. Zeros
            // keep a zero lo, so a zero x still gives exact zeros.
            writeln!(s, "            let lo = select(vec4<f32>(0.0), (v - h32) * LO, fin);").unwrap();
            writeln!(s, "            let least = bitcast<vec4<f32>>((bits & vec4<u32>(0x80000000u)) | vec4<u32>(0x38800000u));").unwrap();
            writeln!(s, "            {tile}_lo[{at}] = vec4<f16>(select(lo, least, (lo == vec4<f32>(0.0)) & (v != vec4<f32>(0.0))));").unwrap();
        } else {
            writeln!(s, "            {tile}_hi[{at}] = vec4<f16>(v);").unwrap();
        }
        writeln!(s, "        }}").unwrap();
    };
    for i in 0..a_slots {
        if v.layout >= 2 {
            stage_packed(&mut stage, "a", &format!("pa{i}"), &format!("(u32(arow{i}) * LDA) / 4u + 2u * u32(acol)"));
            continue;
        }
        let at = if v.channels_last() {
            format!("(u32(arow{i}) * LDA) / 4u + u32(acol)")
        } else {
            format!("(u32(ak{i}) * LDA) / 4u + u32(am)")
        };
        stage_one(&mut stage, "a", &format!("pa{i}"), "sx", at);
    }
    for i in 0..b_slots {
        if v.layout >= 2 {
            stage.push_str(&stage_b_packed(v, i, b_partial, 0));
            continue;
        }
        stage_one(&mut stage, "b", &b_register(0, i), "sw", format!("(u32(bn{i}) * LDB + u32(bk{i})) / 4u"));
    }
    stage
}

/// B slot `i`'s register for the step's kernel tap `tap` (layout 4 gathers several taps).
pub(super) fn b_register(tap: u32, i: u32) -> String {
    if tap == 0 { format!("pb{i}") } else { format!("pt{tap}b{i}") }
}

/// The staging of packed B slot `i` of tap `tap`, whose weights sit `tap` x BN rows on in
/// the staged tile; a partial slot (see `b_guard`) is stored only by the invocations that
/// gathered it.
pub(super) fn stage_b_packed(v: &Coop, i: u32, b_partial: bool, tap: u32) -> String {
    let row = if tap == 0 { format!("u32(bn{i})") } else { format!("({}u + u32(bn{i}))", tap * v.bn) };
    let guard = if b_partial { "if (lid < BN * BK / 8) " } else { "" };
    let mut s = format!("        {guard}{{\n");
    stage_packed(&mut s, "b", &b_register(tap, i), &format!("({row} * LDB + u32(bk{i})) / 4u"));
    s.push_str("        }\n");
    s
}

/// Layout 2's staging of one gather: 8 float16 values loaded as four u32s, stored as two
/// vec4s of the staged row starting at vec4 `at` (not scaled: float16 data).
pub(super) fn stage_packed(s: &mut String, tile: &str, reg: &str, at: &str) {
    writeln!(s, "        {{").unwrap();
    writeln!(s, "            let at = {at};").unwrap();
    unpack_at(s, "            ", &format!("{tile}_hi"), reg);
    writeln!(s, "        }}").unwrap();
}

/// The stores of 8 packed float16 values (`reg`, four u32s) as two vec4s of the staged tile
/// `array` from vec4 `at` on.
pub(in crate::kernels) fn unpack_at(s: &mut String, ind: &str, array: &str, reg: &str) {
    writeln!(s, "{ind}{array}[at] = vec4<f16>(vec2<f16>(unpack2x16float({reg}.x)), vec2<f16>(unpack2x16float({reg}.y)));").unwrap();
    writeln!(s, "{ind}{array}[at + 1u] = vec4<f16>(vec2<f16>(unpack2x16float({reg}.z)), vec2<f16>(unpack2x16float({reg}.w)));").unwrap();
}

/// One k-step's products: per 16-term slice, the subgroup's A and B tiles loaded from
/// workgroup memory and multiplied into its accumulators (and, for the split, the
/// correction terms into theirs). Layout 4 names the staged row its tap's B tile starts at
/// (`b_row`: tap x BN).
pub(super) fn inner_product(v: &Coop, b_row: Option<u32>) -> String {
    let b_at = b_row.map_or(String::new(), |r| format!("{r}u + "));
    let split = v.split == 3;
    let (tm, tn) = (v.tm(), v.tn());
    let parts: &[&str] = if split { &["hi", "lo"] } else { &["hi"] };
    let mut inner = String::new();
    for kk in 0..v.bk / 16 {
        let s = &mut inner;
        writeln!(s, "        {{").unwrap();
        for p in parts {
            for i in 0..tm {
                // Layout 1 holds A row-major (a pixel's terms together), layout 0 column-major.
                let load = if v.windowed() {
                    format!("coopLoadT<MatA>(&a_{p}[(u32(pf{i} + tap) * LDA + {}u) / 4u], LDA / 4u)", kk * 16)
                } else if v.channels_last() {
                    format!("coopLoadT<MatA>(&a_{p}[((wm + {}u) * LDA + {}u) / 4u], LDA / 4u)", i * 16, kk * 16)
                } else {
                    format!("coopLoad<MatA>(&a_{p}[({} * LDA + wm + {}u) / 4u], LDA / 4u)", kk * 16, i * 16)
                };
                writeln!(s, "            let a{p}{i} = {load};").unwrap();
            }
            for j in 0..tn {
                writeln!(
                    s,
                    "            let b{p}{j} = coopLoad<MatB>(&b_{p}[(({b_at}wn + {}u) * LDB + {}u) / 4u], LDB / 4u);",
                    j * 16,
                    kk * 16
                )
                .unwrap();
            }
        }
        for i in 0..tm {
            for j in 0..tn {
                writeln!(s, "            acc{i}_{j} = coopMultiplyAdd(ahi{i}, bhi{j}, acc{i}_{j});").unwrap();
                if split {
                    writeln!(s, "            cor{i}_{j} = coopMultiplyAdd(ahi{i}, blo{j}, cor{i}_{j});").unwrap();
                    writeln!(s, "            cor{i}_{j} = coopMultiplyAdd(alo{i}, bhi{j}, cor{i}_{j});").unwrap();
                }
            }
        }
        writeln!(s, "        }}").unwrap();
    }
    inner
}

/// The k-step loop: barrier, stage, barrier, gather ahead, multiply. Lean variants skip the
/// gathers past the last step (a uniform branch) instead of testing each. `skips`: the
/// advance skips dead taps (`taps`), and each step is the one the last gathered.
pub(super) fn steps(stage: &str, advance: &str, fetch: &str, inner: &str, lean: bool, skips: bool) -> String {
    let mut s = String::from(if skips {
        "    for (var k0: i32 = k_next; k0 < k_end; k0 = k_next) {\n"
    } else {
        "    for (var k0: i32 = k_begin; k0 < k_end; k0 = k0 + BK) {\n"
    });
    s.push_str("        // Everyone is done reading the staged tiles of the previous step.\n");
    s.push_str("        workgroupBarrier();\n");
    s.push_str(stage);
    s.push_str("        workgroupBarrier();\n");
    s.push_str(advance);
    if lean {
        s.push_str(&format!("        if (k_next < k_end) {{\n{fetch}        }}\n"));
    } else {
        s.push_str(fetch);
    }
    s.push_str(inner);
    s.push_str("    }\n");
    s
}
