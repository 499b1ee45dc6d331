//! Convolution parameters: the validated description of one conv2d problem.
//!
//! Semantics follow `torch.nn.functional.conv2d`: cross-correlation, x is (N, C, H, W),
//! w is (K, C/groups, R, S), output is (N, K, OH, OW). Padding may be asymmetric (PyTorch's
//! "same" with an even effective kernel pads one more at the bottom/right).

use crate::dtype::DType;
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::sizes::human;
use serde::{Deserialize, Serialize};

/// Padding as asked for by the caller, before it is resolved against the kernel size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Zeros on each side: (rows at the top and bottom, columns at the left and right).
    Explicit(i64, i64),
    /// No padding.
    Valid,
    /// The output as large as the input (stride 1 only); an even effective kernel pads
    /// one more at the bottom and right, as PyTorch does.
    Same,
}

/// What a plain convolution's padding holds (PyTorch's `Conv2d(padding_mode=...)`): zeros,
/// or x's own values at the index the mode maps a padded row or column to. The kernels that
/// take a mode read those values in their gather; no padded copy of x is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PaddingMode {
    /// Zeros, as every family takes them.
    #[default]
    Zeros,
    /// x mirrored about its edge row/column, the edge itself not repeated (padding < size).
    Reflect,
    /// The edge row/column repeated.
    Replicate,
    /// x wrapped around (padding <= size).
    Circular,
}

impl PaddingMode {
    /// `"zeros"`, `"reflect"`, `"replicate"` or `"circular"`, as PyTorch names them.
    pub fn parse(name: &str) -> Result<PaddingMode> {
        match name {
            "zeros" => Ok(PaddingMode::Zeros),
            "reflect" => Ok(PaddingMode::Reflect),
            "replicate" => Ok(PaddingMode::Replicate),
            "circular" => Ok(PaddingMode::Circular),
            other => Err(Error::invalid(format!(
                "padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got {other:?}"
            ))),
        }
    }

    /// The mode's name, as `parse` takes it.
    pub fn name(self) -> &'static str {
        match self {
            PaddingMode::Zeros => "zeros",
            PaddingMode::Reflect => "reflect",
            PaddingMode::Replicate => "replicate",
            PaddingMode::Circular => "circular",
        }
    }

    /// Whether the padding holds zeros (the default).
    pub fn is_zeros(&self) -> bool {
        *self == PaddingMode::Zeros
    }
}

/// How x and y are laid out in memory: channels second (PyTorch's default) or last. The
/// weights are (K, C/groups, R, S) either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layout {
    /// (N, C, H, W): channels second, PyTorch's default.
    #[default]
    #[serde(rename = "NCHW")]
    Nchw,
    /// (N, H, W, C): channels last.
    #[serde(rename = "NHWC")]
    Nhwc,
}

impl Layout {
    /// `"NCHW"` or `"NHWC"`.
    pub fn parse(name: &str) -> Result<Layout> {
        match name {
            "NCHW" => Ok(Layout::Nchw),
            "NHWC" => Ok(Layout::Nhwc),
            other => Err(Error::invalid(format!("layout must be \"NCHW\" or \"NHWC\", got {other:?}"))),
        }
    }

    /// Its name, as [`parse`](Self::parse) takes it.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "NCHW",
            Layout::Nhwc => "NHWC",
        }
    }

    /// A tensor's dims in this layout from its (N, C, H, W) dims, and back.
    pub fn dims(self, [n, c, h, w]: [usize; 4]) -> [usize; 4] {
        match self {
            Layout::Nchw => [n, c, h, w],
            Layout::Nhwc => [n, h, w, c],
        }
    }

    /// A tensor's (N, C, H, W) dims from its dims in this layout.
    pub fn nchw(self, d: [usize; 4]) -> [usize; 4] {
        match self {
            Layout::Nchw => d,
            Layout::Nhwc => [d[0], d[3], d[1], d[2]],
        }
    }
}

