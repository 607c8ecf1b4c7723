//! The parts of `config.json` the vision path reads, with the reference's defaults
//! (`optiq/vlm/_mlxvlm/models/gemma4/config.py::VisionConfig`,
//! `diffusion_gemma/config.py::ModelConfig`).

use std::path::{Path, PathBuf};

use dg_core::config::QuantizationConfig;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Result, VisionError};

// Upper bounds on the tower sizes a config may declare: generous (many times the real tower:
// hidden 768, intermediate 3072, 16 layers, 12 heads of 64, patch 16, pooling 3, 280 soft
// tokens, 10240 positions) and checked before anything is sized by them, so that a corrupt
// config.json is a named error, not an allocation abort or an overflow.

/// Largest `vision_config.hidden_size` and `text_config.hidden_size` (the embedder's output).
pub const MAX_HIDDEN_SIZE: usize = 1 << 16;
/// Largest `vision_config.intermediate_size`.
pub const MAX_INTERMEDIATE_SIZE: usize = 1 << 18;
/// Largest `vision_config.num_hidden_layers`.
pub const MAX_LAYERS: usize = 1024;
/// Largest attention or key/value head count.
pub const MAX_HEADS: usize = 1024;
/// Largest `vision_config.head_dim`.
pub const MAX_HEAD_DIM: usize = 4096;
/// Largest `vision_config.patch_size` (pixels per side).
pub const MAX_PATCH_SIZE: usize = 256;
/// Largest `vision_config.pooling_kernel_size`.
pub const MAX_POOLING_KERNEL_SIZE: usize = 64;
/// Largest `vision_config.position_embedding_size`.
pub const MAX_POSITION_EMBEDDING_SIZE: usize = 1 << 20;
/// Largest padded patch count, `default_output_length * pooling_kernel_size^2` (real: 2520).
pub const MAX_PATCHES: usize = 1 << 20;

/// `vision_config`: the tower's geometry. Missing fields take the reference dataclass defaults.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct VisionConfig {
    /// Width of the tower's residual stream.
    pub hidden_size: usize,
    /// Hidden width of each block's MLP.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_hidden_layers: usize,
    /// Query heads per block.
    pub num_attention_heads: usize,
    /// Key/value heads per block.
    pub num_key_value_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Epsilon of every RMS norm.
    pub rms_norm_eps: f32,
    /// Default soft-token budget per image: the pooled output length.
    pub default_output_length: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// Positions per axis of the learned position table `[2, size, hidden]`.
    pub position_embedding_size: usize,
    /// Side of the square of patches pooled into one soft token.
    pub pooling_kernel_size: usize,
    /// Whether the linears clamp their inputs and outputs to stored bounds.
    pub use_clipped_linears: bool,
    /// Whether the pooled output is standardized with `std_bias` / `std_scale`.
    pub standardize: bool,
    /// The 2-D RoPE's parameters.
    pub rope_parameters: RopeParameters,
}

/// `vision_config.rope_parameters`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct RopeParameters {
    /// RoPE base frequency.
    pub rope_theta: f32,
}

impl Default for RopeParameters {
    fn default() -> Self {
        Self { rope_theta: 100.0 }
    }
}

impl Default for VisionConfig {
    fn default() -> Self {
        Self {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 16,
            num_attention_heads: 12,
            num_key_value_heads: 12,
            head_dim: 64,
            rms_norm_eps: 1e-6,
            default_output_length: 280,
            patch_size: 16,
            position_embedding_size: 10240,
            pooling_kernel_size: 3,
            use_clipped_linears: false,
            standardize: false,
            rope_parameters: RopeParameters::default(),
        }
    }
}

impl VisionConfig {
    /// The padded patch count: `default_output_length * pooling_kernel_size^2` (2520).
    pub fn max_patches(&self) -> usize {
        self.default_output_length * self.pooling_kernel_size * self.pooling_kernel_size
    }

