//! Parity of `dg_engine::research::sampler` (and the MLX kernels of `mlx_math`) with mlx-optiq
//! 0.7.7's `optiq/vlm/_mlxvlm/generate/diffusion.py` on mlx 0.32.4 (CPU, float32).
//!
//! Goldens: `tests/fixtures/goldens/sampler.{safetensors,json}`, written by
//! `tools/reference/dump_sampler_goldens.py`, which calls the reference's own functions.
//!
//! Tolerance: none. Decisions (argmax, samples, masks, stops) must be identical, and every f32
//! (processed logits, probabilities, entropies, logsumexp, MLX's `exp`/`log`) must have the same
//! bit pattern: the implementation follows MLX's CPU kernels operation by operation (same
//! polynomial `exp`, same libm `logf`, same left-to-right f32 sums), so there is no source of
//! difference to tolerate.

mod common;

use common::key_of;
use dg_engine::research::mlx_math;
use dg_engine::research::rng::Rng;
use dg_engine::research::sampler::{self, StabilityStop};
use dg_testkit::{load_json, usizes, Tensors};
use serde_json::Value;

fn as_usize(v: &Value) -> usize {
    v.as_u64().expect("unsigned integer") as usize
}

fn bools(v: &Value) -> Vec<bool> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|b| match b {
            Value::Bool(b) => *b,
            other => other.as_i64().expect("0/1") != 0,
        })
        .collect()
}

