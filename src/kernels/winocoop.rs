//! The non-fused Winograd family on tensor cores, F(2x2, 3x3), dilated layers too (as their
//! dilation's phases, `winogemm::tiles`): wgemm's three
//! passes (`winogemm`: the transforms, their points and accuracy, the chunks, `finish`) with
//! U and V stored as f16, two per u32, and the batched GEMMs M = V U on cooperative
//! matrices, the coop family's products (`coop::gemm_step`) on tiles staged from 16-byte
//! loads. F(2x2) does 4/9 of the direct method's multiplications; what it pays is the round
//! trip of V (f16) and M (f32) through memory, so it pays off on deep layers of few pixels
//! only. On an H200 (float16 NHWC, timed by name): 32,512,7,7 -> 512 in 0.055 ms against the
//! coop family's 0.059-0.064, 8,512,14,14 level (0.055 against 0.054), 32,256,14,14 and wider
//! layers slower (EDSR 4x).
//!
//! float16 data and (`"high"`) float32 data: f16 transformed values keep float16 data's
//! range (a value past it becomes Inf, which `finish` catches and sums again the direct way);
//! float32 data is scaled by powers of two from its maxima first, as the coop family scales
//! it, and scaled back in `finish`. F(4x4) rounds too much in f16: U and V rounded to
//! f16 gave 2.4e-3 of max |y| on 3,37,11,7 -> 41 (the float16 bound is 2.0e-3); F(6x6)'s
//! transforms round more still.

use super::cost::{multiprocessor_fill, parallel_efficiency};
use super::winogemm::{applies_dilated, filter_transform, input_transform, passes, Passes, Tiling};
use super::{coop, Family, KernelVariant};
use crate::codegen::{render, Kernel, MAX_WORKSPACE};
use crate::dtype::DType;
use crate::error::Result;
use crate::params::ConvShape;
use crate::precision::Precision;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WinoCoop {
    /// Output tile side: 2 or 4.
    pub m: u32,
    /// GEMM workgroup tile: `bm` Winograd tiles x `bn` output channels, `bk` input channels
    /// per step.
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    /// Subgroups along the tiles and the channels (each a grid of 16x16 accumulators).
    pub sgm: u32,
    pub sgn: u32,
    /// 1: one f16 product per term ("high"); 3: the split pair, hi*hi + (hi*lo + lo*hi) /
    /// 2^11 with the correction terms accumulated apart ("highest"), as the coop family's.
    pub split: u32,
}

/// (bm, bn, sgm, sgn), 32-deep steps: the coop family's 2x2 to 4x4 accumulator grids on 4
/// or 8 subgroups, and the 128x256 tile of the fastest WGSL GEMM measured on an H200 (275
/// TFLOP/s at 8192^3, `../shared/device/COOPMAT.md`'s design).
const TILES: [(u32, u32, u32, u32); 6] = [(64, 64, 2, 2), (128, 64, 2, 2), (64, 128, 2, 2), (128, 128, 2, 2), (128, 128, 2, 4), (128, 256, 2, 4)];
const MS: [u32; 1] = [2];
const SPLIT: [u32; 2] = [1, 3];
const BK: u32 = 32;
/// f16 elements of padding per staged row: 16 bytes, as the coop family's.
const PAD: u32 = 8;

/// A tensor-core multiply-add relative to a scalar FMA, per multiply-add (the coop family's
/// figure), and the 16-byte staging per staged value, weighed so that the wide tiles rank
/// first: on an H200 the 128x128 and 128x256 tiles ran every deep layer fastest, 2-10% ahead
/// of the 64-wide ones (`benches/results/HISTORY.md`, "Split window tiles; Winograd on tensor cores").
const MMA: f64 = 0.08;
const STAGE: f64 = 4.0;

impl WinoCoop {
    fn tiling(&self) -> Tiling {
        let parts = self.parts() as u64;
        Tiling { m: self.m, r: 3, bm: self.bm, bn: self.bn, bk: self.bk, value_bytes: 2 * parts, m_bytes: 4 * parts, u_apart: true }
    }

    /// f16 parts of each transformed value (hi, and lo for the split pair).
    fn parts(&self) -> u32 {
        if self.split == 3 { 2 } else { 1 }
    }

