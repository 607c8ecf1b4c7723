//! What to generate: the prompt and every option of the reference's `stream_diffusion_generate`.

use crate::error::{EngineError, Result};
use crate::prompt::Image;
use crate::settings::{GenerationSettings, MAX_DENOISING_STEPS};

/// One chat message (re-exported from dg-tokenize).
pub use dg_tokenize::Message;

/// The prompt of a request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Prompt {
    /// Chat messages, rendered with the checkpoint's chat template (generation prompt added).
    Chat(Vec<Message>),
    /// Raw text, encoded as is (the reference's public `generate` with a string prompt).
    Text(String),
    /// Token ids, used as is.
    Tokens(Vec<u32>),
}

/// How each denoising step decides which canvas positions to keep.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Sampler {
    /// Keep positions whose token probability reaches `threshold` (at least one per step);
    /// a block ends when every position is revealed. The reference's public default (0.9).
    ConfidenceThreshold {
        /// In `[0, 1]`.
        threshold: f32,
    },
    /// Keep the lowest-entropy positions whose summed entropy (minus the largest) stays within
    /// the bound; `None` takes the bound from the generation defaults (0.1 in the reference).
    EntropyBound {
        /// Entropy budget, `> 0`.
        bound: Option<f32>,
    },
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::ConfidenceThreshold { threshold: 0.9 }
    }
}

/// Chat-template options: what `apply_chat_template` takes besides the messages, and how the
/// user's text is tokenized.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ChatOptions {
    /// Tool declarations (JSON schemas, OpenAI's `{"type": "function", "function": ...}`).
    pub tools: Option<Vec<serde_json::Value>>,
    /// `enable_thinking`; `None` leaves it undefined (the template's default).
    pub enable_thinking: Option<bool>,
    /// Other template variables.
    pub vars: serde_json::Map<String, serde_json::Value>,
    /// Tokenize special-token strings in the user's text (`<eos>`, `<|image|>`, turn markers)
    /// as plain text: in a chat prompt, every string the messages carry (the template's own
    /// markers stay control tokens); in a raw-text prompt, the whole text. Default `false`: the
    /// reference's and Hugging Face's behaviour, where such a string is the control token.
    /// Images then need image parts ([`ContentPart::image`](dg_tokenize::ContentPart::image)):
    /// a typed `<|image|>` (as in [`Request::with_images`]) stays text.
    pub literal_special_tokens: bool,
}

/// Where generation defaults (steps, schedule, entropy bound, stop rule, extra EOS ids) come
/// from when a request leaves them unset.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum Defaults {
    /// The checkpoint's `generation_config.json`, as HF transformers reads it: what the model's
    /// authors ship (it enables the stable-and-confident stop, which saves steps).
    #[default]
    Checkpoint,
    /// Exactly what mlx-optiq 0.7.7 does: it never reads `generation_config.json`, only a
    /// `generation_config` embedded in config.json (normally absent). Use for parity.
    Reference,
    /// Settings you resolved yourself, e.g. with [`GenerationSettings::resolve`] from a
    /// generation-config dictionary.
    Custom(GenerationSettings),
}

/// A generation request. Build it with [`Request::chat`], [`Request::text`] or
/// [`Request::tokens`], then chain options (or set fields); every option has the reference's
/// default.
///
/// ```
/// use dg_engine::{DiffusionGemma, Message, Request, Sampler};
///
/// let request = Request::chat(vec![Message::user("Name three rivers.")])
///     .max_tokens(64)
///     .sampler(Sampler::EntropyBound { bound: None })
///     .temperature(0.7)
///     .seed(1)
///     .stop(["\n\n"]);
/// assert_eq!(request.max_tokens, 64);
///
/// let dir = "path/to/checkpoint";
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
/// let model = DiffusionGemma::load(dir)?;
/// let answer = model.generate(&request)?;
/// assert!(answer.token_ids.len() <= 64);
/// assert!(!answer.text.contains("\n\n"));
/// # Ok::<(), dg_engine::EngineError>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Request {
    /// What to answer: chat messages, raw text or token ids.
    pub prompt: Prompt,
    /// Maximum number of generated tokens (the reference's public default: 512).
    pub max_tokens: usize,
    /// Which positions each denoising step keeps.
    pub sampler: Sampler,
    /// 0 takes the argmax; above 0 samples each step's candidate canvas from the tempered
    /// distribution.
    pub temperature: f32,
    /// Denoising steps per block; `None` uses the generation defaults (48).
    pub steps: Option<usize>,
    /// Smallest canvas (64 in the reference), capped by `max_canvas`.
    pub min_canvas: Option<usize>,
    /// Largest canvas; `None` is the model's `canvas_length`.
    pub max_canvas: Option<usize>,
    /// Always use the model's full canvas length.
    pub full_canvas: bool,
    /// Seed of the MLX-compatible random generator.
    pub seed: u64,
    /// Where unset settings (steps, temperature schedule, entropy bound, stop rule, extra EOS ids) come from.
    pub defaults: Defaults,
    /// Images, one per image placeholder in the prompt, in order.
    pub images: Vec<Image>,
    /// Stop strings: generation ends when the text contains one; the text is cut before it.
    /// Text is held back while it could still begin one, also across blocks.
    pub stop: Vec<String>,
    /// Chat-template options of a chat prompt.
    pub chat: ChatOptions,
    /// Report the log-probability of each generated token ([`Generation::logprobs`](crate::Generation::logprobs)).
    pub logprobs: bool,
}

