//! The generation driver: runs requests together, block after block.
//!
//! Each round, the decoder passes of every sequence still denoising run as one batched forward
//! pass (`TextModel::decode_batch`: the weights are read once for the whole batch), and so do
//! their prompt prefills, their self-conditioning products and the encoder passes that append
//! committed blocks. Everything else is per sequence: its cache, its random generator (drawn in
//! the same order as when it runs alone), sampler state, detokenizer and statistics, so a
//! sequence's tokens do not depend on what it is batched with. That is what lets sequences join
//! ([`Batch::admit`]) and leave ([`Batch::take_finished`]) between any two rounds: a single
//! `generate` and a fixed batch are runs of one [`Batch`], and the scheduler keeps one alive.

use std::ops::{ControlFlow, Range};
use std::time::Instant;

use dg_core::{DecoderInput, EncoderInput, KvCache, TextModel};
use dg_quant::alloc;
use dg_tokenize::StreamDetokenizer;

use crate::canvas::{BlockParams, BlockResult, BlockSampler, BlockState, Step};
use crate::error::Result;
use crate::output::{Event, FinishReason, Generation, Stats};
use crate::prompt::{encoder_input, PreparedPrompt};
use crate::request::{Request, Sampler};
use crate::rng::Rng;
use crate::settings::GenerationSettings;
use crate::stop::StopStrings;

/// Receives `(sequence key, event)`; `Break` cancels that sequence.
pub(crate) type OnEvent<'a> = dyn FnMut(usize, Event) -> ControlFlow<()> + 'a;

/// A request resolved against the model and its settings: everything a sequence needs, owned.
pub(crate) struct Job {
    pub prompt: PreparedPrompt,
    params: BlockParams,
    max_tokens: usize,
    full_canvas: bool,
    min_canvas: Option<usize>,
    max_canvas: Option<usize>,
    seed: u64,
    stop: Vec<String>,
    eos: Vec<u32>,
}

impl Job {
    /// `eos` is the model's EOS set; the settings may add more.
    pub fn new(
        request: &Request,
        prompt: PreparedPrompt,
        settings: &GenerationSettings,
        eos: &[u32],
    ) -> Self {
        let mut eos = eos.to_vec();
        eos.extend(&settings.extra_eos);
        let sampler = match request.sampler {
            Sampler::ConfidenceThreshold { threshold } => BlockSampler::Confidence {
                threshold: threshold as f64,
            },
            Sampler::EntropyBound { bound } => BlockSampler::Entropy {
                bound: bound.map_or(settings.entropy_bound, f64::from),
            },
        };
        Job {
            prompt,
            params: BlockParams {
                len: 0,
                steps: request.steps.unwrap_or(settings.steps),
                sampler,
                temperature: request.temperature as f64,
                t_min: settings.t_min,
                t_max: settings.t_max,
                stop: settings.stop,
                logprobs: request.logprobs,
            },
            max_tokens: request.max_tokens,
            full_canvas: request.full_canvas,
            min_canvas: request.min_canvas,
            max_canvas: request.max_canvas,
            seed: request.seed,
            stop: request.stop.clone(),
            eos,
        }
    }

    /// Prompt tokens plus the most tokens it may generate: what it can add to its cache.
    pub fn tokens(&self) -> usize {
        self.prompt.ids.len() + self.max_tokens
    }
}

enum Phase {
    Denoising(Box<BlockState>),
    /// A committed block waits to be appended to the cache.
    Committing(Vec<u32>),
    Done,
}

/// One request in flight.
struct Sequence {
    key: usize,
    params: BlockParams,
    max_tokens: usize,
    full_canvas: bool,
    model_canvas: usize,
    min_canvas: usize,
    max_canvas: usize,
    eos: Vec<u32>,
    rng: Rng,
    cache: KvCache,
    stats: Stats,
    detok: StreamDetokenizer,
    stop_strings: StopStrings,
    stop_sequence: Option<String>,
    text: String,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    block: usize,
    phase: Phase,
    finish: FinishReason,
    cancelled: bool,
    started: Instant,
}

