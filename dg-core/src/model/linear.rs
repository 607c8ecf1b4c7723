//! Linear layers as the checkpoint stores them: MLX-affine quantized or plain, resolved the way the
//! reference loader's `class_predicate` does it, optionally clipped (Gemma 4's
//! `ClippableLinear`). The text model and the vision tower both use these.

use std::borrow::Cow;

use dg_quant::{bf16, QExperts, QMatrix, QuantSpec};
use rayon::prelude::*;

use crate::checkpoint::{Buf, Checkpoint, FloatView};
use crate::config::{QuantEntry, QuantizationConfig};
use crate::error::CoreError;
use crate::lora::LoraFactors;

/// How one module is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Plain floating weights.
    Dense,
    /// MLX affine quantized.
    Quantized(QuantSpec),
}

/// The reference's quantization decision for a module path: an explicit per-module entry wins;
/// otherwise the module is quantized with the default bits when its `.scales` tensor exists and
/// its weight count is a multiple of 64.
pub fn resolve_storage(
    ck: &Checkpoint,
    quant: Option<&QuantizationConfig>,
    path: &str,
    weight_elems: usize,
) -> Result<Storage, CoreError> {
    let Some(q) = quant else {
        return Ok(Storage::Dense);
    };
    let entry: Option<QuantEntry> = match q.modules.get(path) {
        Some(explicit) => *explicit,
        None if weight_elems.is_multiple_of(64) && ck.contains(&format!("{path}.scales")) => {
            q.default
        }
        None => None,
    };
    match entry {
        None => Ok(Storage::Dense),
        Some(e) => QuantSpec::new(e.bits, e.group_size)
            .map(Storage::Quantized)
            .map_err(|source| CoreError::Quant {
                name: path.to_owned(),
                source,
            }),
    }
}

/// Packed weights, scales and biases of a quantized tensor.
#[derive(Clone, Debug)]
pub struct QuantizedWeights {
    /// Packed codes, `u32 [.., rows, cols * bits / 32]`.
    pub packed: Buf<u32>,
    /// Per-group scales, `[.., rows, cols / group_size]`.
    pub scales: Buf<bf16>,
    /// Per-group biases, `[.., rows, cols / group_size]`.
    pub biases: Buf<bf16>,
    /// Width and group size.
    pub spec: QuantSpec,
}

impl QuantizedWeights {
    /// Loads `{path}.weight/.scales/.biases` for `matrices` stacked `[rows, cols]` matrices.
    fn load(
        ck: &Checkpoint,
        path: &str,
        lead: &[usize],
        rows: usize,
        cols: usize,
        spec: QuantSpec,
    ) -> Result<Self, CoreError> {
        let bad = |reason: String| CoreError::BadTensor {
            name: format!("{path}.weight"),
            path: ck.dir().to_owned(),
            reason,
        };
        if !cols.is_multiple_of(spec.group_size) || !(cols * spec.bits as usize).is_multiple_of(32)
        {
            return Err(bad(format!(
                "input width {cols} does not fit {}-bit groups of {}",
                spec.bits, spec.group_size
            )));
        }
        let shape = |last: usize| [lead, &[rows, last]].concat();
        Ok(QuantizedWeights {
            packed: ck.u32_buf(
                &format!("{path}.weight"),
                &shape(cols * spec.bits as usize / 32),
            )?,
            scales: ck.bf16_buf(&format!("{path}.scales"), &shape(cols / spec.group_size))?,
            biases: ck.bf16_buf(&format!("{path}.biases"), &shape(cols / spec.group_size))?,
            spec,
        })
    }
}

/// A linear layer `y = x @ W^T` with `W: [out, in]`.
#[derive(Clone, Debug)]
pub struct Linear {
    name: String,
    /// Output features (rows of `W`).
    pub out_dim: usize,
    /// Input features (columns of `W`).
    pub in_dim: usize,
    weights: Weights,
    clip: Option<Clip>,
    lora: Option<MountedLora>,
}

/// Where plain (unquantized) weights live once loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainWeights {
    /// Widened to f32 at load: the text model runs every linear at every denoising step.
    Widened,
    /// Left in the mapped file and widened per call (bf16 a panel at a time, inside the
    /// product): the vision tower runs once per image, and its bf16 sidecar would take twice
    /// the memory as f32.
    Mapped,
}

