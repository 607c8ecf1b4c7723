//! The generation driver: runs one or more requests together, block after block.
//!
//! Each round, the decoder passes of every sequence still denoising run as one batched forward
//! pass (`TextModel::decode_batch`: the weights are read once for the whole batch), and so do
//! their prompt prefills, their self-conditioning products and the encoder passes that append
//! committed blocks. Everything else is per sequence: its cache, its random generator (drawn in
//! the same order as when it runs alone), sampler state, detokenizer and statistics, so a
//! sequence's tokens do not depend on what it is batched with. A single `generate` is a batch
//! of one.

use std::ops::ControlFlow;
use std::time::Instant;

use dg_core::{DecoderInput, EncoderInput, KvCache, TextModel};
use dg_tokenize::StreamDetokenizer;

use crate::canvas::{BlockParams, BlockResult, BlockSampler, BlockState, Step};
use crate::error::Result;
use crate::output::{Event, FinishReason, Generation, Stats};
use crate::prompt::{encoder_input, PreparedPrompt};
use crate::request::{Request, Sampler};
use crate::rng::Rng;
use crate::settings::GenerationSettings;

/// Receives `(sequence index, event)`; `Break` cancels that sequence.
pub(crate) type OnEvent<'a> = dyn FnMut(usize, Event) -> ControlFlow<()> + 'a;

/// A request resolved against the model and its settings.
pub(crate) struct Job<'a> {
    pub request: &'a Request,
    pub prompt: PreparedPrompt,
    pub settings: &'a GenerationSettings,
    /// The model's EOS ids (the settings may add more).
    pub eos: &'a [u32],
}

enum Phase {
    Denoising(Box<BlockState>),
    /// A committed block waits to be appended to the cache.
    Committing(Vec<u32>),
    Done,
}

/// One request in flight.
struct Sequence<'a> {
    index: usize,
    request: &'a Request,
    params: BlockParams,
    model_canvas: usize,
    min_canvas: usize,
    max_canvas: usize,
    eos: Vec<u32>,
    rng: Rng,
    cache: KvCache,
    stats: Stats,
    detok: StreamDetokenizer,
    text: String,
    tokens: Vec<u32>,
    block: usize,
    phase: Phase,
    finish: FinishReason,
    cancelled: bool,
}

impl<'a> Sequence<'a> {
    fn new(index: usize, job: &Job<'a>, model: &TextModel, detok: StreamDetokenizer) -> Self {
        let (request, settings) = (job.request, job.settings);
        let mut eos = job.eos.to_vec();
        eos.extend(&settings.extra_eos);
        let sampler = match request.sampler {
            Sampler::ConfidenceThreshold { threshold } => BlockSampler::Confidence {
                threshold: threshold as f64,
            },
            Sampler::EntropyBound { bound } => BlockSampler::Entropy {
                bound: bound.map_or(settings.entropy_bound, f64::from),
            },
        };
        let model_canvas = model.config().canvas_length;
        let max_canvas = if request.full_canvas {
            model_canvas
        } else {
            model_canvas.min(request.max_canvas.unwrap_or(model_canvas))
        };
        Sequence {
            index,
            request,
            params: BlockParams {
                len: 0,
                steps: request.steps.unwrap_or(settings.steps),
                sampler,
                temperature: request.temperature as f64,
                t_min: settings.t_min,
                t_max: settings.t_max,
                stop: settings.stop,
            },
            model_canvas,
            min_canvas: max_canvas.min(request.min_canvas.unwrap_or(64)),
            max_canvas,
            eos,
            rng: Rng::new(request.seed),
            cache: model.new_cache(),
            stats: Stats {
                prompt_tokens: job.prompt.ids.len(),
                ..Stats::default()
            },
            detok,
            text: String::new(),
            tokens: Vec::new(),
            block: 0,
            phase: Phase::Done,
            finish: FinishReason::Length,
            cancelled: false,
        }
    }

    fn emit(&mut self, on_event: &mut OnEvent<'_>, event: Event) {
        if on_event(self.index, event).is_break() {
            self.cancelled = true;
        }
    }

    /// Starts the next block, or ends the sequence.
    fn next_block(&mut self, vocab: usize, started: Instant) -> Result<()> {
        if self.cancelled || self.stats.generated_tokens >= self.request.max_tokens {
            self.end(started);
            return Ok(());
        }
        self.block += 1;
        let remaining = self.request.max_tokens - self.stats.generated_tokens;
        let mut params = self.params.clone();
        params.len = if self.request.full_canvas {
            self.model_canvas
        } else {
            self.max_canvas.min(remaining.max(self.min_canvas))
        };
        self.phase = Phase::Denoising(Box::new(BlockState::start(params, vocab, &mut self.rng)?));
        Ok(())
    }

