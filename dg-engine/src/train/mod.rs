//! LoRA fine-tuning with DiffusionGemma's denoising objective, replayable against the
//! reference (mlx-optiq 0.7.7 `optiq/vlm/diffusion_gemma/lora.py`, `train_diffusion_lora`).
//!
//! Each iteration takes one example of `train.jsonl` (in file order, `it % len`, or a seeded
//! shuffle), corrupts each target token with probability `t ~ U(t_min, t_max)` to a uniform
//! random token, runs the chat-templated prompt through the encoder and the corrupted canvas
//! through the decoder (no self-conditioning), and takes one AdamW step on the cross-entropy
//! of the corrupted positions. Routing is not differentiated; the routing weights are.
//!
//! What makes a run replayable against the reference: the LoRA init and the corruption are
//! drawn from one MLX-compatible [`Rng`] in the reference's order (the global key after
//! `mx.random.seed(seed)`: the reference's own `seed` argument is never used, so it must be
//! seeded by hand before `linear_to_lora_layers`), and [`AdamW`] rounds as mlx's does.
//!
//! ```no_run
//! use dg_engine::train::{TrainOptions, Trainer};
//! use dg_engine::DiffusionGemma;
//!
//! let model = DiffusionGemma::load("path/to/checkpoint")?;
//! let mut trainer = Trainer::new(&model, "data/train.jsonl".as_ref(), TrainOptions::default())?;
//! trainer.train(200, |report| {
//!     if let Some(loss) = report.loss {
//!         println!("iter {} loss {loss:.4}", report.iteration);
//!     }
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! trainer.save_adapter("adapter".as_ref())?;
//! # Ok::<(), dg_engine::train::TrainError>(())
//! ```

mod checkpoint;
mod data;
mod optim;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use dg_core::config::LayerType;
use dg_core::lora::{Adapter, AdapterConfig, LoraFactors, LoraParameters, DEFAULT_LORA_KEYS};
use dg_core::TextModel;

use crate::engine::DiffusionGemma;
use crate::error::EngineError;
use crate::request::Defaults;
use crate::rng::{self, Rng};

pub use checkpoint::{OPTIMIZER_FILE, STATE_FILE};
pub use data::{encode_pair, load_dataset, read_pairs, EncodedPair, TrainPair, DEFAULT_MAX_CANVAS};
pub use optim::{AdamW, AdamWConfig, Moments};

/// Errors of the trainer; each names the file, line, option or module at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A line of the training data is unusable.
    #[error("{}:{line}: {reason}", path.display())]
    Data {
        /// The data file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A file (data, checkpoint) could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file (data, checkpoint) is malformed.
    #[error("{}: {reason}", path.display())]
    File {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A training option is out of range or contradicts the checkpoint resumed.
    #[error("option {name}: {reason}")]
    Option {
        /// The option (`rank`, `scale`, `learning_rate`, ...).
        name: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// The model, tokenizer or chat template failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<dg_core::CoreError> for TrainError {
    fn from(e: dg_core::CoreError) -> Self {
        TrainError::Engine(e.into())
    }
}

/// The order in which iterations visit the examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOrder {
    /// The reference's: iteration `it` takes example `it % len`.
    Sequential,
    /// Each pass over the data in a fresh seeded permutation (independent of the corruption
    /// RNG: pass `e` sorts the examples by threefry words of key `(seed, e)`).
    Shuffled {
        /// Seed of the permutations.
        seed: u64,
    },
}

/// What to train and how; [`Default`] is the reference trainer's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    /// LoRA rank (default 8).
    pub rank: usize,
    /// Factor on the adapters' output (default 8.0).
    pub scale: f32,
    /// Layer modules to adapt (default: the attention and dense-MLP projections).
    pub keys: Vec<String>,
    /// Adapt only the last `n` layers (default: all), as mlx-lm's `num_layers`.
    pub num_layers: Option<usize>,
    /// The optimizer (default: mlx's AdamW defaults, learning rate 1e-4).
    pub adamw: AdamWConfig,
    /// Longest target in tokens; completions are cut to it (default 256).
    pub max_canvas: usize,
    /// The RNG state before the LoRA init is `mx.random.seed(seed)`'s (default 0).
    pub seed: u64,
    /// Data order (default: the reference's sequential order).
    pub order: DataOrder,
    /// Written as `base_model` in `adapter_config.json`.
    pub base_model: Option<String>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            rank: 8,
            scale: 8.0,
            keys: DEFAULT_LORA_KEYS.iter().map(|k| k.to_string()).collect(),
            num_layers: None,
            adamw: AdamWConfig::default(),
            max_canvas: DEFAULT_MAX_CANVAS,
            seed: 0,
            order: DataOrder::Sequential,
            base_model: None,
        }
    }
}

