//! Element types of x, w, z and y: float32, or float16 (half the bytes; kernels convert to
//! float32 as they load and accumulate in float32, as cuDNN's fp16 convolutions do). The bias
//! is float32 either way. On the host, float16 data travels as its 16-bit patterns.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// The element type of a problem's x, w, z and y (the bias is float32 either way).
// In cache keys as "f32" / "f16" (keys always had a "dtype": "f32" entry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// float32.
    #[default]
    #[serde(rename = "f32")]
    F32,
    /// float16: half the bytes; products and sums in float32, results rounded to float16.
    #[serde(rename = "f16")]
    F16,
}

impl DType {
    /// `"float32"` or `"float16"`.
    pub fn parse(name: &str) -> Result<DType> {
        match name {
            "float32" => Ok(DType::F32),
            "float16" => Ok(DType::F16),
            other => Err(Error::invalid(format!("dtype must be \"float32\" or \"float16\", got {other:?}"))),
        }
    }

    /// Its name, as [`parse`](Self::parse) takes it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }

    /// The WGSL scalar type of the data.
    pub fn wgsl(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
        }
    }

    /// Bytes of a buffer of `elems` elements: whole 4-byte words, as storage bindings and
    /// buffer copies need.
    pub fn buffer_bytes(self, elems: u64) -> u64 {
        (elems * self.size()).div_ceil(4) * 4
    }

    /// The relative error an output of this type adds by itself: float16 results are rounded
    /// to 11 significant bits (the tuner's bound for float16 problems is four of these, see
    /// `Precision::tolerance_for`).
    pub fn output_rounding(self) -> f64 {
        match self {
            DType::F32 => 0.0,
            DType::F16 => 2f64.powi(-11),
        }
    }
}

/// A host element of a tensor: `f32`, or `u16` holding float16 bits (as
/// `half::f16::to_bits` gives them).
pub trait Elem: bytemuck::Pod + Send + Sync + 'static {
    /// The problem's element type this host type carries.
    const DTYPE: DType;
    /// The value as float32.
    fn to_f32(self) -> f32;
    /// A float32 value rounded to this type.
    fn from_f32(v: f32) -> Self;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Elem for u16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v).to_bits()
    }
}

/// The largest finite |v| of `data` as float32 bits (0 where there is none): what the GPU's
/// max pass (`check.wgsl`'s `maxabs`) finds for a kernel that scales float32 inputs.
pub fn finite_abs_max<T: Elem>(data: &[T]) -> u32 {
    // Blocks of eight lanes, so the compiler keeps eight running maxima in one vector.
    let mut lanes = [0u32; 8];
    let mut blocks = data.chunks_exact(8);
    for block in &mut blocks {
        for (m, &v) in lanes.iter_mut().zip(block) {
            *m = (*m).max(finite_abs_bits(v.to_f32()));
        }
    }
    let tail = blocks.remainder().iter().map(|&v| finite_abs_bits(v.to_f32()));
    lanes.into_iter().chain(tail).max().unwrap_or(0)
}

/// |v|'s bits where v is finite, else 0.
fn finite_abs_bits(v: f32) -> u32 {
    let b = v.to_bits() & 0x7fff_ffff;
    if b < 0x7f80_0000 { b } else { 0 }
}

/// `data` converted to `T`, rounding to nearest.
pub fn convert<T: Elem>(data: &[f32]) -> Vec<T> {
    data.iter().map(|&v| T::from_f32(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_abs_max_skips_inf_and_nan_and_takes_the_sign_off() {
        let mut v: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 3.0).collect();
        assert_eq!(finite_abs_max(&v), 6.0f32.to_bits());
        v[5] = -7.5;
        v.extend([f32::INFINITY, f32::NAN, f32::NEG_INFINITY]);
        assert_eq!(finite_abs_max(&v), 7.5f32.to_bits());
        assert_eq!(finite_abs_max::<f32>(&[f32::NAN, -0.0]), 0);
        assert_eq!(finite_abs_max::<f32>(&[]), 0);
        assert_eq!(finite_abs_max(&convert::<u16>(&[1.0, -2.0, 0.5])), 2.0f32.to_bits());
    }

    #[test]
    fn float16_bits_round_trip_and_round_to_nearest() {
        for v in [0.0f32, -0.0, 1.0, -2.5, 65504.0, 2f32.powi(-14), 2f32.powi(-24), f32::INFINITY] {
            assert_eq!(u16::from_f32(v).to_f32(), v);
        }
        assert!(u16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(u16::from_f32(1.0 + 1.0 / 4096.0).to_f32(), 1.0);
        assert_eq!(u16::from_f32(1e6).to_f32(), f32::INFINITY);
        assert_eq!(DType::F16.buffer_bytes(3), 8);
        assert_eq!(DType::F32.buffer_bytes(3), 12);
        assert_eq!(DType::parse("float16").unwrap(), DType::F16);
        assert!(DType::parse("half").is_err());
    }
}
