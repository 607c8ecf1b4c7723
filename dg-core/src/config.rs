//! `config.json`, parsed with the reference's defaults (mlx-optiq's `ModelConfig` / `TextConfig`).
//!
//! Unknown fields are ignored, as the reference's `_config_kwargs` does; missing fields take the
//! reference's dataclass defaults. [`ModelConfig::validate`] then checks that the numbers describe
//! a model we can build, naming the field at fault.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::CoreError;

/// Which attention a layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Sliding-window attention with default RoPE.
    SlidingAttention,
    /// Global attention, proportional partial RoPE, keys reused as values.
    FullAttention,
}

/// RoPE parameters of one layer type (`rope_parameters[layer_type]`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct RopeParameters {
    /// `default` or `proportional`.
    #[serde(default = "default_rope_type", alias = "type")]
    pub rope_type: String,
    /// Base frequency.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// Fraction of the head dimension that is rotated (proportional RoPE).
    #[serde(default = "one")]
    pub partial_rotary_factor: f64,
    /// Frequency scale factor (proportional RoPE).
    #[serde(default = "one")]
    pub factor: f64,
}

fn default_rope_type() -> String {
    "default".into()
}
fn default_rope_theta() -> f64 {
    10000.0
}
fn one() -> f64 {
    1.0
}

/// An id or a list of ids, as HF configs write `eos_token_id`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum TokenIds {
    /// A single id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The text backbone's hyper-parameters (`text_config`).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub num_global_key_value_heads: Option<usize>,
    pub head_dim: usize,
    pub global_head_dim: usize,
    pub hidden_activation: String,
    pub rms_norm_eps: f32,
    pub pad_token_id: u32,
    pub eos_token_id: Option<TokenIds>,
    pub bos_token_id: Option<u32>,
    pub tie_word_embeddings: bool,
    pub rope_parameters: Option<BTreeMap<String, RopeParameters>>,
    pub attention_bias: bool,
    pub sliding_window: usize,
    pub layer_types: Option<Vec<LayerType>>,
    pub final_logit_softcapping: Option<f32>,
    pub use_bidirectional_attention: Option<String>,
    pub num_experts: usize,
    pub top_k_experts: usize,
}

impl Default for TextConfig {
    fn default() -> Self {
        TextConfig {
            vocab_size: 262144,
            hidden_size: 2816,
            intermediate_size: 2112,
            moe_intermediate_size: 704,
            num_hidden_layers: 30,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            num_global_key_value_heads: Some(2),
            head_dim: 256,
            global_head_dim: 512,
            hidden_activation: "gelu_pytorch_tanh".into(),
            rms_norm_eps: 1e-6,
            pad_token_id: 0,
            eos_token_id: Some(TokenIds::One(1)),
            bos_token_id: Some(2),
            tie_word_embeddings: true,
            rope_parameters: None,
            attention_bias: false,
            sliding_window: 1024,
            layer_types: None,
            final_logit_softcapping: Some(30.0),
            use_bidirectional_attention: Some("vision".into()),
            num_experts: 128,
            top_k_experts: 8,
        }
    }
}

impl TextConfig {
    /// Layer types: explicit, or the reference's default 5 sliding : 1 full pattern whose last
    /// layer is forced to full attention.
    pub fn layer_types(&self) -> Vec<LayerType> {
        if let Some(types) = &self.layer_types {
            return types.clone();
        }
        let mut pattern = [LayerType::SlidingAttention; 6];
        pattern[5] = LayerType::FullAttention;
        let mut types: Vec<LayerType> = (0..self.num_hidden_layers)
            .map(|i| pattern[i % 6])
            .collect();
        if let Some(last) = types.last_mut() {
            *last = LayerType::FullAttention;
        }
        types
    }

