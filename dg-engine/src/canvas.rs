//! One block's denoising loop, step for step as the reference runs it (see the walk-through at
//! the top of [`crate::sampler`]): random canvas, decoder pass, tempered logits, argmax,
//! candidate canvas, accept mask, re-noise, self-conditioning for the next step. The decoder
//! passes themselves are run by the driver (`batch.rs`), for many blocks at once.

use dg_core::SelfConditioning;

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
    /// Compute the log-probability of each emitted token.
    pub logprobs: bool,
}

/// A finished block: the emitted tokens (argmax of the last logits) and the steps it took.
pub(crate) struct BlockResult {
    pub tokens: Vec<u32>,
    pub steps: usize,
    /// Log-probability of each token under the last tempered logits (when asked for).
    pub logprobs: Vec<f32>,
}

/// What one denoising step leaves to its driver.
pub(crate) enum Step {
    /// The last step of the budget: the block ends without a draft.
    Last(BlockResult),
    /// A draft to show ([`BlockState::draft`], [`BlockState::revealed`]), then the block ends
    /// (every position revealed, or the stable-and-confident stop).
    Stopped(BlockResult),
    /// A draft to show; the block goes on once it has the soft embeddings of the
    /// probabilities `[len, vocab]` the step wrote into its `probs`
    /// ([`BlockState::set_self_conditioning`]).
    Continue,
}

/// One block's denoising loop as a state machine, so that the decoder passes of several
/// sequences can share one batched forward pass: the driver asks for the decoder input, runs
/// the model, and hands the logits back to [`BlockState::step`].
pub(crate) struct BlockState {
    params: BlockParams,
    vocab: usize,
    /// Steps left, counting down to 1 like the reference's `cur_step`.
    cur_step: usize,
    current: Vec<u32>,
    revealed: Vec<bool>,
    draft: Vec<u32>,
    argmax: Vec<u32>,
    self_conditioning: Option<Vec<f32>>,
    stability: Option<StabilityStop>,
    steps_taken: usize,
}

fn noise(rng: &mut Rng, vocab: usize, len: usize) -> Result<Vec<u32>> {
    rng.token_ids(vocab, len)
}

impl BlockState {
    /// Starts a block on a random canvas (the block's first draw from `rng`).
    pub fn start(params: BlockParams, vocab: usize, rng: &mut Rng) -> Result<Self> {
        let current = noise(rng, vocab, params.len)?;
        Ok(BlockState {
            vocab,
            cur_step: params.steps,
            revealed: vec![false; params.len],
            draft: current.clone(),
            argmax: current.clone(),
            current,
            self_conditioning: None,
            stability: params.stop.map(|(s, c)| StabilityStop::new(s, c)),
            steps_taken: 0,
            params,
        })
    }

    /// The canvas ids of the next decoder pass.
    pub fn canvas(&self) -> &[u32] {
        &self.current
    }

    /// The self-conditioning input of the next decoder pass.
    pub fn self_conditioning(&self) -> SelfConditioning<'_> {
        match &self.self_conditioning {
            Some(e) => SelfConditioning::Embeddings(e),
            None => SelfConditioning::None,
        }
    }

    /// Current draft tokens (what a streamed view shows).
    pub fn draft(&self) -> &[u32] {
        &self.draft
    }

    /// Which positions the sampler has revealed.
    pub fn revealed(&self) -> &[bool] {
        &self.revealed
    }

    /// 1-based number of the step just taken.
    pub fn step_number(&self) -> usize {
        self.steps_taken
    }

    /// The block's parameters.
    pub fn params(&self) -> &BlockParams {
        &self.params
    }

    /// Sets the soft embeddings `[len, hidden]` of the probabilities the last
    /// [`Step::Continue`] left.
    pub fn set_self_conditioning(&mut self, embeddings: Vec<f32>) {
        self.self_conditioning = Some(embeddings);
    }

    /// The block as it ends: the argmax of `logits`, the last (tempered) logits.
    fn result(&self, logits: &[f32]) -> Result<BlockResult> {
        let logprobs = match self.params.logprobs {
            true => sampler::token_logprobs(logits, self.vocab, &self.argmax)?,
            false => Vec::new(),
        };
        Ok(BlockResult {
            tokens: self.argmax.clone(),
            steps: self.steps_taken,
            logprobs,
        })
    }

    /// Consumes the logits `[len, vocab]` of one decoder pass over [`BlockState::canvas`]
    /// (tempered in place): argmax, candidate canvas, accept mask, re-noise, stop checks. `probs`
    /// (as long as `logits`) is the step's scratch and, on [`Step::Continue`], holds the
    /// probabilities for the next step's self-conditioning.
    pub fn step(&mut self, logits: &mut [f32], probs: &mut [f32], rng: &mut Rng) -> Result<Step> {
        let (p, vocab, len) = (&self.params, self.vocab, self.params.len);
        let cur_step = self.cur_step;
        self.steps_taken += 1;
        let t = sampler::linear_temperature(cur_step, p.steps, p.t_min, p.t_max)?;
        sampler::apply_temperature(logits, t);
        let logits = &*logits;
        self.argmax = sampler::argmax_canvas(logits, vocab)?;
        if cur_step == 1 {
            return Ok(Step::Last(self.result(logits)?));
        }
        self.cur_step -= 1;
        let denoiser = if p.temperature <= 0.0 {
            self.argmax.clone()
        } else {
            sampler::sample_canvas(logits, vocab, p.temperature, rng)?
        };

        let has_probs = match p.sampler {
            BlockSampler::Entropy { bound } => {
                let entropy = sampler::entropy_and_probs_into(logits, vocab, probs)?;
                let accept = sampler::entropy_transfer_mask(&entropy, len, bound)?;
                let fresh = noise(rng, vocab, len)?;
                let (_, next) =
                    sampler::entropy_bound_update(&accept, &denoiser, &self.current, &fresh)?;
                self.current = next;
                self.revealed = accept;
                self.draft = self.argmax.clone();
                true
            }
            BlockSampler::Confidence { threshold } => {
                let confidence = sampler::token_probability(logits, vocab, &denoiser)?;
                let unrevealed: Vec<bool> = self.revealed.iter().map(|r| !r).collect();
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
                    &mut self.revealed,
                    &mut self.draft,
                )?;
                self.current = next;
                false
            }
        };

        if !has_probs && self.revealed.iter().all(|&r| r) {
            return Ok(Step::Stopped(self.result(logits)?));
        }
        if let Some(stop) = self.stability.as_mut() {
            if stop.check(&self.argmax, logits, vocab)? {
                return Ok(Step::Stopped(self.result(logits)?));
            }
        }
        if !has_probs {
            sampler::softmax_precise_into(logits, vocab, probs)?;
        }
        Ok(Step::Continue)
    }
}
