//! Kernel families. Each family is one module here and one template in `shaders/`: its knobs
//! and variant space, whether a variant suits a shape on an adapter, its cost estimate and its
//! WGSL generation. `families!` at the bottom is the one list the tuner, the cache and the
//! Python layer walk; adding a family means a module, a template and a line there.

pub mod coop;
pub mod cost;
pub mod direct;
pub mod dwise;
pub mod gemm;
pub mod implicit;
pub mod padding;
pub mod phases;
pub mod stem;
pub mod tconv;
pub mod wino;
pub mod winocoop;
pub mod winogemm;

use crate::codegen::Kernel;
use crate::error::{Error, Result};
use crate::params::ConvShape;
use crate::precision::Precision;
use std::fmt;
use std::str::FromStr;

/// What a variant may rely on from the adapter.
#[derive(Clone, Debug)]
pub struct Caps {
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    /// 16x16x16 f16 x f16 -> f32 cooperative matrices, on subgroups of exactly 32
    /// invocations, enabled on the device.
    pub tensor_cores: bool,
    /// A CPU adapter (lavapipe): it compiles a kernel to machine code at its first dispatch,
    /// in time that grows with the kernel's size.
    pub cpu: bool,
}

impl Caps {
    /// A GPU with these limits and no optional feature.
    pub fn from_limits(limits: wgpu::Limits) -> Caps {
        Caps { limits, features: wgpu::Features::empty(), tensor_cores: false, cpu: false }
    }

    /// What `KernelVariant::unfit` reads of the adapter: equal keys, equal verdicts.
    pub fn fit_key(&self) -> [u32; 5] {
        let l = &self.limits;
        [
            l.max_compute_workgroup_size_x,
            l.max_compute_workgroup_size_y,
            l.max_compute_invocations_per_workgroup,
            l.max_compute_workgroup_storage_size,
            self.tensor_cores as u32 | (self.cpu as u32) << 1,
        ]
    }

    /// Why a family that needs tensor cores cannot run here, or `None` if it can.
    pub fn tensor_cores_missing(&self) -> Option<&'static str> {
        (!self.tensor_cores).then_some(
            "the adapter has no 16x16x16 f16->f32 cooperative matrices on 32-wide subgroups \
             (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX with SHADER_F16, SUBGROUP and SUBGROUP_BARRIER)",
        )
    }
}

/// The static side of a family: its name, template and variant space.
pub trait Family: Sized {
    /// The prefix of every variant name of the family, e.g. `"direct"`.
    const NAME: &'static str;
    /// The WGSL template the family's generator expands.
    const TEMPLATE: &'static str;
    /// Every variant the generator can emit.
    fn space() -> Vec<Self>;
    /// Parses the numbers of a name after the family prefix (the inverse of `name`).
    fn from_numbers(numbers: &[u32]) -> Option<Self>;
}

