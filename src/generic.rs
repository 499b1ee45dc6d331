//! Size-generic kernels: one module for every batch, height and width of a layer.
//!
//! The generators bake a problem's whole shape into module-scope `const` declarations. Two
//! sizes of one layer (the same problem but for N, H and W) give sources that differ only in
//! the values of some of those constants (the sizes, strides and grid counts that follow from
//! N, H and W); everything else is the same text. The generic module is the source of one
//! size with those constants, and every constant computed from them, replaced by reads of
//! a small buffer of the call's sizes (binding 7, the epilogue's residual, in kernels that
//! take none; else binding 4, the run words, in kernels that need none). A call of another
//! size uses it only where its own generated source differs from the module's in those
//! constants' values alone, which it reads from that source: the kernel computes exactly
//! what the exact-size kernel would.

use crate::kernels::Variant;
use crate::params::ConvShape;
use crate::precision::Precision;
use crate::kernel_cache::{KernelCache, DEFAULT_KERNELS, DEFAULT_PER_LAYER};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A module-scope `const NAME: TY = EXPR;` line.
#[derive(Clone, Debug, PartialEq)]
struct Decl {
    line: usize,
    name: String,
    ty: String,
    expr: String,
}

/// A declaration line, comment and all: `const X: i32 = 5;  // why`.
fn decl_of_line(line: usize, text: &str) -> Option<Decl> {
    let code = text.split("//").next()?.trim_end();
    let rest = code.strip_prefix("const ")?;
    let (name, rest) = rest.split_once(':')?;
    let (ty, rest) = rest.split_once('=')?;
    let expr = rest.trim().strip_suffix(';')?.trim();
    Some(Decl { line, name: name.trim().to_string(), ty: ty.trim().to_string(), expr: expr.to_string() })
}

/// The name a function-scope `const NAME...` line (indented) declares.
fn local_const(line: &str) -> Option<String> {
    let rest = line.strip_prefix(char::is_whitespace)?.trim_start().strip_prefix("const ")?;
    let (name, _) = rest.split_once(':').or_else(|| rest.split_once('='))?;
    Some(name.trim().to_string())
}

/// An integer literal's value as the buffer's word: i32, or a u32's bits.
fn word(expr: &str) -> Option<i32> {
    let e = expr.trim();
    let v = e.strip_suffix('u').or_else(|| e.strip_suffix('i')).unwrap_or(e).parse::<i64>().ok()?;
    i32::try_from(v).or_else(|_| u32::try_from(v).map(|u| u as i32)).ok()
}

/// A source's text with constants' values and comment lines left out: two sizes of a layer
/// share a generic module where their skeletons agree.
pub fn skeleton(source: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (i, line) in source.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        match decl_of_line(i, line) {
            Some(d) => (d.name, d.ty).hash(&mut h),
            None => line.hash(&mut h),
        }
    }
    h.finish()
}

/// Two comment lines (the header names the shape).
fn comments(x: &str, y: &str) -> bool {
    x.trim_start().starts_with("//") && y.trim_start().starts_with("//")
}

/// The byte ranges where `text` uses `name` as a whole identifier.
fn occurrences<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (usize, usize)> + 'a {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).map(|(start, _)| (start, start + name.len())).filter(move |&(start, end)| {
        text[..start].chars().next_back().is_none_or(|c| !ident(c)) && text[end..].chars().next().is_none_or(|c| !ident(c))
    })
}

/// Whether `text` uses `name` as a whole identifier.
fn mentions(text: &str, name: &str) -> bool {
    occurrences(text, name).next().is_some()
}

