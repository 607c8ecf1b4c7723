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
    /// Bound of [`Sampler::EntropyBound`](crate::Sampler::EntropyBound) when the request leaves it unset.
    pub entropy_bound: f64,
    /// Floor of the per-step temperature schedule `t_min + (t_max - t_min) * k / steps`, where `k` counts down from `steps` to 1 ([`linear_temperature`](crate::sampler::linear_temperature)); the logits are divided by it.
    pub t_min: f64,
    /// Temperature of a block's first step (`k = steps`).
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

/// Most denoising steps per block a generation config may ask for (the reference uses 48).
pub const MAX_DENOISING_STEPS: usize = 1024;

fn invalid(name: &'static str, reason: String) -> EngineError {
    EngineError::InvalidArgument { name, reason }
}

fn number(v: &Value, name: &'static str) -> Result<f64> {
    v.as_f64()
        .ok_or_else(|| invalid(name, format!("generation config value {v} is not a number")))
}

/// A count: a non-negative integer (`2.0` counts as 2, as it does in Python).
fn count(v: &Value, name: &'static str) -> Result<usize> {
    let n = match v.as_u64() {
        Some(n) => Some(n),
        None => v
            .as_f64()
            .filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x < u64::MAX as f64)
            .map(|x| x as u64),
    };
    n.and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
        invalid(
            name,
            format!("generation config value {v} is not a non-negative integer"),
        )
    })
}

/// `eos_token_id`: an id, a list of ids, or null. Every id must fit a `u32` token id: a larger
/// one is refused, never truncated.
fn ids(v: &Value) -> Result<Vec<u32>> {
    let id = |x: &Value| {
        x.as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| invalid("eos_token_id", format!("{x} is not a token id")))
    };
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Number(_) => Ok(vec![id(v)?]),
        Value::Array(a) => a.iter().map(id).collect(),
        _ => Err(invalid(
            "eos_token_id",
            format!("{v} is not a token id or a list of them"),
        )),
    }
}

/// Whether `x` is finite in f32 too (the samplers compute in f32).
fn finite_f32(x: f64) -> bool {
    x.is_finite() && (x as f32).is_finite()
}