    /// Channels per spatial dimension of the 2-D RoPE: `2 * (head_dim / 4)`.
    pub fn rope_channels_per_dim(&self) -> usize {
        2 * (self.head_dim / 4)
    }

    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
        let bad = |field: &str, message: String| VisionError::Config {
            path: path.to_path_buf(),
            field: format!("vision_config.{field}"),
            message,
        };
        let sizes = [
            ("hidden_size", self.hidden_size, MAX_HIDDEN_SIZE),
            (
                "intermediate_size",
                self.intermediate_size,
                MAX_INTERMEDIATE_SIZE,
            ),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_key_value_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            (
                "default_output_length",
                self.default_output_length,
                MAX_PATCHES,
            ),
            ("patch_size", self.patch_size, MAX_PATCH_SIZE),
            (
                "pooling_kernel_size",
                self.pooling_kernel_size,
                MAX_POOLING_KERNEL_SIZE,
            ),
            (
                "position_embedding_size",
                self.position_embedding_size,
                MAX_POSITION_EMBEDDING_SIZE,
            ),
        ];
        for (field, v, max) in sizes {
            if v == 0 {
                return Err(bad(field, "must be positive".into()));
            }
            if v > max {
                return Err(bad(field, format!("{v} is over the limit of {max}")));
            }
        }
        // All three bounded above, so the product cannot overflow.
        if self.max_patches() > MAX_PATCHES {
            return Err(bad(
                "default_output_length",
                format!(
                    "{} soft tokens times pooling_kernel_size^2 ({}) is over {MAX_PATCHES} patches",
                    self.default_output_length,
                    self.pooling_kernel_size * self.pooling_kernel_size
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(4) {
            // The reference's 2-D RoPE splits the head into two halves of 2*(head_dim/4)
            // channels; any other head_dim loses channels and crashes in its attention.
            return Err(bad(
                "head_dim",
                format!("{} is not a multiple of 4", self.head_dim),
            ));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(bad(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && (0.0..1.0).contains(&self.rms_norm_eps)) {
            return Err(bad(
                "rms_norm_eps",
                format!("{} is not a finite value in [0, 1)", self.rms_norm_eps),
            ));
        }
        if !(self.rope_parameters.rope_theta.is_finite() && self.rope_parameters.rope_theta > 0.0) {
            return Err(bad(
                "rope_parameters.rope_theta",
                format!(
                    "{} is not a finite value > 0",
                    self.rope_parameters.rope_theta
                ),
            ));
        }
        Ok(())
    }
}

/// What the vision path needs from a checkpoint's `config.json`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CheckpointConfig {
    /// `None` when the checkpoint has no vision tower.
    pub vision: Option<VisionConfig>,
    /// `text_config.hidden_size`: the width the embedder projects into.
    pub text_hidden_size: usize,
    /// The `quantization` block (`None` when unquantized): the text model's parser and rules.
    pub quantization: Option<QuantizationConfig>,
    /// Image placeholder token id.
    pub image_token_id: Option<u32>,
    /// Begin-of-image token id.
    pub boi_token_id: Option<u32>,
    /// End-of-image token id.
    pub eoi_token_id: Option<u32>,
}

impl CheckpointConfig {
    /// Reads `<dir>/config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = dg_files::read_text(&path, dg_files::CONFIG_MAX_BYTES)?;
        let value: Value = serde_json::from_str(&text).map_err(|e| VisionError::Config {
            path: path.clone(),
            field: "(file)".into(),
            message: e.to_string(),
        })?;
        Self::from_json(&value, &path)
    }

    /// Parses an already-read `config.json`; `path` is only used in errors.
    pub fn from_json(value: &Value, path: &Path) -> Result<Self> {
        let err = |field: &str, message: String| VisionError::Config {
            path: PathBuf::from(path),
            field: field.to_string(),
            message,
        };
        let vision = match value.get("vision_config") {
            None | Some(Value::Null) => None,
            Some(v) => {
                // The error names the field within vision_config, not just the block.
                let cfg: VisionConfig =
                    serde_path_to_error::deserialize(v.clone()).map_err(|e| {
                        let path = e.path().to_string();
                        let field = if path == "." {
                            "vision_config".to_string()
                        } else {
                            format!("vision_config.{path}")
                        };
                        err(&field, e.inner().to_string())
                    })?;
                cfg.validate(path)?;
                Some(cfg)
            }
        };
        // TextConfig.hidden_size defaults to 2816 in the reference.
        let text_hidden_size = match value.get("text_config").and_then(|t| t.get("hidden_size")) {
            None => 2816,
            Some(v) => v
                .as_u64()
                .and_then(|h| usize::try_from(h).ok())
                .filter(|h| (1..=MAX_HIDDEN_SIZE).contains(h))
                .ok_or_else(|| {
                    err(
                        "text_config.hidden_size",
                        format!("{v} is not an integer in 1..={MAX_HIDDEN_SIZE}"),
                    )
                })?,
        };
        let token = |field: &str, default: Option<u32>| -> Result<Option<u32>> {
            match value.get(field) {
                None => Ok(default),
                Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .map(Some)
                    .ok_or_else(|| err(field, format!("{v}"))),
            }
        };
        let quantization = match value.get("quantization") {
            None | Some(Value::Null) => None,
            Some(q) => Some(QuantizationConfig::from_json(q).map_err(|m| err("quantization", m))?),
        };
        Ok(Self {
            vision,
            text_hidden_size,
            quantization,
            image_token_id: token("image_token_id", Some(258880))?,
            boi_token_id: token("boi_token_id", Some(255999))?,
            eoi_token_id: token("eoi_token_id", Some(258882))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_reference_dataclass() {
        let v: Value = serde_json::json!({"vision_config": {"hidden_size": 1152}});
        let c = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap();
        let vc = c.vision.unwrap();
        assert_eq!(vc.hidden_size, 1152);
        assert_eq!(vc.patch_size, 16);
        assert_eq!(vc.position_embedding_size, 10240);
        assert_eq!(vc.max_patches(), 2520);
        assert_eq!(vc.rope_parameters.rope_theta, 100.0);
        assert!(!vc.standardize);
        assert_eq!(c.text_hidden_size, 2816);
        assert_eq!(c.image_token_id, Some(258880));
    }

    #[test]
    fn null_vision_config_means_no_tower() {
        let v: Value =
            serde_json::json!({"vision_config": null, "text_config": {"hidden_size": 64}});
        let c = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap();
        assert!(c.vision.is_none());
        assert_eq!(c.text_hidden_size, 64);
    }

    #[test]
    fn bad_head_dim_is_a_config_error() {
        let v: Value = serde_json::json!({"vision_config": {"head_dim": 26}});
        let e = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap_err();
        assert!(e.to_string().contains("vision_config.head_dim"), "{e}");
    }

    #[test]
    fn quantization_is_the_text_models_block() {
        let v: Value = serde_json::json!({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
            "a.b": {"group_size": 64, "bits": 8}, "c": false}});
        let c = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap();
        let q = c.quantization.unwrap();
        assert_eq!(q.default.map(|d| (d.bits, d.group_size)), Some((4, 64)));
        assert_eq!(
            q.modules["a.b"].map(|d| (d.bits, d.group_size)),
            Some((8, 64))
        );
        assert_eq!(q.modules["c"], None);
        let v: Value =
            serde_json::json!({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}});
        let e = CheckpointConfig::from_json(&v, Path::new("/m/config.json")).unwrap_err();
        assert!(
            e.to_string().contains("quantization.mode") && e.to_string().contains("/m/config.json"),
            "{e}"
        );
    }

    #[test]
    fn oversized_layer_counts_are_refused_before_allocation() {
        for layers in [100_000_000_u64, 1_000_000_000_000, u64::MAX] {
            let v: Value = serde_json::json!({"vision_config": {"num_hidden_layers": layers}});
            let e = CheckpointConfig::from_json(&v, Path::new("/m/config.json")).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, VisionError::Config { .. })
                    && msg.contains("vision_config.num_hidden_layers")
                    && msg.contains("/m/config.json"),
                "{msg}"
            );
        }
        let v: Value = serde_json::json!({"vision_config": {"default_output_length": 65536,
            "pooling_kernel_size": 64}});
        let e = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap_err();
        assert!(
            e.to_string()
                .contains("vision_config.default_output_length"),
            "{e}"
        );
    }

    #[test]
    fn type_errors_name_the_field() {
        let v: Value = serde_json::json!({"vision_config": {"hidden_size": "big"}});
        let e = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("vision_config.hidden_size") && msg.contains("invalid type"),
            "{msg}"
        );
        let v: Value =
            serde_json::json!({"vision_config": {"rope_parameters": {"rope_theta": -1.0}}});
        let e = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap_err();
        assert!(
            e.to_string()
                .contains("vision_config.rope_parameters.rope_theta"),
            "{e}"
        );
        let v: Value = serde_json::json!({"text_config": {"hidden_size": 1_u64 << 40}});
        let e = CheckpointConfig::from_json(&v, Path::new("config.json")).unwrap_err();
        assert!(e.to_string().contains("text_config.hidden_size"), "{e}");
    }
}
