//! The public description of one convolution: [`Conv2d`], made with [`Conv2dBuilder`].

use crate::dtype::DType;
use crate::epilogue::{Activation, Epilogue};
use crate::error::Result;
use crate::params::{ConvShape, Layout, Padding, PaddingMode};
use crate::precision::Precision;

/// A pair of per-axis values (height, width): strides and dilations. Converts from one
/// integer (both axes) or an `(h, w)` pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hw(pub i64, pub i64);

macro_rules! hw_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Hw {
            fn from(v: $t) -> Hw {
                Hw(v as i64, v as i64)
            }
        }
        impl From<($t, $t)> for Hw {
            fn from((h, w): ($t, $t)) -> Hw {
                Hw(h as i64, w as i64)
            }
        }
        impl From<$t> for Padding {
            fn from(v: $t) -> Padding {
                Padding::Explicit(v as i64, v as i64)
            }
        }
        impl From<($t, $t)> for Padding {
            fn from((h, w): ($t, $t)) -> Padding {
                Padding::Explicit(h as i64, w as i64)
            }
        }
    )*};
}

hw_from!(i32, i64, u32, usize);

/// A validated conv2d problem: shapes, parameters, layout, element type, precision mode and
/// fused epilogue. Made with [`Conv2d::builder`]; the semantics are PyTorch's
/// `torch.nn.functional.conv2d` (cross-correlation; `w` is (K, C/groups, R, S)).
///
/// Each distinct problem is tuned and cached on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2d {
    pub(crate) shape: ConvShape,
    pub(crate) precision: Precision,
}

/// Builds a [`Conv2d`]; every setter has PyTorch's default, and [`build`](Self::build)
/// checks the whole description at once.
#[derive(Clone, Debug)]
#[must_use]
pub struct Conv2dBuilder {
    x: [usize; 4],
    w: [usize; 4],
    stride: Hw,
    padding: Padding,
    dilation: Hw,
    groups: i64,
    bias: Bias,
    layout: Layout,
    dtype: DType,
    precision: Option<Precision>,
    alpha1: f32,
    alpha2: f32,
    residual: bool,
    activation: Activation,
    output_padding: Option<Hw>,
    pixel_shuffle: i64,
    padding_mode: PaddingMode,
}

impl Conv2d {
    /// Starts a description: `x` are x's dims as laid out in memory ((N, C, H, W), or
    /// (N, H, W, C) once [`layout`](Conv2dBuilder::layout) says NHWC), `w` are the weights'
    /// dims (K, C/groups, R, S) in either layout.
    pub fn builder(x: [usize; 4], w: [usize; 4]) -> Conv2dBuilder {
        Conv2dBuilder {
            x,
            w,
            stride: Hw(1, 1),
            padding: Padding::Explicit(0, 0),
            dilation: Hw(1, 1),
            groups: 1,
            bias: Bias::None,
            layout: Layout::Nchw,
            dtype: DType::F32,
            precision: None,
            alpha1: 1.0,
            alpha2: 1.0,
            residual: false,
            activation: Activation::None,
            output_padding: None,
            pixel_shuffle: 1,
            padding_mode: PaddingMode::Zeros,
        }
    }

    pub(crate) fn from_shape(shape: ConvShape, precision: Precision) -> Conv2d {
        Conv2d { shape, precision: precision.for_data(shape.dtype) }
    }

    /// x's dims as laid out in memory.
    pub fn x_dims(&self) -> [usize; 4] {
        let s = &self.shape;
        self.shape.layout.dims([s.n, s.c, s.h, s.w].map(|d| d as usize))
    }

    /// The weights' dims: (K, C/groups, R, S), or (C, K/groups, R, S) for a transposed
    /// convolution.
    pub fn w_dims(&self) -> [usize; 4] {
        let s = &self.shape;
        match s.is_transposed() {
            true => [s.c, s.kg(), s.r, s.s],
            false => [s.k, s.cg(), s.r, s.s],
        }
        .map(|d| d as usize)
    }

    /// Whether it is a transposed convolution (see [`Conv2dBuilder::transposed`]).
    pub fn is_transposed(&self) -> bool {
        self.shape.is_transposed()
    }

    /// The output's dims as laid out in memory: (N, K, OH, OW), or (N, OH, OW, K) for NHWC;
    /// with a pixel shuffle by r, (N, K/r², OH·r, OW·r) (or NHWC). A residual `z` has the same.
    pub fn y_dims(&self) -> [usize; 4] {
        self.shape.y_dims()
    }

    /// Elements of x, w and y.
    pub fn lens(&self) -> [u64; 3] {
        [self.shape.x_len(), self.shape.w_len(), self.shape.y_len()]
    }

