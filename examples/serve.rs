//! Serve DiffusionGemma over HTTP: OpenAI (`/v1/chat/completions`, `/v1/completions`) and
//! Anthropic (`/v1/messages`) APIs, with continuous batching.
//!
//! ```text
//! cargo run --release --example serve -- --model path/to/diffusiongemma --port 8080
//! cargo run --release --example serve -- --model org/name   # downloaded from the Hub first
//! cargo run --release --example serve                       # a small random checkpoint
//! ```
//!
//! It listens at once and answers 503 (`/health` too) until the model is loaded. SIGINT or
//! SIGTERM stops it: no new connections, queued requests get 503, running ones end within one
//! denoising step with finish reason `cancelled`, then it exits 0. Logs go to stderr
//! (`RUST_LOG=debug` for more).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use dg_engine::{DiffusionGemma, Scheduler, SchedulerOptions};
use dg_server::{Server, ServerOptions};

#[path = "common/model_source.rs"]
mod model_source;
#[path = "common/synthetic.rs"]
mod synthetic;

#[derive(Parser, Debug)]
#[command(about = "Serve DiffusionGemma: OpenAI- and Anthropic-compatible HTTP API")]
struct Args {
    /// Checkpoint directory, or a Hugging Face repo id (`org/name`) downloaded into the Hugging
    /// Face cache first, while the server answers 503 (HF_HOME, HF_ENDPOINT, HF_TOKEN apply).
    /// Without it a small random-weight checkpoint is written to a temporary directory and
    /// served: its output is noise.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed in the log).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Worker threads of the numeric kernels (default: physical cores).
    #[arg(long)]
    threads: Option<usize>,
    /// LoRA adapter directory (adapter_config.json + adapters.safetensors), mounted on the
    /// model for every request.
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Most tokens one request may hold, prompt plus max_tokens (longer ones get a 400).
    #[arg(long, default_value_t = dg_engine::DEFAULT_MAX_CONTEXT)]
    max_context: usize,
    /// Model id in /v1/models and responses (default: the checkpoint directory's name).
    #[arg(long)]
    model_name: Option<String>,
    /// Sequences denoised together in one batched step.
    #[arg(long)]
    max_running: Option<usize>,
    /// Requests waiting for a place; more are refused with 429.
    #[arg(long)]
    max_queued: Option<usize>,
    /// Prompt plus max_tokens summed over running requests.
    #[arg(long)]
    max_tokens_in_flight: Option<usize>,
    /// Largest request body in bytes (413 above).
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Largest decoded image in bytes (413 above).
    #[arg(long)]
    max_image_bytes: Option<usize>,
    /// max_tokens of OpenAI requests that set none.
    #[arg(long)]
    default_max_tokens: Option<usize>,
    /// Seconds to wait for open responses after SIGINT / SIGTERM.
    #[arg(long)]
    shutdown_grace: Option<u64>,
}

fn main() -> Result<()> {
    // Before the runtime's threads exist, so that they share the setting's arena.
    dg_engine::retain_freed_memory();
    tokio::runtime::Runtime::new()?.block_on(serve())
}

async fn serve() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();

    let (dir, tmp) = match &args.model {
        Some(dir) => (dir.clone(), None),
        None => {
            let tmp = synthetic::random_checkpoint()?;
            tracing::warn!(
                "no --model given: serving a small RANDOM-weight checkpoint; its output is noise"
            );
            (tmp.path().to_owned(), Some(tmp))
        }
    };

    let mut options = ServerOptions::default();
    options.model_name = match (&args.model_name, &args.model) {
        (Some(name), _) => name.clone(),
        (None, Some(id)) if model_source::is_hub_model(id) => id.to_string_lossy().into_owned(),
        (None, Some(dir)) => dir
            .canonicalize()
            .unwrap_or_else(|_| dir.clone())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "diffusiongemma".into()),
        (None, None) => "diffusiongemma-random".into(),
    };
    if let Some(n) = args.max_body_bytes {
        options.max_body_bytes = n;
    }
    if let Some(n) = args.max_image_bytes {
        options.max_image_bytes = n;
    }
    if let Some(n) = args.default_max_tokens {
        options.default_max_tokens = n;
    }
    if let Some(s) = args.shutdown_grace {
        options.shutdown_grace = std::time::Duration::from_secs(s);
    }
    let mut scheduler_options = SchedulerOptions::default();
    if let Some(n) = args.max_running {
        scheduler_options.max_running = n;
    }
    if let Some(n) = args.max_queued {
        scheduler_options.max_queued = n;
    }
    if let Some(n) = args.max_tokens_in_flight {
        scheduler_options.max_tokens_in_flight = n;
    }

    let server = Server::new(options);
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    tracing::info!(
        "listening on http://{} (503 until the model is loaded)",
        listener.local_addr()?
    );

    // Load on a plain thread: a signal during loading ends the process without waiting for it.
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel::<Result<()>>();
    {
        let server = server.clone();
        let (threads, max_context) = (args.threads, args.max_context);
        let adapter = args.adapter.clone();
        std::thread::spawn(move || {
            let load = || -> Result<()> {
                let started = std::time::Instant::now();
                if model_source::is_hub_model(&dir) {
                    tracing::info!(
                        "getting {} from the Hugging Face Hub (files already in the cache are reused)",
                        dir.display()
                    );
                }
                let dir = model_source::checkpoint_dir(&dir, true)?;
                let mut builder = DiffusionGemma::builder(&dir).max_context(max_context);
                if let Some(threads) = threads {
                    builder = builder.threads(threads);
                }
                if let Some(adapter) = &adapter {
                    builder = builder.adapter(adapter);
                }
                let model = builder
                    .load()
                    .with_context(|| format!("loading {}", dir.display()))?;
                let scheduler = Scheduler::start(Arc::new(model), scheduler_options)
                    .context("starting the scheduler")?;
                server.set_ready(Arc::new(scheduler));
                tracing::info!(
                    "model {} loaded in {:.1}s: ready",
                    dir.display(),
                    started.elapsed().as_secs_f64()
                );
                Ok(())
            };
            let _ = loaded_tx.send(load());
        });
    }

    let mut serving = tokio::spawn(dg_server::serve(
        listener,
        server.clone(),
        dg_server::shutdown_signal(),
    ));
    // A failed load ends the process with an error; a signal before the model is loaded ends
    // it at once.
    tokio::select! {
        loaded = loaded_rx => loaded.context("the loading thread died")??,
        done = &mut serving => {
            done??;
            tracing::info!("stopped before the model was loaded");
            drop(tmp);
            return Ok(());
        }
    }
    serving.await??;
    tracing::info!("stopped");
    drop(tmp);
    Ok(())
}