/// One variant of a family: everything the tuner and the runner ask of it.
pub trait KernelVariant {
    fn family(&self) -> &'static str;
    /// The variant's name, e.g. `direct_wg64x1_u1_k4w1`.
    fn name(&self) -> String;
    /// The knobs as (name, value) pairs, for reports.
    fn knobs(&self) -> Vec<(&'static str, u32)>;
    /// Structural sanity, independent of any shape or adapter.
    fn well_formed(&self) -> bool;
    /// Invocations in one workgroup.
    fn invocations(&self) -> u32;
    /// Bytes of workgroup memory the variant declares.
    fn workgroup_bytes(&self) -> u32;
    /// Largest workgroup extent along x and y.
    fn workgroup_dims(&self) -> (u32, u32) {
        (self.invocations(), 1)
    }
    /// Whether the variant runs on cooperative matrices (see `Caps::tensor_cores`).
    fn needs_tensor_cores(&self) -> bool {
        false
    }
    /// Whether the variant fills padding as any `PaddingMode` says (else zeros only): the
    /// others are not candidates for the other modes.
    fn padding_modes(&self) -> bool {
        false
    }
    /// Whether the variant computes transposed convolutions (and only those): a family
    /// serves one kind, and `Variant` keeps every other kind away from it.
    fn transposed(&self) -> bool {
        false
    }
    /// Whether the variant's results meet `precision`'s error bound by design; the tuner
    /// still checks each candidate against the reference with that bound.
    fn serves(&self, _precision: Precision) -> bool {
        true
    }
    /// Whether the variant makes sense for this shape: no tile far larger than the problem,
    /// no written-out loop that bloats the shader beyond reason.
    fn suits(&self, shape: &ConvShape) -> bool;
    /// Whether the variant can compute this shape at all (`suits` is about sense, this about
    /// ability): a variant that cannot refuses the shape in `generate`.
    fn computes(&self, _shape: &ConvShape) -> bool {
        true
    }
    /// A rough relative run time; only the order among candidates matters.
    fn cost(&self, shape: &ConvShape) -> f64;
    /// The WGSL for this variant on `shape`, and its dispatch.
    fn generate(&self, shape: &ConvShape) -> Result<Kernel>;
    /// `generate` with each workspace binding held to `max_workspace` bytes, which a family
    /// may meet by running in chunks (`Kernel::chunks`); the others ignore it.
    fn generate_within(&self, shape: &ConvShape, _max_workspace: u64) -> Result<Kernel> {
        self.generate(shape)
    }

    /// Why the adapter cannot run it at all, or `None` if it can.
    fn unfit(&self, caps: &Caps) -> Option<String> {
        if self.needs_tensor_cores() {
            if let Some(why) = caps.tensor_cores_missing() {
                return Some(format!("variant {} cannot run here: {why}", self.name()));
            }
        }
        let l = &caps.limits;
        let (x, y) = self.workgroup_dims();
        let fits = x <= l.max_compute_workgroup_size_x
            && y <= l.max_compute_workgroup_size_y
            && self.invocations() <= l.max_compute_invocations_per_workgroup
            && self.workgroup_bytes() <= l.max_compute_workgroup_storage_size;
        (!fits).then(|| {
            format!(
                "variant {} needs {} invocations and {} bytes of workgroup memory; the adapter \
                 allows {} and {}",
                self.name(),
                self.invocations(),
                self.workgroup_bytes(),
                l.max_compute_invocations_per_workgroup,
                l.max_compute_workgroup_storage_size
            )
        })
    }
}

/// The numbers in a name, in order (`"_wg64x1_u1"` gives 64, 1, 1).
fn numbers(s: &str) -> Vec<u32> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// WGSL that more than one family's kernels use: the Winograd families' direct re-sum
/// (`{{DIRECT_SUM}}` in their templates) and the weight passes of lowered forms.
pub const DIRECT_SUM: &str = include_str!("../../shaders/direct_sum.wgsl");
/// Templates besides the families' own, for the tuning cache's hash.
const SHARED_TEMPLATES: [&str; 4] = [DIRECT_SUM, phases::TEMPLATE, phases::SHUFFLE_TEMPLATE, winogemm::TRANSFORMS_TEMPLATE];

/// Declares `Variant`, one arm per family, and the functions that walk all families.
macro_rules! families {
    ($($arm:ident($ty:ty)),+ $(,)?) => {
        /// A kernel variant of any family.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Variant {
            $($arm($ty)),+
        }

        impl Variant {
            fn ops(&self) -> &dyn KernelVariant {
                match self {
                    $(Variant::$arm(v) => v),+
                }
            }
        }

        /// Every variant the generator can emit, over all families.
        pub fn all_variants() -> Vec<Variant> {
            let mut out = Vec::new();
            $(out.extend(<$ty as Family>::space().into_iter().map(Variant::$arm));)+
            out
        }

        /// Every family's template, in list order, then the shared pieces (the tuning
        /// cache hashes them all: a cached winner was measured with this code).
        pub fn templates() -> Vec<&'static str> {
            let mut out = vec![$(<$ty as Family>::TEMPLATE),+];
            out.extend(SHARED_TEMPLATES);
            out
        }

