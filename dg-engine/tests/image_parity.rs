//! Image prompts, token for token against the float32 reference's public
//! `stream_generate(model, tokenizer, prompt, images=[...])` on both vision layouts (inline 4-bit
//! tower, bf16 sidecar). Goldens: tests/fixtures/goldens/generate_images.json
//! (tools/reference/dump_image_generation_goldens.py); every case keeps its trajectory under
//! +-1 f32 ulp noise on 1% of the reference's quantized-matmul outputs.
#![cfg(feature = "vision")]

use dg_engine::{DiffusionGemma, FinishReason, Generation, Image, Request, Sampler};
use serde_json::Value;

use dg_testkit::{fixtures, ids, load_json};

fn image_cases() -> Vec<Value> {
    load_json("generate_images.json")["cases"]
        .as_array()
        .unwrap()
        .clone()
}

fn case_name(case: &Value) -> String {
    format!(
        "{}/{}",
        case["fixture"].as_str().unwrap(),
        case["name"].as_str().unwrap()
    )
}

fn image_request(case: &Value) -> Request {
    let images: Vec<Image> = case["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| Image::Path(fixtures().join("images").join(i["file"].as_str().unwrap())))
        .collect();
    let o = &case["options"];
    let mut req = Request::with_images(case["prompt"]["text"].as_str().unwrap(), images);
    req.max_tokens = o["max_tokens"].as_u64().unwrap() as usize;
    req.temperature = o["temperature"].as_f64().unwrap() as f32;
    req.seed = o["seed"].as_u64().unwrap();
    req.sampler = match o["sampler"].as_str().unwrap() {
        "confidence-threshold" => Sampler::ConfidenceThreshold { threshold: 0.9 },
        _ => Sampler::EntropyBound { bound: None },
    };
    req.defaults = dg_engine::Defaults::Reference;
    req
}

/// Emitted ids, finish reason, token count and steps per block, exactly.
fn check_generation(name: &str, case: &Value, gen: &Generation) {
    let out = &case["outputs"];
    assert_eq!(
        gen.token_ids,
        ids(&out["emitted_ids"]),
        "{name}: emitted ids"
    );
    let finish = if out["finish_reason"] == "stop" {
        FinishReason::Stop
    } else {
        FinishReason::Length
    };
    assert_eq!(gen.finish_reason, finish, "{name}: finish reason");
    assert_eq!(
        gen.stats.generated_tokens as u64,
        out["generation_tokens"].as_u64().unwrap(),
        "{name}"
    );
    let steps: Vec<usize> = out["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["steps"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(gen.stats.steps_per_block, steps, "{name}: steps per block");
}

#[test]
fn image_generations_match_reference() {
    let cases = image_cases();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    let mut models = std::collections::HashMap::new();
    for case in &cases {
        let name = case_name(case);
        let fixture = case["fixture"].as_str().unwrap().to_owned();
        let model = models.entry(fixture.clone()).or_insert_with(|| {
            DiffusionGemma::load(fixtures().join("models").join(&fixture)).unwrap()
        });
        let req = image_request(case);
        let prepared = model.prepare_prompt(&req).unwrap();
        assert_eq!(
            prepared.ids,
            ids(&case["prompt"]["input_ids"]),
            "{name}: expanded prompt ids"
        );
        assert_eq!(
            prepared.token_types,
            ids(&case["prompt"]["mm_token_type_ids"]),
            "{name}: token types"
        );
        let counts: Vec<usize> = prepared.features.iter().map(|f| f.tokens).collect();
        let golden_counts: Vec<usize> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["soft_tokens"].as_u64().unwrap() as usize)
            .collect();
        assert_eq!(counts, golden_counts, "{name}: soft tokens per image");

        let gen = model
            .generate(&req)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_generation(&name, case, &gen);
    }
}

/// All image cases of a fixture in one batch, beside a text-only request: each sequence's
/// image blocks (bidirectional within themselves) must stay its own.
#[test]
fn batched_image_generations_match_reference() {
    let cases = image_cases();
    let fixture = cases[0]["fixture"].as_str().unwrap();
    let model = DiffusionGemma::load(fixtures().join("models").join(fixture)).unwrap();
    let batch: Vec<&Value> = cases.iter().filter(|c| c["fixture"] == fixture).collect();
    assert!(batch.len() >= 4, "{} cases", batch.len());
    let mut requests: Vec<Request> = batch.iter().map(|c| image_request(c)).collect();
    let text_only = Request::with_images(batch[0]["prompt"]["text"].as_str().unwrap(), vec![]);
    let alone = model.generate(&text_only).unwrap();
    requests.insert(1, text_only);
    let gens = model.generate_batch(&requests).unwrap();
    assert_eq!(
        gens[1].token_ids, alone.token_ids,
        "text-only request in the batch"
    );
    for (case, gen) in batch
        .iter()
        .zip(gens.iter().take(1).chain(gens.iter().skip(2)))
    {
        check_generation(&format!("batched {}", case_name(case)), case, gen);
    }
}

#[test]
fn image_errors_are_named() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny-vision")).unwrap();
    let img = |f: &str| Image::Path(fixtures().join("images").join(f));
    // More images than placeholders.
    let mut req = Request::text("no placeholder here");
    req.images = vec![img("normal.png")];
    assert!(model
        .generate(&req)
        .unwrap_err()
        .to_string()
        .contains("placeholder"));
    // Not an image, truncated, missing.
    for bad in ["not_an_image.txt", "truncated.png", "does_not_exist.png"] {
        let req = Request::with_images("x", vec![img(bad)]);
        let err = model.generate(&req).unwrap_err().to_string();
        assert!(err.contains(bad), "{bad}: {err}");
    }
    // A text-only checkpoint refuses images.
    let text_only = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let err = text_only
        .generate(&Request::with_images("x", vec![img("normal.png")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("vision"), "{err}");
}