    /// Bytes a buffer must hold from its offset for x, w, the bias, z and y, in that
    /// order (float16 tensors round up to whole 4-byte words; the bias is float32, `None`
    /// without one; z is `None` without a residual).
    pub fn buffer_bytes(&self) -> TensorBytes {
        let s = &self.shape;
        let bytes = |elems| s.dtype.buffer_bytes(elems);
        TensorBytes {
            x: bytes(s.x_len()),
            w: bytes(s.w_len()),
            bias: s.bias.then(|| DType::F32.buffer_bytes(s.k.into())),
            z: s.epilogue.residual.then(|| bytes(s.y_len())),
            y: bytes(s.y_len()),
        }
    }

    /// The element type of x, w, z and y.
    pub fn dtype(&self) -> DType {
        self.shape.dtype
    }

    /// The memory layout of x, y and z.
    pub fn layout(&self) -> Layout {
        self.shape.layout
    }

    /// The precision mode calls run in (float16 data always runs as [`Precision::High`]).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether calls pass a bias.
    pub fn has_bias(&self) -> bool {
        self.shape.bias
    }

    /// Whether calls pass a residual `z`.
    pub fn has_residual(&self) -> bool {
        self.shape.epilogue.residual
    }

    /// Multiply-adds times two.
    pub fn flops(&self) -> f64 {
        self.shape.flops()
    }

    /// The WGSL source convtune generates for the variant named `variant` on this problem.
    pub fn wgsl(&self, variant: &str) -> Result<String> {
        Ok(variant.parse::<crate::kernels::Variant>()?.generate(&self.shape)?.source)
    }

    /// The problem as a shape spec, the form reports and the command line use
    /// (`"8x64x56x56 k128 3x3 s1 p1"`).
    pub fn label(&self) -> String {
        self.shape.label()
    }
}

/// Bytes each tensor of a problem takes in a buffer (see [`Conv2d::buffer_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorBytes {
    /// The input.
    pub x: u64,
    /// The weights.
    pub w: u64,
    /// The bias (float32), if the problem has one.
    pub bias: Option<u64>,
    /// The residual, if the problem has one.
    pub z: Option<u64>,
    /// The output.
    pub y: u64,
}

/// The bias as the builder was told of it.
#[derive(Clone, Copy, Debug)]
enum Bias {
    None,
    /// One per output channel, whatever K comes out as.
    PerChannel,
    /// Of this length, checked against K.
    Len(usize),
}

impl Conv2dBuilder {
    /// Stride per axis, each ≥ 1 (default 1).
    pub fn stride(mut self, s: impl Into<Hw>) -> Self {
        self.stride = s.into();
        self
    }

    /// Zero padding: an integer or `(h, w)` pair ≥ 0, or [`Padding::Same`] (stride 1;
    /// an even effective kernel pads one more at the bottom and right) or
    /// [`Padding::Valid`] (default 0).
    pub fn padding(mut self, p: impl Into<Padding>) -> Self {
        self.padding = p.into();
        self
    }

    /// Dilation per axis, each ≥ 1 (default 1).
    pub fn dilation(mut self, d: impl Into<Hw>) -> Self {
        self.dilation = d.into();
        self
    }

    /// Groups, dividing C and K (default 1; `groups == C` is depthwise).
    pub fn groups(mut self, g: i64) -> Self {
        self.groups = g;
        self
    }

    /// Whether calls add a float32 bias of K elements (default no).
    pub fn bias(mut self, on: bool) -> Self {
        self.bias = if on { Bias::PerChannel } else { Bias::None };
        self
    }

    /// A bias of `len` elements, checked against K by [`build`](Self::build) (for callers
    /// that hold the bias itself).
    pub fn bias_len(mut self, len: Option<usize>) -> Self {
        self.bias = len.map_or(Bias::None, Bias::Len);
        self
    }

    /// x's and y's memory layout (default NCHW); the weights are (K, C/groups, R, S) either way.
    pub fn layout(mut self, l: Layout) -> Self {
        self.layout = l;
        self
    }

    /// The element type of x, w, z and y (default float32).
    pub fn dtype(mut self, d: DType) -> Self {
        self.dtype = d;
        self
    }

    /// The precision mode (default: `CONVTUNE_PRECISION` if set, else
    /// [`Precision::Highest`], as in Python).
    pub fn precision(mut self, p: Precision) -> Self {
        self.precision = Some(p);
        self
    }

    /// The epilogue's `alpha1`: `y = act(alpha1 * conv + alpha2 * z + bias)` (default 1).
    pub fn alpha1(mut self, a: f32) -> Self {
        self.alpha1 = a;
        self
    }