    fn end(&mut self, started: Instant) {
        self.phase = Phase::Done;
        self.stats.generation_time = started.elapsed();
    }

    /// Emits the draft of the step just taken.
    fn emit_draft(&mut self, on_event: &mut OnEvent<'_>) {
        let Phase::Denoising(state) = &self.phase else {
            return;
        };
        let event = Event::Draft {
            block: self.block,
            step: state.step_number(),
            total_steps: state.params().steps,
            canvas: state.draft().iter().map(|&t| t as u32).collect(),
            revealed: state.revealed().to_vec(),
        };
        self.emit(on_event, event);
    }

    /// Commits a finished block: tokens up to an EOS or the token limit, text deltas, the
    /// block's end; then either ends or queues the block for the cache.
    fn finish_block(
        &mut self,
        result: BlockResult,
        on_event: &mut OnEvent<'_>,
        started: Instant,
    ) -> Result<()> {
        let len = result.tokens.len();
        self.stats.canvases += 1;
        self.stats.canvas_tokens += len;
        self.stats.denoising_steps += result.steps;
        self.stats.steps_per_block.push(result.steps);
        self.stats.work_tokens += len * result.steps;

        let mut committed = Vec::new();
        let mut stopped = false;
        for &token in &result.tokens {
            self.stats.generated_tokens += 1;
            if self.eos.contains(&token) {
                stopped = true;
                self.finish = FinishReason::Stop;
                break;
            }
            committed.push(token);
            if let Some(delta) = self.detok.push(token)?.filter(|d| !d.is_empty()) {
                self.text.push_str(&delta);
                self.emit(on_event, Event::Text(delta));
            }
            if self.stats.generated_tokens >= self.request.max_tokens {
                stopped = true;
                self.finish = FinishReason::Length;
                break;
            }
        }
        self.tokens.extend(&committed);
        let event = Event::BlockEnd {
            block: self.block,
            steps: result.steps,
            tokens: committed,
        };
        self.emit(on_event, event);
        if stopped || self.cancelled {
            self.end(started);
        } else {
            // The committed canvas joins the prompt in the cache for the next block.
            self.phase = Phase::Committing(result.tokens);
        }
        Ok(())
    }

    fn into_generation(mut self, on_event: &mut OnEvent<'_>) -> Result<Generation> {
        let tail = self.detok.flush()?;
        if !tail.is_empty() {
            self.text.push_str(&tail);
            let _ = on_event(self.index, Event::Text(tail));
        }
        Ok(Generation {
            text: self.text,
            token_ids: self.tokens,
            finish_reason: if self.cancelled {
                FinishReason::Cancelled
            } else {
                self.finish
            },
            stats: self.stats,
        })
    }
}

/// Runs `jobs` to completion; `detok` makes each sequence's streaming detokenizer.
pub(crate) fn run<'a>(
    model: &TextModel,
    pool: &rayon::ThreadPool,
    jobs: &[Job<'a>],
    detok: impl Fn() -> StreamDetokenizer,
    on_event: &mut OnEvent<'_>,
) -> Result<Vec<Generation>> {
    let vocab = model.vocab_size();
    let mut seqs: Vec<Sequence<'a>> = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| Sequence::new(i, job, model, detok()))
        .collect();

    let start = Instant::now();
    pool.install(|| prefill(model, jobs, &mut seqs))?;
    let prefill_time = start.elapsed();
    let started = Instant::now();
    for (seq, job) in seqs.iter_mut().zip(jobs) {
        seq.stats.prefill_time = prefill_time;
        seq.emit(
            on_event,
            Event::Prefilled {
                prompt_tokens: job.prompt.ids.len(),
            },
        );
        seq.next_block(vocab, started)?;
    }

    while seqs.iter().any(|s| matches!(s.phase, Phase::Denoising(_))) {
        denoise_round(model, pool, &mut seqs, on_event, started)?;
        commit_round(model, pool, &mut seqs, started)?;
    }
    seqs.into_iter()
        .map(|s| s.into_generation(on_event))
        .collect()
}

