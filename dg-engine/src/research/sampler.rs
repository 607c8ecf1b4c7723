//! The reference's per-step sampling math (mlx-optiq 0.7.7,
//! `optiq/vlm/_mlxvlm/generate/diffusion.py`) as pure functions on f32 slices.
//!
//! Logits are `[rows, vocab]` row-major: one canvas of one batch row is `[L, V]`, as the
//! reference's `(1, L, V)`. Functions that reduce over positions (the transfer masks) take
//! `[batch, L]` values and work per canvas row of length `canvas_len`. Every value is computed
//! as MLX computes it on the CPU (see [`crate::mlx_math`]), so results are bit-identical to the
//! float32 reference, not merely close.
//!
//! # One block, step by step, as `stream_diffusion_generate` runs it (diffusion.py 509-1024)
//!
//! Defaults: `steps = 48`, schedule `t_min 0.4`, `t_max 0.8`, entropy bound `0.1`,
//! confidence threshold `0.9`, no stop check unless the model config carries a generation
//! config, `diffusion_show_unmasking = False`.
//!
//! Block setup (706-793): run the encoder on the prompt (first block) or on the previous block's
//! emitted canvas (later blocks); `L = min(max_canvas, max(remaining, min_canvas))` (734-739);
//! `current = randint(0, vocab, (1, L))` (**RNG draw 1**, 751); `revealed = all false`,
//! `draft = current` (757-758); no self-conditioning; empty stability history (775).
//!
//! For `cur_step` = `steps`, `steps - 1`, ..., 1 (795):
//! 1. `logits = decoder(current, self_conditioning)` (796-828; without self-conditioning on the
//!    first step of a block).
//! 2. `logits = logits / t` with `t = linear_temperature(cur_step)` (829-835; in the logits'
//!    dtype: [`linear_temperature`], [`apply_temperature`]).
//! 3. `argmax = argmax(logits)` (837, [`argmax_canvas`]). If `cur_step == 1`: **break** (840).
//!    Every step that continues has `cur_step >= 2`, so the `cur_step == 1` branches below
//!    (`force_all`, the plain-entropy fallback) never run in a default generation.
//! 4. `denoiser = argmax` if `temperature <= 0`, else [`sample_canvas`] (843-851; **RNG draw**:
//!    one `categorical`).
//! 5. Entropy-bound (853-885):
//!    `(entropy, probs) =` [`entropy_and_probs`] (the compiled `exp(logits - logsumexp)`
//!    chain); `accept =` [`entropy_transfer_mask`]`(entropy, 0.1)`;
//!    `accepted = where(accept, denoiser, current)`;
//!    `current = where(accept, accepted, randint(0, vocab, (1, L)))` (**RNG draw**).
//!    Not cumulative: positions accepted earlier are re-noised unless accepted again (the
//!    reference's `revealed = accept` and `draft = argmax` here only feed its display).
//!    Next self-conditioning input: `(probs @ embed_table) * embed_scale` from these `probs`.
//!    ([`entropy_bound_update`] does the two `where`s.)
//! 6. Confidence-threshold (886-919):
//!    `confidence =` [`token_probability`]`(logits, denoiser)`;
//!    `accept =` [`confidence_transfer_mask`]`(confidence, !revealed, 0.9, force_all =
//!    cur_step == 1)`; `accepted = where(accept, denoiser, draft)`;
//!    `current = where(revealed | accept, accepted, randint(0, vocab, (1, L)))` (**RNG draw**,
//!    taken even when nothing is left to reveal); `revealed |= accept`;
//!    `draft = where(accept, accepted, draft)`. ([`confidence_update`] does these.)
//! 7. Confidence-threshold only: if every position is revealed, **break** (943-947).
//! 8. Stop check (949-955): [`StabilityStop::check`]`(argmax, logits)`; **break** if true.
//!    With no stopping config (the default) it is always false and keeps no history.
//! 9. Self-conditioning for the next step (957-964): entropy-bound reuses the probabilities of
//!    step 5; confidence-threshold computes [`softmax_precise`]`(logits)`. Both from the
//!    temperature-divided logits, then `(probs @ embed_table) * embed_scale` (the table
//!    dequantized once per call; in the bf16 reference `probs` are rounded to bf16 first).
//!
//! After the loop (966-995) the emitted block is `argmax` from the **last computed logits**
//! (not the accepted/draft canvas), and becomes the next encoder input. Tokens are emitted in
//! order; an EOS token stops generation (it is counted but not emitted as text); so does
//! reaching `max_tokens`.
//!
//! RNG draws per block: one `randint` at setup, then per executed step (every step but the
//! last, or up to an early break) an optional `categorical` (temperature > 0) followed by one
//! `randint`. `diffusion_show_unmasking=True` changes this (the `cur_step == 1` step then
//! samples too), which is why it is not a display-only option in the reference.
//!
//! In the bf16 reference (as shipped) the division of step 2 happens in bf16 (`t` rounded to
//! bf16 first, checked) and `argmax` sees bf16 logits; the helpers then cast to f32. This
//! module, like dg, works in f32 and matches the float32 reference.
//!
//! The test `denoising_loop_matches_reference` (dg-engine/tests/sampler.rs) runs exactly this
//! algorithm against the real `stream_diffusion_generate` driven by a fake model, and checks
//! every canvas fed to the model, the emitted tokens and the final RNG state.