/// A fully validated conv2d problem. Every field is a plain count; construction checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvShape {
    pub n: u32,
    pub c: u32,
    pub h: u32,
    pub w: u32,
    pub k: u32,
    pub r: u32,
    pub s: u32,
    pub stride: (u32, u32),
    /// Padding at the top and left; bottom/right padding is implied by `oh`, `ow`.
    pub pad: (u32, u32),
    /// Padding at the bottom and right.
    pub pad_end: (u32, u32),
    pub dilation: (u32, u32),
    pub groups: u32,
    pub bias: bool,
    /// What the store step does with each sum (bias, scaling, residual, activation).
    /// Absent from cache keys written before epilogues existed: those were plain.
    #[serde(default, skip_serializing_if = "Epilogue::is_plain")]
    pub epilogue: Epilogue,
    /// x's and y's memory layout; cache keys always had a "layout" entry ("NCHW").
    #[serde(default)]
    pub layout: Layout,
    /// The element type of x, w, z and y; cache keys always had a "dtype" entry ("f32").
    #[serde(default)]
    pub dtype: DType,
    /// `Some(output_padding)` for a transposed convolution (PyTorch's `conv_transpose2d`):
    /// x is (N, C, H, W), w is (C, K/groups, R, S) and each output gathers the inputs whose
    /// strided windows reach it. `pad` and `pad_end` are then the padding taken off each
    /// side of the full output, and the output padding adds rows and columns at the bottom
    /// and right. Absent from the cache keys of plain convolutions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transposed: Option<(u32, u32)>,
    /// What the padding holds; absent from the cache keys of zero-padded problems, so caches
    /// written before padding modes stay valid.
    #[serde(default, skip_serializing_if = "PaddingMode::is_zeros")]
    pub padding_mode: PaddingMode,
    /// `Some(r)` (r >= 2) for depth-to-space fused into the store (PyTorch's
    /// `pixel_shuffle(y, r)` of the conv's output): conv output channel c*r*r + i*r + j at
    /// pixel (oh, ow) lands at channel c, pixel (oh*r + i, ow*r + j), after the epilogue.
    /// y (and z) are then (N, K/r^2, OH*r, OW*r) in the problem's layout. Absent from the
    /// cache keys of problems without it, so caches written before it stay valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pixel_shuffle: Option<u32>,
    /// `Some` only on the plain convolution a transposed one is lowered to (see
    /// [`lowered`](Self::lowered)): where each of its outputs lands in the transposed
    /// problem's y. Never part of a cache key: the transposed problem is the key.
    #[serde(skip)]
    pub scatter: Option<Scatter>,
}

/// Where the outputs of a lowered form land (a transposed convolution's, or a pixel
/// shuffle's). The lowered conv has P = `phases.0 * phases.1` times the output channels.
/// Within each group its channel n is the pair (phase ph, channel c): `ph * KG + c`
/// (`phase_major`, channels-last: a phase's channels side by side, so stores keep whole
/// quads) or `c * P + ph` (channels-first: a channel's phases side by side, so a row's
/// neighbouring columns come from neighbouring channels; PyTorch's pixel_shuffle order).
/// At pixel (oh, ow) it is the output's channel `g * KG + c` at (oh * st_h + ph / st_w -
/// off.0, ow * st_w + ph % st_w - off.1), dropped when that falls outside `out`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scatter {
    /// The transposed convolution's stride: one output phase per (row, column) residue.
    pub phases: (u32, u32),
    /// How far the lowered grid starts before the output's first row and column.
    pub off: (u32, u32),
    /// The transposed convolution's output height and width.
    pub out: (u32, u32),
    /// Its output channels per group.
    pub kg: u32,
    /// A pixel shuffle's form: each lowered channel has its own bias entry (the conv
    /// channel it came from), where a transposed convolution's phases share theirs.
    pub shuffle: bool,
    /// The lowered channels' order within a group (see above).
    pub phase_major: bool,
    /// A pixel shuffle after a transposed convolution (1: none): `phases` and `off` then
    /// count the shuffled grid's rows and columns (stride times r), and the transposed
    /// output channel of (phase (ph_h, ph_w), c) is `c * r * r + (ph_h % r) * r + ph_w % r`.
    pub inner: u32,
    /// The transposed convolution's kernel (R, S): where it is not a multiple of the stride,
    /// some phases' lowered taps are zero (`kernels::phases::live_taps`). A pixel shuffle's
    /// form: the conv's own kernel. A transposed convolution dilated at a stride past 1 has
    /// its kernel spread out: d * (R - 1) + 1 taps, every d-th a weight (`holes`).
    pub kernel: (u32, u32),
    /// The spacing of the weights within `kernel`: the transposed convolution's dilation
    /// where its stride is past 1 (the taps between are zeros), else 1.
    pub holes: (u32, u32),
}

impl Scatter {
    /// Whether some lowered outputs fall outside y (a transposed convolution's edges).
    pub fn crops(&self) -> bool {
        !self.shuffle
    }

    /// Whether the kernel's weights are w rearranged by a weight pass (all but a pixel
    /// shuffle in PyTorch's channel order).
    pub fn rearranges_w(&self) -> bool {
        !self.shuffle || self.phase_major
    }
}

/// Strides, paddings and dilations beyond this are rejected: kernels do their index
/// arithmetic in 32 bits, and no real convolution comes near it.
pub const MAX_PARAM: i64 = 65535;

fn pair_at_least(name: &str, v: (i64, i64), min: i64) -> Result<(u32, u32)> {
    if v.0 < min || v.1 < min {
        return Err(Error::invalid(format!(
            "{name} must be >= {min} in both dimensions, got ({}, {})",
            v.0, v.1
        )));
    }
    if v.0 > MAX_PARAM || v.1 > MAX_PARAM {
        return Err(Error::invalid(format!(
            "{name} must be <= {MAX_PARAM} in both dimensions, got ({}, {})",
            v.0, v.1
        )));
    }
    let cap = |x: i64| {
        u32::try_from(x).map_err(|_| Error::invalid(format!("{name} value {x} is too large")))
    };
    Ok((cap(v.0)?, cap(v.1)?))
}