    fn threads(&self) -> u32 {
        coop::SUBGROUP * self.sgm * self.sgn
    }

    fn tm(&self) -> u32 {
        self.bm / (16 * self.sgm)
    }

    fn tn(&self) -> u32 {
        self.bn / (16 * self.sgn)
    }
}

impl Family for WinoCoop {
    const NAME: &'static str = "wcoop";
    const TEMPLATE: &'static str = include_str!("../../shaders/winocoop.wgsl");

    fn space() -> Vec<Self> {
        let tiles = MS.iter().flat_map(|&m| TILES.iter().map(move |&t| (m, t)));
        tiles
            .flat_map(|(m, (bm, bn, sgm, sgn))| SPLIT.iter().map(move |&split| WinoCoop { m, bm, bn, bk: BK, sgm, sgn, split }))
            .filter(|v| v.well_formed())
            .collect()
    }

    fn from_numbers(n: &[u32]) -> Option<Self> {
        match *n {
            [m, bm, bn, bk, sgm, sgn, split] => Some(WinoCoop { m, bm, bn, bk, sgm, sgn, split }),
            _ => None,
        }
    }
}

impl KernelVariant for WinoCoop {
    fn family(&self) -> &'static str {
        Self::NAME
    }
    fn padding_modes(&self) -> bool {
        true
    }

    fn name(&self) -> String {
        format!("wcoop_m{}_b{}x{}x{}_s{}x{}_p{}", self.m, self.bm, self.bn, self.bk, self.sgm, self.sgn, self.split)
    }

    fn knobs(&self) -> Vec<(&'static str, u32)> {
        vec![("m", self.m), ("bm", self.bm), ("bn", self.bn), ("bk", self.bk), ("sgm", self.sgm), ("sgn", self.sgn), ("split", self.split)]
    }

    fn well_formed(&self) -> bool {
        let t = self.threads();
        MS.contains(&self.m)
            && SPLIT.contains(&self.split)
            && self.bk == BK
            && TILES.contains(&(self.bm, self.bn, self.sgm, self.sgn))
            // Whole 16-byte load slots per invocation on both sides.
            && (self.bm * self.bk / 8) % t == 0
            && (self.bn * self.bk / 8) % t == 0
    }

    fn invocations(&self) -> u32 {
        self.threads()
    }

    fn workgroup_bytes(&self) -> u32 {
        2 * self.parts() * (self.bk * (self.bm + PAD) + self.bn * (self.bk + PAD))
    }

    fn needs_tensor_cores(&self) -> bool {
        true
    }

    /// One f16 product per term: `"high"` (and float16 data, which it serves); the split
    /// pair `"highest"` (it would serve `"high"` too, at three times the products).
    fn serves(&self, precision: Precision) -> bool {
        matches!((self.split, precision), (1, Precision::High) | (3, Precision::Highest))
    }

    /// 3x3 at stride 1, dilated too (their dilation's phases, `winogemm::tiles`), where U
    /// and one GEMM tile's V and M fit the default workspace bound (larger problems run in
    /// chunks of tiles).
    fn computes(&self, shape: &ConvShape) -> bool {
        applies_dilated(shape) && self.tiling().chunking(shape, MAX_WORKSPACE).is_some()
    }

    fn suits(&self, shape: &ConvShape) -> bool {
        let (_, _, tiles) = self.tiling().tiles(shape);
        self.computes(shape)
            && self.bm as u64 <= tiles.next_power_of_two().max(64)
            && self.bn <= shape.kg().next_power_of_two().max(64)
            && self.bk <= shape.cg().next_power_of_two().max(BK)
    }

    /// The GEMMs as the coop family counts its products (padding included, over how well
    /// each chunk's dispatch fills the GPU), plus wgemm's account of the workspaces'
    /// round trips, the transforms, the outputs and the passes.
    fn cost(&self, shape: &ConvShape) -> f64 {
        let t = self.tiling();
        let Some(chunking) = t.chunking(shape, MAX_WORKSPACE) else {
            return f64::INFINITY;
        };
        let (_, cp, np) = t.padded(shape);
        let tp = chunking.tp * chunking.chunks as u64;
        let fmas = t.p2() as f64 * (tp * np * cp * shape.groups as u64) as f64;
        let parts = self.parts() as f64;
        let per_fma = MMA * self.split as f64 + STAGE * parts * (1.0 / self.bm as f64 + 1.0 / self.bn as f64);
        let workgroups = t.gemm_workgroups(shape, chunking.tp);
        let gemm = fmas * per_fma / parallel_efficiency(workgroups * self.threads() as u64) / multiprocessor_fill(workgroups);
        gemm + t.overhead(shape, chunking)
    }

    fn generate(&self, shape: &ConvShape) -> Result<Kernel> {
        generate(self, shape, MAX_WORKSPACE)
    }

    fn generate_within(&self, shape: &ConvShape, max_workspace: u64) -> Result<Kernel> {
        generate(self, shape, max_workspace)
    }
}

