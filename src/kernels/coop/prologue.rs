//! Layout 1's prologue: the channels-last copies of x and w, and their max |x|, max |w|.

use super::variant::*;
use crate::params::{ConvShape, Layout};

/// The prologue's template values (it is in every coop module; only layout 1 runs it), its
/// workgroup count and how many of those (the last ones) write w's copy.
#[allow(clippy::too_many_arguments)]
pub(super) fn prologue_vars(shape: &ConvShape, padded: &Padded, vec_w: bool, in_place: bool, scaled: bool, wv: u32, packed: bool, w_in_place: bool) -> (Vec<(&'static str, String)>, u64, u64) {
    let hw = shape.h as u64 * shape.w as u64;
    let (p_tiles, c_tiles) = (hw.div_ceil(32), padded.chp.div_ceil(32));
    let x_vec4s = shape.x_len() / 4;
    let padded_vec4s = padded.x_len(shape) / 4;
    let (x_blocks, prologue_x) = match (shape.layout, in_place) {
        // float32 x read in place by the window tiles (the max pass ran before): nothing.
        (_, true) if packed => (0, PROLOGUE_X_WINDOW),
        // float16 NCHW x read in place by the window tiles (`window_f16_nchw`): nothing.
        (Layout::Nchw, true) => (0, PROLOGUE_X_WINDOW),
        // float32 data packed for layout 2 (whole runs of 8 channels: no padding).
        (Layout::Nhwc, _) if packed => ((shape.x_len() / 8).div_ceil(256), PROLOGUE_X_PACK),
        (Layout::Nchw, _) if packed => (shape.n as u64 * p_tiles * c_tiles, PROLOGUE_X_COPY_PACKED),
        // x read in place needs no pass of its own unless its scale is wanted.
        (Layout::Nhwc, true) if !scaled => (0, PROLOGUE_X_NONE),
        // A few workgroups striding over x: one vec4 per invocation made a 100 MB x pay a
        // workgroup's atomics and barriers 25,000 times.
        (Layout::Nhwc, true) => (x_vec4s.div_ceil(256).min(MAX_BLOCKS), PROLOGUE_X_MAX),
        (Layout::Nhwc, false) => (padded_vec4s.div_ceil(256), PROLOGUE_X_PAD),
        (Layout::Nchw, _) => (shape.n as u64 * p_tiles * c_tiles, PROLOGUE_X_COPY),
    };
    let w_blocks = if w_in_place { 0 } else { (padded.w_len(shape) / wv as u64).div_ceil(256) };
    let w_at = if vec_w { "    return f32(w[i / 4][i % 4]);" } else { "    return f32(w[i]);" };
    let vars = vec![
        ("P_TILES", p_tiles.to_string()),
        ("C_TILES", c_tiles.to_string()),
        ("X_BLOCKS", x_blocks.to_string()),
        ("W_BLOCKS", w_blocks.to_string()),
        ("WV", wv.to_string()),
        ("WT_WRITE", if wv == 8 { wt_write_packed(packed) } else { WT_WRITE.to_string() }),
        ("W_AT", w_at.to_string()),
        ("W_CHUNK", if w_in_place { W_CHUNK } else { "" }.to_string()),
        ("X_VEC4S", x_vec4s.to_string()),
        ("PROLOGUE_X", prologue_x.to_string()),
        // Only layout 1's prologue on float32 data finds the maxima the kernel scales by;
        // elsewhere they are known before it runs (the max pass, or the upload's) or unused
        // (float16 data), and every workgroup's two atomics on the same two words were most
        // of the packing copies' time on an H200 (54-72% on NCHW x).
        ("PROLOGUE_FOLD", if scaled && !packed { PROLOGUE_FOLD } else { "    // The maxima are known before this pass (or unused): nothing to fold." }.to_string()),
        ("XP_VEC4S", padded_vec4s.to_string()),
    ];
    (vars, x_blocks + w_blocks, w_blocks)
}

/// Layouts 2 to 4's in-place gather of a 1x1 kernel's w (where they read w in place).
pub(super) const W_CHUNK: &str = r#"// Layouts 2 to 4 gather a 1x1 kernel's w in place: the 8 weights of reduction terms at ..
// at + 7 (neighbouring channels, 16-byte aligned) of one output channel, scaled by `sw` (1
// for float16 data) and packed as float16.
fn w_chunk(at: i32, sw: f32) -> vec4<u32> {
    let v = vec4<f32>(w[at / 4]) * sw;
    let u = vec4<f32>(w[at / 4 + 1]) * sw;
    return vec4<u32>(pack2x16float(v.xy), pack2x16float(v.zw), pack2x16float(u.xy), pack2x16float(u.zw));
}
"#;

/// The prologue's write of four channels of w's copy.
pub(super) const WT_WRITE: &str = "            wt[i] = vec4<CT>(v);";

/// Layouts 2 and 3's: eight channels packed as float16 into 16 bytes. float16 data is never
/// scaled (the max below, of the first four, goes unused); float32 data (`scaled`) is scaled
/// as the max pass before the prologue says (the max below then changes nothing).
fn wt_write_packed(scaled: bool) -> String {
    let (sw, times) = if scaled { ("            let sw = ldexp(1.0, scale_exp(atomicLoad(&scales[1])));\n", " * sw") } else { ("", "") };
    format!(
        "            let u = vec4<f32>(w_or_zero(src + 4 * R * S, c + 4), w_or_zero(src + 5 * R * S, c + 5),
                              w_or_zero(src + 6 * R * S, c + 6), w_or_zero(src + 7 * R * S, c + 7));
{sw}            wt[i] = vec4<u32>(pack2x16float(v.xy{times}), pack2x16float(v.zw{times}), pack2x16float(u.xy{times}), pack2x16float(u.zw{times}));"
    )
}

