//! Self-attention of one layer, for the encoder (causal, appends to the cache) and the decoder
//! canvas (bidirectional over itself and the kept prompt positions, cache untouched).
//!
//! Gemma-4 details the reference follows: scale 1.0 (q/k are RMS-normed instead), per-head q/k
//! norms with weights, a scale-free v norm, and on full-attention layers no `v_proj`: values are
//! the raw `k_proj` output (before k-norm and RoPE) through the v norm.

use rayon::prelude::*;

use dg_quant::ops;

use super::cache::LayerCache;
use super::linear::Linear;
use super::rope::Rope;
use crate::config::LayerType;
use crate::error::CoreError;

/// Who may attend to whom in one attention call.
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

/// Projected, normed and rotated queries/keys/values of one pass, per head.
struct Projected {
    /// `[heads][len * head_dim]`
    queries: Vec<Vec<f32>>,
    /// `[kv_heads][len * head_dim]`
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl Attention {
    fn project(
        &self,
        x: &[f32],
        len: usize,
        first_position: usize,
    ) -> Result<Projected, CoreError> {
        let hd = self.head_dim;
        let q = self.q_proj.forward(x, len)?;
        let k = self.k_proj.forward(x, len)?;
        let v = match &self.v_proj {
            Some(v_proj) => v_proj.forward(x, len)?,
            None => k.clone(),
        };
        let split =
            |flat: &[f32], heads: usize, norm: Option<&[f32]>, rope: bool| -> Vec<Vec<f32>> {
                (0..heads)
                    .map(|h| {
                        let mut out = vec![0.0f32; len * hd];
                        for (t, o) in out.chunks_exact_mut(hd).enumerate() {
                            let src = &flat[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                            ops::rms_norm_row(src, norm, self.eps, o);
                            if rope {
                                self.rope.apply(o, first_position + t);
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

    /// Encoder pass over `len` new positions starting at `cache.positions().end`: appends their
    /// keys/values to the cache and attends causally over everything kept.
    pub fn forward_encoder(
        &self,
        x: &[f32],
        len: usize,
        cache: &mut LayerCache,
        mask: AttentionMask<'_>,
    ) -> Result<Vec<f32>, CoreError> {
        let first = cache.positions().end;
        let p = self.project(x, len, first)?;
        cache.append(&p.keys, &p.values);
        let key_start = cache.start;
        let keys: Vec<&[f32]> = cache.keys.iter().map(Vec::as_slice).collect();
        let values: Vec<&[f32]> = cache.values.iter().map(Vec::as_slice).collect();
        let out = self.attend(&p.queries, len, first, &keys, &values, key_start, mask)?;
        cache.trim();
        self.o_proj.forward(&out, len)
    }

    /// Decoder pass over a canvas of `len` positions placed after the prompt: attends to the
    /// kept prompt positions (`visible` of the cache) and bidirectionally to the canvas.
    pub fn forward_decoder(
        &self,
        x: &[f32],
        len: usize,
        cache: &LayerCache,
        visible: std::ops::Range<usize>,
    ) -> Result<Vec<f32>, CoreError> {
        let offset = cache.positions().end;
        let p = self.project(x, len, offset)?;
        let hd = self.head_dim;
        let from = (visible.start - cache.start) * hd;
        let to = (visible.end - cache.start) * hd;
        let join = |cached: &[Vec<f32>], fresh: &[Vec<f32>]| -> Vec<Vec<f32>> {
            cached
                .iter()
                .zip(fresh)
                .map(|(c, f)| [&c[from..to], f.as_slice()].concat())
                .collect()
        };
        let keys = join(&cache.keys, &p.keys);
        let values = join(&cache.values, &p.values);
        let keys: Vec<&[f32]> = keys.iter().map(Vec::as_slice).collect();
        let values: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
        let out = self.attend(
            &p.queries,
            len,
            offset,
            &keys,
            &values,
            visible.start,
            AttentionMask::Full,
        )?;
        self.o_proj.forward(&out, len)
    }

    /// Scaled-dot-product attention (scale 1.0) of every query head over its key/value head.
    /// Returns `[len, heads * head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        queries: &[Vec<f32>],
        len: usize,
        first_query: usize,
        keys: &[&[f32]],
        values: &[&[f32]],
        first_key: usize,
        mask: AttentionMask<'_>,
    ) -> Result<Vec<f32>, CoreError> {
        let hd = self.head_dim;
        let group = self.heads / self.kv_heads;
        let per_head: Vec<Vec<f32>> = queries
            .par_iter()
            .enumerate()
            .map(|(h, q)| {
                let k = keys[h / group];
                let v = values[h / group];
                let n_keys = k.len() / hd;
                let mut scores = vec![0.0f32; len * n_keys];
                dg_quant::matmul_f32(q, k, len, hd, n_keys, true, &mut scores)?;
                for (i, row) in scores.chunks_exact_mut(n_keys).enumerate() {
                    if let AttentionMask::Causal { window, blocks } = mask {
                        let qp = first_query + i;
                        for (j, s) in row.iter_mut().enumerate() {
                            let kp = first_key + j;
                            let causal = kp <= qp && window.is_none_or(|w| qp < kp + w);
                            let same_block = blocks.is_some_and(|b| {
                                let (bq, bk) =
                                    (qp.wrapping_sub(first_query), kp.wrapping_sub(first_query));
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
            })
            .collect::<Result<_, dg_quant::QuantError>>()
            .map_err(|source| CoreError::Quant {
                name: self.o_proj.name().replace("o_proj", "attention"),
                source,
            })?;
        let mut out = vec![0.0f32; len * self.heads * hd];
        for (h, head) in per_head.iter().enumerate() {
            for t in 0..len {
                out[(t * self.heads + h) * hd..(t * self.heads + h + 1) * hd]
                    .copy_from_slice(&head[t * hd..(t + 1) * hd]);
            }
        }
        Ok(out)
    }
}
