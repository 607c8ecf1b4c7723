//! The Gemma 4 vision tower (`gemma4/vision.py::VisionModel`) for one image:
//! patch embedding + position embeddings, `num_hidden_layers` bidirectional transformer blocks
//! with 2-D RoPE, average pooling by grid position, `* sqrt(hidden)`, and standardization.
//!
//! The reference pads every image to `max_patches` (2520) tokens and masks the padding with an
//! additive -1e4. In float32 `exp(-1e4 - max)` is exactly 0, so the padding adds nothing to a
//! real patch's attention, and the pooler zeroes padded rows before averaging: running the
//! blocks on the real patches alone gives the same numbers and saves the padding's cost.

use rayon::prelude::*;

use dg_core::checkpoint::{Checkpoint, FloatView};
use dg_core::config::QuantizationConfig;
use dg_core::model::{Clip, Linear, PlainWeights, Storage};
use dg_quant::ops;

use crate::config::VisionConfig;
use crate::error::{Result, VisionError};
use crate::patches::{patch_positions, patch_value_table, patchify};
use crate::rope2d::Rope2d;

const PREFIX: &str = "model.encoder.vision_tower";

/// `q_norm` / `k_norm` / `v_norm` use `VisionRMSNorm`'s default eps, not the config's.
const HEAD_NORM_EPS: f32 = 1e-6;

struct Block {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    input_layernorm: Vec<f32>,
    post_attention_layernorm: Vec<f32>,
    pre_feedforward_layernorm: Vec<f32>,
    post_feedforward_layernorm: Vec<f32>,
}

/// The tower's output for one image.
#[derive(Clone, Debug, PartialEq)]
pub struct TowerOutput {
    /// Soft tokens: `(H / patch / pooling) * (W / patch / pooling)`.
    pub tokens: usize,
    /// Vision hidden size.
    pub hidden: usize,
    /// `[tokens, hidden]`, row-major.
    pub data: Vec<f32>,
}

pub(crate) struct VisionTower {
    pub config: VisionConfig,
    input_proj: Linear,
    position_table: FloatView,
    blocks: Vec<Block>,
    standardize: Option<(Vec<f32>, Vec<f32>)>,
}

fn vec_f32(ck: &Checkpoint, name: &str, len: usize) -> Result<Vec<f32>> {
    Ok(ck.f32(name, &[len])?)
}

/// Loads the linear at module path `module`: for a `ClippableLinear` (`clippable`), the matrix
/// lives at `<module>.linear`, and its bounds beside it when the config clips. Plain weights
/// stay mapped (see [`PlainWeights::Mapped`]).
pub(crate) fn load_linear(
    ck: &Checkpoint,
    quant: Option<&QuantizationConfig>,
    module: &str,
    clippable: bool,
    clipped: bool,
    in_dim: usize,
    out_dim: usize,
) -> Result<Linear> {
    let path = match clippable {
        true => format!("{module}.linear"),
        false => module.to_string(),
    };
    let linear = Linear::load_with(ck, quant, &path, out_dim, in_dim, PlainWeights::Mapped)?;
    Ok(match clippable && clipped {
        true => linear.with_clip(Clip::load(ck, module)?),
        false => linear,
    })
}