        /// Every family's name, in list order.
        pub fn family_names() -> Vec<&'static str> {
            vec![$(<$ty as Family>::NAME),+]
        }

        fn parse_name(s: &str) -> Option<Variant> {
            $(
                if let Some(rest) = s.strip_prefix(<$ty as Family>::NAME).and_then(|r| r.strip_prefix('_')) {
                    return <$ty as Family>::from_numbers(&numbers(rest)).map(Variant::$arm);
                }
            )+
            None
        }
    };
}

families! {
    Direct(direct::Direct),
    Stem(stem::Stem),
    Gemm(gemm::Gemm),
    Coop(coop::Coop),
    Wino(wino::Wino),
    Tconv(tconv::Tconv),
    Wgemm(winogemm::WinoGemm),
    Wcoop(winocoop::WinoCoop),
    Dwise(dwise::Dwise),
}

impl Variant {
    pub fn family(&self) -> &'static str {
        self.ops().family()
    }
    pub fn invocations(&self) -> u32 {
        self.ops().invocations()
    }
    pub fn workgroup_bytes(&self) -> u32 {
        self.ops().workgroup_bytes()
    }
    pub fn knobs(&self) -> Vec<(&'static str, u32)> {
        self.ops().knobs()
    }
    pub fn well_formed(&self) -> bool {
        self.ops().well_formed()
    }
    /// Whether the adapter can run it at all.
    pub fn fits(&self, caps: &Caps) -> bool {
        self.unfit(caps).is_none()
    }
    /// Why the adapter cannot run it, or `None` if it can.
    pub fn unfit(&self, caps: &Caps) -> Option<String> {
        self.ops().unfit(caps)
    }
    pub fn serves(&self, precision: Precision) -> bool {
        self.ops().serves(precision)
    }
    pub fn needs_tensor_cores(&self) -> bool {
        self.ops().needs_tensor_cores()
    }
    /// The shape the variant's own generator sees for `shape`: a transposed problem's
    /// lowered form for the plain families, a pixel shuffle's scatter form where it has one
    /// (`kernels::phases`), the shape itself for the variant's own kind, else none.
    fn target(&self, shape: &ConvShape) -> Option<ConvShape> {
        if !shape.padding_mode.is_zeros() && !self.ops().padding_modes() {
            return None;
        }
        match (self.ops().transposed(), shape.is_transposed()) {
            (false, false) => Some(shape.shuffle_lowered().unwrap_or(*shape)),
            (true, true) => Some(*shape),
            (false, true) => shape.lowered(),
            _ => None,
        }
    }
    pub fn suits(&self, shape: &ConvShape) -> bool {
        self.target(shape).is_some_and(|t| self.ops().suits(&t))
    }
    pub fn computes(&self, shape: &ConvShape) -> bool {
        self.target(shape).is_some_and(|t| self.ops().computes(&t))
    }
    /// The lowered form's cost where the variant computes one: its zero taps (a kernel side
    /// short of a stride multiple) are work like any other, but where the variant skips them
    /// (the tensor-core tiles, `coop::taps`).
    pub fn cost(&self, shape: &ConvShape) -> f64 {
        self.ops().cost(&self.target(shape).unwrap_or(*shape))
    }
    /// The WGSL for this variant on `shape`; an error for names outside the generator's space.
    pub fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        self.generate_within(shape, crate::codegen::MAX_WORKSPACE)
    }
    /// `generate` with each workspace binding held to `max_workspace` bytes (an adapter's
    /// largest binding, where smaller than the default): see `KernelVariant::generate_within`.
    pub fn generate_within(&self, shape: &ConvShape, max_workspace: u64) -> Result<Kernel> {
        if !self.well_formed() {
            return Err(Error::invalid(format!("variant {self} is not in the generator's space")));
        }
        let Some(target) = self.target(shape) else {
            let why = if !shape.padding_mode.is_zeros() {
                "padding modes other than 'zeros' are for plain convolutions, which every family but tconv runs"
            } else if shape.is_transposed() {
                "a transposed convolution with padding past its kernel's reach runs on tconv only"
            } else {
                "a plain convolution runs on every family but tconv"
            };
            return Err(Error::invalid(format!("variant {self} cannot run on this shape ({}): {why}", shape.label())));
        };
        let mut kernel = self.ops().generate_within(&target, max_workspace)?;
        if target.scatter.is_some_and(|sc| sc.rearranges_w()) {
            kernel.wprep = Some(phases::weight_prep(shape, &target, &self.to_string())?);
        }
        Ok(kernel)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.ops().name())
    }
}

