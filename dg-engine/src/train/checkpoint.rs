//! Checkpoints of a training run: a directory holding the adapter in the reference's format
//! (`adapter_config.json`, `adapters.safetensors`: mountable as is), the AdamW moments
//! ([`OPTIMIZER_FILE`]) and the run's state and options ([`STATE_FILE`]: iteration, optimizer
//! step, RNG key). Resuming continues exactly where the run stopped: the same draws, the same
//! updates, the same losses as an uninterrupted run.

use std::collections::BTreeMap;
use std::path::Path;

use dg_core::lora::Adapter;
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use super::{
    module_dims, AdamW, AdamWConfig, DataOrder, Moments, TrainError, TrainOptions, Trainer,
};
use crate::engine::DiffusionGemma;
use crate::rng::Rng;

/// The run's state and options, JSON.
pub const STATE_FILE: &str = "trainer_state.json";
/// The AdamW moments: `<parameter>.m` and `<parameter>.v` (f32), parameters named as in
/// `adapters.safetensors`.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const FORMAT: &str = "dg-lora-train/1";
/// A state file is a few hundred bytes; refuse anything absurd before reading it.
const MAX_STATE_BYTES: u64 = 1 << 20;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    format: String,
    iteration: u64,
    optimizer_step: u64,
    rng_key: [u32; 2],
    seed: u64,
    shuffle_seed: Option<u64>,
    num_layers: Option<usize>,
    max_canvas: usize,
    learning_rate: f32,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_owned(),
        source,
    }
}

fn file_err(path: &Path, reason: impl ToString) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so that an interrupted
/// save leaves the previous file whole.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl<'m> Trainer<'m> {
    /// Saves the run to `dir` (created if needed): adapter, optimizer moments, state.
    pub fn save_checkpoint(&self, dir: &Path) -> Result<(), TrainError> {
        self.adapter.save(dir)?;
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, m) in &self.optimizer.moments {
            tensors.push((format!("{name}.m"), vec![m.m.len()], f32_bytes(&m.m)));
            tensors.push((format!("{name}.v"), vec![m.v.len()], f32_bytes(&m.v)));
        }
        let path = dir.join(OPTIMIZER_FILE);
        let views = tensors
            .iter()
            .map(|(name, shape, bytes)| {
                safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_err(&path, e))?;
        let bytes = safetensors::serialize(views, None).map_err(|e| file_err(&path, e))?;
        write_atomic(&path, &bytes)?;
        let o = &self.options;
        let state = State {
            format: FORMAT.into(),
            iteration: self.iteration,
            optimizer_step: self.optimizer.step,
            rng_key: self.rng.state(),
            seed: o.seed,
            shuffle_seed: match o.order {
                DataOrder::Sequential => None,
                DataOrder::Shuffled { seed } => Some(seed),
            },
            num_layers: o.num_layers,
            max_canvas: o.max_canvas,
            learning_rate: o.adamw.learning_rate,
            betas: o.adamw.betas,
            eps: o.adamw.eps,
            weight_decay: o.adamw.weight_decay,
        };
        let path = dir.join(STATE_FILE);
        let json = serde_json::to_string_pretty(&state).map_err(|e| file_err(&path, e))?;
        write_atomic(&path, json.as_bytes())
    }

    /// Continues the run saved in `dir` on `data` (normally the file it was trained on): the
    /// adapter, moments, iteration, RNG state and options (rank, scale, keys, layers, seed,
    /// data order, max canvas, AdamW settings) all come from the checkpoint.
    pub fn resume(model: &'m DiffusionGemma, data: &Path, dir: &Path) -> Result<Self, TrainError> {
        let state_path = dir.join(STATE_FILE);
        let meta = std::fs::metadata(&state_path).map_err(io_err(&state_path))?;
        if meta.len() > MAX_STATE_BYTES {
            return Err(file_err(&state_path, "too large for a trainer state file"));
        }
        let text = std::fs::read_to_string(&state_path).map_err(io_err(&state_path))?;
        let state: State = serde_json::from_str(&text).map_err(|e| file_err(&state_path, e))?;
        if state.format != FORMAT {
            return Err(file_err(
                &state_path,
                format!("format {:?}, expected {FORMAT:?}", state.format),
            ));
        }
        let adapter = Adapter::load(dir)?;
        check_adapter_fits(model, &adapter, dir)?;
        let p = &adapter.config.lora_parameters;
        let options = TrainOptions {
            rank: p.rank,
            scale: p.scale,
            keys: p.keys.clone(),
            num_layers: state.num_layers,
            adamw: AdamWConfig {
                learning_rate: state.learning_rate,
                betas: state.betas,
                eps: state.eps,
                weight_decay: state.weight_decay,
            },
            max_canvas: state.max_canvas,
            seed: state.seed,
            order: match state.shuffle_seed {
                None => DataOrder::Sequential,
                Some(seed) => DataOrder::Shuffled { seed },
            },
            base_model: adapter.config.base_model.clone(),
        };
        options.check()?;
        let moments = read_moments(&dir.join(super::OPTIMIZER_FILE), &adapter)?;
        let optimizer = AdamW {
            config: options.adamw,
            step: state.optimizer_step,
            moments,
        };
        let rng = Rng::from_key(state.rng_key);
        let examples = super::load_dataset(model, data, options.max_canvas)?;
        Self::with_state(
            model,
            examples,
            options,
            adapter,
            optimizer,
            rng,
            state.iteration,
        )
    }

    /// Changes the learning rate from the next step on (e.g. after [`resume`](Self::resume)).
    pub fn set_learning_rate(&mut self, learning_rate: f32) -> Result<(), TrainError> {
        let mut options = self.options.clone();
        options.adamw.learning_rate = learning_rate;
        options.check()?;
        self.options = options;
        self.optimizer.config.learning_rate = learning_rate;
        Ok(())
    }
}

