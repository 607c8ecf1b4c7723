//! [`DiffusionGemma`]: a loaded checkpoint (model, tokenizer, chat template, thread pool) and
//! block-by-block generation.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use dg_core::lora::{Adapter, AdapterConfig};
use dg_core::{Checkpoint, ModelConfig, TextModel};
use dg_tokenize::{ChatTemplate, ImageTokenIds, RenderOptions, Tokenizer};

use crate::batch::{self, Job, OnEvent};
use crate::error::{EngineError, Result};
use crate::output::{Event, Generation};
use crate::prompt::{attach_images, PreparedPrompt};
use crate::request::{ChatOptions, Defaults, Prompt, Request};
use crate::settings::GenerationSettings;

/// Load progress: layers done and total. Return `false` to cancel loading.
pub type ProgressFn<'a> = Box<dyn FnMut(usize, usize) -> bool + 'a>;

/// The default of [`LoadBuilder::max_context`]: prompt (images expanded) plus `max_tokens`.
pub const DEFAULT_MAX_CONTEXT: usize = 32768;

/// Options for [`DiffusionGemma::builder`].
pub struct LoadBuilder<'a> {
    dir: PathBuf,
    threads: Option<usize>,
    max_context: usize,
    #[cfg(feature = "vision")]
    image_limits: dg_vision::DecodeLimits,
    progress: Option<ProgressFn<'a>>,
    adapter: Option<PathBuf>,
}

impl<'a> LoadBuilder<'a> {
    /// Worker threads for the numeric kernels (default: the number of physical cores).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// The most tokens a request may hold: its prompt (image placeholders expanded) plus its
    /// `max_tokens` (default [`DEFAULT_MAX_CONTEXT`]). A longer request is refused before its
    /// prompt is encoded, so one oversized prompt cannot exhaust the memory a shared model
    /// serves from.
    pub fn max_context(mut self, tokens: usize) -> Self {
        self.max_context = tokens;
        self
    }

    /// Limits on each request image: encoded bytes, width, height, pixels, decoder memory
    /// (default [`DecodeLimits::default`](crate::DecodeLimits::default): 128 MiB encoded,
    /// Pillow's 178,956,970-pixel bomb threshold, 1 GiB of decoder memory). An image over one
    /// is refused before its pixels are decoded, with an error naming the limit.
    #[cfg(feature = "vision")]
    pub fn image_limits(mut self, limits: dg_vision::DecodeLimits) -> Self {
        self.image_limits = limits;
        self
    }

    /// Mounts the LoRA adapter in `dir` (`adapter_config.json` + `adapters.safetensors`, as
    /// the reference's trainer and dg's write them) once the model is loaded; see
    /// [`DiffusionGemma::mount_adapter`].
    pub fn adapter(mut self, dir: impl AsRef<Path>) -> Self {
        self.adapter = Some(dir.as_ref().to_owned());
        self
    }