/// A Python float written with `repr`: Rust's parser rounds correctly, so this is exact.
fn py_float(v: &Value) -> f64 {
    v.as_str()
        .expect("repr string")
        .parse()
        .expect("float repr")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn mask_of(v: &[i32]) -> Vec<bool> {
    v.iter().map(|&x| x != 0).collect()
}

/// The golden file, its JSON and the logits table, loaded once per test.
struct Golden {
    doc: Value,
    t: Tensors,
    vocab: usize,
    table: Vec<f32>,
}

impl Golden {
    fn load() -> Self {
        let doc = load_json("sampler.json");
        let t = Tensors::load("sampler.safetensors");
        let vocab = as_usize(&doc["vocab"]);
        let (shape, table) = t.f32_shaped(doc["table"].as_str().unwrap());
        assert_eq!(shape, [as_usize(&doc["table_rows"]), vocab]);
        let table = table.to_vec();
        Self {
            doc,
            t,
            vocab,
            table,
        }
    }

    fn rows(&self, rows: &[usize]) -> Vec<f32> {
        rows.iter()
            .flat_map(|&r| {
                self.table[r * self.vocab..(r + 1) * self.vocab]
                    .iter()
                    .copied()
            })
            .collect()
    }

    /// A case's logits after the schedule temperature, and that temperature.
    fn processed(&self, case: &Value) -> (Vec<f32>, f64) {
        let t = py_float(&case["temperature"]);
        let ours = sampler::linear_temperature(
            as_usize(&case["cur_step"]),
            as_usize(&case["steps"]),
            0.4,
            0.8,
        )
        .unwrap();
        assert_eq!(ours.to_bits(), t.to_bits(), "{}: temperature", case["name"]);
        let mut logits = self.rows(&usizes(&case["rows"]));
        sampler::apply_temperature(&mut logits, t);
        (logits, t)
    }
}

#[test]
fn schedule_matches_reference() {
    let g = Golden::load();
    let entries = g.doc["schedule"].as_array().unwrap();
    assert!(entries.len() > 100);
    for e in entries {
        let ours = sampler::linear_temperature(
            as_usize(&e["cur_step"]),
            as_usize(&e["steps"]),
            e["t_min"].as_f64().unwrap(),
            e["t_max"].as_f64().unwrap(),
        )
        .unwrap();
        assert_eq!(ours.to_bits(), py_float(&e["value"]).to_bits(), "{e}");
    }
}

#[test]
fn mlx_math_is_bit_exact() {
    let g = Golden::load();
    let (_, x) = g.t.f32_shaped("math_x");
    let (_, want) = g.t.f32_shaped("math_exp");
    let ours: Vec<f32> = x.iter().map(|&v| mlx_math::exp(v)).collect();
    for ((&xi, &o), &w) in x.iter().zip(&ours).zip(want) {
        assert!(
            o.to_bits() == w.to_bits() || (o.is_nan() && w.is_nan()),
            "exp({xi:e}) = {o:e}, MLX {w:e}"
        );
    }
    // MLX's exp is not libm's: make sure the golden would notice.
    let libm_differs = x
        .iter()
        .zip(want)
        .filter(|(&xi, &w)| xi.is_finite() && xi.exp().to_bits() != w.to_bits())
        .count();
    assert!(
        libm_differs > 100,
        "only {libm_differs} inputs tell exp from expf"
    );

    let (_, x) = g.t.f32_shaped("math_log_x");
    let (_, want) = g.t.f32_shaped("math_log");
    for (&xi, &w) in x.iter().zip(want) {
        let o = mlx_math::log(xi);
        assert!(o.to_bits() == w.to_bits(), "log({xi:e}) = {o:e}, MLX {w:e}");
    }

    let (shape, x) = g.t.f32_shaped("math_lse_x");
    let (_, want) = g.t.f32_shaped("math_lse");
    let ours = sampler::logsumexp_rows(x, shape[1]).unwrap();
    assert_eq!(bits(&ours), bits(want), "logsumexp");
}

#[test]
fn per_case_outputs_match_reference() {
    let g = Golden::load();
    let v = g.vocab;
    let layout = &g.doc["case_layout"];
    let taus: Vec<f64> = layout["sample_temperatures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let thresholds: Vec<f64> = layout["conf_thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let bounds: Vec<f64> = layout["entropy_bounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let probe_cols = usizes(&g.doc["probe_columns"]);
    let (mut values_checked, mut masks_checked, mut full_cases, mut forced) = (0, 0, 0, 0);
    let cases = g.doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 40);
    for (i, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        let (logits, _) = g.processed(case);
        let l = logits.len() / v;
        let p = format!("c{i}/");

        if case["full"].as_bool().unwrap() {
            full_cases += 1;
            let (_, want) = g.t.f32_shaped(&format!("{p}processed"));
            assert_eq!(bits(&logits), bits(want), "{name}: processed logits");
            let (_, probs) = sampler::entropy_and_probs(&logits, v).unwrap();
            let (_, want) = g.t.f32_shaped(&format!("{p}chain_probs"));
            assert_eq!(bits(&probs), bits(want), "{name}: entropy-chain probs");
            let soft = sampler::softmax_precise(&logits, v).unwrap();
            let (_, want) = g.t.f32_shaped(&format!("{p}softmax_probs"));
            assert_eq!(bits(&soft), bits(want), "{name}: softmax probs");
            values_checked += 3 * logits.len();
        }

        // tokens: argmax, then one sample per temperature, each from a fresh seed
        let (_, tokens) = g.t.i32_shaped(&format!("{p}tokens"));
        let tokens: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        let argmax = sampler::argmax_canvas(&logits, v).unwrap();
        assert_eq!(argmax, tokens[..l], "{name}: argmax");
        let seeds = usizes(&case["sample_seeds"]);
        let states = case["sample_states"].as_array().unwrap();
        let mut samples = Vec::new();
        for (j, &tau) in taus.iter().enumerate() {
            let mut rng = Rng::new(seeds[j] as u64);
            let s = sampler::sample_canvas(&logits, v, tau, &mut rng).unwrap();
            assert_eq!(
                s,
                tokens[(j + 1) * l..(j + 2) * l],
                "{name}: sample at {tau}"
            );
            assert_eq!(
                rng.state(),
                key_of(&states[j]),
                "{name}: rng after sample at {tau}"
            );
            samples.push(s);
        }
        let sample_07 = &samples[taus.iter().position(|&t| t == 0.7).unwrap()];

        // values
        let (shape, want) = g.t.f32_shaped(&format!("{p}values"));
        assert_eq!(shape, vec![8, l]);
        let row = |k: usize| &want[k * l..(k + 1) * l];
        let conf_argmax = sampler::token_probability(&logits, v, &argmax).unwrap();
        let conf_sample = sampler::token_probability(&logits, v, sample_07).unwrap();
        let entropy = sampler::token_entropy(&logits, v).unwrap();
        let lse = sampler::logsumexp_rows(&logits, v).unwrap();
        let (chain_entropy, chain) = sampler::entropy_and_probs(&logits, v).unwrap();
        let soft = sampler::softmax_precise(&logits, v).unwrap();
        assert_eq!(
            bits(&chain_entropy),
            bits(&entropy),
            "{name}: chain entropy"
        );
        let rowsum =
            |probs: &[f32]| -> Vec<f32> { probs.chunks_exact(v).map(mlx_math::sum).collect() };
        let at = |probs: &[f32], cols: &[u32]| -> Vec<f32> {
            probs
                .chunks_exact(v)
                .zip(cols)
                .map(|(r, &c)| r[c as usize])
                .collect()
        };
        let ours: [(&str, Vec<f32>); 8] = [
            ("confidence of argmax", conf_argmax.clone()),
            ("confidence of sample", conf_sample.clone()),
            ("token entropy", entropy.clone()),
            ("logsumexp", lse),
            ("chain row sum", rowsum(&chain)),
            ("chain at argmax", at(&chain, &argmax)),
            ("softmax row sum", rowsum(&soft)),
            ("softmax at argmax", at(&soft, &argmax)),
        ];
        for (k, (what, vals)) in ours.iter().enumerate() {
            assert_eq!(bits(vals), bits(row(k)), "{name}: {what}");
            values_checked += l;
        }
        let (_, probes) = g.t.f32_shaped(&format!("{p}probes"));
        let nc = probe_cols.len();
        for (pi, probs) in [&chain, &soft].into_iter().enumerate() {
            for r in 0..l {
                for (ci, &c) in probe_cols.iter().enumerate() {
                    let want = probes[(pi * l + r) * nc + ci];
                    assert_eq!(probs[r * v + c].to_bits(), want.to_bits(), "{name}: probe");
                }
            }
        }

        // masks: confidence (per denoiser x threshold x force_all), then entropy bounds
        let unrevealed = bools(&case["unrevealed"]);
        let (_, masks) = g.t.i32_shaped(&format!("{p}masks"));
        let mut k = 0;
        for conf in [&conf_argmax, &conf_sample] {
            for &thr in &thresholds {
                for force_all in [false, true] {
                    let ours =
                        sampler::confidence_transfer_mask(conf, &unrevealed, l, thr, force_all)
                            .unwrap();
                    let want = mask_of(&masks[k * l..(k + 1) * l]);
                    assert_eq!(ours, want, "{name}: confidence mask {thr} {force_all}");
                    let passing = (0..l).any(|i| unrevealed[i] && conf[i] >= thr as f32);
                    forced += usize::from(!force_all && !passing && want.contains(&true));
                    k += 1;
                    masks_checked += 1;
                }
            }
        }
        for &b in &bounds {
            let ours = sampler::entropy_transfer_mask(&entropy, l, b).unwrap();
            assert_eq!(
                ours,
                mask_of(&masks[k * l..(k + 1) * l]),
                "{name}: entropy mask {b}"
            );
            k += 1;
            masks_checked += 1;
        }
    }
    assert_eq!(full_cases, 1);
    assert!(values_checked > 30_000, "{values_checked}");
    assert!(masks_checked > 1000, "{masks_checked}");
    assert!(forced >= 10, "only {forced} masks exercise the forced pick");
}

/// The golden cases include confidences within a few ulp of the 0.9 threshold, on both sides.
#[test]
fn near_threshold_confidences_are_present() {
    let g = Golden::load();
    let v = g.vocab;
    let (mut below, mut above) = (0, 0);
    for case in g.doc["cases"].as_array().unwrap() {
        let (logits, _) = g.processed(case);
        let argmax = sampler::argmax_canvas(&logits, v).unwrap();
        for c in sampler::token_probability(&logits, v, &argmax).unwrap() {
            let d = c as f64 - 0.9_f64 as f32 as f64;
            below += usize::from((-2e-6..0.0).contains(&d));
            above += usize::from((0.0..2e-6).contains(&d));
        }
    }
    assert!(below >= 2 && above >= 2, "below {below}, above {above}");
}

#[test]
fn direct_masks_match_reference() {
    let g = Golden::load();
    let entries = g.doc["direct_masks"].as_array().unwrap();
    let (mut conf, mut ent) = (0, 0);
    for e in entries {
        let (shape, input) = g.t.f32_shaped(e["input"].as_str().unwrap());
        let l = shape[1];
        let (_, want) = g.t.i32_shaped(e["out"].as_str().unwrap());
        let ours = match e["kind"].as_str().unwrap() {
            "confidence" => {
                conf += 1;
                let unrevealed: Vec<bool> = e["unrevealed"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(bools)
                    .collect();
                let thr = py_float(&e["threshold"]);
                let force_all = e["force_all"].as_bool().unwrap();
                sampler::confidence_transfer_mask(input, &unrevealed, l, thr, force_all).unwrap()
            }
            _ => {
                ent += 1;
                sampler::entropy_transfer_mask(input, l, py_float(&e["bound"])).unwrap()
            }
        };
        assert_eq!(ours, mask_of(want), "{e}");
    }
    assert!(conf >= 40 && ent >= 20, "{conf} confidence, {ent} entropy");
}

#[test]
fn stop_check_matches_reference() {
    let g = Golden::load();
    let v = g.vocab;
    let cases = g.doc["cases"].as_array().unwrap();
    let mut fired = 0;
    for traj in g.doc["stop"].as_array().unwrap() {
        let decisions = bools(&traj["decisions"]);
        let mut stop = match &traj["config"] {
            Value::Null => None,
            cfg => Some(StabilityStop::new(
                cfg.get("stability_threshold")
                    .map_or(StabilityStop::DEFAULT_STABILITY_THRESHOLD, as_usize),
                cfg.get("confidence_threshold")
                    .map_or(StabilityStop::DEFAULT_CONFIDENCE_THRESHOLD, |x| {
                        x.as_f64().unwrap()
                    }),
            )),
        };
        for (step, &ci) in usizes(&traj["cases"]).iter().enumerate() {
            let (logits, _) = g.processed(&cases[ci]);
            let argmax = sampler::argmax_canvas(&logits, v).unwrap();
            let ours = match stop.as_mut() {
                Some(s) => s.check(&argmax, &logits, v).unwrap(),
                None => false,
            };
            assert_eq!(ours, decisions[step], "{} step {step}", traj["trajectory"]);
            fired += usize::from(ours);
        }
    }
    assert!(fired >= 20, "the stop check fired only {fired} times");
}

/// Token ids of a `randint(0, vocab)` draw as the sampler takes them (u32).
fn u32s(ids: Vec<i32>) -> Vec<u32> {
    ids.into_iter().map(|t| t as u32).collect()
}

/// The fake model of the loop goldens: logits of position `l` are table row
/// `loop_rows[(7 * token + 3 * l) % K]` ("token") or `loop_rows[(3 * l + 11 * block) % K]`.
fn fake_logits(
    g: &Golden,
    loop_rows: &[usize],
    mode: &str,
    canvas: &[u32],
    block: usize,
) -> Vec<f32> {
    let k = loop_rows.len();
    let rows: Vec<usize> = canvas
        .iter()
        .enumerate()
        .map(|(l, &tok)| match mode {
            "token" => loop_rows[(7 * tok as usize + 3 * l) % k],
            _ => loop_rows[(3 * l + 11 * block) % k],
        })
        .collect();
    g.rows(&rows)
}

/// The per-step algorithm of `sampler`'s module docs, written out with the fake model: every
/// canvas the reference fed its model, the emitted tokens and the final RNG state must agree.
#[test]
fn denoising_loop_matches_reference() {
    let g = Golden::load();
    let v = g.vocab;
    let loop_rows = usizes(&g.doc["loop_rows"]);
    let loops = g.doc["loops"].as_array().unwrap();
    assert!(loops.len() >= 16);
    let mut calls_checked = 0;
    for run in loops {
        let confidence = run["sampler"].as_str().unwrap() == "confidence-threshold";
        let temperature = run["temperature"].as_f64().unwrap();
        let mode = run["mode"].as_str().unwrap();
        let steps = as_usize(&run["steps"]);
        let max_canvas = as_usize(&run["canvas_length"]);
        let min_canvas = as_usize(&run["min_canvas"]).min(max_canvas);
        let max_tokens = as_usize(&run["max_tokens"]);
        let threshold = run["threshold"].as_f64().unwrap();
        let bound = run["entropy_bound"].as_f64().unwrap();
        let eos: Vec<u32> = usizes(&run["eos"]).into_iter().map(|x| x as u32).collect();
        let stop_cfg = &run["generation_config"]["diffusion_stopping_config"];
        let mut stop = stop_cfg.is_object().then(|| {
            StabilityStop::new(
                as_usize(&stop_cfg["stability_threshold"]),
                stop_cfg["confidence_threshold"].as_f64().unwrap(),
            )
        });

        let mut rng = Rng::new(run["seed"].as_u64().unwrap());
        let mut calls: Vec<Vec<u32>> = Vec::new();
        let mut emitted = Vec::new();
        let mut generated = 0;
        let mut finish = "length";
        let mut block = 0;
        'blocks: while generated < max_tokens {
            let l = max_canvas.min((max_tokens - generated).max(min_canvas));
            let mut current = u32s(rng.randint(0, v as i32, &[1, l]).unwrap());
            let mut revealed = vec![false; l];
            let mut draft = current.clone();
            let mut argmax = current.clone();
            if let Some(s) = stop.as_mut() {
                s.reset();
            }
            for cur_step in (1..=steps).rev() {
                calls.push(current.clone());
                let mut logits = fake_logits(&g, &loop_rows, mode, &current, block);
                let t = sampler::linear_temperature(cur_step, steps, 0.4, 0.8).unwrap();
                sampler::apply_temperature(&mut logits, t);
                argmax = sampler::argmax_canvas(&logits, v).unwrap();
                if cur_step == 1 {
                    break;
                }
                let denoiser = if temperature <= 0.0 {
                    argmax.clone()
                } else {
                    sampler::sample_canvas(&logits, v, temperature, &mut rng).unwrap()
                };
                if confidence {
                    let conf = sampler::token_probability(&logits, v, &denoiser).unwrap();
                    let unrevealed: Vec<bool> = revealed.iter().map(|r| !r).collect();
                    let accept = sampler::confidence_transfer_mask(
                        &conf,
                        &unrevealed,
                        l,
                        threshold,
                        cur_step == 1,
                    )
                    .unwrap();
                    let noise = u32s(rng.randint(0, v as i32, &[1, l]).unwrap());
                    let (_, next) = sampler::confidence_update(
                        &accept,
                        &denoiser,
                        &noise,
                        &mut revealed,
                        &mut draft,
                    )
                    .unwrap();
                    current = next;
                    if revealed.iter().all(|&r| r) {
                        break;
                    }
                } else {
                    let (entropy, _probs) = sampler::entropy_and_probs(&logits, v).unwrap();
                    let accept = sampler::entropy_transfer_mask(&entropy, l, bound).unwrap();
                    let noise = u32s(rng.randint(0, v as i32, &[1, l]).unwrap());
                    let (_, next) =
                        sampler::entropy_bound_update(&accept, &denoiser, &current, &noise)
                            .unwrap();
                    current = next;
                }
                if let Some(s) = stop.as_mut() {
                    if s.check(&argmax, &logits, v).unwrap() {
                        break;
                    }
                }
            }
            for &tok in &argmax {
                generated += 1;
                if eos.contains(&tok) {
                    finish = "stop";
                    break 'blocks;
                }
                emitted.push(tok);
                if generated >= max_tokens {
                    finish = "length";
                    break 'blocks;
                }
            }
            block += 1;
        }

        let want_calls: Vec<Vec<u32>> = run["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| usizes(c).into_iter().map(|x| x as u32).collect())
            .collect();
        let what = format!(
            "{} t={temperature} {mode} stop={} seed {}",
            run["sampler"],
            stop.is_some(),
            run["seed"]
        );
        assert_eq!(calls.len(), want_calls.len(), "{what}: model calls");
        for (n, (ours, want)) in calls.iter().zip(&want_calls).enumerate() {
            assert_eq!(ours, want, "{what}: canvas of call {n}");
        }
        calls_checked += calls.len();
        let want_emitted: Vec<u32> = usizes(&run["emitted"])
            .into_iter()
            .map(|x| x as u32)
            .collect();
        assert_eq!(emitted, want_emitted, "{what}: emitted tokens");
        assert_eq!(
            generated,
            as_usize(&run["generation_tokens"]),
            "{what}: token count"
        );
        assert_eq!(
            finish,
            run["finish_reason"].as_str().unwrap(),
            "{what}: finish reason"
        );
        assert_eq!(
            rng.state(),
            key_of(&run["state_after"]),
            "{what}: final RNG state"
        );
    }
    assert!(calls_checked > 200, "{calls_checked}");
}