/// Replaces every whole-identifier `name` in `text` by `with`.
fn substitute(text: &str, name: &str, with: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for (start, end) in occurrences(text, name) {
        out.push_str(&text[from..start]);
        out.push_str(with);
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

/// A module for every size of a layer, made from one size's source.
#[derive(Clone, Debug)]
pub struct Generic {
    /// The WGSL to compile.
    pub source: String,
    /// The binding the sizes' buffer takes: 7 (the residual's, read-only) or 4 (the run
    /// words').
    pub binding: u32,
    /// The constants read from the buffer, in its order.
    pub names: Vec<String>,
    /// The source it was made from, for checking other sizes against, and its values of
    /// `names`.
    template: String,
    values: Vec<i32>,
}

const DIMS: &str = "convtune_dims";

impl Generic {
    /// The generic module of `exact` (one size's source), given `others` (other sizes'):
    /// `None` where none of them has its skeleton, where a constant that differs is not a
    /// plain integer, or where one is needed at compile time (an array size, the workgroup
    /// size) or bindings 7 and 4 are both taken.
    pub fn of(exact: &str, others: &[&str]) -> Option<Generic> {
        let a: Vec<&str> = exact.lines().collect();
        // The sizes come in binding 7, read-only, where the kernel takes no residual: naga
        // counts a value read there at a uniform index as uniform, so kernels whose barriers
        // and tensor-core steps follow size-dependent branches (a workgroup's `return` past
        // the last tile) stay valid. Else in binding 4 (run words), where the kernel needs
        // none: a read there is not uniform, which the FMA families do not need.
        let binding = [7, 4].into_iter().find(|b| !exact.contains(&format!("@binding({b})")))?;
        // Every constant that differs from any other size's whose source has the same
        // skeleton (sizes where a generator picks other code, e.g. vector stores where the
        // pixel count allows them, have modules of their own).
        let mut base: Vec<Decl> = Vec::new();
        let mut compared = false;
        let form = skeleton(exact);
        for other in others.iter().filter(|o| skeleton(o) == form) {
            compared = true;
            let b: Vec<&str> = other.lines().collect();
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                if x == y || comments(x, y) || base.iter().any(|d| d.line == i) {
                    continue;
                }
                let (dx, dy) = (decl_of_line(i, x)?, decl_of_line(i, y)?);
                if dx.name != dy.name || dx.ty != dy.ty || !matches!(dx.ty.as_str(), "i32" | "u32") {
                    return None;
                }
                word(&dx.expr)?;
                word(&dy.expr)?;
                base.push(dx);
            }
        }
        if !compared {
            return None;
        }
        base.sort_by_key(|d| d.line);
        if base.is_empty() {
            return None;
        }
        // Constants computed from them are computed at run time too.
        let decls: Vec<Decl> = a.iter().enumerate().filter_map(|(i, l)| decl_of_line(i, l)).collect();
        let mut runtime: HashSet<String> = base.iter().map(|d| d.name.clone()).collect();
        let mut derived: Vec<Decl> = Vec::new();
        loop {
            let more: Vec<Decl> = decls
                .iter()
                .filter(|d| !runtime.contains(&d.name) && runtime.iter().any(|n| mentions(&d.expr, n)))
                .cloned()
                .collect();
            if more.is_empty() {
                break;
            }
            for d in more {
                runtime.insert(d.name.clone());
                derived.push(d);
            }
        }
        // A function's constants computed from them become `let`s (`local`).
        let mut local: HashSet<String> = HashSet::new();
        loop {
            let more: Vec<String> = a
                .iter()
                .filter_map(|l| local_const(l).filter(|name| !local.contains(name) && runtime.iter().chain(&local).any(|n| mentions(l, n))))
                .collect();
            if more.is_empty() {
                break;
            }
            local.extend(more);
        }
        // Nothing that must be known at compile time may use them.
        let compile_time = |l: &str| l.contains("var<workgroup>") || l.contains("@workgroup_size") || l.contains("array<");
        if a.iter().filter(|l| compile_time(l)).any(|l| runtime.iter().chain(&local).any(|n| mentions(l, n))) {
            return None;
        }
        // Derived constants in an order that defines each after what it reads, each the
        // expression of the buffer's words it comes to.
        let mut set: HashMap<String, String> =
            base.iter().enumerate().map(|(i, d)| (d.name.clone(), format!("{}({DIMS}[{i}])", d.ty))).collect();
        let mut left = derived;
        let mut removed: Vec<usize> = base.iter().map(|d| d.line).collect();
        while !left.is_empty() {
            let (ready, wait): (Vec<Decl>, Vec<Decl>) = left
                .into_iter()
                .partition(|d| runtime.iter().filter(|n| mentions(&d.expr, n)).all(|n| set.contains_key(n)));
            if ready.is_empty() {
                return None;
            }
            for d in &ready {
                let expr = set.iter().fold(d.expr.clone(), |e, (n, with)| substitute(&e, n, with));
                set.insert(d.name.clone(), format!("{}({expr})", d.ty));
                removed.push(d.line);
            }
            left = wait;
        }
        let mut lines: Vec<String> = Vec::with_capacity(a.len() + 2);
        for (i, l) in a.iter().enumerate() {
            if removed.contains(&i) {
                lines.push(format!("// {} comes from {DIMS}", decl_of_line(i, l)?.name));
            } else if runtime.iter().chain(&local).any(|n| mentions(l, n)) {
                let l = set.iter().fold(l.to_string(), |l, (n, with)| substitute(&l, n, with));
                lines.push(match local_const(&l) {
                    Some(name) if local.contains(&name) => l.replacen("const ", "let ", 1),
                    _ => l,
                });
            } else {
                lines.push(l.to_string());
            }
        }
        lines.push(String::new());
        let access = if binding == 7 { "read" } else { "read_write" };
        lines.push(format!("// Size-generic: the call's sizes.\n@group(0) @binding({binding}) var<storage, {access}> {DIMS}: array<u32>;"));
        let source = hoist_reads(&lines, base.len()).join("\n") + "\n";
        let values = base.iter().map(|d| word(&d.expr)).collect::<Option<_>>()?;
        Some(Generic { source, binding, names: base.into_iter().map(|d| d.name).collect(), template: exact.to_string(), values })
    }

    /// The buffer's values for a call whose exact-size source is `exact`: `None` where that
    /// source differs from the template in anything but the values of `names`.
    pub fn values(&self, exact: &str) -> Option<Vec<i32>> {
        let (a, b): (Vec<&str>, Vec<&str>) = (self.template.lines().collect(), exact.lines().collect());
        if a.len() != b.len() {
            return None;
        }
        // Those equal to the template's keep its value.
        let mut values = self.values.clone();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if x == y || comments(x, y) {
                continue;
            }
            let (dx, dy) = (decl_of_line(i, x)?, decl_of_line(i, y)?);
            let at = self.names.iter().position(|n| *n == dx.name && dx.name == dy.name)?;
            values[at] = word(&dy.expr)?;
        }
        Some(values)
    }
}