/// Gemma 4's `ClippableLinear` bounds: the input and the output are clamped to scalars the
/// checkpoint stores beside the matrix (`input_min`, `input_max`, `output_min`, `output_max`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clip {
    /// `(input_min, input_max)`.
    pub input: (f32, f32),
    /// `(output_min, output_max)`.
    pub output: (f32, f32),
}

impl Clip {
    /// Reads the bounds of the clippable module at `module` (`{module}.input_min`, ...).
    pub fn load(ck: &Checkpoint, module: &str) -> Result<Self, CoreError> {
        let s = |k: &str| ck.scalar_f32(&format!("{module}.{k}"));
        Ok(Clip {
            input: (s("input_min")?, s("input_max")?),
            output: (s("output_min")?, s("output_max")?),
        })
    }
}

/// `mx.clip(x, lo, hi)`: `minimum(maximum(x, lo), hi)`.
#[inline]
fn clamp(v: f32, (lo, hi): (f32, f32)) -> f32 {
    v.max(lo).min(hi)
}

/// A LoRA adapter's factors on one layer and the factor on their product.
#[derive(Clone, Debug)]
struct MountedLora {
    factors: LoraFactors,
    scale: f32,
}

#[derive(Clone, Debug)]
enum Weights {
    Dense(Plain),
    Quantized(QuantizedWeights),
}

#[derive(Clone, Debug)]
enum Plain {
    Widened(Vec<f32>),
    Mapped(FloatView),
}

impl Plain {
    fn load(
        ck: &Checkpoint,
        name: &str,
        shape: &[usize],
        form: PlainWeights,
    ) -> Result<Self, CoreError> {
        Ok(match form {
            PlainWeights::Widened => Plain::Widened(ck.f32(name, shape)?),
            PlainWeights::Mapped => Plain::Mapped(ck.float_view(name, shape)?),
        })
    }

    /// The weights in the mapped file as bf16, which `x @ W^T` widens a panel at a time
    /// (`dg_quant::matmul_bf16_t`) instead of whole.
    fn mapped_bf16(&self) -> Option<&[bf16]> {
        match self {
            Plain::Mapped(v) => v.as_bf16(),
            Plain::Widened(_) => None,
        }
    }

    /// The weights as f32: borrowed when widened at load, else widened now.
    fn f32(&self) -> Cow<'_, [f32]> {
        match self {
            Plain::Widened(w) => Cow::Borrowed(w),
            Plain::Mapped(v) => Cow::Owned(v.to_f32()),
        }
    }
}