/// `groups` as a count: at least 1 and within u32.
fn group_count(groups: i64) -> Result<u32> {
    if groups < 1 {
        return Err(Error::invalid(format!("groups must be >= 1, got {groups}")));
    }
    u32::try_from(groups).map_err(|_| Error::invalid("groups is too large"))
}

/// The input channels split evenly into the groups.
fn channels_divide(c: u32, groups: u32) -> Result<()> {
    if c % groups != 0 {
        return Err(Error::invalid(format!("input channels C={c} are not divisible by groups={groups}")));
    }
    Ok(())
}

fn dim(name: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::invalid(format!("{name} = {v} is too large")))
}

impl ConvShape {
    /// Validates shapes and parameters the way PyTorch does and resolves the padding.
    pub fn new(
        x: [usize; 4],
        w: [usize; 4],
        stride: (i64, i64),
        padding: Padding,
        dilation: (i64, i64),
        groups: i64,
        bias_len: Option<usize>,
    ) -> Result<Self> {
        let stride = pair_at_least("stride", stride, 1)?;
        let dilation = pair_at_least("dilation", dilation, 1)?;
        let groups = group_count(groups)?;
        let [n, c, h, wd] = x;
        let [k, cg, r, s] = w;
        let (n, c, h, wd) = (dim("N", n)?, dim("C", c)?, dim("H", h)?, dim("W", wd)?);
        let (k, cg, r, s) = (dim("K", k)?, dim("C/groups", cg)?, dim("R", r)?, dim("S", s)?);
        channels_divide(c, groups)?;
        if k % groups != 0 {
            return Err(Error::invalid(format!(
                "output channels K={k} (w.shape[0]) are not divisible by groups={groups}"
            )));
        }
        if cg != c / groups {
            return Err(Error::invalid(format!(
                "w.shape[1] must be C/groups = {}/{} = {}, got {cg} (x has {c} channels)",
                c,
                groups,
                c / groups
            )));
        }
        if r == 0 || s == 0 {
            return Err(Error::invalid(format!("kernel size must be >= 1, got {r}x{s}")));
        }
        if let Some(len) = bias_len {
            if len != k as usize {
                return Err(Error::invalid(format!(
                    "bias must have K={k} elements (one per output channel), got {len}"
                )));
            }
        }
        let eff_r = dilation.0 as u64 * (r as u64 - 1) + 1;
        let eff_s = dilation.1 as u64 * (s as u64 - 1) + 1;
        let (pad, pad_end) = match padding {
            Padding::Explicit(ph, pw) => {
                if ph < 0 || pw < 0 {
                    return Err(Error::invalid(format!(
                        "padding must be >= 0, got ({ph}, {pw})"
                    )));
                }
                let p = pair_at_least("padding", (ph, pw), 0)?;
                (p, p)
            }
            Padding::Valid => ((0, 0), (0, 0)),
            Padding::Same => {
                if stride != (1, 1) {
                    return Err(Error::invalid(format!(
                        "padding='same' needs stride 1, got stride {stride:?}"
                    )));
                }
                let th = (eff_r - 1) as u32;
                let tw = (eff_s - 1) as u32;
                ((th / 2, tw / 2), (th - th / 2, tw - tw / 2))
            }
        };
        let shape = ConvShape {
            n, c, h, w: wd, k, r, s, stride, pad, pad_end, dilation, groups,
            bias: bias_len.is_some(),
            epilogue: Epilogue::default(),
            layout: Layout::Nchw,
            dtype: DType::F32,
            transposed: None,
            padding_mode: PaddingMode::Zeros,
            pixel_shuffle: None,
            scatter: None,
        };
        let padded_h = h as u64 + pad.0 as u64 + pad_end.0 as u64;
        let padded_w = wd as u64 + pad.1 as u64 + pad_end.1 as u64;
        if padded_h > i32::MAX as u64 || padded_w > i32::MAX as u64 {
            return Err(Error::invalid(format!(
                "padded input {padded_h}x{padded_w} is too large (at most {} per dimension)",
                i32::MAX
            )));
        }
        if padded_h < eff_r || padded_w < eff_s {
            return Err(Error::invalid(format!(
                "kernel {r}x{s} (dilated to {eff_r}x{eff_s}) is larger than the padded input \
                 {padded_h}x{padded_w}: the output would be empty"
            )));
        }
        if n == 0 || c == 0 || h == 0 || wd == 0 || k == 0 {
            return Err(Error::invalid(format!(
                "empty tensor: x shape ({n}, {c}, {h}, {wd}), w shape ({k}, {cg}, {r}, {s}); \
                 every dimension must be >= 1"
            )));
        }
        shape.check_lens()?;
        Ok(shape)
    }

