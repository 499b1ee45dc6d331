//! Expands the WGSL templates in `shaders/` into one source per (variant, shape).
//!
//! Templates hold the readable skeleton of each kernel family; this module writes out the
//! register-level parts (accumulators, loads, FMAs) with constant indices, because NVIDIA's
//! Vulkan compiler spills loop-indexed register arrays to local memory.

use crate::error::{Error, Result};
use crate::params::ConvShape;

/// Generated WGSL for one variant and shape, plus the dispatch it needs.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub source: String,
    /// Total workgroups; the launcher folds them into a 2D grid.
    pub workgroups: u64,
    /// Whether the kernel reads max |x| and max |w| (binding 4), which a pass before it
    /// computes.
    pub scaled: bool,
    /// Workgroups of the module's `prologue` entry point, run before `main`. It fills the
    /// workspace buffers and, for a scaled kernel, computes the scales itself.
    pub prologue: Option<u64>,
    /// With a prologue on a scaled kernel: the max-|x|, max-|w| pass runs first anyway, so
    /// the prologue can write scaled copies (otherwise it computes the maxima itself).
    pub prescale: bool,
    /// Bytes of the two workspace buffers (bindings 5 and 6) the prologue fills.
    pub workspace: [u64; 2],
    /// The prologue's last `w_blocks` workgroups only write w's copy into binding 6 (w
    /// rearranged, or a Winograd family's transformed filters), the rest never touch it: with
    /// that copy kept from an earlier run on the same weights, the prologue runs without them.
    pub w_blocks: u64,
    /// Workgroups of the module's `finish` entry point, run after `main` (split-K sums).
    pub finish: Option<u64>,
    /// A pass of its own module run first, rewriting w into the weights `main` reads (a
    /// transposed convolution computed in its lowered form).
    pub wprep: Option<WeightPrep>,
    /// Runs of `prologue`, `main` and `finish` in a row, each over its own part of the
    /// problem ("chunk") with the workspace reused: 1 for most kernels. Before each run the
    /// runner writes the chunk's index (0, 1, ...) into word [`CHUNK_WORD`] of binding 4,
    /// where the passes read it; the dispatches are the same for every chunk.
    pub chunks: u32,
}

impl Kernel {
    /// The GPU dispatches one run makes, in order: the weight pass (a transposed problem's
    /// lowered weights; skipped once a weight Tensor keeps them), the max-|x|, |w| pass (a
    /// scaled kernel's, unless both maxima are known: Tensor inputs), the prologue, `main`
    /// and the finishing pass. A chunked kernel runs those from the prologue on once per
    /// chunk (`chunks`).
    pub fn dispatches(&self) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.wprep.is_some() {
            d.push("weights");
        }
        if self.scaled && (self.prologue.is_none() || self.prescale) {
            d.push("max");
        }
        if self.prologue.is_some_and(|g| g > 0) {
            d.push("prologue");
        }
        d.push("main");
        if self.finish.is_some() {
            d.push("finish");
        }
        d
    }
}

/// The default bound on each workspace binding (5 and 6) of a kernel: lavapipe's largest
/// storage binding, and wgpu's default limit. `Engine::max_workspace` lowers it to the
/// adapter's limit (and `CONVTUNE_MAX_WORKSPACE`, for tests).
pub const MAX_WORKSPACE: u64 = 128 << 20;

/// The most chunks a kernel may run in (the engine keeps that many chunk indices).
pub const MAX_CHUNKS: u32 = 4096;

/// The word of binding 4 (the run's words: max |x| and max |w| in words 0 and 1 for kernels
/// that scale) holding the index of the chunk a chunked kernel's passes compute.
pub const CHUNK_WORD: u64 = 3;

/// A weight-rearranging pass: its module's `main` reads w (binding 1) and writes the
/// kernel's weights (binding 3, a pooled buffer of `bytes`), which the kernel's own passes
/// then read as w.
#[derive(Clone, Debug)]
pub struct WeightPrep {
    pub source: String,
    pub workgroups: u64,
    pub bytes: u64,
}

