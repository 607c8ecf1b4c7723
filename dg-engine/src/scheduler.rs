//! Continuous batching: requests arrive at any time, from any thread, and join the running
//! batch at the next round boundary; sequences leave as they finish.
//!
//! One worker thread owns a [`Batch`](crate::batch::Batch). Between two rounds it admits
//! queued requests in arrival order (their prompts prefilled together in one encoder pass, so
//! running sequences wait at most one prefill pass), cancels the sequences whose consumer has
//! gone, and hands finished results out. Since a sequence's tokens do not depend on what it is
//! batched with, every request gets exactly the tokens it gets alone, whatever arrives, leaves
//! or is cancelled around it. Admission is bounded (sequences per round, queued requests,
//! tokens in flight): past a bound a request is refused with [`EngineError::Overloaded`]
//! instead of queues or caches growing without limit.

use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::batch::{Batch, Job};
use crate::engine::DiffusionGemma;
use crate::error::{EngineError, Result};
use crate::output::{Event, FinishReason, Generation, Stats};
use crate::request::Request;

/// Bounds on what a [`Scheduler`] takes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerOptions {
    /// Sequences denoised together in one round.
    pub max_running: usize,
    /// Requests waiting for a place; one more is refused as overloaded.
    pub max_queued: usize,
    /// Prompt tokens plus `max_tokens` summed over the running requests (what their caches can
    /// grow to). A request alone above it is refused as invalid.
    pub max_tokens_in_flight: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            max_running: 16,
            max_queued: 64,
            max_tokens_in_flight: 65536,
        }
    }
}

/// What a [`Scheduler`] is doing, and counters since it started.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SchedulerStatus {
    /// Requests waiting for a place.
    pub queued: usize,
    /// Sequences in the batch.
    pub running: usize,
    /// Prompt tokens plus `max_tokens` of the running requests.
    pub tokens_in_flight: usize,
    /// Denoising rounds run.
    pub rounds: u64,
    /// Denoising steps summed over sequences (a round of n sequences counts n).
    pub sequence_steps: u64,
    /// Time spent in rounds, in seconds.
    pub round_seconds: f64,
    /// Duration of the last round, in seconds.
    pub last_round_seconds: f64,
    /// Prefill passes run (each takes every request admitted at one boundary).
    pub prefill_passes: u64,
    /// Prompt tokens prefilled.
    pub prefill_tokens: u64,
    /// Requests that ended (done, failed or cancelled).
    pub finished: u64,
}

/// One update of a request's [`Stream`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Update {
    /// A generation event.
    Event(Event),
    /// The result; the stream ends.
    Done(Generation),
    /// The request failed; the stream ends.
    Failed(EngineError),
}

/// How the worker reaches a request's consumer.
struct Route {
    tx: mpsc::UnboundedSender<Update>,
    cancel: Arc<AtomicBool>,
    tokens: usize,
    prompt_tokens: usize,
}

impl Route {
    fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.tx.is_closed()
    }

    fn send(&self, update: Update) -> ControlFlow<()> {
        if self.tx.send(update).is_err() || self.cancel.load(Ordering::Relaxed) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    /// Ends a request that never ran.
    fn cancelled(&self) {
        let _ = self.tx.send(Update::Done(Generation {
            text: String::new(),
            token_ids: Vec::new(),
            finish_reason: FinishReason::Cancelled,
            stop_sequence: None,
            logprobs: None,
            stats: Stats {
                prompt_tokens: self.prompt_tokens,
                ..Stats::default()
            },
        }));
    }
}

struct Pending {
    key: usize,
    job: Job,
    route: Route,
}

