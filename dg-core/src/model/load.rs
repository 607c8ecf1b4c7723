//! Building a [`TextModel`] from a checkpoint directory.

use std::path::Path;

use super::attention::Attention;
use super::layer::Layer;
use super::linear::{ExpertLinear, Linear};
use super::mlp::Mlp;
use super::moe::{Experts, Router};
use super::rope::Rope;
use super::self_conditioning::SelfConditioningBlock;
use super::TextModel;
use crate::checkpoint::{Checkpoint, SanitizeOptions};
use crate::config::{LayerType, ModelConfig};
use crate::error::CoreError;

/// Progress while loading: called with (layers done, layers total); return `false` to cancel.
pub type LoadProgress<'a> = &'a mut dyn FnMut(usize, usize) -> bool;

impl TextModel {
    /// Loads `config.json` and the weights of the checkpoint in `dir`.
    pub fn load(dir: &Path) -> Result<Self, CoreError> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck = Checkpoint::open(dir, sanitize_options(&config))?;
        Self::from_checkpoint(&ck, config, &mut |_, _| true)
    }

    /// Builds the model from an opened checkpoint, reporting progress per layer.
    pub fn from_checkpoint(
        ck: &Checkpoint,
        config: ModelConfig,
        progress: LoadProgress<'_>,
    ) -> Result<Self, CoreError> {
        let t = &config.text;
        let q = config.quantization.as_ref();
        let h = t.hidden_size;
        let eps = t.rms_norm_eps;
        let vec = |name: &str, len: usize| ck.f32(name, &[len]);
        let scalar = |name: &str| -> Result<f32, CoreError> { Ok(ck.f32(name, &[1])?[0]) };
        let linear = |path: &str, out: usize, inp: usize| Linear::load(ck, q, path, out, inp);

        let embed_tokens = linear("model.decoder.embed_tokens", t.vocab_size, h)?;
        let layer_types = t.layer_types();
        let mut layers = Vec::with_capacity(t.num_hidden_layers);
        for (i, &lt) in layer_types.iter().enumerate() {
            if !progress(i, t.num_hidden_layers) {
                return Err(CoreError::Cancelled);
            }
            let p = format!("model.decoder.layers.{i}");
            let hd = t.head_dim_of(lt);
            let kv = t.kv_heads_of(lt);
            let heads = t.num_attention_heads;
            let attention = Attention {
                heads,
                kv_heads: kv,
                head_dim: hd,
                q_proj: linear(&format!("{p}.self_attn.q_proj"), heads * hd, h)?,
                k_proj: linear(&format!("{p}.self_attn.k_proj"), kv * hd, h)?,
                v_proj: match lt {
                    LayerType::SlidingAttention => {
                        Some(linear(&format!("{p}.self_attn.v_proj"), kv * hd, h)?)
                    }
                    LayerType::FullAttention => None,
                },
                o_proj: linear(&format!("{p}.self_attn.o_proj"), h, heads * hd)?,
                q_norm: vec(&format!("{p}.self_attn.q_norm.weight"), hd)?,
                k_norm: vec(&format!("{p}.self_attn.k_norm.weight"), hd)?,
                eps,
                rope: Rope::new(hd, &t.rope(lt)),
            };
            let norm = |name: &str| vec(&format!("{p}.{name}.weight"), h);
            layers.push(Layer {
                attention,
                mlp: Mlp {
                    gate_proj: linear(&format!("{p}.mlp.gate_proj"), t.intermediate_size, h)?,
                    up_proj: linear(&format!("{p}.mlp.up_proj"), t.intermediate_size, h)?,
                    down_proj: linear(&format!("{p}.mlp.down_proj"), h, t.intermediate_size)?,
                },
                router: Router {
                    proj: linear(&format!("{p}.router.proj"), t.num_experts, h)?,
                    scale: vec(&format!("{p}.router.scale"), h)?,
                    per_expert_scale: vec(&format!("{p}.router.per_expert_scale"), t.num_experts)?,
                    top_k: t.top_k_experts,
                    eps,
                },
                experts: Experts {
                    gate_up_proj: ExpertLinear::load(
                        ck,
                        q,
                        &format!("{p}.experts.gate_up_proj"),
                        t.num_experts,
                        2 * t.moe_intermediate_size,
                        h,
                    )?,
                    down_proj: ExpertLinear::load(
                        ck,
                        q,
                        &format!("{p}.experts.down_proj"),
                        t.num_experts,
                        h,
                        t.moe_intermediate_size,
                    )?,
                    moe_dim: t.moe_intermediate_size,
                },
                input_layernorm: norm("input_layernorm")?,
                post_attention_layernorm: norm("post_attention_layernorm")?,
                pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
                post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
                post_feedforward_layernorm_1: norm("post_feedforward_layernorm_1")?,
                pre_feedforward_layernorm_2: norm("pre_feedforward_layernorm_2")?,
                post_feedforward_layernorm_2: norm("post_feedforward_layernorm_2")?,
                decoder_scalar: scalar(&format!("{p}.layer_scalar"))?,
                encoder_scalar: scalar(&format!(
                    "model.encoder.language_model.layers.{i}.layer_scalar"
                ))?,
                eps,
            });
        }
        if !progress(t.num_hidden_layers, t.num_hidden_layers) {
            return Err(CoreError::Cancelled);
        }
        let sc = "model.decoder.self_conditioning";
        let self_conditioning = SelfConditioningBlock {
            pre_norm: vec(&format!("{sc}.pre_norm.weight"), h)?,
            mlp: Mlp {
                gate_proj: linear(&format!("{sc}.gate_proj"), t.intermediate_size, h)?,
                up_proj: linear(&format!("{sc}.up_proj"), t.intermediate_size, h)?,
                down_proj: linear(&format!("{sc}.down_proj"), h, t.intermediate_size)?,
            },
            eps,
        };
        Ok(TextModel {
            embed_scale: (h as f64).sqrt() as f32,
            norm: vec("model.decoder.norm.weight", h)?,
            embed_tokens,
            layers,
            layer_types,
            self_conditioning,
            config,
        })
    }
}

/// The sanitize options a config implies.
pub fn sanitize_options(config: &ModelConfig) -> SanitizeOptions {
    let vision = config.vision_config.as_ref();
    SanitizeOptions {
        has_vision_tower: vision.is_some(),
        use_clipped_linears: vision
            .and_then(|v| v.get("use_clipped_linears"))
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
    }
}
