//! `config.json`, parsed with the reference's defaults (mlx-optiq's `ModelConfig` / `TextConfig`).
//!
//! Unknown fields are ignored, as the reference's `_config_kwargs` does; missing fields take the
//! reference's dataclass defaults. A field of the wrong type is named by its path
//! (`text_config.hidden_size: invalid type: ...`). `ModelConfig::validate` then checks that
//! every number describes a model we can build, naming the field at fault: ranges, finiteness,
//! token ids below the vocabulary, and sizes below the `MAX_*` bounds below, checked before
//! anything is allocated from them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::CoreError;

// Upper bounds on the sizes a config may declare. They are generous (several times the real
// DiffusionGemma 26B-A4B: hidden 2816, intermediate 2112 / MoE 704, 30 layers, 16 heads with
// 8 / 2 KV heads, head dim 256 / 512, 128 experts top-8, vocab 262144, canvas 256, sliding
// window 1024) and exist so that a corrupt or hostile config.json gets a named error instead
// of an allocation abort or an overflow: every one is checked before anything is sized by it.

/// Largest `text_config.vocab_size` (8x the real 262144).
pub const MAX_VOCAB_SIZE: usize = 1 << 21;
/// Largest `text_config.hidden_size` (about 23x the real 2816).
pub const MAX_HIDDEN_SIZE: usize = 1 << 16;
/// Largest `text_config.intermediate_size` and `moe_intermediate_size` (real: 2112, 704).
pub const MAX_INTERMEDIATE_SIZE: usize = 1 << 18;
/// Largest `text_config.num_hidden_layers` (real: 30).
pub const MAX_LAYERS: usize = 1024;
/// Largest attention or key/value head count (real: 16 / 8 / 2).
pub const MAX_HEADS: usize = 1024;
/// Largest `text_config.head_dim` / `global_head_dim` (real: 256 / 512).
pub const MAX_HEAD_DIM: usize = 4096;
/// Largest `text_config.num_experts` (real: 128; `top_k_experts` is at most this too).
pub const MAX_EXPERTS: usize = 4096;
/// Largest `canvas_length` (real: 256).
pub const MAX_CANVAS_LENGTH: usize = 4096;
/// Largest `canvas_length * vocab_size`: the logits of one full canvas (2^30 f32 = 4 GiB; the
/// real model's is 2^26).
pub const MAX_CANVAS_LOGITS: usize = 1 << 30;
/// Largest `text_config.sliding_window` (real: 1024).
pub const MAX_SLIDING_WINDOW: usize = 1 << 20;
/// Largest `vision_soft_tokens_per_image` (real: 280).
pub const MAX_SOFT_TOKENS_PER_IMAGE: usize = 1 << 16;

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
    /// Vocabulary size: rows of the (tied) embedding and width of the logits.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Hidden width of each layer's dense MLP.
    pub intermediate_size: usize,
    /// Hidden width of each expert.
    pub moe_intermediate_size: usize,
    /// Layers of the one stack the encoder and decoder both run.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key/value heads of sliding-attention layers.
    pub num_key_value_heads: usize,
    /// Key/value heads of full-attention layers; `None` = `num_key_value_heads`.
    pub num_global_key_value_heads: Option<usize>,
    /// Head dimension of sliding-attention layers.
    pub head_dim: usize,
    /// Head dimension of full-attention layers (0 = `head_dim`).
    pub global_head_dim: usize,
    /// MLP activation; only `gelu_pytorch_tanh` is supported.
    pub hidden_activation: String,
    /// Epsilon of every RMS norm.
    pub rms_norm_eps: f32,
    /// Padding id; image tokens are embedded as this id.
    pub pad_token_id: u32,
    /// End-of-sequence id(s) of the text config.
    pub eos_token_id: Option<TokenIds>,
    /// Beginning-of-sequence id.
    pub bos_token_id: Option<u32>,
    /// Whether the output head is the embedding (it always is here: `lm_head.weight` is dropped, as the reference's `sanitize` does).
    pub tie_word_embeddings: bool,
    /// RoPE parameters keyed by layer type (`sliding_attention`, `full_attention`); see [`TextConfig::rope`].
    pub rope_parameters: Option<BTreeMap<String, RopeParameters>>,
    /// Biases on the attention projections; `true` is rejected.
    pub attention_bias: bool,
    /// Window of sliding-attention layers, in tokens.
    pub sliding_window: usize,
    /// Attention type of each layer; `None` = the default pattern of [`TextConfig::layer_types`].
    pub layer_types: Option<Vec<LayerType>>,
    /// Logit soft cap `cap * tanh(logits / cap)`; `None` or 0 = off.
    pub final_logit_softcapping: Option<f32>,
    /// The reference's `use_bidirectional_attention` (`"vision"`), kept as read.
    pub use_bidirectional_attention: Option<String>,
    /// Experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
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
    /// Bits per weight.
    pub bits: u32,
    /// Elements per scale/bias group.
    pub group_size: usize,
}