/// The prologue's x part for float32 NHWC x on layouts 2 and 3: 8 channels per invocation,
/// scaled (the max pass ran before the prologue) and packed as float16.
pub(super) const PROLOGUE_X_PACK: &str = r#"        let i = i32(block) * 256 + lid;
        let sx = tile_sx;
        if (i < X_VEC4S / 2) {
            let v = vec4<f32>(x_at(8 * i), x_at(8 * i + 1), x_at(8 * i + 2), x_at(8 * i + 3)) * sx;
            let u = vec4<f32>(x_at(8 * i + 4), x_at(8 * i + 5), x_at(8 * i + 6), x_at(8 * i + 7)) * sx;
            xt[i] = vec4<u32>(pack2x16float(v.xy), pack2x16float(v.zw), pack2x16float(u.xy), pack2x16float(u.zw));
        }"#;

/// The prologue's x part for float32 NCHW x on layouts 2 and 3: a 32-channel x 32-pixel
/// tile through workgroup memory as `PROLOGUE_X_COPY`, scaled, written 8 channels of a
/// pixel (16 bytes of packed float16) per invocation.
pub(super) const PROLOGUE_X_COPY_PACKED: &str = r#"        let p0 = i32(block % P_TILES) * 32;
        let c0 = i32((block / P_TILES) % C_TILES) * 32;
        let n = i32(block / (P_TILES * C_TILES));
        let sx = tile_sx;
        for (var i = 0; i < 4; i = i + 1) {
            let cy = lid / 32 + 8 * i;
            let p = p0 + lid % 32;
            let cg = (c0 + cy) / CP;
            let cc = (c0 + cy) % CP;
            let ok = c0 + cy < CHP && cc < CG && p < HW;
            tile[cy * 33 + lid % 32] = select(0.0, x_at(select(0, (n * CH + cg * CG + cc) * HW + p, ok)), ok) * sx;
        }
        workgroupBarrier();
        let py = lid / 4;
        let c8 = 8 * (lid % 4);
        if (lid < 128 && p0 + py < HW && c0 + c8 < CHP) {
            let t = c8 * 33 + py;
            xt[((n * HW + p0 + py) * CHP + c0 + c8) / 8] = vec4<u32>(
                pack2x16float(vec2<f32>(tile[t], tile[t + 33])), pack2x16float(vec2<f32>(tile[t + 66], tile[t + 99])),
                pack2x16float(vec2<f32>(tile[t + 132], tile[t + 165])), pack2x16float(vec2<f32>(tile[t + 198], tile[t + 231])));
        }"#;

