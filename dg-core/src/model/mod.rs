//! The DiffusionGemma text backbone: one stack of layers run two ways. The encoder prefills the
//! prompt (and each committed block) into the [`KvCache`]; the decoder runs a canvas over the
//! cache bidirectionally and returns vocabulary logits through the tied, soft-capped head.

// The layers and their weights are this crate's business (their `pub` items reach no further
// than this crate): other crates see the model, its cache and inputs, and the linear type the
// vision tower shares.
pub(crate) mod attention;
pub(crate) mod batch;
pub(crate) mod cache;
pub(crate) mod layer;
pub(crate) mod linear;
pub(crate) mod mlp;
pub(crate) mod moe;
pub(crate) mod rope;
pub(crate) mod self_conditioning;

mod load;

use dg_quant::{alloc, mlx, ops};
use rayon::prelude::*;

use crate::config::{LayerType, ModelConfig};
use crate::error::CoreError;
use crate::lora::{split_module_path, Adapter, DEFAULT_LORA_KEYS};
use attention::AttentionMask;
use layer::{Layer, Pass};
use self_conditioning::SelfConditioningBlock;

pub use batch::Segments;
pub use cache::{KvCache, LayerCache};
pub use linear::{Clip, Linear, PlainWeights, Storage};
pub use load::{sanitize_options, LoadProgress};

/// What the decoder's self-conditioning input is for one canvas pass.
#[derive(Clone, Copy, Debug, Default)]
pub enum SelfConditioning<'a> {
    /// No signal (the first denoising step): zero soft embeddings.
    #[default]
    None,
    /// The previous step's logits `[canvas, vocab]`; softmaxed and projected here (with
    /// `dg_quant::mlx::softmax`, the softmax the sampler's confidence path uses).
    Logits(&'a [f32]),
    /// Soft embeddings `[canvas, hidden]` already computed (what the engine passes).
    Embeddings(&'a [f32]),
}

/// One sequence of a batched encoder pass ([`TextModel::encode_batch`]).
#[derive(Debug)]
pub struct EncoderInput<'a> {
    /// The sequence's cache; the pass continues it.
    pub cache: &'a mut KvCache,
    /// Input embeddings `[len, hidden]` (see [`TextModel::embed_prompt`]).
    pub embeddings: Vec<f32>,
    /// One image block id per position, `-1` for text (used in a first prefill only).
    pub image_blocks: Option<&'a [i32]>,
}

