//! Self-attention of one layer, for the encoder (causal, appends to the cache) and the decoder
//! canvas (bidirectional over itself and the kept prompt positions, cache untouched).
//!
//! Gemma-4 details the reference follows: scale 1.0 (q/k are RMS-normed instead), per-head q/k
//! norms with weights, a scale-free v norm, and on full-attention layers no `v_proj`: values are
//! the raw `k_proj` output (before k-norm and RoPE) through the v norm.

use std::borrow::Cow;
use std::ops::Range;

use rayon::prelude::*;

use dg_quant::ops;

use super::batch::Segments;
use super::cache::LayerCache;
use super::linear::Linear;
use super::rope::Rope;
use crate::config::LayerType;
use crate::error::CoreError;

/// Who may attend to whom within one sequence of an attention call.
#[derive(Clone, Copy, Debug)]
pub enum AttentionMask<'a> {
    /// Encoder pass: causal, limited to `window` positions (self included) on sliding layers;
    /// `blocks` (one id per query/key position of this pass, `-1` for text) lets tokens of the
    /// same image block see each other bidirectionally.
    Causal {
        window: Option<usize>,
        blocks: Option<&'a [i32]>,
    },
    /// Decoder pass: every kept key is visible.
    Full,
}

/// Attention weights of one layer.
#[derive(Debug)]
pub struct Attention {
    pub layer_type: LayerType,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Option<Linear>,
    pub o_proj: Linear,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub eps: f32,
    pub rope: Rope,
}

/// Projected, normed and rotated queries/keys/values of one pass, per head, all sequences
/// packed (`[heads][rows * head_dim]`; sequence `i` owns rows `segments.span(i)`).
struct Projected {
    queries: Vec<Vec<f32>>,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

/// What one sequence attends over: per key/value head, its keys and values
/// `[n_keys, head_dim]`, the absolute positions of the first key and first query, its mask.
struct KeyView<'a> {
    keys: Vec<Cow<'a, [f32]>>,
    values: Vec<Cow<'a, [f32]>>,
    first_key: usize,
    first_query: usize,
    mask: AttentionMask<'a>,
}