impl Kernel {
    /// A kernel that is one dispatch of `main` over `workgroups` workgroups.
    pub fn plain(source: String, workgroups: u64) -> Kernel {
        Kernel { source, workgroups, scaled: false, prologue: None, prescale: false, workspace: [0, 0], w_blocks: 0, finish: None, wprep: None, chunks: 1 }
    }
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

/// Placeholders shared by every family: the shape, baked in as constants.
pub fn shape_vars(shape: &ConvShape, variant: &str) -> Vec<(&'static str, String)> {
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
        // The store step: the epilogue, then where its value goes (`ystore`).
        ("EPILOGUE", s.epilogue.wgsl(s.bias, s.dtype, s.scatter.map(|_| "ybias")) + &store_index_wgsl(s)),
        // The data's element type; float16 needs WGSL's f16 extension (coop.wgsl enables it
        // for its own use in any case).
        ("DT", s.dtype.wgsl().to_string()),
        ("ENABLES", if s.dtype == crate::dtype::DType::F16 { "enable f16;\n" } else { "" }.to_string()),
        ("XSN", s.x_strides()[0].to_string()),
        ("XSC", s.x_strides()[1].to_string()),
        ("XSH", s.x_strides()[2].to_string()),
        ("XSW", s.x_strides()[3].to_string()),
        ("YSN", s.y_strides()[0].to_string()),
        ("YSK", s.y_strides()[1].to_string()),
        ("YSP", s.y_strides()[2].to_string()),
    ]
}

/// `fn ystore(yi: i32) -> i32`: where the conv's output element at `yi` (indexed through
/// YSN, YSK and YSP) is stored, as `ConvShape::y_store_index` computes it. The identity
/// without a pixel shuffle; with one, a few divisions by constants per stored element. Every
/// store of the FMA families and the split-K finish passes its index through it, and reads
/// z there too (z has y's shuffled shape).
pub fn store_index_wgsl(s: &ConvShape) -> String {
    if let Some(sc) = s.scatter {
        return scatter_wgsl(s, &sc);
    }
    let r = s.shuffle();
    if r == 1 {
        return "\nfn ystore(yi: i32) -> i32 { return yi; }\n".into();
    }
    let (k, oh, ow) = (s.k, s.oh(), s.ow());
    let img = k * oh * ow;
    let (chan, pix) = match s.layout {
        crate::params::Layout::Nchw => (format!("off / {}", oh * ow), format!("off % {}", oh * ow)),
        crate::params::Layout::Nhwc => (format!("off % {k}"), format!("off / {k}")),
    };
    let stored = match s.layout {
        crate::params::Layout::Nchw => format!("(c * {} + row) * {} + col", oh * r, ow * r),
        crate::params::Layout::Nhwc => format!("(row * {} + col) * {} + c", ow * r, k / (r * r)),
    };
    format!(
        "
// Depth-to-space by {r}: conv channel c*{r}*{r} + i*{r} + j at (oh, ow) -> channel c at
// (oh*{r} + i, ow*{r} + j). Image blocks keep their place.
fn ystore(yi: i32) -> i32 {{
    let off = yi % {img};
    let ch = {chan};
    let p = {pix};
    let c = ch / {rr};
    let row = (p / {ow}) * {r} + (ch / {r}) % {r};
    let col = (p % {ow}) * {r} + ch % {r};
    return yi - off + {stored};
}}
",
        rr = r * r
    )
}

