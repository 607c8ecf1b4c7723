//! Running a request on the scheduler: submitting it (on a blocking thread: the tokenizer,
//! template and vision tower run there), collecting its result, or streaming it as
//! server-sent events in a route's framing.
//!
//! The response body owns the scheduler's `Stream`: when a client disconnects, hyper drops the
//! body (or, before the response began, the handler's future), the `Stream` is dropped with it
//! and the scheduler cancels the request within one denoising step.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dg_engine::{Event, Generation, Request, Scheduler, Stream, Update};
use serde_json::json;

use crate::error::ApiError;
use crate::metrics::{Endpoint, Record};
use crate::state::Server;

/// A submitted request: its updates, the scheduler (for the tokenizer) and its metrics record.
struct Submitted {
    stream: Stream,
    scheduler: Arc<Scheduler>,
    record: Record,
}

/// Submits a request; errors (invalid request, overloaded, shutting down) come back at once.
async fn submit(
    server: &Server,
    request: Request,
    record: &mut Record,
) -> Result<(Stream, Arc<Scheduler>), ApiError> {
    let result = async {
        let scheduler = server.ready()?;
        let s = scheduler.clone();
        let stream = tokio::task::spawn_blocking(move || s.submit(request))
            .await
            .map_err(|e| ApiError::internal(format!("the submit task failed: {e}")))??;
        Ok((stream, scheduler))
    }
    .await;
    if let Err(e) = &result {
        record.failed(e);
        log_error(record.endpoint(), e);
    }
    result
}

fn log_error(endpoint: Endpoint, e: &ApiError) {
    if e.status.is_server_error() && e.status != StatusCode::SERVICE_UNAVAILABLE {
        tracing::error!(?endpoint, "{e}");
    } else {
        tracing::info!(?endpoint, "{e}");
    }
}

/// Waits for the result, skipping events.
async fn collect(mut s: Submitted) -> Result<(Generation, Record), ApiError> {
    while let Some(update) = s.stream.recv().await {
        match update {
            Update::Done(generation) => {
                s.record.done(&generation);
                log_done(s.record.endpoint(), &generation);
                return Ok((generation, s.record));
            }
            Update::Failed(e) => {
                let e = ApiError::from(e);
                s.record.failed(&e);
                log_error(s.record.endpoint(), &e);
                return Err(e);
            }
            _ => {}
        }
    }
    let e = ApiError::internal("the generation ended without a result");
    s.record.failed(&e);
    Err(e)
}

fn log_done(endpoint: Endpoint, g: &Generation) {
    tracing::info!(
        ?endpoint,
        finish = ?g.finish_reason,
        prompt_tokens = g.stats.prompt_tokens,
        generated_tokens = g.stats.generated_tokens,
        steps = g.stats.denoising_steps,
        seconds = format!(
            "{:.3}",
            (g.stats.prefill_time + g.stats.generation_time).as_secs_f64()
        ),
        "done"
    );
}

/// One route's stream framing.
pub(crate) trait Frames: Send + 'static {
    /// The stream's first frames (a role chunk, `message_start`); `prompt_tokens` when the
    /// prompt is already prefilled.
    fn open(&mut self, prompt_tokens: Option<usize>, out: &mut String);
    /// Committed text.
    fn text(&mut self, delta: &str, out: &mut String);
    /// The result: final chunk(s) and the stream's end.
    fn finish(&mut self, generation: &Generation, out: &mut String);
    /// A failure after the stream began.
    fn fail(&mut self, error: &ApiError, out: &mut String);
}

/// Appends one `data:` event.
pub(crate) fn data(out: &mut String, value: &serde_json::Value) {
    out.push_str("data: ");
    out.push_str(&value.to_string());
    out.push_str("\n\n");
}

/// Appends one named event (`event: NAME` then `data:`).
pub(crate) fn named(out: &mut String, name: &str, value: &serde_json::Value) {
    out.push_str("event: ");
    out.push_str(name);
    out.push('\n');
    data(out, value);
}

/// A draft as an SSE comment line: every SSE parser skips comments (the official OpenAI and
/// Anthropic SDKs, browsers' EventSource), so only clients that asked for drafts and read the
/// raw stream see them. Unrevealed canvas positions show as `░`.
fn draft(
    scheduler: &Scheduler,
    block: usize,
    step: usize,
    total_steps: usize,
    canvas: &[u32],
    revealed: &[bool],
    out: &mut String,
) {
    let tokenizer = scheduler.model().tokenizer();
    let mut text = String::new();
    let mut run: Vec<u32> = Vec::new();
    let flush = |run: &mut Vec<u32>, text: &mut String| {
        if !run.is_empty() {
            text.push_str(&tokenizer.decode(run, true).unwrap_or_default());
            run.clear();
        }
    };
    for (&token, &shown) in canvas.iter().zip(revealed) {
        if shown {
            run.push(token);
        } else {
            flush(&mut run, &mut text);
            text.push('░');
        }
    }
    flush(&mut run, &mut text);
    let value = json!({
        "block": block,
        "step": step,
        "total_steps": total_steps,
        "canvas_length": canvas.len(),
        "revealed": revealed.iter().filter(|&&r| r).count(),
        "text": text,
    });
    out.push_str(": draft ");
    out.push_str(&value.to_string());
    out.push_str("\n\n");
}