impl Attention {
    /// Projects every row; row `t` of sequence `i` is rotated for position `first[i] + t`.
    fn project(
        &self,
        x: &[f32],
        segments: &Segments,
        first: &[usize],
    ) -> Result<Projected, CoreError> {
        let hd = self.head_dim;
        let rows = segments.rows();
        let q = self.q_proj.forward(x, rows)?;
        let k = self.k_proj.forward(x, rows)?;
        let v = match &self.v_proj {
            Some(v_proj) => v_proj.forward(x, rows)?,
            None => k.clone(),
        };
        // Absolute position of every packed row.
        let positions: Vec<usize> = segments
            .spans()
            .zip(first)
            .flat_map(|(span, &f)| (0..span.len()).map(move |t| f + t))
            .collect();
        let split =
            |flat: &[f32], heads: usize, norm: Option<&[f32]>, rope: bool| -> Vec<Vec<f32>> {
                (0..heads)
                    .map(|h| {
                        let mut out = vec![0.0f32; rows * hd];
                        for (t, o) in out.chunks_exact_mut(hd).enumerate() {
                            let src = &flat[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                            ops::rms_norm_row(src, norm, self.eps, o);
                            if rope {
                                self.rope.apply(o, positions[t]);
                            }
                        }
                        out
                    })
                    .collect()
            };
        Ok(Projected {
            queries: split(&q, self.heads, Some(&self.q_norm), true),
            keys: split(&k, self.kv_heads, Some(&self.k_norm), true),
            values: split(&v, self.kv_heads, None, false),
        })
    }

    /// Encoder pass: sequence `i` of `segments` continues `caches[i]` (its rows follow
    /// `caches[i].positions().end`), appends its keys/values there and attends over everything
    /// kept under `masks[i]`.
    pub fn forward_encoder(
        &self,
        x: &[f32],
        segments: &Segments,
        caches: &mut [&mut LayerCache],
        masks: &[AttentionMask<'_>],
    ) -> Result<Vec<f32>, CoreError> {
        let hd = self.head_dim;
        let first: Vec<usize> = caches.iter().map(|c| c.positions().end).collect();
        let p = self.project(x, segments, &first)?;
        for (span, cache) in segments.spans().zip(caches.iter_mut()) {
            let rows = span.start * hd..span.end * hd;
            cache.append(
                p.keys.iter().map(|k| &k[rows.clone()]),
                p.values.iter().map(|v| &v[rows.clone()]),
            );
        }
        let views = caches
            .iter()
            .zip(&first)
            .zip(masks)
            .map(|((cache, &first_query), &mask)| KeyView {
                keys: cache
                    .keys
                    .iter()
                    .map(|k| Cow::Borrowed(k.as_slice()))
                    .collect(),
                values: cache
                    .values
                    .iter()
                    .map(|v| Cow::Borrowed(v.as_slice()))
                    .collect(),
                first_key: cache.start,
                first_query,
                mask,
            })
            .collect::<Vec<_>>();
        let out = self.attend(&p, segments, &views)?;
        drop(views);
        for cache in caches.iter_mut() {
            cache.trim();
        }
        self.o_proj.forward(&out, segments.rows())
    }

    /// Decoder pass: sequence `i` of `segments` is a canvas placed after `caches[i]`; it
    /// attends to the cache's positions `visible[i]` and bidirectionally to itself. Caches
    /// are not modified.
    pub fn forward_decoder(
        &self,
        x: &[f32],
        segments: &Segments,
        caches: &[&LayerCache],
        visible: &[Range<usize>],
    ) -> Result<Vec<f32>, CoreError> {
        let hd = self.head_dim;
        let first: Vec<usize> = caches.iter().map(|c| c.positions().end).collect();
        let p = self.project(x, segments, &first)?;
        let views = segments
            .spans()
            .zip(caches)
            .zip(visible)
            .zip(&first)
            .map(|(((span, cache), visible), &first_query)| {
                let kept = (visible.start - cache.start) * hd..(visible.end - cache.start) * hd;
                let rows = span.start * hd..span.end * hd;
                let join = |cached: &[Vec<f32>], fresh: &[Vec<f32>]| -> Vec<Cow<'_, [f32]>> {
                    cached
                        .iter()
                        .zip(fresh)
                        .map(|(c, f)| Cow::Owned([&c[kept.clone()], &f[rows.clone()]].concat()))
                        .collect()
                };
                KeyView {
                    keys: join(&cache.keys, &p.keys),
                    values: join(&cache.values, &p.values),
                    first_key: visible.start,
                    first_query,
                    mask: AttentionMask::Full,
                }
            })
            .collect::<Vec<_>>();
        let out = self.attend(&p, segments, &views)?;
        self.o_proj.forward(&out, segments.rows())
    }

    /// Scaled-dot-product attention (scale 1.0) of every sequence's query heads over its own
    /// keys (`views[i]`), one task per (sequence, head). Returns `[rows, heads * head_dim]`.
    fn attend(
        &self,
        p: &Projected,
        segments: &Segments,
        views: &[KeyView<'_>],
    ) -> Result<Vec<f32>, CoreError> {
        let hd = self.head_dim;
        let group = self.heads / self.kv_heads;
        let tasks: Vec<(usize, usize)> = (0..segments.len())
            .flat_map(|s| (0..self.heads).map(move |h| (s, h)))
            .collect();
        let per_task: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|&(s, h)| {
                let span = segments.span(s);
                let view = &views[s];
                let q = &p.queries[h][span.start * hd..span.end * hd];
                attend_head(
                    q,
                    span.len(),
                    &view.keys[h / group],
                    &view.values[h / group],
                    hd,
                    view,
                )
            })
            .collect::<Result<_, dg_quant::QuantError>>()
            .map_err(|source| CoreError::Quant {
                name: self.o_proj.name().replace("o_proj", "attention"),
                source,
            })?;
        let mut out = vec![0.0f32; segments.rows() * self.heads * hd];
        for (&(s, h), head) in tasks.iter().zip(&per_task) {
            for (t, row) in segments.span(s).zip(head.chunks_exact(hd)) {
                out[(t * self.heads + h) * hd..(t * self.heads + h + 1) * hd].copy_from_slice(row);
            }
        }
        Ok(out)
    }
}

/// One query head of one sequence over its key/value head: `softmax(mask(q k^T)) v`.
fn attend_head(
    q: &[f32],
    len: usize,
    k: &[f32],
    v: &[f32],
    hd: usize,
    view: &KeyView<'_>,
) -> Result<Vec<f32>, dg_quant::QuantError> {
    let n_keys = k.len() / hd;
    let mut scores = vec![0.0f32; len * n_keys];
    dg_quant::matmul_f32(q, k, len, hd, n_keys, true, &mut scores)?;
    for (i, row) in scores.chunks_exact_mut(n_keys).enumerate() {
        if let AttentionMask::Causal { window, blocks } = view.mask {
            let qp = view.first_query + i;
            for (j, s) in row.iter_mut().enumerate() {
                let kp = view.first_key + j;
                let causal = kp <= qp && window.is_none_or(|w| qp < kp + w);
                let same_block = blocks.is_some_and(|b| {
                    let (bq, bk) = (
                        qp.wrapping_sub(view.first_query),
                        kp.wrapping_sub(view.first_query),
                    );
                    bq < b.len() && bk < b.len() && b[bq] >= 0 && b[bq] == b[bk]
                });
                if !(causal || same_block) {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
        ops::softmax_inplace(row);
    }
    let mut out = vec![0.0f32; len * hd];
    dg_quant::matmul_f32(&scores, v, len, n_keys, hd, false, &mut out)?;
    Ok(out)
}