    /// Calls add a residual `z` of the output's shape, scaled by `alpha2`.
    pub fn residual(mut self, alpha2: f32) -> Self {
        self.residual = true;
        self.alpha2 = alpha2;
        self
    }

    /// The residual's weight alone (default 1; it means nothing without
    /// [`residual`](Self::residual), but must be finite all the same).
    pub fn alpha2(mut self, a: f32) -> Self {
        self.alpha2 = a;
        self
    }

    /// Makes the problem a transposed convolution, PyTorch's `conv_transpose2d`, with
    /// `output_padding` extra rows and columns at the bottom and right (each smaller than
    /// the stride or the dilation): `w` is then (C, K/groups, R, S), the padding an integer
    /// or pair taken off each side of the full output, and the output
    /// (H - 1) * stride - 2 * padding + dilation * (R - 1) + output_padding + 1 high (the
    /// same across).
    pub fn transposed(mut self, output_padding: impl Into<Hw>) -> Self {
        self.output_padding = Some(output_padding.into());
        self
    }

    /// What the padding holds (default zeros), PyTorch's `Conv2d(padding_mode=...)`: reflect
    /// needs each side's padding below x's size along it, circular at most that size; a
    /// transposed convolution pads with zeros only. Fused into the gather of the families
    /// that take it (the others are not candidates): no padded copy of x.
    pub fn padding_mode(mut self, mode: PaddingMode) -> Self {
        self.padding_mode = mode;
        self
    }

    /// Depth-to-space fused into the store, PyTorch's `pixel_shuffle(y, r)` of the output
    /// (default 1, none): conv output channel c·r² + i·r + j at pixel (oh, ow) is stored at
    /// channel c, pixel (oh·r + i, ow·r + j), after the epilogue (bias per conv channel,
    /// activation per element). K must be divisible by r²; not for transposed problems.
    pub fn pixel_shuffle(mut self, r: i64) -> Self {
        self.pixel_shuffle = r;
        self
    }

    /// The activation applied last (default none).
    pub fn activation(mut self, a: Activation) -> Self {
        self.activation = a;
        self
    }

