//! Generation, token for token against the float32 reference (mlx-optiq 0.7.7's
//! `stream_diffusion_generate` as its public `generate` runs it), on the `tiny` fixture.
//!
//! Goldens: tests/fixtures/goldens/generate_tiny.json (tools/reference/dump_generation_goldens.py).
//! Every case there was checked to keep its exact trajectory under +-1 f32 ulp noise on 1% of
//! the reference's quantized-matmul outputs (check_fixture_stability.py), so a mismatch here
//! is a bug, not chaos. Compared exactly: emitted ids, the EOS-inclusive token count, finish
//! reason, canvases, steps per block, and for the per-step cases each step's accept mask.

use std::ops::ControlFlow;

use dg_engine::{DiffusionGemma, EngineError, Event, FinishReason, Prompt, Request, Sampler};
use serde_json::Value;

mod common;

use common::{check_generation, golden_request as request, goldens, Seen};
use dg_testkit::{fixtures, ids};

#[test]
fn generations_match_reference_token_for_token() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).expect("load tiny");
    let cases = goldens();
    assert!(cases.len() >= 15, "golden file has {} cases", cases.len());
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let req = request(case);
        // The prompt ids we build must be the reference's (text encoding, chat template).
        assert_eq!(
            model.prompt_ids(&req.prompt).unwrap(),
            ids(&case["prompt"]["ids"]),
            "{name}: prompt ids"
        );
        let mut seen = Seen::default();
        let gen = model
            .generate_stream(&req, |e| {
                seen.record(e);
                ControlFlow::Continue(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_generation(case, &gen, &seen);
    }
}

/// Every golden case in one batch (ragged prompts, both samplers, several temperatures,
/// canvas lengths, block counts and stops): each must still match the reference exactly.
#[test]
fn batched_generations_match_reference_token_for_token() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).expect("load tiny");
    let cases = goldens();
    let requests: Vec<Request> = cases.iter().map(request).collect();
    let mut seen: Vec<Seen> = cases.iter().map(|_| Seen::default()).collect();
    let gens = model
        .generate_batch_stream(&requests, |i, e| {
            seen[i].record(e);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(gens.len(), cases.len());
    let lengths: std::collections::BTreeSet<usize> =
        gens.iter().map(|g| g.stats.prompt_tokens).collect();
    assert!(lengths.len() > 1, "the batch is ragged");
    for ((case, gen), seen) in cases.iter().zip(&gens).zip(&seen) {
        check_generation(case, gen, seen);
    }
}

/// A batch whose prompts all have the same length (no row needs padding): the masks must be
/// applied all the same (a past bug skipped them), so each matches the reference.
#[test]
fn equal_length_batch_matches_reference() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let cases = goldens();
    let mut by_length: std::collections::BTreeMap<usize, Vec<&Value>> = Default::default();
    for case in &cases {
        by_length
            .entry(ids(&case["prompt"]["ids"]).len())
            .or_default()
            .push(case);
    }
    let group = by_length
        .values()
        .filter(|g| g.len() >= 2)
        .max_by_key(|g| g.len())
        .expect("golden cases with equal prompt lengths");
    let requests: Vec<Request> = group.iter().map(|c| request(c)).collect();
    let gens = model.generate_batch(&requests).unwrap();
    for (case, gen) in group.iter().zip(&gens) {
        let name = case["name"].as_str().unwrap();
        assert_eq!(
            gen.token_ids,
            ids(&case["outputs"]["emitted_ids"]),
            "{name} in an equal-length batch of {}",
            group.len()
        );
    }
}