    /// Called as layers load; returning `false` cancels with [`EngineError::Cancelled`].
    pub fn progress(mut self, f: impl FnMut(usize, usize) -> bool + 'a) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The checkpoint directory (the hub download sets it once the files are in the cache).
    #[cfg(feature = "hub")]
    pub(crate) fn set_dir(&mut self, dir: PathBuf) {
        self.dir = dir;
    }

    /// Loads the checkpoint.
    pub fn load(self) -> Result<DiffusionGemma> {
        let dir = self.dir;
        check_checkpoint_dir(&dir)?;
        if self.max_context == 0 {
            return Err(EngineError::InvalidArgument {
                name: "max_context",
                reason: "must be at least 1".into(),
            });
        }
        let model_err = |e: dg_core::CoreError| EngineError::Model(Box::new(e));
        let pool =
            dg_quant::pool::build(self.threads).map_err(|e| EngineError::InvalidArgument {
                name: "threads",
                reason: e.to_string(),
            })?;
        let config = ModelConfig::from_file(&dir.join("config.json")).map_err(model_err)?;
        let tokenizer = Tokenizer::from_dir(&dir)?;
        let template = if has_chat_template(&dir) {
            Some(ChatTemplate::from_dir(&dir)?.with_special_tokens(tokenizer.special_tokens_map()))
        } else {
            None
        };
        let checkpoint_settings = read_generation_config(&dir)?;
        let reference_settings = GenerationSettings::resolve(config.generation_config.as_ref())?;
        check_token_ids(
            &dir,
            &config,
            &tokenizer,
            &checkpoint_settings,
            &reference_settings,
        )?;
        #[cfg(feature = "vision")]
        let vision_config = match config.vision_config {
            Some(_) => Some(dg_vision::CheckpointConfig::load(&dir)?),
            None => None,
        };
        // One checkpoint, each shard (and the vision sidecar) mapped once, for both towers.
        let ck =
            Checkpoint::open(&dir, dg_core::model::sanitize_options(&config)).map_err(model_err)?;
        #[cfg(feature = "vision")]
        let vision = match vision_config {
            Some(c) => Some(dg_vision::VisionModel::from_checkpoint(&ck, c)?),
            None => None,
        };
        let mut progress = self.progress.unwrap_or_else(|| Box::new(|_, _| true));
        let mut model =
            TextModel::from_checkpoint(&ck, config, &mut *progress).map_err(|e| match e {
                dg_core::CoreError::Cancelled => EngineError::Cancelled,
                other => model_err(other),
            })?;
        let adapter = match &self.adapter {
            Some(dir) => {
                let adapter = Adapter::load(dir)?;
                model.mount_adapter(&adapter)?;
                Some(MountedAdapter::of(adapter))
            }
            None => None,
        };
        // The reference's EOS set: the tokenizer's EOS, then config.json's `eos_token_id`.
        let mut eos: Vec<u32> = tokenizer.eos_token_id().into_iter().collect();
        eos.extend(model.config().eos_ids());
        if eos.is_empty() {
            eos.push(1);
        }
        Ok(DiffusionGemma {
            dir,
            model,
            tokenizer,
            template,
            #[cfg(feature = "vision")]
            vision,
            pool,
            eos,
            checkpoint_settings,
            reference_settings,
            max_context: self.max_context,
            #[cfg(feature = "vision")]
            image_limits: self.image_limits,
            adapter,
        })
    }
}

/// A clear error, saying what to do, for a path that is not a checkpoint directory.
fn check_checkpoint_dir(dir: &Path) -> Result<()> {
    let fail = |reason: String| {
        Err(EngineError::File {
            path: dir.to_path_buf(),
            reason,
        })
    };
    if dir.is_dir() {
        return Ok(());
    }
    let layout = "dg loads a diffusion_gemma checkpoint directory in MLX safetensors form \
                  (the layout of mlx-community/diffusiongemma-26B-A4B-it-OptiQ-4bit)";
    if dir.is_file() {
        let gguf = dir
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        return fail(match gguf {
            true => format!("a GGUF file: {layout}"),
            false => format!("a file, not a directory: {layout}"),
        });
    }
    let text = dir.to_string_lossy();
    let parts: Vec<&str> = text.split('/').collect();
    let hub_id = parts.len() == 2
        && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'))
        && !text.starts_with('/');
    fail(match hub_id {
        true => format!(
            "no such directory; it looks like a Hugging Face model id: build dg-engine with \
             its `hub` feature and call `DiffusionGemma::from_hub(\"{text}\")` (the examples' \
             --model does), or download it first (e.g. `hf download {text} --local-dir DIR`) \
             and pass that directory"
        ),
        false => "no such directory".to_string(),
    })
}

/// Refuses, at load, ids the model has no embedding row for: a tokenizer whose ids reach past
/// `text_config.vocab_size` (a smaller embedding would fail part-way through a generate; a
/// larger, padded one is fine) and generation-config EOS ids past it. config.json's own ids are
/// checked by its validation.
fn check_token_ids(
    dir: &Path,
    config: &ModelConfig,
    tokenizer: &Tokenizer,
    checkpoint: &GenerationSettings,
    reference: &GenerationSettings,
) -> Result<()> {
    let vocab = config.text.vocab_size;
    if tokenizer.id_count() > vocab {
        return Err(EngineError::File {
            path: tokenizer.path().to_path_buf(),
            reason: format!(
                "its token ids reach {} ({} ids) but config.json's text_config.vocab_size is \
                 {vocab}: the tokenizer does not belong to this model",
                tokenizer.id_count() - 1,
                tokenizer.id_count()
            ),
        });
    }
    let sources = [
        (
            dir.join("generation_config.json"),
            "eos_token_id",
            checkpoint,
        ),
        (
            dir.join("config.json"),
            "generation_config.eos_token_id",
            reference,
        ),
    ];
    for (path, field, settings) in sources {
        if let Some(id) = settings.extra_eos.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::File {
                path,
                reason: format!("{field}: token id {id} is outside text_config.vocab_size {vocab}"),
            });
        }
    }
    Ok(())
}

