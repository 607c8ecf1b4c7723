//! 32 clients on loopback at once: mixed prompt lengths, arrival times, samplers, seeds,
//! streamed and not, some cancelling mid-stream. Every completed response must be what the
//! same request gives alone (`DiffusionGemma::generate`), nothing lost or duplicated, no
//! deadlock, and the scheduler's queue back to empty.

mod common;

use std::io::BufReader;
use std::time::{Duration, Instant};

use common::{load, openai_chunks, read_chunk, read_head, send, TestServer};
use dg_engine::{Message, Request, Sampler, SchedulerOptions};
use dg_server::ServerOptions;
use dg_testkit::fixtures;
use serde_json::{json, Value};

const CLIENTS: usize = 32;

struct Client {
    body: Value,
    request: Request,
    stream: bool,
    cancel: bool,
}

fn client(i: usize) -> Client {
    let words = [
        "sea", "stone", "light", "river", "north", "wind", "salt", "glass",
    ];
    let prompt: Vec<&str> = (0..2 + (i * 5) % 23)
        .map(|j| words[(i + j * 3) % 8])
        .collect();
    let prompt = prompt.join(" ");
    let entropy = i % 3 == 1;
    let temperature = [0.0, 0.0, 0.7, 1.0][i % 4];
    let max_tokens = 8 + (i * 7) % 40;
    let seed = 1000 + i as u64;
    let mut body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "sampler": if entropy { "entropy-bound" } else { "confidence-threshold" },
    });
    let stream = i.is_multiple_of(2);
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let mut request = Request::chat(vec![Message::user(prompt)]);
    request.max_tokens = max_tokens;
    request.temperature = temperature as f32;
    request.seed = seed;
    if entropy {
        request.sampler = Sampler::EntropyBound { bound: None };
    }
    Client {
        body,
        request,
        stream,
        cancel: i % 8 == 6,
    }
}

/// (text, completion tokens, finish reason) of a completed response.
fn answer(reply: &common::Reply, stream: bool) -> (String, u64, String) {
    if !stream {
        assert_eq!(reply.status, 200, "{}", reply.text());
        let v = reply.json();
        let choice = &v["choices"][0];
        return (
            choice["message"]["content"].as_str().unwrap().to_string(),
            v["usage"]["completion_tokens"].as_u64().unwrap(),
            choice["finish_reason"].as_str().unwrap().to_string(),
        );
    }
    let chunks = openai_chunks(reply);
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for c in &chunks {
        if let Some(choice) = c["choices"].get(0) {
            if let Some(t) = choice["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                assert!(finish.is_none(), "one finish reason");
                finish = Some(f.to_string());
            }
        }
        if let Some(n) = c["usage"]["completion_tokens"].as_u64() {
            usage = Some(n);
        }
    }
    (
        text,
        usage.expect("usage chunk"),
        finish.expect("a finish reason"),
    )
}

#[test]
fn thirty_two_clients_get_what_each_request_gets_alone() {
    let model = load(&fixtures().join("models/tiny"));
    let mut sched = SchedulerOptions::default();
    sched.max_running = 8;
    sched.max_queued = 64;
    let server = TestServer::start(&model, ServerOptions::default(), sched);
    let scheduler = server.server.scheduler().unwrap().clone();
    let clients: Vec<Client> = (0..CLIENTS).map(client).collect();
    let addr = server.addr;
    let started = Instant::now();
    let answers: Vec<Option<(String, u64, String)>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                s.spawn(move || {
                    // Arrivals spread over the first rounds.
                    std::thread::sleep(Duration::from_millis(((i * 37) % 160) as u64));
                    let body = c.body.to_string();
                    if c.cancel {
                        // Read the head and one event, then hang up mid-stream.
                        let mut body = c.body.clone();
                        body["stream"] = json!(true);
                        let s = send(
                            addr,
                            "POST",
                            "/v1/chat/completions",
                            Some(body.to_string().as_bytes()),
                        );
                        let mut reader = BufReader::new(s);
                        let (status, _) = read_head(&mut reader);
                        assert_eq!(status, 200);
                        read_chunk(&mut reader);
                        return None;
                    }
                    let reply =
                        common::http(addr, "POST", "/v1/chat/completions", Some(body.as_bytes()));
                    Some(answer(&reply, c.stream))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(started.elapsed() < Duration::from_secs(300), "no deadlock");
    let mut completed = 0;
    for (i, (c, got)) in clients.iter().zip(&answers).enumerate() {
        let Some((text, tokens, finish)) = got else {
            continue;
        };
        let alone = model.generate(&c.request).unwrap();
        assert_eq!(text, &alone.text, "client {i}: text");
        assert_eq!(
            *tokens, alone.stats.generated_tokens as u64,
            "client {i}: tokens"
        );
        let want = match alone.finish_reason {
            dg_engine::FinishReason::Length => "length",
            _ => "stop",
        };
        assert_eq!(finish, want, "client {i}: finish reason");
        completed += 1;
    }
    assert_eq!(completed, CLIENTS - CLIENTS / 8);
    // Every request ended exactly once (cancelled ones too); the queue is empty again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = scheduler.status();
        if s.finished == CLIENTS as u64 && s.running == 0 {
            assert_eq!((s.queued, s.tokens_in_flight), (0, 0));
            assert!(s.sequence_steps > s.rounds, "clients shared rounds");
            break;
        }
        assert!(Instant::now() < deadline, "requests left over: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    server.stop().unwrap();
}