impl Sequence {
    fn new(key: usize, job: &Job, model: &TextModel, detok: StreamDetokenizer) -> Self {
        let model_canvas = model.config().canvas_length;
        let max_canvas = if job.full_canvas {
            model_canvas
        } else {
            model_canvas.min(job.max_canvas.unwrap_or(model_canvas))
        };
        Sequence {
            key,
            params: job.params.clone(),
            max_tokens: job.max_tokens,
            full_canvas: job.full_canvas,
            model_canvas,
            min_canvas: max_canvas.min(job.min_canvas.unwrap_or(64)),
            max_canvas,
            eos: job.eos.clone(),
            rng: Rng::new(job.seed),
            cache: model.new_cache(),
            stats: Stats {
                prompt_tokens: job.prompt.ids.len(),
                ..Stats::default()
            },
            detok,
            stop_strings: StopStrings::new(&job.stop),
            stop_sequence: None,
            text: String::new(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            block: 0,
            phase: Phase::Done,
            finish: FinishReason::Length,
            cancelled: false,
            started: Instant::now(),
        }
    }

    fn emit(&mut self, on_event: &mut OnEvent<'_>, event: Event) {
        if on_event(self.key, event).is_break() {
            self.cancelled = true;
        }
    }

    /// Cancels within one denoising step: the sequence ends before its next pass.
    fn cancel(&mut self) {
        self.cancelled = true;
        if matches!(self.phase, Phase::Denoising(_)) {
            self.end();
        }
    }

    /// Starts the next block, or ends the sequence.
    fn next_block(&mut self, vocab: usize) -> Result<()> {
        if self.cancelled || self.stats.generated_tokens >= self.max_tokens {
            self.end();
            return Ok(());
        }
        self.block += 1;
        let remaining = self.max_tokens - self.stats.generated_tokens;
        let mut params = self.params.clone();
        params.len = if self.full_canvas {
            self.model_canvas
        } else {
            self.max_canvas.min(remaining.max(self.min_canvas))
        };
        self.phase = Phase::Denoising(Box::new(BlockState::start(params, vocab, &mut self.rng)?));
        Ok(())
    }

    fn end(&mut self) {
        self.phase = Phase::Done;
        self.stats.generation_time = self.started.elapsed();
    }

    /// Passes committed text through the stop strings; true when one was found.
    fn push_text(&mut self, delta: &str, on_event: &mut OnEvent<'_>) -> bool {
        let released = self.stop_strings.push(delta);
        if !released.text.is_empty() {
            self.text.push_str(&released.text);
            self.emit(on_event, Event::Text(released.text));
        }
        if released.stop.is_some() {
            self.stop_sequence = released.stop;
            self.finish = FinishReason::StopSequence;
            return true;
        }
        false
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
            canvas: state.draft().to_vec(),
            revealed: state.revealed().to_vec(),
        };
        self.emit(on_event, event);
    }

    /// Commits a finished block: tokens up to an EOS, a stop string or the token limit, text
    /// deltas, the block's end; then either ends or queues the block for the cache. A `Break`
    /// from any event stops the commit there: the result holds what was delivered.
    fn finish_block(&mut self, result: BlockResult, on_event: &mut OnEvent<'_>) -> Result<()> {
        let len = result.tokens.len();
        self.stats.canvases += 1;
        self.stats.canvas_tokens += len;
        self.stats.denoising_steps += result.steps;
        self.stats.steps_per_block.push(result.steps);
        self.stats.work_tokens += len * result.steps;

        let mut committed = Vec::new();
        let mut stopped = false;
        for &token in &result.tokens {
            if self.cancelled {
                break;
            }
            self.stats.generated_tokens += 1;
            if self.eos.contains(&token) {
                stopped = true;
                self.finish = FinishReason::Stop;
                break;
            }
            committed.push(token);
            if let Some(delta) = self.detok.push(token)?.filter(|d| !d.is_empty()) {
                if self.push_text(&delta, on_event) {
                    stopped = true;
                    break;
                }
            }
            if self.stats.generated_tokens >= self.max_tokens {
                stopped = true;
                self.finish = FinishReason::Length;
                break;
            }
        }
        self.tokens.extend(&committed);
        if self.params.logprobs {
            self.logprobs
                .extend_from_slice(&result.logprobs[..committed.len()]);
        }
        if !self.cancelled {
            let event = Event::BlockEnd {
                block: self.block,
                steps: result.steps,
                tokens: committed,
            };
            self.emit(on_event, event);
        }
        if stopped || self.cancelled {
            self.end();
        } else {
            // The committed canvas joins the prompt in the cache for the next block.
            self.phase = Phase::Committing(result.tokens);
        }
        Ok(())
    }