impl TrainOptions {
    fn check(&self) -> Result<(), TrainError> {
        let bad = |name, reason: String| Err(TrainError::Option { name, reason });
        if self.rank == 0 || self.rank > dg_core::lora::MAX_LORA_RANK {
            return bad(
                "rank",
                format!(
                    "{} is not in 1..={}",
                    self.rank,
                    dg_core::lora::MAX_LORA_RANK
                ),
            );
        }
        if !self.scale.is_finite() {
            return bad("scale", format!("{} is not finite", self.scale));
        }
        let lr = self.adamw.learning_rate;
        if !(lr.is_finite() && lr >= 0.0) {
            return bad("learning_rate", format!("{lr} is not a finite value >= 0"));
        }
        if self.max_canvas == 0 {
            return bad("max_canvas", "must be at least 1".into());
        }
        if self.keys.is_empty() {
            return bad("keys", "no module to adapt".into());
        }
        if let Some(k) = self
            .keys
            .iter()
            .find(|k| !DEFAULT_LORA_KEYS.contains(&k.as_str()))
        {
            return bad(
                "keys",
                format!(
                    "{k:?} is not one of {} (experts, router and self-conditioning stay frozen)",
                    DEFAULT_LORA_KEYS.join(", ")
                ),
            );
        }
        Ok(())
    }
}

/// The order in which mlx-lm's `linear_to_lora_layers` creates a layer's LoRA modules (the
/// order of `Module.named_modules()`: children in reverse of their definition order), which is
/// the order their `lora_a` draws come from the global RNG.
const INIT_ORDER: [&str; 7] = [
    "mlp.down_proj",
    "mlp.up_proj",
    "mlp.gate_proj",
    "self_attn.o_proj",
    "self_attn.v_proj",
    "self_attn.k_proj",
    "self_attn.q_proj",
];

/// `(in, out)` features of a layer's adaptable module, `None` where the layer has none
/// (full-attention layers have no `v_proj`).
fn module_dims(model: &TextModel, layer_type: LayerType, module: &str) -> Option<(usize, usize)> {
    let t = &model.config().text;
    let h = t.hidden_size;
    let q = t.num_attention_heads * t.head_dim_of(layer_type);
    let kv = t.kv_heads_of(layer_type) * t.head_dim_of(layer_type);
    Some(match module {
        "self_attn.q_proj" => (h, q),
        "self_attn.k_proj" => (h, kv),
        "self_attn.v_proj" if layer_type == LayerType::SlidingAttention => (h, kv),
        "self_attn.o_proj" => (q, h),
        "mlp.gate_proj" | "mlp.up_proj" => (h, t.intermediate_size),
        "mlp.down_proj" => (t.intermediate_size, h),
        _ => return None,
    })
}

