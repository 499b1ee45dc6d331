//! The engine's compiled kernels, bounded: a kernel bakes its whole shape in, so a process
//! that meets many input sizes compiles one per size, and each kept about 1 MB (the driver's
//! code, the shader module, the pipeline) for good. The least recently used kernel is
//! dropped once the cache holds `CONVTUNE_KERNEL_CACHE` of them (default 256), and within
//! one layer (a group: the same problem but for its batch, height and width) once that
//! layer holds `CONVTUNE_KERNELS_PER_LAYER` (default 16: a detection head run on five
//! feature-map scales at three batch sizes keeps them all), so that a layer fed ever new sizes
//! cannot push out the kernels of layers that keep theirs; a call still running one keeps
//! its own reference, and a later call on that shape compiles it again.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Kernels kept when `CONVTUNE_KERNEL_CACHE` is unset.
pub const DEFAULT_KERNELS: usize = 256;
/// Kernels kept per layer when `CONVTUNE_KERNELS_PER_LAYER` is unset.
pub const DEFAULT_PER_LAYER: usize = 16;

/// Sizes and evictions of a [`KernelCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCacheStats {
    /// Kernels held now.
    pub entries: usize,
    /// The most it holds.
    pub limit: usize,
    /// The most it holds of one layer (the same problem but for batch, height and width).
    pub per_layer: usize,
    /// Kernels dropped to make room, since the engine started.
    pub evictions: u64,
}

/// A map from key to compiled kernel that keeps the `limit` most recently used, and the
/// `per_group` most recently used of each group (`group` names a key's).
pub struct KernelCache<K, V> {
    limit: usize,
    per_group: usize,
    group: fn(&K) -> u64,
    map: Mutex<HashMap<K, (Arc<V>, u64)>>,
    clock: AtomicU64,
    evictions: AtomicU64,
}

impl<K: Eq + Hash + Clone, V> KernelCache<K, V> {
    /// A cache of `limit` kernels, `per_group` of each group (each at least one).
    pub fn new(limit: usize, per_group: usize, group: fn(&K) -> u64) -> Self {
        KernelCache {
            limit: limit.max(1),
            per_group: per_group.max(1),
            group,
            map: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The limits `CONVTUNE_KERNEL_CACHE` and `CONVTUNE_KERNELS_PER_LAYER` set (positive
    /// integers), else the defaults.
    pub fn from_env(group: fn(&K) -> u64) -> Self {
        Self::new(
            crate::settings::env_usize("CONVTUNE_KERNEL_CACHE").unwrap_or(DEFAULT_KERNELS),
            crate::settings::env_usize("CONVTUNE_KERNELS_PER_LAYER").unwrap_or(DEFAULT_PER_LAYER),
            group,
        )
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The kernel under `key`, marked as just used.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        let now = self.tick();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get_mut(key).map(|(v, used)| {
            *used = now;
            v.clone()
        })
    }

    /// Keeps `value` under `key`, dropping the least recently used kernels of its group
    /// beyond the group's limit, then of all beyond the limit.
    pub fn insert(&self, key: K, value: Arc<V>) {
        let now = self.tick();
        let group = (self.group)(&key);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key, (value, now));
        while map.keys().filter(|k| (self.group)(k) == group).count() > self.per_group {
            self.evict_oldest(&mut map, |k| (self.group)(k) == group);
        }
        while map.len() > self.limit {
            self.evict_oldest(&mut map, |_| true);
        }
    }

    /// Drops the kernel under `key`, if held (not counted as an eviction).
    pub fn remove(&self, key: &K) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    fn evict_oldest(&self, map: &mut HashMap<K, (Arc<V>, u64)>, among: impl Fn(&K) -> bool) {
        let oldest = map.iter().filter(|(k, _)| among(k)).min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone());
        if let Some(oldest) = oldest {
            map.remove(&oldest);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> KernelCacheStats {
        let entries = self.map.lock().unwrap_or_else(|e| e.into_inner()).len();
        KernelCacheStats { entries, limit: self.limit, per_layer: self.per_group, evictions: self.evictions.load(Ordering::Relaxed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_group(_: &i32) -> u64 {
        0
    }

    fn tens(k: &i32) -> u64 {
        (*k / 10) as u64
    }

    #[test]
    fn keeps_the_most_recently_used_within_its_limit() {
        let c = KernelCache::new(2, 10, one_group);
        c.insert(1, Arc::new("a"));
        c.insert(2, Arc::new("b"));
        assert_eq!(c.get(&1).as_deref(), Some(&"a")); // 1 is now newer than 2
        c.insert(3, Arc::new("c"));
        assert!(c.get(&2).is_none() && c.get(&1).is_some() && c.get(&3).is_some());
        assert_eq!(c.stats(), KernelCacheStats { entries: 2, limit: 2, per_layer: 10, evictions: 1 });
        // A kernel in use outlives its eviction.
        let held = c.get(&1).unwrap();
        c.insert(4, Arc::new("d"));
        c.insert(5, Arc::new("e"));
        assert_eq!(*held, "a");
        assert_eq!(c.stats().evictions, 3);
    }

    #[test]
    fn many_threads_share_it() {
        let c = Arc::new(KernelCache::new(8, 3, tens));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let k = (t * 7 + i) % 13;
                        if c.get(&k).is_none() {
                            c.insert(k, Arc::new(k));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = c.stats();
        assert!(s.entries <= 8 && s.evictions > 0, "{s:?}");
    }

    /// A group fed ever new keys keeps its own most recent few and leaves the others'.
    #[test]
    fn a_group_of_many_keys_keeps_its_own_few() {
        let c = KernelCache::new(16, 3, tens);
        for k in [1, 2, 3] {
            c.insert(k, Arc::new(k));
        }
        for k in 10..20 {
            c.insert(k, Arc::new(k));
        }
        assert!([1, 2, 3, 17, 18, 19].iter().all(|k| c.get(k).is_some()));
        assert!((10..17).all(|k| c.get(&k).is_none()));
        assert_eq!(c.stats(), KernelCacheStats { entries: 6, limit: 16, per_layer: 3, evictions: 7 });
    }
}
