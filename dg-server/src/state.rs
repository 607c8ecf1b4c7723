//! The server's shared state: options, the scheduler once the model is loaded, metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use dg_engine::Scheduler;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// What the server answers with and accepts.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServerOptions {
    /// The model id shown by `/v1/models` and in responses. Requests may name any model: one
    /// model is served.
    pub model_name: String,
    /// Largest request body, in bytes (413 above it).
    pub max_body_bytes: usize,
    /// Largest decoded image, in bytes (413 above it).
    pub max_image_bytes: usize,
    /// `max_tokens` of an OpenAI request that gives none.
    pub default_max_tokens: usize,
    /// After a shutdown signal, how long [`serve`](crate::serve) waits for open responses to
    /// complete (a client that stopped reading would hold it forever).
    pub shutdown_grace: std::time::Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            model_name: "diffusiongemma".into(),
            max_body_bytes: 32 << 20,
            max_image_bytes: 20 << 20,
            default_max_tokens: 512,
            shutdown_grace: std::time::Duration::from_secs(30),
        }
    }
}

/// The server: cheap to clone (one `Arc`). Create it, start [`serve`](crate::serve) (it
/// answers 503 while loading), then hand it the scheduler with
/// [`set_ready`](Self::set_ready).
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    options: ServerOptions,
    scheduler: OnceLock<Arc<Scheduler>>,
    shutting_down: AtomicBool,
    metrics: Arc<Metrics>,
    created: u64,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("options", &self.inner.options)
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server with no model yet.
    pub fn new(options: ServerOptions) -> Self {
        Server {
            inner: Arc::new(Inner {
                options,
                scheduler: OnceLock::new(),
                shutting_down: AtomicBool::new(false),
                metrics: Arc::new(Metrics::default()),
                created: crate::params::now(),
            }),
        }
    }

    /// A server that is ready at once.
    pub fn with_scheduler(options: ServerOptions, scheduler: Arc<Scheduler>) -> Self {
        let server = Self::new(options);
        server.set_ready(scheduler);
        server
    }

    /// Starts serving requests with this scheduler. Only the first call counts.
    pub fn set_ready(&self, scheduler: Arc<Scheduler>) {
        if self.inner.scheduler.set(scheduler).is_err() {
            tracing::warn!("set_ready called twice: the first scheduler stays");
        }
    }

    /// Whether the model is loaded and the server is not shutting down.
    pub fn is_ready(&self) -> bool {
        self.inner.scheduler.get().is_some() && !self.is_shutting_down()
    }

    /// Whether [`shutdown`](Self::shutdown) has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// The scheduler, once loaded.
    pub fn scheduler(&self) -> Option<&Arc<Scheduler>> {
        self.inner.scheduler.get()
    }

    /// The options the server was built with.
    pub fn options(&self) -> &ServerOptions {
        &self.inner.options
    }

    /// Stops taking requests: queued ones fail with 503, running ones end within one denoising
    /// step with finish reason `cancelled` (their streams get a final chunk). Returns once the
    /// scheduler's worker has stopped.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        if let Some(scheduler) = self.scheduler().cloned() {
            let _ = tokio::task::spawn_blocking(move || scheduler.shutdown()).await;
        }
    }

    /// The scheduler, or 503 while loading or shutting down.
    pub(crate) fn ready(&self) -> Result<Arc<Scheduler>, ApiError> {
        if self.is_shutting_down() {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        self.scheduler()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("the model is still loading; retry shortly"))
    }

    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// When the server started (Unix seconds): the `created` time of the model.
    pub(crate) fn created(&self) -> u64 {
        self.inner.created
    }
}