/// `lines` with each function's reads of the sizes' buffer made once, at its start
/// (`let convtune_dim3 = convtune_dims[3];`), not at every use: a read of a storage buffer
/// between stores to another may not be merged with the last by a compiler that cannot rule
/// out their aliasing. A value read at a constant index of the read-only binding at a
/// function's start is as uniform as the read (barriers after size-dependent branches stay
/// valid).
fn hoist_reads(lines: &[String], words: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(lines.len() + 16);
    let mut i = 0;
    while i < lines.len() {
        let l = &lines[i];
        if !(l.starts_with("fn ") || l.starts_with("@compute")) {
            out.push(l.clone());
            i += 1;
            continue;
        }
        // The signature up to the line that opens the body, then the body up to its closing
        // brace at column 0.
        let Some(open) = (i..lines.len()).find(|&j| lines[j].contains('{')) else {
            out.extend(lines[i..].iter().cloned());
            break;
        };
        // A body on the signature's line (a one-line function) keeps its reads.
        if !lines[open].trim_end().ends_with('{') {
            out.extend(lines[i..=open].iter().cloned());
            i = open + 1;
            continue;
        }
        let Some(close) = (open + 1..lines.len()).find(|&j| lines[j].starts_with('}')) else {
            out.extend(lines[i..].iter().cloned());
            break;
        };
        out.extend(lines[i..=open].iter().cloned());
        let body = &lines[open + 1..close];
        let used: Vec<usize> = (0..words).filter(|w| body.iter().any(|b| b.contains(&format!("{DIMS}[{w}]")))).collect();
        for w in &used {
            out.push(format!("    let {DIMS}{w} = {DIMS}[{w}];"));
        }
        for b in body {
            out.push(used.iter().fold(b.clone(), |b, w| b.replace(&format!("{DIMS}[{w}]"), &format!("{DIMS}{w}"))));
        }
        out.push(lines[close].clone());
        i = close + 1;
    }
    out
}

