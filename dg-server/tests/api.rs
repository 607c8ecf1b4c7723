//! Every route over raw HTTP/1.1 against the `tiny` fixture: response shapes, stream framing
//! byte by byte, usage counts, and the text: streamed == non-streamed ==
//! `DiffusionGemma::generate` for the same request and seed (and the reference's goldens).

mod common;

use std::sync::Arc;

use common::{load, openai_chunks, sse_events, TestServer};
use dg_engine::{
    Defaults, DiffusionGemma, FinishReason, Message, Request, Sampler, SchedulerOptions,
};
use dg_server::ServerOptions;
use dg_testkit::fixtures;
use serde_json::{json, Value};

fn tiny() -> Arc<DiffusionGemma> {
    load(&fixtures().join("models/tiny"))
}

fn start(model: &Arc<DiffusionGemma>) -> TestServer {
    TestServer::start(model, ServerOptions::default(), SchedulerOptions::default())
}

fn chat_text(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The text of an OpenAI chat stream, checking its chunk sequence: a role chunk first, content
/// deltas, one finish chunk, and a usage chunk when asked.
fn streamed_chat(chunks: &[Value], include_usage: bool) -> (String, String, Option<Value>) {
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c["id"], id, "one id per stream");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            c.get("usage").is_some(),
            include_usage,
            "usage key iff asked"
        );
        let choices = c["choices"].as_array().unwrap();
        if choices.is_empty() {
            assert!(
                include_usage && i == chunks.len() - 1,
                "the usage chunk is last"
            );
            usage = Some(c["usage"].clone());
            continue;
        }
        assert!(finish.is_none(), "nothing after the finish chunk but usage");
        if let Some(delta) = choices[0]["delta"]["content"].as_str() {
            text.push_str(delta);
        }
        if let Some(f) = choices[0]["finish_reason"].as_str() {
            assert_eq!(choices[0]["delta"], json!({}));
            finish = Some(f.to_string());
        }
    }
    (text, finish.expect("a finish chunk"), usage)
}

#[test]
fn health_models_metrics_and_unknown_routes() {
    let model = tiny();
    let s = start(&model);

    let r = s.get("/health");
    assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));

    let r = s.get("/v1/models");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "diffusiongemma");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(
        s.get("/v1/models/diffusiongemma").json()["id"],
        "diffusiongemma"
    );
    let r = s.get("/v1/models/gpt-9");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["param"], "model");

    let r = s.get("/v1/nothing");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = s.get("/v1/chat/completions");
    assert_eq!(r.status, 405);
    assert!(r.json()["error"]["message"].is_string());
    let r = s.get("/v1/messages");
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["type"], "error", "Anthropic shape on its route");

    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}),
    );
    assert_eq!(r.status, 200);
    let usage = r.json()["usage"].clone();
    let r = s.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = r.text();
    for series in [
        "dg_model_loaded 1",
        "dg_requests_total{endpoint=\"chat_completions\",outcome=\"ok\"} 1",
        "dg_requests_total{endpoint=\"messages\",outcome=\"ok\"} 0",
        "dg_scheduler_running 0",
        "dg_scheduler_queued 0",
        "dg_request_duration_seconds_count{endpoint=\"chat_completions\"} 1",
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
    }
    assert_eq!(
        s.metric("dg_prompt_tokens_total"),
        usage["prompt_tokens"].as_f64()
    );
    assert_eq!(
        s.metric("dg_generated_tokens_total"),
        usage["completion_tokens"].as_f64()
    );
    assert!(s.metric("dg_denoising_steps_total").unwrap() >= 1.0);
    assert!(s.metric("dg_scheduler_rounds_total").unwrap() >= 1.0);
    // Every line is a comment or `name{labels} value`.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').unwrap();
        value.parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
    }
    s.stop().unwrap();
}