/// A fresh adapter as mlx-lm's `linear_to_lora_layers` makes it, drawing from `rng` in its
/// order: per adapted module one draw for the throw-away `nn.Linear` weight `LoRALinear`
/// creates, then `lora_a ~ U(-1/sqrt(in), 1/sqrt(in))` `[in, rank]`; `lora_b` is zeros.
pub fn init_adapter(
    model: &TextModel,
    options: &TrainOptions,
    rng: &mut Rng,
) -> Result<Adapter, TrainError> {
    options.check()?;
    let types = model.config().text.layer_types();
    let layers = types.len();
    let adapted = options.num_layers.unwrap_or(layers);
    if adapted == 0 || adapted > layers {
        return Err(TrainError::Option {
            name: "num_layers",
            reason: format!("{adapted} is not in 1..={layers} (the model's layers)"),
        });
    }
    let mut factors = BTreeMap::new();
    for (i, &lt) in types.iter().enumerate().skip(layers - adapted) {
        for module in INIT_ORDER {
            if !options.keys.iter().any(|k| k == module) {
                continue;
            }
            let Some((in_dim, out_dim)) = module_dims(model, lt, module) else {
                continue;
            };
            rng.next_key(); // nn.Linear(in, out, bias=False).weight, discarded
            let bound = 1.0 / (in_dim as f64).sqrt();
            let a = rng.uniform_range(-bound as f32, bound as f32, &[in_dim, options.rank])?;
            factors.insert(
                format!("model.decoder.layers.{i}.{module}"),
                LoraFactors {
                    a,
                    b: vec![0.0; options.rank * out_dim],
                    in_dim,
                    out_dim,
                    rank: options.rank,
                },
            );
        }
    }
    Ok(Adapter {
        config: AdapterConfig {
            base_model: options.base_model.clone(),
            fine_tune_type: "lora".into(),
            model_type: Some("diffusion_gemma".into()),
            lora_parameters: LoraParameters {
                rank: options.rank,
                scale: options.scale,
                dropout: 0.0,
                keys: options.keys.clone(),
            },
        },
        factors,
        source: None,
    })
}

/// One iteration's corruption of a target.
#[derive(Clone, Debug, PartialEq)]
pub struct Corruption {
    /// The noise level drawn.
    pub t: f32,
    /// Which positions were replaced.
    pub corrupt: Vec<bool>,
    /// The random token drawn for every position.
    pub noise: Vec<u32>,
    /// The decoder's input: `noise` where corrupted, else the target.
    pub canvas: Vec<u32>,
}

/// Draws the corruption of `target` as the reference's `diffusion_loss` does, three draws
/// from the global key: `t = uniform(low=t_min, high=t_max)`, `corrupt = uniform((1, L)) < t`,
/// `noise = randint(0, vocab, (1, L))`.
pub fn draw_corruption(
    rng: &mut Rng,
    target: &[u32],
    t_range: (f32, f32),
    vocab: usize,
) -> Result<Corruption, TrainError> {
    let l = target.len();
    let vocab = i32::try_from(vocab).map_err(|_| TrainError::Option {
        name: "vocab",
        reason: format!("{vocab} does not fit an int32 randint"),
    })?;
    let t = rng.uniform_range(t_range.0, t_range.1, &[])?[0];
    let corrupt: Vec<bool> = rng.uniform(&[1, l])?.iter().map(|&u| u < t).collect();
    // randint(0, vocab) is within [0, vocab): the cast is lossless.
    let noise: Vec<u32> = rng
        .randint(0, vocab, &[1, l])?
        .iter()
        .map(|&x| x as u32)
        .collect();
    let canvas = target
        .iter()
        .zip(&corrupt)
        .zip(&noise)
        .map(|((&y, &c), &n)| if c { n } else { y })
        .collect();
    Ok(Corruption {
        t,
        corrupt,
        noise,
        canvas,
    })
}

/// What one iteration did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// Iterations done, this one included (1-based).
    pub iteration: u64,
    /// Optimizer steps done (iterations on empty targets take none).
    pub optimizer_step: u64,
    /// The example's line in the data file.
    pub line: usize,
    /// The loss before the update; `None` when the example's target is empty (skipped, as
    /// the reference skips it: no draw, no update).
    pub loss: Option<f32>,
    /// Corrupted positions (the loss's denominator).
    pub corrupted: usize,
    /// Target tokens of the example.
    pub target_tokens: usize,
    /// Wall time of the iteration.
    pub seconds: f64,
    /// Examples per second over the iterations of this [`Trainer::train`] call so far.
    pub examples_per_sec: f64,
}

/// A LoRA training run on a loaded model: data, adapter, optimizer and RNG state.
pub struct Trainer<'m> {
    model: &'m DiffusionGemma,
    data: Vec<EncodedPair>,
    options: TrainOptions,
    t_range: (f32, f32),
    adapter: Adapter,
    optimizer: AdamW,
    rng: Rng,
    iteration: u64,
}

impl std::fmt::Debug for Trainer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("examples", &self.data.len())
            .field("iteration", &self.iteration)
            .field("optimizer_step", &self.optimizer.step)
            .finish_non_exhaustive()
    }
}