/// Distinct sizes a layer must meet before its new sizes run a size-generic module:
/// `CONVTUNE_GENERIC_AFTER` (0: never), else 16, the sizes of one layer the kernel cache
/// keeps: a layer kept at a few sizes (a detection head on five scales at three batch sizes)
/// keeps its exact-size kernels, which fold every size into their index arithmetic.
pub fn after() -> usize {
    std::env::var("CONVTUNE_GENERIC_AFTER").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_AFTER)
}

pub const DEFAULT_AFTER: usize = 16;

/// The layer of a shape: the problem but for its batch, height and width.
pub fn layer_of(shape: &ConvShape) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ConvShape { n: 0, h: 0, w: 0, ..*shape }.hash(&mut h);
    h.finish()
}

/// A size's bucket: the power of two of its output pixels, N x OH x OW. Past the switch-over
/// the first size of each bucket chooses (is tuned, in `auto` mode) for the bucket's others:
/// a tile that suits 200 pixels may not suit 200,000.
pub fn bucket(shape: &ConvShape) -> u32 {
    let pixels = shape.n as u64 * shape.oh() as u64 * shape.ow() as u64;
    64 - pixels.max(1).leading_zeros()
}

/// Sizes kept per layer (to find another size to compare with) and layers tracked at most.
const SIZES_KEPT: usize = 8;
const LAYERS_KEPT: usize = 4096;

/// A generic module's key: variant, layer, workspace bound and source skeleton.
type ModuleKey = (Variant, u64, u64, u64);

/// Per engine: the sizes each layer has met, each (variant, layer, code form)'s generic
/// module `M` (`None`: it has none), and the variant each bucket of a layer's new sizes runs
/// once the layer switched over.
pub struct Layers<M> {
    sizes: Mutex<HashMap<u64, (usize, Vec<ConvShape>)>>,
    /// Bounded as the kernel cache is: each holds a compiled pipeline.
    modules: KernelCache<ModuleKey, M>,
    /// Keys tried that have no module (compiled per size).
    refused: Mutex<HashSet<ModuleKey>>,
    variants: Mutex<HashMap<(u64, Precision, u32), Variant>>,
}