/// One canvas of a batched decoder pass ([`TextModel::decode_batch`]).
#[derive(Clone, Copy, Debug)]
pub struct DecoderInput<'a> {
    /// The prompt (and committed blocks) the canvas follows.
    pub cache: &'a KvCache,
    /// Canvas token ids.
    pub canvas: &'a [u32],
    /// The self-conditioning input of this step.
    pub self_conditioning: SelfConditioning<'a>,
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

    /// Mounts `adapter` on its layers, replacing the one mounted before. Every factor is checked
    /// against its layer first: on an error the model is unchanged.
    pub fn mount_adapter(&mut self, adapter: &Adapter) -> Result<(), CoreError> {
        let bad = |reason: String| CoreError::Adapter {
            path: adapter.source.clone().unwrap_or_default(),
            reason,
        };
        let layers = self.layers.len();
        let mut placed = Vec::with_capacity(adapter.factors.len());
        for (path, factors) in &adapter.factors {
            let (i, module) =
                split_module_path(path).ok_or_else(|| bad(format!("{path}: matches no layer")))?;
            let layer = self.layers.get_mut(i).ok_or_else(|| {
                bad(format!(
                    "{path}: matches no layer (the model has {layers} layers)"
                ))
            })?;
            let linear = layer.adaptable_mut(module).ok_or_else(|| {
                bad(format!(
                    "{path}: matches no layer (layer {i} has no {module}; full-attention layers \
                     have no v_proj)"
                ))
            })?;
            linear.check_lora(factors).map_err(bad)?;
            placed.push((i, module, factors));
        }
        self.unmount_adapter();
        for (i, module, factors) in placed {
            if let Some(linear) = self.layers[i].adaptable_mut(module) {
                linear.set_lora(Some((factors.clone(), adapter.scale())));
            }
        }
        Ok(())
    }

    /// Removes the mounted adapter, if any: the base model again.
    pub fn unmount_adapter(&mut self) {
        for layer in &mut self.layers {
            for module in DEFAULT_LORA_KEYS {
                if let Some(linear) = layer.adaptable_mut(module) {
                    linear.set_lora(None);
                }
            }
        }
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
        h: Vec<f32>,
        image_blocks: Option<&[i32]>,
        mut observe: impl FnMut(usize, &[f32]),
    ) -> Result<Vec<f32>, CoreError> {
        let mut inputs = [EncoderInput {
            cache,
            embeddings: h,
            image_blocks,
        }];
        let mut out = self.encode_batch(&mut inputs, |layer, h, _| observe(layer, h))?;
        Ok(out.pop().expect("one output per input"))
    }

    /// Encoder pass over several sequences at once, packed one after another (no padding),
    /// each appended to its own cache. Returns each sequence's final-normed hidden states
    /// `[len, hidden]`. `observe` sees each layer's packed output and the sequences' rows in it
    /// ([`Segments`]). Every input is checked before any cache changes.
    pub fn encode_batch(
        &self,
        inputs: &mut [EncoderInput<'_>],
        mut observe: impl FnMut(usize, &[f32], &Segments),
    ) -> Result<Vec<Vec<f32>>, CoreError> {
        let hidden = self.hidden_size();
        for (i, input) in inputs.iter().enumerate() {
            let n = input.embeddings.len();
            if n == 0 || n % hidden != 0 {
                return Err(CoreError::InvalidInput(format!(
                    "encoder input {i}: {n} values is not a non-empty multiple of hidden size {hidden}"
                )));
            }
            self.check_cache(input.cache, i)?;
            if let Some(b) = input.image_blocks {
                if b.len() != n / hidden {
                    return Err(CoreError::InvalidInput(format!(
                        "encoder input {i}: {} image block ids for {} positions",
                        b.len(),
                        n / hidden
                    )));
                }
            }
        }
        let segments = Segments::from_lengths(inputs.iter().map(|i| i.embeddings.len() / hidden));
        for (input, span) in inputs.iter_mut().zip(segments.spans()) {
            for layer in &mut input.cache.layers {
                layer.reserve(span.len())?;
            }
        }
        let mut h = Vec::new();
        alloc::reserve(
            &mut h,
            segments.rows() * hidden,
            "encoder states [prompt, hidden]",
        )?;
        for input in inputs.iter_mut() {
            h.extend_from_slice(&std::mem::take(&mut input.embeddings));
        }
        // Image blocks only exist in the first prefill; continuation passes ignore them, as
        // the reference does.
        let blocks: Vec<Option<&[i32]>> = inputs
            .iter()
            .map(|i| i.image_blocks.filter(|_| i.cache.offset == 0))
            .collect();
        let window = self.config.text.sliding_window;
        for (l, (layer, lt)) in self.layers.iter().zip(&self.layer_types).enumerate() {
            let window = (*lt == LayerType::SlidingAttention).then_some(window);
            // One mask per sequence, always (also when every sequence has the same length).
            let masks: Vec<AttentionMask<'_>> = blocks
                .iter()
                .map(|&blocks| AttentionMask::Causal { window, blocks })
                .collect();
            let mut caches: Vec<&mut LayerCache> =
                inputs.iter_mut().map(|i| &mut i.cache.layers[l]).collect();
            layer.forward(
                &mut h,
                &segments,
                Pass::Encoder {
                    caches: &mut caches,
                    masks: &masks,
                },
            )?;
            observe(l, &h, &segments);
        }
        for (input, span) in inputs.iter_mut().zip(segments.spans()) {
            input.cache.offset += span.len();
        }
        ops::rms_norm_rows_inplace_par(
            &mut h,
            hidden,
            Some(&self.norm),
            self.config.text.rms_norm_eps,
        );
        split_rows(h, &segments, hidden, "encoder states [prompt, hidden]")
    }

    fn check_cache(&self, cache: &KvCache, input: usize) -> Result<(), CoreError> {
        if cache.layers.len() != self.layers.len()
            || cache
                .layers
                .first()
                .is_some_and(|c| c.positions().end != cache.offset)
        {
            return Err(CoreError::InvalidInput(format!(
                "input {input}: the cache does not belong to this model"
            )));
        }
        Ok(())
    }

    /// Decoder pass: the canvas `ids` placed after everything in `cache`, with optional
    /// self-conditioning. Returns soft-capped logits `[canvas, vocab]`.
    pub fn decode(
        &self,
        cache: &KvCache,
        canvas: &[u32],
        self_conditioning: SelfConditioning<'_>,
    ) -> Result<Vec<f32>, CoreError> {
        let mut out = self.decode_batch(&[DecoderInput {
            cache,
            canvas,
            self_conditioning,
        }])?;
        Ok(out.pop().expect("one output per input"))
    }

    /// Decoder passes of several canvases at once, packed like
    /// [`encode_batch`](Self::encode_batch), each over its own cache.
    /// Returns each canvas's soft-capped logits `[canvas, vocab]`.
    pub fn decode_batch(&self, inputs: &[DecoderInput<'_>]) -> Result<Vec<Vec<f32>>, CoreError> {
        let mut logits = Vec::new();
        let segments = self.decode_batch_into(inputs, &mut logits)?;
        split_rows(
            logits,
            &segments,
            self.vocab_size(),
            "logits [canvas, vocab]",
        )
    }

    /// [`Self::decode_batch`] into one packed buffer: `logits` becomes `[rows, vocab]`, canvas
    /// `i` owning rows `segments.span(i)` of the returned segments. The buffer is reused (only
    /// grown), so a driver that keeps it allocates no logits per step.
    pub fn decode_batch_into(
        &self,
        inputs: &[DecoderInput<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<Segments, CoreError> {
        let (hidden, segments) = self.decode_hidden_batch(inputs)?;
        self.logits_into(&hidden, segments.rows(), logits)?;
        Ok(segments)
    }

    /// The decoder's final-normed hidden states `[canvas, hidden]`.
    pub fn decode_hidden(
        &self,
        cache: &KvCache,
        canvas: &[u32],
        self_conditioning: SelfConditioning<'_>,
    ) -> Result<Vec<f32>, CoreError> {
        let (hidden, _) = self.decode_hidden_batch(&[DecoderInput {
            cache,
            canvas,
            self_conditioning,
        }])?;
        Ok(hidden)
    }

    /// The decoder's final-normed hidden states of several canvases, packed `[rows, hidden]`,
    /// with each canvas's rows.
    pub fn decode_hidden_batch(
        &self,
        inputs: &[DecoderInput<'_>],
    ) -> Result<(Vec<f32>, Segments), CoreError> {
        let hidden_size = self.hidden_size();
        let vocab = self.vocab_size();
        if inputs.is_empty() {
            return Err(CoreError::InvalidInput("no canvas to decode".into()));
        }
        for (i, input) in inputs.iter().enumerate() {
            let len = input.canvas.len();
            if len == 0 {
                return Err(CoreError::InvalidInput(format!("canvas {i} is empty")));
            }
            self.check_cache(input.cache, i)?;
            let (what, got, width) = match input.self_conditioning {
                SelfConditioning::None => continue,
                SelfConditioning::Embeddings(e) => ("embeddings", e.len(), hidden_size),
                SelfConditioning::Logits(l) => ("logits", l.len(), vocab),
            };
            if got != len * width {
                return Err(CoreError::InvalidInput(format!(
                    "canvas {i}: self-conditioning {what} have {got} values, expected {len} x {width}"
                )));
            }
        }
        let segments = Segments::from_lengths(inputs.iter().map(|i| i.canvas.len()));
        let ids: Vec<u32> = inputs.iter().flat_map(|i| i.canvas).copied().collect();
        let embeds = self.embed(&ids)?;
        let soft = self.batch_soft_embeddings(inputs, &segments)?;
        let mut h = self
            .self_conditioning
            .forward(&embeds, soft.as_deref(), segments.rows())?;
        for (l, layer) in self.layers.iter().enumerate() {
            let caches: Vec<&LayerCache> = inputs.iter().map(|i| &i.cache.layers[l]).collect();
            // Sliding layers see only the last `sliding_window - 1` prompt positions.
            let visible: Vec<std::ops::Range<usize>> = caches
                .iter()
                .map(|c| {
                    let offset = c.positions().end;
                    match c.keep {
                        Some(keep) => offset.saturating_sub(keep).max(c.start)..offset,
                        None => c.start..offset,
                    }
                })
                .collect();
            layer.forward(
                &mut h,
                &segments,
                Pass::Decoder {
                    caches: &caches,
                    visible: &visible,
                },
            )?;
        }
        ops::rms_norm_rows_inplace_par(
            &mut h,
            hidden_size,
            Some(&self.norm),
            self.config.text.rms_norm_eps,
        );
        Ok((h, segments))
    }

    /// The packed self-conditioning signal of a decoder batch: `None` when no canvas has one;
    /// else zeros for canvases without (exactly what an absent signal contributes, see
    /// `self_conditioning.rs`), the given embeddings, or the soft embeddings of softmaxed
    /// logits (all such canvases in one product).
    fn batch_soft_embeddings(
        &self,
        inputs: &[DecoderInput<'_>],
        segments: &Segments,
    ) -> Result<Option<Vec<f32>>, CoreError> {
        if inputs
            .iter()
            .all(|i| matches!(i.self_conditioning, SelfConditioning::None))
        {
            return Ok(None);
        }
        let hidden = self.hidden_size();
        let vocab = self.vocab_size();
        let mut probs = Vec::new();
        for input in inputs {
            if let SelfConditioning::Logits(logits) = input.self_conditioning {
                alloc::reserve(&mut probs, logits.len(), "self-conditioning probabilities")?;
                let start = probs.len();
                probs.resize(start + logits.len(), 0.0);
                mlx::softmax_rows(logits, vocab, &mut probs[start..]);
            }
        }
        let from_logits = if probs.is_empty() {
            Vec::new()
        } else {
            self.soft_embeddings(&probs, probs.len() / vocab)?
        };
        let mut next_from_logits = from_logits.chunks(hidden);
        let mut soft = alloc::zeroed(segments.rows() * hidden, "self-conditioning embeddings")?;
        for (input, span) in inputs.iter().zip(segments.spans()) {
            let dst = &mut soft[span.start * hidden..span.end * hidden];
            match input.self_conditioning {
                SelfConditioning::None => {}
                SelfConditioning::Embeddings(e) => dst.copy_from_slice(e),
                SelfConditioning::Logits(_) => {
                    for row in dst.chunks_exact_mut(hidden) {
                        row.copy_from_slice(
                            next_from_logits.next().expect("one row per logit row"),
                        );
                    }
                }
            }
        }
        Ok(Some(soft))
    }

    /// Tied head and soft cap: `tanh((h @ embed^T) / cap) * cap` in f32.
    pub fn logits(&self, hidden: &[f32], rows: usize) -> Result<Vec<f32>, CoreError> {
        let mut logits = Vec::new();
        self.logits_into(hidden, rows, &mut logits)?;
        Ok(logits)
    }

    /// [`Self::logits`] into `out` (resized to `[rows, vocab]`, its allocation reused: a
    /// driver that keeps it allocates no logits per step).
    pub fn logits_into(
        &self,
        hidden: &[f32],
        rows: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), CoreError> {
        let len = rows * self.vocab_size();
        if out.len() < len {
            alloc::reserve(out, len - out.len(), "logits [canvas, vocab]")?;
        }
        // Every value is overwritten by the product below: only new room is zeroed.
        out.resize(len, 0.0);
        self.embed_tokens.forward_into(hidden, rows, out)?;
        if let Some(cap) = self
            .config
            .text
            .final_logit_softcapping
            .filter(|c| *c > 0.0)
        {
            out.par_chunks_mut(1 << 16)
                .for_each(|chunk| ops::softcap_inplace(chunk, cap));
        }
        Ok(())
    }

    /// Soft embeddings `probs @ embed * sqrt(hidden)` for `rows` probability rows (each row
    /// reads only the embedding rows its probabilities need: see `dg_quant::sparse`).
    pub fn soft_embeddings(&self, probs: &[f32], rows: usize) -> Result<Vec<f32>, CoreError> {
        let mut e = self.embed_tokens.forward_transposed_sparse(probs, rows)?;
        for v in e.iter_mut() {
            *v *= self.embed_scale;
        }
        Ok(e)
    }
}

/// `packed` `[rows, width]` split into each segment's rows: one segment is returned as is (no
/// copy), several are copied out, each copy an error naming `what` if memory runs out.
fn split_rows(
    packed: Vec<f32>,
    segments: &Segments,
    width: usize,
    what: &'static str,
) -> Result<Vec<Vec<f32>>, CoreError> {
    if segments.len() == 1 {
        return Ok(vec![packed]);
    }
    segments
        .spans()
        .map(|span| {
            Ok(alloc::copied(
                &packed[span.start * width..span.end * width],
                what,
            )?)
        })
        .collect()
}
