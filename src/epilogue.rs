//! The fused epilogue, cuDNN's ConvolutionBiasActivationForward formula:
//! `y = act(alpha1 * conv(x, w) + alpha2 * z + bias)`, applied in every kernel's store step
//! (no separate elementwise pass, no extra trip through memory for y).
//!
//! It is part of the problem (`ConvShape::epilogue`): kernels are generated with it, the
//! tuner validates candidates with it against the reference variant running the same
//! epilogue, and the tuning cache keys on it.

use crate::dtype::DType;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::hash::{Hash, Hasher};

/// The activation applied last. NaN stays NaN through every one of them, as in PyTorch.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// None: the value as it is.
    #[default]
    None,
    /// max(v, 0).
    Relu,
    /// v for v ≥ 0, else `negative_slope` · v (finite; PyTorch's default is 0.01).
    LeakyRelu {
        /// The slope below zero.
        negative_slope: f32,
    },
    /// v · sigmoid(v).
    Silu,
    /// The tanh approximation (PyTorch's `gelu(approximate="tanh")`).
    Gelu,
    /// v limited to [min, max] (finite, min ≤ max).
    Clamp {
        /// The lower bound.
        min: f32,
        /// The upper bound.
        max: f32,
    },
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Epilogue {
    pub alpha1: f32,
    pub alpha2: f32,
    /// Whether a residual `z` of y's shape is added (binding 7).
    pub residual: bool,
    pub activation: Activation,
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue { alpha1: 1.0, alpha2: 1.0, residual: false, activation: Activation::None }
    }
}

impl Activation {
    /// Parses the Python-side name with its parameters (`negative_slope`; `min`, `max`).
    pub fn parse(name: Option<&str>, negative_slope: f32, clamp: (f32, f32)) -> Result<Self> {
        let act = match name {
            None => Activation::None,
            Some("relu") => Activation::Relu,
            Some("leaky_relu") => Activation::LeakyRelu { negative_slope },
            Some("silu") => Activation::Silu,
            Some("gelu") => Activation::Gelu,
            Some("clamp") => Activation::Clamp { min: clamp.0, max: clamp.1 },
            Some(other) => {
                return Err(Error::invalid(format!(
                    "activation must be None, \"relu\", \"leaky_relu\", \"silu\", \"gelu\" or \"clamp\", got {other:?}"
                )))
            }
        };
        act.checked()
    }

    /// The activation if its parameters are usable: finite, and a clamp's min ≤ max.
    fn checked(self) -> Result<Self> {
        let finite = |what: &str, v: f32| {
            if v.is_finite() { Ok(v) } else { Err(Error::invalid(format!("{what} must be finite, got {v}"))) }
        };
        match self {
            Activation::LeakyRelu { negative_slope } => {
                finite("negative_slope", negative_slope)?;
            }
            Activation::Clamp { min, max } => {
                let (min, max) = (finite("clamp min", min)?, finite("clamp max", max)?);
                if min > max {
                    return Err(Error::invalid(format!("clamp min must be <= max, got ({min}, {max})")));
                }
            }
            _ => {}
        }
        Ok(self)
    }

