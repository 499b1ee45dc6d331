//! The direct store: where y holds float32 and the output needs nothing but its scale (no
//! epilogue, bias, scatter or split-K partials), each accumulator tile goes from the
//! subgroup's registers straight into y (cooperative matrix stores along y's own rows or
//! columns), without the scratch round trip and its two barriers per tile. Only a workgroup
//! whose whole tile lies inside y takes it (a uniform test); the others keep the scratch
//! store, which checks each element. naga cannot convert an f32 matrix to f16, so float16
//! outputs always go through the scratch.

use super::variant::*;
use crate::dtype::DType;
use crate::params::{ConvShape, Layout};
use std::fmt::Write as _;

/// Whether `shape`'s outputs can be stored directly by `v` (the window tiles' and the
/// gathering layouts' pixel blocks: 16 consecutive tile pixels are 16 consecutive pixels of
/// one image wherever the tile lies inside it, for the gathering layouts in NCHW where the
/// image's pixels are whole 16-pixel blocks). Layouts 0 and 4 only: on an H200 their tiles
/// ran 5-15% (layout 0) and up to 4% (layout 4) faster so, layouts 1 to 3 within 1% but one
/// tile 43% slower, and the second store path makes a kernel compile ~15% longer, which with
/// a cold driver cache pushed a layer's winner past the tuning budget (benches/results/HISTORY.md, "Float32
/// outputs stored from registers").
pub(super) fn direct(v: &Coop, shape: &ConvShape, window: bool) -> bool {
    let blocks_in_images = window || shape.layout == Layout::Nhwc || (shape.oh() as u64 * shape.ow() as u64) % 16 == 0;
    matches!(v.layout, 0 | 4)
        && shape.dtype == DType::F32
        && shape.epilogue.is_plain()
        && !shape.bias
        && shape.scatter.is_none()
        && shape.pixel_shuffle.is_none()
        && v.splits == 1
        && blocks_in_images
}

/// `if (inside) { direct stores } else { scratch }`: the direct stores of every accumulator
/// tile, `vec_y` where y is bound as vec4s (the stores then count fours).
pub(super) fn direct_store(v: &Coop, shape: &ConvShape, vec_y: bool, window: bool, scratch: &str) -> String {
    let inside = if window { "oh0 + BM / TW <= OH && ow0 + TW <= OW && n0 + BN <= KG" } else { "m0 + BM <= M && n0 + BN <= KG" };
    let nchw = shape.layout == Layout::Nchw;
    let (store_fn, stride) = if nchw { ("coopStore", "YSK") } else { ("coopStoreT", "YSP") };
    let four = if vec_y { " / 4" } else { "" };
    let mut s = String::new();
    writeln!(s, "    // The whole tile lies inside y: each accumulator tile straight from registers.").unwrap();
    writeln!(s, "    if ({inside}) {{").unwrap();
    writeln!(s, "        let scale = min(ux, uw) * max(ux, uw);").unwrap();
    // Stride and index as values of their own: naga's SPIR-V writer leaves a store's
    // argument expressions unemitted where they read memory (a size-generic module's
    // sizes, `generic`).
    writeln!(s, "        let y_stride = u32({stride}){four};").unwrap();
    for i in 0..v.tm() {
        let q = format!("i32(wm) + {}", i * 16);
        let pixel = if window {
            format!("img * YSN + ((oh0 + ({q}) / TW) * OW + ow0 + ({q}) % TW) * YSP")
        } else {
            let m = format!("m0 + {q}");
            format!("(({m}) / OHW) * YSN + (({m}) % OHW) * YSP")
        };
        writeln!(s, "        let yd{i} = {pixel};").unwrap();
        for j in 0..v.tn() {
            let sum = if v.split == 3 { format!("(acc{i}_{j} + cor{i}_{j} * (1.0 / LO))") } else { format!("acc{i}_{j}") };
            let at = format!("yd{i} + (g * KG + n0 + i32(wn) + {}) * YSK", j * 16);
            writeln!(s, "        {{ let y_at = ({at}){four}; {store_fn}({sum} * scale, &y[y_at], y_stride); }}").unwrap();
        }
    }
    writeln!(s, "    }} else {{").unwrap();
    s.push_str(scratch);
    writeln!(s, "    }}").unwrap();
    s
}
