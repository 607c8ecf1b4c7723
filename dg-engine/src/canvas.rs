//! One block's denoising loop, step for step as the reference runs it (see the walk-through at
//! the top of [`crate::sampler`]): random canvas, decoder pass, tempered logits, argmax,
//! candidate canvas, accept mask, re-noise, self-conditioning for the next step.

use std::ops::ControlFlow;

use dg_core::{KvCache, SelfConditioning, TextModel};
use rayon::ThreadPool;

use crate::error::Result;
use crate::rng::Rng;
use crate::sampler::{self, StabilityStop};

/// The sampler of one block, resolved.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BlockSampler {
    Confidence { threshold: f64 },
    Entropy { bound: f64 },
}

/// Everything a block needs besides the model and cache.
#[derive(Clone, Debug)]
pub(crate) struct BlockParams {
    pub len: usize,
    pub steps: usize,
    pub sampler: BlockSampler,
    pub temperature: f64,
    pub t_min: f64,
    pub t_max: f64,
    pub stop: Option<(usize, f64)>,
}

/// The state of the canvas after one denoising step, for streaming.
#[derive(Clone, Debug)]
pub(crate) struct StepView<'a> {
    /// 1-based step number.
    pub step: usize,
    pub canvas: &'a [i32],
    pub revealed: &'a [bool],
}

/// A finished block: the emitted tokens (argmax of the last logits) and the steps it took.
pub(crate) struct BlockResult {
    pub tokens: Vec<u32>,
    pub steps: usize,
}

/// The model with the thread pool its numeric work runs on. Only model calls enter the pool,
/// so callbacks of the generation loop need not be `Send`.
#[derive(Clone, Copy)]
pub(crate) struct Compute<'a> {
    pub model: &'a TextModel,
    pub pool: &'a ThreadPool,
}

impl Compute<'_> {
    pub fn encode(&self, cache: &mut KvCache, ids: &[u32]) -> Result<()> {
        self.pool
            .install(|| self.model.encode(cache, ids, |_, _| {}))?;
        Ok(())
    }

    pub fn prefill(
        &self,
        cache: &mut KvCache,
        prompt: &crate::prompt::PreparedPrompt,
    ) -> Result<()> {
        self.pool
            .install(|| crate::prompt::prefill(self.model, cache, prompt))
    }

    pub fn decode(
        &self,
        cache: &KvCache,
        canvas: &[u32],
        sc: SelfConditioning<'_>,
    ) -> Result<Vec<f32>> {
        Ok(self.pool.install(|| self.model.decode(cache, canvas, sc))?)
    }

    pub fn soft_embeddings(&self, probs: &[f32], rows: usize) -> Result<Vec<f32>> {
        Ok(self
            .pool
            .install(|| self.model.soft_embeddings(probs, rows))?)
    }
}

fn to_ids(canvas: &[i32]) -> Vec<u32> {
    canvas.iter().map(|&t| t as u32).collect()
}

fn noise(rng: &mut Rng, vocab: usize, len: usize) -> Result<Vec<i32>> {
    rng.randint(0, vocab as i32, &[1, len])
}

/// Denoises one block. `on_step` sees each step's draft; `Break` cancels (returns `None`).
pub(crate) fn denoise_block(
    model: Compute<'_>,
    cache: &KvCache,
    p: &BlockParams,
    rng: &mut Rng,
    on_step: &mut dyn FnMut(StepView<'_>) -> ControlFlow<()>,
) -> Result<Option<BlockResult>> {
    let vocab = model.model.vocab_size();
    let len = p.len;

    let mut current = noise(rng, vocab, len)?;
    let mut revealed = vec![false; len];
    let mut draft = current.clone();
    let mut self_conditioning: Option<Vec<f32>> = None;
    let mut stability = p.stop.map(|(s, c)| StabilityStop::new(s, c));
    let mut argmax = current.clone();
    let mut steps_taken = 0;

    for cur_step in (1..=p.steps).rev() {
        steps_taken += 1;
        let sc = match &self_conditioning {
            Some(e) => SelfConditioning::Embeddings(e),
            None => SelfConditioning::None,
        };
        let mut logits = model.decode(cache, &to_ids(&current), sc)?;
        let t = sampler::linear_temperature(cur_step, p.steps, p.t_min, p.t_max)?;
        sampler::apply_temperature(&mut logits, t);
        argmax = sampler::argmax_canvas(&logits, vocab)?;
        if cur_step == 1 {
            break;
        }
        let denoiser = if p.temperature <= 0.0 {
            argmax.clone()
        } else {
            sampler::sample_canvas(&logits, vocab, p.temperature, rng)?
        };

        let probs = match p.sampler {
            BlockSampler::Entropy { bound } => {
                let (entropy, probs) = sampler::entropy_and_probs(&logits, vocab)?;
                let accept = sampler::entropy_transfer_mask(&entropy, len, bound)?;
                let fresh = noise(rng, vocab, len)?;
                let (_, next) =
                    sampler::entropy_bound_update(&accept, &denoiser, &current, &fresh)?;
                current = next;
                revealed = accept;
                draft = argmax.clone();
                probs
            }
            BlockSampler::Confidence { threshold } => {
                let confidence = sampler::token_probability(&logits, vocab, &denoiser)?;
                let unrevealed: Vec<bool> = revealed.iter().map(|r| !r).collect();
                let accept = sampler::confidence_transfer_mask(
                    &confidence,
                    &unrevealed,
                    len,
                    threshold,
                    false,
                )?;
                let fresh = noise(rng, vocab, len)?;
                let (_, next) = sampler::confidence_update(
                    &accept,
                    &denoiser,
                    &fresh,
                    &mut revealed,
                    &mut draft,
                )?;
                current = next;
                Vec::new()
            }
        };

        if on_step(StepView {
            step: p.steps - cur_step + 1,
            canvas: &draft,
            revealed: &revealed,
        })
        .is_break()
        {
            return Ok(None);
        }

        if matches!(p.sampler, BlockSampler::Confidence { .. }) && revealed.iter().all(|&r| r) {
            break;
        }
        if let Some(stop) = stability.as_mut() {
            if stop.check(&argmax, &logits, vocab)? {
                break;
            }
        }
        let probs = match p.sampler {
            BlockSampler::Entropy { .. } => probs,
            BlockSampler::Confidence { .. } => sampler::softmax_precise(&logits, vocab)?,
        };
        self_conditioning = Some(model.soft_embeddings(&probs, len)?);
    }
    Ok(Some(BlockResult {
        tokens: to_ids(&argmax),
        steps: steps_taken,
    }))
}