    /// Validates a transposed convolution the way PyTorch's `conv_transpose2d` does: x is
    /// (N, C, H, W), w is (C, K/groups, R, S), and the output is
    /// (H - 1) * stride - 2 * padding + dilation * (R - 1) + output_padding + 1 high (the
    /// same across). `output_padding` must be smaller than the stride or the dilation.
    #[allow(clippy::too_many_arguments)]
    pub fn new_transposed(
        x: [usize; 4],
        w: [usize; 4],
        stride: (i64, i64),
        padding: (i64, i64),
        output_padding: (i64, i64),
        dilation: (i64, i64),
        groups: i64,
        bias_len: Option<usize>,
    ) -> Result<Self> {
        let stride = pair_at_least("stride", stride, 1)?;
        let dilation = pair_at_least("dilation", dilation, 1)?;
        let pad = pair_at_least("padding", padding, 0)?;
        let op = pair_at_least("output_padding", output_padding, 0)?;
        for (axis, o, st, d) in [("height", op.0, stride.0, dilation.0), ("width", op.1, stride.1, dilation.1)] {
            if o >= st && o >= d {
                return Err(Error::invalid(format!(
                    "output_padding must be smaller than the stride or the dilation; got \
                     output_padding {o} with stride {st} and dilation {d} along the {axis}"
                )));
            }
        }
        let groups = group_count(groups)?;
        let [n, c, h, wd] = x;
        let [wc, kg, r, s] = w;
        let (n, c, h, wd) = (dim("N", n)?, dim("C", c)?, dim("H", h)?, dim("W", wd)?);
        let (wc, kg, r, s) = (dim("w.shape[0]", wc)?, dim("K/groups", kg)?, dim("R", r)?, dim("S", s)?);
        if wc != c {
            return Err(Error::invalid(format!(
                "w.shape[0] must be x's channel count C = {c} (w is (C, K/groups, R, S) for a \
                 transposed convolution), got {wc}"
            )));
        }
        channels_divide(c, groups)?;
        let k = kg
            .checked_mul(groups)
            .ok_or_else(|| Error::invalid(format!("K = w.shape[1] * groups = {kg} * {groups} is too large")))?;
        if n == 0 || c == 0 || h == 0 || wd == 0 || kg == 0 || r == 0 || s == 0 {
            return Err(Error::invalid(format!(
                "empty tensor: x shape ({n}, {c}, {h}, {wd}), w shape ({wc}, {kg}, {r}, {s}); \
                 every dimension must be >= 1"
            )));
        }
        if let Some(len) = bias_len {
            if len != k as usize {
                return Err(Error::invalid(format!(
                    "bias must have K={k} elements (w.shape[1] * groups, one per output channel), got {len}"
                )));
            }
        }
        let out = |i: u32, st: u32, p: u32, d: u32, kk: u32, o: u32| {
            (i as i64 - 1) * st as i64 - 2 * p as i64 + d as i64 * (kk as i64 - 1) + o as i64 + 1
        };
        let (oh, ow) = (
            out(h, stride.0, pad.0, dilation.0, r, op.0),
            out(wd, stride.1, pad.1, dilation.1, s, op.1),
        );
        if oh < 1 || ow < 1 {
            return Err(Error::invalid(format!(
                "padding ({}, {}) leaves an empty output: the transposed convolution's output \
                 would be {oh}x{ow}",
                pad.0, pad.1
            )));
        }
        if oh > i32::MAX as i64 || ow > i32::MAX as i64 {
            return Err(Error::invalid(format!("output {oh}x{ow} is too large (at most {} per dimension)", i32::MAX)));
        }
        let shape = ConvShape {
            n, c, h, w: wd, k, r, s, stride, pad, pad_end: pad, dilation, groups,
            bias: bias_len.is_some(),
            epilogue: Epilogue::default(),
            layout: Layout::Nchw,
            dtype: DType::F32,
            transposed: Some(op),
            padding_mode: PaddingMode::Zeros,
            pixel_shuffle: None,
            scatter: None,
        };
        shape.check_lens()?;
        Ok(shape)
    }

