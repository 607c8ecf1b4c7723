//! LoRA adapters in the reference's format (mlx-lm's `LoRALinear`, as OptiQ's DiffusionGemma
//! trainer writes them): a directory with `adapter_config.json` and `adapters.safetensors` whose
//! tensors are named `model.decoder.layers.{i}.{module}.lora_a` `[in, rank]` and `.lora_b`
//! `[rank, out]`. A mounted adapter adds `scale * (x @ lora_a) @ lora_b` to its layer's output in
//! every pass; the encoder runs the same layers, so one adapter acts in both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::mmap::MappedFile;

/// The adapter's configuration file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapters.safetensors";
/// The layer modules the reference's trainer adapts (attention and dense MLP projections; the
/// experts, router and self-conditioning stay frozen).
pub const DEFAULT_LORA_KEYS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];
/// Largest rank accepted: far above any useful adapter, low enough that a corrupt config cannot
/// size a huge allocation.
pub const MAX_LORA_RANK: usize = 4096;
/// Where the layers' parameters live in the reference's module tree.
const LAYER_PREFIX: &str = "model.decoder.layers.";

/// `lora_parameters` of `adapter_config.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraParameters {
    /// Inner dimension of the two factors.
    pub rank: usize,
    /// Factor on the adapter's output.
    pub scale: f32,
    /// Training-time dropout on the adapter's input (no effect at inference).
    #[serde(default)]
    pub dropout: f32,
    /// Layer modules adapted, e.g. `self_attn.q_proj`.
    pub keys: Vec<String>,
}

/// `adapter_config.json` as the reference writes and reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdapterConfig {
    /// The checkpoint the adapter was trained on (informational).
    #[serde(default)]
    pub base_model: Option<String>,
    /// Always `"lora"` (mlx-lm also writes `"dora"` and `"full"`, which dg does not mount).
    pub fine_tune_type: String,
    /// `"diffusion_gemma"`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Rank, scale, dropout and adapted modules.
    pub lora_parameters: LoraParameters,
}

/// The two factors of one adapted linear layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraFactors {
    /// `[in, rank]`, row-major.
    pub a: Vec<f32>,
    /// `[rank, out]`, row-major.
    pub b: Vec<f32>,
    /// Input features of the layer.
    pub in_dim: usize,
    /// Output features of the layer.
    pub out_dim: usize,
    /// Inner dimension.
    pub rank: usize,
}

/// A LoRA adapter: its configuration and the factors of every adapted layer, keyed by the
/// layer's module path (`model.decoder.layers.3.mlp.up_proj`).
#[derive(Clone, Debug, PartialEq)]
pub struct Adapter {
    /// The configuration.
    pub config: AdapterConfig,
    /// Factors by module path.
    pub factors: BTreeMap<String, LoraFactors>,
    /// Where it was loaded from (for error messages); `None` when built in memory.
    pub source: Option<PathBuf>,
}

impl Adapter {
    /// Reads `adapter_config.json` and `adapters.safetensors` from `dir`. Shapes are checked
    /// against the config here and against the model when mounted.
    pub fn load(dir: &Path) -> Result<Self, CoreError> {
        let bad = |path: &Path, reason: String| CoreError::Adapter {
            path: path.to_owned(),
            reason,
        };
        if !dir.is_dir() {
            return Err(bad(
                dir,
                "not a directory (an adapter is a directory with adapter_config.json and \
                 adapters.safetensors)"
                    .into(),
            ));
        }
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let config = read_config(&config_path)?;
        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        let factors = read_factors(&weights_path, &config.lora_parameters)?;
        Ok(Adapter {
            config,
            factors,
            source: Some(dir.to_owned()),
        })
    }

    /// Writes the adapter as the reference does: `adapters.safetensors` (f32) and
    /// `adapter_config.json`, creating `dir` if needed.
    pub fn save(&self, dir: &Path) -> Result<(), CoreError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| CoreError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut tensors: Vec<(String, Vec<usize>, &[f32])> = Vec::new();
        for (path, f) in &self.factors {
            tensors.push((format!("{path}.lora_a"), vec![f.in_dim, f.rank], &f.a));
            tensors.push((format!("{path}.lora_b"), vec![f.rank, f.out_dim], &f.b));
        }
        let views = tensors
            .iter()
            .map(|(name, shape, data)| {
                safetensors::tensor::TensorView::new(
                    Dtype::F32,
                    shape.clone(),
                    bytemuck::cast_slice(data),
                )
                .map(|view| (name.clone(), view))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CoreError::Adapter {
                path: dir.to_owned(),
                reason: format!("cannot serialize the factors: {e}"),
            })?;
        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        safetensors::serialize_to_file(views, None, &weights_path).map_err(|e| {
            CoreError::Adapter {
                path: weights_path.clone(),
                reason: format!("cannot write: {e}"),
            }
        })?;
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let json =
            serde_json::to_string_pretty(&self.config).map_err(|source| CoreError::Json {
                path: config_path.clone(),
                source,
            })?;
        std::fs::write(&config_path, json).map_err(io(&config_path))
    }

    /// The factor on every adapted layer's output.
    pub fn scale(&self) -> f32 {
        self.config.lora_parameters.scale
    }

    /// Names the adapter in messages: its directory, or "the adapter".
    pub fn describe(&self) -> String {
        match &self.source {
            Some(dir) => dir.display().to_string(),
            None => "the adapter".into(),
        }
    }
}

