//! Precision modes, named after `torch.set_float32_matmul_precision`: what a float32 conv2d
//! may trade for speed. Each mode is an error bound that a tuning candidate must meet
//! against the float32 reference kernel before it may win.

use crate::dtype::DType;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a float32 problem may trade for speed, named after PyTorch's
/// `set_float32_matmul_precision`; each mode is an error bound every tuning candidate must
/// meet against the reference kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// float32-class results (the default).
    #[default]
    Highest,
    /// TF32-class results: products of 11-bit significands, accumulated in float32.
    High,
}

pub const NAMES: [&str; 2] = ["highest", "high"];

impl Precision {
    /// `"highest"` or `"high"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Precision::Highest => "highest",
            Precision::High => "high",
        }
    }

    /// Largest max|got - want| / max|want| a kernel may show against the float32 reference.
    /// "high" allows what one rounding of each operand to 11 significant bits gives on a
    /// long reduction, with a margin; a wrong kernel is off by far more.
    pub fn tolerance(&self) -> f64 {
        match self {
            Precision::Highest => 1e-5,
            Precision::High => 4e-3,
        }
    }

    /// The mode that applies to data of `dtype`. float16 values are 11-bit significands
    /// already, so one f16 product per term on tensor cores is exact and "high" gives up
    /// nothing: every call on float16 data runs (and is cached) as "high". Its error bound is
    /// the output's own rounding to float16 (`tolerance_for`).
    pub fn for_data(self, dtype: DType) -> Precision {
        match dtype {
            DType::F32 => self,
            DType::F16 => Precision::High,
        }
    }

    /// The tuner's bound for a problem on `dtype` data: the mode's, or for float16 outputs
    /// four of their rounding steps (the reference's output is rounded too, and sums may
    /// land on either side of a rounding boundary).
    pub fn tolerance_for(&self, dtype: DType) -> f64 {
        match dtype {
            DType::F32 => self.tolerance(),
            DType::F16 => 4.0 * dtype.output_rounding(),
        }
    }

    /// The bound a tuning candidate must meet on the tuner's validation data: the mode's own,
    /// except "highest" on float32 data, which is validated at half of it so the promise holds
    /// on data the tuner never saw (a random sweep over modes, layouts and epilogues reached
    /// 9.8e-6 against 1e-5 with candidates validated at the full bound).
    pub fn validation_bound(&self, dtype: DType) -> f64 {
        match (self, dtype) {
            (Precision::Highest, DType::F32) => self.tolerance() / 2.0,
            _ => self.tolerance_for(dtype),
        }
    }

    /// The argument if given, else `CONVTUNE_PRECISION`, else "highest".
    pub fn resolve(arg: Option<&str>) -> Result<Precision> {
        match arg {
            Some(a) => a.parse(),
            None => match std::env::var("CONVTUNE_PRECISION") {
                Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| {
                    Error::invalid(format!(
                        "CONVTUNE_PRECISION must be one of {}, got {v:?}",
                        quoted_names()
                    ))
                }),
                _ => Ok(Precision::default()),
            },
        }
    }
}

fn quoted_names() -> String {
    NAMES.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

impl FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Precision> {
        match s {
            "highest" => Ok(Precision::Highest),
            "high" => Ok(Precision::High),
            _ => Err(Error::invalid(format!("precision must be one of {}, got {s:?}", quoted_names()))),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_others_are_rejected_by_name() {
        for n in NAMES {
            assert_eq!(n.parse::<Precision>().unwrap().as_str(), n);
        }
        let e = "fast".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("'highest'") && e.contains("'high'") && e.contains("fast"), "{e}");
        assert!("HIGH".parse::<Precision>().is_err());
        assert!(Precision::High.tolerance() > Precision::Highest.tolerance());
    }

    /// "highest" candidates meet half the promised bound on the tuner's data; the other
    /// modes are validated at their own bound.
    #[test]
    fn highest_is_validated_with_a_margin() {
        assert_eq!(Precision::Highest.validation_bound(DType::F32), 5e-6);
        assert_eq!(Precision::High.validation_bound(DType::F32), Precision::High.tolerance());
        assert_eq!(Precision::Highest.validation_bound(DType::F16), Precision::Highest.tolerance_for(DType::F16));
    }
}
