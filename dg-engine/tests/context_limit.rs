//! The context limit: a request whose prompt plus max_tokens exceeds it is refused before its
//! prompt is encoded, with an error naming the prompt and the limit, and a model shared by
//! other threads goes on serving them.

use std::sync::Arc;

use dg_engine::{DiffusionGemma, EngineError, Request, Scheduler, SchedulerOptions};

use dg_testkit::fixtures;

#[test]
fn a_request_over_the_context_limit_is_refused_and_names_it() {
    let model = DiffusionGemma::builder(fixtures().join("models/tiny"))
        .max_context(50)
        .load()
        .unwrap();
    assert_eq!(model.max_context(), 50);
    let mut fits = Request::tokens(vec![5; 10]);
    fits.max_tokens = 40;
    model.generate(&fits).unwrap();
    let mut over = fits.clone();
    over.max_tokens = 41;
    let err = model.generate(&over).unwrap_err();
    assert!(
        matches!(err, EngineError::InvalidArgument { name: "prompt", .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("10 prompt tokens plus max_tokens 41 exceed the context limit of 50"),
        "{text}"
    );
    // A chat prompt is measured after the template.
    let mut chat = Request::chat(vec![dg_engine::Message::user("word ".repeat(200))]);
    chat.max_tokens = 1;
    assert!(model
        .generate(&chat)
        .unwrap_err()
        .to_string()
        .contains("context limit of 50"));
    assert!(DiffusionGemma::builder(fixtures().join("models/tiny"))
        .max_context(0)
        .load()
        .is_err());
}

#[test]
fn a_huge_prompt_is_refused_while_other_requests_are_served() {
    let model = Arc::new(DiffusionGemma::load(fixtures().join("models/tiny")).unwrap());
    let scheduler = Scheduler::start(model.clone(), SchedulerOptions::default()).unwrap();
    let mut small = Request::tokens(vec![7, 8, 9]);
    small.max_tokens = 24;
    let alone = model.generate(&small).unwrap();
    std::thread::scope(|s| {
        let served = s.spawn(|| scheduler.submit(small.clone()).unwrap().wait().unwrap());
        // Ten million tokens, and a ten-megabyte message: both refused at once.
        let err = scheduler
            .submit(Request::tokens(vec![5; 10_000_000]))
            .unwrap_err();
        assert!(err.to_string().contains("context limit"), "{err}");
        let err = scheduler
            .submit(Request::text("many words ".repeat(1_000_000)))
            .unwrap_err();
        assert!(err.to_string().contains("context limit"), "{err}");
        assert_eq!(served.join().unwrap().token_ids, alone.token_ids);
    });
}

#[test]
fn max_tokens_alone_over_the_limit_names_max_tokens() {
    let model = DiffusionGemma::builder(fixtures().join("models/tiny"))
        .max_context(50)
        .load()
        .unwrap();
    let err = model
        .generate(&Request::tokens(vec![5]).max_tokens(50))
        .unwrap_err();
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
    assert!(err.to_string().contains("context limit of 50"), "{err}");
}