/// Whether the checkpoint ships a chat template (`chat_template.jinja` or a `chat_template`
/// field in tokenizer_config.json), as transformers looks for one.
fn has_chat_template(dir: &Path) -> bool {
    let config = dir.join("tokenizer_config.json");
    dir.join("chat_template.jinja").exists()
        || dg_files::read_text(&config, dg_files::CONFIG_MAX_BYTES)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v.get("chat_template").is_some_and(|c| !c.is_null()))
}

fn read_generation_config(dir: &Path) -> Result<GenerationSettings> {
    let path = dir.join("generation_config.json");
    let Some(text) = dg_files::read_text_if_present(&path, dg_files::CONFIG_MAX_BYTES)? else {
        return Ok(GenerationSettings::default());
    };
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| EngineError::File {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    GenerationSettings::resolve(Some(&value)).map_err(|e| EngineError::File {
        path,
        reason: e.to_string(),
    })
}

/// A loaded DiffusionGemma checkpoint. `Send + Sync`: one instance serves many threads.
pub struct DiffusionGemma {
    dir: PathBuf,
    pub(crate) model: TextModel,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    #[cfg(feature = "vision")]
    vision: Option<dg_vision::VisionModel>,
    pub(crate) pool: rayon::ThreadPool,
    eos: Vec<u32>,
    checkpoint_settings: GenerationSettings,
    reference_settings: GenerationSettings,
    max_context: usize,
    #[cfg(feature = "vision")]
    image_limits: dg_vision::DecodeLimits,
    adapter: Option<MountedAdapter>,
}

/// What is kept of a mounted adapter: its configuration and where it came from.
#[derive(Clone, Debug)]
struct MountedAdapter {
    config: AdapterConfig,
    source: Option<PathBuf>,
}

impl MountedAdapter {
    fn of(adapter: Adapter) -> Self {
        MountedAdapter {
            config: adapter.config,
            source: adapter.source,
        }
    }
}

impl std::fmt::Debug for DiffusionGemma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiffusionGemma")
            .field("dir", &self.dir)
            .field("threads", &self.pool.current_num_threads())
            .finish_non_exhaustive()
    }
}