/// `ystore` for a scatter ([`crate::params::Scatter`]: a transposed convolution's lowered
/// form, or a pixel shuffle's): the output index of the lowered output at `yi`, or -1 where
/// it falls outside (every store then skips it), and `ybias`: a lowered channel's bias entry.
fn scatter_wgsl(s: &ConvShape, sc: &crate::params::Scatter) -> String {
    let (k, oh, ow) = (s.k, s.oh(), s.ow());
    let (sh, sw) = sc.phases;
    let (fh, fw) = sc.out;
    let kf = sc.kg * s.groups;
    let (chan, pix) = match s.layout {
        crate::params::Layout::Nchw => (format!("off / {}", oh * ow), format!("off % {}", oh * ow)),
        crate::params::Layout::Nhwc => (format!("off % {k}"), format!("off / {k}")),
    };
    let stored = match s.layout {
        crate::params::Layout::Nchw => format!("(c * {fh} + row) * {fw} + col"),
        crate::params::Layout::Nhwc => format!("(row * {fw} + col) * {kf} + c"),
    };
    format!(
        "
// The lowered form's scatter: channel (g, phase, c) at (oh, ow) -> channel
// g * {kgf} + c at (oh * {sh} + phase / {sw} - {oh0}, ow * {sw} + phase % {sw} - {ow0}).
fn ybias(k: i32) -> i32 {{
    return {bias};
}}
// The two halves of the mapping, for stores that hold one of them across many elements:
// a lowered pixel's image offset, row and column, and a lowered channel's output channel
// and phase row and column.
fn ypix(m: i32) -> vec3<i32> {{
    let p = m % {ohw};
    return vec3<i32>((m / {ohw}) * {fimg}, (p / {ow}) * {sh} - {oh0}, (p % {ow}) * {sw} - {ow0});
}}
fn ychan(ch: i32) -> vec3<i32> {{
    let n = ch % {gk};
    let phase = {phase_of_n};
    return vec3<i32>((ch / {gk}) * {kgf} + {c_of_n}, phase / {sw}, phase % {sw});
}}
fn yscatter(p: vec3<i32>, q: vec3<i32>) -> i32 {{
    let row = p.y + q.y;
    let col = p.z + q.z;
    let c = q.x;
{crop}    return p.x + {stored};
}}
fn ystore(yi: i32) -> i32 {{
    let off = yi % {img};
    return yscatter(ypix((yi / {img}) * {ohw} + {pix}), ychan({chan}));
}}
",
        ohw = oh * ow,
        img = k * oh * ow,
        fimg = kf * fh * fw,
        crop = if sc.crops() {
            format!("    if (row < 0 || row >= {fh} || col < 0 || col >= {fw}) {{\n        return -1;\n    }}\n")
        } else {
            String::new()
        },
        // A shuffle's lowered channel (g, phase, c) came from conv channel
        // g * KG + c * phases + phase, which has its own bias.
        bias = match (sc.shuffle, sc.phase_major) {
            // A transposed convolution's pixel shuffle: the bias of the transposed output
            // channel the (phase, channel) pair came from.
            (false, _) if sc.inner > 1 => {
                let (q, p) = (sc.inner, sh * sw);
                let (phase, c) = if sc.phase_major {
                    (format!("(k % {gk}) / {kgf}", gk = s.kg(), kgf = sc.kg), format!("k % {}", sc.kg))
                } else {
                    (format!("(k % {gk}) % {p}", gk = s.kg()), format!("(k % {gk}) / {p}", gk = s.kg()))
                };
                format!(
                    "(k / {gk}) * {kgt} + (({c}) * {q} + (({phase}) / {sw}) % {q}) * {q} + (({phase}) % {sw}) % {q}",
                    gk = s.kg(),
                    kgt = sc.kg * q * q
                )
            }
            (true, false) => "k".to_string(),
            (true, true) => format!("(k / {gk}) * {gk} + (k % {kgf}) * {p} + (k % {gk}) / {kgf}", gk = s.kg(), kgf = sc.kg, p = sh * sw),
            (false, true) => format!("(k / {gk}) * {kgf} + k % {kgf}", gk = s.kg(), kgf = sc.kg),
            (false, false) => format!("(k / {gk}) * {kgf} + (k % {gk}) / {p}", gk = s.kg(), kgf = sc.kg, p = sh * sw),
        },
        phase_of_n = if sc.phase_major { format!("n / {}", sc.kg) } else { format!("n % {}", sh * sw) },
        c_of_n = if sc.phase_major { format!("n % {}", sc.kg) } else { format!("n / {}", sh * sw) },
        gk = s.kg(),
        kgf = sc.kg,
        oh0 = sc.off.0,
        ow0 = sc.off.1,
    )
}

/// One output element's store: `value` (an f32 sum) through the epilogue into y at the
/// conv's output index `at` (moved by `ystore`), for channel `k`. Problems whose stores can
/// fall outside y (a lowered transposed convolution) skip those.
pub fn store_stmt(s: &ConvShape, at: &str, value: &str, k: &str) -> String {
    let store = format!("y[yi] = DT(epilogue({value}, {k}, yi));");
    if s.scatter.is_some_and(|sc| sc.crops()) {
        format!("let yi = ystore({at}); if (yi >= 0) {{ {store} }}")
    } else {
        format!("let yi = ystore({at}); {store}")
    }
}