/// Splits `model.decoder.layers.{i}.{module}` into the layer index and the module key.
pub fn split_module_path(path: &str) -> Option<(usize, &str)> {
    let rest = path.strip_prefix(LAYER_PREFIX)?;
    let (index, module) = rest.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((index.parse().ok()?, module))
}

fn read_config(path: &Path) -> Result<AdapterConfig, CoreError> {
    let bad = |reason: String| CoreError::Adapter {
        path: path.to_owned(),
        reason,
    };
    let text = dg_files::read_text(path, dg_files::CONFIG_MAX_BYTES)?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let config: AdapterConfig = serde_path_to_error::deserialize(de)
        .map_err(|e| bad(format!("field {}: {}", e.path(), e.inner())))?;
    if config.fine_tune_type != "lora" {
        return Err(bad(format!(
            "fine_tune_type is {:?}; dg mounts \"lora\" adapters only",
            config.fine_tune_type
        )));
    }
    if let Some(kind) = &config.model_type {
        if kind != "diffusion_gemma" {
            return Err(bad(format!(
                "model_type is {kind:?}: this adapter was trained for another model, not \
                 diffusion_gemma"
            )));
        }
    }
    let p = &config.lora_parameters;
    if p.rank == 0 || p.rank > MAX_LORA_RANK {
        return Err(bad(format!(
            "lora_parameters.rank is {}; expected 1..={MAX_LORA_RANK}",
            p.rank
        )));
    }
    if !p.scale.is_finite() {
        return Err(bad(format!(
            "lora_parameters.scale is {}; expected a finite number",
            p.scale
        )));
    }
    if !(0.0..1.0).contains(&p.dropout) {
        return Err(bad(format!(
            "lora_parameters.dropout is {}; expected 0 <= dropout < 1",
            p.dropout
        )));
    }
    if let Some(key) = p
        .keys
        .iter()
        .find(|k| !DEFAULT_LORA_KEYS.contains(&k.as_str()))
    {
        return Err(bad(format!(
            "lora_parameters.keys names {key:?}, which is not a linear layer dg can adapt \
             (one of {})",
            DEFAULT_LORA_KEYS.join(", ")
        )));
    }
    Ok(config)
}

/// One stored factor: its shape and values.
type Factor = (Vec<usize>, Vec<f32>);

fn read_factors(
    path: &Path,
    params: &LoraParameters,
) -> Result<BTreeMap<String, LoraFactors>, CoreError> {
    let bad = |reason: String| CoreError::Adapter {
        path: path.to_owned(),
        reason,
    };
    let file = MappedFile::open(path)?;
    let st = SafeTensors::deserialize(file.bytes())
        .map_err(|e| bad(format!("truncated or corrupt safetensors file: {e}")))?;
    let mut halves: BTreeMap<String, [Option<Factor>; 2]> = BTreeMap::new();
    for (name, view) in st.tensors() {
        let (module_path, is_a) = if let Some(p) = name.strip_suffix(".lora_a") {
            (p, true)
        } else if let Some(p) = name.strip_suffix(".lora_b") {
            (p, false)
        } else {
            return Err(bad(format!(
                "tensor {name}: not a LoRA factor (names end in .lora_a or .lora_b)"
            )));
        };
        let Some((_, module)) = split_module_path(module_path) else {
            return Err(bad(format!(
                "tensor {name}: matches no layer (expected {LAYER_PREFIX}<i>.<module>.lora_a/b)"
            )));
        };
        if !params.keys.iter().any(|k| k == module) {
            return Err(bad(format!(
                "tensor {name}: module {module} is not in lora_parameters.keys"
            )));
        }
        let shape = view.shape().to_vec();
        if shape.len() != 2 {
            return Err(bad(format!(
                "tensor {name}: shape {shape:?} is not a matrix"
            )));
        }
        let rank_axis = if is_a { shape[1] } else { shape[0] };
        if rank_axis != params.rank {
            return Err(bad(format!(
                "tensor {name}: shape {shape:?} has rank {rank_axis}, but \
                 lora_parameters.rank is {}",
                params.rank
            )));
        }
        let data = to_f32(view.dtype(), view.data()).ok_or_else(|| {
            bad(format!(
                "tensor {name}: dtype {:?} is not a float",
                view.dtype()
            ))
        })?;
        let slot = halves.entry(module_path.to_owned()).or_default();
        slot[usize::from(!is_a)] = Some((shape, data));
    }
    let mut factors = BTreeMap::new();
    for (module_path, [a, b]) in halves {
        let (Some((a_shape, a)), Some((b_shape, b))) = (a, b) else {
            return Err(bad(format!(
                "{module_path}: has only one of lora_a and lora_b"
            )));
        };
        factors.insert(
            module_path,
            LoraFactors {
                a,
                b,
                in_dim: a_shape[0],
                out_dim: b_shape[1],
                rank: params.rank,
            },
        );
    }
    if factors.is_empty() {
        return Err(bad("holds no LoRA factors".into()));
    }
    Ok(factors)
}

fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let words = |n: usize| bytes.chunks_exact(n);
    Some(match dtype {
        Dtype::F32 => words(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => words(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => words(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_paths_split_into_layer_and_module() {
        assert_eq!(
            split_module_path("model.decoder.layers.12.mlp.up_proj"),
            Some((12, "mlp.up_proj"))
        );
        assert_eq!(
            split_module_path("model.decoder.layers.x.mlp.up_proj"),
            None
        );
        assert_eq!(
            split_module_path("model.encoder.layers.1.mlp.up_proj"),
            None
        );
        assert_eq!(split_module_path("model.decoder.layers.1"), None);
    }
}