    /// RoPE parameters of a layer type, with the reference's defaults.
    pub fn rope(&self, layer_type: LayerType) -> RopeParameters {
        let key = match layer_type {
            LayerType::SlidingAttention => "sliding_attention",
            LayerType::FullAttention => "full_attention",
        };
        if let Some(p) = self.rope_parameters.as_ref().and_then(|m| m.get(key)) {
            return p.clone();
        }
        if self.rope_parameters.is_some() {
            // The reference's `rope_parameters.get(layer_type, {})`: plain default RoPE.
            return RopeParameters {
                rope_type: default_rope_type(),
                rope_theta: default_rope_theta(),
                partial_rotary_factor: 1.0,
                factor: 1.0,
            };
        }
        match layer_type {
            LayerType::SlidingAttention => RopeParameters {
                rope_type: "default".into(),
                rope_theta: 10000.0,
                partial_rotary_factor: 1.0,
                factor: 1.0,
            },
            LayerType::FullAttention => RopeParameters {
                rope_type: "proportional".into(),
                rope_theta: 1_000_000.0,
                partial_rotary_factor: 0.25,
                factor: 1.0,
            },
        }
    }

    /// Head dimension of a layer type.
    pub fn head_dim_of(&self, layer_type: LayerType) -> usize {
        match layer_type {
            LayerType::FullAttention if self.global_head_dim > 0 => self.global_head_dim,
            _ => self.head_dim,
        }
    }

    /// Key/value head count of a layer type.
    pub fn kv_heads_of(&self, layer_type: LayerType) -> usize {
        match (layer_type, self.num_global_key_value_heads) {
            (LayerType::FullAttention, Some(n)) => n,
            _ => self.num_key_value_heads,
        }
    }
}

/// One entry of the `quantization` table: the default or a per-module override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantEntry {
    pub bits: u32,
    pub group_size: usize,
}

/// The checkpoint's `quantization` block: defaults plus per-module overrides (`false` = keep
/// the module unquantized).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizationConfig {
    pub default: Option<QuantEntry>,
    pub mode: String,
    pub modules: BTreeMap<String, Option<QuantEntry>>,
}

impl QuantizationConfig {
    fn parse(value: &serde_json::Value) -> Result<Self, String> {
        let map = value.as_object().ok_or("`quantization` is not an object")?;
        let num = |v: &serde_json::Value, what: &str| -> Result<u64, String> {
            v.as_u64()
                .ok_or(format!("`quantization.{what}` is not an integer"))
        };
        let mut out = QuantizationConfig {
            mode: "affine".into(),
            ..Default::default()
        };
        let bits = map.get("bits").map(|v| num(v, "bits")).transpose()?;
        let group = map
            .get("group_size")
            .map(|v| num(v, "group_size"))
            .transpose()?;
        if let Some(bits) = bits {
            out.default = Some(QuantEntry {
                bits: bits as u32,
                group_size: group.unwrap_or(64) as usize,
            });
        }
        if let Some(mode) = map.get("mode") {
            out.mode = mode
                .as_str()
                .ok_or("`quantization.mode` is not a string")?
                .into();
        }
        for (key, v) in map {
            if matches!(key.as_str(), "bits" | "group_size" | "mode") {
                continue;
            }
            let entry = match v {
                serde_json::Value::Bool(false) => None,
                serde_json::Value::Bool(true) => out.default,
                serde_json::Value::Object(m) => {
                    let bits = m
                        .get("bits")
                        .map(|b| num(b, &format!("{key}.bits")))
                        .transpose()?;
                    let group = m
                        .get("group_size")
                        .map(|g| num(g, &format!("{key}.group_size")))
                        .transpose()?;
                    let default = out.default;
                    Some(QuantEntry {
                        bits: bits
                            .map(|b| b as u32)
                            .or(default.map(|d| d.bits))
                            .unwrap_or(4),
                        group_size: group
                            .map(|g| g as usize)
                            .or(default.map(|d| d.group_size))
                            .unwrap_or(64),
                    })
                }
                _ => continue,
            };
            out.modules.insert(key.clone(), entry);
        }
        Ok(out)
    }
}