/// The prologue's fold of its workgroup's maxima into the run's scales, unless they were
/// written before the run: each workgroup's two atomics on the same two words cost a
/// "highest" stride-2 layer with a 51 MB x (layout 1) 8% of its time on an H200.
pub(super) const PROLOGUE_FOLD: &str = r#"    workgroupBarrier();
    // Word 2 set: the runner wrote the maxima before the run (the upload's), and these
    // would only find them again.
    if (lidx == 0u && atomicLoad(&scales[2]) == 0u) {
        atomicMax(&scales[0], atomicLoad(&tile_max[0]));
        atomicMax(&scales[1], atomicLoad(&tile_max[1]));
    }"#;

/// Workgroups of the prologue's max pass over x read in place, as in `check`'s.
pub(super) const MAX_BLOCKS: u64 = 1024;

/// The prologue's x part for NCHW x: transpose a 32-channel x 32-pixel tile into `xt`.
pub(super) const PROLOGUE_X_COPY: &str = r#"        let p0 = i32(block % P_TILES) * 32;
        let c0 = i32((block / P_TILES) % C_TILES) * 32;
        let n = i32(block / (P_TILES * C_TILES));
        var mx = 0u;
        for (var i = 0; i < 4; i = i + 1) {
            let cy = lid / 32 + 8 * i;
            let p = p0 + lid % 32;
            // Padded channel c0 + cy is channel cc of group cg; past CG it is padding (zero).
            let cg = (c0 + cy) / CP;
            let cc = (c0 + cy) % CP;
            let ok = c0 + cy < CHP && cc < CG && p < HW;
            let v = select(0.0, x_at(select(0, (n * CH + cg * CG + cc) * HW + p, ok)), ok);
            mx = max(mx, finite_abs_bits(v));
            tile[cy * 33 + lid % 32] = v;
        }
        atomicMax(&tile_max[0], mx);
        workgroupBarrier();
        let py = lid / 8;
        let c4 = 4 * (lid % 8);
        if (p0 + py < HW && c0 + c4 < CHP) {
            xt[((n * HW + p0 + py) * CHP + c0 + c4) / 4] = vec4<CT>(vec4<f32>(
                tile[c4 * 33 + py], tile[(c4 + 1) * 33 + py],
                tile[(c4 + 2) * 33 + py], tile[(c4 + 3) * 33 + py]));
        }"#;

/// The prologue's x part for NHWC x whose groups' channels are not whole vec4s: copy it with
/// each group's channels zero-padded to CP, one vec4 of the copy per invocation.
pub(super) const PROLOGUE_X_PAD: &str = r#"        let i = i32(block) * 256 + lid;
        var mx = 0u;
        if (i < XP_VEC4S) {
            let pix = (4 * i) / CHP;
            let c0 = (4 * i) % CHP;
            var v = vec4<f32>(0.0);
            for (var j = 0; j < 4; j = j + 1) {
                // Padded channel c0 + j is channel cc of group cg; past CG it is padding.
                let cg = (c0 + j) / CP;
                let cc = (c0 + j) % CP;
                let ok = cc < CG;
                v[j] = select(0.0, x_at(select(0, pix * CH + cg * CG + cc, ok)), ok);
                mx = max(mx, finite_abs_bits(v[j]));
            }
            xt[i] = vec4<CT>(v);
        }
        atomicMax(&tile_max[0], mx);"#;

/// The prologue's x part for float16 NHWC x read in place: nothing (no copy, no scale), and
/// no workgroup takes this branch.
pub(super) const PROLOGUE_X_NONE: &str = "        // float16 x read in place: no copy, no scale.";

/// The same for x that the window tiles read in place: float32 (its max pass ran before)
/// and float16 NCHW.
pub(super) const PROLOGUE_X_WINDOW: &str = "        // x read in place by the window tiles (float32 scaled as they load it).";

/// The prologue's x part for NHWC x, which the kernel reads in place: its max only.
pub(super) const PROLOGUE_X_MAX: &str = r#"        var mx = 0u;
        for (var i = i32(block) * 256 + lid; i < X_VEC4S; i = i + i32(X_BLOCKS) * 256) {
            let b = bitcast<vec4<u32>>(vec4<f32>(x[i])) & vec4<u32>(0x7FFFFFFFu);
            let f = select(vec4<u32>(0u), b, b < vec4<u32>(0x7F800000u));
            mx = max(mx, max(max(f.x, f.y), max(f.z, f.w)));
        }
        atomicMax(&tile_max[0], mx);"#;
