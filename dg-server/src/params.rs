//! What every generation route shares: JSON bodies parsed with the failing field named, the
//! diffusion options (extra body fields), stop strings, ids and timestamps.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use dg_engine::{Defaults, Request, Sampler};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ApiError;

/// The request body, or the 413 / 400 that reading it gave.
pub(crate) fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(
                "the request body is larger than this server accepts (see --max-body-bytes)",
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            )
        }
    })
}

/// Parses a JSON body; an error names the field at fault (`messages[0].content`).
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(value) => {
            // Trailing characters after the object are a syntax error too.
            de.end()
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, invalid_json(&e)))?;
            Ok(value)
        }
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let text = inner.to_string();
            if let Some(field) = text
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
            {
                let param = if path == "." {
                    field.to_string()
                } else {
                    format!("{path}.{field}")
                };
                return Err(ApiError::invalid(
                    param.clone(),
                    format!("{param}: a required field is missing"),
                ));
            }
            if inner.is_data() && path != "." {
                Err(ApiError::invalid(path.clone(), format!("{path}: {inner}")))
            } else if inner.is_data() {
                Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("the body must be a JSON object: {inner}"),
                ))
            } else {
                Err(ApiError::new(StatusCode::BAD_REQUEST, invalid_json(&inner)))
            }
        }
    }
}

fn invalid_json(e: &serde_json::Error) -> String {
    format!("the body is not valid JSON: {e}")
}

/// `stop`: one string or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// The diffusion options, as extra body fields. The names mlx-vlm's server takes
/// (`diffusion_sampler`, `max_denoising_steps`, `diffusion_{min,max}_canvas_length`,
/// `diffusion_full_canvas`, `threshold`) are accepted as aliases of the short ones.
#[derive(Deserialize, Debug, Default, Clone)]
pub(crate) struct Diffusion {
    /// `confidence-threshold` or `entropy-bound` (`_` for `-` accepted).
    #[serde(alias = "diffusion_sampler")]
    pub sampler: Option<String>,
    /// Confidence threshold in [0, 1] (confidence-threshold sampler).
    #[serde(alias = "diffusion_threshold")]
    pub threshold: Option<f32>,
    /// Entropy budget > 0 (entropy-bound sampler).
    #[serde(alias = "diffusion_entropy_bound")]
    pub entropy_bound: Option<f32>,
    /// Denoising steps per block.
    #[serde(alias = "max_denoising_steps")]
    pub steps: Option<usize>,
    #[serde(alias = "diffusion_min_canvas_length")]
    pub min_canvas: Option<usize>,
    #[serde(alias = "diffusion_max_canvas_length")]
    pub max_canvas: Option<usize>,
    #[serde(alias = "diffusion_full_canvas")]
    pub full_canvas: Option<bool>,
    /// Where unset generation settings come from: `checkpoint` (generation_config.json, the
    /// default) or `reference` (mlx-optiq's, for parity).
    pub defaults: Option<String>,
    /// Per-step drafts in a stream, as SSE comment lines (`: draft {...}`).
    pub drafts: Option<bool>,
}

impl Diffusion {
    /// Sets the request's diffusion options.
    pub(crate) fn apply(&self, r: &mut Request) -> Result<(), ApiError> {
        let sampler = self
            .sampler
            .as_deref()
            .map(|s| s.trim().to_ascii_lowercase().replace('_', "-"));
        r.sampler = match sampler.as_deref() {
            None if self.entropy_bound.is_some() && self.threshold.is_none() => {
                Sampler::EntropyBound {
                    bound: self.entropy_bound,
                }
            }
            None | Some("confidence-threshold") => {
                if self.entropy_bound.is_some() {
                    return Err(ApiError::invalid(
                        "entropy_bound",
                        "entropy_bound is an option of the entropy-bound sampler, not of \
                         confidence-threshold",
                    ));
                }
                match self.threshold {
                    Some(threshold) => Sampler::ConfidenceThreshold { threshold },
                    None => Sampler::default(),
                }
            }
            Some("entropy-bound") => {
                if self.threshold.is_some() {
                    return Err(ApiError::invalid(
                        "threshold",
                        "threshold is an option of the confidence-threshold sampler, not of \
                         entropy-bound",
                    ));
                }
                Sampler::EntropyBound {
                    bound: self.entropy_bound,
                }
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "sampler",
                    format!(
                        "unknown sampler {other:?}: use \"confidence-threshold\" or \
                         \"entropy-bound\""
                    ),
                ))
            }
        };
        r.steps = self.steps;
        r.min_canvas = self.min_canvas;
        r.max_canvas = self.max_canvas;
        r.full_canvas = self.full_canvas.unwrap_or(false);
        r.defaults = match self.defaults.as_deref() {
            None | Some("checkpoint") => Defaults::Checkpoint,
            Some("reference") => Defaults::Reference,
            Some(other) => {
                return Err(ApiError::invalid(
                    "defaults",
                    format!("unknown defaults {other:?}: use \"checkpoint\" or \"reference\""),
                ))
            }
        };
        Ok(())
    }
}

/// Options shared by the three generation routes.
pub(crate) struct Common {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
}

impl Common {
    /// Sets them on the request; `default_max_tokens` when the client gave none.
    pub(crate) fn apply(self, r: &mut Request, default_max_tokens: usize) {
        r.max_tokens = self.max_tokens.unwrap_or(default_max_tokens);
        r.temperature = self.temperature.unwrap_or(0.0);
        r.seed = self.seed.unwrap_or(0);
        r.stop = self.stop;
    }
}

/// A fresh random id with the given prefix (`chatcmpl-`, `cmpl-`, `msg_`).
pub(crate) fn new_id(prefix: &str) -> String {
    let random = |salt: u64| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(salt);
        h.finish()
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}{:016x}{:016x}", random(nanos), random(!nanos))
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Refuses an option this server does not implement when it is set to something other than
/// its neutral value.
pub(crate) fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(
        param,
        format!("{param}: {what} is not supported by this server"),
    )
}
