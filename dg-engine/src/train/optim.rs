//! AdamW exactly as `mlx.optimizers.AdamW` (mlx 0.32.4) computes it in float32.

use std::collections::BTreeMap;

/// AdamW's hyper-parameters; [`Default`] is mlx's defaults with the reference trainer's
/// learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate (the reference trainer's default: 1e-4).
    pub learning_rate: f32,
    /// Running-average coefficients of the gradient and its square.
    pub betas: (f64, f64),
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            learning_rate: 1e-4,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// First and second moments of one parameter tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Moments {
    /// Running average of the gradient.
    pub m: Vec<f32>,
    /// Running average of the squared gradient.
    pub v: Vec<f32>,
}

/// AdamW with mlx's update rule and its default `bias_correction=False`:
/// `w <- w * (1 - lr * wd)`, `m <- b1 m + (1 - b1) g`, `v <- b2 v + (1 - b2) g^2`,
/// `w <- w - lr * m / (sqrt(v) + eps)`, every operation rounded to f32 in that order. The
/// Python scalars are rounded to f32 where mlx rounds them (`1 - b1` is computed in double
/// first).
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// Updates applied so far (mlx's `state["step"]`).
    pub step: u64,
    /// Moments by parameter name; created (zeros) at a parameter's first update.
    pub moments: BTreeMap<String, Moments>,
}

impl AdamW {
    /// A fresh optimizer.
    pub fn new(config: AdamWConfig) -> Self {
        AdamW {
            config,
            step: 0,
            moments: BTreeMap::new(),
        }
    }

    /// Counts one optimizer step; call once per update of all parameters, before
    /// [`update`](Self::update)s (mlx increments its step first).
    pub fn begin_step(&mut self) {
        self.step += 1;
    }

    /// Updates `param` in place with `grad` and the moments stored under `name`.
    ///
    /// `param` and `grad` must have the same length (the caller checks shapes); a length that
    /// differs from stored moments restarts them.
    pub fn update(&mut self, name: &str, param: &mut [f32], grad: &[f32]) {
        let c = &self.config;
        let lr = c.learning_rate;
        let decay = 1.0 - lr * c.weight_decay as f32;
        let (b1, b2) = (c.betas.0 as f32, c.betas.1 as f32);
        let (one_b1, one_b2) = ((1.0 - c.betas.0) as f32, (1.0 - c.betas.1) as f32);
        let eps = c.eps as f32;
        let n = param.len();
        let state = self
            .moments
            .entry(name.to_owned())
            .or_insert_with(|| Moments {
                m: vec![0.0; n],
                v: vec![0.0; n],
            });
        if state.m.len() != n {
            *state = Moments {
                m: vec![0.0; n],
                v: vec![0.0; n],
            };
        }
        for (((w, &g), m), v) in param
            .iter_mut()
            .zip(grad)
            .zip(state.m.iter_mut())
            .zip(state.v.iter_mut())
        {
            let decayed = *w * decay;
            *m = b1 * *m + one_b1 * g;
            *v = b2 * *v + one_b2 * (g * g);
            *w = decayed - lr * *m / (v.sqrt() + eps);
        }
    }
}