#[test]
fn cancelling_one_request_of_a_batch_leaves_the_others() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let cases = goldens();
    let requests: Vec<Request> = cases.iter().take(3).map(request).collect();
    let mut drafts = 0;
    let gens = model
        .generate_batch_stream(&requests, |i, e| {
            if i == 1 && matches!(e, Event::Draft { .. }) {
                drafts += 1;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(drafts, 1, "no step of request 1 ran after it was cancelled");
    assert_eq!(gens[1].finish_reason, FinishReason::Cancelled);
    for i in [0, 2] {
        assert_eq!(gens[i].token_ids, ids(&cases[i]["outputs"]["emitted_ids"]));
    }
}

#[test]
fn batch_errors_name_the_request() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    assert!(model.generate_batch(&[]).unwrap().is_empty());
    let mut bad = Request::tokens(vec![5]);
    bad.temperature = f32::NAN;
    let err = model
        .generate_batch(&[Request::tokens(vec![5]), bad])
        .unwrap_err();
    assert!(
        matches!(err, EngineError::Request { index: 1, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with("request 1: temperature"),
        "{err}"
    );
    let err = model
        .generate_batch(&[Request::tokens(vec![1, 2, 100_000])])
        .unwrap_err();
    assert!(err.to_string().starts_with("request 0:"), "{err}");
}

#[test]
fn same_tokens_with_one_and_two_threads() {
    let one = DiffusionGemma::builder(fixtures().join("models/tiny"))
        .threads(1)
        .load()
        .unwrap();
    let two = DiffusionGemma::builder(fixtures().join("models/tiny"))
        .threads(2)
        .load()
        .unwrap();
    for case in goldens().iter().take(4) {
        let req = request(case);
        assert_eq!(
            one.generate(&req).unwrap().token_ids,
            two.generate(&req).unwrap().token_ids
        );
    }
}

#[test]
fn cancellation_stops_within_one_step() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let mut req = Request::tokens(vec![10, 11, 12]);
    req.sampler = Sampler::EntropyBound { bound: None };
    req.max_tokens = 64;
    let mut drafts = 0;
    let gen = model
        .generate_stream(&req, |e| {
            if let Event::Draft { .. } = e {
                drafts += 1;
                if drafts == 3 {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(gen.finish_reason, FinishReason::Cancelled);
    assert_eq!(drafts, 3, "no step ran after the callback asked to stop");
    assert!(gen.token_ids.is_empty());
}

#[test]
fn bad_requests_are_named_errors() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let mut req = Request::tokens(vec![1, 2, 100_000]);
    let err = model.generate(&req).unwrap_err().to_string();
    assert!(err.contains("100000"), "{err}");
    req.prompt = Prompt::Tokens(vec![]);
    assert!(model
        .generate(&req)
        .unwrap_err()
        .to_string()
        .contains("prompt"));
    req.prompt = Prompt::Tokens(vec![5]);
    req.temperature = -1.0;
    assert!(model
        .generate(&req)
        .unwrap_err()
        .to_string()
        .contains("temperature"));
    req.temperature = 0.0;
    req.sampler = Sampler::ConfidenceThreshold { threshold: 1.5 };
    assert!(model
        .generate(&req)
        .unwrap_err()
        .to_string()
        .contains("threshold"));
}

#[test]
fn one_model_serves_several_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<DiffusionGemma>();
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let cases = goldens();
    std::thread::scope(|s| {
        for case in cases.iter().take(3) {
            let model = &model;
            s.spawn(move || {
                let gen = model.generate(&request(case)).unwrap();
                assert_eq!(gen.token_ids, ids(&case["outputs"]["emitted_ids"]));
            });
        }
    });
}

#[test]
fn break_on_a_text_event_stops_delivery_at_once() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let case = &goldens()[0];
    let mut events_after = 0;
    let mut first = None;
    let gen = model
        .generate_stream(&request(case), |e| {
            if first.is_some() {
                events_after += 1;
            }
            if let Event::Text(t) = e {
                first.get_or_insert(t);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(events_after, 0, "no event after the Break");
    assert_eq!(gen.finish_reason, FinishReason::Cancelled);
    assert_eq!(Some(gen.text), first, "the result holds what was delivered");
}

#[test]
fn custom_settings_and_steps_are_checked_like_the_checkpoint_s() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let settings = dg_engine::GenerationSettings {
        t_min: 0.0,
        t_max: 0.0,
        ..Default::default()
    };
    let req = Request::tokens(vec![5]).defaults(dg_engine::Defaults::Custom(settings));
    let err = model.generate(&req).unwrap_err().to_string();
    assert!(err.contains("t_max"), "{err}");
    let req = Request::tokens(vec![5]).steps(dg_engine::MAX_DENOISING_STEPS + 1);
    let err = model.generate(&req).unwrap_err().to_string();
    assert!(err.starts_with("steps: 1025 is not in 1..=1024"), "{err}");
}