    fn into_generation(mut self, on_event: &mut OnEvent<'_>) -> Result<Generation> {
        if self.stop_sequence.is_none() && !self.cancelled {
            let tail = self.detok.flush()?;
            if !self.push_text(&tail, on_event) {
                let held = self.stop_strings.flush();
                if !held.is_empty() {
                    self.text.push_str(&held);
                    let _ = on_event(self.key, Event::Text(held));
                }
            }
        }
        Ok(Generation {
            text: self.text,
            token_ids: self.tokens,
            finish_reason: if self.cancelled {
                FinishReason::Cancelled
            } else {
                self.finish
            },
            stop_sequence: self.stop_sequence,
            logprobs: self.params.logprobs.then_some(self.logprobs),
            stats: self.stats,
        })
    }
}

/// Sequences generating together.
#[derive(Default)]
pub(crate) struct Batch {
    seqs: Vec<Sequence>,
    buffers: RoundBuffers,
}

/// The packed `[rows, vocab]` buffers of a denoising round, kept from round to round (each
/// only grows) and freed when the batch empties.
#[derive(Default)]
struct RoundBuffers {
    /// Every denoising sequence's logits, in the decoder's row order; tempered in place.
    logits: Vec<f32>,
    /// The samplers' scratch, then the self-conditioning probabilities of the sequences that
    /// go on (moved to the front for one soft-embedding product).
    probs: Vec<f32>,
}

impl Batch {
    /// How many sequences need a decoder pass.
    pub fn denoising(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| matches!(s.phase, Phase::Denoising(_)))
            .count()
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Keys of the sequences in the batch.
    pub fn keys(&self) -> impl Iterator<Item = usize> + '_ {
        self.seqs.iter().map(|s| s.key)
    }

    /// Cancels the sequence `key` within one step.
    pub fn cancel(&mut self, key: usize) {
        if let Some(seq) = self.seqs.iter_mut().find(|s| s.key == key) {
            seq.cancel();
        }
    }

    /// Adds `(key, job)`s: their prompts are prefilled in one batched encoder pass, then each
    /// starts its first block. Nothing is added if the pass fails.
    pub fn admit(
        &mut self,
        model: &TextModel,
        pool: &rayon::ThreadPool,
        jobs: Vec<(usize, Job)>,
        detok: impl Fn() -> StreamDetokenizer,
        on_event: &mut OnEvent<'_>,
    ) -> Result<()> {
        let start = Instant::now();
        let mut seqs: Vec<Sequence> = jobs
            .iter()
            .map(|(key, job)| Sequence::new(*key, job, model, detok()))
            .collect();
        let prompts: Vec<&PreparedPrompt> = jobs.iter().map(|(_, job)| &job.prompt).collect();
        pool.install(|| prefill(model, &prompts, &mut seqs))?;
        let prefill_time = start.elapsed();
        let started = Instant::now();
        let vocab = model.vocab_size();
        for seq in &mut seqs {
            seq.stats.prefill_time = prefill_time;
            seq.started = started;
            let prompt_tokens = seq.stats.prompt_tokens;
            seq.emit(on_event, Event::Prefilled { prompt_tokens });
            seq.next_block(vocab)?;
        }
        self.seqs.extend(seqs);
        Ok(())
    }

    /// One round: a denoising step of every denoising sequence, then the cache appends of the
    /// blocks it committed.
    pub fn round(
        &mut self,
        model: &TextModel,
        pool: &rayon::ThreadPool,
        on_event: &mut OnEvent<'_>,
    ) -> Result<()> {
        denoise_round(model, pool, &mut self.seqs, &mut self.buffers, on_event)?;
        commit_round(model, pool, &mut self.seqs)
    }

    /// Removes the sequences that are done, with their results.
    pub fn take_finished(
        &mut self,
        on_event: &mut OnEvent<'_>,
    ) -> Vec<(usize, Result<Generation>)> {
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.seqs)
            .into_iter()
            .partition(|s| matches!(s.phase, Phase::Done));
        self.seqs = running;
        if self.seqs.is_empty() {
            // An idle scheduler holds no round buffers.
            self.buffers = RoundBuffers::default();
        }
        done.into_iter()
            .map(|s| (s.key, s.into_generation(on_event)))
            .collect()
    }
}

/// Runs `jobs` to completion, results in job order; `detok` makes each sequence's streaming
/// detokenizer.
pub(crate) fn run(
    model: &TextModel,
    pool: &rayon::ThreadPool,
    jobs: Vec<Job>,
    detok: impl Fn() -> StreamDetokenizer,
    on_event: &mut OnEvent<'_>,
) -> Result<Vec<Generation>> {
    let mut results: Vec<Option<Generation>> = (0..jobs.len()).map(|_| None).collect();
    let mut batch = Batch::default();
    batch.admit(
        model,
        pool,
        jobs.into_iter().enumerate().collect(),
        detok,
        on_event,
    )?;
    loop {
        for (key, generation) in batch.take_finished(on_event) {
            results[key] = Some(generation?);
        }
        if batch.len() == 0 {
            break;
        }
        batch.round(model, pool, on_event)?;
    }
    Ok(results
        .into_iter()
        .map(|g| g.expect("every job finishes"))
        .collect())
}