use std::collections::VecDeque;

use dg_quant::alloc;
use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::mlx_math;
use crate::rng::Rng;

/// Checks `[rows, vocab]` logits and returns `rows`.
fn rows_of(logits: &[f32], vocab: usize, name: &'static str) -> Result<usize> {
    if vocab == 0 || !logits.len().is_multiple_of(vocab) {
        return Err(EngineError::Shape {
            name,
            reason: format!(
                "{} values are not whole rows of vocab {vocab}",
                logits.len()
            ),
        });
    }
    Ok(logits.len() / vocab)
}

/// Checks that `[batch, canvas_len]` per-position arrays have whole rows.
fn check_canvas(len: usize, canvas_len: usize, name: &'static str) -> Result<()> {
    if canvas_len == 0 || !len.is_multiple_of(canvas_len) {
        return Err(EngineError::Shape {
            name,
            reason: format!("{len} values are not whole canvases of length {canvas_len}"),
        });
    }
    Ok(())
}

fn same_len(len: usize, expected: usize, name: &'static str) -> Result<()> {
    if len != expected {
        return Err(EngineError::Shape {
            name,
            reason: format!("{len} values, expected {expected}"),
        });
    }
    Ok(())
}

/// `_diffusion_linear_temperature` (diffusion.py 208-217), in f64 as Python computes it:
/// `t_min + ((t_max - t_min) * (cur_step / steps))`. `cur_step` counts down from `steps` to 1,
/// so the first step of a block is the hottest (`t_max`).
///
/// The grouping matters in f64: `(t_max - t_min) * cur_step / steps` differs in the last bit
/// for about 1 in 10 `(cur_step, steps)` pairs (never after the f32 rounding of
/// [`apply_temperature`] for 0.4 / 0.8, but keep the reference's order).
pub fn linear_temperature(cur_step: usize, steps: usize, t_min: f64, t_max: f64) -> Result<f64> {
    if steps == 0 {
        return Err(EngineError::InvalidArgument {
            name: "steps",
            reason: "the schedule needs at least one denoising step".into(),
        });
    }
    Ok(t_min + ((t_max - t_min) * (cur_step as f64 / steps as f64)))
}

/// `processed_logits / schedule_temperature` (diffusion.py 835) for float32 logits: MLX turns
/// the Python float into an f32 scalar and **divides** (multiplying by `1/t` rounds
/// differently).
pub fn apply_temperature(logits: &mut [f32], temperature: f64) {
    let t = temperature as f32;
    logits.par_chunks_mut(ELEMENTWISE_CHUNK).for_each(|xs| {
        for x in xs {
            *x /= t;
        }
    });
}

/// Elements per task of the samplers' elementwise passes over a canvas's logits.
const ELEMENTWISE_CHUNK: usize = 1 << 16;

/// `mx.argmax(logits, axis=-1).astype(int32)` (diffusion.py 837): first maximal index per row.
pub fn argmax_canvas(logits: &[f32], vocab: usize) -> Result<Vec<u32>> {
    rows_of(logits, vocab, "logits")?;
    Ok(logits
        .par_chunks_exact(vocab)
        .map(|row| mlx_math::argmax(row) as u32)
        .collect())
}