    /// The same problem with its output depth-to-space shuffled by `r` (1: none). K must be
    /// divisible by r^2; a transposed problem takes it where it has a lowered form, the
    /// shuffle then folded into that form's scatter.
    pub fn with_pixel_shuffle(self, r: i64) -> Result<Self> {
        if r < 1 {
            return Err(Error::invalid(format!("pixel_shuffle must be >= 1, got {r}")));
        }
        if r == 1 {
            return Ok(ConvShape { pixel_shuffle: None, ..self });
        }
        let r2 = r.checked_mul(r).filter(|&r2| r2 <= self.k as i64);
        if r2.is_none_or(|r2| self.k as i64 % r2 != 0) {
            return Err(Error::invalid(format!(
                "pixel_shuffle={r} needs output channels K divisible by {r}^2, got K={}",
                self.k
            )));
        }
        let shape = ConvShape { pixel_shuffle: Some(r as u32), ..self };
        // Output rows and columns grow by r: they must still index in 32 bits.
        if shape.oh() as u64 * r as u64 > i32::MAX as u64 || shape.ow() as u64 * r as u64 > i32::MAX as u64 {
            return Err(Error::invalid(format!("pixel_shuffle={r} makes the output too large")));
        }
        if shape.is_transposed() && shape.lowered().is_none() {
            return Err(Error::invalid(format!(
                "pixel_shuffle={r} on a transposed convolution needs padding within the kernel's \
                 reach (it runs in the convolution's lowered form); got padding {:?} with kernel \
                 {}x{}, dilation {:?}",
                self.pad, self.r, self.s, self.dilation
            )));
        }
        Ok(shape)
    }

    /// Whether y's elements move on the way out (`ystore`): a pixel shuffle or a lowered
    /// transposed convolution's scatter.
    pub fn moves_y(&self) -> bool {
        self.pixel_shuffle.is_some() || self.scatter.is_some()
    }

    /// The depth-to-space factor of the output (1 when there is none).
    pub fn shuffle(&self) -> u32 {
        self.pixel_shuffle.unwrap_or(1)
    }

    /// Where the conv's output element at `yi` is stored: `yi` indexes the unshuffled output
    /// through [`y_strides`](Self::y_strides); the result indexes y as stored (identity
    /// without a pixel shuffle). Image blocks keep their place: only the offset within an
    /// image moves. The kernels do the same through `ystore` (`store_index_wgsl`).
    pub fn y_store_index(&self, yi: u64) -> u64 {
        let r = self.shuffle() as u64;
        if r == 1 {
            return yi;
        }
        let (k, oh, ow) = (self.k as u64, self.oh() as u64, self.ow() as u64);
        let img = k * oh * ow;
        let (n, off) = (yi / img, yi % img);
        let (ch, p) = match self.layout {
            Layout::Nchw => (off / (oh * ow), off % (oh * ow)),
            Layout::Nhwc => (off % k, off / k),
        };
        let (c, i, j) = (ch / (r * r), ch / r % r, ch % r);
        let (row, col) = ((p / ow) * r + i, (p % ow) * r + j);
        let (kc, w2) = (k / (r * r), ow * r);
        n * img
            + match self.layout {
                Layout::Nchw => (c * oh * r + row) * w2 + col,
                Layout::Nhwc => (row * w2 + col) * kc + c,
            }
    }

    /// The plain convolution that computes this transposed one by stride phases, or `None`
    /// where there is none (not transposed, or padding so large that the lowered conv would
    /// need negative padding). Output row oy = Y * st + i - p
    /// (0 <= i < st) sums x[Y - a'] * w[i + a' * st] over a' < ceil(R / st): per phase, a
    /// stride-1 conv of x with the taps i, i + st, ... flipped. Stacking the st_h * st_w
    /// phases as output channels makes one conv of stride 1 with a ceil(R/st) x ceil(S/st)
    /// kernel (taps past R or S are zero), whose store scatters each phase to its rows and
    /// columns ([`Scatter`]). At stride 1 a dilation d stays one: the flipped taps d apart,
    /// the padding d * (R - 1) - p. Past stride 1 a dilated kernel is lowered as the kernel
    /// spread out, d * (R - 1) + 1 taps with zeros between its weights (`Scatter::holes`):
    /// phases the weights never reach have only zero taps, which the tensor-core tiles skip.
    /// Every family computes the lowered form; its weights are w rearranged (`kernels::phases`).
    pub fn lowered(&self) -> Option<ConvShape> {
        self.transposed?;
        let strided = self.stride != (1, 1);
        let spread = |d: u32, taps: u32| if strided { d * (taps - 1) + 1 } else { taps };
        let (kr, ks) = (spread(self.dilation.0, self.r), spread(self.dilation.1, self.s));
        let (holes, dilation) = if strided { (self.dilation, (1, 1)) } else { ((1, 1), self.dilation) };
        // Per axis: kernel taps, padding before and after, the grid's offset, given the
        // input extent, stride, padding taken off, output extent and dilation (1 where the
        // stride is past 1).
        let axis = |len: u32, st: u32, p: u32, taps: u32, out: u32, d: u32| -> Option<(u32, u32, u32, u32)> {
            let a = taps.div_ceil(st);
            let first = p / st;
            let pad = (d * (a - 1)).checked_sub(first)?;
            let rows = (out - 1 + p) / st - first + 1;
            let pad_end = (rows + d * (a - 1)).saturating_sub(pad + len);
            Some((a, pad, pad_end, p - first * st))
        };
        let (oh, ow) = (self.oh(), self.ow());
        let (r, ph, ph_end, off_h) = axis(self.h, self.stride.0, self.pad.0, kr, oh, dilation.0)?;
        let (s, pw, pw_end, off_w) = axis(self.w, self.stride.1, self.pad.1, ks, ow, dilation.1)?;
        let phases = self.stride.0 * self.stride.1;
        // A pixel shuffle after it refines each phase into r * r finer ones: the scatter then
        // works on the shuffled output's grid.
        let q = self.shuffle();
        let lowered = ConvShape {
            k: self.k.checked_mul(phases)?,
            r,
            s,
            stride: (1, 1),
            dilation,
            pad: (ph, pw),
            pad_end: (ph_end, pw_end),
            transposed: None,
            pixel_shuffle: None,
            scatter: Some(Scatter {
                phases: (self.stride.0 * q, self.stride.1 * q),
                off: (off_h * q, off_w * q),
                out: (oh * q, ow * q),
                kg: self.kg() / (q * q),
                shuffle: false,
                // Channels-first keeps an NCHW row's neighbouring columns in neighbouring
                // channels (stores coalesce), but where the kernel is not a multiple of the
                // stride, phase-major lets the tensor-core tiles skip the taps a phase never
                // reaches (on an H200, "high" on a 3x3 stride-2 decoder: channels-last
                // skipping 0.061 ms, channels-first NCHW 0.105).
                phase_major: self.layout == Layout::Nhwc || (q == 1 && (self.r % self.stride.0 != 0 || self.s % self.stride.1 != 0)),
                inner: q,
                kernel: (kr, ks),
                holes,
            }),
            ..*self
        };
        lowered.check_lens().ok()?;
        Some(lowered)
    }