/// The whole `config.json` of a `diffusion_gemma` checkpoint.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub model_type: String,
    pub text: TextConfig,
    /// The vision tower's raw config (parsed by dg-vision), if the checkpoint has one.
    pub vision_config: Option<serde_json::Value>,
    pub boi_token_id: Option<u32>,
    pub eoi_token_id: Option<u32>,
    pub image_token_id: Option<u32>,
    pub canvas_length: usize,
    pub eos_token_id: Option<TokenIds>,
    pub quantization: Option<QuantizationConfig>,
    /// `generation_config` embedded in config.json (the reference honours only this one).
    pub generation_config: Option<serde_json::Value>,
    pub vision_soft_tokens_per_image: Option<usize>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default = "default_model_type")]
    model_type: String,
    #[serde(default)]
    text_config: Option<TextConfig>,
    #[serde(default)]
    vision_config: Option<serde_json::Value>,
    #[serde(default = "default_boi")]
    boi_token_id: Option<u32>,
    #[serde(default = "default_eoi")]
    eoi_token_id: Option<u32>,
    #[serde(default = "default_image")]
    image_token_id: Option<u32>,
    #[serde(default = "default_canvas")]
    canvas_length: usize,
    #[serde(default)]
    eos_token_id: Option<TokenIds>,
    #[serde(default)]
    quantization: Option<serde_json::Value>,
    #[serde(default)]
    generation_config: Option<serde_json::Value>,
    #[serde(default)]
    vision_soft_tokens_per_image: Option<usize>,
}

fn default_model_type() -> String {
    "diffusion_gemma".into()
}
fn default_boi() -> Option<u32> {
    Some(255999)
}
fn default_eoi() -> Option<u32> {
    Some(258882)
}
fn default_image() -> Option<u32> {
    Some(258880)
}
fn default_canvas() -> usize {
    256
}

impl ModelConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, CoreError> {
        let text = std::fs::read_to_string(path).map_err(|source| CoreError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json_str(&text).map_err(|e| match e {
            CoreError::Config { reason, .. } => CoreError::Config {
                path: path.to_owned(),
                reason,
            },
            other => other,
        })
    }