/// `_diffusion_sample_canvas` (diffusion.py 220-230): argmax when `temperature <= 0`, else
/// `mx.random.categorical(logits / temperature)` (no division when `temperature == 1`), one
/// draw from `rng` covering all rows.
///
/// Pass every row of the `(batch, L, V)` logits at once: MLX draws one Gumbel array for the
/// whole tensor (and uses its inverse-CDF path when there is a single row). The divided
/// logits and the noise are never written out: each row hashes only the words that can win
/// ([`crate::rng::categorical_scaled_with_key`]).
pub fn sample_canvas(
    logits: &[f32],
    vocab: usize,
    temperature: f64,
    rng: &mut Rng,
) -> Result<Vec<u32>> {
    let rows = rows_of(logits, vocab, "logits")?;
    if temperature <= 0.0 {
        return argmax_canvas(logits, vocab);
    }
    rng.categorical_scaled(logits, &[rows, vocab], temperature as f32)
}

/// `mx.logsumexp(logits, axis=-1)` per row.
pub fn logsumexp_rows(logits: &[f32], vocab: usize) -> Result<Vec<f32>> {
    rows_of(logits, vocab, "logits")?;
    Ok(dg_quant::mlx::max_sum_exp_rows(logits, vocab)
        .into_iter()
        .map(|(m, s)| mlx_math::logsumexp_of(m, s))
        .collect())
}

/// Per row, `logits[token] - logsumexp(logits)`: the log-probability of `tokens` (dg's own,
/// for reporting; the reference reports none).
pub fn token_logprobs(logits: &[f32], vocab: usize, tokens: &[u32]) -> Result<Vec<f32>> {
    let rows = rows_of(logits, vocab, "logits")?;
    same_len(tokens.len(), rows, "tokens")?;
    let lse = logsumexp_rows(logits, vocab)?;
    logits
        .chunks_exact(vocab)
        .zip(tokens)
        .zip(lse)
        .map(|((row, &t), lse)| {
            let x = usize::try_from(t)
                .ok()
                .and_then(|t| row.get(t))
                .ok_or_else(|| EngineError::InvalidArgument {
                    name: "tokens",
                    reason: format!("token {t} is outside the vocabulary of {vocab}"),
                })?;
            Ok(x - lse)
        })
        .collect()
}

/// `_diffusion_token_probability` (diffusion.py 233-243): per row,
/// `exp(logits[token] - logsumexp(logits))` with MLX's exp: the confidence of `tokens`.
pub fn token_probability(logits: &[f32], vocab: usize, tokens: &[u32]) -> Result<Vec<f32>> {
    let logprobs = token_logprobs(logits, vocab, tokens)?;
    Ok(logprobs.into_iter().map(mlx_math::exp).collect())
}

/// One row of the entropy chain: writes `exp(logits - lse)` into `probs`, returns
/// `-sum(probs * (logits - lse))`.
fn entropy_row(row: &[f32], probs: Option<&mut [f32]>) -> f32 {
    let lse = mlx_math::logsumexp(row);
    // `p = exp(x - lse)` on the kernels, then `acc += p * log_p` left to right.
    let mut acc = 0.0_f32;
    let mut accumulate = |xs: &[f32], ps: &[f32]| {
        for (&x, &p) in xs.iter().zip(ps) {
            acc += p * (x - lse);
        }
    };
    match probs {
        Some(out) => {
            mlx_math::exp_shifted(row, lse, out);
            accumulate(row, out);
        }
        None => {
            let mut buf = [0.0_f32; 1024];
            for xs in row.chunks(buf.len()) {
                let ps = &mut buf[..xs.len()];
                mlx_math::exp_shifted(xs, lse, ps);
                accumulate(xs, ps);
            }
        }
    }
    -acc
}

/// `_diffusion_token_entropy` (diffusion.py 246-250): per row, `-sum(p * log_p)` with
/// `log_p = logits - logsumexp`, `p = exp(log_p)`, summed in f32 left to right.
pub fn token_entropy(logits: &[f32], vocab: usize) -> Result<Vec<f32>> {
    rows_of(logits, vocab, "logits")?;
    Ok(logits
        .par_chunks_exact(vocab)
        .map(|row| entropy_row(row, None))
        .collect())
}

/// `_diffusion_entropy_probs_chain` (diffusion.py 270-275, `mx.compile`d; the compiled
/// kernel computes exactly the eager values): `(entropy, probs)`, `probs = exp(logits -
/// logsumexp)` (`[rows, vocab]`), the entropy-bound sampler's soft-embedding weights.
pub fn entropy_and_probs(logits: &[f32], vocab: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut probs = alloc::zeroed(logits.len(), "probabilities [canvas, vocab]")?;
    let entropy = entropy_and_probs_into(logits, vocab, &mut probs)?;
    Ok((entropy, probs))
}

