//! Continuous batching: requests that arrive at any time, from several threads, while others
//! run, leave or are cancelled, each get exactly the tokens they get alone (and the reference's,
//! where a golden case exists); admission bounds refuse instead of growing; shutdown ends
//! everything.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dg_engine::{
    DiffusionGemma, EngineError, Event, FinishReason, Generation, Request, Sampler, Scheduler,
    SchedulerOptions, Stream, Update,
};

mod common;

use common::{golden_request, goldens};
use dg_testkit::{fixtures, ids};

fn tiny() -> Arc<DiffusionGemma> {
    Arc::new(DiffusionGemma::load(fixtures().join("models/tiny")).expect("load tiny"))
}

fn options(max_running: usize, max_queued: usize, max_tokens_in_flight: usize) -> SchedulerOptions {
    let mut o = SchedulerOptions::default();
    o.max_running = max_running;
    o.max_queued = max_queued;
    o.max_tokens_in_flight = max_tokens_in_flight;
    o
}

/// Reads a stream to its end: the result and the concatenated text events.
fn drain(stream: Stream) -> (Generation, String) {
    let mut text = String::new();
    for update in stream {
        match update {
            Update::Event(Event::Text(t)) => text.push_str(&t),
            Update::Event(_) => {}
            Update::Done(generation) => return (generation, text),
            Update::Failed(e) => panic!("request failed: {e}"),
            _ => unreachable!(),
        }
    }
    panic!("the stream ended without a result")
}

/// Polls until `done` holds (the scheduler works on its own thread); fails after a generous
/// bound instead of hanging.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Requests beyond the goldens: sampled (temperature > 0), entropy-bound, several blocks.
fn extra_requests() -> Vec<Request> {
    (0..6)
        .map(|i| {
            let mut r = Request::tokens(vec![3 + i, 40 + 2 * i, 7, 90 + i]);
            r.max_tokens = 20 + 9 * i as usize;
            r.min_canvas = Some(16);
            r.seed = 100 + u64::from(i);
            r.temperature = [0.0, 0.7, 1.0][i as usize % 3];
            if i % 2 == 1 {
                r.sampler = Sampler::EntropyBound { bound: None };
            }
            r
        })
        .collect()
}

#[test]
fn requests_arriving_at_any_time_get_the_tokens_they_get_alone() {
    let model = tiny();
    let cases = goldens();
    let extra = extra_requests();
    let alone: Vec<Generation> = extra.iter().map(|r| model.generate(r).unwrap()).collect();
    // (request, expected ids, cancel after this many events)
    let mut work: Vec<(Request, Option<Vec<u32>>, Option<usize>)> = Vec::new();
    for case in &cases {
        work.push((
            golden_request(case),
            Some(ids(&case["outputs"]["emitted_ids"])),
            None,
        ));
    }
    for (r, g) in extra.iter().zip(&alone) {
        work.push((r.clone(), Some(g.token_ids.clone()), None));
    }
    for (i, r) in extra.iter().enumerate().take(4) {
        work.push((r.clone(), None, Some(1 + 3 * i)));
    }
    let total = work.len();
    let scheduler = Scheduler::start(model.clone(), options(5, 64, 1 << 20)).unwrap();
    let threads = 4;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (scheduler, work) = (&scheduler, &work);
            s.spawn(move || {
                for (i, (request, expected, cancel_after)) in
                    work.iter().enumerate().skip(t).step_by(threads)
                {
                    // Staggered arrivals: some while others prefill, denoise or finish.
                    std::thread::sleep(Duration::from_millis(((i * 7 + t * 3) % 23) as u64));
                    let stream = scheduler.submit(request.clone()).unwrap();
                    if let Some(n) = cancel_after {
                        let mut stream = stream;
                        for _ in 0..*n {
                            stream.blocking_recv();
                        }
                        drop(stream);
                        continue;
                    }
                    let (generation, text) = drain(stream);
                    assert_eq!(
                        Some(&generation.token_ids),
                        expected.as_ref(),
                        "request {i} through the scheduler"
                    );
                    assert_eq!(text, generation.text, "request {i}: streamed text");
                }
            });
        }
    });
    eventually("every request finished", || {
        scheduler.status().finished == total as u64
    });
    let status = scheduler.status();
    assert_eq!(
        (status.queued, status.running, status.tokens_in_flight),
        (0, 0, 0)
    );
    assert!(status.rounds > 0 && status.sequence_steps >= status.rounds);
    assert!(
        status.sequence_steps > status.rounds,
        "some rounds ran several sequences"
    );
}

#[test]
fn results_match_generate_for_every_golden_case_in_any_order() {
    let model = tiny();
    let cases = goldens();
    let scheduler = Scheduler::start(model.clone(), options(3, 64, 1 << 20)).unwrap();
    // Submitted in reverse, all at once: the queue admits three at a time.
    let streams: Vec<Stream> = cases
        .iter()
        .rev()
        .map(|c| scheduler.submit(golden_request(c)).unwrap())
        .collect();
    for (case, stream) in cases.iter().rev().zip(streams) {
        let generation = stream.wait().unwrap();
        let alone = model.generate(&golden_request(case)).unwrap();
        assert_eq!(generation.token_ids, alone.token_ids);
        assert_eq!(generation.text, alone.text);
        assert_eq!(generation.finish_reason, alone.finish_reason);
        assert_eq!(
            generation.stats.steps_per_block,
            alone.stats.steps_per_block
        );
    }
}