/// Prefills every prompt in one batched encoder pass.
fn prefill(model: &TextModel, jobs: &[Job<'_>], seqs: &mut [Sequence<'_>]) -> Result<()> {
    let (embeddings, blocks): (Vec<_>, Vec<_>) = jobs
        .iter()
        .map(|job| encoder_input(model, &job.prompt))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let mut inputs: Vec<EncoderInput<'_>> = seqs
        .iter_mut()
        .zip(embeddings)
        .zip(&blocks)
        .map(|((seq, embeddings), blocks)| EncoderInput {
            cache: &mut seq.cache,
            embeddings,
            image_blocks: blocks.as_deref(),
        })
        .collect();
    model.encode_batch(&mut inputs, |_, _, _| {})?;
    Ok(())
}

/// One denoising step of every denoising sequence: one batched decoder pass, the samplers,
/// then one batched self-conditioning product for the blocks that go on.
fn denoise_round(
    model: &TextModel,
    pool: &rayon::ThreadPool,
    seqs: &mut [Sequence<'_>],
    on_event: &mut OnEvent<'_>,
    started: Instant,
) -> Result<()> {
    let active: Vec<usize> = (0..seqs.len())
        .filter(|&i| matches!(seqs[i].phase, Phase::Denoising(_)))
        .collect();
    let canvases: Vec<Vec<u32>> = active.iter().map(|&i| state(&seqs[i]).canvas()).collect();
    let inputs: Vec<DecoderInput<'_>> = active
        .iter()
        .zip(&canvases)
        .map(|(&i, canvas)| DecoderInput {
            cache: &seqs[i].cache,
            canvas,
            self_conditioning: state(&seqs[i]).self_conditioning(),
        })
        .collect();
    let logits = pool.install(|| model.decode_batch(&inputs))?;

    let mut continuing: Vec<(usize, Vec<f32>)> = Vec::new();
    for (&i, logits) in active.iter().zip(logits) {
        let seq = &mut seqs[i];
        let Phase::Denoising(state) = &mut seq.phase else {
            unreachable!("active sequences are denoising")
        };
        match state.step(logits, &mut seq.rng)? {
            Step::Last(result) => seq.finish_block(result, on_event, started)?,
            Step::Stopped(result) => {
                seq.emit_draft(on_event);
                if seq.cancelled {
                    seq.end(started);
                } else {
                    seq.finish_block(result, on_event, started)?;
                }
            }
            Step::Continue(probs) => {
                seq.emit_draft(on_event);
                if seq.cancelled {
                    seq.end(started);
                } else {
                    continuing.push((i, probs));
                }
            }
        }
    }
    if continuing.is_empty() {
        return Ok(());
    }
    let (vocab, hidden) = (model.vocab_size(), model.hidden_size());
    let probs: Vec<f32> = continuing.iter().flat_map(|(_, p)| p).copied().collect();
    let embeddings = pool.install(|| model.soft_embeddings(&probs, probs.len() / vocab))?;
    let mut at = 0;
    for (i, p) in continuing {
        let n = p.len() / vocab * hidden;
        if let Phase::Denoising(state) = &mut seqs[i].phase {
            state.set_self_conditioning(embeddings[at..at + n].to_vec());
        }
        at += n;
    }
    Ok(())
}

/// Appends every committed block to its cache in one batched encoder pass, then starts each
/// sequence's next block.
fn commit_round(
    model: &TextModel,
    pool: &rayon::ThreadPool,
    seqs: &mut [Sequence<'_>],
    started: Instant,
) -> Result<()> {
    let mut committing: Vec<&mut Sequence<'_>> = seqs
        .iter_mut()
        .filter(|s| matches!(s.phase, Phase::Committing(_)))
        .collect();
    if committing.is_empty() {
        return Ok(());
    }
    let mut inputs = Vec::with_capacity(committing.len());
    for seq in committing.iter_mut() {
        let Phase::Committing(tokens) = &seq.phase else {
            unreachable!("filtered above")
        };
        // As the reference re-encodes ids: an image token id embeds as the pad token.
        let embeddings = model.embed_prompt(tokens)?;
        inputs.push(EncoderInput {
            cache: &mut seq.cache,
            embeddings,
            image_blocks: None,
        });
    }
    pool.install(|| model.encode_batch(&mut inputs, |_, _, _| {}))?;
    drop(inputs);
    let vocab = model.vocab_size();
    for seq in committing {
        seq.next_block(vocab, started)?;
    }
    Ok(())
}

fn state<'s>(seq: &'s Sequence<'_>) -> &'s BlockState {
    match &seq.phase {
        Phase::Denoising(state) => state,
        _ => unreachable!("only denoising sequences are asked for a canvas"),
    }
}