/// [`entropy_and_probs`] writing the probabilities into `probs` (as long as `logits`);
/// returns the entropies.
pub fn entropy_and_probs_into(logits: &[f32], vocab: usize, probs: &mut [f32]) -> Result<Vec<f32>> {
    let rows = rows_of(logits, vocab, "logits")?;
    same_len(probs.len(), logits.len(), "probs")?;
    let mut entropy = Vec::new();
    alloc::reserve(&mut entropy, rows, "entropy")?;
    logits
        .par_chunks_exact(vocab)
        .zip(probs.par_chunks_exact_mut(vocab))
        .map(|(row, out)| entropy_row(row, Some(out)))
        .collect_into_vec(&mut entropy);
    Ok(entropy)
}

/// `mx.softmax(logits, axis=-1, precise=True)` (`_diffusion_soft_embeddings`, diffusion.py
/// 289-298), the confidence sampler's soft-embedding weights: `exp(x - max) * (1 / sum)`.
/// Differs from [`entropy_and_probs`]'s probabilities in the last bits. The decoder's
/// `SelfConditioning::Logits` runs the same softmax (`dg_quant::mlx::softmax`).
pub fn softmax_precise(logits: &[f32], vocab: usize) -> Result<Vec<f32>> {
    let mut probs = alloc::zeroed(logits.len(), "probabilities [canvas, vocab]")?;
    softmax_precise_into(logits, vocab, &mut probs)?;
    Ok(probs)
}

/// [`softmax_precise`] into `probs` (as long as `logits`).
pub fn softmax_precise_into(logits: &[f32], vocab: usize, probs: &mut [f32]) -> Result<()> {
    rows_of(logits, vocab, "logits")?;
    same_len(probs.len(), logits.len(), "probs")?;
    dg_quant::mlx::softmax_rows(logits, vocab, probs);
    Ok(())
}

/// `_diffusion_confidence_transfer_mask` (diffusion.py 301-320), per canvas row:
/// `unrevealed & (confidence >= f32(threshold))`; if a row still has unrevealed positions but
/// none passes, the unrevealed position of highest confidence is forced (first index on
/// ties, as `mx.argmax`). `force_all` returns `unrevealed`.
pub fn confidence_transfer_mask(
    confidence: &[f32],
    unrevealed: &[bool],
    canvas_len: usize,
    threshold: f64,
    force_all: bool,
) -> Result<Vec<bool>> {
    check_canvas(confidence.len(), canvas_len, "confidence")?;
    same_len(unrevealed.len(), confidence.len(), "unrevealed")?;
    if force_all {
        return Ok(unrevealed.to_vec());
    }
    let threshold = threshold as f32;
    let mut out = Vec::with_capacity(confidence.len());
    for (conf, unrev) in confidence
        .chunks_exact(canvas_len)
        .zip(unrevealed.chunks_exact(canvas_len))
    {
        let start = out.len();
        out.extend(conf.iter().zip(unrev).map(|(&c, &u)| u && c >= threshold));
        let has_unrevealed = unrev.iter().any(|&u| u);
        let has_transfer = out[start..].iter().any(|&t| t);
        if has_unrevealed && !has_transfer {
            let masked: Vec<f32> = conf
                .iter()
                .zip(unrev)
                .map(|(&c, &u)| if u { c } else { f32::NEG_INFINITY })
                .collect();
            out[start + mlx_math::argmax(&masked)] = true;
        }
    }
    Ok(out)
}

/// `_diffusion_entropy_transfer_mask` (diffusion.py 323-341), per canvas row: sort entropies
/// ascending (stable: ties keep the lower index first; NaN last), accept each sorted position
/// whose `cumsum - cummax <= f32(bound)` (f32 scans, left to right). The lowest-entropy
/// position always passes (`e - e = 0`).
pub fn entropy_transfer_mask(entropy: &[f32], canvas_len: usize, bound: f64) -> Result<Vec<bool>> {
    check_canvas(entropy.len(), canvas_len, "entropy")?;
    let bound = bound as f32;
    let mut out = vec![false; entropy.len()];
    let mut order: Vec<usize> = Vec::with_capacity(canvas_len);
    for (row, mask) in entropy
        .chunks_exact(canvas_len)
        .zip(out.chunks_exact_mut(canvas_len))
    {
        order.clear();
        order.extend(0..canvas_len);
        // MLX's comparator: NaN is never less, anything else is less than NaN; equal values
        // keep index order (-0.0 == 0.0 counts as equal, so no total_cmp).
        order.sort_by(|&a, &b| {
            let (x, y) = (row[a], row[b]);
            match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                (false, false) => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
            }
        });
        let mut cumsum = 0.0_f32;
        let mut cummax = f32::NEG_INFINITY;
        for (k, &i) in order.iter().enumerate() {
            let e = row[i];
            // Inclusive scans: the first output is the first input itself.
            if k == 0 {
                cumsum = e;
                cummax = e;
            } else {
                cumsum += e;
                cummax = mlx_math::maximum(cummax, e);
            }
            mask[i] = cumsum - cummax <= bound;
        }
    }
    Ok(out)
}