    fn name(&self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::LeakyRelu { .. } => "leaky_relu",
            Activation::Silu => "silu",
            Activation::Gelu => "gelu",
            Activation::Clamp { .. } => "clamp",
        }
    }

    /// The parameters, as bits (for equality and hashing: a NaN-free f32 compares by bits).
    fn params(&self) -> [u32; 2] {
        match *self {
            Activation::LeakyRelu { negative_slope } => [negative_slope.to_bits(), 0],
            Activation::Clamp { min, max } => [min.to_bits(), max.to_bits()],
            _ => [0, 0],
        }
    }

    /// WGSL turning `v` into the result. NaN is tested on the bits (`nan`, declared before
    /// this): GPU compilers may assume there is no NaN and turn a comparison-based select into
    /// min/max, which on NVIDIA's returns the number (relu(NaN) came out 0 on an H100).
    fn wgsl(&self) -> String {
        match *self {
            Activation::None => "    return v;".into(),
            Activation::Relu => "    return select(max(v, 0.0), v, nan);".into(),
            Activation::LeakyRelu { negative_slope } => {
                format!("    return select(select(v, v * {}, v < 0.0), v, nan);", lit(negative_slope))
            }
            Activation::Silu => "    return v / (1.0 + exp(-v));".into(),
            // tanh's argument is clamped: some drivers build tanh from exp and give NaN for
            // large arguments; tanh(10) is 1 in f32 already. NaN passes a select-based clamp.
            Activation::Gelu => concat!(
                "    let t = 0.7978845608028654 * (v + 0.044715 * v * v * v);\n",
                "    let tc = select(select(t, -10.0, t < -10.0), 10.0, t > 10.0);\n",
                "    return 0.5 * v * (1.0 + tanh(tc));"
            )
            .into(),
            Activation::Clamp { min, max } => {
                format!("    return select(clamp(v, {}, {}), v, nan);", lit(min), lit(max))
            }
        }
    }

    /// Whether the WGSL needs `nan`: activations that may replace a value by a constant.
    fn tests_nan(&self) -> bool {
        matches!(self, Activation::Relu | Activation::LeakyRelu { .. } | Activation::Clamp { .. })
    }

    fn apply(&self, v: f32) -> f32 {
        match *self {
            Activation::None => v,
            Activation::Relu => if v < 0.0 { 0.0 } else { v },
            Activation::LeakyRelu { negative_slope } => if v < 0.0 { v * negative_slope } else { v },
            Activation::Silu => v / (1.0 + (-v).exp()),
            Activation::Gelu => {
                let t = 0.797_884_6 * (v + 0.044715 * v * v * v);
                0.5 * v * (1.0 + t.clamp(-10.0, 10.0).tanh())
            }
            Activation::Clamp { min, max } => if v < min { min } else if v > max { max } else { v },
        }
    }
}

/// An exact f32 literal: the bits, so no decimal rounding can differ from the caller's value.
fn lit(v: f32) -> String {
    format!("bitcast<f32>({:#010x}u)", v.to_bits())
}

impl Epilogue {
    pub fn new(alpha1: f32, alpha2: f32, residual: bool, activation: Activation) -> Result<Self> {
        for (name, v) in [("alpha1", alpha1), ("alpha2", alpha2)] {
            if !v.is_finite() {
                return Err(Error::invalid(format!("{name} must be a finite number, got {v}")));
            }
        }
        Ok(Epilogue { alpha1, alpha2, residual, activation: activation.checked()? })
    }

    /// y = conv(x, w) + bias: what every kernel did before epilogues existed.
    pub fn is_plain(&self) -> bool {
        *self == Epilogue::default()
    }

    fn key(&self) -> (u32, u32, bool, &'static str, [u32; 2]) {
        // alpha2 means nothing without a residual: equal problems, one key.
        let a2 = if self.residual { self.alpha2.to_bits() } else { 0 };
        (self.alpha1.to_bits(), a2, self.residual, self.activation.name(), self.activation.params())
    }

    /// Appended to a shape's label: "" when plain, else e.g. " *0.1 +0.5z relu".
    pub fn label(&self) -> String {
        let mut s = String::new();
        if self.alpha1 != 1.0 {
            s += &format!(" *{}", self.alpha1);
        }
        if self.residual {
            s += &if self.alpha2 == 1.0 { " +z".to_string() } else { format!(" +{}z", self.alpha2) };
        }
        match self.activation {
            Activation::None => {}
            Activation::LeakyRelu { negative_slope } => s += &format!(" leaky_relu({negative_slope})"),
            Activation::Clamp { min, max } => s += &format!(" clamp({min},{max})"),
            a => s += &format!(" {}", a.name()),
        }
        s
    }

    /// The WGSL every family's template takes as `{{EPILOGUE}}`: the residual's binding
    /// when there is one, and `epilogue(acc, k, i)`, the value stored at output element `i`
    /// of channel `k` for the convolution's sum `acc`. Plain, it is `acc + bias[k]` as before.
    /// `bias_of` names the function giving a channel's bias entry (`None`: the channel
    /// itself).
    pub fn wgsl(&self, bias: bool, dtype: DType, bias_of: Option<&str>) -> String {
        let mut s = String::from("// The store step: y = act(alpha1 * conv + alpha2 * z + bias).\n");
        if self.residual {
            s += &format!("@group(0) @binding(7) var<storage, read> z: array<{}>;\n", dtype.wgsl());
        }
        s += "fn epilogue(acc: f32, k: i32, i: i32) -> f32 {\n";
        s += &if self.alpha1 == 1.0 { "    var v = acc;\n".to_string() } else { format!("    var v = acc * {};\n", lit(self.alpha1)) };
        if self.residual {
            s += &if self.alpha2 == 1.0 { "    v = v + f32(z[i]);\n".to_string() } else { format!("    v = v + {} * f32(z[i]);\n", lit(self.alpha2)) };
        }
        if bias {
            s += &match bias_of {
                Some(f) => format!("    v = v + bias[{f}(k)];\n"),
                None => "    v = v + bias[k];\n".into(),
            };
        }
        if self.activation.tests_nan() {
            s += "    let nan = (bitcast<u32>(v) & 0x7FFFFFFFu) > 0x7F800000u;\n";
        }
        s += &self.activation.wgsl();
        s += "\n}\n";
        s
    }