/// A WGSL vec4's components, by index.
pub const LANES: [&str; 4] = ["x", "y", "z", "w"];

/// The epilogue of n outputs at y elements `base` + 0..n (channels `ks`), packed for one
/// vecn store.
pub fn epilogue_vec(values: &[String], ks: &[String], base: &str) -> String {
    debug_assert_eq!(values.len(), ks.len());
    let parts: Vec<String> =
        values.iter().zip(ks).enumerate().map(|(e, (v, k))| format!("DT(epilogue({v}, {k}, {base} + {e}))")).collect();
    format!("vec{}<DT>({})", values.len(), parts.join(", "))
}

/// `store_stmt` for a scatter ([`crate::params::Scatter`]) whose caller holds the two halves
/// of the mapping: `pixel` (`ypix`'s vec3 for the output's lowered pixel) and `chan` (`ychan`'s
/// for its channel), so that no element divides by the image and row sizes as `ystore` does.
pub fn scatter_store_stmt(s: &ConvShape, pixel: &str, chan: &str, value: &str, k: &str) -> String {
    let store = format!("y[yi] = DT(epilogue({value}, {k}, yi));");
    if s.scatter.is_some_and(|sc| sc.crops()) {
        format!("let yi = yscatter({pixel}, {chan}); if (yi >= 0) {{ {store} }}")
    } else {
        format!("let yi = yscatter({pixel}, {chan}); {store}")
    }
}