#[test]
fn chat_streamed_equals_non_streamed_equals_generate() {
    let model = tiny();
    let s = start(&model);
    let messages = json!([
        {"role": "system", "content": "You are tiny."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]);
    for (seed, temperature, sampler) in [
        (0u64, 0.0f32, "confidence-threshold"),
        (3, 0.7, "confidence-threshold"),
        (5, 0.0, "entropy-bound"),
    ] {
        let body = json!({
            "model": "anything",
            "messages": messages,
            "max_tokens": 40,
            "seed": seed,
            "temperature": temperature,
            "sampler": sampler,
        });
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = r.json();
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "diffusiongemma");
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        let text = chat_text(&v);

        let mut request = Request::chat(vec![
            Message::system("You are tiny."),
            Message::user("Why is the sky blue?"),
        ]);
        request.max_tokens = 40;
        request.seed = seed;
        request.temperature = temperature;
        if sampler == "entropy-bound" {
            request.sampler = Sampler::EntropyBound { bound: None };
        }
        let g = model.generate(&request).unwrap();
        assert_eq!(text, g.text, "seed {seed}: server == generate");
        let finish = match g.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            other => panic!("{other:?}"),
        };
        assert_eq!(v["choices"][0]["finish_reason"], finish);
        let usage = &v["usage"];
        assert_eq!(usage["prompt_tokens"], g.stats.prompt_tokens);
        assert_eq!(usage["completion_tokens"], g.stats.generated_tokens);
        assert_eq!(
            usage["total_tokens"],
            g.stats.prompt_tokens + g.stats.generated_tokens
        );

        for include_usage in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(true);
            if include_usage {
                body["stream_options"] = json!({"include_usage": true});
            }
            let r = s.post("/v1/chat/completions", &body);
            let (streamed, streamed_finish, streamed_usage) =
                streamed_chat(&openai_chunks(&r), include_usage);
            assert_eq!(streamed, text, "seed {seed}: streamed == non-streamed");
            assert_eq!(streamed_finish, finish);
            if include_usage {
                assert_eq!(streamed_usage.unwrap(), *usage);
            }
        }
    }
    s.stop().unwrap();
}