/// A long request: entropy-bound, 48 steps, several blocks.
fn long_request() -> Request {
    let mut r = Request::tokens(vec![10, 11, 12]);
    r.sampler = Sampler::EntropyBound { bound: None };
    r.max_tokens = 200;
    r.min_canvas = Some(16);
    r
}

fn next_draft(stream: &mut Stream) {
    loop {
        match stream.blocking_recv().expect("the stream goes on") {
            Update::Event(Event::Draft { .. }) => return,
            Update::Event(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn cancel_ends_a_request_within_one_step_and_dropping_a_stream_cancels() {
    let scheduler = Scheduler::start(tiny(), options(4, 8, 1 << 20)).unwrap();
    let mut stream = scheduler.submit(long_request()).unwrap();
    next_draft(&mut stream);
    next_draft(&mut stream);
    stream.cancel();
    let mut drafts_after = 0;
    let generation = loop {
        match stream.blocking_recv().unwrap() {
            Update::Event(Event::Draft { .. }) => drafts_after += 1,
            Update::Done(g) => break g,
            _ => {}
        }
    };
    assert!(drafts_after <= 1, "{drafts_after} steps ran after cancel");
    assert_eq!(generation.finish_reason, FinishReason::Cancelled);
    assert!(stream.blocking_recv().is_none(), "nothing after the result");

    let mut dropped = scheduler.submit(long_request()).unwrap();
    next_draft(&mut dropped);
    drop(dropped);
    eventually("the dropped request ended", || {
        let s = scheduler.status();
        s.finished == 2 && s.running == 0
    });
}

#[test]
fn admission_is_bounded_and_refusals_are_clear() {
    let scheduler = Scheduler::start(tiny(), options(1, 1, 300)).unwrap();
    // Larger than the token budget alone: never admissible.
    let mut big = Request::tokens(vec![5; 10]);
    big.max_tokens = 291;
    let err = scheduler.submit(big).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::InvalidArgument {
                name: "max_tokens",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("exceed the 300 tokens in flight"),
        "{err}"
    );
    let mut running = scheduler.submit(long_request()).unwrap();
    next_draft(&mut running);
    // The batch is full (one running): the next waits, the one after is refused.
    let small = || {
        let mut r = Request::tokens(vec![5, 6]);
        r.max_tokens = 20;
        r
    };
    let waiting = scheduler.submit(small()).unwrap();
    let err = scheduler.submit(small()).unwrap_err();
    assert!(matches!(err, EngineError::Overloaded { .. }), "{err:?}");
    assert!(
        err.to_string().contains("1 requests are already waiting"),
        "{err}"
    );
    assert_eq!(scheduler.status().queued, 1);
    // Invalid requests are refused at submission.
    let mut bad = Request::tokens(vec![5]);
    bad.stop = vec![String::new()];
    assert!(scheduler
        .submit(bad)
        .unwrap_err()
        .to_string()
        .starts_with("stop:"));
    running.cancel();
    let generation = waiting.wait().unwrap();
    assert!(!generation.token_ids.is_empty() || generation.finish_reason == FinishReason::Stop);
    assert!(SchedulerOptions::default().max_running > 0);
    assert!(Scheduler::start(tiny(), options(0, 1, 1)).is_err());
}

#[test]
fn shutdown_ends_running_and_queued_requests_and_refuses_new_ones() {
    let scheduler = Scheduler::start(tiny(), options(1, 4, 1 << 20)).unwrap();
    let mut running = scheduler.submit(long_request()).unwrap();
    next_draft(&mut running);
    let queued = scheduler.submit(long_request()).unwrap();
    scheduler.shutdown();
    let (generation, _) = drain(running);
    assert_eq!(generation.finish_reason, FinishReason::Cancelled);
    assert!(matches!(queued.wait(), Err(EngineError::ShuttingDown)));
    assert!(matches!(
        scheduler.submit(Request::tokens(vec![5])),
        Err(EngineError::ShuttingDown)
    ));
    scheduler.shutdown();
}

#[test]
fn a_model_streams_one_request_as_an_iterator() {
    let model = tiny();
    let request = golden_request(&goldens()[0]);
    let alone = model.generate(&request).unwrap();
    let (generation, text) = drain(model.stream(request.clone()).unwrap());
    assert_eq!(generation.token_ids, alone.token_ids);
    assert_eq!(text, alone.text);
    // Dropped after its first draft: the thread stops within a step (the model is free again).
    let mut stream = model.stream(long_request()).unwrap();
    next_draft(&mut stream);
    drop(stream);
    assert_eq!(model.generate(&request).unwrap().token_ids, alone.token_ids);
    // Invalid requests are refused at once; bad prompts arrive as a failure.
    assert!(model
        .stream(Request::tokens(vec![5]).max_tokens(0))
        .is_err());
    let mut bad = model.stream(Request::tokens(vec![100_000])).unwrap();
    assert!(matches!(bad.blocking_recv(), Some(Update::Failed(_))));
}