impl DiffusionGemma {
    /// Loads a checkpoint directory with default options. The weight files are memory-mapped:
    /// they must not be modified or truncated while the model is alive.
    ///
    /// ```
    /// use dg_engine::DiffusionGemma;
    ///
    /// let dir = "path/to/checkpoint";
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
    /// let model = DiffusionGemma::load(dir)?;
    /// println!("{} token ids", model.tokenizer().vocab_size());
    ///
    /// // With options: worker threads, a progress callback (`false` cancels).
    /// let model = DiffusionGemma::builder(dir)
    ///     .threads(2)
    ///     .progress(|done, total| {
    ///         eprintln!("layer {done}/{total}");
    ///         true
    ///     })
    ///     .load()?;
    /// # Ok::<(), dg_engine::EngineError>(())
    /// ```
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Self::builder(dir).load()
    }

    /// Load options (threads, progress).
    pub fn builder<'a>(dir: impl AsRef<Path>) -> LoadBuilder<'a> {
        LoadBuilder {
            dir: dir.as_ref().to_owned(),
            threads: None,
            max_context: DEFAULT_MAX_CONTEXT,
            #[cfg(feature = "vision")]
            image_limits: dg_vision::DecodeLimits::default(),
            progress: None,
            adapter: None,
        }
    }

    /// Mounts a LoRA adapter on the attention and dense-MLP projections, replacing the one
    /// mounted before; it acts in every encoder and decoder pass, batched or not. The adapter
    /// is checked against the model first: on an error nothing changes. The base weights are
    /// untouched, so [`unmount_adapter`](Self::unmount_adapter) gives the base model back
    /// without reloading.
    ///
    /// ```
    /// use dg_engine::{Adapter, DiffusionGemma, Request};
    ///
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
    /// # let adapter_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/adapters/tiny-random");
    /// let mut model = DiffusionGemma::load(dir)?;
    /// model.mount_adapter(Adapter::load(adapter_dir.as_ref())?)?;
    /// let tuned = model.generate(&Request::text("Hi").max_tokens(8))?;
    /// model.unmount_adapter();
    /// let base = model.generate(&Request::text("Hi").max_tokens(8))?;
    /// # let _ = (tuned, base);
    /// # Ok::<(), dg_engine::EngineError>(())
    /// ```
    pub fn mount_adapter(&mut self, adapter: Adapter) -> Result<()> {
        self.model.mount_adapter(&adapter)?;
        self.adapter = Some(MountedAdapter::of(adapter));
        Ok(())
    }

    /// Removes the mounted adapter, if any: generation is the base model's again.
    pub fn unmount_adapter(&mut self) {
        self.model.unmount_adapter();
        self.adapter = None;
    }

    /// The mounted adapter's configuration and directory, if one is mounted.
    pub fn adapter(&self) -> Option<(&AdapterConfig, Option<&Path>)> {
        self.adapter
            .as_ref()
            .map(|a| (&a.config, a.source.as_deref()))
    }

    /// The text model: its configuration, and single passes for research (see
    /// [`research`](crate::research)).
    pub fn model(&self) -> &TextModel {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The EOS ids generation stops on (before generation-config additions).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The settings a request falls back on for the given source of defaults.
    pub fn settings<'a>(&'a self, defaults: &'a Defaults) -> &'a GenerationSettings {
        match defaults {
            Defaults::Checkpoint => &self.checkpoint_settings,
            Defaults::Reference => &self.reference_settings,
            Defaults::Custom(settings) => settings,
        }
    }

    /// The prompt's token ids as the request describes them.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        self.prompt_ids_with(prompt, &ChatOptions::default())
    }

    /// [`prompt_ids`](Self::prompt_ids) with chat-template options (tools, thinking, extra
    /// variables) for a chat prompt.
    pub fn prompt_ids_with(&self, prompt: &Prompt, chat: &ChatOptions) -> Result<Vec<u32>> {
        let ids = match prompt {
            Prompt::Tokens(ids) => ids.clone(),
            // The reference encodes raw text with `add_special_tokens=True`.
            Prompt::Text(text) if chat.literal_special_tokens => {
                self.tokenizer.encode_literal(text, true)?
            }
            Prompt::Text(text) => self.tokenizer.encode(text, true)?,
            // The template would fail on it with a message about its own internals.
            Prompt::Chat(messages) if messages.is_empty() => {
                return Err(EngineError::InvalidArgument {
                    name: "messages",
                    reason: "the chat has no messages".into(),
                })
            }
            Prompt::Chat(messages) => {
                let template =
                    self.template
                        .as_ref()
                        .ok_or_else(|| EngineError::InvalidArgument {
                            name: "prompt",
                            reason: format!(
                                "{} has no chat template; send text or token ids",
                                self.dir.display()
                            ),
                        })?;
                let options = RenderOptions {
                    add_generation_prompt: true,
                    enable_thinking: chat.enable_thinking,
                    tools: chat.tools.clone(),
                    extra: chat.vars.clone(),
                };
                match chat.literal_special_tokens {
                    true => self
                        .tokenizer
                        .apply_chat_template_literal(template, messages, &options)?,
                    false => self
                        .tokenizer
                        .apply_chat_template(template, messages, &options)?,
                }
            }
        };
        if ids.is_empty() {
            return Err(EngineError::InvalidArgument {
                name: "prompt",
                reason: "the prompt has no tokens".into(),
            });
        }
        let vocab = self.model.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::InvalidArgument {
                name: "prompt",
                reason: format!("token id {bad} is out of range (vocabulary of {vocab})"),
            });
        }
        Ok(ids)
    }

    /// The most tokens a request may hold (prompt plus `max_tokens`).
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Refuses a request whose `prompt_tokens` plus `max_tokens` exceed the context limit.
    fn check_context(&self, prompt_tokens: usize, max_tokens: usize) -> Result<()> {
        let limit = self.max_context;
        if max_tokens >= limit {
            return Err(EngineError::InvalidArgument {
                name: "max_tokens",
                reason: format!(
                    "{max_tokens} leaves no room for the prompt within the context limit of \
                     {limit} tokens (LoadBuilder::max_context)"
                ),
            });
        }
        if prompt_tokens.saturating_add(max_tokens) > limit {
            return Err(EngineError::InvalidArgument {
                name: "prompt",
                reason: format!(
                    "{prompt_tokens} prompt tokens plus max_tokens {max_tokens} exceed the \
                     context limit of {limit} tokens (LoadBuilder::max_context)"
                ),
            });
        }
        Ok(())
    }

    /// The encoder input of a request: prompt ids with image placeholders expanded, token
    /// types and image features.
    pub fn prepare_prompt(&self, request: &Request) -> Result<PreparedPrompt> {
        let ids = self.prompt_ids_with(&request.prompt, &request.chat)?;
        // Before the vision tower runs; again below with the image blocks expanded.
        self.check_context(ids.len(), request.max_tokens)?;
        let c = self.model.config();
        let tokens = match (c.image_token_id, c.boi_token_id, c.eoi_token_id) {
            (Some(image), Some(boi), Some(eoi)) => Some(ImageTokenIds { image, boi, eoi }),
            _ => None,
        };
        let prepared = self.pool.install(|| {
            #[cfg(feature = "vision")]
            return attach_images(
                ids,
                &request.images,
                self.vision.as_ref(),
                self.image_limits,
                tokens,
            );
            #[cfg(not(feature = "vision"))]
            return attach_images(ids, &request.images, tokens);
        })?;
        self.check_context(prepared.ids.len(), request.max_tokens)?;
        Ok(prepared)
    }

    /// Generates a complete answer.
    pub fn generate(&self, request: &Request) -> Result<Generation> {
        self.generate_stream(request, |_| ControlFlow::Continue(()))
    }

    /// Generates, calling `on_event` for each [`Event`]; returning `ControlFlow::Break(())`
    /// cancels within one denoising step (the result then has [`FinishReason::Cancelled`](crate::FinishReason::Cancelled)).
    ///
    /// ```
    /// use std::io::Write;
    /// use std::ops::ControlFlow;
    /// use dg_engine::{DiffusionGemma, Event, FinishReason, Message, Request};
    ///
    /// let dir = "path/to/checkpoint";
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
    /// let model = DiffusionGemma::load(dir)?;
    /// let request = Request::chat(vec![Message::user("Tell me a story.")]).max_tokens(64);
    /// let mut steps = 0;
    /// let answer = model.generate_stream(&request, |event| {
    ///     match event {
    ///         Event::Text(text) => {
    ///             print!("{text}");
    ///             std::io::stdout().flush().ok();
    ///         }
    ///         Event::Draft { .. } => steps += 1,
    ///         _ => {}
    ///     }
    ///     // Stop early, e.g. when the user presses Ctrl-C or the client disconnects.
    ///     if steps == 2 {
    ///         ControlFlow::Break(())
    ///     } else {
    ///         ControlFlow::Continue(())
    ///     }
    /// })?;
    /// assert_eq!(answer.finish_reason, FinishReason::Cancelled);
    /// # Ok::<(), dg_engine::EngineError>(())
    /// ```
    pub fn generate_stream(
        &self,
        request: &Request,
        mut on_event: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<Generation> {
        request.validate()?;
        let job = self.job(request)?;
        let mut out = self.run(vec![job], &mut |_, event| on_event(event))?;
        Ok(out.pop().expect("one generation per request"))
    }

    /// Generates several answers together: each denoising step of all of them is one batched
    /// forward pass, so the weights are read once per step for the whole batch. Each request
    /// gets the tokens it would get alone (its own seed, canvas and stops); results come in
    /// request order. Every request is checked first; an error names the request at fault
    /// ([`EngineError::Request`]).
    ///
    /// ```
    /// use dg_engine::{DiffusionGemma, Message, Request};
    ///
    /// let dir = "path/to/checkpoint";
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
    /// let model = DiffusionGemma::load(dir)?;
    /// let requests = [
    ///     Request::chat(vec![Message::user("Name a river.")]).max_tokens(32),
    ///     Request::chat(vec![Message::user("Name a mountain.")]).max_tokens(32).seed(7),
    ///     Request::text("The capital of France is").max_tokens(16),
    /// ];
    /// let answers = model.generate_batch(&requests)?;
    /// for answer in &answers {
    ///     println!("{} ({:?})", answer.text, answer.finish_reason);
    /// }
    /// // Each request gets the tokens it gets alone.
    /// assert_eq!(answers[1].token_ids, model.generate(&requests[1])?.token_ids);
    /// # Ok::<(), dg_engine::EngineError>(())
    /// ```
    pub fn generate_batch(&self, requests: &[Request]) -> Result<Vec<Generation>> {
        self.generate_batch_stream(requests, |_, _| ControlFlow::Continue(()))
    }

    /// [`generate_batch`](Self::generate_batch) with events: `on_event(i, event)` for request
    /// `i`; `Break` cancels request `i` only, within one denoising step.
    pub fn generate_batch_stream(
        &self,
        requests: &[Request],
        mut on_event: impl FnMut(usize, Event) -> ControlFlow<()>,
    ) -> Result<Vec<Generation>> {
        let at = |index: usize| {
            move |e: EngineError| EngineError::Request {
                index,
                source: Box::new(e),
            }
        };
        for (i, request) in requests.iter().enumerate() {
            request.validate().map_err(at(i))?;
        }
        let jobs = requests
            .iter()
            .enumerate()
            .map(|(i, request)| self.job(request).map_err(at(i)))
            .collect::<Result<Vec<_>>>()?;
        self.run(jobs, &mut on_event)
    }

    /// Resolves a validated request: prompt ids, images, settings.
    pub(crate) fn job(&self, request: &Request) -> Result<Job> {
        Ok(Job::new(
            request,
            self.prepare_prompt(request)?,
            self.settings(&request.defaults),
            &self.eos,
        ))
    }

    fn run(&self, jobs: Vec<Job>, on_event: &mut OnEvent<'_>) -> Result<Vec<Generation>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        batch::run(
            &self.model,
            &self.pool,
            jobs,
            || self.tokenizer.stream_detokenizer(),
            on_event,
        )
    }

    /// The worker pool the numeric kernels run on.
    pub(crate) fn pool(&self) -> &rayon::ThreadPool {
        &self.pool
    }
}