fn generate(v: &WinoCoop, shape: &ConvShape, cap: u64) -> Result<Kernel> {
    let t = v.tiling();
    let scaled = shape.dtype == DType::F32;
    let split = v.split == 3;
    let Passes { mut vars, chunking, tr, gemm, finish, nhwc } = passes(&v.name(), &t, shape, cap, scaled, split, false)?;
    let tp = chunking.tp;
    let p2 = t.p2() as u64;
    let (_, cp, np) = t.padded(shape);
    let groups = shape.groups as u64;
    let threads = v.threads();

    // The transforms of two filters (channels c0, c1) and two patches (tiles t0, t0 + 1),
    // each plane's pair stored as one u32.
    let (sx, sw) = if scaled { (Some("sx"), Some("sw")) } else { (None, None) };
    let mut filter = filter_transform(&tr, "0", sw) + &filter_transform(&tr, "1", sw);
    let mut input = input_transform(&tr, "0", sx, shape.padding_mode, shape.dilation) + &input_transform(&tr, "1", sx, shape.padding_mode, shape.dilation);
    let scales = if scaled { "    let sx = ldexp(1.0, scale_exp(run[0]));\n    let sw = ldexp(1.0, scale_exp(run[1]));" } else { "" };
    // The split pair's lo parts: each part's u32s after its hi parts'.
    // V's offsets in the module's constants, not literals: a size-generic module
    // (`generic`) sets those from the call's sizes.
    let (u_lo, v_lo) = (groups * p2 * np * cp / 2, format!("{groups} * P2 * CP * TP / 2"));
    for xi in 0..p2 {
        let (uq, vq) = (xi * np * cp / 2, format!("{xi} * CP * TP / 2"));
        if split {
            writeln!(filter, "        put_split(dst + {uq}, {u_lo}, u0_{xi}, u1_{xi}, true);").unwrap();
            writeln!(input, "    put_split(dst + {vq}, {v_lo}, v0_{xi}, v1_{xi}, false);").unwrap();
        } else {
            writeln!(filter, "        put_pair(dst + {uq}, u0_{xi}, u1_{xi}, true);").unwrap();
            writeln!(input, "    put_pair(dst + {vq}, v0_{xi}, v1_{xi}, false);").unwrap();
        }
    }
    // V's order: tile-major for channels-last x (the input transform reads x and writes V
    // along channels), channel-major for NCHW x (both along tiles).
    let tile_major = nhwc;
    let patches = patch_pairs(tile_major);

    // The GEMM: 16-byte slots of each step, V along tiles ([c][tile]) or channels ([tile][c])
    // and U along channels.
    let a_slots = v.bm * v.bk / 8 / threads;
    let b_slots = v.bn * v.bk / 8 / threads;
    let mut setup = String::new();
    let mut code = SlotCode::default();
    // Per slot a register per part of the split pair (hi, then lo `lo` 16-byte elements on).
    let parts: &[(&str, &str, bool)] = if split { &[("", "hi", false), ("l", "lo", true)] } else { &[("", "hi", false)] };
    for i in 0..a_slots {
        let q = format!("(lid + {})", i * threads);
        let (index, at) = if tile_major {
            writeln!(setup, "    let am{i} = {q} / (BK / 8);\n    let ak{i} = {q} % (BK / 8) * 8;").unwrap();
            (format!("a_src + (am{i} * CP + k_next + ak{i}) / 8"), format!("(u32(am{i}) * LDA + u32(ak{i})) / 4u"))
        } else {
            writeln!(setup, "    let ak{i} = {q} / (BM / 8);\n    let am{i} = {q} % (BM / 8) * 8;").unwrap();
            (format!("a_src + (k_next + ak{i}) * (TP / 8) + am{i} / 8"), format!("(u32(ak{i}) * LDA + u32(am{i})) / 4u"))
        };
        code.slot(&mut setup, parts, &format!("pa{i}"), "a", |off| format!("bitcast<vec4<u32>>(ws[{off}{index}])"), &at, &format!("({v_lo}) / 4"));
    }
    for i in 0..b_slots {
        writeln!(setup, "    let bn{i} = (lid + {}) / (BK / 8);", i * threads).unwrap();
        writeln!(setup, "    let bk{i} = (lid + {}) % (BK / 8) * 8;", i * threads).unwrap();
        let at = format!("(u32(bn{i}) * LDB + u32(bk{i})) / 4u");
        code.slot(&mut setup, parts, &format!("pb{i}"), "b", |off| format!("uw[{off}b_src + (bn{i} * CP + k_next + bk{i}) / 8]"), &at, &(u_lo / 4).to_string());
    }
    let SlotCode { fetch, stage } = code;
    let (tm, tn) = (v.tm(), v.tn());
    let mut acc = String::new();
    // M's stride and index as values of their own: naga's SPIR-V writer leaves a store's
    // argument expressions unemitted where they read memory (a size-generic module's sizes,
    // `generic`).
    let mut store = format!("    let m_stride = u32({}) / 4u;\n", if nhwc { "NP" } else { "TP" });
    // M follows V's parts in `ws`, the correction terms' after the products' (every
    // plane's); `ws` holds vec4s, so M's offsets and strides count fours.
    let m_off = u64::from(v.parts()) * groups * p2 * cp * tp / 2;
    let cor = format!("MOFF + {groups} * P2 * MSX");
    let sums: Vec<(&str, &str)> = if split { vec![("acc", "MOFF"), ("cor", &cor)] } else { vec![("acc", "MOFF")] };
    for i in 0..tm {
        for j in 0..tn {
            let (row, col) = (format!("u32(m0) + wm + {}u", 16 * i), format!("u32(n0) + wn + {}u", 16 * j));
            for &(sum, at) in &sums {
                writeln!(acc, "    var {sum}{i}_{j}: MatC;").unwrap();
                let put = if nhwc {
                    format!("{{ let m_at = (u32({at}) + m_dst + ({row}) * u32(NP) + {col}) / 4u; coopStoreT({sum}{i}_{j}, &ws[m_at], m_stride); }}")
                } else {
                    format!("{{ let m_at = (u32({at}) + m_dst + ({col}) * u32(TP) + {row}) / 4u; coopStore({sum}{i}_{j}, &ws[m_at], m_stride); }}")
                };
                writeln!(store, "    {put}").unwrap();
            }
        }
    }
    // V staged as stored: BK rows of BM tiles, or BM rows of BK channels.
    let (a_rows, lda, a_src) = if tile_major {
        (v.bm, v.bk + PAD, "(VOFF + (gx * TP + m0) * CP) / 8")
    } else {
        (v.bk, v.bm + PAD, "(VOFF + gx * CP * TP + m0) / 8")
    };
    let f_jobs = groups * np * cp / 2;
    let f_blocks = f_jobs.div_ceil(256);
    let v_jobs = groups * cp * tp / 2;
    let v_blocks = v_jobs.div_ceil(256);
    vars.extend([
        ("F_JOBS", f_jobs.to_string()),
        ("V_JOBS", v_jobs.to_string()),
        ("V_BLOCKS", v_blocks.to_string()),
        ("MOFF", m_off.to_string()),
        ("SUBGROUPS", (v.sgm * v.sgn).to_string()),
        ("SPLIT", v.split.to_string()),
        ("SGM", v.sgm.to_string()),
        ("WM", (16 * tm).to_string()),
        ("WN", (16 * tn).to_string()),
        ("TM", tm.to_string()),
        ("TN", tn.to_string()),
        ("LDA", lda.to_string()),
        ("LDB", (v.bk + PAD).to_string()),
        ("A_TILE", (a_rows * lda / 4).to_string()),
        ("A_SRC", a_src.to_string()),
        ("B_TILE", (v.bn * (v.bk + PAD) / 4).to_string()),
        ("LO_TILES", if split { format!("var<workgroup> a_lo: array<vec4<f16>, {}>;\nvar<workgroup> b_lo: array<vec4<f16>, {}>;", a_rows * lda / 4, v.bn * (v.bk + PAD) / 4) } else { String::new() }),
        ("THREADS", threads.to_string()),
        ("SCALES", scales.to_string()),
        ("FILTER_TRANSFORM", filter),
        ("PATCHES", patches),
        ("INPUT_TRANSFORM", input),
        ("SETUP", setup),
        ("ACC_DECL", acc),
        ("FETCH", fetch),
        ("STAGE", stage),
        ("INNER", coop::gemm_step(v.bm, v.bn, v.bk, v.sgm, v.sgn, tile_major, v.split)),
        ("STORE", store),
    ]);
    let mut kernel = Kernel::plain(render(WinoCoop::TEMPLATE, &vars)?, gemm);
    kernel.prologue = Some(v_blocks + f_blocks);
    // U's workgroups, the prologue's last: left out where U is kept with resident weights.
    kernel.w_blocks = f_blocks;
    kernel.workspace = t.workspace(shape, tp);
    kernel.finish = Some(finish);
    kernel.chunks = chunking.chunks;
    // The max pass runs before the prologue, which scales as it transforms.
    kernel.scaled = scaled;
    kernel.prescale = scaled;
    Ok(kernel)
}