impl Request {
    fn with_prompt(prompt: Prompt) -> Self {
        Request {
            prompt,
            max_tokens: 512,
            sampler: Sampler::default(),
            temperature: 0.0,
            steps: None,
            min_canvas: None,
            max_canvas: None,
            full_canvas: false,
            seed: 0,
            defaults: Defaults::default(),
            images: Vec::new(),
            stop: Vec::new(),
            chat: ChatOptions::default(),
            logprobs: false,
        }
    }

    /// A chat request.
    pub fn chat(messages: Vec<Message>) -> Self {
        Self::with_prompt(Prompt::Chat(messages))
    }

    /// An image prompt as the reference's public `generate(prompt, images=...)` builds it: one
    /// user turn with one `<|image|>` placeholder per image before the text.
    pub fn with_images(text: &str, images: Vec<Image>) -> Self {
        let content = format!("{}{text}", "<|image|>".repeat(images.len()));
        let mut r = Self::chat(vec![Message::user(content)]);
        r.images = images;
        r
    }

    /// A raw-text request (not chat-templated).
    pub fn text(text: impl Into<String>) -> Self {
        Self::with_prompt(Prompt::Text(text.into()))
    }

    /// A request from prompt token ids.
    pub fn tokens(ids: Vec<u32>) -> Self {
        Self::with_prompt(Prompt::Tokens(ids))
    }

    /// Sets [`max_tokens`](Self::max_tokens).
    pub fn max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Sets the [`sampler`](Self::sampler).
    pub fn sampler(mut self, sampler: Sampler) -> Self {
        self.sampler = sampler;
        self
    }

    /// Sets the [`temperature`](Self::temperature).
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.temperature = temperature;
        self
    }

    /// Sets the denoising [`steps`](Self::steps) per block.
    pub fn steps(mut self, steps: usize) -> Self {
        self.steps = Some(steps);
        self
    }

    /// Sets the smallest and largest canvas ([`min_canvas`](Self::min_canvas),
    /// [`max_canvas`](Self::max_canvas)).
    pub fn canvas(mut self, min: usize, max: usize) -> Self {
        self.min_canvas = Some(min);
        self.max_canvas = Some(max);
        self
    }

    /// Always uses the model's full canvas length ([`full_canvas`](Self::full_canvas)).
    pub fn full_canvas(mut self, full: bool) -> Self {
        self.full_canvas = full;
        self
    }

    /// Sets the [`seed`](Self::seed).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets where unset options take their [`defaults`](Self::defaults) from.
    pub fn defaults(mut self, defaults: Defaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// Sets the [`images`](Self::images), one per image placeholder in the prompt.
    pub fn images(mut self, images: Vec<Image>) -> Self {
        self.images = images;
        self
    }

    /// Sets the [`stop`](Self::stop) strings.
    pub fn stop<S: Into<String>>(mut self, stop: impl IntoIterator<Item = S>) -> Self {
        self.stop = stop.into_iter().map(Into::into).collect();
        self
    }

    /// Asks for the log-probability of each generated token.
    pub fn logprobs(mut self, on: bool) -> Self {
        self.logprobs = on;
        self
    }

    /// Declares tools to the chat template.
    pub fn tools(mut self, tools: Vec<serde_json::Value>) -> Self {
        self.chat.tools = Some(tools);
        self
    }

    /// Turns the template's thinking on or off (`enable_thinking`).
    pub fn thinking(mut self, on: bool) -> Self {
        self.chat.enable_thinking = Some(on);
        self
    }

    /// Keeps special-token strings typed in the prompt's text as text
    /// ([`ChatOptions::literal_special_tokens`]); off by default, as in the reference. Turn it
    /// on when the text comes from people who should not be able to end a turn or place an
    /// image by typing its marker.
    pub fn literal_special_tokens(mut self, on: bool) -> Self {
        self.chat.literal_special_tokens = on;
        self
    }

    /// Sets another chat-template variable.
    pub fn template_var(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.chat.vars.insert(name.into(), value);
        self
    }

    /// Checks every option, naming the one at fault.
    pub fn validate(&self) -> Result<()> {
        let bad =
            |name: &'static str, reason: String| Err(EngineError::InvalidArgument { name, reason });
        if self.max_tokens == 0 {
            return bad("max_tokens", "must be at least 1".into());
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(
                "temperature",
                format!("{} is not a finite value >= 0", self.temperature),
            );
        }
        if let Some(steps) = self
            .steps
            .filter(|s| !(1..=MAX_DENOISING_STEPS).contains(s))
        {
            return bad(
                "steps",
                format!("{steps} is not in 1..={MAX_DENOISING_STEPS}"),
            );
        }
        if let Defaults::Custom(settings) = &self.defaults {
            settings.validate()?;
        }
        if self.min_canvas == Some(0) {
            return bad("min_canvas", "must be at least 1".into());
        }
        if self.max_canvas == Some(0) {
            return bad("max_canvas", "must be at least 1".into());
        }
        if let Some(i) = self.stop.iter().position(String::is_empty) {
            return bad("stop", format!("stop string {i} is empty"));
        }
        match self.sampler {
            Sampler::ConfidenceThreshold { threshold } if !(0.0..=1.0).contains(&threshold) => {
                bad("threshold", format!("{threshold} is outside [0, 1]"))
            }
            Sampler::EntropyBound { bound: Some(b) } if !(b > 0.0 && b.is_finite()) => {
                bad("entropy_bound", format!("{b} is not a finite value > 0"))
            }
            _ => Ok(()),
        }
    }
}
