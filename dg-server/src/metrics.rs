//! Prometheus text-format metrics, written by hand: request counts by endpoint and outcome,
//! tokens, denoising steps, request latency, and the scheduler's own counters and gauges.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dg_engine::{FinishReason, Generation, SchedulerStatus};

use crate::error::ApiError;

/// The generation endpoints, as metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    ChatCompletions,
    Completions,
    Messages,
}

impl Endpoint {
    const ALL: [Endpoint; 3] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Messages,
    ];

    fn label(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Messages => "messages",
        }
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered (finish reason stop, stop sequence or length).
    Ok,
    /// 4xx other than 429: the client's request was invalid.
    ClientError,
    /// 429: the scheduler's queue or token budget was full.
    Rejected,
    /// 503: loading or shutting down.
    Unavailable,
    /// 5xx other than 503, or a stream that failed after it began.
    Error,
    /// The client went away, or a shutdown cancelled the generation.
    Cancelled,
}

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::ClientError,
        Outcome::Rejected,
        Outcome::Unavailable,
        Outcome::Error,
        Outcome::Cancelled,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::Rejected => "rejected",
            Outcome::Unavailable => "unavailable",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }

    pub(crate) fn of_error(e: &ApiError) -> Outcome {
        match e.status.as_u16() {
            429 => Outcome::Rejected,
            503 => Outcome::Unavailable,
            s if s >= 500 => Outcome::Error,
            _ => Outcome::ClientError,
        }
    }
}

/// Upper bounds of the request-duration histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

const FINISH: [&str; 4] = ["stop", "stop_sequence", "length", "cancelled"];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The server's counters.
#[derive(Default)]
pub(crate) struct Metrics {
    requests: Mutex<[[u64; Outcome::ALL.len()]; Endpoint::ALL.len()]>,
    durations: Mutex<[Histogram; Endpoint::ALL.len()]>,
    finish: Mutex<[u64; FINISH.len()]>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    denoising_steps: AtomicU64,
    /// Requests being answered now (HTTP level: parsing, queued, running or streaming).
    active: AtomicU64,
}

fn index<T: PartialEq>(all: &[T], x: &T) -> usize {
    all.iter().position(|a| a == x).expect("listed")
}

fn finish_label(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::StopSequence => "stop_sequence",
        FinishReason::Length => "length",
        _ => "cancelled",
    }
}