    /// Checks the description and resolves the padding; errors name the argument.
    pub fn build(self) -> Result<Conv2d> {
        let precision = match self.precision {
            Some(p) => p,
            None => Precision::resolve(None)?,
        };
        // K is w.shape[0] for a plain convolution and w.shape[1] * groups for a transposed one.
        let k = match self.output_padding {
            None => self.w[0],
            Some(_) => self.w[1].saturating_mul(usize::try_from(self.groups).unwrap_or(0)),
        };
        let bias_len = match self.bias {
            Bias::None => None,
            Bias::PerChannel => Some(k),
            Bias::Len(len) => Some(len),
        };
        let (Hw(sh, sw), Hw(dh, dw)) = (self.stride, self.dilation);
        let x = self.layout.nchw(self.x);
        let shape = match self.output_padding {
            None => ConvShape::new(x, self.w, (sh, sw), self.padding, (dh, dw), self.groups, bias_len)?,
            Some(Hw(oph, opw)) => {
                let pad = match self.padding {
                    Padding::Explicit(ph, pw) => (ph, pw),
                    Padding::Valid => (0, 0),
                    Padding::Same => {
                        return Err(crate::error::Error::invalid(
                            "padding='same' is not defined for a transposed convolution; give an int or an (h, w) pair",
                        ))
                    }
                };
                ConvShape::new_transposed(x, self.w, (sh, sw), pad, (oph, opw), (dh, dw), self.groups, bias_len)?
            }
        }
        .with_layout(self.layout)
            .with_dtype(self.dtype)
            .with_pixel_shuffle(self.pixel_shuffle)?
            .with_padding_mode(self.padding_mode)?;
        let epilogue = Epilogue::new(self.alpha1, self.alpha2, self.residual, self.activation)?;
        Ok(Conv2d::from_shape(shape.with_epilogue(epilogue), precision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_resolves_padding_and_names_bad_arguments() {
        let p = Conv2d::builder([2, 8, 10, 12], [4, 8, 3, 3]).padding(Padding::Same).build().unwrap();
        assert_eq!(p.y_dims(), [2, 4, 10, 12]);
        let nhwc = Conv2d::builder([2, 10, 12, 8], [4, 8, 3, 3]).layout(Layout::Nhwc).stride(2).padding(1).build().unwrap();
        assert_eq!(nhwc.y_dims(), [2, 5, 6, 4]);
        assert_eq!(nhwc.x_dims(), [2, 10, 12, 8]);
        let e = Conv2d::builder([1, 6, 8, 8], [4, 3, 3, 3]).groups(4).build().unwrap_err().to_string();
        assert!(e.contains("groups"), "{e}");
        let e = Conv2d::builder([1, 6, 8, 8], [4, 6, 3, 3]).stride((1, 0)).build().unwrap_err().to_string();
        assert!(e.contains("stride"), "{e}");
        let e = Conv2d::builder([1, 6, 8, 8], [4, 6, 3, 3])
            .activation(Activation::Clamp { min: 1.0, max: 0.0 })
            .build()
            .unwrap_err()
            .to_string();
        assert!(e.contains("clamp min"), "{e}");
    }

    #[test]
    fn transposed_problems_follow_pytorch() {
        // (28 - 1) * 2 - 2 + 4 - 1 + 1 = 56: a DCGAN-style 4x4 stride-2 upsampler.
        let p = Conv2d::builder([2, 16, 28, 28], [16, 8, 4, 4]).stride(2).padding(1).transposed(0).build().unwrap();
        assert_eq!(p.y_dims(), [2, 8, 56, 56]);
        assert_eq!(p.w_dims(), [16, 8, 4, 4]);
        let g = Conv2d::builder([1, 6, 5, 7], [6, 2, 3, 3]).stride((3, 2)).groups(3).transposed((2, 1));
        let e = g.clone().bias_len(Some(2)).build().unwrap_err().to_string();
        assert!(e.contains("bias must have K=6"), "{e}");
        let p = g.bias(true).build().unwrap();
        assert!(p.has_bias());
        assert_eq!(p.y_dims(), [1, 6, (5 - 1) * 3 + 3 + 2, (7 - 1) * 2 + 3 + 1]);
        let e = Conv2d::builder([1, 4, 5, 5], [4, 2, 3, 3]).stride(2).transposed(2).build().unwrap_err().to_string();
        assert!(e.contains("output_padding"), "{e}");
        let e = Conv2d::builder([1, 4, 5, 5], [3, 2, 3, 3]).transposed(0).build().unwrap_err().to_string();
        assert!(e.contains("w.shape[0]"), "{e}");
        // Output padding below the dilation is allowed even at stride 1, as in PyTorch.
        assert!(Conv2d::builder([1, 4, 5, 5], [4, 2, 3, 3]).dilation(2).transposed(1).build().is_ok());
    }

    #[test]
    fn pixel_shuffle_moves_channels_into_pixels() {
        let p = Conv2d::builder([2, 8, 10, 12], [36, 8, 3, 3]).padding(1).pixel_shuffle(3).build().unwrap();
        assert_eq!(p.y_dims(), [2, 4, 30, 36]);
        assert!(p.label().ends_with(" ps3"), "{}", p.label());
        let nhwc = Conv2d::builder([2, 10, 12, 8], [16, 8, 3, 3]).layout(Layout::Nhwc).pixel_shuffle(2).build().unwrap();
        assert_eq!(nhwc.y_dims(), [2, 16, 20, 4]);
        let plain = Conv2d::builder([2, 8, 10, 12], [36, 8, 3, 3]).pixel_shuffle(1).build().unwrap();
        assert_eq!(plain.shape.pixel_shuffle, None);
        for (k, r) in [(36, 4), (8, 0), (8, -2), (2, 2)] {
            let e = Conv2d::builder([1, 8, 6, 6], [k, 8, 3, 3]).pixel_shuffle(r).build().unwrap_err().to_string();
            assert!(e.contains("pixel_shuffle"), "{e}");
        }
        // After a transposed convolution: its output shuffled, in its lowered form (dilated
        // too); padding past the kernel's reach leaves none.
        let t = Conv2d::builder([1, 4, 5, 5], [4, 4, 3, 3]).stride(2).transposed(0).pixel_shuffle(2).build().unwrap();
        assert_eq!(t.y_dims(), [1, 1, 22, 22]);
        let d = Conv2d::builder([1, 4, 5, 5], [4, 4, 3, 3]).stride(2).dilation(2).transposed(0).pixel_shuffle(2).build().unwrap();
        assert_eq!(d.y_dims(), [1, 1, 26, 26]);
        let e = Conv2d::builder([1, 4, 5, 5], [4, 4, 3, 3]).stride(2).padding(4).transposed(0).pixel_shuffle(2).build().unwrap_err().to_string();
        assert!(e.contains("pixel_shuffle") && e.contains("padding within the kernel's reach"), "{e}");
    }

    #[test]
    fn float16_problems_run_as_high() {
        let p = Conv2d::builder([1, 4, 6, 6], [4, 4, 1, 1]).dtype(DType::F16).precision(Precision::Highest).build().unwrap();
        assert_eq!(p.precision(), Precision::High);
        assert_eq!(p.buffer_bytes().x, 4 * 36 * 2);
    }
}
