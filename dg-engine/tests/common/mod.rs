//! The engine's side of the goldens (requests and generations of `generate_tiny.json`); the
//! files themselves load through dg-testkit. (Each test binary uses a different subset.)
#![allow(dead_code)]

use dg_engine::research::rng::Key;
use dg_engine::{
    Defaults, Event, FinishReason, Generation, GenerationSettings, Message, Request, Sampler,
};
use serde_json::Value;

use dg_testkit::{ids, load_json, usizes};

pub fn key_of(v: &Value) -> Key {
    let k = usizes(v);
    [k[0] as u32, k[1] as u32]
}

/// The cases of generate_tiny.json (the `tiny` fixture).
pub fn goldens() -> Vec<Value> {
    load_json("generate_tiny.json")["cases"]
        .as_array()
        .unwrap()
        .clone()
}

/// The request a golden case describes.
pub fn golden_request(case: &Value) -> Request {
    let prompt = &case["prompt"];
    let mut r = match prompt["kind"].as_str().unwrap() {
        "text" => Request::text(prompt["text"].as_str().unwrap()),
        "chat" => Request::chat(
            prompt["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect(),
        ),
        other => panic!("unknown prompt kind {other}"),
    };
    let o = &case["options"];
    r.max_tokens = o["max_tokens"].as_u64().unwrap() as usize;
    r.temperature = o["temperature"].as_f64().unwrap() as f32;
    r.seed = o["seed"].as_u64().unwrap();
    r.steps = o.get("steps").and_then(Value::as_u64).map(|s| s as usize);
    r.min_canvas = o
        .get("min_canvas")
        .and_then(Value::as_u64)
        .map(|s| s as usize);
    r.max_canvas = o
        .get("max_canvas")
        .and_then(Value::as_u64)
        .map(|s| s as usize);
    r.sampler = match o["sampler"].as_str().unwrap() {
        "confidence-threshold" => Sampler::ConfidenceThreshold {
            threshold: o.get("threshold").and_then(Value::as_f64).unwrap_or(0.9) as f32,
        },
        "entropy-bound" => Sampler::EntropyBound { bound: None },
        other => panic!("unknown sampler {other}"),
    };
    // The reference reads only a generation config set on the model config.
    r.defaults = match o.get("generation_config") {
        Some(g) => Defaults::Custom(GenerationSettings::resolve(Some(g)).unwrap()),
        None => Defaults::Reference,
    };
    r
}

/// What a streamed generation showed: block 1's per-step revealed masks, and (block, steps)
/// of each block end.
#[derive(Default)]
pub struct Seen {
    accepts: Vec<Vec<bool>>,
    blocks: Vec<(usize, usize)>,
}

impl Seen {
    pub fn record(&mut self, e: Event) {
        match e {
            Event::Draft {
                block: 1, revealed, ..
            } => self.accepts.push(revealed),
            Event::BlockEnd { block, steps, .. } => self.blocks.push((block, steps)),
            _ => {}
        }
    }
}

/// Compares one generation with its golden case exactly.
pub fn check_generation(case: &Value, gen: &Generation, seen: &Seen) {
    let name = case["name"].as_str().unwrap();
    let req = golden_request(case);
    let out = &case["outputs"];
    assert_eq!(
        gen.token_ids,
        ids(&out["emitted_ids"]),
        "{name}: emitted ids"
    );
    let finish = match out["finish_reason"].as_str().unwrap() {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        other => panic!("{other}"),
    };
    assert_eq!(gen.finish_reason, finish, "{name}: finish reason");
    assert_eq!(
        gen.stats.generated_tokens as u64,
        out["generation_tokens"].as_u64().unwrap(),
        "{name}: generation tokens"
    );
    let blocks = out["blocks"].as_array().unwrap();
    let steps: Vec<usize> = blocks
        .iter()
        .map(|b| b["steps"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(gen.stats.steps_per_block, steps, "{name}: steps per block");
    assert_eq!(gen.stats.canvases, blocks.len(), "{name}: canvases");
    assert_eq!(
        gen.stats.canvas_tokens as u64,
        out["canvas_tokens"].as_u64().unwrap(),
        "{name}: canvas tokens"
    );
    assert_eq!(seen.blocks.len(), blocks.len(), "{name}: block events");

    // Per-step accept masks (block 1), when recorded.
    if let Some(per_step) = blocks[0].get("per_step").and_then(Value::as_array) {
        let confidence = matches!(req.sampler, Sampler::ConfidenceThreshold { .. });
        let mut revealed = vec![false; per_step[0]["canvas_in"].as_array().unwrap().len()];
        let mut step_masks = Vec::new();
        for s in per_step
            .iter()
            .filter_map(|s| s.get("accept").and_then(Value::as_str))
        {
            let accept: Vec<bool> = s.chars().map(|c| c == '1').collect();
            if confidence {
                for (r, a) in revealed.iter_mut().zip(&accept) {
                    *r |= a;
                }
                step_masks.push(revealed.clone());
            } else {
                step_masks.push(accept);
            }
        }
        assert_eq!(seen.accepts, step_masks, "{name}: per-step accept masks");
    }
}