#[test]
fn drafts_are_sse_comments_between_chunks() {
    let model = tiny();
    let s = start(&model);
    let body = json!({
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 24,
        "stream": true,
        "drafts": true,
    });
    let r = s.post("/v1/chat/completions", &body);
    let text = r.text();
    let drafts: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix(": draft "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(!drafts.is_empty(), "drafts in\n{text}");
    assert_eq!(drafts[0]["block"], 1);
    assert_eq!(drafts[0]["step"], 1);
    for d in &drafts {
        assert!(d["total_steps"].as_u64().unwrap() >= d["step"].as_u64().unwrap());
        assert!(d["revealed"].as_u64().unwrap() <= d["canvas_length"].as_u64().unwrap());
        assert!(d["text"].is_string());
    }
    // The chunks around them are what a stream without drafts has.
    let with = streamed_chat(&openai_chunks(&r), false);
    let mut plain = body.clone();
    plain["drafts"] = json!(false);
    let r = s.post("/v1/chat/completions", &plain);
    assert!(!r.text().contains(": draft"));
    assert_eq!(streamed_chat(&openai_chunks(&r), false), with);
}

/// A golden case the server can express: a text or chat prompt and public options.
fn golden_body(case: &Value) -> Option<(String, Value)> {
    let o = &case["options"];
    if o.get("generation_config").is_some() {
        return None;
    }
    let mut body = json!({
        "max_tokens": o["max_tokens"],
        "temperature": o["temperature"],
        "seed": o["seed"],
        "sampler": o["sampler"],
        "defaults": "reference",
    });
    for key in ["steps", "min_canvas", "max_canvas", "threshold"] {
        if let Some(v) = o.get(key) {
            body[key] = v.clone();
        }
    }
    let prompt = &case["prompt"];
    match prompt["kind"].as_str().unwrap() {
        "text" => {
            body["prompt"] = prompt["text"].clone();
            Some(("/v1/completions".into(), body))
        }
        "chat" => {
            body["messages"] = prompt["messages"].clone();
            Some(("/v1/chat/completions".into(), body))
        }
        _ => None,
    }
}

#[test]
fn completions_match_the_reference_goldens() {
    let model = tiny();
    let s = start(&model);
    let goldens: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("goldens/generate_tiny.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for case in goldens["cases"].as_array().unwrap() {
        if case["fixture"] != "tiny" {
            continue;
        }
        let Some((path, body)) = golden_body(case) else {
            continue;
        };
        let name = case["name"].as_str().unwrap();
        let out = &case["outputs"];
        let r = s.post(&path, &body);
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        let v = r.json();
        let text = if path == "/v1/completions" {
            assert_eq!(v["object"], "text_completion");
            v["choices"][0]["text"].as_str().unwrap().to_string()
        } else {
            chat_text(&v)
        };
        // The golden tokens, decoded as generation decodes them.
        let ids: Vec<u32> = out["emitted_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect();
        let mut request = match path.as_str() {
            "/v1/completions" => Request::text(case["prompt"]["text"].as_str().unwrap()),
            _ => Request::chat(serde_json::from_value(case["prompt"]["messages"].clone()).unwrap()),
        };
        request.defaults = Defaults::Reference;
        request.max_tokens = body["max_tokens"].as_u64().unwrap() as usize;
        request.seed = body["seed"].as_u64().unwrap();
        request.temperature = body["temperature"].as_f64().unwrap() as f32;
        request.steps = body.get("steps").map(|v| v.as_u64().unwrap() as usize);
        request.min_canvas = body.get("min_canvas").map(|v| v.as_u64().unwrap() as usize);
        request.max_canvas = body.get("max_canvas").map(|v| v.as_u64().unwrap() as usize);
        request.sampler = match body["sampler"].as_str().unwrap() {
            "entropy-bound" => Sampler::EntropyBound { bound: None },
            _ => Sampler::ConfidenceThreshold {
                threshold: body
                    .get("threshold")
                    .map_or(0.9, |t| t.as_f64().unwrap() as f32),
            },
        };
        let g = model.generate(&request).unwrap();
        assert_eq!(g.token_ids, ids, "{name}: generate == golden tokens");
        assert_eq!(text, g.text, "{name}: server text == generate text");
        assert_eq!(
            v["usage"]["completion_tokens"], out["generation_tokens"],
            "{name}: completion tokens"
        );
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
            case["prompt"]["ids"].as_array().unwrap().len(),
            "{name}: prompt tokens"
        );
        assert_eq!(
            v["choices"][0]["finish_reason"], out["finish_reason"],
            "{name}: finish reason"
        );

        // Streamed, byte-level framing, same text.
        let mut body = body.clone();
        body["stream"] = json!(true);
        let chunks = openai_chunks(&s.post(&path, &body));
        let streamed: String = chunks
            .iter()
            .filter_map(|c| {
                c["choices"][0]["text"]
                    .as_str()
                    .or(c["choices"][0]["delta"]["content"].as_str())
            })
            .collect();
        assert_eq!(streamed, text, "{name}: streamed == non-streamed");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} golden cases checked");
    s.stop().unwrap();
}

#[test]
fn completions_take_token_ids() {
    let model = tiny();
    let s = start(&model);
    let ids = [65u32, 13, 25, 92, 195, 22];
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 12, "seed": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut request = Request::tokens(ids.to_vec());
    request.max_tokens = 12;
    request.seed = 2;
    let g = model.generate(&request).unwrap();
    assert_eq!(r.json()["choices"][0]["text"], g.text);
    assert_eq!(r.json()["usage"]["prompt_tokens"], 6);
}

/// An Anthropic stream: the exact event sequence, each event's data typed as its name.
fn anthropic_stream(r: &common::Reply) -> (Value, String, Value) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&r.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for (name, d) in names.iter().zip(&data) {
        assert_eq!(d["type"], *name, "event name == data type");
    }
    let n = names.len();
    assert_eq!(
        &names[..3],
        ["message_start", "content_block_start", "ping"]
    );
    assert!(names[3..n - 3].iter().all(|&x| x == "content_block_delta"));
    assert_eq!(
        &names[n - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let start = data[0]["message"].clone();
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["content"], json!([]));
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        data[1]["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = data[3..n - 3]
        .iter()
        .map(|d| {
            assert_eq!(d["index"], 0);
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_string()
        })
        .collect();
    (start, text, data[n - 2].clone())
}

#[test]
fn anthropic_messages_stream_and_not() {
    let model = tiny();
    let s = start(&model);
    let body = json!({
        "model": "claude-whatever",
        "max_tokens": 40,
        "system": "You are tiny.",
        "messages": [{"role": "user", "content": "Why is the sky blue?"}],
    });
    let r = s.post("/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["content"][0]["type"], "text");
    let text = v["content"][0]["text"].as_str().unwrap().to_string();

    // The same conversation as OpenAI chat gives the same text, and generate() too.
    let chat = s.post(
        "/v1/chat/completions",
        &json!({
            "max_tokens": 40,
            "messages": [
                {"role": "system", "content": "You are tiny."},
                {"role": "user", "content": "Why is the sky blue?"},
            ],
        }),
    );
    assert_eq!(chat_text(&chat.json()), text);
    let mut request = Request::chat(vec![
        Message::system("You are tiny."),
        Message::user("Why is the sky blue?"),
    ]);
    request.max_tokens = 40;
    let g = model.generate(&request).unwrap();
    assert_eq!(text, g.text);
    let stop_reason = match g.finish_reason {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
        other => panic!("{other:?}"),
    };
    assert_eq!(v["stop_reason"], stop_reason);
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(v["usage"]["input_tokens"], g.stats.prompt_tokens);
    assert_eq!(v["usage"]["output_tokens"], g.stats.generated_tokens);

    // System as text blocks, content as blocks: the same prompt.
    let mut blocks = body.clone();
    blocks["system"] = json!([{"type": "text", "text": "You are tiny."}]);
    blocks["messages"][0]["content"] = json!([{"type": "text", "text": "Why is the sky blue?"}]);
    assert_eq!(
        s.post("/v1/messages", &blocks).json()["content"][0]["text"],
        text
    );

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (start, streamed, delta) = anthropic_stream(&s.post("/v1/messages", &streaming));
    assert_eq!(streamed, text);
    assert_eq!(start["usage"]["input_tokens"], g.stats.prompt_tokens);
    assert_eq!(delta["delta"]["stop_reason"], stop_reason);
    assert_eq!(delta["usage"]["output_tokens"], g.stats.generated_tokens);
    s.stop().unwrap();
}

#[test]
fn stop_strings_cut_the_text() {
    let model = tiny();
    let s = start(&model);
    let base = json!({"prompt": "Why is the sky blue? Because", "max_tokens": 40, "seed": 1});
    let full = s.post("/v1/completions", &base).json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 12, "a long enough answer: {full:?}");
    // A stop string from the middle of the answer: the text ends right before its first
    // occurrence.
    let stop: String = chars[8..11].iter().collect();
    let cut = &full[..full.find(&stop).unwrap()];
    for stop_field in [json!(stop), json!(["never-generated-xyz", stop])] {
        let mut body = base.clone();
        body["stop"] = stop_field;
        let v = s.post("/v1/completions", &body).json();
        assert_eq!(v["choices"][0]["text"], cut);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        body["stream"] = json!(true);
        let chunks = openai_chunks(&s.post("/v1/completions", &body));
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(streamed, cut, "a stream never shows the stop string");
    }

    // Anthropic: stop_sequences, stop_reason stop_sequence and the sequence echoed.
    let body = json!({
        "max_tokens": 40,
        "messages": [{"role": "user", "content": "Why is the sky blue?"}],
    });
    let full = s.post("/v1/messages", &body).json()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    if chars.len() > 10 {
        let stop: String = chars[6..9].iter().collect();
        let cut = &full[..full.find(&stop).unwrap()];
        let mut body = body.clone();
        body["stop_sequences"] = json!([stop]);
        let v = s.post("/v1/messages", &body).json();
        assert_eq!(v["content"][0]["text"], cut);
        assert_eq!(v["stop_reason"], "stop_sequence");
        assert_eq!(v["stop_sequence"], stop);
        body["stream"] = json!(true);
        let (_, streamed, delta) = anthropic_stream(&s.post("/v1/messages", &body));
        assert_eq!(streamed, cut);
        assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
        assert_eq!(delta["delta"]["stop_sequence"], stop);
    }
    s.stop().unwrap();
}

/// `(route, body, status, param)`: the status and the field named.
fn check_error(s: &TestServer, path: &str, body: &[u8], status: u16, param: Option<&str>) {
    let r = s.post_raw(path, body);
    let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    assert_eq!(r.status, status, "{path} {shown}: {}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    if path == "/v1/messages" {
        assert_eq!(v["type"], "error", "{shown}");
        assert!(v["error"]["type"].is_string());
        let message = v["error"]["message"].as_str().unwrap();
        if let Some(p) = param {
            assert!(message.contains(p), "{shown}: {message} names {p}");
        }
    } else {
        let e = &v["error"];
        assert!(e["message"].is_string(), "{shown}");
        assert!(e["type"].is_string());
        assert_eq!(e["param"].as_str(), param, "{shown}: {e}");
    }
}

#[test]
fn bad_requests_are_named_4xx_never_500() {
    let model = tiny();
    let options = {
        let mut o = ServerOptions::default();
        o.max_body_bytes = 64 << 10;
        o.max_image_bytes = 1000;
        o
    };
    let mut sched = SchedulerOptions::default();
    sched.max_tokens_in_flight = 4096;
    let s = TestServer::start(&model, options, sched);
    let chat = "/v1/chat/completions";
    let user = json!([{"role": "user", "content": "Hi"}]);
    let with = |extra: Value| {
        let mut b = json!({"messages": user, "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string().into_bytes()
    };
    check_error(&s, chat, b"{\"messages\": [", 400, None);
    check_error(&s, chat, b"[1, 2]", 400, None);
    check_error(&s, chat, b"", 400, None);
    check_error(&s, chat, b"{}", 400, Some("messages"));
    // Alternatives per token are not reported; the generated tokens' own are (see below).
    let top = with(json!({"logprobs": true, "top_logprobs": 3}));
    check_error(&s, chat, &top, 400, Some("top_logprobs"));
    let top_alone = with(json!({"top_logprobs": 2}));
    check_error(&s, chat, &top_alone, 400, Some("top_logprobs"));
    let legacy = json!({"prompt": "Hi", "max_tokens": 4, "logprobs": 5}).to_string();
    check_error(
        &s,
        "/v1/completions",
        legacy.as_bytes(),
        400,
        Some("logprobs"),
    );
    let legacy_bad = json!({"prompt": "Hi", "max_tokens": 4, "logprobs": "x"}).to_string();
    check_error(
        &s,
        "/v1/completions",
        legacy_bad.as_bytes(),
        400,
        Some("logprobs"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"messages": []})),
        400,
        Some("messages"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"messages": [{"content": "x"}]})),
        400,
        Some("messages[0].role"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"messages": [{"role": "wizard", "content": "x"}]})),
        400,
        Some("messages[0].role"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"messages": [{"role": "user", "content": 7}]})),
        400,
        Some("messages[0].content"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"max_tokens": "many"})),
        400,
        Some("max_tokens"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"max_tokens": -1})),
        400,
        Some("max_tokens"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"max_tokens": 0})),
        400,
        Some("max_tokens"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"max_completion_tokens": 0})),
        400,
        Some("max_tokens"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"temperature": -1})),
        400,
        Some("temperature"),
    );
    check_error(&s, chat, &with(json!({"seed": -3})), 400, Some("seed"));
    check_error(
        &s,
        chat,
        &with(json!({"threshold": 2})),
        400,
        Some("threshold"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"sampler": "greedy"})),
        400,
        Some("sampler"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"sampler": "entropy-bound", "entropy_bound": 0})),
        400,
        Some("entropy_bound"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"sampler": "confidence-threshold", "entropy_bound": 0.1})),
        400,
        Some("entropy_bound"),
    );
    check_error(&s, chat, &with(json!({"steps": 0})), 400, Some("steps"));
    check_error(
        &s,
        chat,
        &with(json!({"defaults": "mine"})),
        400,
        Some("defaults"),
    );
    check_error(&s, chat, &with(json!({"stop": [""]})), 400, Some("stop"));
    check_error(&s, chat, &with(json!({"stop": 5})), 400, Some("stop"));
    check_error(&s, chat, &with(json!({"n": 2})), 400, Some("n"));
    check_error(
        &s,
        chat,
        &with(json!({"tools": [{"type": "function"}]})),
        400,
        Some("tools"),
    );
    // Larger than the scheduler's tokens in flight: the request can never run.
    check_error(
        &s,
        chat,
        &with(json!({"max_tokens": 100000})),
        400,
        Some("max_tokens"),
    );

    // Images.
    let image = |url: &str| {
        with(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]}]}))
    };
    let param = Some("messages[0].content[1].image_url");
    check_error(&s, chat, &image("https://example.com/cat.png"), 400, param);
    check_error(&s, chat, &image("file:///etc/passwd"), 400, param);
    check_error(&s, chat, &image("data:image/png;base64,%%%%"), 400, param);
    check_error(&s, chat, &image("data:image/png,rawbytes"), 400, param);
    let big = format!("data:image/png;base64,{}", "A".repeat(4000));
    check_error(&s, chat, &image(&big), 413, param);
    // A valid image for a checkpoint without a vision tower.
    check_error(
        &s,
        chat,
        &image("data:image/png;base64,iVBORw0KGgo="),
        400,
        Some("images"),
    );
    check_error(
        &s,
        chat,
        &with(json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]})),
        400,
        Some("messages[0].content[0].type"),
    );

    // The whole body over the limit.
    let huge = with(json!({"messages": [{"role": "user", "content": "x".repeat(70 << 10)}]}));
    check_error(&s, chat, &huge, 413, None);

    // Completions.
    let cmpl = "/v1/completions";
    check_error(&s, cmpl, b"{\"max_tokens\": 3}", 400, Some("prompt"));
    check_error(
        &s,
        cmpl,
        b"{\"prompt\": [\"a\", \"b\"]}",
        400,
        Some("prompt"),
    );
    check_error(&s, cmpl, b"{\"prompt\": []}", 400, Some("prompt"));
    check_error(&s, cmpl, b"{\"prompt\": [1, -2]}", 400, Some("prompt[1]"));
    check_error(
        &s,
        cmpl,
        b"{\"prompt\": [1, 99999999]}",
        400,
        Some("prompt"),
    );
    check_error(&s, cmpl, b"{\"prompt\": \"\"}", 400, Some("prompt"));
    check_error(
        &s,
        cmpl,
        b"{\"prompt\": \"a\", \"echo\": true}",
        400,
        Some("echo"),
    );
    check_error(
        &s,
        cmpl,
        b"{\"prompt\": \"a\", \"best_of\": 3}",
        400,
        Some("best_of"),
    );

    // Anthropic, in its own error shape.
    let msgs = "/v1/messages";
    check_error(&s, msgs, b"{\"messages\": [", 400, None);
    check_error(
        &s,
        msgs,
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
        400,
        Some("max_tokens"),
    );
    check_error(
        &s,
        msgs,
        b"{\"max_tokens\": 4, \"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}",
        400,
        Some("messages[0].role"),
    );
    let anthropic_image = |source: Value| {
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": source},
            {"type": "text", "text": "What is this?"},
        ]}]})
        .to_string()
        .into_bytes()
    };
    check_error(
        &s,
        msgs,
        &anthropic_image(json!({"type": "url", "url": "https://example.com/a.png"})),
        400,
        Some("messages[0].content[0].source.url"),
    );
    check_error(
        &s,
        msgs,
        &anthropic_image(
            json!({"type": "base64", "media_type": "image/png", "data": "A".repeat(4000)}),
        ),
        413,
        Some("messages[0].content[0].source.data"),
    );
    check_error(&s, msgs, &huge, 413, None);
    check_error(
        &s,
        msgs,
        b"{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": -2}",
        400,
        Some("temperature"),
    );

    // None of it was a server error.
    let metrics = s.get("/metrics").text();
    for endpoint in ["chat_completions", "completions", "messages"] {
        let series = format!("dg_requests_total{{endpoint=\"{endpoint}\",outcome=\"error\"}} 0");
        assert!(metrics.lines().any(|l| l == series), "{series}");
    }
    // And the server still answers.
    let r = s.post(chat, &json!({"messages": user, "max_tokens": 4}));
    assert_eq!(r.status, 200);
    s.stop().unwrap();
}

