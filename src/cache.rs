//! The on-disk tuning cache: one JSON file of (key, report) entries, shared by every process
//! of the user.
//!
//! A key names everything a tuning result depends on: the adapter and its driver, the
//! convtune version, the kernel generator (templates and generated code) and the variant
//! space, and the problem shape. Entries whose key differs in any of these are kept, but never
//! match, so a file can be shipped between machines and holds results for several adapters.
//!
//! Writers take an exclusive lock on a side file, re-read the cache, merge their entries in
//! and rename a complete new file into place: readers need no lock and always see a whole
//! file, and concurrent writers lose nothing. A file that does not parse, or that an
//! incompatible convtune wrote, is reported as a warning and treated as empty; the next
//! write replaces it (keeping a `.bad` copy).

use crate::device::AdapterDesc;
use crate::error::{Error, Result};
use crate::families::Families;
use crate::precision::Precision;
use crate::params::ConvShape;
use crate::tuner::TuneReport;
use crate::kernels;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

const FORMAT: &str = "convtune-tuning-cache";
/// Bumped when the file layout changes incompatibly; other versions are ignored.
pub const FORMAT_VERSION: u32 = 1;
const FILE_NAME: &str = "tuning.json";

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AdapterKey {
    pub vendor: u32,
    pub device: u32,
    pub name: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
}

