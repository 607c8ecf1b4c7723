//! dg-server: an OpenAI- and Anthropic-compatible HTTP server for DiffusionGemma, on the
//! continuous-batching [`Scheduler`](dg_engine::Scheduler).
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use dg_engine::{DiffusionGemma, Scheduler, SchedulerOptions};
//! use dg_server::{serve, shutdown_signal, Server, ServerOptions};
//!
//! let server = Server::new(ServerOptions::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! // Listen at once (503 until loaded), load, then serve.
//! let serving = tokio::spawn(serve(listener, server.clone(), shutdown_signal()));
//! let model = Arc::new(DiffusionGemma::load("path/to/checkpoint").unwrap());
//! server.set_ready(Arc::new(Scheduler::start(model, SchedulerOptions::default()).unwrap()));
//! serving.await.unwrap()
//! # }
//! ```
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (OpenAI), `POST /v1/messages`
//! (Anthropic), `GET /v1/models`, `GET /v1/models/{id}`, `GET /health` (200 once loaded, 503
//! before and while shutting down), `GET /metrics` (Prometheus text format).
//!
//! Errors never come as bare 500s for bad input: 400 (invalid JSON or field, the field named in
//! `param`), 404 (route), 405 (method), 413 (body over `max_body_bytes`, image over
//! `max_image_bytes` or the vision tower's limits), 429 (the scheduler's queue or token budget
//! is full), 503 (loading, shutting down). Streams are server-sent events; a client that
//! disconnects cancels its request within one denoising step.
//!
//! Diffusion options are extra body fields on every generation route: `sampler`
//! (`confidence-threshold` | `entropy-bound`), `threshold`, `entropy_bound`, `steps`,
//! `min_canvas`, `max_canvas`, `full_canvas`, `defaults` (`checkpoint` | `reference`), and
//! `drafts: true` for per-step drafts in a stream, sent as SSE comment lines
//! (`: draft {"block","step","total_steps","canvas_length","revealed","text"}`) that SDKs skip.
//! mlx-vlm's names (`diffusion_sampler`, `max_denoising_steps`,
//! `diffusion_min_canvas_length`, `diffusion_max_canvas_length`, `diffusion_full_canvas`) are
//! accepted too. Unset, `temperature` and `seed` are 0 (the same request gives the same answer).

#![warn(missing_docs)]

mod anthropic;
mod error;
mod generate;
mod images;
mod metrics;
mod openai;
mod params;
mod state;

use std::future::Future;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

pub use error::{ApiError, Flavor};
pub use state::{Server, ServerOptions};

/// The routes, with the server as state.
pub fn router(server: Server) -> Router {
    let limit = server.options().max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages_route))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(server)
}

/// Serves until `shutdown` resolves, then stops accepting connections, shuts the scheduler
/// down (queued requests get 503, running ones end within one denoising step with finish
/// reason `cancelled` and a proper final chunk) and returns once every response is complete,
/// or after [`ServerOptions::shutdown_grace`] if some client stopped reading.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: Server,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(server.clone());
    let grace = server.options().shutdown_grace;
    let stopped = std::sync::Arc::new(tokio::sync::Notify::new());
    let graceful = {
        let stopped = stopped.clone();
        axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: finishing in-flight requests");
            server.shutdown().await;
            stopped.notify_one();
        })
    };
    tokio::select! {
        result = graceful => result,
        _ = async {
            stopped.notified().await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!("responses still open {grace:?} after the shutdown: leaving them");
            Ok(())
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = terminate => tracing::info!("SIGTERM received"),
    }
}

fn model_object(server: &Server) -> serde_json::Value {
    let name = &server.options().model_name;
    // OpenAI's and Anthropic's model objects in one.
    json!({
        "id": name,
        "object": "model",
        "created": server.created(),
        "owned_by": "dg",
        "type": "model",
        "display_name": name,
        "created_at": rfc3339(server.created()),
    })
}

/// `GET /v1/models`: the one model served (OpenAI's list shape, with Anthropic's fields).
async fn models(State(server): State<Server>) -> Response {
    let name = &server.options().model_name;
    generate::json_response(&json!({
        "object": "list",
        "data": [model_object(&server)],
        "has_more": false,
        "first_id": name,
        "last_id": name,
    }))
}

/// `GET /v1/models/{id}`.
async fn model(State(server): State<Server>, Path(id): Path<String>) -> Response {
    if id == server.options().model_name {
        generate::json_response(&model_object(&server))
    } else {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("the model {id:?} does not exist (this server serves one model)"),
        )
        .param("model")
        .code("model_not_found")
        .into_response()
    }
}

/// `GET /health`: 200 once the model is loaded, 503 while loading or shutting down.
async fn health(State(server): State<Server>) -> Response {
    let (status, text) = if server.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    } else if server.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    };
    let mut response = generate::json_response(&json!({ "status": text }));
    *response.status_mut() = status;
    response
}

/// `GET /metrics`.
async fn metrics(State(server): State<Server>) -> Response {
    let status = server.scheduler().map(|s| s.status());
    let text = server.metrics().render(server.is_ready(), status);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    let message = format!("Invalid URL ({method} {})", uri.path());
    route_error(StatusCode::NOT_FOUND, message, "not_found", &uri)
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    let message = format!("{method} is not allowed on {}", uri.path());
    route_error(
        StatusCode::METHOD_NOT_ALLOWED,
        message,
        "method_not_allowed",
        &uri,
    )
}

/// An error about the route itself, in the flavour of the API the path belongs to.
fn route_error(status: StatusCode, message: String, code: &'static str, uri: &Uri) -> ApiError {
    let error = ApiError::new(status, message).code(code);
    if uri.path().starts_with("/v1/messages") {
        error.anthropic()
    } else {
        error
    }
}

/// Unix seconds as an RFC 3339 UTC time.
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