/// The two `mx.where`s of an entropy-bound step (diffusion.py 869-883):
/// `accepted = where(accept, denoiser, current)` and the next model input
/// `where(accept, accepted, noise)` (`noise` is the step's fresh `randint` canvas). Returns
/// `(accepted, next_current)`.
pub fn entropy_bound_update(
    accept: &[bool],
    denoiser: &[u32],
    current: &[u32],
    noise: &[u32],
) -> Result<(Vec<u32>, Vec<u32>)> {
    let n = accept.len();
    same_len(denoiser.len(), n, "denoiser")?;
    same_len(current.len(), n, "current")?;
    same_len(noise.len(), n, "noise")?;
    let accepted: Vec<u32> = (0..n)
        .map(|i| if accept[i] { denoiser[i] } else { current[i] })
        .collect();
    let next = (0..n)
        .map(|i| if accept[i] { accepted[i] } else { noise[i] })
        .collect();
    Ok((accepted, next))
}

/// The updates of a confidence-threshold step (diffusion.py 899-919), in place on the
/// block's `revealed` mask and `draft` canvas:
/// `accepted = where(accept, denoiser, draft)`,
/// next model input `where(revealed | accept, accepted, noise)`, `revealed |= accept`,
/// `draft = where(accept, accepted, draft)`. Returns `(accepted, next_current)`.
pub fn confidence_update(
    accept: &[bool],
    denoiser: &[u32],
    noise: &[u32],
    revealed: &mut [bool],
    draft: &mut [u32],
) -> Result<(Vec<u32>, Vec<u32>)> {
    let n = accept.len();
    same_len(denoiser.len(), n, "denoiser")?;
    same_len(noise.len(), n, "noise")?;
    same_len(revealed.len(), n, "revealed")?;
    same_len(draft.len(), n, "draft")?;
    let accepted: Vec<u32> = (0..n)
        .map(|i| if accept[i] { denoiser[i] } else { draft[i] })
        .collect();
    let next = (0..n)
        .map(|i| {
            if revealed[i] || accept[i] {
                accepted[i]
            } else {
                noise[i]
            }
        })
        .collect();
    for i in 0..n {
        revealed[i] |= accept[i];
        if accept[i] {
            draft[i] = accepted[i];
        }
    }
    Ok((accepted, next))
}

/// The stable-and-confident stop check (`_diffusion_stable_and_confident`, diffusion.py
/// 415-443), with the history it keeps across the steps of one block.
///
/// A step stops the block when the argmax canvas equals each of the last
/// `stability_threshold` argmax canvases **and** the mean token entropy of the
/// temperature-divided logits is below `confidence_threshold`.
#[derive(Clone, Debug)]
pub struct StabilityStop {
    stability_threshold: usize,
    confidence_threshold: f64,
    history: VecDeque<Vec<u32>>,
}

impl StabilityStop {
    /// Reference defaults when a stopping config exists but omits a key: `stability_threshold`
    /// 1, `confidence_threshold` 0.005.
    pub const DEFAULT_STABILITY_THRESHOLD: usize = 1;
    /// See [`Self::DEFAULT_STABILITY_THRESHOLD`].
    pub const DEFAULT_CONFIDENCE_THRESHOLD: f64 = 0.005;

    /// A check with an empty history (one per block).
    pub fn new(stability_threshold: usize, confidence_threshold: f64) -> Self {
        Self {
            stability_threshold,
            confidence_threshold,
            history: VecDeque::new(),
        }
    }

    /// Forgets the history (a new block).
    pub fn reset(&mut self) {
        self.history.clear();
    }

