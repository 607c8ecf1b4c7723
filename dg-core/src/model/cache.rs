//! The encoder's key/value cache, one entry per layer.
//!
//! Full-attention layers keep every position. Sliding layers keep only what a later query can
//! still see: after each encoder pass they are trimmed to the last `sliding_window - 1`
//! positions. The reference's `RotatingKVCache` keeps the whole prefill until the next update
//! and trims then; what any query can attend to is identical (see `attention.rs`), we just
//! free the memory sooner.

use dg_quant::alloc::{self, OutOfMemory};
use rayon::prelude::*;

/// Keys and values of one layer, per key/value head: `[positions, head_dim]` each.
#[derive(Clone, Debug)]
pub struct LayerCache {
    pub(crate) keys: Vec<Vec<f32>>,
    pub(crate) values: Vec<Vec<f32>>,
    pub(crate) head_dim: usize,
    /// Absolute position of the first stored entry.
    pub(crate) start: usize,
    /// Keep at most this many positions after a pass (`None`: keep all).
    pub(crate) keep: Option<usize>,
}

impl LayerCache {
    pub(crate) fn new(kv_heads: usize, head_dim: usize, keep: Option<usize>) -> Self {
        LayerCache {
            keys: vec![Vec::new(); kv_heads],
            values: vec![Vec::new(); kv_heads],
            head_dim,
            start: 0,
            keep,
        }
    }

    /// Number of stored positions.
    pub fn len(&self) -> usize {
        self.keys.first().map_or(0, |k| k.len() / self.head_dim)
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Absolute positions of the stored entries.
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len()
    }

    /// Stored keys of one key/value head, `[len, head_dim]` (after k-norm and RoPE).
    pub fn keys(&self, head: usize) -> &[f32] {
        &self.keys[head]
    }

    /// Stored values of one key/value head, `[len, head_dim]`.
    pub fn values(&self, head: usize) -> &[f32] {
        &self.values[head]
    }

    /// Number of key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.keys.len()
    }

    /// Appends new positions, per key/value head; the heads' copies run in parallel (a long
    /// prompt's first pass also faults in their fresh pages).
    pub(crate) fn append<'a>(
        &mut self,
        keys: impl Iterator<Item = &'a [f32]>,
        values: impl Iterator<Item = &'a [f32]>,
    ) {
        let copies: Vec<(&mut Vec<f32>, &[f32])> = self
            .keys
            .iter_mut()
            .zip(keys)
            .chain(self.values.iter_mut().zip(values))
            .collect();
        copies
            .into_par_iter()
            .for_each(|(dst, src)| dst.extend_from_slice(src));
    }

    /// Makes room for `positions` more entries per head, so that appending them cannot abort
    /// on a refused allocation (the encoder reserves before its pass).
    pub(crate) fn reserve(&mut self, positions: usize) -> Result<(), OutOfMemory> {
        let values = positions.saturating_mul(self.head_dim);
        for v in self.keys.iter_mut().chain(self.values.iter_mut()) {
            alloc::reserve(v, values, "key/value cache")?;
        }
        Ok(())
    }

    pub(crate) fn trim(&mut self) {
        let Some(keep) = self.keep else { return };
        let len = self.len();
        if len > keep {
            let drop = (len - keep) * self.head_dim;
            for v in self.keys.iter_mut().chain(self.values.iter_mut()) {
                v.drain(..drop);
            }
            self.start += len - keep;
        }
    }
}

/// The whole model's cache after some encoder passes.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub(crate) layers: Vec<LayerCache>,
    /// Total number of positions encoded so far.
    pub(crate) offset: usize,
}

impl KvCache {
    /// Total number of encoded positions (the next position to encode).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// One layer's cache.
    pub fn layer(&self, index: usize) -> Option<&LayerCache> {
        self.layers.get(index)
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}