/// Every factor of `adapter` names a module of the model, with its shape.
fn check_adapter_fits(
    model: &DiffusionGemma,
    adapter: &Adapter,
    dir: &Path,
) -> Result<(), TrainError> {
    let types = model.model().config().text.layer_types();
    for (path, f) in &adapter.factors {
        let dims = dg_core::lora::split_module_path(path)
            .and_then(|(i, module)| module_dims(model.model(), *types.get(i)?, module));
        if dims != Some((f.in_dim, f.out_dim)) {
            return Err(file_err(
                &dir.join(dg_core::lora::ADAPTER_WEIGHTS_FILE),
                format!(
                    "{path} [{} -> {}] matches no layer of this model{}",
                    f.in_dim,
                    f.out_dim,
                    match dims {
                        Some((i, o)) => format!(" (it has [{i} -> {o}])"),
                        None => String::new(),
                    }
                ),
            ));
        }
    }
    Ok(())
}

fn read_moments(path: &Path, adapter: &Adapter) -> Result<BTreeMap<String, Moments>, TrainError> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| file_err(path, e))?;
    let read = |name: &str, len: usize| -> Result<Vec<f32>, TrainError> {
        let view = st
            .tensor(name)
            .map_err(|_| file_err(path, format!("tensor {name} is missing")))?;
        if view.dtype() != Dtype::F32 || view.shape() != [len] {
            return Err(file_err(
                path,
                format!(
                    "tensor {name}: {:?} {:?}, expected F32 [{len}]",
                    view.dtype(),
                    view.shape()
                ),
            ));
        }
        Ok(view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    };
    let mut moments = BTreeMap::new();
    if st.names().is_empty() {
        // Saved before the first step: mlx starts the moments at zero too.
        return Ok(moments);
    }
    for (module, f) in &adapter.factors {
        for (suffix, len) in [("lora_a", f.a.len()), ("lora_b", f.b.len())] {
            let name = format!("{module}.{suffix}");
            let m = read(&format!("{name}.m"), len)?;
            let v = read(&format!("{name}.v"), len)?;
            moments.insert(name, Moments { m, v });
        }
    }
    Ok(moments)
}