    /// A pixel-shuffled problem as a scatter ([`Scatter`]): in NHWC the same convolution
    /// with its output channels reordered from PyTorch's (c, i, j) to (i, j, c) within each
    /// group (its weight pass permutes w's rows, `kernels::phases`), so that a phase's
    /// channels land side by side and stores keep whole quads together; in NCHW in
    /// PyTorch's order (w as it is). `None` where a group's channels are not whole sets of
    /// r^2 phases, or without a shuffle.
    pub fn shuffle_lowered(&self) -> Option<ConvShape> {
        let r = self.pixel_shuffle?;
        if self.kg() % (r * r) != 0 {
            return None;
        }
        Some(ConvShape {
            pixel_shuffle: None,
            scatter: Some(Scatter {
                phases: (r, r),
                off: (0, 0),
                out: (self.oh() * r, self.ow() * r),
                kg: self.kg() / (r * r),
                shuffle: true,
                phase_major: self.layout == Layout::Nhwc,
                inner: 1,
                kernel: (self.r, self.s),
                holes: (1, 1),
            }),
            ..*self
        })
    }

    /// Whether the problem is a transposed convolution.
    pub fn is_transposed(&self) -> bool {
        self.transposed.is_some()
    }

    /// Kernels index in 32 bits: every tensor's element count must fit.
    fn check_lens(&self) -> Result<()> {
        let shape = self;
        for (what, count) in [
            ("x", shape.x_len()),
            ("w", shape.w_len()),
            ("output", shape.y_len()),
        ] {
            if count > i32::MAX as u64 {
                return Err(Error::invalid(format!(
                    "{what} has {count} elements ({} as float32); at most {} ({}) are supported",
                    human(count.saturating_mul(4)),
                    i32::MAX,
                    human(i32::MAX as u64 * 4)
                )));
            }
        }
        Ok(())
    }

    pub fn oh(&self) -> u32 {
        let eff = self.dilation.0 * (self.r - 1) + 1;
        match self.transposed {
            Some((op, _)) => (self.h - 1) * self.stride.0 + eff + op - self.pad.0 - self.pad_end.0,
            None => (self.h + self.pad.0 + self.pad_end.0 - eff) / self.stride.0 + 1,
        }
    }

    pub fn ow(&self) -> u32 {
        let eff = self.dilation.1 * (self.s - 1) + 1;
        match self.transposed {
            Some((_, op)) => (self.w - 1) * self.stride.1 + eff + op - self.pad.1 - self.pad_end.1,
            None => (self.w + self.pad.1 + self.pad_end.1 - eff) / self.stride.1 + 1,
        }
    }

    pub fn cg(&self) -> u32 {
        self.c / self.groups
    }

    pub fn kg(&self) -> u32 {
        self.k / self.groups
    }

    pub fn x_len(&self) -> u64 {
        self.n as u64 * self.c as u64 * self.h as u64 * self.w as u64
    }

    pub fn w_len(&self) -> u64 {
        self.k as u64 * self.cg() as u64 * self.r as u64 * self.s as u64
    }

    pub fn y_len(&self) -> u64 {
        self.n as u64 * self.k as u64 * self.oh() as u64 * self.ow() as u64
    }