#[test]
fn images_as_data_urls_on_a_vision_checkpoint() {
    use base64::Engine;
    let model = load(&fixtures().join("models/tiny-vision"));
    let s = start(&model);
    let png = std::fs::read(fixtures().join("images/normal.png")).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let body = json!({
        "max_tokens": 16,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}},
            {"type": "text", "text": "What is in the picture?"},
        ]}],
    });
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let mut request = Request::with_images(
        "What is in the picture?",
        vec![dg_engine::Image::Bytes(png.clone())],
    );
    request.max_tokens = 16;
    let g = model.generate(&request).unwrap();
    assert_eq!(chat_text(&v), g.text, "server == generate with the image");
    assert_eq!(v["usage"]["prompt_tokens"], g.stats.prompt_tokens);

    // Anthropic's base64 image block: the same prompt, the same answer.
    let r = s.post(
        "/v1/messages",
        &json!({
            "max_tokens": 16,
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
                {"type": "text", "text": "What is in the picture?"},
            ]}],
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], g.text);

    // Not an image, and too many images for the placeholders: 400 naming the images.
    let bad = |url: String| {
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "?"},
        ]}]})
    };
    let text = base64::engine::general_purpose::STANDARD.encode(b"not an image at all");
    let r = s.post(
        "/v1/chat/completions",
        &bad(format!("data:image/png;base64,{text}")),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "images");
    let truncated = std::fs::read(fixtures().join("images/truncated.png")).unwrap();
    let r = s.post(
        "/v1/chat/completions",
        &bad(format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(truncated)
        )),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    s.stop().unwrap();
}

