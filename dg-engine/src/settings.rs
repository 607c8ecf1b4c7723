//! Generation settings resolved from a generation-config dictionary exactly as the reference's
//! `stream_diffusion_generate` resolves `model.config.generation_config` (diffusion.py 531-627).
//! The same resolution serves both sources of [`crate::Defaults`].

use serde_json::Value;

use crate::error::{EngineError, Result};

/// Settings a request falls back on.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationSettings {
    /// Denoising steps per block.
    pub steps: usize,
    pub entropy_bound: f64,
    pub t_min: f64,
    pub t_max: f64,
    /// The stable-and-confident stop: (stability threshold, mean-entropy threshold).
    pub stop: Option<(usize, f64)>,
    /// EOS ids the generation config adds.
    pub extra_eos: Vec<u32>,
}

impl Default for GenerationSettings {
    /// The reference's settings with no generation config.
    fn default() -> Self {
        GenerationSettings::resolve(None).expect("the empty config resolves")
    }
}

fn number(v: &Value, name: &'static str) -> Result<f64> {
    v.as_f64().ok_or_else(|| EngineError::InvalidArgument {
        name,
        reason: format!("generation config value {v} is not a number"),
    })
}

fn ids(v: &Value) -> Vec<u32> {
    match v {
        Value::Number(n) => n.as_u64().map(|i| vec![i as u32]).unwrap_or_default(),
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|i| i as u32))
            .collect(),
        _ => Vec::new(),
    }
}

impl GenerationSettings {
    /// Resolves a generation-config dictionary (`None` or a non-object behaves as `{}`).
    pub fn resolve(config: Option<&Value>) -> Result<Self> {
        let empty = serde_json::Map::new();
        let g = config.and_then(Value::as_object).unwrap_or(&empty);
        let sub = |key: &str| {
            g.get(key)
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty())
        };

        let steps = match g.get("max_denoising_steps") {
            Some(v) if !v.is_null() && v.as_u64() != Some(0) => {
                v.as_u64().ok_or_else(|| EngineError::InvalidArgument {
                    name: "max_denoising_steps",
                    reason: format!("generation config value {v} is not a positive integer"),
                })? as usize
            }
            _ => 48,
        };

        let sampler = sub("sampler_config");
        let sampler_name = sampler
            .and_then(|s| s.get("_cls_name"))
            .and_then(Value::as_str)
            .unwrap_or("EntropyBoundSamplerConfig");
        if sampler_name != "EntropyBoundSamplerConfig" {
            return Err(EngineError::InvalidArgument {
                name: "sampler_config",
                reason: format!("diffusion sampler {sampler_name:?} is not supported"),
            });
        }
        let entropy_bound = match sampler.and_then(|s| s.get("entropy_bound")) {
            Some(v) => number(v, "entropy_bound")?,
            None => 0.1,
        };

        let (t_min, t_max) = match sub("linear_temperature_schedule_config") {
            Some(s) => (s.get("t_min"), s.get("t_max")),
            None => (g.get("t_min"), g.get("t_max")),
        };
        let t_min = t_min
            .map(|v| number(v, "t_min"))
            .transpose()?
            .unwrap_or(0.4);
        let t_max = t_max
            .map(|v| number(v, "t_max"))
            .transpose()?
            .unwrap_or(0.8);

        let stop_source = sub("diffusion_stopping_config").or_else(|| {
            (g.contains_key("confidence_threshold") || g.contains_key("stability_threshold"))
                .then_some(g)
        });
        let stop = match stop_source {
            Some(s) => {
                let stability = match s.get("stability_threshold") {
                    Some(v) => number(v, "stability_threshold")? as usize,
                    None => 1,
                };
                let confidence = match s.get("confidence_threshold") {
                    Some(v) => number(v, "confidence_threshold")?,
                    None => 0.005,
                };
                Some((stability, confidence))
            }
            None => None,
        };

        Ok(GenerationSettings {
            steps,
            entropy_bound,
            t_min,
            t_max,
            stop,
            extra_eos: g.get("eos_token_id").map(ids).unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_config_gives_reference_defaults() {
        let s = GenerationSettings::default();
        assert_eq!(
            (s.steps, s.entropy_bound, s.t_min, s.t_max, s.stop),
            (48, 0.1, 0.4, 0.8, None)
        );
    }

    #[test]
    fn hf_generation_config_enables_the_stop() {
        let g = json!({"max_denoising_steps": 32, "t_min": 0.3, "t_max": 0.9, "stability_threshold": 2,
            "confidence_threshold": 0.01, "eos_token_id": [1, 106],
            "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.2}});
        let s = GenerationSettings::resolve(Some(&g)).unwrap();
        assert_eq!(s.steps, 32);
        assert_eq!((s.t_min, s.t_max, s.entropy_bound), (0.3, 0.9, 0.2));
        assert_eq!(s.stop, Some((2, 0.01)));
        assert_eq!(s.extra_eos, vec![1, 106]);
    }

    #[test]
    fn unknown_sampler_is_named() {
        let g = json!({"sampler_config": {"_cls_name": "TopKSamplerConfig"}});
        let err = GenerationSettings::resolve(Some(&g))
            .unwrap_err()
            .to_string();
        assert!(err.contains("TopKSamplerConfig"), "{err}");
    }
}
