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
use crate::error::CoreError;

/// Who may attend to whom within one sequence of an attention call.
#[derive(Clone, Copy, Debug)]
pub enum AttentionMask<'a> {
    /// Encoder pass: causal, limited to `window` positions (self included) on sliding layers;
    /// `blocks` (one id per query/key position of this pass, `-1` for text) lets tokens of the
    /// same image block see each other bidirectionally.
    Causal {
        /// Sliding window in positions (self included); `None` = unlimited (full-attention layers).
        window: Option<usize>,
        /// Image block id per position of this pass, `-1` for text; `None` = no images.
        blocks: Option<&'a [i32]>,
    },
    /// Decoder pass: every kept key is visible.
    Full,
}

/// Attention weights of one layer.
#[derive(Debug)]
pub struct Attention {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (each shared by `heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Query projection `[heads * head_dim, hidden]`.
    pub q_proj: Linear,
    /// Key projection `[kv_heads * head_dim, hidden]`.
    pub k_proj: Linear,
    /// Value projection `[kv_heads * head_dim, hidden]`; `None` on full-attention layers (values are the keys).
    pub v_proj: Option<Linear>,
    /// Output projection `[hidden, heads * head_dim]`.
    pub o_proj: Linear,
    /// Per-head query RMS-norm weight `[head_dim]`.
    pub q_norm: Vec<f32>,
    /// Per-head key RMS-norm weight `[head_dim]`.
    pub k_norm: Vec<f32>,
    /// Epsilon of the q/k/v norms.
    pub eps: f32,
    /// Rotary embedding of this layer type.
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
pub(crate) struct KeyView<'a> {
    pub(crate) keys: Vec<Cow<'a, [f32]>>,
    pub(crate) values: Vec<Cow<'a, [f32]>>,
    pub(crate) first_key: usize,
    pub(crate) first_query: usize,
    pub(crate) mask: AttentionMask<'a>,
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
        let angles = self.rope.angles(positions.iter().copied());
        let split =
            |flat: &[f32], heads: usize, norm: Option<&[f32]>, rope: bool| -> Vec<Vec<f32>> {
                (0..heads)
                    .into_par_iter()
                    .map(|h| {
                        let mut out = vec![0.0f32; rows * hd];
                        let src = flat.get(h * hd..).unwrap_or_default();
                        ops::rms_norm_rows_strided(src, hd, heads * hd, norm, self.eps, &mut out);
                        if rope {
                            for (t, o) in out.chunks_exact_mut(hd).enumerate() {
                                angles.rotate(o, t);
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
                // Heads in parallel: after a long prompt each is megabytes.
                let join = |cached: &[Vec<f32>], fresh: &[Vec<f32>]| -> Vec<Cow<'_, [f32]>> {
                    cached
                        .par_iter()
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
        // Interleaved into `[rows, heads * head_dim]` in parallel over rows (a 4096-token
        // prompt moves 64-128 MB per layer here).
        let width = self.heads * hd;
        let mut out = vec![0.0f32; segments.rows() * width];
        for (s, span) in segments.spans().enumerate() {
            let heads = &per_task[s * self.heads..(s + 1) * self.heads];
            out[span.start * width..span.end * width]
                .par_chunks_mut(width)
                .enumerate()
                .for_each(|(i, row)| {
                    for (o, head) in row.chunks_exact_mut(hd).zip(heads) {
                        o.copy_from_slice(&head[i * hd..(i + 1) * hd]);
                    }
                });
        }
        Ok(out)
    }
}

/// Query rows per block of `attend_head`: the scores of one block, `[rows, keys]`, are all a
/// head holds at once, so attention memory grows linearly with the prompt. Under a sliding
/// window of `w` keys, a causal block of `r` rows also scores up to `r - 1` keys that its first
/// rows cannot see, `(r - 1) / w` more work: `w / 16` rows keep that near 6%. Other passes take
/// 256 rows, which pack their keys for the scores product fewer times. The block size changes
/// no result: masked keys weigh exactly 0, and the values product is one fma chain per element.
pub(crate) fn query_block(mask: &AttentionMask<'_>) -> usize {
    match mask {
        AttentionMask::Causal {
            window: Some(w),
            blocks: None,
        } => (w / 16).clamp(16, 256),
        _ => 256,
    }
}

/// One query head of one sequence over its key/value head: `softmax(mask(q k^T)) v`, a block of
/// query rows at a time over only the keys the block can see (on causal passes: none after its
/// last query, none before a sliding window). Masked keys weigh exactly 0 after the softmax, so
/// leaving them out changes no row's result.
pub(crate) fn attend_head(
    q: &[f32],
    len: usize,
    k: &[f32],
    v: &[f32],
    hd: usize,
    view: &KeyView<'_>,
) -> Result<Vec<f32>, dg_quant::QuantError> {
    attend_head_in_blocks(q, len, k, v, hd, view, query_block(&view.mask))
}

/// [`attend_head`] in blocks of `block` query rows.
fn attend_head_in_blocks(
    q: &[f32],
    len: usize,
    k: &[f32],
    v: &[f32],
    hd: usize,
    view: &KeyView<'_>,
    block: usize,
) -> Result<Vec<f32>, dg_quant::QuantError> {
    let n_keys = k.len() / hd;
    let mut out = vec![0.0f32; len * hd];
    let mut scores = Vec::new();
    for i0 in (0..len).step_by(block) {
        let rows = block.min(len - i0);
        let (k0, k1) = visible_keys(view, i0, rows, n_keys);
        let width = k1 - k0;
        scores.clear();
        scores.resize(rows * width, 0.0f32);
        let q_rows = &q[i0 * hd..(i0 + rows) * hd];
        block_probs(
            view,
            q_rows,
            &k[k0 * hd..k1 * hd],
            (i0, k0),
            hd,
            &mut scores,
        )?;
        let o = &mut out[i0 * hd..(i0 + rows) * hd];
        dg_quant::attention_values(&scores, &v[k0 * hd..k1 * hd], (rows, width, hd), o)?;
    }
    Ok(out)
}

/// The attention probabilities `softmax(mask(q k^T))` of the query rows `i0..` (`q_rows`,
/// `[rows, hd]`) over the keys `k0..` (`k_blk`, `[width, hd]`), into `probs` (`[rows, width]`).
pub(crate) fn block_probs(
    view: &KeyView<'_>,
    q_rows: &[f32],
    k_blk: &[f32],
    (i0, k0): (usize, usize),
    hd: usize,
    probs: &mut [f32],
) -> Result<(), dg_quant::QuantError> {
    let (rows, width) = (q_rows.len() / hd, k_blk.len() / hd);
    dg_quant::matmul_f32(q_rows, k_blk, rows, hd, width, true, probs)?;
    for (i, row) in probs.chunks_exact_mut(width).enumerate() {
        mask_row(view, i0 + i, k0, row);
    }
    dg_quant::mlx::softmax_rows_inplace(probs, width);
    Ok(())
}

/// Sets the scores of query row `i` (index into the pass's queries) over the keys `k0..` that
/// its mask hides to `-inf`.
pub(crate) fn mask_row(view: &KeyView<'_>, i: usize, k0: usize, row: &mut [f32]) {
    if let AttentionMask::Causal { window, blocks } = view.mask {
        let qp = view.first_query + i;
        for (j, s) in row.iter_mut().enumerate() {
            let kp = view.first_key + k0 + j;
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
}

/// The keys `k0..k1` (indices into the view's keys) that query rows `i0..i0 + rows` can see.
/// Image blocks see each other both ways, so a pass with image blocks keeps every key.
pub(crate) fn visible_keys(
    view: &KeyView<'_>,
    i0: usize,
    rows: usize,
    n_keys: usize,
) -> (usize, usize) {
    let AttentionMask::Causal {
        window,
        blocks: None,
    } = view.mask
    else {
        return (0, n_keys);
    };
    let (first_q, last_q) = (view.first_query + i0, view.first_query + i0 + rows - 1);
    let end = (last_q + 1).saturating_sub(view.first_key).min(n_keys);
    let start = window.map_or(0, |w| {
        (first_q + 1)
            .saturating_sub(w)
            .saturating_sub(view.first_key)
    });
    (start.min(end), end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `softmax(mask(q k^T)) v` for every query at once, in f64.
    fn naive(q: &[f32], k: &[f32], v: &[f32], hd: usize, view: &KeyView<'_>) -> Vec<f64> {
        let (len, n_keys) = (q.len() / hd, k.len() / hd);
        let mut out = vec![0.0f64; len * hd];
        for i in 0..len {
            let qp = view.first_query + i;
            let visible = |j: usize| {
                let kp = view.first_key + j;
                match view.mask {
                    AttentionMask::Full => true,
                    AttentionMask::Causal { window, .. } => {
                        kp <= qp && window.is_none_or(|w| qp < kp + w)
                    }
                }
            };
            let s: Vec<f64> = (0..n_keys)
                .map(|j| match visible(j) {
                    true => (0..hd)
                        .map(|d| q[i * hd + d] as f64 * k[j * hd + d] as f64)
                        .sum(),
                    false => f64::NEG_INFINITY,
                })
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (j, w) in e.iter().enumerate() {
                for d in 0..hd {
                    out[i * hd + d] += w / sum * v[j * hd + d] as f64;
                }
            }
        }
        out
    }

    /// One head's queries `[len, hd]`, keys and values `[n_keys, hd]`.
    fn head_inputs(len: usize, n_keys: usize, hd: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let value =
            |i: usize, salt: usize| (((i * 7919 + salt * 104729) % 2003) as f32 / 2003.0) - 0.5;
        (
            (0..len * hd).map(|i| value(i, 1)).collect(),
            (0..n_keys * hd).map(|i| value(i, 2)).collect(),
            (0..n_keys * hd).map(|i| value(i, 3)).collect(),
        )
    }

    #[test]
    fn query_blocks_over_visible_keys_match_whole_attention() {
        let hd = 8;
        // A continuation pass: 600 queries (3 blocks) after 100 cached positions.
        let (cached, len) = (100, 600);
        let (q, k, v) = head_inputs(len, cached + len, hd);
        for mask in [
            AttentionMask::Causal {
                window: None,
                blocks: None,
            },
            AttentionMask::Causal {
                window: Some(300),
                blocks: None,
            },
            AttentionMask::Full,
        ] {
            let view = KeyView {
                keys: Vec::new(),
                values: Vec::new(),
                first_key: 0,
                first_query: cached,
                mask,
            };
            let got = attend_head(&q, len, &k, &v, hd, &view).unwrap();
            let want = naive(&q, &k, &v, hd, &view);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() < 1e-5,
                    "{mask:?}: element {i}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn the_query_block_size_changes_no_bit() {
        let hd = 16;
        // 700 queries after 100 cached positions: with 256-row blocks the values product runs
        // over more than 512 keys, where a chunked reduction would round differently.
        let (cached, len) = (100, 700);
        let (q, k, v) = head_inputs(len, cached + len, hd);
        for window in [None, Some(300)] {
            let view = KeyView {
                keys: Vec::new(),
                values: Vec::new(),
                first_key: 0,
                first_query: cached,
                mask: AttentionMask::Causal {
                    window,
                    blocks: None,
                },
            };
            let want = attend_head_in_blocks(&q, len, &k, &v, hd, &view, 256).unwrap();
            for block in [16, 64, 100] {
                let got = attend_head_in_blocks(&q, len, &k, &v, hd, &view, block).unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "window {window:?}: blocks of {block} differ from 256");
            }
        }
    }

    #[test]
    fn visible_keys_end_at_the_last_query_and_start_at_the_window() {
        let view = |window| KeyView {
            keys: Vec::new(),
            values: Vec::new(),
            first_key: 10,
            first_query: 50,
            mask: AttentionMask::Causal {
                window,
                blocks: None,
            },
        };
        // Rows 0..256 are positions 50..306; keys 0..296 are positions 10..306.
        assert_eq!(visible_keys(&view(None), 0, 256, 1000), (0, 296));
        // Window 100: the first query (position 50) sees positions from -49, i.e. key 0;
        // rows 256..512 (positions 306..562) see positions 207.. = key 197.
        assert_eq!(visible_keys(&view(Some(100)), 0, 256, 1000), (0, 296));
        assert_eq!(visible_keys(&view(Some(100)), 256, 256, 1000), (197, 552));
        let blocks = [0i32; 4];
        let with_images = KeyView {
            mask: AttentionMask::Causal {
                window: Some(2),
                blocks: Some(&blocks),
            },
            ..view(None)
        };
        assert_eq!(visible_keys(&with_images, 0, 4, 44), (0, 44));
    }
}
