//! The on-disk tuning cache, as the public API sees it: one file shared by Rust and Python
//! callers, in `CONVTUNE_CACHE_DIR` or the user cache directory.

use crate::cache::{self, Cache};
use crate::error::Result;
use std::path::{Path, PathBuf};

/// The tuning cache file `CONVTUNE_CACHE_DIR` (or the user cache directory) names now;
/// `None` where there is no cache directory (results are then kept in memory only).
pub fn cache_path() -> Option<PathBuf> {
    Cache::from_env().file().map(PathBuf::from)
}

/// Writes every cache entry (all adapters) to `path`; returns how many. Recoverable
/// problems (an unreadable cache file) are pushed to `warnings`.
pub fn cache_export(path: &Path, warnings: &mut Vec<String>) -> Result<usize> {
    Cache::from_env().export(path, warnings)
}

/// Merges an exported file into the cache; returns how many entries it held.
pub fn cache_import(path: &Path, warnings: &mut Vec<String>) -> Result<usize> {
    Cache::from_env().import(path, warnings)
}

/// Deletes the cache file and forgets its entries.
pub fn cache_clear() -> Result<()> {
    Cache::from_env().clear()
}

/// Tests: forgets what this process remembers of any cache file.
#[doc(hidden)]
pub fn forget_cache_memory() {
    cache::forget_memory();
}