    /// One step's check: compares `argmax` (an owned copy is kept) with the history, pushes
    /// it, and when stable tests `mean(token_entropy(logits)) < f32(confidence_threshold)`
    /// (mean = f32 sum times f32(1 / count)).
    ///
    /// Quirk kept: with `stability_threshold == 0` every step counts as stable.
    pub fn check(&mut self, argmax: &[u32], logits: &[f32], vocab: usize) -> Result<bool> {
        let rows = rows_of(logits, vocab, "logits")?;
        same_len(argmax.len(), rows, "argmax")?;
        if let Some(h) = self.history.front() {
            same_len(h.len(), argmax.len(), "argmax")?;
        }
        let stable = self.history.len() == self.stability_threshold
            && self.history.iter().all(|h| h.as_slice() == argmax);
        self.history.push_back(argmax.to_vec());
        if self.history.len() > self.stability_threshold {
            self.history.pop_front();
        }
        if !stable {
            return Ok(false);
        }
        let entropy = token_entropy(logits, vocab)?;
        let mean = mlx_math::sum(&entropy) * ((1.0 / rows as f64) as f32);
        Ok(mean < self.confidence_threshold as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_endpoints() {
        assert_eq!(
            linear_temperature(48, 48, 0.4, 0.8).unwrap(),
            0.4 + 0.4 * 1.0
        );
        assert_eq!(linear_temperature(0, 48, 0.4, 0.8).unwrap(), 0.4);
        assert!(linear_temperature(1, 0, 0.4, 0.8).is_err());
    }

    #[test]
    fn confidence_mask_forces_first_best() {
        let conf = [0.5, 0.7, 0.7, 0.95];
        let unrev = [true, true, true, false];
        let m = confidence_transfer_mask(&conf, &unrev, 4, 0.9, false).unwrap();
        assert_eq!(m, vec![false, true, false, false]);
        let all_revealed = confidence_transfer_mask(&conf, &[false; 4], 4, 0.9, false).unwrap();
        assert_eq!(all_revealed, vec![false; 4]);
        let forced = confidence_transfer_mask(&conf, &unrev, 4, 0.9, true).unwrap();
        assert_eq!(forced, unrev.to_vec());
    }

    #[test]
    fn confidence_threshold_compares_in_f32() {
        // f32(0.9) < 0.9: a confidence equal to f32(0.9) passes.
        let c = 0.9_f64 as f32;
        let m = confidence_transfer_mask(&[c, 0.1], &[true, true], 2, 0.9, false).unwrap();
        assert_eq!(m, vec![true, false]);
    }

    #[test]
    fn entropy_mask_keeps_lowest_and_ties_by_index() {
        let m = entropy_transfer_mask(&[0.5, 0.5, 2.0], 3, 0.1).unwrap();
        assert_eq!(m, vec![true, false, false]);
        let m = entropy_transfer_mask(&[0.02, 0.03, 0.06, 0.9], 4, 0.1).unwrap();
        assert_eq!(m, vec![true, true, true, false]);
    }

    #[test]
    fn shapes_are_checked() {
        assert!(argmax_canvas(&[0.0; 5], 2).is_err());
        assert!(argmax_canvas(&[0.0; 4], 0).is_err());
        assert!(token_probability(&[0.0; 4], 2, &[0, 2]).is_err());
        assert!(token_probability(&[0.0; 4], 2, &[0]).is_err());
        assert!(confidence_transfer_mask(&[0.0; 3], &[true; 2], 3, 0.9, false).is_err());
        assert!(entropy_transfer_mask(&[0.0; 3], 2, 0.1).is_err());
        assert!(entropy_bound_update(&[true], &[1, 2], &[1], &[1]).is_err());
    }

    #[test]
    fn stability_needs_full_history() {
        let logits = [100.0, 0.0, 0.0, 100.0];
        let mut stop = StabilityStop::new(1, 0.005);
        assert!(!stop.check(&[0, 1], &logits, 2).unwrap());
        assert!(stop.check(&[0, 1], &logits, 2).unwrap());
        assert!(!stop.check(&[1, 1], &logits, 2).unwrap());
        let mut zero = StabilityStop::new(0, 0.005);
        assert!(zero.check(&[0, 1], &logits, 2).unwrap());
    }
}

#[cfg(test)]
mod logprob_tests {
    use super::*;

    #[test]
    fn token_logprobs_are_log_softmax_at_the_token() {
        let logits = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.25];
        let got = token_logprobs(&logits, 3, &[2, 0]).unwrap();
        for (row, (&t, g)) in logits.chunks(3).zip([2usize, 0].iter().zip(&got)) {
            let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
            assert!((*g as f64 - (row[t] as f64 - lse)).abs() < 1e-6, "{g}");
        }
        assert!(token_logprobs(&logits, 3, &[3, 0]).is_err());
        assert!(token_logprobs(&logits, 3, &[0]).is_err());
    }
}