/// The GEMM's load slots as WGSL: their 16-byte loads of the next step, and their unpacking
/// into the staged tiles.
#[derive(Default)]
struct SlotCode {
    fetch: String,
    stage: String,
}

impl SlotCode {
    /// Slot `reg`'s register per part of the split pair (`parts`: suffix, staged tile's part,
    /// whether it is the lo part), declared in `setup`: loaded by `load(offset)`, the lo part
    /// `lo_elems` 16-byte elements on, unpacked into `tile`'s part at `at`.
    #[allow(clippy::too_many_arguments)]
    fn slot(&mut self, setup: &mut String, parts: &[(&str, &str, bool)], reg: &str, tile: &str, load: impl Fn(&str) -> String, at: &str, lo_elems: &str) {
        for &(suffix, part, lo) in parts {
            let off = if lo { format!("{lo_elems} + ") } else { String::new() };
            writeln!(setup, "    var {reg}{suffix}: vec4<u32>;").unwrap();
            writeln!(self.fetch, "    {reg}{suffix} = {};", load(&off)).unwrap();
            writeln!(self.stage, "        {{\n            let at = {at};").unwrap();
            coop::unpack_at(&mut self.stage, "            ", &format!("{tile}_{part}"), &format!("{reg}{suffix}"));
            self.stage.push_str("        }\n");
        }
    }
}