impl FromStr for Variant {
    type Err = Error;

    /// Parses the names `Display` writes, e.g. `direct_wg64x1_u1_k4w1`, `gemm_b64x64x8_t4x4`.
    fn from_str(s: &str) -> Result<Self> {
        match parse_name(s) {
            Some(v) if v.to_string() == s && v.well_formed() => Ok(v),
            _ => Err(Error::invalid(format!(
                "unknown variant name {s:?}; names come from convtune.variant_space() (families: {}), \
                 e.g. 'direct_wg64x1_u1_k4w1' or 'gemm_b64x64x8_t4x4'",
                family_names().join(", ")
            ))),
        }
    }
}

/// A fixed rule on the shape and the adapter's limits: the untuned choice for transposed
/// problems (plain ones take the cost model's first pick, `tuner::default_choice`).
pub fn default_variant(shape: &ConvShape, caps: &Caps) -> Variant {
    if shape.is_transposed() {
        // A shuffled one has only its lowered form: the plain rule on that.
        return match shape.lowered().filter(|_| shape.pixel_shuffle.is_some()) {
            Some(lowered) => default_variant(&lowered, caps),
            None => tconv::default_variant(shape),
        };
    }
    let m = shape.n as u64 * shape.oh() as u64 * shape.ow() as u64;
    let red = shape.cg() * shape.r * shape.s;
    // GEMM tiles pay off once both the pixel and the channel side fill a tile and the
    // reduction is deep enough to amortise staging through workgroup memory. 8-deep steps:
    // on the H100 they ran 1.2-1.5x faster than 16-deep ones with this tile.
    if shape.kg() >= 32 && m >= 4096 && red >= 32 {
        let g = Variant::Gemm(gemm::Gemm { bm: 64, bn: 64, bk: 8, tm: 4, tn: 4, splits: 1 });
        if g.fits(caps) {
            return g;
        }
    }
    // A CPU adapter (lavapipe) compiles a kernel to machine code at its first run, in time
    // that grows with the written-out code: there the window stays a loop.
    let unroll = if shape.r * shape.s <= 49 && !caps.cpu { 1 } else { 0 };
    // In NHWC a pixel's output channels are contiguous: workgroups 8 pixels by 8 channel
    // tiles store a few sectors per instruction where 64 pixels store 32 (the seed shape on
    // the H100: 15.6 us against 34.2). With 32 channels or more, tiles of 4 channels x 4
    // pixels fill all 8 lanes along y and reuse more of each load (14.7 us on the seed
    // shape, 0.43 ms against 0.61 with 2 x 2 on 32,3,224,224 -> 64; benches/results/HISTORY.md, "NHWC
    // against NCHW").
    if shape.layout == crate::params::Layout::Nhwc && shape.kg() >= 16 {
        let (tk, tw) = if shape.kg() >= 32 { (4, 4) } else { (2, 2) };
        return Variant::Direct(direct::Direct { wg_x: 8, wg_y: 8, unroll, tk, tw });
    }
    let tk = if shape.kg() >= 4 { 4 } else { 1 };
    let v = Variant::Direct(direct::Direct { wg_x: 64, wg_y: 1, unroll, tk, tw: 1 });
    debug_assert!(v.fits(caps));
    v
}

/// A one-group problem with equal strides and paddings on both axes, for the families' tests.
/// Variants a test sweeps per family unless `CONVTUNE_EXHAUSTIVE=1`.
#[cfg(test)]
const SWEPT_PER_FAMILY: usize = 12;

