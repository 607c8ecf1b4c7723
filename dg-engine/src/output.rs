//! What generation produces: streamed events, the final result and its statistics.

use std::time::Duration;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FinishReason {
    /// An EOS token was generated.
    Stop,
    /// One of the request's stop strings was generated ([`Generation::stop_sequence`]).
    StopSequence,
    /// `max_tokens` was reached.
    Length,
    /// The event callback, the stream's consumer or a shutdown asked to stop.
    Cancelled,
}

/// One event of a streamed generation.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Event {
    /// The prompt is in the cache.
    Prefilled {
        /// Tokens of the prompt (image tokens included).
        prompt_tokens: usize,
    },
    /// The canvas after one denoising step.
    Draft {
        /// 1-based block number.
        block: usize,
        /// 1-based step within the block.
        step: usize,
        /// The step budget of the block.
        total_steps: usize,
        /// Current draft tokens of the canvas.
        canvas: Vec<u32>,
        /// Which positions the sampler has revealed (accepted).
        revealed: Vec<bool>,
    },
    /// Newly committed text (UTF-8 safe: never a partial character).
    Text(String),
    /// A block was committed.
    BlockEnd {
        /// 1-based block number.
        block: usize,
        /// Denoising steps it took.
        steps: usize,
        /// Its tokens up to (not including) an EOS or the token limit.
        tokens: Vec<u32>,
    },
}

/// Counters and timings of one generation.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Tokens of the prompt (image tokens included).
    pub prompt_tokens: usize,
    /// Generated tokens, counting a final EOS (as the reference does).
    pub generated_tokens: usize,
    /// Canvases (blocks) denoised.
    pub canvases: usize,
    /// Canvas positions denoised, summed over blocks.
    pub canvas_tokens: usize,
    /// Denoising steps, summed over blocks.
    pub denoising_steps: usize,
    /// Denoising steps of each block.
    pub steps_per_block: Vec<usize>,
    /// Work: canvas length x steps, summed over blocks.
    pub work_tokens: usize,
    /// Wall time of the prompt's prefill pass (serialized in seconds).
    #[serde(serialize_with = "secs")]
    pub prefill_time: Duration,
    /// Wall time from the end of prefill to the end of generation (serialized in seconds).
    #[serde(serialize_with = "secs")]
    pub generation_time: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn rate(count: usize, time: Duration) -> f64 {
    count as f64 / time.as_secs_f64().max(1e-9)
}

impl Stats {
    /// Prompt tokens per second of prefill.
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_time)
    }
    /// Generated tokens per second.
    pub fn generation_tps(&self) -> f64 {
        rate(self.generated_tokens, self.generation_time)
    }
    /// Canvas positions per second.
    pub fn canvas_tps(&self) -> f64 {
        rate(self.canvas_tokens, self.generation_time)
    }
    /// Work token-steps per second (canvas length x steps).
    pub fn work_tps(&self) -> f64 {
        rate(self.work_tokens, self.generation_time)
    }
    /// Generated tokens per decoder forward pass.
    pub fn tokens_per_forward(&self) -> f64 {
        self.generated_tokens as f64 / self.denoising_steps.max(1) as f64
    }
}

/// The result of a generation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    /// Decoded text of the generated tokens (EOS excluded), cut before a stop string.
    pub text: String,
    /// Generated token ids (EOS excluded; after a stop string, up to the token that completed
    /// it).
    pub token_ids: Vec<u32>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// The stop string that ended generation (it and what followed it are not in `text`).
    pub stop_sequence: Option<String>,
    /// With [`Request::logprobs`](crate::Request::logprobs): the natural-log probability of each
    /// token of `token_ids` under the logits it was taken from (the block's last step, divided
    /// by that step's schedule temperature, soft-capped), i.e. how sure the model was.
    pub logprobs: Option<Vec<f32>>,
    /// Counters and timings.
    pub stats: Stats,
}