    /// The same on the host, for output rows no kernel computes (windows of padding only).
    pub fn apply(&self, acc: f32, bias: f32, z: f32) -> f32 {
        let mut v = acc * self.alpha1;
        if self.residual {
            v += self.alpha2 * z;
        }
        self.activation.apply(v + bias)
    }
}

impl PartialEq for Epilogue {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Epilogue {}

impl Hash for Epilogue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_is_the_old_store() {
        let e = Epilogue::default();
        assert!(e.is_plain());
        assert_eq!(e.label(), "");
        let w = e.wgsl(true, DType::F32, None);
        assert!(w.contains("v = v + bias[k]") && !w.contains("binding(7)"), "{w}");
        // alpha2 without a residual changes nothing.
        assert!(Epilogue::new(1.0, 0.5, false, Activation::None).unwrap().is_plain());
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Activation::parse(Some("fast"), 0.0, (0.0, 0.0)).is_err());
        assert!(Activation::parse(Some("clamp"), 0.0, (1.0, 0.0)).is_err());
        assert!(Activation::parse(Some("leaky_relu"), f32::NAN, (0.0, 0.0)).is_err());
        assert!(Epilogue::new(f32::INFINITY, 1.0, true, Activation::Relu).is_err());
    }

    #[test]
    fn host_formula_and_nan() {
        let e = Epilogue::new(0.5, 2.0, true, Activation::Relu).unwrap();
        assert_eq!(e.apply(4.0, 1.0, -3.0), 0.0);
        assert_eq!(e.apply(4.0, 1.0, 1.0), 5.0);
        assert!(e.apply(f32::NAN, 0.0, 0.0).is_nan());
        let c = Activation::parse(Some("clamp"), 0.0, (-1.0, 2.0)).unwrap();
        assert!(c.apply(f32::NAN).is_nan());
        assert_eq!(c.apply(5.0), 2.0);
        assert!((Activation::Gelu.apply(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(Activation::Gelu.apply(1e30), 1e30);
    }

    /// Every activation, with and without residual and bias, in every family's store step
    /// passes naga's validation.
    #[test]
    fn every_epilogue_validates_in_every_family() {
        use crate::codegen::validate;
        use crate::kernels::all_variants;
        use crate::params::{ConvShape, Padding};
        let acts = [
            Activation::None,
            Activation::Relu,
            Activation::LeakyRelu { negative_slope: 0.2 },
            Activation::Silu,
            Activation::Gelu,
            Activation::Clamp { min: -1.0, max: 2.5 },
        ];
        let names = ["direct_wg64x1_u1_k4w4", "gemm_b32x32x8_t4x4", "gemm_b32x32x16_t4x4_k4", "coop_b64x64x32_s2x2_p3_l1"];
        let variants: Vec<_> = all_variants().into_iter().filter(|v| names.contains(&v.to_string().as_str())).collect();
        assert_eq!(variants.len(), names.len());
        for bias in [None, Some(8)] {
            let base = ConvShape::new([1, 8, 9, 9], [8, 8, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, bias).unwrap();
            for act in acts {
                for residual in [false, true] {
                    let shape = base.with_epilogue(Epilogue::new(0.5, 2.0, residual, act).unwrap());
                    for v in &variants {
                        let k = v.generate(&shape).unwrap();
                        if let Err(e) = validate(&k.source) {
                            panic!("{v} with {}: {e}", shape.label());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn labels_name_every_part() {
        let e = Epilogue::new(0.1, 1.0, true, Activation::LeakyRelu { negative_slope: 0.2 }).unwrap();
        assert_eq!(e.label(), " *0.1 +z leaky_relu(0.2)");
    }
}