impl From<&AdapterDesc> for AdapterKey {
    fn from(d: &AdapterDesc) -> Self {
        AdapterKey {
            vendor: d.vendor,
            device: d.device,
            name: d.name.clone(),
            backend: d.backend.clone(),
            driver: d.driver.clone(),
            driver_info: d.driver_info.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShapeKey {
    /// Every field of the problem, flattened into the key (its data type too).
    #[serde(flatten)]
    pub shape: ConvShape,
}

impl From<&ConvShape> for ShapeKey {
    fn from(s: &ConvShape) -> Self {
        ShapeKey { shape: *s }
    }
}

/// Everything a tuning result depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheKey {
    pub adapter: AdapterKey,
    pub version: String,
    /// sha256 of the WGSL templates.
    pub templates: String,
    /// sha256 of the code generated for every variant on a probe shape: catches generator
    /// changes the templates do not show (about 30 ms, once per process).
    pub codegen: String,
    /// sha256 of the names of every variant in the space.
    pub candidates: String,
    pub shape: ShapeKey,
    /// Entries written before precision modes existed were tuned for "highest".
    #[serde(default)]
    pub precision: Precision,
    /// The families `CONVTUNE_FAMILIES` allowed, comma-separated; absent when it allowed all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub families: Option<String>,
}

fn sha256_hex(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        // Length-prefixed so ("ab", "c") and ("a", "bc") differ.
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn templates_hash() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(|| sha256_hex(&kernels::templates()))
}

pub fn candidates_hash() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(|| {
        let names: Vec<String> = kernels::all_variants().iter().map(|v| v.to_string()).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        sha256_hex(&refs)
    })
}

pub fn codegen_hash() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(|| {
        // Small, but with padding, stride, dilation, groups and bias so every generator
        // branch contributes.
        let probe = ConvShape::new(
            [2, 4, 7, 6],
            [4, 2, 3, 2],
            (2, 1),
            crate::params::Padding::Explicit(1, 1),
            (1, 2),
            2,
            Some(4),
        );
        let mut h = Sha256::new();
        if let Ok(shape) = probe {
            for v in kernels::all_variants() {
                h.update(v.to_string().as_bytes());
                match v.generate(&shape) {
                    Ok(k) => {
                        h.update(k.source.as_bytes());
                        h.update(k.workgroups.to_le_bytes());
                    }
                    Err(e) => h.update(e.to_string().as_bytes()),
                }
            }
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    })
}

impl CacheKey {
    pub fn new(adapter: &AdapterDesc, shape: &ConvShape, precision: Precision, families: &Families) -> Self {
        CacheKey {
            adapter: adapter.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            templates: templates_hash().into(),
            codegen: codegen_hash().into(),
            candidates: candidates_hash().into(),
            shape: shape.into(),
            precision,
            families: families.key(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    pub key: CacheKey,
    pub report: TuneReport,
}

#[derive(Serialize, Deserialize)]
struct FileData {
    format: String,
    format_version: u32,
    entries: Vec<Entry>,
}

/// The format marker alone, read first so a file of another version is recognised as such
/// instead of as corrupt.
#[derive(Deserialize)]
struct Header {
    format: String,
    format_version: u32,
}

/// What reading a cache file gave.
enum Read {
    Missing,
    Good(Vec<Entry>),
    /// Unusable; the message says why.
    Bad(String),
}

fn read_file(path: &Path) -> Read {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Read::Missing,
        Err(e) => return Read::Bad(format!("cannot read tuning cache {}: {e}; ignoring it", path.display())),
    };
    let corrupt = |e: serde_json::Error| {
        Read::Bad(format!("tuning cache {} is corrupt ({e}); ignoring it", path.display()))
    };
    let header: Header = match serde_json::from_str(&text) {
        Ok(h) => h,
        Err(e) => return corrupt(e),
    };
    if header.format != FORMAT || header.format_version != FORMAT_VERSION {
        return Read::Bad(format!(
            "tuning cache {} has format {:?} version {}, this convtune reads {FORMAT:?} version \
             {FORMAT_VERSION}; ignoring it",
            path.display(),
            header.format,
            header.format_version
        ));
    }
    match serde_json::from_str::<FileData>(&text) {
        Ok(data) => Read::Good(data.entries),
        Err(e) => corrupt(e),
    }
}

/// Size and modification time: enough to notice another process rewrote the file.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// What this process knows of one cache file.
#[derive(Default)]
struct Snapshot {
    stamp: Stamp,
    loaded: bool,
    /// Shared, not cloned: a report lists every candidate and lookups happen per call.
    entries: HashMap<CacheKey, Arc<TuneReport>>,
}

impl Snapshot {
    fn absorb(&mut self, entries: Vec<Entry>) {
        for e in entries {
            self.entries.insert(e.key, Arc::new(e.report));
        }
    }
}

/// Snapshots per cache file path; `None` is the in-memory cache used when no directory is
/// available.
static MEMORY: Mutex<Option<HashMap<Option<PathBuf>, Snapshot>>> = Mutex::new(None);

fn with_snapshot<T>(file: &Option<PathBuf>, f: impl FnOnce(&mut Snapshot) -> T) -> T {
    let mut guard = MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    f(map.entry(file.clone()).or_default())
}

/// Forgets every snapshot, so the next lookup reads the files again.
pub fn forget_memory() {
    *MEMORY.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The directory the cache lives in: `CONVTUNE_CACHE_DIR` if set, else the platform's user
/// cache directory. Read at every call, so tests and tools can switch it.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("CONVTUNE_CACHE_DIR") {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => dirs::cache_dir().map(|d| d.join("convtune")),
    }
}

/// An exclusive lock on the cache's lock file, released when dropped (the file is closed).
struct Lock(#[allow(dead_code)] File);

fn lock(file: &Path) -> Result<Lock> {
    let dir = file.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)
        .map_err(|e| Error::Cache(format!("cannot create cache directory {}: {e}", dir.display())))?;
    let lock_path = file.with_extension("json.lock");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::Cache(format!("cannot open lock file {}: {e}", lock_path.display())))?;
    fs4::fs_std::FileExt::lock_exclusive(&f)
        .map_err(|e| Error::Cache(format!("cannot lock {}: {e}", lock_path.display())))?;
    Ok(Lock(f))
}

/// Writes `entries` to `path` through a temporary file in the same directory and a rename,
/// so no reader ever sees a partial file.
fn write_atomic(path: &Path, entries: Vec<Entry>) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let data = FileData { format: FORMAT.into(), format_version: FORMAT_VERSION, entries };
    // Compact: a report lists every candidate, and the file is read whole.
    let json = serde_json::to_vec(&data).map_err(|e| Error::Cache(e.to_string()))?;
    let io = |what: &str, e: std::io::Error| Error::Cache(format!("{what} {}: {e}", path.display()));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tuning-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| io("cannot create a temporary file next to", e))?;
    tmp.write_all(&json).map_err(|e| io("cannot write", e))?;
    tmp.as_file().sync_all().map_err(|e| io("cannot write", e))?;
    tmp.persist(path).map_err(|e| io("cannot replace", e.error))?;
    Ok(())
}

/// Keys in `b` replace those in `a`, the rest of `a` is kept, in file order.
fn merge(a: Vec<Entry>, b: Vec<Entry>) -> Vec<Entry> {
    let mut out: Vec<Entry> = a.into_iter().filter(|e| !b.iter().any(|n| n.key == e.key)).collect();
    out.extend(b);
    out
}

/// The tuning cache in the directory `cache_dir()` names now (memory only when none).
pub struct Cache {
    file: Option<PathBuf>,
}

impl Cache {
    pub fn from_env() -> Cache {
        Cache { file: cache_dir().map(|d| d.join(FILE_NAME)) }
    }