    /// y's dims in the problem's layout, after any pixel shuffle.
    pub fn y_dims(&self) -> [usize; 4] {
        let r = self.shuffle() as usize;
        self.layout.dims([self.n as usize, self.k as usize / (r * r), self.oh() as usize * r, self.ow() as usize * r])
    }

    /// The same problem with x and y in `layout`.
    pub fn with_layout(self, layout: Layout) -> Self {
        ConvShape { layout, ..self }
    }

    /// Element strides (image, channel, row, column) of x, and (image, channel, pixel) of y,
    /// where a pixel is oh * OW + ow (of the conv's output before any pixel shuffle, which
    /// `y_store_index` then applies): the direct and implicit-GEMM kernels index through
    /// these, so they read and write either layout natively (the tensor-core kernels are
    /// NCHW only and refuse NHWC problems).
    pub fn x_strides(&self) -> [u64; 4] {
        let (c, h, w) = (self.c as u64, self.h as u64, self.w as u64);
        match self.layout {
            Layout::Nchw => [c * h * w, h * w, w, 1],
            Layout::Nhwc => [h * w * c, 1, w * c, c],
        }
    }

    pub fn y_strides(&self) -> [u64; 3] {
        let (k, p) = (self.k as u64, self.oh() as u64 * self.ow() as u64);
        match self.layout {
            Layout::Nchw => [k * p, p, 1],
            Layout::Nhwc => [p * k, 1, k],
        }
    }

    /// Multiply-adds counted as two FLOPs, the usual convention for GFLOP/s figures. A
    /// transposed convolution does one per input element, output channel of its group and tap.
    pub fn flops(&self) -> f64 {
        let taps = self.r as f64 * self.s as f64;
        if self.is_transposed() {
            return 2.0 * self.x_len() as f64 * self.kg() as f64 * taps;
        }
        2.0 * self.y_len() as f64 * self.cg() as f64 * taps
    }