impl Metrics {
    fn record(&self, endpoint: Endpoint, outcome: Outcome, seconds: f64) {
        let e = index(&Endpoint::ALL, &endpoint);
        self.requests.lock().unwrap()[e][index(&Outcome::ALL, &outcome)] += 1;
        let mut durations = self.durations.lock().unwrap();
        let h = &mut durations[e];
        for (count, bound) in h.counts.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *count += 1;
            }
        }
        h.count += 1;
        h.sum += seconds;
    }

    fn generation(&self, g: &Generation) {
        self.prompt_tokens
            .fetch_add(g.stats.prompt_tokens as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(g.stats.generated_tokens as u64, Ordering::Relaxed);
        self.denoising_steps
            .fetch_add(g.stats.denoising_steps as u64, Ordering::Relaxed);
        let f = index(&FINISH, &finish_label(g.finish_reason));
        self.finish.lock().unwrap()[f] += 1;
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self, ready: bool, status: Option<SchedulerStatus>) -> String {
        let mut out = String::new();
        let help = |out: &mut String, name: &str, kind: &str, text: &str| {
            let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
        };
        help(
            &mut out,
            "dg_model_loaded",
            "gauge",
            "1 once the model is loaded and requests are served.",
        );
        let _ = writeln!(out, "dg_model_loaded {}", u8::from(ready));

        help(
            &mut out,
            "dg_requests_total",
            "counter",
            "Generation requests by endpoint and outcome.",
        );
        let requests = *self.requests.lock().unwrap();
        for (e, endpoint) in Endpoint::ALL.iter().enumerate() {
            for (o, outcome) in Outcome::ALL.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "dg_requests_total{{endpoint=\"{}\",outcome=\"{}\"}} {}",
                    endpoint.label(),
                    outcome.label(),
                    requests[e][o]
                );
            }
        }
        help(
            &mut out,
            "dg_requests_active",
            "gauge",
            "Generation requests being answered (queued, running or streaming).",
        );
        let _ = writeln!(
            out,
            "dg_requests_active {}",
            self.active.load(Ordering::Relaxed)
        );

        help(
            &mut out,
            "dg_request_duration_seconds",
            "histogram",
            "Time from a request's arrival to its last byte, by endpoint.",
        );
        {
            let durations = self.durations.lock().unwrap();
            for (e, endpoint) in Endpoint::ALL.iter().enumerate() {
                let h = &durations[e];
                let label = endpoint.label();
                for (count, bound) in h.counts.iter().zip(BUCKETS) {
                    let _ = writeln!(
                        out,
                        "dg_request_duration_seconds_bucket{{endpoint=\"{label}\",le=\"{bound}\"}} {count}"
                    );
                }
                let _ = writeln!(
                    out,
                    "dg_request_duration_seconds_bucket{{endpoint=\"{label}\",le=\"+Inf\"}} {}\n\
                     dg_request_duration_seconds_sum{{endpoint=\"{label}\"}} {}\n\
                     dg_request_duration_seconds_count{{endpoint=\"{label}\"}} {}",
                    h.count, h.sum, h.count
                );
            }
        }

        help(
            &mut out,
            "dg_finish_reasons_total",
            "counter",
            "Finished generations by finish reason.",
        );
        let finish = *self.finish.lock().unwrap();
        for (reason, count) in FINISH.iter().zip(finish) {
            let _ = writeln!(
                out,
                "dg_finish_reasons_total{{reason=\"{reason}\"}} {count}"
            );
        }
        for (name, text, value) in [
            (
                "dg_prompt_tokens_total",
                "Prompt tokens of finished generations.",
                &self.prompt_tokens,
            ),
            (
                "dg_generated_tokens_total",
                "Generated tokens of finished generations (a final EOS counted).",
                &self.generated_tokens,
            ),
            (
                "dg_denoising_steps_total",
                "Denoising steps of finished generations.",
                &self.denoising_steps,
            ),
        ] {
            help(&mut out, name, "counter", text);
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }

        if let Some(s) = status {
            let gauges: [(&str, &str, f64); 4] = [
                (
                    "dg_scheduler_running",
                    "Requests in the running batch (the batch size).",
                    s.running as f64,
                ),
                (
                    "dg_scheduler_queued",
                    "Requests waiting for a place in the batch.",
                    s.queued as f64,
                ),
                (
                    "dg_scheduler_tokens_in_flight",
                    "Prompt plus maximum generated tokens of the queued and running requests.",
                    s.tokens_in_flight as f64,
                ),
                (
                    "dg_scheduler_last_round_seconds",
                    "Duration of the last scheduler round (one batched denoising step).",
                    s.last_round_seconds,
                ),
            ];
            for (name, text, value) in gauges {
                help(&mut out, name, "gauge", text);
                let _ = writeln!(out, "{name} {value}");
            }
            let counters: [(&str, &str, f64); 5] = [
                (
                    "dg_scheduler_rounds_total",
                    "Scheduler rounds (batched denoising steps).",
                    s.rounds as f64,
                ),
                (
                    "dg_scheduler_round_seconds_total",
                    "Time spent in scheduler rounds.",
                    s.round_seconds,
                ),
                (
                    "dg_scheduler_sequence_steps_total",
                    "Denoising steps summed over the requests of each round.",
                    s.sequence_steps as f64,
                ),
                (
                    "dg_scheduler_prefill_passes_total",
                    "Encoder passes (prompts and committed blocks).",
                    s.prefill_passes as f64,
                ),
                (
                    "dg_scheduler_prefill_tokens_total",
                    "Tokens through the encoder.",
                    s.prefill_tokens as f64,
                ),
            ];
            for (name, text, value) in counters {
                help(&mut out, name, "counter", text);
                let _ = writeln!(out, "{name} {value}");
            }
        }
        out
    }
}

/// One request's record: counted once, when it is settled or dropped. A record dropped before
/// it was settled counts as cancelled (the client went away mid-request).
pub(crate) struct Record {
    metrics: Arc<Metrics>,
    endpoint: Endpoint,
    started: Instant,
    outcome: Option<Outcome>,
}

impl Record {
    pub(crate) fn start(metrics: Arc<Metrics>, endpoint: Endpoint) -> Record {
        metrics.active.fetch_add(1, Ordering::Relaxed);
        Record {
            metrics,
            endpoint,
            started: Instant::now(),
            outcome: None,
        }
    }

    /// A finished generation: its tokens and steps are counted; the request is `ok` unless it
    /// was cancelled (by a shutdown).
    pub(crate) fn done(&mut self, g: &Generation) {
        self.metrics.generation(g);
        self.outcome = Some(if g.finish_reason == FinishReason::Cancelled {
            Outcome::Cancelled
        } else {
            Outcome::Ok
        });
    }

    pub(crate) fn failed(&mut self, e: &ApiError) {
        self.outcome = Some(Outcome::of_error(e));
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        self.endpoint
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.metrics.active.fetch_sub(1, Ordering::Relaxed);
        let outcome = self.outcome.unwrap_or(Outcome::Cancelled);
        self.metrics
            .record(self.endpoint, outcome, self.started.elapsed().as_secs_f64());
    }
}
