//! The DiffusionGemma text backbone: one stack of layers run two ways. The encoder prefills the
//! prompt (and each committed block) into the [`KvCache`]; the decoder runs a canvas over the
//! cache bidirectionally and returns vocabulary logits through the tied, soft-capped head.

pub mod attention;
pub mod cache;
pub mod layer;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod rope;
pub mod self_conditioning;

mod load;

use dg_quant::ops;

use crate::config::{LayerType, ModelConfig};
use crate::error::CoreError;
use attention::AttentionMask;
use cache::{KvCache, LayerCache};
use layer::{Layer, Pass};
use linear::Linear;
use self_conditioning::SelfConditioningBlock;

pub use load::{sanitize_options, LoadProgress};

/// What the decoder's self-conditioning input is for one canvas pass.
#[derive(Clone, Copy, Debug, Default)]
pub enum SelfConditioning<'a> {
    /// No signal (the first denoising step): zero soft embeddings.
    #[default]
    None,
    /// The previous step's logits `[canvas, vocab]`; softmaxed and projected here.
    Logits(&'a [f32]),
    /// Soft embeddings `[canvas, hidden]` already computed (what the engine passes).
    Embeddings(&'a [f32]),
}

/// The loaded text model.
#[derive(Debug)]
pub struct TextModel {
    pub(crate) config: ModelConfig,
    pub(crate) embed_tokens: Linear,
    pub(crate) layers: Vec<Layer>,
    pub(crate) layer_types: Vec<LayerType>,
    pub(crate) norm: Vec<f32>,
    pub(crate) self_conditioning: SelfConditioningBlock,
    pub(crate) embed_scale: f32,
}

impl TextModel {
    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.config.text.vocab_size
    }

    /// Hidden size.
    pub fn hidden_size(&self) -> usize {
        self.config.text.hidden_size
    }

    /// An empty cache for a new sequence.
    pub fn new_cache(&self) -> KvCache {
        let t = &self.config.text;
        let layers = self
            .layer_types
            .iter()
            .map(|&lt| {
                let keep = match lt {
                    LayerType::SlidingAttention => Some(t.sliding_window.saturating_sub(1)),
                    LayerType::FullAttention => None,
                };
                LayerCache::new(t.kv_heads_of(lt), t.head_dim_of(lt), keep)
            })
            .collect();
        KvCache { layers, offset: 0 }
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), CoreError> {
        let vocab = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(CoreError::InvalidInput(format!(
                "token id {bad} is out of range (vocabulary of {vocab})"
            )));
        }
        Ok(())
    }

    /// Token embeddings scaled by `sqrt(hidden)`, `[ids, hidden]`.
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>, CoreError> {
        self.check_ids(ids)?;
        let mut h = self.embed_tokens.rows(ids)?;
        for v in h.iter_mut() {
            *v *= self.embed_scale;
        }
        Ok(h)
    }

    /// Encoder pass over prompt (or committed-block) token ids, appended to `cache`. Returns
    /// the final-normed hidden states `[ids, hidden]`. `observe` sees each layer's output.
    pub fn encode(
        &self,
        cache: &mut KvCache,
        ids: &[u32],
        observe: impl FnMut(usize, &[f32]),
    ) -> Result<Vec<f32>, CoreError> {
        let h = self.embed_prompt(ids)?;
        self.encode_embeddings(cache, h, None, observe)
    }

    /// Encoder input embeddings of prompt ids: image tokens are embedded as the pad token, as
    /// the reference does before scattering image features over them.
    pub fn embed_prompt(&self, ids: &[u32]) -> Result<Vec<f32>, CoreError> {
        let image = self.config.image_token_id;
        let pad = self.config.text.pad_token_id;
        let ids: Vec<u32> = ids
            .iter()
            .map(|&id| if Some(id) == image { pad } else { id })
            .collect();
        self.embed(&ids)
    }

    /// Encoder pass over precomputed input embeddings `[len, hidden]`; `image_blocks` gives one
    /// id per position (`-1` for text) so each image block attends to itself bidirectionally.
    pub fn encode_embeddings(
        &self,
        cache: &mut KvCache,
        mut h: Vec<f32>,
        image_blocks: Option<&[i32]>,
        mut observe: impl FnMut(usize, &[f32]),
    ) -> Result<Vec<f32>, CoreError> {
        let hidden = self.hidden_size();
        if h.is_empty() || h.len() % hidden != 0 {
            return Err(CoreError::InvalidInput(format!(
                "encoder input of {} values is not a non-empty multiple of hidden size {hidden}",
                h.len()
            )));
        }
        let len = h.len() / hidden;
        if cache.layers.len() != self.layers.len()
            || cache
                .layers
                .first()
                .is_some_and(|c| c.positions().end != cache.offset)
        {
            return Err(CoreError::InvalidInput(
                "the cache does not belong to this model".into(),
            ));
        }
        if let Some(b) = image_blocks {
            if b.len() != len {
                return Err(CoreError::InvalidInput(format!(
                    "{} image block ids for {len} positions",
                    b.len()
                )));
            }
        }
        // Image blocks only exist in the first prefill; continuation passes ignore them, as
        // the reference does.
        let blocks = image_blocks.filter(|_| cache.offset == 0);
        let window = self.config.text.sliding_window;
        for (i, (layer, lt)) in self.layers.iter().zip(&self.layer_types).enumerate() {
            let mask = AttentionMask::Causal {
                window: (*lt == LayerType::SlidingAttention).then_some(window),
                blocks,
            };
            layer.forward(
                &mut h,
                len,
                Pass::Encoder {
                    cache: &mut cache.layers[i],
                    mask,
                },
            )?;
            observe(i, &h);
        }
        cache.offset += len;
        ops::rms_norm_rows_inplace(
            &mut h,
            hidden,
            Some(&self.norm),
            self.config.text.rms_norm_eps,
        );
        Ok(h)
    }

    /// Decoder pass: the canvas `ids` placed after everything in `cache`, with optional
    /// self-conditioning. Returns soft-capped logits `[canvas, vocab]`.
    pub fn decode(
        &self,
        cache: &KvCache,
        canvas: &[u32],
        self_conditioning: SelfConditioning<'_>,
    ) -> Result<Vec<f32>, CoreError> {
        let hidden = self.decode_hidden(cache, canvas, self_conditioning)?;
        self.logits(&hidden, canvas.len())
    }

    /// The decoder's final-normed hidden states `[canvas, hidden]`.
    pub fn decode_hidden(
        &self,
        cache: &KvCache,
        canvas: &[u32],
        self_conditioning: SelfConditioning<'_>,
    ) -> Result<Vec<f32>, CoreError> {
        if canvas.is_empty() {
            return Err(CoreError::InvalidInput("empty canvas".into()));
        }
        if cache.layers.len() != self.layers.len() {
            return Err(CoreError::InvalidInput(
                "the cache does not belong to this model".into(),
            ));
        }
        let len = canvas.len();
        let hidden_size = self.hidden_size();
        let embeds = self.embed(canvas)?;
        let soft = match self_conditioning {
            SelfConditioning::None => None,
            SelfConditioning::Embeddings(e) => {
                if e.len() != len * hidden_size {
                    return Err(CoreError::InvalidInput(format!(
                        "self-conditioning embeddings have {} values, expected {len} x {hidden_size}",
                        e.len()
                    )));
                }
                Some(e.to_vec())
            }
            SelfConditioning::Logits(logits) => {
                if logits.len() != len * self.vocab_size() {
                    return Err(CoreError::InvalidInput(format!(
                        "self-conditioning logits have {} values, expected {len} x {}",
                        logits.len(),
                        self.vocab_size()
                    )));
                }
                let mut probs = logits.to_vec();
                for row in probs.chunks_exact_mut(self.vocab_size()) {
                    ops::softmax_inplace(row);
                }
                Some(self.soft_embeddings(&probs, len)?)
            }
        };
        let mut h = self
            .self_conditioning
            .forward(&embeds, soft.as_deref(), len)?;
        let offset = cache.offset;
        for (i, layer) in self.layers.iter().enumerate() {
            let c = &cache.layers[i];
            // Sliding layers see only the last `sliding_window - 1` prompt positions.
            let visible = match c.keep {
                Some(keep) => offset.saturating_sub(keep).max(c.start)..offset,
                None => c.start..offset,
            };
            layer.forward(&mut h, len, Pass::Decoder { cache: c, visible })?;
        }
        ops::rms_norm_rows_inplace(
            &mut h,
            hidden_size,
            Some(&self.norm),
            self.config.text.rms_norm_eps,
        );
        Ok(h)
    }

    /// Tied head and soft cap: `tanh((h @ embed^T) / cap) * cap` in f32.
    pub fn logits(&self, hidden: &[f32], rows: usize) -> Result<Vec<f32>, CoreError> {
        let mut logits = self.embed_tokens.forward(hidden, rows)?;
        if let Some(cap) = self
            .config
            .text
            .final_logit_softcapping
            .filter(|c| *c > 0.0)
        {
            ops::softcap_inplace(&mut logits, cap);
        }
        Ok(logits)
    }

    /// Soft embeddings `probs @ embed * sqrt(hidden)` for `rows` probability rows.
    pub fn soft_embeddings(&self, probs: &[f32], rows: usize) -> Result<Vec<f32>, CoreError> {
        let mut e = self.embed_tokens.forward_transposed(probs, rows)?;
        for v in e.iter_mut() {
            *v *= self.embed_scale;
        }
        Ok(e)
    }
}