impl<'m> Trainer<'m> {
    /// Starts a run: reads and encodes `data` (a `train.jsonl` file), seeds the RNG with
    /// `options.seed` and initialises the adapter. The noise range is the checkpoint's
    /// `generation_config.json` `t_min`/`t_max` (0.4/0.8 without it).
    pub fn new(
        model: &'m DiffusionGemma,
        data: &Path,
        options: TrainOptions,
    ) -> Result<Self, TrainError> {
        options.check()?;
        let examples = load_dataset(model, data, options.max_canvas)?;
        Self::with_examples(model, examples, options)
    }

    /// [`new`](Self::new) on examples already tokenized (e.g. by [`encode_pair`]).
    pub fn with_examples(
        model: &'m DiffusionGemma,
        examples: Vec<EncodedPair>,
        options: TrainOptions,
    ) -> Result<Self, TrainError> {
        options.check()?;
        let mut rng = Rng::new(options.seed);
        let adapter = init_adapter(model.model(), &options, &mut rng)?;
        let optimizer = AdamW::new(options.adamw);
        Self::with_state(model, examples, options, adapter, optimizer, rng, 0)
    }

    fn with_state(
        model: &'m DiffusionGemma,
        examples: Vec<EncodedPair>,
        options: TrainOptions,
        adapter: Adapter,
        optimizer: AdamW,
        rng: Rng,
        iteration: u64,
    ) -> Result<Self, TrainError> {
        let vocab = model.model().vocab_size();
        for (i, ex) in examples.iter().enumerate() {
            let bad = ex
                .prompt_ids
                .iter()
                .chain(&ex.target_ids)
                .find(|&&id| id as usize >= vocab);
            if ex.prompt_ids.is_empty() || bad.is_some() {
                return Err(TrainError::Option {
                    name: "examples",
                    reason: format!(
                        "example {i} (line {}): {}",
                        ex.line,
                        match bad {
                            Some(id) =>
                                format!("token id {id} is outside the vocabulary of {vocab}"),
                            None => "empty prompt".into(),
                        }
                    ),
                });
            }
        }
        if examples.iter().all(|ex| ex.target_ids.is_empty()) {
            return Err(TrainError::Option {
                name: "examples",
                reason: "no example has a target: nothing to train on".into(),
            });
        }
        let s = model.settings(&Defaults::Checkpoint);
        Ok(Trainer {
            model,
            data: examples,
            t_range: (s.t_min as f32, s.t_max as f32),
            options,
            adapter,
            optimizer,
            rng,
            iteration,
        })
    }

    /// The encoded examples, in file order.
    pub fn examples(&self) -> &[EncodedPair] {
        &self.data
    }

    /// The adapter as trained so far.
    pub fn adapter(&self) -> &Adapter {
        &self.adapter
    }

    /// The optimizer state.
    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    /// The options of this run.
    pub fn options(&self) -> &TrainOptions {
        &self.options
    }

    /// Iterations done.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// The corruption RNG's state (MLX's global key).
    pub fn rng(&self) -> &Rng {
        &self.rng
    }

    /// The noise range `(t_min, t_max)`.
    pub fn noise_range(&self) -> (f32, f32) {
        self.t_range
    }

    /// The example iteration `it` (0-based) visits.
    pub fn example_index(&self, it: u64) -> usize {
        let n = self.data.len() as u64;
        let pos = (it % n) as usize;
        match self.options.order {
            DataOrder::Sequential => pos,
            DataOrder::Shuffled { seed } => permutation(seed, it / n, self.data.len())[pos],
        }
    }

