//! Rearranged copies of weights kept with the weights they were made from (a weight
//! [`Tensor`](crate::Tensor), a tuning run's inputs): weights that stay on the device are
//! rearranged for a kernel once, not on every call.

use crate::pool::PooledBuffer;
use std::sync::{Arc, Mutex};

/// Copies kept per weights, newest last. Two: a lowered transposed convolution's weights and
/// the tensor-core copy made from them, or one weight tensor serving two problems.
const KEPT: usize = 2;

/// The copies made from one set of weights, each under the key of the pass that made it
/// (a hash of its module's WGSL, which fixes the shape and the rearrangement).
#[derive(Default)]
pub(crate) struct Resident {
    copies: Mutex<Vec<(u64, Arc<PooledBuffer>)>>,
}

impl Resident {
    /// The copy made under `key`, if kept.
    pub(crate) fn get(&self, key: u64) -> Option<Arc<PooledBuffer>> {
        let copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        copies.iter().find(|(k, _)| *k == key).map(|(_, b)| b.clone())
    }

    /// Keeps `buf` under `key`, once the passes writing it are submitted: a later call's
    /// passes, which read it, are queued behind them.
    pub(crate) fn keep(&self, key: u64, buf: Arc<PooledBuffer>) {
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        copies.retain(|(k, _)| *k != key);
        copies.push((key, buf));
        let extra = copies.len().saturating_sub(KEPT);
        copies.drain(..extra);
    }

    /// Drops every copy: the weights may change from now on.
    pub(crate) fn clear(&self) {
        self.copies.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// The key of copies made by a pass of this WGSL.
pub(crate) fn key_of(source: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    h.finish()
}