impl Linear {
    /// Loads the module at `path` (`{path}.weight`, plus scales/biases when quantized); plain
    /// weights are widened to f32 now.
    pub fn load(
        ck: &Checkpoint,
        quant: Option<&QuantizationConfig>,
        path: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self, CoreError> {
        Self::load_with(ck, quant, path, out_dim, in_dim, PlainWeights::Widened)
    }

    /// [`Linear::load`], with plain weights kept as `plain` says.
    pub fn load_with(
        ck: &Checkpoint,
        quant: Option<&QuantizationConfig>,
        path: &str,
        out_dim: usize,
        in_dim: usize,
        plain: PlainWeights,
    ) -> Result<Self, CoreError> {
        let weights = match resolve_storage(ck, quant, path, out_dim * in_dim)? {
            Storage::Dense => Weights::Dense(Plain::load(
                ck,
                &format!("{path}.weight"),
                &[out_dim, in_dim],
                plain,
            )?),
            Storage::Quantized(spec) => Weights::Quantized(QuantizedWeights::load(
                ck,
                path,
                &[],
                out_dim,
                in_dim,
                spec,
            )?),
        };
        Ok(Linear {
            name: path.to_owned(),
            out_dim,
            in_dim,
            weights,
            clip: None,
            lora: None,
        })
    }

    /// Clamps the input and the output of every [`forward`](Self::forward) to `clip`.
    pub fn with_clip(mut self, clip: Clip) -> Self {
        self.clip = Some(clip);
        self
    }

    /// The module path, for error messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the weights are stored.
    pub fn storage(&self) -> Storage {
        match &self.weights {
            Weights::Dense(_) => Storage::Dense,
            Weights::Quantized(q) => Storage::Quantized(q.spec),
        }
    }

    fn qmatrix<'a>(&self, q: &'a QuantizedWeights) -> Result<QMatrix<'a>, CoreError> {
        QMatrix::new(
            q.packed.as_slice(),
            q.scales.as_slice(),
            q.biases.as_slice(),
            self.out_dim,
            self.in_dim,
            q.spec,
        )
        .map_err(|source| self.quant_err(source))
    }

    fn quant_err(&self, source: dg_quant::QuantError) -> CoreError {
        CoreError::Quant {
            name: self.name.clone(),
            source,
        }
    }

    /// `x [m, in] @ W^T -> [m, out]`, plus the mounted adapter's `scale * (x @ A) @ B`; with a
    /// [`Clip`], the input is clamped first and the output last, as `ClippableLinear` does.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>, CoreError> {
        let mut out = dg_quant::alloc::zeroed(m * self.out_dim, "linear layer output")?;
        self.forward_into(x, m, &mut out)?;
        Ok(out)
    }

    /// [`Self::forward`] into `out` `[m, out]` (every value overwritten).
    pub fn forward_into(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), CoreError> {
        let clipped_in;
        let x = match &self.clip {
            Some(c) => {
                clipped_in = x.par_iter().map(|&v| clamp(v, c.input)).collect::<Vec<_>>();
                &clipped_in[..]
            }
            None => x,
        };
        self.forward_base_into(x, m, out)?;
        if let Some(lora) = &self.lora {
            self.add_lora(lora, x, m, out)?;
        }
        if let Some(c) = &self.clip {
            out.par_iter_mut().for_each(|v| *v = clamp(*v, c.output));
        }
        Ok(())
    }

    /// `x [m, in] @ W^T` without any mounted adapter (the frozen base, for training).
    pub(crate) fn forward_base(&self, x: &[f32], m: usize) -> Result<Vec<f32>, CoreError> {
        let mut out = dg_quant::alloc::zeroed(m * self.out_dim, "linear layer output")?;
        self.forward_base_into(x, m, &mut out)?;
        Ok(out)
    }

    fn forward_base_into(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), CoreError> {
        match &self.weights {
            Weights::Dense(w) => match w.mapped_bf16() {
                Some(w) => dg_quant::matmul_bf16_t(x, m, w, (self.out_dim, self.in_dim), out),
                None => dg_quant::matmul_f32(x, &w.f32(), m, self.in_dim, self.out_dim, true, out),
            },
            Weights::Quantized(q) => dg_quant::matmul_t(x, m, &self.qmatrix(q)?, out),
        }
        .map_err(|e| self.quant_err(e))
    }

    /// `out += scale * (x @ A) @ B`, in the reference's order: the two products, the scale on
    /// their result, then the sum.
    fn add_lora(
        &self,
        lora: &MountedLora,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), CoreError> {
        let f = &lora.factors;
        let mut xa = vec![0.0f32; m * f.rank];
        dg_quant::matmul_f32(x, &f.a, m, self.in_dim, f.rank, false, &mut xa)
            .map_err(|e| self.quant_err(e))?;
        let mut z = vec![0.0f32; m * self.out_dim];
        dg_quant::matmul_f32(&xa, &f.b, m, f.rank, self.out_dim, false, &mut z)
            .map_err(|e| self.quant_err(e))?;
        for (o, z) in out.iter_mut().zip(&z) {
            *o += lora.scale * z;
        }
        Ok(())
    }

    /// Checks that `factors` fit this layer (`[in, rank]` and `[rank, out]`).
    pub(crate) fn check_lora(&self, factors: &LoraFactors) -> Result<(), String> {
        let rank = factors.rank;
        if factors.in_dim != self.in_dim
            || factors.out_dim != self.out_dim
            || factors.a.len() != self.in_dim * rank
            || factors.b.len() != rank * self.out_dim
        {
            return Err(format!(
                "{}: lora_a {:?} and lora_b {:?} do not fit the layer's {} inputs and {} outputs \
                 (expected [{}, {rank}] and [{rank}, {}])",
                self.name,
                [factors.in_dim, rank],
                [rank, factors.out_dim],
                self.in_dim,
                self.out_dim,
                self.in_dim,
                self.out_dim
            ));
        }
        Ok(())
    }

    /// Mounts (or, with `None`, removes) an adapter's factors; checked by [`Self::check_lora`].
    pub(crate) fn set_lora(&mut self, lora: Option<(LoraFactors, f32)>) {
        self.lora = lora.map(|(factors, scale)| MountedLora { factors, scale });
    }

    /// Whether an adapter is mounted on this layer.
    pub fn has_lora(&self) -> bool {
        self.lora.is_some()
    }

    /// `x [m, out] @ W -> [m, in]` (the soft-embedding product `probs @ embed`).
    pub fn forward_transposed(&self, x: &[f32], m: usize) -> Result<Vec<f32>, CoreError> {
        let mut out = dg_quant::alloc::zeroed(m * self.in_dim, "x @ W output")?;
        match &self.weights {
            Weights::Dense(w) => {
                dg_quant::matmul_f32(x, &w.f32(), m, self.out_dim, self.in_dim, false, &mut out)
            }
            Weights::Quantized(q) => dg_quant::matmul(x, m, &self.qmatrix(q)?, &mut out),
        }
        .map_err(|e| self.quant_err(e))?;
        Ok(out)
    }

    /// `x @ W` for rows of probabilities (the soft embeddings): quantized weights skip each
    /// row's smallest probabilities within the bound of `dg_quant::sparse` (half a unit
    /// roundoff of the row's scale); plain weights take [`Self::forward_transposed`].
    pub fn forward_transposed_sparse(&self, x: &[f32], m: usize) -> Result<Vec<f32>, CoreError> {
        let Weights::Quantized(q) = &self.weights else {
            return self.forward_transposed(x, m);
        };
        let mut out = dg_quant::alloc::zeroed(m * self.in_dim, "x @ W output")?;
        dg_quant::matmul_sparse(x, m, &self.qmatrix(q)?, &mut out)
            .map_err(|e| self.quant_err(e))?;
        Ok(out)
    }

    /// Rows of W (embedding lookup), `ids.len() x in`.
    pub fn rows(&self, ids: &[u32]) -> Result<Vec<f32>, CoreError> {
        let mut out = dg_quant::alloc::zeroed(ids.len() * self.in_dim, "embedding rows")?;
        match &self.weights {
            Weights::Dense(w) => {
                let w = w.f32();
                for (id, o) in ids.iter().zip(out.chunks_exact_mut(self.in_dim)) {
                    let r = *id as usize;
                    if r >= self.out_dim {
                        return Err(CoreError::InvalidInput(format!(
                            "token id {id} is out of range for {} (vocabulary of {})",
                            self.name, self.out_dim
                        )));
                    }
                    o.copy_from_slice(&w[r * self.in_dim..(r + 1) * self.in_dim]);
                }
            }
            Weights::Quantized(q) => {
                if let Some(id) = ids.iter().find(|&&id| id as usize >= self.out_dim) {
                    return Err(CoreError::InvalidInput(format!(
                        "token id {id} is out of range for {} (vocabulary of {})",
                        self.name, self.out_dim
                    )));
                }
                dg_quant::embedding(&self.qmatrix(q)?, ids, &mut out)
                    .map_err(|e| self.quant_err(e))?;
            }
        }
        Ok(out)
    }

    /// The whole weight matrix dequantized to f32 `[out, in]`.
    pub fn dequantized(&self) -> Result<Vec<f32>, CoreError> {
        match &self.weights {
            Weights::Dense(w) => Ok(w.f32().into_owned()),
            Weights::Quantized(q) => {
                let mut out =
                    dg_quant::alloc::zeroed(self.out_dim * self.in_dim, "dequantized weights")?;
                dg_quant::dequantize(&self.qmatrix(q)?, &mut out).map_err(|e| self.quant_err(e))?;
                Ok(out)
            }
        }
    }
}