struct Queue {
    pending: VecDeque<Pending>,
    accepting: bool,
    next_key: usize,
    status: SchedulerStatus,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    options: SchedulerOptions,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The worker never panics while holding the lock; a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Serves requests with continuous batching on a worker thread. `Send + Sync`: share it (in an
/// `Arc`) between the threads or tasks that submit.
///
/// ```
/// use std::sync::Arc;
/// use dg_engine::{DiffusionGemma, Event, Message, Request, Scheduler, SchedulerOptions, Update};
///
/// let dir = "path/to/diffusiongemma";
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny");
/// let model = Arc::new(DiffusionGemma::load(dir)?);
/// let scheduler = Arc::new(Scheduler::start(model, SchedulerOptions::default())?);
///
/// // Another thread submits and waits for the whole answer ...
/// let shared = scheduler.clone();
/// let other = std::thread::spawn(move || {
///     shared.submit(Request::chat(vec![Message::user("Hi")]).max_tokens(32))?.wait()
/// });
///
/// // ... while this one reads its stream as an iterator; both share each denoising pass.
/// let request = Request::chat(vec![Message::user("Write a haiku.")]).max_tokens(64);
/// for update in scheduler.submit(request)? {
///     match update {
///         Update::Event(Event::Text(text)) => print!("{text}"),
///         Update::Done(answer) => println!("\n[{:?}]", answer.finish_reason),
///         Update::Failed(e) => return Err(e),
///         _ => {}
///     }
/// }
/// println!("{}", other.join().unwrap()?.text);
/// # Ok::<(), dg_engine::EngineError>(())
/// ```
pub struct Scheduler {
    model: Arc<DiffusionGemma>,
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("options", &self.shared.options)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl DiffusionGemma {
    /// Generates on a thread of its own and returns the [`Stream`] of its updates: an iterator
    /// for sync code (`for update in model.stream(request)? { ... }`), `recv().await` for
    /// async code; dropping it cancels within one denoising step. For many requests arriving
    /// over time, a [`Scheduler`] batches them instead.
    pub fn stream(self: &Arc<Self>, request: Request) -> Result<Stream> {
        Stream::spawn(self.clone(), request)
    }
}

impl Scheduler {
    /// Starts the worker thread.
    pub fn start(model: Arc<DiffusionGemma>, options: SchedulerOptions) -> Result<Self> {
        for (name, value) in [
            ("max_running", options.max_running),
            ("max_queued", options.max_queued),
            ("max_tokens_in_flight", options.max_tokens_in_flight),
        ] {
            if value == 0 {
                return Err(EngineError::InvalidArgument {
                    name,
                    reason: "must be at least 1".into(),
                });
            }
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                accepting: true,
                next_key: 0,
                status: SchedulerStatus::default(),
            }),
            wake: Condvar::new(),
            options,
        });
        let worker = {
            let (model, shared) = (model.clone(), shared.clone());
            std::thread::Builder::new()
                .name("dg-scheduler".into())
                .spawn(move || work(&model, &shared))
                .map_err(|e| EngineError::InvalidArgument {
                    name: "scheduler",
                    reason: format!("cannot start the worker thread: {e}"),
                })?
        };
        Ok(Scheduler {
            model,
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// The model it serves.
    pub fn model(&self) -> &Arc<DiffusionGemma> {
        &self.model
    }

    /// The bounds it was started with.
    pub fn options(&self) -> SchedulerOptions {
        self.shared.options
    }

    /// Queues a request. Validation and prompt preparation (template, tokenizer, vision tower)
    /// run on the calling thread, so errors in the request come back here; from async code call
    /// it on a blocking thread. Refused with [`EngineError::Overloaded`] when the queue is full
    /// and [`EngineError::ShuttingDown`] after [`shutdown`](Self::shutdown).
    pub fn submit(&self, request: Request) -> Result<Stream> {
        request.validate()?;
        self.check_admission(&self.shared.lock())?;
        let job = self.model.job(&request)?;
        let limit = self.shared.options.max_tokens_in_flight;
        let tokens = job.tokens();
        if tokens > limit {
            return Err(EngineError::InvalidArgument {
                name: "max_tokens",
                reason: format!(
                    "{} prompt tokens plus max_tokens {} exceed the {limit} tokens in flight this \
                     scheduler allows",
                    job.prompt.ids.len(),
                    request.max_tokens
                ),
            });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let route = Route {
            tx,
            cancel: cancel.clone(),
            tokens,
            prompt_tokens: job.prompt.ids.len(),
        };
        let mut queue = self.shared.lock();
        self.check_admission(&queue)?;
        let key = queue.next_key;
        queue.next_key += 1;
        queue.pending.push_back(Pending { key, job, route });
        queue.status.queued = queue.pending.len();
        drop(queue);
        self.shared.wake.notify_one();
        Ok(Stream { key, rx, cancel })
    }

    fn check_admission(&self, queue: &Queue) -> Result<()> {
        if !queue.accepting {
            return Err(EngineError::ShuttingDown);
        }
        let max = self.shared.options.max_queued;
        if queue.pending.len() >= max {
            return Err(EngineError::Overloaded {
                reason: format!("{max} requests are already waiting"),
            });
        }
        Ok(())
    }

    /// Queue depth, batch size and counters.
    pub fn status(&self) -> SchedulerStatus {
        self.shared.lock().status.clone()
    }

    /// Stops taking requests: queued ones end with [`EngineError::ShuttingDown`], running ones
    /// are cancelled within one denoising step and end with [`FinishReason::Cancelled`] and what
    /// they committed. Returns once the worker has stopped; calling it again does nothing.
    pub fn shutdown(&self) {
        let mut queue = self.shared.lock();
        queue.accepting = false;
        for pending in queue.pending.drain(..) {
            let _ = pending
                .route
                .tx
                .send(Update::Failed(EngineError::ShuttingDown));
        }
        queue.status.queued = 0;
        drop(queue);
        self.shared.wake.notify_all();
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The worker: admit, cancel, run a round, hand out results; sleep when there is nothing to do.
fn work(model: &DiffusionGemma, shared: &Shared) {
    let options = shared.options;
    let text = model.model();
    let pool = model.pool();
    let detok = || model.tokenizer().stream_detokenizer();
    let mut batch = Batch::default();
    let mut routes: HashMap<usize, Route> = HashMap::new();
    let mut tokens_in_flight = 0usize;
    loop {
        let (admitted, accepting) = {
            let mut queue = shared.lock();
            while queue.accepting && queue.pending.is_empty() && batch.len() == 0 {
                queue = shared.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            if !queue.accepting && batch.len() == 0 {
                return;
            }
            let mut admitted = Vec::new();
            while let Some(next) = queue.pending.front() {
                if next.route.is_cancelled() {
                    let gone = queue.pending.pop_front().expect("front exists");
                    gone.route.cancelled();
                    queue.status.finished += 1;
                    continue;
                }
                let full = batch.len() + admitted.len() >= options.max_running
                    || tokens_in_flight + next.route.tokens > options.max_tokens_in_flight;
                if full {
                    break;
                }
                let next = queue.pending.pop_front().expect("front exists");
                tokens_in_flight += next.route.tokens;
                admitted.push(next);
            }
            queue.status.queued = queue.pending.len();
            (admitted, queue.accepting)
        };

        let keys: Vec<usize> = batch.keys().collect();
        for key in keys {
            if !accepting || routes[&key].is_cancelled() {
                batch.cancel(key);
            }
        }

        let mut round = RoundCounters::default();
        if !admitted.is_empty() {
            let mut jobs = Vec::with_capacity(admitted.len());
            for Pending { key, job, route } in admitted {
                round.prefill_tokens += job.prompt.ids.len() as u64;
                routes.insert(key, route);
                jobs.push((key, job));
            }
            let keys: Vec<usize> = jobs.iter().map(|(key, _)| *key).collect();
            let mut deliver = |key: usize, event| deliver(&routes, key, event);
            if let Err(e) = batch.admit(text, pool, jobs, detok, &mut deliver) {
                fail(&keys, e, &mut routes, &mut tokens_in_flight, &mut round);
            }
            round.prefill_passes += 1;
        }

        let denoising = batch.denoising();
        if denoising > 0 {
            let start = Instant::now();
            let mut deliver = |key: usize, event| deliver(&routes, key, event);
            let result = batch.round(text, pool, &mut deliver);
            round.seconds = Some(start.elapsed().as_secs_f64());
            round.sequence_steps = denoising as u64;
            if let Err(e) = result {
                let keys: Vec<usize> = batch.keys().collect();
                batch = Batch::default();
                fail(&keys, e, &mut routes, &mut tokens_in_flight, &mut round);
            }
        }

        let mut deliver = |key: usize, event| deliver(&routes, key, event);
        let finished: Vec<_> = batch
            .take_finished(&mut deliver)
            .into_iter()
            .map(|(key, result)| {
                let route = routes.remove(&key).expect("every sequence has a route");
                tokens_in_flight -= route.tokens;
                round.finished += 1;
                (route, result)
            })
            .collect();

        // The status first: a client that has its answer sees it counted as finished.
        {
            let mut queue = shared.lock();
            round.record(&mut queue.status);
            queue.status.running = batch.len();
            queue.status.tokens_in_flight = tokens_in_flight;
        }
        for (route, result) in finished {
            let _ = route.tx.send(match result {
                Ok(generation) => Update::Done(generation),
                Err(e) => Update::Failed(e),
            });
        }
    }
}

/// What one pass of the worker loop adds to the status.
#[derive(Default)]
struct RoundCounters {
    seconds: Option<f64>,
    sequence_steps: u64,
    prefill_passes: u64,
    prefill_tokens: u64,
    finished: u64,
}

impl RoundCounters {
    fn record(&self, status: &mut SchedulerStatus) {
        if let Some(seconds) = self.seconds {
            status.rounds += 1;
            status.round_seconds += seconds;
            status.last_round_seconds = seconds;
        }
        status.sequence_steps += self.sequence_steps;
        status.prefill_passes += self.prefill_passes;
        status.prefill_tokens += self.prefill_tokens;
        status.finished += self.finished;
    }
}

fn deliver(routes: &HashMap<usize, Route>, key: usize, event: Event) -> ControlFlow<()> {
    routes.get(&key).map_or(ControlFlow::Break(()), |route| {
        route.send(Update::Event(event))
    })
}

/// Ends the requests of a failed shared pass.
fn fail(
    keys: &[usize],
    error: EngineError,
    routes: &mut HashMap<usize, Route>,
    tokens_in_flight: &mut usize,
    round: &mut RoundCounters,
) {
    let error = Arc::new(error);
    for key in keys {
        if let Some(route) = routes.remove(key) {
            *tokens_in_flight -= route.tokens;
            round.finished += 1;
            let _ = route.tx.send(Update::Failed(EngineError::Batch {
                source: error.clone(),
            }));
        }
    }
}

/// The updates of one submitted request, in order: [`Event::Prefilled`] once it is admitted and
/// prefilled (always its first event), its other events, then [`Update::Done`] or
/// [`Update::Failed`] (a request failed or cancelled before admission has no events). Dropping it (or [`cancel`](Self::cancel)) cancels the request within one
/// denoising step. Read it from async code with [`recv`](Self::recv), from sync code as an
/// iterator or with [`blocking_recv`](Self::blocking_recv).
#[derive(Debug)]
pub struct Stream {
    key: usize,
    rx: mpsc::UnboundedReceiver<Update>,
    cancel: Arc<AtomicBool>,
}

impl Stream {
    /// Runs `request` alone on a new thread (see [`DiffusionGemma::stream`]).
    pub(crate) fn spawn(model: Arc<DiffusionGemma>, request: Request) -> Result<Stream> {
        request.validate()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let route = Route {
            tx,
            cancel: cancel.clone(),
            tokens: 0,
            prompt_tokens: 0,
        };
        std::thread::Builder::new()
            .name("dg-generate".into())
            .spawn(move || {
                let result = model.generate_stream(&request, |e| route.send(Update::Event(e)));
                let _ = route.tx.send(match result {
                    Ok(generation) => Update::Done(generation),
                    Err(e) => Update::Failed(e),
                });
            })
            .map_err(|e| EngineError::InvalidArgument {
                name: "stream",
                reason: format!("cannot start a generation thread: {e}"),
            })?;
        Ok(Stream { key: 0, rx, cancel })
    }

    /// The request's number, unique within its scheduler (in submission order).
    pub fn id(&self) -> usize {
        self.key
    }

    /// The next update; `None` after the last.
    pub async fn recv(&mut self) -> Option<Update> {
        self.rx.recv().await
    }

    /// The next update, blocking the thread; `None` after the last. Do not call it inside an
    /// async runtime (it panics there): use [`recv`](Self::recv).
    pub fn blocking_recv(&mut self) -> Option<Update> {
        self.rx.blocking_recv()
    }

    /// The next update if one is waiting, without blocking (`None`: nothing yet, or ended).
    pub fn try_recv(&mut self) -> Option<Update> {
        self.rx.try_recv().ok()
    }

    /// Cancels the request: it ends within one denoising step with
    /// [`FinishReason::Cancelled`] and what it committed.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Blocks until the result, skipping events.
    pub fn wait(mut self) -> Result<Generation> {
        while let Some(update) = self.blocking_recv() {
            match update {
                Update::Done(generation) => return Ok(generation),
                Update::Failed(e) => return Err(e),
                Update::Event(_) => {}
            }
        }
        Err(EngineError::ShuttingDown)
    }
}

impl Iterator for Stream {
    type Item = Update;

    fn next(&mut self) -> Option<Update> {
        self.blocking_recv()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.cancel();
    }
}