/// The checkpoint's `quantization` block: defaults plus per-module overrides (`false` = keep
/// the module unquantized).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizationConfig {
    /// The top-level `bits` / `group_size`, if any.
    pub default: Option<QuantEntry>,
    /// Quantization mode; only `affine` is supported.
    pub mode: String,
    /// Per-module overrides by weight path; `None` = unquantized.
    pub modules: BTreeMap<String, Option<QuantEntry>>,
}

impl QuantizationConfig {
    /// Parses config.json's `quantization` block (the text model's and the vision tower's
    /// linears alike); the error names the field at fault (`quantization.bits: ...`).
    pub fn from_json(value: &serde_json::Value) -> Result<Self, String> {
        let map = value.as_object().ok_or("quantization: not an object")?;
        // Both numbers are checked against what MLX affine supports (`dg_quant::QuantSpec`),
        // with checked conversions: 2^32 + 4 bits is an error, not 4.
        let bits_of = |v: &serde_json::Value, field: &str| -> Result<u32, String> {
            let bits = v
                .as_u64()
                .ok_or_else(|| format!("{field}: {v} is not a non-negative integer"))?;
            u32::try_from(bits)
                .ok()
                .filter(|&b| dg_quant::QuantSpec::new(b, 64).is_ok())
                .ok_or_else(|| {
                    format!("{field}: {bits} bits is not supported (MLX affine: 2, 3, 4, 5, 6, 8)")
                })
        };
        let group_of = |v: &serde_json::Value, field: &str| -> Result<usize, String> {
            let group = v
                .as_u64()
                .ok_or_else(|| format!("{field}: {v} is not a non-negative integer"))?;
            usize::try_from(group)
                .ok()
                .filter(|&g| dg_quant::QuantSpec::new(4, g).is_ok())
                .ok_or_else(|| {
                    format!(
                        "{field}: group size {group} is not supported (MLX affine: 32, 64, 128)"
                    )
                })
        };
        let mut out = QuantizationConfig {
            mode: "affine".into(),
            ..Default::default()
        };
        let bits = map
            .get("bits")
            .map(|v| bits_of(v, "quantization.bits"))
            .transpose()?;
        let group = map
            .get("group_size")
            .map(|v| group_of(v, "quantization.group_size"))
            .transpose()?;
        if let Some(bits) = bits {
            out.default = Some(QuantEntry {
                bits,
                group_size: group.unwrap_or(64),
            });
        }
        if let Some(mode) = map.get("mode") {
            out.mode = mode
                .as_str()
                .ok_or("quantization.mode: not a string")?
                .into();
            if out.mode != "affine" {
                return Err(format!("quantization.mode {:?} is not supported", out.mode));
            }
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
                        .map(|b| bits_of(b, &format!("quantization.{key}.bits")))
                        .transpose()?;
                    let group = m
                        .get("group_size")
                        .map(|g| group_of(g, &format!("quantization.{key}.group_size")))
                        .transpose()?;
                    let default = out.default;
                    Some(QuantEntry {
                        bits: bits.or(default.map(|d| d.bits)).unwrap_or(4),
                        group_size: group.or(default.map(|d| d.group_size)).unwrap_or(64),
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
    /// `model_type` (`diffusion_gemma`).
    pub model_type: String,
    /// The text backbone (`text_config`).
    pub text: TextConfig,
    /// The vision tower's raw config (parsed by dg-vision), if the checkpoint has one.
    pub vision_config: Option<serde_json::Value>,
    /// Begin-of-image token id.
    pub boi_token_id: Option<u32>,
    /// End-of-image token id.
    pub eoi_token_id: Option<u32>,
    /// Image placeholder token id (one per soft token of an image).
    pub image_token_id: Option<u32>,
    /// Tokens per denoising block (the decoder's canvas).
    pub canvas_length: usize,
    /// Top-level end-of-sequence id(s); see [`ModelConfig::eos_ids`].
    pub eos_token_id: Option<TokenIds>,
    /// The `quantization` block; `None` = unquantized weights.
    pub quantization: Option<QuantizationConfig>,
    /// `generation_config` embedded in config.json (the reference honours only this one).
    pub generation_config: Option<serde_json::Value>,
    /// Image tokens per image (`vision_soft_tokens_per_image`), if set.
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
        let text = dg_files::read_text(path, dg_files::CONFIG_MAX_BYTES)?;
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
        // Syntax errors carry a line and column; type errors (read from the parsed value) carry
        // the path of the field instead: `text_config.hidden_size: invalid type: ...`.
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let raw: RawConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            bad(if path == "." {
                e.inner().to_string()
            } else {
                format!("{path}: {}", e.inner())
            })
        })?;
        let quantization = raw
            .quantization
            .as_ref()
            .map(QuantizationConfig::from_json)
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

    /// Checks every number and its relations, naming the field at fault. Sizes are checked
    /// against the `MAX_*` bounds before anything is allocated from them (`layer_types` builds
    /// a list of `num_hidden_layers` entries). Whether the layer count matches the tensors
    /// present is checked where the model is built.
    fn validate(&self) -> Result<(), String> {
        let t = &self.text;
        if self.model_type != "diffusion_gemma" {
            return Err(format!(
                "model_type is {:?}, expected \"diffusion_gemma\"",
                self.model_type
            ));
        }
        let sizes = [
            ("text_config.vocab_size", t.vocab_size, MAX_VOCAB_SIZE),
            ("text_config.hidden_size", t.hidden_size, MAX_HIDDEN_SIZE),
            (
                "text_config.intermediate_size",
                t.intermediate_size,
                MAX_INTERMEDIATE_SIZE,
            ),
            (
                "text_config.moe_intermediate_size",
                t.moe_intermediate_size,
                MAX_INTERMEDIATE_SIZE,
            ),
            (
                "text_config.num_hidden_layers",
                t.num_hidden_layers,
                MAX_LAYERS,
            ),
            (
                "text_config.num_attention_heads",
                t.num_attention_heads,
                MAX_HEADS,
            ),
            (
                "text_config.num_key_value_heads",
                t.num_key_value_heads,
                MAX_HEADS,
            ),
            ("text_config.head_dim", t.head_dim, MAX_HEAD_DIM),
            ("text_config.num_experts", t.num_experts, MAX_EXPERTS),
            ("text_config.top_k_experts", t.top_k_experts, MAX_EXPERTS),
            (
                "text_config.sliding_window",
                t.sliding_window,
                MAX_SLIDING_WINDOW,
            ),
            ("canvas_length", self.canvas_length, MAX_CANVAS_LENGTH),
        ];
        for (field, value, max) in sizes {
            in_range(field, value, 1, max)?;
        }
        if let Some(n) = t.num_global_key_value_heads {
            in_range("text_config.num_global_key_value_heads", n, 1, MAX_HEADS)?;
        }
        // 0 means "the sliding head dim".
        in_range(
            "text_config.global_head_dim",
            t.global_head_dim,
            0,
            MAX_HEAD_DIM,
        )?;
        if let Some(n) = self.vision_soft_tokens_per_image {
            in_range(
                "vision_soft_tokens_per_image",
                n,
                1,
                MAX_SOFT_TOKENS_PER_IMAGE,
            )?;
        }
        // Both bounded above, so the product cannot overflow.
        if self.canvas_length * t.vocab_size > MAX_CANVAS_LOGITS {
            return Err(format!(
                "canvas_length: {} canvas positions times text_config.vocab_size {} is over \
                 {MAX_CANVAS_LOGITS} logits per canvas",
                self.canvas_length, t.vocab_size
            ));
        }
        if t.top_k_experts > t.num_experts {
            return Err(format!(
                "text_config.top_k_experts ({}) exceeds text_config.num_experts ({})",
                t.top_k_experts, t.num_experts
            ));
        }

        // Token ids index the embedding table.
        let vocab = t.vocab_size;
        let mut ids = vec![("text_config.pad_token_id", Some(t.pad_token_id))];
        ids.push(("text_config.bos_token_id", t.bos_token_id));
        ids.push(("boi_token_id", self.boi_token_id));
        ids.push(("eoi_token_id", self.eoi_token_id));
        ids.push(("image_token_id", self.image_token_id));
        let eos = [
            ("text_config.eos_token_id", &t.eos_token_id),
            ("eos_token_id", &self.eos_token_id),
        ];
        for (field, list) in eos {
            for id in list.iter().flat_map(TokenIds::to_vec) {
                ids.push((field, Some(id)));
            }
        }
        for (field, id) in ids {
            if let Some(id) = id {
                if usize::try_from(id).map_or(true, |i| i >= vocab) {
                    return Err(format!(
                        "{field}: token id {id} is outside text_config.vocab_size {vocab}"
                    ));
                }
            }
        }

        if !(t.rms_norm_eps.is_finite() && (0.0..1.0).contains(&t.rms_norm_eps)) {
            return Err(format!(
                "text_config.rms_norm_eps: {} is not a finite value in [0, 1)",
                t.rms_norm_eps
            ));
        }
        if let Some(cap) = t.final_logit_softcapping {
            // 0 turns the soft cap off, as an absent value does.
            if !(cap.is_finite() && cap >= 0.0) {
                return Err(format!(
                    "text_config.final_logit_softcapping: {cap} is not a finite value >= 0"
                ));
            }
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
            validate_rope(lt, &t.rope(lt))?;
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

/// `value` in `min..=max`, or an error naming `field`.
fn in_range(field: &str, value: usize, min: usize, max: usize) -> Result<(), String> {
    if value < min {
        return Err(if min == 1 {
            format!("{field} must be positive")
        } else {
            format!("{field}: {value} is below {min}")
        });
    }
    if value > max {
        return Err(format!("{field}: {value} is over the limit of {max}"));
    }
    Ok(())
}

/// The RoPE numbers of one layer type: a positive base and scale that stay finite and positive
/// in f32 (where [`crate::model`] uses them) and a rotated fraction in `[0, 1]` (more would rotate
/// past the half of the head that is rotated).
fn validate_rope(lt: LayerType, rope: &RopeParameters) -> Result<(), String> {
    let key = match lt {
        LayerType::SlidingAttention => "sliding_attention",
        LayerType::FullAttention => "full_attention",
    };
    let field = |name: &str| format!("text_config.rope_parameters.{key}.{name}");
    if !matches!(rope.rope_type.as_str(), "default" | "proportional") {
        return Err(format!(
            "{}: unsupported rope_type {:?}",
            field("rope_type"),
            rope.rope_type
        ));
    }
    let positive_f32 = |x: f64| x > 0.0 && (x as f32).is_finite() && (x as f32) > 0.0;
    if !positive_f32(rope.rope_theta) {
        return Err(format!(
            "{}: {} is not a finite value > 0",
            field("rope_theta"),
            rope.rope_theta
        ));
    }
    if !positive_f32(rope.factor) {
        return Err(format!(
            "{}: {} is not a finite value > 0",
            field("factor"),
            rope.factor
        ));
    }
    if !(0.0..=1.0).contains(&rope.partial_rotary_factor) {
        return Err(format!(
            "{}: {} is not in [0, 1]",
            field("partial_rotary_factor"),
            rope.partial_rotary_factor
        ));
    }
    Ok(())
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

    /// The committed tiny fixture's config with `edit` applied.
    fn tiny_with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<ModelConfig, CoreError> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/tiny/config.json"
        );
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        edit(&mut v);
        ModelConfig::from_json_str(&v.to_string())
    }

    /// Asserts a typed config error whose message contains every one of `needles`.
    fn refused(result: Result<ModelConfig, CoreError>, needles: &[&str]) {
        match result {
            Err(e @ CoreError::Config { .. }) => {
                let msg = e.to_string();
                for n in needles {
                    assert!(msg.contains(n), "{n:?} not in {msg:?}");
                }
            }
            Err(e) => panic!("not a config error: {e}"),
            Ok(_) => panic!("accepted; expected an error naming {needles:?}"),
        }
    }

    #[test]
    fn the_tiny_fixture_validates() {
        tiny_with(|_| {}).unwrap();
    }

    #[test]
    fn huge_layer_counts_are_refused_before_allocation() {
        for n in [100_000_000_u64, 1_000_000_000_000, u64::MAX] {
            let r = tiny_with(|v| {
                v["text_config"]["num_hidden_layers"] = n.into();
                v["text_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("layer_types");
            });
            refused(r, &["text_config.num_hidden_layers", "limit"]);
        }
    }

    #[test]
    fn sizes_over_their_bounds_are_named() {
        let cases: [(&str, u64); 9] = [
            ("vocab_size", 1 << 40),
            ("hidden_size", 1 << 40),
            ("intermediate_size", 1 << 40),
            ("moe_intermediate_size", 1 << 40),
            ("num_attention_heads", 1 << 40),
            ("head_dim", 1 << 40),
            ("num_experts", 1 << 40),
            ("sliding_window", 1 << 40),
            ("global_head_dim", 1 << 40),
        ];
        for (field, n) in cases {
            refused(
                tiny_with(|v| v["text_config"][field] = n.into()),
                &[&format!("text_config.{field}")],
            );
        }
        refused(
            tiny_with(|v| v["text_config"]["num_global_key_value_heads"] = (1u64 << 40).into()),
            &["text_config.num_global_key_value_heads"],
        );
        refused(
            tiny_with(|v| v["vision_soft_tokens_per_image"] = (1u64 << 40).into()),
            &["vision_soft_tokens_per_image"],
        );
    }

    #[test]
    fn canvas_length_is_bounded_alone_and_against_the_vocab() {
        refused(
            tiny_with(|v| v["canvas_length"] = 1_000_000_000.into()),
            &["canvas_length", "limit"],
        );
        refused(
            tiny_with(|v| v["canvas_length"] = 0.into()),
            &["canvas_length"],
        );
        // Each fine alone, too many logits together.
        refused(
            tiny_with(|v| {
                v["canvas_length"] = MAX_CANVAS_LENGTH.into();
                v["text_config"]["vocab_size"] = MAX_VOCAB_SIZE.into();
            }),
            &["canvas_length", "vocab_size"],
        );
    }

    #[test]
    fn rope_numbers_are_checked() {
        refused(
            tiny_with(|v| {
                v["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] =
                    2.0.into()
            }),
            &["text_config.rope_parameters.full_attention.partial_rotary_factor"],
        );
        for theta in [0.0, -10.0, 1e300] {
            refused(
                tiny_with(|v| {
                    v["text_config"]["rope_parameters"]["sliding_attention"]["rope_theta"] =
                        theta.into()
                }),
                &["text_config.rope_parameters.sliding_attention.rope_theta"],
            );
        }
        refused(
            tiny_with(|v| {
                v["text_config"]["rope_parameters"]["full_attention"]["factor"] = 0.0.into()
            }),
            &["text_config.rope_parameters.full_attention.factor"],
        );
    }

    #[test]
    fn norm_eps_and_softcap_are_checked() {
        for eps in [-1.0, 1.0, 1e300] {
            refused(
                tiny_with(|v| v["text_config"]["rms_norm_eps"] = eps.into()),
                &["text_config.rms_norm_eps"],
            );
        }
        refused(
            tiny_with(|v| v["text_config"]["final_logit_softcapping"] = (-30.0).into()),
            &["text_config.final_logit_softcapping"],
        );
    }

    #[test]
    fn token_ids_must_be_in_the_vocab() {
        for field in ["boi_token_id", "eoi_token_id", "image_token_id"] {
            refused(tiny_with(|v| v[field] = 512.into()), &[field, "vocab_size"]);
        }
        refused(
            tiny_with(|v| v["eos_token_id"] = serde_json::json!([1, 600])),
            &["eos_token_id", "600"],
        );
        for field in ["pad_token_id", "bos_token_id", "eos_token_id"] {
            refused(
                tiny_with(|v| v["text_config"][field] = 9999.into()),
                &[&format!("text_config.{field}")],
            );
        }
        // Over u32: a typed error naming the field, not a truncation.
        refused(
            tiny_with(|v| v["boi_token_id"] = ((1u64 << 32) + 5).into()),
            &["boi_token_id"],
        );
    }

    #[test]
    fn quantization_numbers_are_not_truncated() {
        refused(
            tiny_with(|v| v["quantization"]["bits"] = ((1u64 << 32) + 4).into()),
            &["quantization.bits", "4294967300"],
        );
        refused(
            tiny_with(|v| v["quantization"]["group_size"] = 48.into()),
            &["quantization.group_size"],
        );
        let module = "model.decoder.layers.0.mlp.gate_proj";
        refused(
            tiny_with(|v| v["quantization"][module]["bits"] = 7.into()),
            &[&format!("quantization.{module}.bits")],
        );
    }

    #[test]
    fn type_errors_name_the_field_not_a_column() {
        let r = tiny_with(|v| v["text_config"]["hidden_size"] = "big".into());
        refused(
            r,
            &["config.json: text_config.hidden_size: invalid type: string \"big\", expected usize"],
        );
        let err = tiny_with(|v| v["text_config"]["hidden_size"] = "big".into())
            .unwrap_err()
            .to_string();
        assert!(!err.contains("column"), "{err}");
        refused(
            tiny_with(|v| v["canvas_length"] = (-1).into()),
            &["canvas_length: invalid value"],
        );
        // Syntax errors keep their position.
        refused(
            ModelConfig::from_json_str("{ not json"),
            &["invalid JSON", "line 1"],
        );
    }
}