struct Live<F> {
    stream: Stream,
    scheduler: Arc<Scheduler>,
    record: Record,
    frames: F,
    drafts: bool,
    first: Option<Update>,
    opened: bool,
    done: bool,
}

impl<F: Frames> Live<F> {
    /// The frames of one update; sets `done` at the end.
    fn frames_of(&mut self, update: Option<Update>, out: &mut String) {
        if !self.opened {
            self.opened = true;
            let prompt_tokens = match &update {
                Some(Update::Event(Event::Prefilled { prompt_tokens })) => Some(*prompt_tokens),
                Some(Update::Done(g)) => Some(g.stats.prompt_tokens),
                _ => None,
            };
            self.frames.open(prompt_tokens, out);
        }
        match update {
            Some(Update::Event(Event::Text(delta))) if !delta.is_empty() => {
                self.frames.text(&delta, out)
            }
            Some(Update::Event(Event::Draft {
                block,
                step,
                total_steps,
                canvas,
                revealed,
                ..
            })) if self.drafts => draft(
                &self.scheduler,
                block,
                step,
                total_steps,
                &canvas,
                &revealed,
                out,
            ),
            Some(Update::Event(_)) => {}
            Some(Update::Done(generation)) => {
                self.record.done(&generation);
                log_done(self.record.endpoint(), &generation);
                self.frames.finish(&generation, out);
                self.done = true;
            }
            Some(Update::Failed(e)) => {
                let e = ApiError::from(e);
                self.record.failed(&e);
                log_error(self.record.endpoint(), &e);
                self.frames.fail(&e, out);
                self.done = true;
            }
            None => {
                let e = ApiError::internal("the generation ended without a result");
                self.record.failed(&e);
                self.frames.fail(&e, out);
                self.done = true;
            }
            Some(_) => {}
        }
    }
}

/// Streams a submitted request as server-sent events. The response starts once the first
/// update is there (the request was admitted), so a request refused before it ran still gets
/// an HTTP error status.
async fn stream<F: Frames>(
    mut s: Submitted,
    frames: F,
    drafts: bool,
) -> Result<Response, ApiError> {
    let first = s.stream.recv().await;
    if let Some(Update::Failed(e)) = first {
        let e = ApiError::from(e);
        s.record.failed(&e);
        log_error(s.record.endpoint(), &e);
        return Err(e);
    }
    let live = Live {
        stream: s.stream,
        scheduler: s.scheduler,
        record: s.record,
        frames,
        drafts,
        first,
        opened: false,
        done: false,
    };
    let body = futures_util::stream::unfold(live, |mut live| async move {
        loop {
            if live.done {
                return None;
            }
            let update = match live.first.take() {
                Some(update) => Some(update),
                None => live.stream.recv().await,
            };
            let mut out = String::new();
            live.frames_of(update, &mut out);
            if !out.is_empty() {
                return Some((Ok::<_, Infallible>(Bytes::from(out)), live));
            }
        }
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            // nginx: pass each event on at once.
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

/// What a generation route parsed from its body.
pub(crate) struct Parsed {
    pub request: Request,
    pub streaming: bool,
    pub drafts: bool,
    /// OpenAI's `stream_options.include_usage`.
    pub include_usage: bool,
}

/// Every generation route after parsing: a parse error is counted and logged, the request is
/// submitted, then streamed in the route's `frames` or answered with its `body` of the result.
pub(crate) async fn respond<F: Frames>(
    server: &Server,
    endpoint: Endpoint,
    parsed: Result<Parsed, ApiError>,
    frames: impl FnOnce(&Parsed) -> F,
    body: impl FnOnce(&Generation) -> serde_json::Value,
) -> Result<Response, ApiError> {
    let mut record = Record::start(server.metrics().clone(), endpoint);
    let parsed = parsed.inspect_err(|e| {
        record.failed(e);
        log_error(endpoint, e);
    })?;
    let frames = frames(&parsed);
    let (stream_, scheduler) = submit(server, parsed.request, &mut record).await?;
    let submitted = Submitted {
        stream: stream_,
        scheduler,
        record,
    };
    if parsed.streaming {
        return stream(submitted, frames, parsed.drafts).await;
    }
    let (generation, _record) = collect(submitted).await?;
    Ok(json_response(&body(&generation)))
}

/// A JSON response.
pub(crate) fn json_response(value: &serde_json::Value) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}