/// `logprobs`: the generated tokens' log probabilities, the library's numbers, in OpenAI's two
/// layouts (chat `content[]`, completions' parallel arrays), streamed in the final chunk.
#[test]
fn logprobs_are_the_generated_tokens_own() {
    let model = tiny();
    let s = start(&model);
    let request = Request::chat(vec![Message::user("Why is the sky blue?")])
        .max_tokens(24)
        .seed(2)
        .temperature(0.7)
        .logprobs(true);
    let g = model.generate(&request).unwrap();
    let want = g.logprobs.clone().unwrap();
    assert_eq!(want.len(), g.token_ids.len());
    assert!(!want.is_empty() && want.iter().all(|&lp| lp <= 0.0 && lp.is_finite()));
    let spelled: Vec<String> = g
        .token_ids
        .iter()
        .map(|&id| model.tokenizer().decode(&[id], false).unwrap())
        .collect();

    let body = json!({
        "messages": [{"role": "user", "content": "Why is the sky blue?"}],
        "max_tokens": 24, "seed": 2, "temperature": 0.7, "logprobs": true,
    });
    let v = s.post("/v1/chat/completions", &body).json();
    assert_eq!(chat_text(&v), g.text);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let got: Vec<f32> = content
        .iter()
        .map(|c| c["logprob"].as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, want);
    let tokens: Vec<&str> = content
        .iter()
        .map(|c| c["token"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, spelled);
    assert_eq!(content[0]["top_logprobs"], json!([]));

    // Streamed: the same numbers on the finish chunk; none on the content chunks.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = openai_chunks(&s.post("/v1/chat/completions", &streamed));
    let finish = chunks
        .iter()
        .find(|c| !c["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert_eq!(finish["choices"][0]["logprobs"]["content"], json!(content));
    let with_content = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count();
    assert!(with_content > 1);

    // Not asked: null.
    let mut plain = body.clone();
    plain["logprobs"] = json!(false);
    assert!(s.post("/v1/chat/completions", &plain).json()["choices"][0]["logprobs"].is_null());

    // Completions: `logprobs: 0` is the generated tokens alone.
    let request = Request::text("Once upon a time")
        .max_tokens(16)
        .seed(1)
        .logprobs(true);
    let g = model.generate(&request).unwrap();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 16, "seed": 1, "logprobs": 0});
    let lp = &s.post("/v1/completions", &body).json()["choices"][0]["logprobs"];
    let got: Vec<f32> = lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, g.logprobs.unwrap());
    let offsets = lp["text_offset"].as_array().unwrap();
    assert_eq!(offsets.len(), got.len());
    assert_eq!(offsets[0], 0);
    s.stop().unwrap();
}