impl VisionTower {
    pub fn load(
        ck: &Checkpoint,
        quant: Option<&QuantizationConfig>,
        config: &VisionConfig,
    ) -> Result<Self> {
        let c = config;
        let h = c.hidden_size;
        let clipped = c.use_clipped_linears;
        let patch_dim = 3 * c.patch_size * c.patch_size;
        let input_proj = load_linear(
            ck,
            quant,
            &format!("{PREFIX}.patch_embedder.input_proj"),
            false,
            false,
            patch_dim,
            h,
        )?;
        let position_table = ck.float_view(
            &format!("{PREFIX}.patch_embedder.position_embedding_table"),
            &[2, c.position_embedding_size, h],
        )?;
        let q_dim = c.num_attention_heads * c.head_dim;
        let kv_dim = c.num_key_value_heads * c.head_dim;
        let mut blocks = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("{PREFIX}.encoder.layers.{i}");
            let lin = |name: &str, i_dim: usize, o_dim: usize| {
                load_linear(
                    ck,
                    quant,
                    &format!("{p}.{name}"),
                    true,
                    clipped,
                    i_dim,
                    o_dim,
                )
            };
            blocks.push(Block {
                q_proj: lin("self_attn.q_proj", h, q_dim)?,
                k_proj: lin("self_attn.k_proj", h, kv_dim)?,
                v_proj: lin("self_attn.v_proj", h, kv_dim)?,
                o_proj: lin("self_attn.o_proj", q_dim, h)?,
                q_norm: vec_f32(ck, &format!("{p}.self_attn.q_norm.weight"), c.head_dim)?,
                k_norm: vec_f32(ck, &format!("{p}.self_attn.k_norm.weight"), c.head_dim)?,
                gate_proj: lin("mlp.gate_proj", h, c.intermediate_size)?,
                up_proj: lin("mlp.up_proj", h, c.intermediate_size)?,
                down_proj: lin("mlp.down_proj", c.intermediate_size, h)?,
                input_layernorm: vec_f32(ck, &format!("{p}.input_layernorm.weight"), h)?,
                post_attention_layernorm: vec_f32(
                    ck,
                    &format!("{p}.post_attention_layernorm.weight"),
                    h,
                )?,
                pre_feedforward_layernorm: vec_f32(
                    ck,
                    &format!("{p}.pre_feedforward_layernorm.weight"),
                    h,
                )?,
                post_feedforward_layernorm: vec_f32(
                    ck,
                    &format!("{p}.post_feedforward_layernorm.weight"),
                    h,
                )?,
            });
        }
        let standardize = if c.standardize {
            Some((
                vec_f32(ck, &format!("{PREFIX}.std_bias"), h)?,
                vec_f32(ck, &format!("{PREFIX}.std_scale"), h)?,
            ))
        } else {
            None
        };
        Ok(Self {
            config: c.clone(),
            input_proj,
            position_table,
            blocks,
            standardize,
        })
    }

    /// Whether `input_proj` is quantized (the uint32-cast input quirk applies).
    pub fn quantized_input_proj(&self) -> bool {
        matches!(self.input_proj.storage(), Storage::Quantized(_))
    }

    /// Patch projection plus position embeddings for the real patches, `[n, hidden]`.
    pub fn embed_patches(&self, rgb: &[u8], height: usize, width: usize) -> Result<Vec<f32>> {
        let c = &self.config;
        let (p, hd) = (c.patch_size, c.hidden_size);
        let (ph, pw) = (height / p, width / p);
        let n = ph * pw;
        let table = patch_value_table(self.quantized_input_proj());
        let patches = patchify(rgb, height, width, p, &table);
        let mut h = self.input_proj.forward(&patches, n)?;
        // one_hot(position) @ table for x and y, summed: a position past the table's end has an
        // all-zero one-hot and contributes nothing.
        let table_f32 = self.position_table.to_f32();
        let size = c.position_embedding_size;
        let row = |dim: usize, pos: usize| -> Option<&[f32]> {
            (pos < size).then(|| &table_f32[(dim * size + pos) * hd..(dim * size + pos + 1) * hd])
        };
        for (i, (x, y)) in patch_positions(ph, pw).into_iter().enumerate() {
            let dst = &mut h[i * hd..(i + 1) * hd];
            let (ex, ey) = (row(0, x), row(1, y));
            for j in 0..hd {
                let pe = ex.map_or(0.0, |r| r[j]) + ey.map_or(0.0, |r| r[j]);
                dst[j] += pe;
            }
        }
        Ok(h)
    }

    fn attention(
        &self,
        b: &Block,
        x: &[f32],
        n: usize,
        positions: &[(usize, usize)],
        rope: &Rope2d,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let (hd, nh, nkv) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let mut q = b.q_proj.forward(x, n)?;
        let mut k = b.k_proj.forward(x, n)?;
        let mut v = b.v_proj.forward(x, n)?;
        ops::rms_norm_rows_inplace_par(&mut q, hd, Some(&b.q_norm), HEAD_NORM_EPS);
        ops::rms_norm_rows_inplace_par(&mut k, hd, Some(&b.k_norm), HEAD_NORM_EPS);
        ops::rms_norm_rows_inplace_par(&mut v, hd, None, HEAD_NORM_EPS);
        let rotate = |t: &mut [f32], heads: usize| {
            t.par_chunks_mut(heads * hd)
                .zip(positions.par_iter())
                .for_each(|(tok, &(px, py))| {
                    for head in tok.chunks_exact_mut(hd) {
                        rope.apply(head, px, py);
                    }
                });
        };
        rotate(&mut q, nh);
        rotate(&mut k, nkv);
        // Head-major copies [heads, n, hd] for the per-head products.
        let head_major = |t: &[f32], heads: usize| -> Vec<f32> {
            let mut out = vec![0f32; t.len()];
            out.par_chunks_mut((n * hd).max(1))
                .enumerate()
                .for_each(|(h, dst)| {
                    for (tok, d) in dst.chunks_exact_mut(hd).enumerate() {
                        d.copy_from_slice(&t[(tok * heads + h) * hd..(tok * heads + h + 1) * hd]);
                    }
                });
            out
        };
        let (qh, kh, vh) = (head_major(&q, nh), head_major(&k, nkv), head_major(&v, nkv));
        let mut out = vec![0f32; n * nh * hd];
        // Scale 1.0: the q/k norms replace 1/sqrt(head_dim).
        dg_quant::attention_bidirectional(&qh, &kh, &vh, (nh, nkv, hd), n, n, &mut out).map_err(
            |source| VisionError::Quant {
                name: "vision attention".into(),
                source,
            },
        )?;
        Ok(b.o_proj.forward(&out, n)?)
    }

    fn mlp(&self, b: &Block, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut gate = b.gate_proj.forward(x, n)?;
        let up = b.up_proj.forward(x, n)?;
        dg_quant::ops::geglu_inplace_par(&mut gate, &up);
        Ok(b.down_proj.forward(&gate, n)?)
    }

    /// Runs the tower on one resized image (`height x width x 3` RGB; both sides multiples of
    /// `patch * pooling`).
    pub fn forward(&self, rgb: &[u8], height: usize, width: usize) -> Result<TowerOutput> {
        let c = &self.config;
        let (p, k, hd) = (c.patch_size, c.pooling_kernel_size, c.hidden_size);
        let shape_err = |message: String| VisionError::ImageShape {
            height,
            width,
            message,
        };
        if rgb.len() != height * width * 3 {
            return Err(shape_err(format!("pixel buffer holds {} bytes", rgb.len())));
        }
        if height == 0
            || width == 0
            || !height.is_multiple_of(p * k)
            || !width.is_multiple_of(p * k)
        {
            return Err(shape_err(format!(
                "sides must be positive multiples of patch_size * pooling_kernel_size = {}",
                p * k
            )));
        }
        let (ph, pw) = (height / p, width / p);
        let n = ph * pw;
        if n > c.max_patches() {
            return Err(shape_err(format!(
                "{n} patches, the tower takes at most {}",
                c.max_patches()
            )));
        }
        let positions = patch_positions(ph, pw);
        let rope = Rope2d::new(c.head_dim, c.rope_parameters.rope_theta, ph.max(pw));
        let eps = c.rms_norm_eps;

        let mut h = self.embed_patches(rgb, height, width)?;
        let mut normed = vec![0f32; h.len()];
        for b in &self.blocks {
            ops::rms_norm_rows_par(&h, hd, Some(&b.input_layernorm), eps, &mut normed);
            let mut attn = self.attention(b, &normed, n, &positions, &rope)?;
            ops::rms_norm_rows_inplace_par(&mut attn, hd, Some(&b.post_attention_layernorm), eps);
            ops::elementwise_par(&mut h, &attn, |a, b| *a += b);

            ops::rms_norm_rows_par(&h, hd, Some(&b.pre_feedforward_layernorm), eps, &mut normed);
            let mut ffw = self.mlp(b, &normed, n)?;
            ops::rms_norm_rows_inplace_par(&mut ffw, hd, Some(&b.post_feedforward_layernorm), eps);
            ops::elementwise_par(&mut h, &ffw, |a, b| *a += b);
        }

        // VisionPooler._avg_pool_by_positions: bucket (x / k) + (pW / k) * (y / k), weight
        // f32(1) / f32(k^2) per patch, then * sqrt(hidden).
        let (bw, bh) = (pw / k, ph / k);
        let tokens = bw * bh;
        let w = 1.0f32 / (k * k) as f32;
        let mut pooled = vec![0f32; tokens * hd];
        for (i, &(x, y)) in positions.iter().enumerate() {
            let bucket = x / k + bw * (y / k);
            let dst = &mut pooled[bucket * hd..(bucket + 1) * hd];
            for (d, s) in dst.iter_mut().zip(&h[i * hd..(i + 1) * hd]) {
                *d += w * s;
            }
        }
        let root = (hd as f64).sqrt() as f32;
        for v in &mut pooled {
            *v *= root;
        }
        if let Some((bias, scale)) = &self.standardize {
            for row in pooled.chunks_exact_mut(hd) {
                for ((v, b), s) in row.iter_mut().zip(bias).zip(scale) {
                    *v = (*v - b) * s;
                }
            }
        }
        Ok(TowerOutput {
            tokens,
            hidden: hd,
            data: pooled,
        })
    }
}