/// The prologue's patch pair: its job decoded (`i`: channels c0, c0 + 1 of one tile for a
/// tile-major V, tiles t0, t0 + 1 of one channel for a channel-major one, neighbouring
/// invocations taking neighbouring pairs), each patch's origin in x and validity (lane 0 and
/// 1, as `input_transform` reads them), and `dst`, the pair's u32 in plane 0 of V.
fn patch_pairs(tile_major: bool) -> String {
    let mut s = String::new();
    let (tile, chan) = if tile_major {
        s.push_str("    let c0 = 2 * (i % (CP / 2));\n    let t = (i / (CP / 2)) % TP;\n    let g = i / (CP / 2 * TP);\n");
        s.push_str("    let dst = (VOFF + (g * P2 * TP + t) * CP + c0) / 2;   // u32s; plane xi is TP * CP / 2 on\n");
        (["t", "t"], ["c0", "c0 + 1"])
    } else {
        s.push_str("    let t0 = 2 * (i % (TP / 2));\n    let c = (i / (TP / 2)) % CP;\n    let g = i / (TP / 2 * CP);\n");
        s.push_str("    let dst = (VOFF + (g * P2 * CP + c) * TP + t0) / 2;   // u32s; plane xi is CP * TP / 2 on\n");
        (["t0", "t0 + 1"], ["c", "c"])
    };
    for lane in 0..2 {
        let (t, c) = (tile[lane], chan[lane]);
        writeln!(s, "    let tg{lane} = chunk_base() + {t};").unwrap();
        writeln!(s, "    let tok{lane} = tg{lane} < TILES && {c} < CG;").unwrap();
        writeln!(s, "    let o{lane} = tile_origin(min(tg{lane}, TILES - 1));").unwrap();
        writeln!(s, "    let ih{lane} = o{lane}.y - PH;\n    let iw{lane} = o{lane}.z - PW;").unwrap();
        writeln!(s, "    let xb{lane} = o{lane}.x * XSN + (g * CG + min({c}, CG - 1)) * XSC + ih{lane} * XSH + iw{lane} * XSW;").unwrap();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{Layout, Padding};

    fn shape(x: [usize; 4], w: [usize; 4], layout: Layout) -> ConvShape {
        ConvShape::new(x, w, (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap().with_layout(layout).with_dtype(DType::F16)
    }

    /// Every variant's WGSL validates with naga (lavapipe cannot run it) in both layouts, in
    /// one chunk and in several, on float16 data and scaled float32 data; other kernels are
    /// refused.
    #[test]
    fn every_variant_validates_and_refuses_what_it_cannot_compute() {
        let small = shape([2, 40, 13, 11], [24, 40, 3, 3], Layout::Nchw);
        let edsr = shape([1, 64, 720, 1280], [64, 64, 3, 3], Layout::Nhwc);
        for v in WinoCoop::space() {
            assert!(v.needs_tensor_cores());
            assert_eq!((v.serves(Precision::High), v.serves(Precision::Highest)), (v.split == 1, v.split == 3), "{}", v.name());
            for s in [small, small.with_layout(Layout::Nhwc), edsr] {
                assert!(v.computes(&s), "{} {}", v.name(), s.label());
                let k = v.generate(&s).unwrap();
                assert!(k.workspace.iter().all(|&b| b <= MAX_WORKSPACE));
                if let Err(e) = crate::codegen::validate(&k.source) {
                    panic!("{} on {}: {e}", v.name(), s.label());
                }
            }
            assert!(v.generate(&edsr).unwrap().chunks > 1);
            for s in [small.with_dtype(DType::F32), edsr.with_dtype(DType::F32)] {
                let k = v.generate(&s).unwrap();
                assert!(k.scaled && k.prescale && k.source.contains("scale_exp(run[0])"), "{}", v.name());
                if let Err(e) = crate::codegen::validate(&k.source) {
                    panic!("{} on {}: {e}", v.name(), s.label());
                }
            }
            assert!(!v.generate(&small).unwrap().scaled);
            let five = ConvShape::new([2, 40, 13, 11], [24, 40, 5, 5], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
                .unwrap()
                .with_dtype(DType::F16);
            assert!(!v.computes(&five) && v.generate(&five).is_err());
            let name = v.name();
            assert_eq!(name.parse::<super::super::Variant>().unwrap().to_string(), name);
        }
    }

    /// U and V take half of wgemm's bytes per value and M as many; the split pair twice
    /// each (hi and lo parts, products and correction terms).
    #[test]
    fn workspaces_hold_f16_transforms_and_f32_products() {
        let s = shape([3, 37, 11, 7], [41, 37, 3, 3], Layout::Nchw);
        for split in [1, 3] {
            let v = WinoCoop { m: 2, bm: 64, bn: 64, bk: 32, sgm: 2, sgn: 2, split };
            // OH 11, OW 7: 6 x 4 tiles per image, 72 in all -> TP 128; CP 64, NP 64.
            assert_eq!(v.tiling().padded(&s), (128, 64, 64));
            let k = v.generate(&s.with_dtype(DType::F32)).unwrap();
            let parts = if split == 3 { 2 } else { 1 };
            // V and M in binding 5, U alone in binding 6 (its workgroups the prologue's last).
            assert_eq!(k.workspace, [parts * 16 * 64 * 128 * (2 + 4), parts * 16 * 64 * 64 * 2]);
            assert_eq!(k.workgroups, 2 * 16);
            assert_eq!(k.prologue, Some((64 * 64 / 2u64).div_ceil(256) + (64 * 128 / 2u64).div_ceil(256)));
            assert_eq!(k.w_blocks, (64 * 64 / 2u64).div_ceil(256));
            assert_eq!(k.source.contains("put_split(dst"), split == 3);
            assert_eq!(k.source.contains("coopStore(cor0_0"), split == 3);
        }
    }
}