    /// A short human-readable key, e.g. `1x3x225x225 k32 3x3 s1 p0`.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{}x{}x{}x{} k{} {}x{}",
            self.n, self.c, self.h, self.w, self.k, self.r, self.s
        );
        let pair = |(a, b): (u32, u32)| if a == b { a.to_string() } else { format!("{a},{b}") };
        s += &format!(" s{}", pair(self.stride));
        if self.pad == self.pad_end {
            s += &format!(" p{}", pair(self.pad));
        } else {
            s += &format!(" p{}/{}", pair(self.pad), pair(self.pad_end));
        }
        if self.dilation != (1, 1) {
            s += &format!(" d{}", pair(self.dilation));
        }
        if !self.padding_mode.is_zeros() {
            s += &format!(" {}", self.padding_mode.name());
        }
        if let Some(op) = self.transposed {
            s += " T";
            if op != (0, 0) {
                s += &format!(" op{}", pair(op));
            }
        }
        if self.groups != 1 {
            s += &format!(" g{}", self.groups);
        }
        if let Some(r) = self.pixel_shuffle {
            s += &format!(" ps{r}");
        }
        // Scatter forms are never keys; their labels head the WGSL they generate.
        match self.scatter {
            Some(sc) if sc.shuffle => s += &format!(" ps{} (phase-major)", sc.phases.0),
            Some(sc) => s += &format!(" (lowered from a stride {} transposed convolution)", pair(sc.phases)),
            None => {}
        }
        if self.bias {
            s += " +b";
        }
        if self.layout == Layout::Nhwc {
            s += " nhwc";
        }
        if self.dtype == DType::F16 {
            s += " f16";
        }
        s + &self.epilogue.label()
    }

    /// The same problem on data of type `dtype`.
    pub fn with_dtype(self, dtype: DType) -> Self {
        ConvShape { dtype, ..self }
    }

    /// The same problem with `epilogue` in its store step.
    pub fn with_epilogue(self, epilogue: Epilogue) -> Self {
        ConvShape { epilogue, ..self }
    }

    /// The same problem with its padding filled as `mode` says, refused as PyTorch refuses
    /// it: a transposed convolution pads with zeros only, reflection needs each side's
    /// padding below x's size along it, wrapping at most x's size.
    pub fn with_padding_mode(self, mode: PaddingMode) -> Result<Self> {
        if mode.is_zeros() {
            return Ok(ConvShape { padding_mode: mode, ..self });
        }
        if self.is_transposed() {
            return Err(Error::invalid(format!(
                "padding_mode '{}': only 'zeros' padding mode is supported for a transposed convolution",
                mode.name()
            )));
        }
        let sides = [("height", self.h, self.pad.0, self.pad_end.0), ("width", self.w, self.pad.1, self.pad_end.1)];
        for (what, size, before, after) in sides {
            let pad = before.max(after);
            match mode {
                PaddingMode::Reflect if pad >= size => {
                    return Err(Error::invalid(format!(
                        "padding_mode 'reflect': padding size should be less than the corresponding input dimension, \
                         but got padding {pad} for an input {what} of {size}"
                    )))
                }
                PaddingMode::Circular if pad > size => {
                    return Err(Error::invalid(format!(
                        "padding_mode 'circular': padding value causes wrapping around more than once \
                         (padding {pad} for an input {what} of {size})"
                    )))
                }
                _ => {}
            }
        }
        Ok(ConvShape { padding_mode: mode, ..self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(x: [usize; 4], w: [usize; 4], p: Padding) -> Result<ConvShape> {
        ConvShape::new(x, w, (1, 1), p, (1, 1), 1, None)
    }

    #[test]
    fn output_size_matches_pytorch_formula() {
        let s = ConvShape::new([2, 3, 10, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 0), (1, 2), 1, None)
            .unwrap();
        // floor((10 + 2 - 3) / 2) + 1 = 5 ; floor((7 - 3) / 1) + 1 = 5
        assert_eq!((s.oh(), s.ow()), (5, 5));
    }

    #[test]
    fn same_padding_is_asymmetric_for_even_kernels() {
        let s = shape([1, 1, 8, 8], [1, 1, 4, 4], Padding::Same).unwrap();
        assert_eq!((s.pad, s.pad_end), ((1, 1), (2, 2)));
        assert_eq!((s.oh(), s.ow()), (8, 8));
    }

    /// The stored index is PyTorch's pixel_shuffle written out, in both layouts, and a
    /// permutation of the output.
    #[test]
    fn store_index_is_pixel_shuffle() {
        let base = ConvShape::new([2, 3, 4, 5], [18, 3, 1, 1], (1, 1), Padding::Valid, (1, 1), 1, None).unwrap();
        let s = base.with_pixel_shuffle(3).unwrap();
        let (kc, h2, w2) = (2u64, 12u64, 15u64);
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let s = s.with_layout(layout);
            let ys = s.y_strides();
            let mut seen = vec![false; s.y_len() as usize];
            for n in 0..2u64 {
                for k in 0..18u64 {
                    for p in 0..20u64 {
                        let at = s.y_store_index(n * ys[0] + k * ys[1] + p * ys[2]);
                        let (c, row, col) = (k / 9, p / 5 * 3 + k / 3 % 3, p % 5 * 3 + k % 3);
                        let want = match layout {
                            Layout::Nchw => ((n * kc + c) * h2 + row) * w2 + col,
                            Layout::Nhwc => ((n * h2 + row) * w2 + col) * kc + c,
                        };
                        assert_eq!(at, want);
                        seen[at as usize] = true;
                    }
                }
            }
            assert!(seen.iter().all(|&b| b));
        }
        assert_eq!(base.y_store_index(17), 17);
    }

    /// A plain problem's key has no pixel_shuffle entry (caches written before it stay
    /// valid); a shuffled one's keeps it.
    #[test]
    fn pixel_shuffle_is_left_out_of_plain_keys() {
        let s = ConvShape::new([1, 3, 4, 5], [8, 3, 1, 1], (1, 1), Padding::Valid, (1, 1), 1, None).unwrap();
        let plain = serde_json::to_string(&s).unwrap();
        assert!(!plain.contains("pixel_shuffle"), "{plain}");
        assert_eq!(serde_json::from_str::<ConvShape>(&plain).unwrap(), s);
        let shuffled = s.with_pixel_shuffle(2).unwrap();
        let key = serde_json::to_string(&shuffled).unwrap();
        assert!(key.contains("\"pixel_shuffle\":2"), "{key}");
        assert_eq!(serde_json::from_str::<ConvShape>(&key).unwrap(), shuffled);
        assert_eq!(shuffled.with_pixel_shuffle(1).unwrap(), s);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(shape([1, 4, 8, 8], [2, 3, 3, 3], Padding::Valid).is_err());
        assert!(shape([1, 1, 2, 2], [1, 1, 3, 3], Padding::Valid).is_err());
        assert!(ConvShape::new([1, 4, 8, 8], [2, 2, 3, 3], (1, 1), Padding::Valid, (1, 1), 3, None).is_err());
        assert!(ConvShape::new([1, 1, 8, 8], [2, 1, 3, 3], (0, 1), Padding::Valid, (1, 1), 1, None).is_err());
        assert!(ConvShape::new([1, 1, 8, 8], [2, 1, 3, 3], (1, 1), Padding::Explicit(-1, 0), (1, 1), 1, None).is_err());
        assert!(ConvShape::new([1, 1, 8, 8], [2, 1, 3, 3], (1, 1), Padding::Valid, (1, 1), 1, Some(3)).is_err());
        assert!(ConvShape::new([1, 1, 8, 8], [2, 1, 3, 3], (2, 1), Padding::Same, (1, 1), 1, None).is_err());
    }
}
