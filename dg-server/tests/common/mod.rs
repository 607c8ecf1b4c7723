//! A server on 127.0.0.1:0 in a background runtime, and a raw HTTP/1.1 client over
//! `std::net::TcpStream` (no HTTP client crate: what goes over the wire is what is checked).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dg_engine::{DiffusionGemma, Scheduler, SchedulerOptions};
use dg_server::{Server, ServerOptions};
use serde_json::Value;

/// A running server; dropping it shuts it down.
pub struct TestServer {
    pub addr: SocketAddr,
    pub server: Server,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

pub fn load(dir: &Path) -> Arc<DiffusionGemma> {
    Arc::new(DiffusionGemma::load(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())))
}

pub fn scheduler(model: &Arc<DiffusionGemma>, options: SchedulerOptions) -> Arc<Scheduler> {
    Arc::new(Scheduler::start(model.clone(), options).unwrap())
}

impl TestServer {
    /// Serves `server` (ready or not) on a free loopback port.
    pub fn serve(server: Server) -> TestServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let s = server.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                dg_server::serve(listener, s, async {
                    let _ = rx.await;
                })
                .await
            })
        });
        TestServer {
            addr,
            server,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// A ready server for the checkpoint.
    pub fn start(
        model: &Arc<DiffusionGemma>,
        options: ServerOptions,
        sched: SchedulerOptions,
    ) -> TestServer {
        Self::serve(Server::with_scheduler(options, scheduler(model, sched)))
    }

    /// Asks for a shutdown (as SIGTERM does) without waiting.
    pub fn signal(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Shuts down and waits for `serve` to return.
    pub fn stop(mut self) -> std::io::Result<()> {
        self.signal();
        self.thread.take().unwrap().join().unwrap()
    }

    pub fn get(&self, path: &str) -> Reply {
        http(self.addr, "GET", path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        http(self.addr, "POST", path, Some(body.to_string().as_bytes()))
    }

    pub fn post_raw(&self, path: &str, body: &[u8]) -> Reply {
        http(self.addr, "POST", path, Some(body))
    }

    /// The value of one metric line (`name{labels}` exactly as printed).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits (bounded) until the metric has the value.
    pub fn wait_metric(&self, series: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if self.metric(series) == Some(value) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{series} never reached {value}: {:?}",
                self.metric(series)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An HTTP response: status, headers (names lower-cased) and the body, de-chunked.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("UTF-8 body")
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// The request bytes.
pub fn request_bytes(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(body) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    if let Some(body) = body {
        bytes.extend_from_slice(body);
    }
    bytes
}

/// Connects and sends a request.
pub fn send(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    // A large body may be refused before it is all sent: the write error is not the test's.
    let _ = s.write_all(&request_bytes(addr, method, path, body));
    s
}

/// Sends a request and reads the whole response.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> Reply {
    let s = send(addr, method, path, body);
    let mut reader = BufReader::new(s);
    let (status, headers) = read_head(&mut reader);
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse::<usize>().unwrap());
    let body = if chunked {
        let mut body = Vec::new();
        while let Some(chunk) = read_chunk(&mut reader) {
            body.extend_from_slice(&chunk);
        }
        body
    } else if let Some(n) = length {
        let mut body = vec![0; n];
        reader.read_exact(&mut body).unwrap();
        body
    } else {
        let mut body = Vec::new();
        reader.read_to_end(&mut body).unwrap();
        body
    };
    Reply {
        status,
        headers,
        body,
    }
}

/// Reads the status line and headers.
pub fn read_head(reader: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 "), "status line {line:?}");
    let status = line[9..12].parse().unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let l = line.trim_end_matches("\r\n");
        if l.is_empty() {
            break;
        }
        let (name, value) = l.split_once(':').expect("header line");
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    (status, headers)
}

/// One chunk of a chunked body; `None` at the last (empty) chunk or at EOF.
pub fn read_chunk(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim_end().split(';').next().unwrap(), 16)
        .unwrap_or_else(|_| panic!("chunk size line {line:?}"));
    if size == 0 {
        let mut end = String::new();
        let _ = reader.read_line(&mut end);
        return None;
    }
    let mut chunk = vec![0; size];
    reader.read_exact(&mut chunk).ok()?;
    let mut crlf = [0; 2];
    reader.read_exact(&mut crlf).ok()?;
    assert_eq!(&crlf, b"\r\n");
    Some(chunk)
}

/// An SSE body split into events, checking the framing byte by byte: every event is
/// `[event: NAME\n]data: JSON\n\n` (or an SSE comment), nothing else.
pub fn sse_events(body: &[u8]) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(body).expect("UTF-8 stream");
    assert!(
        text.ends_with("\n\n"),
        "stream ends with a blank line: {text:?}"
    );
    let mut events = Vec::new();
    for event in text[..text.len() - 2].split("\n\n") {
        if event.starts_with(':') {
            assert!(!event.contains('\n'), "one comment line: {event:?}");
            continue;
        }
        let (name, data) = match event.strip_prefix("event: ") {
            Some(rest) => {
                let (name, data) = rest.split_once('\n').expect("event then data");
                (Some(name.to_string()), data)
            }
            None => (None, event),
        };
        let data = data
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("a data line: {event:?}"));
        assert!(!data.contains('\n'), "one data line per event: {event:?}");
        events.push((name, data.to_string()));
    }
    events
}

/// The data of an OpenAI stream's events: JSON chunks, then `[DONE]` last.
pub fn openai_chunks(reply: &Reply) -> Vec<Value> {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    assert!(
        reply.body.ends_with(b"data: [DONE]\n\n"),
        "the stream ends with data: [DONE]"
    );
    let events = sse_events(&reply.body);
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last, &(None, "[DONE]".to_string()));
    rest.iter()
        .map(|(name, data)| {
            assert_eq!(name, &None, "OpenAI streams have unnamed events");
            serde_json::from_str(data).unwrap()
        })
        .collect()
}