/// Stacked expert weights `[E, out, in]` (MLX `SwitchLinear`), quantized or plain.
#[derive(Clone, Debug)]
pub struct ExpertLinear {
    name: String,
    /// Number of experts `E`.
    pub experts: usize,
    /// Output features of each expert.
    pub out_dim: usize,
    /// Input features of each expert.
    pub in_dim: usize,
    weights: Weights,
}

impl ExpertLinear {
    /// The stacked quantized weights as the kernels take them.
    fn qexperts<'a>(&self, q: &'a QuantizedWeights) -> Result<QExperts<'a>, dg_quant::QuantError> {
        QExperts::new(
            q.packed.as_slice(),
            q.scales.as_slice(),
            q.biases.as_slice(),
            self.experts,
            self.out_dim,
            self.in_dim,
            q.spec,
        )
    }

    /// Loads `{path}.weight` (+ scales/biases) of `experts` stacked `[out, in]` matrices.
    pub fn load(
        ck: &Checkpoint,
        quant: Option<&QuantizationConfig>,
        path: &str,
        experts: usize,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self, CoreError> {
        let weights = match resolve_storage(ck, quant, path, experts * out_dim * in_dim)? {
            Storage::Dense => Weights::Dense(Plain::load(
                ck,
                &format!("{path}.weight"),
                &[experts, out_dim, in_dim],
                PlainWeights::Widened,
            )?),
            Storage::Quantized(spec) => Weights::Quantized(QuantizedWeights::load(
                ck,
                path,
                &[experts],
                out_dim,
                in_dim,
                spec,
            )?),
        };
        Ok(ExpertLinear {
            name: path.to_owned(),
            experts,
            out_dim,
            in_dim,
            weights,
        })
    }

    /// For each `(x_row, expert)` pair: `x[x_row] @ W_expert^T`, giving `[pairs, out]`.
    pub fn forward_pairs(
        &self,
        x: &[f32],
        x_rows: usize,
        pairs: &[(usize, usize)],
    ) -> Result<Vec<f32>, CoreError> {
        let err = |source| CoreError::Quant {
            name: self.name.clone(),
            source,
        };
        let mut out = dg_quant::alloc::zeroed(pairs.len() * self.out_dim, "expert outputs")?;
        match &self.weights {
            Weights::Quantized(q) => {
                let experts = self.qexperts(q).map_err(err)?;
                dg_quant::gather_matmul_t(x, x_rows, &experts, pairs, &mut out).map_err(err)?;
            }
            Weights::Dense(w) => {
                let w = w.f32();
                let size = self.out_dim * self.in_dim;
                for (p, &(row, e)) in pairs.iter().enumerate() {
                    let xr = &x[row * self.in_dim..(row + 1) * self.in_dim];
                    let we = &w[e * size..(e + 1) * size];
                    dg_quant::matmul_f32(
                        xr,
                        we,
                        1,
                        self.in_dim,
                        self.out_dim,
                        true,
                        &mut out[p * self.out_dim..(p + 1) * self.out_dim],
                    )
                    .map_err(err)?;
                }
            }
        }
        Ok(out)
    }

    /// For each `(dy_row, expert)` pair: `dy[p] @ W_expert` (the gradient of
    /// [`Self::forward_pairs`] with respect to its input), giving `[pairs, in]`. Pairs are
    /// independent: pair `p` reads row `p` of `dy` (`[pairs, out]`).
    pub(crate) fn backward_pairs(
        &self,
        dy: &[f32],
        experts_of_pairs: &[usize],
    ) -> Result<Vec<f32>, CoreError> {
        let err = |source| CoreError::Quant {
            name: self.name.clone(),
            source,
        };
        let (n, k) = (self.out_dim, self.in_dim);
        let mut out = vec![0.0f32; experts_of_pairs.len() * k];
        // One product per expert over all its pairs, the weights read once.
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); self.experts];
        for (p, &e) in experts_of_pairs.iter().enumerate() {
            by_expert
                .get_mut(e)
                .ok_or_else(|| {
                    CoreError::InvalidInput(format!(
                        "{}: expert {e} of pair {p} is out of range ({} experts)",
                        self.name, self.experts
                    ))
                })?
                .push(p);
        }
        for (e, ps) in by_expert
            .iter()
            .enumerate()
            .filter(|(_, ps)| !ps.is_empty())
        {
            let rows: Vec<f32> = ps
                .iter()
                .flat_map(|&p| dy[p * n..(p + 1) * n].iter().copied())
                .collect();
            let mut res = vec![0.0f32; ps.len() * k];
            match &self.weights {
                Weights::Quantized(q) => {
                    let experts = self.qexperts(q).map_err(err)?;
                    dg_quant::matmul(&rows, ps.len(), &experts.expert(e).map_err(err)?, &mut res)
                }
                Weights::Dense(w) => dg_quant::matmul_f32(
                    &rows,
                    &w.f32()[e * n * k..(e + 1) * n * k],
                    ps.len(),
                    n,
                    k,
                    false,
                    &mut res,
                ),
            }
            .map_err(err)?;
            for (&p, r) in ps.iter().zip(res.chunks_exact(k)) {
                out[p * k..(p + 1) * k].copy_from_slice(r);
            }
        }
        Ok(out)
    }
}
