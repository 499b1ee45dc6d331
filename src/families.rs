//! `CONVTUNE_FAMILIES`: the kernel families the tuner and the default rule may choose from.
//! A variant asked for by name runs whatever this says: the caller chose it.

use crate::error::{Error, Result};
use crate::kernels::family_names;

pub const ENV: &str = "CONVTUNE_FAMILIES";

/// A set of kernel families, in the order of the `families!` list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Families {
    allowed: Vec<&'static str>,
}

impl Default for Families {
    fn default() -> Self {
        Families::all()
    }
}

impl Families {
    pub fn all() -> Families {
        Families { allowed: family_names() }
    }

    /// Parses a comma-separated list of family names (case and spaces ignored).
    pub fn parse(text: &str) -> Result<Families> {
        let known = family_names();
        let mut wanted = Vec::new();
        for item in text.split(',').map(|t| t.trim().to_ascii_lowercase()).filter(|t| !t.is_empty()) {
            match known.iter().find(|&&k| k == item) {
                Some(&k) => wanted.push(k),
                None => {
                    return Err(Error::invalid(format!(
                        "{ENV}: unknown kernel family {item:?}; accepted: {} (comma-separated, e.g. \"direct,gemm\")",
                        known.join(", ")
                    )))
                }
            }
        }
        if wanted.is_empty() {
            return Err(Error::invalid(format!(
                "{ENV} names no kernel family ({text:?}); accepted: {}",
                known.join(", ")
            )));
        }
        Ok(Families { allowed: known.into_iter().filter(|k| wanted.contains(k)).collect() })
    }

    /// `CONVTUNE_FAMILIES` now; unset or blank allows every family.
    pub fn from_env() -> Result<Families> {
        match std::env::var(ENV) {
            Ok(v) if !v.trim().is_empty() => Families::parse(&v),
            _ => Ok(Families::all()),
        }
    }

    pub fn allows(&self, family: &str) -> bool {
        self.allowed.contains(&family)
    }

    pub fn allowed(&self) -> &[&'static str] {
        &self.allowed
    }

    /// The families left out, in list order.
    pub fn excluded(&self) -> Vec<&'static str> {
        family_names().into_iter().filter(|f| !self.allows(f)).collect()
    }

    pub fn is_all(&self) -> bool {
        self.excluded().is_empty()
    }

    /// What the tuning cache keys on: `None` without a restriction, so that entries written
    /// before the variable existed keep matching unrestricted calls.
    pub fn key(&self) -> Option<String> {
        (!self.is_all()).then(|| self.allowed.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_in_list_order_and_rejects_unknown_ones() {
        let f = Families::parse(" GEMM, direct,,gemm ").unwrap();
        assert_eq!(f.allowed(), ["direct", "gemm"]);
        assert_eq!(f.excluded(), ["stem", "coop", "wino", "tconv", "wgemm", "wcoop", "dwise"]);
        assert_eq!(f.key().as_deref(), Some("direct,gemm"));
        assert!(Families::parse("coop,gemm,wino,direct,stem,tconv,wgemm,wcoop,dwise").unwrap().key().is_none());
        let e = Families::parse("direct,winograd").unwrap_err().to_string();
        assert!(e.contains("\"winograd\"") && e.contains("direct, stem, gemm, coop, wino, tconv, wgemm, wcoop, dwise"), "{e}");
        assert!(Families::parse(" , ").is_err());
    }
}