    #[cfg(test)]
    pub fn in_dir(dir: &Path) -> Cache {
        Cache { file: Some(dir.join(FILE_NAME)) }
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The report stored for `key`. Reads the file only the first time, or when it changed
    /// since and the key is not known yet.
    pub fn get(&self, key: &CacheKey, warnings: &mut Vec<String>) -> Option<Arc<TuneReport>> {
        with_snapshot(&self.file, |snap| {
            if let Some(r) = snap.entries.get(key) {
                return Some(r.clone());
            }
            let path = self.file.as_ref()?;
            let now = stamp(path);
            if snap.loaded && now == snap.stamp {
                return None;
            }
            snap.loaded = true;
            snap.stamp = now;
            match read_file(path) {
                Read::Good(entries) => snap.absorb(entries),
                Read::Bad(msg) => warnings.push(msg),
                Read::Missing => {}
            }
            snap.entries.get(key).cloned()
        })
    }

    /// Stores entries: in memory at once, then on disk under the lock, merged with what
    /// other processes wrote meanwhile.
    pub fn put(&self, entries: Vec<Entry>, warnings: &mut Vec<String>) -> Result<()> {
        with_snapshot(&self.file, |snap| snap.absorb(entries.clone()));
        let Some(path) = &self.file else { return Ok(()) };
        let _lock = lock(path)?;
        let existing = match read_file(path) {
            Read::Good(e) => e,
            Read::Missing => Vec::new(),
            Read::Bad(msg) => {
                warnings.push(format!("{msg}; replacing it (old file kept as .bad)"));
                let _ = fs::rename(path, path.with_extension("json.bad"));
                Vec::new()
            }
        };
        let merged = merge(existing, entries);
        write_atomic(path, merged.clone())?;
        with_snapshot(&self.file, |snap| {
            snap.absorb(merged);
            snap.loaded = true;
            snap.stamp = stamp(path);
        });
        Ok(())
    }

    /// Every entry on disk (for every adapter).
    pub fn entries(&self, warnings: &mut Vec<String>) -> Vec<Entry> {
        let Some(path) = &self.file else {
            return with_snapshot(&self.file, |s| {
                s.entries.iter().map(|(k, r)| Entry { key: k.clone(), report: (**r).clone() }).collect()
            });
        };
        match read_file(path) {
            Read::Good(e) => e,
            Read::Missing => Vec::new(),
            Read::Bad(msg) => {
                warnings.push(msg);
                Vec::new()
            }
        }
    }

    /// Writes every entry to `dest` (a file in the cache's own format). Returns how many.
    pub fn export(&self, dest: &Path, warnings: &mut Vec<String>) -> Result<usize> {
        let entries = match &self.file {
            Some(path) => {
                let _lock = lock(path)?;
                self.entries(warnings)
            }
            None => self.entries(warnings),
        };
        let n = entries.len();
        if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)
                .map_err(|e| Error::Cache(format!("cannot create {}: {e}", dir.display())))?;
        }
        write_atomic(dest, entries)?;
        Ok(n)
    }

    /// Merges the entries of an exported file into the cache. Returns how many it held. A
    /// file that is not a cache export is an error: the caller asked for it by name.
    pub fn import(&self, src: &Path, warnings: &mut Vec<String>) -> Result<usize> {
        let entries = match read_file(src) {
            Read::Good(e) => e,
            Read::Missing => {
                return Err(Error::invalid(format!("no such file: {}", src.display())))
            }
            Read::Bad(msg) => return Err(Error::Cache(msg)),
        };
        let n = entries.len();
        self.put(entries, warnings)?;
        Ok(n)
    }

    /// Removes the cache file and forgets its entries.
    pub fn clear(&self) -> Result<()> {
        with_snapshot(&self.file, |s| *s = Snapshot::default());
        let Some(path) = &self.file else { return Ok(()) };
        if !path.exists() {
            return Ok(());
        }
        let _lock = lock(path)?;
        match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::Cache(format!("cannot remove {}: {e}", path.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Padding;
    use crate::tuner::{CandidateResult, Status};

    fn adapter(device: u32) -> AdapterDesc {
        AdapterDesc {
            index: Some(0),
            name: "test gpu".into(),
            backend: "vulkan".into(),
            device_type: "DiscreteGpu".into(),
            driver: "drv".into(),
            driver_info: "1.0".into(),
            vendor: 0x10de,
            device,
        }
    }

    fn shape(k: usize) -> ConvShape {
        ConvShape::new([1, 3, 8, 8], [k, 3, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap()
    }

    fn report(s: &ConvShape, winner: &str) -> TuneReport {
        TuneReport {
            shape: *s,
            precision: Precision::Highest,
            winner: winner.into(),
            default: "direct_wg64x1_u1_k4w1".into(),
            reference: "direct_wg64x1_u0_k1w1".into(),
            default_ms: Some(2.0),
            tuned_ms: Some(1.0),
            tuning_s: 0.5,
            phases: None,
            budget_s: 3.0,
            tuned_at: "2024-01-01T00:00:00Z".into(),
            adapter: "test gpu".into(),
            families: None,
            candidates: vec![CandidateResult {
                name: winner.into(),
                status: Status::Ok,
                samples_ms: vec![1.0, 1.0, 1.0],
                median_ms: Some(1.0),
                detail: None,
                compile_ms: Some(100.0),
                runoff_ms: None,
                at_s: Some(0.1),
                measure_ms: Some(5.0),
            }],
        }
    }

    fn entry(device: u32, k: usize, winner: &str) -> Entry {
        let s = shape(k);
        let key = CacheKey::new(&adapter(device), &s, Precision::Highest, &Families::all());
        Entry { key, report: report(&s, winner) }
    }

    #[test]
    fn round_trip_and_key_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::in_dir(dir.path());
        let mut w = Vec::new();
        let e = entry(1, 8, "gemm_b32x32x8_t4x4");
        cache.put(vec![e.clone()], &mut w).unwrap();
        forget_memory();
        assert_eq!(*cache.get(&e.key, &mut w).unwrap(), e.report);

        let mut other_adapter = e.key.clone();
        other_adapter.adapter.device = 2;
        let mut other_version = e.key.clone();
        other_version.version = "0.0.0".into();
        let mut other_templates = e.key.clone();
        other_templates.templates = "00".into();
        let mut other_driver = e.key.clone();
        other_driver.adapter.driver_info = "2.0".into();
        for k in [other_adapter, other_version, other_templates, other_driver] {
            assert!(cache.get(&k, &mut w).is_none());
        }
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn corrupt_and_foreign_files_are_warned_about_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::in_dir(dir.path());
        let e = entry(1, 8, "gemm_b32x32x8_t4x4");
        for bad in ["{not json", r#"{"format": "convtune-tuning-cache", "format_version": 999, "entries": 5}"#] {
            forget_memory();
            fs::write(cache.file().unwrap(), bad).unwrap();
            let mut w = Vec::new();
            assert!(cache.get(&e.key, &mut w).is_none());
            assert_eq!(w.len(), 1, "{w:?}");
            cache.put(vec![e.clone()], &mut w).unwrap();
            assert!(w[1].contains("replacing"), "{w:?}");
            forget_memory();
            let mut w = Vec::new();
            assert_eq!(*cache.get(&e.key, &mut w).unwrap(), e.report);
            assert!(w.is_empty());
        }
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let d = dir.path().to_path_buf();
                std::thread::spawn(move || {
                    for j in 0..5 {
                        let mut w = Vec::new();
                        Cache::in_dir(&d).put(vec![entry(i, 1 + j, "direct_wg64x1_u0_k1w1")], &mut w).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut w = Vec::new();
        assert_eq!(Cache::in_dir(dir.path()).entries(&mut w).len(), 40);
    }

    #[test]
    fn export_import_keeps_adapters_apart() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let mut w = Vec::new();
        let mine = entry(1, 8, "gemm_b32x32x8_t4x4");
        let theirs = entry(2, 8, "direct_wg64x1_u0_k1w1");
        Cache::in_dir(a.path()).put(vec![mine.clone(), theirs.clone()], &mut w).unwrap();
        let out = a.path().join("export.json");
        assert_eq!(Cache::in_dir(a.path()).export(&out, &mut w).unwrap(), 2);
        let cb = Cache::in_dir(b.path());
        assert_eq!(cb.import(&out, &mut w).unwrap(), 2);
        forget_memory();
        assert_eq!(cb.get(&mine.key, &mut w).unwrap().winner, "gemm_b32x32x8_t4x4");
        assert_eq!(cb.get(&theirs.key, &mut w).unwrap().winner, "direct_wg64x1_u0_k1w1");
        fs::write(&out, "garbage").unwrap();
        assert!(matches!(cb.import(&out, &mut w), Err(Error::Cache(_))));
        cb.clear().unwrap();
        assert!(cb.get(&mine.key, &mut w).is_none());
    }

    #[test]
    fn hashes_are_stable_hex() {
        assert_eq!(templates_hash().len(), 64);
        assert_eq!(candidates_hash(), candidates_hash());
        assert_eq!(codegen_hash().len(), 64);
        assert_ne!(sha256_hex(&["ab", "c"]), sha256_hex(&["a", "bc"]));
    }
}
