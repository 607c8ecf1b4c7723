//! Loading, overload, disconnects and shutdown, over raw HTTP/1.1. Long generations run on a
//! small random checkpoint (dg_core::synthetic), which does not stop by itself: only a
//! disconnect or a shutdown ends them early. No timing is asserted: waits are bounded polls.

mod common;

use std::io::BufReader;
use std::sync::Arc;

use common::{load, read_chunk, read_head, scheduler, send, sse_events, TestServer};
use dg_engine::{DiffusionGemma, SchedulerOptions};
use dg_server::{Server, ServerOptions};
use dg_testkit::fixtures;
use serde_json::{json, Value};

fn synthetic() -> (tempfile::TempDir, Arc<DiffusionGemma>) {
    let dir = tempfile::tempdir().unwrap();
    dg_core::synthetic::write_checkpoint(dir.path(), &dg_core::synthetic::SyntheticSpec::default())
        .unwrap();
    // Room for the never-ending generations below (the default limit is 32768 tokens).
    let model = DiffusionGemma::builder(dir.path())
        .max_context(2_000_000)
        .load()
        .unwrap();
    (dir, Arc::new(model))
}

fn roomy() -> SchedulerOptions {
    let mut o = SchedulerOptions::default();
    o.max_tokens_in_flight = 10_000_000;
    o
}

/// A long streamed completion: the connection, after its head and first chunk.
fn long_stream(s: &TestServer, path: &str) -> (BufReader<std::net::TcpStream>, String) {
    let body = match path {
        "/v1/messages" => json!({
            "max_tokens": 1_000_000,
            "stream": true,
            "messages": [{"role": "user", "content": "Go on forever."}],
        }),
        _ => json!({"prompt": "Go on forever.", "max_tokens": 1_000_000, "stream": true}),
    };
    let stream = send(s.addr, "POST", path, Some(body.to_string().as_bytes()));
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader);
    assert_eq!(status, 200);
    assert!(headers
        .iter()
        .any(|(n, v)| n == "content-type" && v == "text/event-stream"));
    let first = read_chunk(&mut reader).expect("a first chunk");
    (reader, String::from_utf8(first).unwrap())
}

#[test]
fn unavailable_until_the_model_is_loaded() {
    let server = Server::new(ServerOptions::default());
    let s = TestServer::serve(server.clone());
    let r = s.get("/health");
    assert_eq!((r.status, r.json()), (503, json!({"status": "loading"})));
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("loading"));
    let r = s.post(
        "/v1/messages",
        &json!({"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["type"], "overloaded_error");
    assert_eq!(s.metric("dg_model_loaded"), Some(0.0));
    assert_eq!(
        s.metric("dg_requests_total{endpoint=\"chat_completions\",outcome=\"unavailable\"}"),
        Some(1.0)
    );

    let model = load(&fixtures().join("models/tiny"));
    server.set_ready(scheduler(&model, SchedulerOptions::default()));
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.post("/v1/chat/completions", &body).status, 200);
    assert_eq!(s.metric("dg_model_loaded"), Some(1.0));
    s.stop().unwrap();
}

#[test]
fn a_client_that_disconnects_cancels_its_request() {
    let (_dir, model) = synthetic();
    let s = TestServer::start(&model, ServerOptions::default(), roomy());
    let cancelled = "dg_requests_total{endpoint=\"completions\",outcome=\"cancelled\"}";

    // Streaming: gone after the first chunk.
    let (reader, first) = long_stream(&s, "/v1/completions");
    assert!(first.starts_with("data: "));
    assert_eq!(s.metric("dg_scheduler_running"), Some(1.0));
    drop(reader);
    s.wait_metric(cancelled, 1.0);
    s.wait_metric("dg_scheduler_running", 0.0);

    // Not streaming: gone while it runs.
    let body = json!({"prompt": "Go on forever.", "max_tokens": 1_000_000});
    let conn = send(
        s.addr,
        "POST",
        "/v1/completions",
        Some(body.to_string().as_bytes()),
    );
    s.wait_metric("dg_scheduler_running", 1.0);
    drop(conn);
    s.wait_metric(cancelled, 2.0);
    s.wait_metric("dg_scheduler_running", 0.0);
    s.wait_metric("dg_requests_active", 0.0);

    // The server goes on.
    let r = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 8}));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["completion_tokens"], 8);
    s.stop().unwrap();
}

#[test]
fn a_full_queue_answers_429() {
    let (_dir, model) = synthetic();
    let mut sched = roomy();
    sched.max_running = 1;
    sched.max_queued = 1;
    let s = TestServer::start(&model, ServerOptions::default(), sched);

    let (running, _) = long_stream(&s, "/v1/completions");
    // The second waits in the queue (its response has not begun).
    let body = json!({"prompt": "Go on forever.", "max_tokens": 1_000_000, "stream": true});
    let queued = send(
        s.addr,
        "POST",
        "/v1/completions",
        Some(body.to_string().as_bytes()),
    );
    s.wait_metric("dg_scheduler_queued", 1.0);

    let r = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 4}));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    let e = &r.json()["error"];
    assert_eq!(e["type"], "rate_limit_error");
    assert_eq!(e["code"], "rate_limit_exceeded");
    let r = s.post(
        "/v1/messages",
        &json!({"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert_eq!(
        s.metric("dg_requests_total{endpoint=\"completions\",outcome=\"rejected\"}"),
        Some(1.0)
    );

    drop(running);
    drop(queued);
    s.wait_metric("dg_scheduler_running", 0.0);
    s.wait_metric("dg_scheduler_queued", 0.0);
    assert_eq!(
        s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 4}))
            .status,
        200
    );
    s.stop().unwrap();
}

/// The rest of a stream, to its end.
fn rest(mut reader: BufReader<std::net::TcpStream>, first: String) -> Vec<u8> {
    let mut body = first.into_bytes();
    while let Some(chunk) = read_chunk(&mut reader) {
        body.extend_from_slice(&chunk);
    }
    body
}

#[test]
fn shutdown_ends_running_streams_with_a_final_chunk() {
    let (_dir, model) = synthetic();
    let mut s = TestServer::start(&model, ServerOptions::default(), roomy());
    let (openai, openai_first) = long_stream(&s, "/v1/completions");
    let (anthropic, anthropic_first) = long_stream(&s, "/v1/messages");
    s.wait_metric("dg_scheduler_running", 2.0);

    s.signal(); // what SIGTERM does

    let body = rest(openai, openai_first);
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let events = sse_events(&body);
    let last: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "cancelled");

    let body = rest(anthropic, anthropic_first);
    let events = sse_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let delta: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "cancelled");

    let addr = s.addr;
    s.stop().expect("serve returns Ok after a shutdown");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "no new connections after shutdown"
    );
}