    /// Runs one iteration: draws the corruption, computes the loss and the adapter gradients,
    /// takes an AdamW step. An example with an empty target is skipped (no draw, no step).
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        let start = Instant::now();
        let index = self.example_index(self.iteration);
        let pair = &self.data[index];
        let (line, target_tokens) = (pair.line, pair.target_ids.len());
        let mut report = StepReport {
            iteration: self.iteration + 1,
            optimizer_step: self.optimizer.step,
            line,
            loss: None,
            corrupted: 0,
            target_tokens,
            seconds: 0.0,
            examples_per_sec: 0.0,
        };
        if target_tokens > 0 {
            let vocab = self.model.model().vocab_size();
            let mut rng = self.rng.clone();
            let c = draw_corruption(&mut rng, &pair.target_ids, self.t_range, vocab)?;
            let out = self.loss_and_grads(index, &c)?;
            self.apply(&out.grads)?;
            // Commit the RNG only once the step succeeded, so a failed step can be retried.
            self.rng = rng;
            report.loss = Some(out.loss);
            report.corrupted = out.corrupted;
            report.optimizer_step = self.optimizer.step;
        }
        self.iteration += 1;
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// The loss and adapter gradients of example `index` under corruption `c`.
    pub fn loss_and_grads(
        &self,
        index: usize,
        c: &Corruption,
    ) -> Result<dg_core::train::LossAndGrads, TrainError> {
        let pair = &self.data[index];
        let example = dg_core::train::TrainExample {
            prompt_ids: &pair.prompt_ids,
            canvas_ids: &c.canvas,
            target_ids: &pair.target_ids,
            corrupt: &c.corrupt,
        };
        let model = self.model.model();
        Ok(self
            .model
            .pool()
            .install(|| dg_core::train::diffusion_loss_and_grads(model, &self.adapter, &example))?)
    }

    /// One AdamW step on every adapter tensor.
    fn apply(&mut self, grads: &BTreeMap<String, (Vec<f32>, Vec<f32>)>) -> Result<(), TrainError> {
        for (path, f) in &self.adapter.factors {
            let Some((da, db)) = grads.get(path) else {
                return Err(TrainError::Option {
                    name: "gradients",
                    reason: format!("the backward pass returned no gradient for {path}"),
                });
            };
            if da.len() != f.a.len() || db.len() != f.b.len() {
                return Err(TrainError::Option {
                    name: "gradients",
                    reason: format!(
                        "{path}: gradient sizes {} and {} do not fit lora_a {} and lora_b {}",
                        da.len(),
                        db.len(),
                        f.a.len(),
                        f.b.len()
                    ),
                });
            }
        }
        self.optimizer.begin_step();
        for (path, f) in self.adapter.factors.iter_mut() {
            if let Some((da, db)) = grads.get(path) {
                self.optimizer
                    .update(&format!("{path}.lora_a"), &mut f.a, da);
                self.optimizer
                    .update(&format!("{path}.lora_b"), &mut f.b, db);
            }
        }
        Ok(())
    }

    /// Runs `iters` iterations, calling `on_step` after each; `ControlFlow::Break` stops early.
    pub fn train(
        &mut self,
        iters: u64,
        mut on_step: impl FnMut(&StepReport) -> ControlFlow<()>,
    ) -> Result<(), TrainError> {
        let start = Instant::now();
        for done in 1..=iters {
            let mut report = self.step()?;
            report.examples_per_sec = done as f64 / start.elapsed().as_secs_f64().max(1e-9);
            if on_step(&report).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Writes the adapter in the reference's format (`adapter_config.json` +
    /// `adapters.safetensors`): mountable by dg and by the reference's `load_diffusion_lora`.
    pub fn save_adapter(&self, dir: &Path) -> Result<(), TrainError> {
        Ok(self.adapter.save(dir)?)
    }
}

/// The permutation of `n` examples for pass `epoch`: indices sorted by the threefry words of
/// key `(seed, epoch)` (ties, vanishingly rare, by index).
fn permutation(seed: u64, epoch: u64, n: usize) -> Vec<usize> {
    let key = rng::threefry2x32(rng::key(seed), [epoch as u32, (epoch >> 32) as u32]);
    let mut words = vec![0u32; n];
    rng::fill_bits(key, &mut words);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (words[i], i));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_seeded_permutations() {
        let p = permutation(3, 0, 10);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_eq!(p, permutation(3, 0, 10));
        assert_ne!(p, permutation(3, 1, 10));
        assert_ne!(p, permutation(4, 0, 10));
    }

    #[test]
    fn options_are_checked_by_name() {
        let bad = |o: TrainOptions| o.check().unwrap_err().to_string();
        let base = TrainOptions::default();
        assert!(bad(TrainOptions {
            rank: 0,
            ..base.clone()
        })
        .contains("option rank"));
        assert!(bad(TrainOptions {
            keys: vec!["experts.down_proj".into()],
            ..base.clone()
        })
        .contains("option keys"));
        let mut o = base;
        o.adamw.learning_rate = f32::NAN;
        assert!(bad(o).contains("option learning_rate"));
    }
}