impl<M> Default for Layers<M> {
    fn default() -> Self {
        Layers {
            sizes: Mutex::default(),
            modules: KernelCache::new(DEFAULT_KERNELS, DEFAULT_PER_LAYER, |k: &ModuleKey| k.1),
            refused: Mutex::default(),
            variants: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<M> Layers<M> {
    /// Notes that a call meets `shape` (where it chooses its kernel: a tuned size's kernel
    /// is compiled by the tuner, not on a kernel-cache miss).
    pub fn record(&self, shape: &ConvShape) {
        self.note(shape, 0);
    }

    /// Notes that `shape` runs; whether its layer has met more than `after` sizes (then it
    /// keeps at least one other, which a generic module is made with: `kept`).
    pub fn note(&self, shape: &ConvShape, after: usize) -> bool {
        let mut sizes = lock(&self.sizes);
        if sizes.len() >= LAYERS_KEPT {
            sizes.clear();
        }
        let (count, kept) = sizes.entry(layer_of(shape)).or_default();
        if !kept.contains(shape) {
            *count += 1;
            if kept.len() == SIZES_KEPT {
                kept.remove(0);
            }
            kept.push(*shape);
        }
        after > 0 && *count > after
    }

    /// The sizes of `shape`'s layer kept (the last few met).
    pub fn kept(&self, shape: &ConvShape) -> Vec<ConvShape> {
        lock(&self.sizes).get(&layer_of(shape)).map_or_else(Vec::new, |(_, k)| k.clone())
    }

    /// Whether `shape`'s layer has met more than `after` sizes, `shape` counted.
    pub fn switched(&self, shape: &ConvShape, after: usize) -> bool {
        let sizes = lock(&self.sizes);
        let (count, kept) = sizes.get(&layer_of(shape)).map_or((0, None), |(c, k)| (*c, Some(k)));
        let new = kept.is_none_or(|k| !k.contains(shape));
        after > 0 && count + new as usize > after
    }

    /// The module of `variant` for `shape`'s layer and source skeleton, if one was tried.
    pub fn module(&self, variant: &Variant, shape: &ConvShape, workspace: u64, skeleton: u64) -> Option<Option<Arc<M>>> {
        let key = (*variant, layer_of(shape), workspace, skeleton);
        match self.modules.get(&key) {
            Some(m) => Some(Some(m)),
            None => lock(&self.refused).contains(&key).then_some(None),
        }
    }

    pub fn keep_module(&self, variant: &Variant, shape: &ConvShape, workspace: u64, skeleton: u64, module: Option<Arc<M>>) {
        let key = (*variant, layer_of(shape), workspace, skeleton);
        match module {
            Some(m) => self.modules.insert(key, m),
            None => {
                let mut refused = lock(&self.refused);
                if refused.len() >= LAYERS_KEPT {
                    refused.clear();
                }
                refused.insert(key);
            }
        }
    }

    /// Drops the module of (variant, layer, code form) unless a bucket of the layer runs the
    /// variant: a bucket's timing compiles its finalists, and only its pick need stay.
    pub fn drop_module(&self, variant: &Variant, shape: &ConvShape, workspace: u64, skeleton: u64) {
        let layer = layer_of(shape);
        if lock(&self.variants).iter().any(|((l, ..), v)| *l == layer && v == variant) {
            return;
        }
        self.modules.remove(&(*variant, layer, workspace, skeleton));
    }

    /// Size-generic modules held (the least recently used past the kernel cache's default
    /// limits are dropped, to be made again when next needed).
    pub fn modules(&self) -> usize {
        self.modules.stats().entries
    }

    /// The variant the layer's new sizes of `shape`'s bucket run, once one was chosen there
    /// past the switch-over.
    pub fn variant(&self, shape: &ConvShape, precision: Precision) -> Option<Variant> {
        lock(&self.variants).get(&(layer_of(shape), precision, bucket(shape))).copied()
    }

    /// Keeps `variant`, chosen for `shape`, as its bucket's where the layer has switched over.
    pub fn keep_variant(&self, shape: &ConvShape, precision: Precision, variant: Variant, after: usize) {
        if self.switched(shape, after) {
            self.variants().entry((layer_of(shape), precision, bucket(shape))).or_insert(variant);
        }
    }

    /// Makes `variant`, tuned for `shape`, its bucket's where the layer has switched over,
    /// in place of what ran while it was tuned (a detached run's interim or fallback kernel,
    /// the background mode's default pick).
    pub fn prefer_variant(&self, shape: &ConvShape, precision: Precision, variant: Variant, after: usize) {
        if self.switched(shape, after) {
            self.variants().insert((layer_of(shape), precision, bucket(shape)), variant);
        }
    }

    /// The buckets' variants, for a new entry: a few bytes each, cleared past
    /// `LAYERS_KEPT` layers' worth of buckets as `sizes` is.
    fn variants(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, Precision, u32), Variant>> {
        let mut variants = lock(&self.variants);
        if variants.len() >= 8 * LAYERS_KEPT {
            variants.clear();
        }
        variants
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "const H: i32 = 10;\nconst K: i32 = 8;  // channels\nconst HK: i32 = H * K;\nconst N: u32 = 2u;\n@compute @workgroup_size(64, 1, 1)\nfn main(\n    @builtin(local_invocation_id) lid: vec3<u32>,\n) {\n    let a = HK + i32(N);\n}\n";

    #[test]
    fn sizes_become_reads_of_the_call_words() {
        let b = A.replace("H: i32 = 10", "H: i32 = 12").replace("N: u32 = 2u", "N: u32 = 3u");
        let g = Generic::of(A, &[&b]).unwrap();
        assert_eq!(g.names, ["H", "N"]);
        assert!(!g.source.contains("const H:") && !g.source.contains("const HK:"));
        assert!(g.source.contains("const K: i32 = 8;"));
        // Derived ones inline what they are computed from (reads at a uniform index, made
        // once at the function's start).
        assert!(g.source.contains(") {\n    let convtune_dims0 = convtune_dims[0];\n    let convtune_dims1 = convtune_dims[1];\n"), "{}", g.source);
        assert!(g.source.contains("let a = i32(i32(convtune_dims0) * K) + i32(u32(convtune_dims1));"), "{}", g.source);
        crate::codegen::validate(&g.source).unwrap();
        assert!(g.source.contains("@group(0) @binding(7) var<storage, read> convtune_dims: array<u32>;"));
        assert_eq!(g.values(&b), Some(vec![12, 3]));
        assert_eq!(g.values(A), Some(vec![10, 2]));
        // Another difference than a size's value: not this module's.
        assert_eq!(g.values(&b.replace("HK + i32(N)", "HK - i32(N)")), None);
        assert_eq!(g.values(&b.replace("K: i32 = 9", "K: i32 = 9").replace("K: i32 = 8", "K: i32 = 9")), None);
        // A kernel that reads the epilogue's residual has binding 7 taken: binding 4 then,
        // unless that is taken too.
        let z = format!("{A}@group(0) @binding(7) var<storage, read> z: array<f32>;\n");
        let g = Generic::of(&z, &[&z.replace("H: i32 = 10", "H: i32 = 12")]).unwrap();
        assert_eq!(g.binding, 4);
        assert!(g.source.contains("@group(0) @binding(4) var<storage, read_write> convtune_dims: array<u32>;"));
        let both = format!("{z}@group(0) @binding(4) var<storage, read_write> run: array<u32, 4>;\n");
        assert!(Generic::of(&both, &[&both.replace("H: i32 = 10", "H: i32 = 12")]).is_none());
    }

    /// Each function reads a size once, at its start; a one-line function keeps its read.
    #[test]
    fn reads_are_made_once_per_function() {
        let lines: Vec<String> = [
            "fn one(i: i32) -> i32 { return i * i32(convtune_dims[1]); }",
            "fn two(",
            "    i: i32,",
            ") -> i32 {",
            "    let a = i32(convtune_dims[0]) + i;",
            "    return a * i32(convtune_dims[0]);",
            "}",
            "const K: i32 = 3;",
        ]
        .map(String::from)
        .to_vec();
        let out = hoist_reads(&lines, 2).join("\n");
        assert_eq!(
            out,
            "fn one(i: i32) -> i32 { return i * i32(convtune_dims[1]); }\nfn two(\n    i: i32,\n) -> i32 {\n    let convtune_dims0 = convtune_dims[0];\n    let a = i32(convtune_dims0) + i;\n    return a * i32(convtune_dims0);\n}\nconst K: i32 = 3;"
        );
    }

    #[test]
    fn a_function_constant_computed_from_sizes_becomes_a_let() {
        let a = A.replace("    let a = HK + i32(N);", "    const T: i32 = (H + 3) / 4;\n    const U: i32 = T * 2;\n    const V: i32 = K * 2;\n    let a = U + V;");
        let b = a.replace("H: i32 = 10", "H: i32 = 12");
        let g = Generic::of(&a, &[&b]).unwrap();
        assert!(g.source.contains("    let T: i32 = (i32(convtune_dims0) + 3) / 4;\n    let U: i32 = T * 2;\n    const V: i32 = K * 2;"), "{}", g.source);
        crate::codegen::validate(&g.source).unwrap();
        // Not where one must be known at compile time.
        let c = a.replace("    let a = U + V;", "    var t: array<f32, U>;\n    let a = U + V;");
        assert!(Generic::of(&c, &[&c.replace("H: i32 = 10", "H: i32 = 12")]).is_none());
    }

    #[test]
    fn modules_kept_are_bounded_as_kernels_are() {
        use crate::params::Padding;
        let layers: Layers<u32> = Layers::default();
        let v: Variant = "direct_wg64x1_u1_k4w1".parse().unwrap();
        let layer = |c: usize| ConvShape::new([1, c, 9, 9], [4, c, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        for c in 1..=40 {
            for skeleton in 0..20u64 {
                layers.keep_module(&v, &layer(c), 0, skeleton, Some(Arc::new(skeleton as u32)));
            }
        }
        assert_eq!(layers.modules(), crate::kernel_cache::DEFAULT_KERNELS);
        // A layer keeps its most recent; one without a module is remembered as such.
        assert_eq!(layers.module(&v, &layer(40), 0, 19).flatten().as_deref(), Some(&19));
        assert!(layers.module(&v, &layer(40), 0, 0).is_none());
        layers.keep_module(&v, &layer(41), 0, 7, None);
        assert!(matches!(layers.module(&v, &layer(41), 0, 7), Some(None)));
    }

    #[test]
    fn sizes_needed_at_compile_time_refuse() {
        let a = format!("{A}var<workgroup> t: array<f32, HK>;\n");
        let b = a.replace("H: i32 = 10", "H: i32 = 12");
        assert!(Generic::of(&a, &[&b]).is_none());
        assert!(Generic::of(A, &[A]).is_none(), "nothing differs: no generic module");
    }
}

#[cfg(test)]
mod family_tests {
    use super::*;
    use crate::params::{ConvShape, Padding};

    /// The Vulkan backend's translation: naga's SPIR-V writer has failed (panicked) on
    /// modules its validator passed, where a tensor-core store's arguments read memory.
    fn to_spirv(source: &str) -> Result<(), String> {
        let module = naga::front::wgsl::parse_str(source).map_err(|e| e.to_string())?;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .map_err(|e| e.to_string())?;
        let written = std::panic::catch_unwind(|| naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None));
        match written {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the SPIR-V writer panicked".into()),
        }
    }

    /// Every variant that generates on two sizes of a layer: the generic module of one
    /// validates, and the other's values come out of it. Prints which families take it.
    #[test]
    fn generic_modules_of_real_variants_validate() {
        use crate::params::Layout;
        use crate::dtype::DType;
        // 3x3 and 1x1 layers, both layouts, float32 and float16 data; then, for the Winograd
        // families only, a dilated 3x3 and a 5x5.
        let forms = [
            (8, 16, 3, 1, Layout::Nchw, DType::F32),
            (48, 32, 3, 1, Layout::Nhwc, DType::F16),
            (64, 32, 1, 1, Layout::Nchw, DType::F16),
            (32, 64, 1, 1, Layout::Nhwc, DType::F32),
            (32, 32, 3, 2, Layout::Nhwc, DType::F16),
            (16, 32, 5, 1, Layout::Nchw, DType::F32),
        ];
        let mut taken: HashMap<&str, (usize, usize)> = HashMap::new();
        for (v, (c, k, r, d, layout, dtype)) in crate::kernels::all_variants().into_iter().flat_map(|v| forms.map(|f| (v, f))) {
            let pad = d * (r / 2);
            let layer = |n: usize, h: usize, w: usize| ConvShape {
                layout,
                dtype,
                ..ConvShape::new([n, c, h, w], [k, c, r, r], (1, 1), Padding::Explicit(pad as i64, pad as i64), (d as i64, d as i64), 1, Some(k)).unwrap()
            };
            // The FMA direct family, hundreds of variants, on the first form only.
            if v.family() == "direct" && (c, layout) != (forms[0].0, forms[0].4) {
                continue;
            }
            if (d > 1 || r == 5) && !v.family().starts_with('w') {
                continue;
            }
            let (a, b) = (layer(1, 13, 11), layer(2, 21, 17));
            let (Ok(ka), Ok(kb)) = (v.generate(&a), v.generate(&b)) else { continue };
            let e = taken.entry(v.family()).or_default();
            e.1 += 1;
            let Some(g) = Generic::of(&ka.source, &[&kb.source]) else { continue };
            crate::codegen::validate(&g.source).unwrap_or_else(|err| panic!("{v}: {err}\n{}", g.source));
            to_spirv(&g.source).unwrap_or_else(|err| panic!("{v}: {err}"));
            assert!(g.values(&kb.source).is_some(), "{v}");
            e.0 += 1;
        }
        eprintln!("generic modules by family (taken, generated): {taken:?}");
    }
}
