//! A projection as the checkpoint stores it: MLX-affine quantized (`weight` u32 + `scales` +
//! `biases`) or plain (bf16 / f16 / f32), optionally wrapped in Gemma 4's `ClippableLinear`
//! (input and output clamped to scalar bounds stored in the checkpoint).

use half::bf16;

use crate::config::QuantConfig;
use crate::error::{Result, VisionError};
use crate::weights::{TensorRef, TensorStore};

/// Clamp bounds of a clipped linear (`input_min`, `input_max`, `output_min`, `output_max`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Clip {
    input: (f32, f32),
    output: (f32, f32),
}

enum Weight {
    Quantized {
        packed: Vec<u32>,
        scales: Vec<bf16>,
        biases: Vec<bf16>,
        spec: dg_quant::QuantSpec,
    },
    /// Kept memory-mapped; widened to f32 per call (a call covers every patch of an image, so
    /// the conversion is amortized, and the f32 copy never lives beyond the call).
    Plain(TensorRef),
}

/// `x @ W^T` for `W [out, in]`.
pub(crate) struct Linear {
    name: String,
    pub out_dim: usize,
    pub in_dim: usize,
    weight: Weight,
    clip: Option<Clip>,
}

/// `mx.clip(x, lo, hi)`: `minimum(maximum(x, lo), hi)`.
#[inline]
fn clamp(v: f32, (lo, hi): (f32, f32)) -> f32 {
    v.max(lo).min(hi)
}

fn quant_err(name: &str, e: dg_quant::QuantError) -> VisionError {
    VisionError::Quant {
        name: name.to_string(),
        message: e.to_string(),
    }
}

impl Linear {
    /// Loads the linear at module path `module` (for a `ClippableLinear`, the wrapper's path:
    /// the matrix lives at `<module>.linear`). It is quantized when `<path>.scales` exists,
    /// with `quant`'s parameters for that path (the reference loader's rule).
    pub fn load(
        store: &TensorStore,
        quant: &QuantConfig,
        module: &str,
        clippable: bool,
        clipped: bool,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<Self> {
        let path = if clippable {
            format!("{module}.linear")
        } else {
            module.to_string()
        };
        let weight_name = format!("{path}.weight");
        let w = store.get(&weight_name)?;
        let weight = match store.get_opt(&format!("{path}.scales"))? {
            Some(scales) => {
                let params = quant.params_for(&path).ok_or_else(|| VisionError::Quant {
                    name: weight_name.clone(),
                    message: "scales present but config.json has no `quantization`".into(),
                })?;
                let spec = dg_quant::QuantSpec::new(params.bits, params.group_size)
                    .map_err(|e| quant_err(&weight_name, e))?;
                let biases = store.get(&format!("{path}.biases"))?;
                let groups = in_dim / params.group_size.max(1);
                w.expect_shape(&[out_dim, spec.words_per_row(in_dim)])?;
                scales.expect_shape(&[out_dim, groups])?;
                biases.expect_shape(&[out_dim, groups])?;
                let (packed, scales, biases) = (w.to_u32()?, scales.to_bf16()?, biases.to_bf16()?);
                // Validate the lengths once, here, rather than on every call.
                dg_quant::QMatrix::new(&packed, &scales, &biases, out_dim, in_dim, spec)
                    .map_err(|e| quant_err(&weight_name, e))?;
                Weight::Quantized {
                    packed,
                    scales,
                    biases,
                    spec,
                }
            }
            None => {
                w.expect_shape(&[out_dim, in_dim])?;
                // Checks the dtype now so a bad checkpoint fails at load, not mid-image.
                if !matches!(
                    w.dtype,
                    safetensors::Dtype::F32 | safetensors::Dtype::BF16 | safetensors::Dtype::F16
                ) {
                    w.to_f32()?;
                }
                Weight::Plain(w)
            }
        };
        let clip = if clippable && clipped {
            let s = |k: &str| store.get(&format!("{module}.{k}"))?.scalar_f32();
            Some(Clip {
                input: (s("input_min")?, s("input_max")?),
                output: (s("output_min")?, s("output_max")?),
            })
        } else {
            None
        };
        Ok(Self {
            name: weight_name,
            out_dim,
            in_dim,
            weight,
            clip,
        })
    }

    pub fn is_quantized(&self) -> bool {
        matches!(self.weight, Weight::Quantized { .. })
    }

    /// `y [m, out] = clip_out(clip_in(x [m, in]) @ W^T)`.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        debug_assert_eq!(x.len(), m * self.in_dim);
        let clipped_in;
        let x = match self.clip {
            Some(c) => {
                clipped_in = x.iter().map(|&v| clamp(v, c.input)).collect::<Vec<_>>();
                &clipped_in[..]
            }
            None => x,
        };
        let mut out = vec![0f32; m * self.out_dim];
        match &self.weight {
            Weight::Quantized {
                packed,
                scales,
                biases,
                spec,
            } => {
                let q = dg_quant::QMatrix::new(
                    packed,
                    scales,
                    biases,
                    self.out_dim,
                    self.in_dim,
                    *spec,
                )
                .map_err(|e| quant_err(&self.name, e))?;
                dg_quant::matmul_t(x, m, &q, &mut out).map_err(|e| quant_err(&self.name, e))?;
            }
            Weight::Plain(t) => {
                let w = t.to_f32()?;
                dg_quant::matmul_f32(x, &w, m, self.in_dim, self.out_dim, true, &mut out)
                    .map_err(|e| quant_err(&self.name, e))?;
            }
        }
        if let Some(c) = self.clip {
            for v in &mut out {
                *v = clamp(*v, c.output);
            }
        }
        Ok(out)
    }
}