    /// Parses and validates a config from JSON text.
    pub fn from_json_str(text: &str) -> Result<Self, CoreError> {
        let bad = |reason: String| CoreError::Config {
            path: "config.json".into(),
            reason,
        };
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let quantization = raw
            .quantization
            .as_ref()
            .map(QuantizationConfig::parse)
            .transpose()
            .map_err(bad)?;
        let config = ModelConfig {
            model_type: raw.model_type,
            text: raw.text_config.unwrap_or_default(),
            vision_config: raw.vision_config.filter(|v| !v.is_null()),
            boi_token_id: raw.boi_token_id,
            eoi_token_id: raw.eoi_token_id,
            image_token_id: raw.image_token_id,
            canvas_length: raw.canvas_length,
            eos_token_id: raw.eos_token_id,
            quantization,
            generation_config: raw.generation_config,
            vision_soft_tokens_per_image: raw.vision_soft_tokens_per_image,
        };
        config.validate().map_err(bad)?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        let t = &self.text;
        if self.model_type != "diffusion_gemma" {
            return Err(format!(
                "model_type is {:?}, expected \"diffusion_gemma\"",
                self.model_type
            ));
        }
        let positive = [
            ("text_config.vocab_size", t.vocab_size),
            ("text_config.hidden_size", t.hidden_size),
            ("text_config.intermediate_size", t.intermediate_size),
            ("text_config.moe_intermediate_size", t.moe_intermediate_size),
            ("text_config.num_hidden_layers", t.num_hidden_layers),
            ("text_config.num_attention_heads", t.num_attention_heads),
            ("text_config.num_key_value_heads", t.num_key_value_heads),
            ("text_config.head_dim", t.head_dim),
            ("text_config.num_experts", t.num_experts),
            ("text_config.top_k_experts", t.top_k_experts),
            ("text_config.sliding_window", t.sliding_window),
            ("canvas_length", self.canvas_length),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(format!("{field} must be positive"));
            }
        }
        if t.top_k_experts > t.num_experts {
            return Err(format!(
                "text_config.top_k_experts ({}) exceeds text_config.num_experts ({})",
                t.top_k_experts, t.num_experts
            ));
        }
        let types = t.layer_types();
        if types.len() != t.num_hidden_layers {
            return Err(format!(
                "text_config.layer_types has {} entries for {} layers",
                types.len(),
                t.num_hidden_layers
            ));
        }
        for lt in [LayerType::SlidingAttention, LayerType::FullAttention] {
            let kv = t.kv_heads_of(lt);
            if kv == 0 || !t.num_attention_heads.is_multiple_of(kv) {
                return Err(format!(
                    "text_config.num_attention_heads ({}) is not a multiple of the {lt:?} key/value heads ({kv})",
                    t.num_attention_heads
                ));
            }
            let hd = t.head_dim_of(lt);
            if !hd.is_multiple_of(2) {
                return Err(format!("{lt:?} head dim {hd} is odd"));
            }
            let rope = t.rope(lt);
            if !matches!(rope.rope_type.as_str(), "default" | "proportional") {
                return Err(format!(
                    "text_config.rope_parameters: unsupported rope_type {:?}",
                    rope.rope_type
                ));
            }
        }
        if t.hidden_activation != "gelu_pytorch_tanh" {
            return Err(format!(
                "text_config.hidden_activation {:?} is not supported (gelu_pytorch_tanh only)",
                t.hidden_activation
            ));
        }
        if t.attention_bias {
            return Err("text_config.attention_bias = true is not supported".into());
        }
        if let Some(q) = &self.quantization {
            if q.mode != "affine" {
                return Err(format!("quantization.mode {:?} is not supported", q.mode));
            }
        }
        Ok(())
    }

    /// The EOS set the reference engine stops on: `[tokenizer eos] + config.eos_token_id`.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_token_id
            .as_ref()
            .map(TokenIds::to_vec)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_reference() {
        let c = ModelConfig::from_json_str(r#"{"model_type": "diffusion_gemma"}"#).unwrap();
        let types = c.text.layer_types();
        assert_eq!(types.len(), 30);
        assert_eq!(types[5], LayerType::FullAttention);
        assert_eq!(types[4], LayerType::SlidingAttention);
        assert_eq!(
            c.text.rope(LayerType::FullAttention).partial_rotary_factor,
            0.25
        );
        assert_eq!(c.canvas_length, 256);
        assert_eq!(c.text.head_dim_of(LayerType::FullAttention), 512);
        assert_eq!(c.text.kv_heads_of(LayerType::FullAttention), 2);
    }

    #[test]
    fn last_layer_is_forced_full() {
        let c = ModelConfig::from_json_str(
            r#"{"model_type": "diffusion_gemma", "text_config": {"num_hidden_layers": 4}}"#,
        )
        .unwrap();
        assert_eq!(c.text.layer_types()[3], LayerType::FullAttention);
    }

    #[test]
    fn bad_fields_are_named() {
        let err = ModelConfig::from_json_str(
            r#"{"model_type": "diffusion_gemma", "text_config": {"top_k_experts": 300}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("top_k_experts"), "{err}");
        let err = ModelConfig::from_json_str(r#"{"model_type": "llama"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("model_type"), "{err}");
    }

    #[test]
    fn quantization_overrides_parse() {
        let c = ModelConfig::from_json_str(
            r#"{"model_type": "diffusion_gemma", "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                "model.decoder.layers.0.mlp.gate_proj": {"group_size": 64, "bits": 8},
                "model.encoder.vision_tower.x": false}}"#,
        )
        .unwrap();
        let q = c.quantization.unwrap();
        assert_eq!(
            q.default,
            Some(QuantEntry {
                bits: 4,
                group_size: 64
            })
        );
        assert_eq!(
            q.modules["model.decoder.layers.0.mlp.gate_proj"],
            Some(QuantEntry {
                bits: 8,
                group_size: 64
            })
        );
        assert_eq!(q.modules["model.encoder.vision_tower.x"], None);
    }
}
