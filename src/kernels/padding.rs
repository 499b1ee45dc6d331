//! Padding modes in the gathers (`PaddingMode`): zero padding masks a padded row or column
//! (the read gives zero); the other modes map it into x (`pad_row`/`pad_col`, which the
//! kernel's source defines) and read it there. A family whose gathers go through here takes
//! every mode (`KernelVariant::padding_modes`).

use crate::params::PaddingMode;

/// Where the gather reads a padded row or column: zero padding masks it (the read gives
/// zero), the other modes map it into x (`pad_row`/`pad_col`) and read it there.
pub struct PadIndex(pub PaddingMode);

impl PadIndex {
    pub fn row(&self, i: &str) -> String {
        if self.0.is_zeros() { i.to_string() } else { format!("pad_row({i})") }
    }
    pub fn col(&self, i: &str) -> String {
        if self.0.is_zeros() { i.to_string() } else { format!("pad_col({i})") }
    }
    /// Whether row `i` (as `row` gives it) is read.
    pub fn row_ok(&self, i: &str) -> String {
        if self.0.is_zeros() { format!("{i} >= 0 && {i} < H") } else { "true".into() }
    }
    pub fn col_ok(&self, i: &str) -> String {
        if self.0.is_zeros() { format!("{i} >= 0 && {i} < W") } else { "true".into() }
    }
    /// `pad_row` and `pad_col` (none for zeros): reflection needs padding below the size,
    /// wrapping at most the size (`ConvShape::with_padding_mode`), which keeps every row an
    /// output reads inside x; the clamp keeps the reads of a tile's rows past the output
    /// (computed, never stored) inside x too.
    pub fn wgsl(&self) -> String {
        let body = |n: &str| match self.0 {
            PaddingMode::Zeros => None,
            PaddingMode::Reflect => Some(format!("let a = abs(i);\n    return clamp(select(a, 2 * ({n} - 1) - a, a >= {n}), 0, {n} - 1);")),
            PaddingMode::Replicate => Some(format!("return clamp(i, 0, {n} - 1);")),
            PaddingMode::Circular => Some(format!("return clamp(select(select(i, i - {n}, i >= {n}), i + {n}, i < 0), 0, {n} - 1);")),
        };
        match (body("H"), body("W")) {
            (Some(h), Some(w)) => format!(
                "// Padding mode '{}': the x row and column a padded one reads.\nfn pad_row(i: i32) -> i32 {{\n    {h}\n}}\nfn pad_col(i: i32) -> i32 {{\n    {w}\n}}\n",
                self.0.name()
            ),
            _ => String::new(),
        }
    }
}


/// The shared direct-method sum (`shaders/direct_sum.wgsl`, the Winograd families' re-sum of
/// non-finite outputs) over a `side` x `side` filter, its padding read as `mode` says and taps
/// `dilation` apart.
pub fn direct_sum(mode: PaddingMode, dilation: (u32, u32), side: usize) -> String {
    let sum = super::DIRECT_SUM.trim_end().replace("KSIDE", &side.to_string());
    let tap = |d: u32, t: &str| if d == 1 { t.to_string() } else { format!("{t} * {d}") };
    let (row, col) = (format!("oh - PH + {}", tap(dilation.0, "r")), format!("ow - PW + {}", tap(dilation.1, "q")));
    let p = PadIndex(mode);
    let (row, col, ok) = if mode.is_zeros() {
        (row, col, "let ok = ih >= 0 && ih < H && iw >= 0 && iw < W;")
    } else {
        (p.row(&row), p.col(&col), "let ok = true;")
    };
    let out = sum
        .replace("let ih = oh - PH + r;", &format!("let ih = {row};"))
        .replace("let iw = ow - PW + q;", &format!("let iw = {col};"))
        .replace("let ok = ih >= 0 && ih < H && iw >= 0 && iw < W;", ok);
    debug_assert!(out.contains(ok) && out.contains(&format!("let ih = {row};")), "direct_sum.wgsl changed");
    out
}