/// Parses and validates WGSL with naga, the front end wgpu itself uses.
#[cfg(test)]
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
    use crate::kernels::swept_variants;

    #[test]
    fn render_fills_and_rejects_missing() {
        assert_eq!(render("a {{X}} b", &[("X", "1".into())]).unwrap(), "a 1 b");
        assert!(render("a {{Y}} b", &[("X", "1".into())]).is_err());
    }

    /// Every generatable variant passes naga validation, on shapes that exercise padding,
    /// stride, dilation, groups and bias.
    #[test]
    fn swept_variants_validate() {
        let shapes = [
            ConvShape::new([2, 6, 9, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 2, Some(4)).unwrap(),
            ConvShape::new([1, 3, 5, 5], [5, 3, 1, 1], (1, 1), Padding::Valid, (1, 1), 1, None).unwrap(),
            // Channel counts the channels-last gathers take.
            ConvShape::new([2, 8, 9, 7], [6, 4, 3, 2], (2, 1), Padding::Explicit(1, 0), (1, 2), 2, Some(6)).unwrap(),
            // NHWC, read in place by the channels-last tensor-core variants.
            ConvShape::new([2, 8, 9, 7], [6, 4, 3, 2], (2, 1), Padding::Explicit(1, 0), (1, 2), 2, Some(6))
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc),
            // NHWC with C/groups 3: the tensor-core prologue's padded copy.
            ConvShape::new([2, 6, 9, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 2, Some(4))
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc),
            // 3x3 at stride 1 (the Winograd family): groups, bias, odd output sizes, residual.
            ConvShape::new([2, 6, 9, 7], [10, 3, 3, 3], (1, 1), Padding::Explicit(2, 0), (1, 1), 2, Some(10))
                .unwrap()
                .with_epilogue(crate::epilogue::Epilogue::new(0.5, 2.0, true, crate::epilogue::Activation::Relu).unwrap()),
            // Outputs stored four at a time: whole quads of pixels (NCHW) or of channels (NHWC).
            ConvShape::new([2, 8, 8, 8], [8, 8, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, Some(8))
                .unwrap()
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap()),
            ConvShape::new([2, 8, 9, 7], [8, 8, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, Some(8))
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc),
            // Short grids with a long reduction: the tensor-core split-K variants.
            ConvShape::new([2, 64, 8, 8], [32, 64, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, Some(32))
                .unwrap()
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap()),
            ConvShape::new([2, 64, 8, 8], [32, 64, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc)
                .with_dtype(crate::dtype::DType::F16),
            // 1x1 at stride 1 with whole quads of pixels: gathered four pixels at a time.
            ConvShape::new([2, 8, 4, 6], [6, 4, 1, 1], (1, 1), Padding::Explicit(0, 0), (1, 1), 2, Some(6)).unwrap(),
            // float16 data, both layouts.
            ConvShape::new([2, 8, 9, 7], [6, 4, 3, 2], (2, 1), Padding::Explicit(1, 0), (1, 2), 2, Some(6))
                .unwrap()
                .with_dtype(crate::dtype::DType::F16),
            ConvShape::new([2, 8, 9, 7], [8, 8, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc)
                .with_dtype(crate::dtype::DType::F16)
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap()),
            // Pixel-shuffled stores, both layouts (3x3 at stride 1 for the Winograd family).
            ConvShape::new([2, 6, 9, 7], [18, 3, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 2, Some(18))
                .unwrap()
                .with_pixel_shuffle(3)
                .unwrap(),
            ConvShape::new([2, 8, 9, 7], [16, 8, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc)
                .with_dtype(crate::dtype::DType::F16)
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap())
                .with_pixel_shuffle(2)
                .unwrap(),
            // Transposed: strided, dilated, grouped, output padding; NHWC float16 with a residual.
            ConvShape::new_transposed([2, 6, 5, 4], [6, 2, 3, 2], (2, 3), (1, 0), (1, 2), (1, 2), 2, Some(4)).unwrap(),
            ConvShape::new_transposed([2, 8, 5, 4], [8, 8, 4, 4], (2, 2), (1, 1), (0, 0), (1, 1), 1, None)
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc)
                .with_dtype(crate::dtype::DType::F16)
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap()),
            // Lowered to plain convolutions by stride phases (every family): kernels short of
            // a stride multiple, grouped, with a bias.
            ConvShape::new_transposed([2, 6, 5, 4], [6, 2, 3, 3], (2, 3), (1, 0), (1, 2), (1, 1), 2, Some(4)).unwrap(),
            // Padding modes read in x, not zeros: strided, dilated and grouped; NHWC float16
            // with a residual; 3x3 at stride 1 (the Winograd families) and window tiles.
            ConvShape::new([2, 6, 9, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 2, Some(4))
                .unwrap()
                .with_padding_mode(crate::params::PaddingMode::Reflect)
                .unwrap(),
            ConvShape::new([2, 8, 9, 7], [6, 4, 3, 2], (2, 1), Padding::Explicit(1, 1), (1, 2), 2, Some(6))
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc)
                .with_padding_mode(crate::params::PaddingMode::Circular)
                .unwrap(),
            ConvShape::new([2, 16, 9, 11], [16, 16, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
                .unwrap()
                .with_layout(crate::params::Layout::Nhwc)
                .with_dtype(crate::dtype::DType::F16)
                .with_epilogue(crate::epilogue::Epilogue::new(1.0, 0.5, true, crate::epilogue::Activation::Relu).unwrap())
                .with_padding_mode(crate::params::PaddingMode::Replicate)
                .unwrap(),
            ConvShape::new([2, 6, 9, 7], [10, 6, 3, 3], (1, 1), Padding::Explicit(2, 1), (1, 1), 1, Some(10))
                .unwrap()
                .with_padding_mode(crate::params::PaddingMode::Reflect)
                .unwrap(),
        ];
        for shape in &shapes {
            for v in swept_variants() {
                let k = match v.generate(shape) {
                    Ok(k) => k,
                    // A variant may refuse a shape it does not suit (split-K workspace over
                    // its limit, a Winograd variant a filter other than 3x3 at stride 1),
                    // never one it suits.
                    Err(e) if !v.suits(shape) => {
                        assert!(e.to_string().contains("cannot run on this shape"), "{v}: {e}");
                        continue;
                    }
                    Err(e) => panic!("{v} on {}: {e}", shape.label()),
                };
                // A variant that takes a padding mode defines the mode's rows and columns and
                // reads through them.
                if !shape.padding_mode.is_zeros() {
                    let uses = |f: &str| k.source.matches(f).count() > 1;
                    assert!(uses("pad_row(") && uses("pad_col("), "{v} on {}: the mode is not read", shape.label());
                }
                for source in std::iter::once(&k.source).chain(k.wprep.as_ref().map(|p| &p.source)) {
                    if let Err(e) = validate(source) {
                        panic!("{v} on {}: {e}", shape.label());
                    }
                }
            }
        }
    }
}