impl GenerationSettings {
    /// Checks every setting, naming the one at fault: the one validation of generation settings
    /// from any source ([`Self::resolve`] calls it; call it on settings you build yourself).
    ///
    /// - `steps`: `1..=`[`MAX_DENOISING_STEPS`].
    /// - `entropy_bound`: finite and `> 0` (as a request's bound).
    /// - `t_min`, `t_max`: finite, `0 <= t_min <= t_max`, `t_max > 0`, so that every step's
    ///   temperature `t_min + (t_max - t_min) * k / steps` (`k >= 1`) is positive: the logits
    ///   are divided by it.
    /// - `stop`: `stability_threshold <= MAX_DENOISING_STEPS` (0 is the reference's quirk:
    ///   every step counts as stable), `confidence_threshold` finite and `>= 0`.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_DENOISING_STEPS).contains(&self.steps) {
            return Err(invalid(
                "steps",
                format!("{} is not in 1..={MAX_DENOISING_STEPS}", self.steps),
            ));
        }
        if !(finite_f32(self.entropy_bound) && self.entropy_bound > 0.0) {
            return Err(invalid(
                "entropy_bound",
                format!("{} is not a finite value > 0", self.entropy_bound),
            ));
        }
        if !(finite_f32(self.t_min) && self.t_min >= 0.0) {
            return Err(invalid(
                "t_min",
                format!("{} is not a finite value >= 0", self.t_min),
            ));
        }
        if !(finite_f32(self.t_max) && self.t_max > 0.0) {
            return Err(invalid(
                "t_max",
                format!("{} is not a finite value > 0", self.t_max),
            ));
        }
        if self.t_min > self.t_max {
            return Err(invalid(
                "t_min",
                format!("{} is above t_max {}", self.t_min, self.t_max),
            ));
        }
        if let Some((stability, confidence)) = self.stop {
            if stability > MAX_DENOISING_STEPS {
                return Err(invalid(
                    "stability_threshold",
                    format!("{stability} is over the limit of {MAX_DENOISING_STEPS}"),
                ));
            }
            if !(finite_f32(confidence) && confidence >= 0.0) {
                return Err(invalid(
                    "confidence_threshold",
                    format!("{confidence} is not a finite value >= 0"),
                ));
            }
        }
        Ok(())
    }

    /// Resolves a generation-config dictionary (`None` or a non-object behaves as `{}`), then
    /// [validates](Self::validate) it; errors name the config's key.
    pub fn resolve(config: Option<&Value>) -> Result<Self> {
        let empty = serde_json::Map::new();
        let g = config.and_then(Value::as_object).unwrap_or(&empty);
        let sub = |key: &str| {
            g.get(key)
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty())
        };

        // The reference's `max_denoising_steps or 48`: absent, null and 0 mean 48.
        let steps = match g.get("max_denoising_steps") {
            Some(v) if !v.is_null() && v.as_u64() != Some(0) => count(v, "max_denoising_steps")?,
            _ => 48,
        };

        let sampler = sub("sampler_config");
        let sampler_name = sampler
            .and_then(|s| s.get("_cls_name"))
            .and_then(Value::as_str)
            .unwrap_or("EntropyBoundSamplerConfig");
        if sampler_name != "EntropyBoundSamplerConfig" {
            return Err(invalid(
                "sampler_config",
                format!("diffusion sampler {sampler_name:?} is not supported"),
            ));
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
                    Some(v) => count(v, "stability_threshold")?,
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

        let settings = GenerationSettings {
            steps,
            entropy_bound,
            t_min,
            t_max,
            stop,
            extra_eos: g
                .get("eos_token_id")
                .map(ids)
                .transpose()?
                .unwrap_or_default(),
        };
        settings.validate().map_err(|e| match e {
            // The config's name for `steps`.
            EngineError::InvalidArgument {
                name: "steps",
                reason,
            } => invalid("max_denoising_steps", reason),
            other => other,
        })?;
        Ok(settings)
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

    /// Asserts `InvalidArgument` naming `field` for the config `g`.
    fn refused(g: Value, field: &str) {
        match GenerationSettings::resolve(Some(&g)) {
            Err(e @ EngineError::InvalidArgument { name, .. }) => {
                assert_eq!(name, field, "{e}");
                assert!(e.to_string().starts_with(field), "{e}");
            }
            Err(e) => panic!("{g}: not an InvalidArgument: {e}"),
            Ok(s) => panic!("{g}: accepted as {s:?}; expected an error naming {field}"),
        }
    }

    #[test]
    fn eos_ids_over_u32_are_refused_not_truncated() {
        refused(json!({"eos_token_id": (1u64 << 32) + 26}), "eos_token_id");
        refused(
            json!({"eos_token_id": [1, (1u64 << 32) + 26]}),
            "eos_token_id",
        );
        refused(json!({"eos_token_id": [1, -3]}), "eos_token_id");
        refused(json!({"eos_token_id": "1"}), "eos_token_id");
        let s = GenerationSettings::resolve(Some(&json!({"eos_token_id": null}))).unwrap();
        assert!(s.extra_eos.is_empty());
    }

    #[test]
    fn the_stop_rule_is_checked() {
        refused(json!({"stability_threshold": -3}), "stability_threshold");
        refused(json!({"stability_threshold": 1.5}), "stability_threshold");
        refused(json!({"stability_threshold": 1e9}), "stability_threshold");
        refused(
            json!({"diffusion_stopping_config": {"stability_threshold": -3}}),
            "stability_threshold",
        );
        refused(
            json!({"confidence_threshold": -0.1}),
            "confidence_threshold",
        );
        refused(
            json!({"confidence_threshold": 1e300}),
            "confidence_threshold",
        );
        // 2.0 is 2, as in Python; 0 is the reference's "every step is stable" quirk.
        let s = GenerationSettings::resolve(Some(&json!({"stability_threshold": 2.0}))).unwrap();
        assert_eq!(s.stop, Some((2, 0.005)));
        let s = GenerationSettings::resolve(Some(&json!({"stability_threshold": 0}))).unwrap();
        assert_eq!(s.stop, Some((0, 0.005)));
    }

    #[test]
    fn the_temperature_schedule_stays_positive() {
        refused(json!({"t_min": 0, "t_max": 0}), "t_max");
        refused(json!({"t_min": 5, "t_max": -3}), "t_max");
        refused(json!({"t_min": 5, "t_max": 3}), "t_min");
        refused(json!({"t_min": -1, "t_max": 0.8}), "t_min");
        refused(json!({"t_max": 1e300}), "t_max");
        refused(
            json!({"linear_temperature_schedule_config": {"t_min": 0.0, "t_max": 0.0}}),
            "t_max",
        );
        // A zero floor is fine: every step's temperature is above it.
        let s = GenerationSettings::resolve(Some(&json!({"t_min": 0, "t_max": 0.5}))).unwrap();
        assert_eq!((s.t_min, s.t_max), (0.0, 0.5));
    }

    #[test]
    fn entropy_bound_and_steps_are_checked() {
        let bound = |b: Value| json!({"sampler_config": {"entropy_bound": b}});
        refused(bound(json!(-1)), "entropy_bound");
        refused(bound(json!(0)), "entropy_bound");
        refused(bound(json!("x")), "entropy_bound");
        refused(json!({"max_denoising_steps": -4}), "max_denoising_steps");
        refused(json!({"max_denoising_steps": 2.5}), "max_denoising_steps");
        refused(
            json!({"max_denoising_steps": MAX_DENOISING_STEPS + 1}),
            "max_denoising_steps",
        );
        // The reference's `or 48`.
        for v in [json!(0), json!(null)] {
            let s = GenerationSettings::resolve(Some(&json!({"max_denoising_steps": v}))).unwrap();
            assert_eq!(s.steps, 48);
        }
    }

    #[test]
    fn settings_built_by_hand_go_through_the_same_checks() {
        let ok = GenerationSettings::default();
        ok.validate().unwrap();
        let cases: [(&str, GenerationSettings); 5] = [
            (
                "steps",
                GenerationSettings {
                    steps: 0,
                    ..ok.clone()
                },
            ),
            (
                "entropy_bound",
                GenerationSettings {
                    entropy_bound: f64::NAN,
                    ..ok.clone()
                },
            ),
            (
                "t_max",
                GenerationSettings {
                    t_min: 0.0,
                    t_max: 0.0,
                    ..ok.clone()
                },
            ),
            (
                "stability_threshold",
                GenerationSettings {
                    stop: Some((usize::MAX, 0.005)),
                    ..ok.clone()
                },
            ),
            (
                "confidence_threshold",
                GenerationSettings {
                    stop: Some((1, f64::INFINITY)),
                    ..ok.clone()
                },
            ),
        ];
        for (field, s) in cases {
            match s.validate() {
                Err(EngineError::InvalidArgument { name, .. }) => assert_eq!(name, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