/// Tests: the variants of `all` a sweep runs: every one with `CONVTUNE_EXHAUSTIVE=1` (the
/// GPU machine's runs and the opt-in full sweep), else up to `SWEPT_PER_FAMILY` of each
/// family, spread evenly over its list (its first and last included), so that every family
/// and the range of its knobs is covered in a CI run's time.
#[cfg(test)]
pub(crate) fn swept<T: Copy>(all: &[T], family: impl Fn(&T) -> &'static str) -> Vec<T> {
    if std::env::var("CONVTUNE_EXHAUSTIVE").is_ok_and(|v| v.trim() == "1") {
        return all.to_vec();
    }
    let mut names: Vec<&'static str> = all.iter().map(&family).collect();
    names.dedup();
    names
        .into_iter()
        .flat_map(|name| {
            let of: Vec<T> = all.iter().copied().filter(|v| family(v) == name).collect();
            let m = of.len().min(SWEPT_PER_FAMILY);
            (0..m).map(move |i| of[if m == 1 { 0 } else { i * (of.len() - 1) / (m - 1) }])
        })
        .collect()
}

/// Tests: `swept` over every variant.
#[cfg(test)]
pub(crate) fn swept_variants() -> Vec<Variant> {
    swept(&all_variants(), |v| v.family())
}

#[cfg(test)]
pub(crate) fn square_shape(x: [usize; 4], w: [usize; 4], stride: i64, pad: i64) -> ConvShape {
    ConvShape::new(x, w, (stride, stride), crate::params::Padding::Explicit(pad, pad), (1, 1), 1, None).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nhwc_defaults_tile_channels_across_the_workgroup() {
        use crate::params::{Layout, Padding};
        let caps = Caps::from_limits(wgpu::Limits::default());
        let seed = ConvShape::new([1, 3, 225, 225], [32, 3, 3, 3], (1, 1), Padding::Explicit(0, 0), (1, 1), 1, None).unwrap();
        assert_eq!(default_variant(&seed, &caps).to_string(), "direct_wg64x1_u1_k4w1");
        assert_eq!(default_variant(&seed.with_layout(Layout::Nhwc), &caps).to_string(), "direct_wg8x8_u1_k4w4");
        let k16 = ConvShape::new([1, 3, 64, 64], [16, 3, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        assert_eq!(default_variant(&k16.with_layout(Layout::Nhwc), &caps).to_string(), "direct_wg8x8_u1_k2w2");
        // Depthwise: one channel per group, nothing to tile across the workgroup.
        let dw = ConvShape::new([1, 32, 28, 28], [32, 1, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 32, None).unwrap();
        assert_eq!(default_variant(&dw.with_layout(Layout::Nhwc), &caps).to_string(), "direct_wg64x1_u1_k1w1");
    }

    #[test]
    fn sweeps_cover_every_family_ends_included() {
        let all = all_variants();
        let some = swept(&all, |v| v.family());
        for name in family_names() {
            let of: Vec<_> = all.iter().filter(|v| v.family() == name).collect();
            let picked: Vec<_> = some.iter().filter(|v| v.family() == name).collect();
            assert!(picked.len() >= of.len().min(SWEPT_PER_FAMILY), "{name}");
            assert!(picked.first() == of.first() && picked.last() == of.last(), "{name}");
        }
    }

    #[test]
    fn names_round_trip() {
        for v in all_variants() {
            assert_eq!(v.to_string().parse::<Variant>().unwrap(), v);
        }
        assert!("direct_wg64x1_u3_k4w1".parse::<Variant>().is_err());
        assert!("gemm_b64x64".parse::<Variant>().is_err());
        assert!("nonsense".parse::<Variant>().is_err());
    }

    #[test]
    fn space_has_every_family_and_only_well_formed_variants() {
        let all = all_variants();
        for name in family_names() {
            assert!(all.iter().any(|v| v.family() == name), "{name}");
        }
        assert!(all.iter().all(|v| v.well_formed()));
    }
}