/// Prefills the prompts in one batched encoder pass.
fn prefill(model: &TextModel, prompts: &[&PreparedPrompt], seqs: &mut [Sequence]) -> Result<()> {
    let (embeddings, blocks): (Vec<_>, Vec<_>) = prompts
        .iter()
        .map(|prompt| encoder_input(model, prompt))
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

/// One denoising step of every denoising sequence: one batched decoder pass into the packed
/// logits, the samplers on each sequence's rows, then one batched self-conditioning product
/// for the blocks that go on.
fn denoise_round(
    model: &TextModel,
    pool: &rayon::ThreadPool,
    seqs: &mut [Sequence],
    buffers: &mut RoundBuffers,
    on_event: &mut OnEvent<'_>,
) -> Result<()> {
    let active: Vec<usize> = (0..seqs.len())
        .filter(|&i| matches!(seqs[i].phase, Phase::Denoising(_)))
        .collect();
    if active.is_empty() {
        return Ok(());
    }
    let inputs: Vec<DecoderInput<'_>> = active
        .iter()
        .map(|&i| DecoderInput {
            cache: &seqs[i].cache,
            canvas: state(&seqs[i]).canvas(),
            self_conditioning: state(&seqs[i]).self_conditioning(),
        })
        .collect();
    let logits = &mut buffers.logits;
    let segments = pool.install(|| model.decode_batch_into(&inputs, logits))?;
    drop(inputs);
    let vocab = model.vocab_size();
    let probs = &mut buffers.probs;
    if probs.len() < logits.len() {
        alloc::reserve(
            probs,
            logits.len() - probs.len(),
            "probabilities [canvas, vocab]",
        )?;
    }
    probs.resize(logits.len(), 0.0);

    let mut continuing: Vec<(usize, Range<usize>)> = Vec::new();
    for (&i, span) in active.iter().zip(segments.spans()) {
        let seq = &mut seqs[i];
        let Phase::Denoising(state) = &mut seq.phase else {
            unreachable!("active sequences are denoising")
        };
        let values = span.start * vocab..span.end * vocab;
        // On the engine's pool: the samplers' passes over the logits are parallel.
        let step = pool.install(|| {
            state.step(
                &mut logits[values.clone()],
                &mut probs[values.clone()],
                &mut seq.rng,
            )
        })?;
        match step {
            Step::Last(result) => seq.finish_block(result, on_event)?,
            Step::Stopped(result) => {
                seq.emit_draft(on_event);
                if seq.cancelled {
                    seq.end();
                } else {
                    seq.finish_block(result, on_event)?;
                }
            }
            Step::Continue => {
                seq.emit_draft(on_event);
                if seq.cancelled {
                    seq.end();
                } else {
                    continuing.push((i, values));
                }
            }
        }
    }
    if continuing.is_empty() {
        return Ok(());
    }
    // The probabilities of the sequences that go on, packed at the front in order (they only
    // move when a sequence before them stopped this round).
    let mut packed = 0;
    for (_, values) in &continuing {
        if values.start != packed {
            probs.copy_within(values.clone(), packed);
        }
        packed += values.len();
    }
    let hidden = model.hidden_size();
    let probs = &probs[..packed];
    let embeddings = pool.install(|| model.soft_embeddings(probs, packed / vocab))?;
    let mut at = 0;
    for (i, values) in continuing {
        let n = values.len() / vocab * hidden;
        if let Phase::Denoising(state) = &mut seqs[i].phase {
            state.set_self_conditioning(embeddings[at..at + n].to_vec());
        }
        at += n;
    }
    Ok(())
}

/// Appends every committed block to its cache in one batched encoder pass, then starts each
/// sequence's next block.
fn commit_round(model: &TextModel, pool: &rayon::ThreadPool, seqs: &mut [Sequence]) -> Result<()> {
    let mut committing: Vec<&mut Sequence> = seqs
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
        seq.next_block(vocab)?;
    }
    Ok(())
}

fn state(seq: &Sequence) -> &BlockState {
    match &seq.phase {
        Phase::Denoising(state) => state,
        _ => unreachable!("only denoising sequences are asked for a canvas"),
    }
}
