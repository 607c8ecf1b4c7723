//! Stop strings: cut where they start, also when one straddles two blocks, and the streamed
//! text never shows them.

use std::ops::ControlFlow;

use dg_engine::{DiffusionGemma, Event, FinishReason, Request};

mod common;

use common::{golden_request, goldens};
use dg_testkit::fixtures;

/// Generates with events: (result, streamed text, text of each block as committed).
fn run(model: &DiffusionGemma, request: &Request) -> (dg_engine::Generation, String, Vec<String>) {
    let mut text = String::new();
    let mut blocks = vec![String::new()];
    let generation = model
        .generate_stream(request, |e| {
            match e {
                Event::Text(t) => {
                    text.push_str(&t);
                    blocks.last_mut().unwrap().push_str(&t);
                }
                Event::BlockEnd { .. } => blocks.push(String::new()),
                _ => {}
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    (generation, text, blocks)
}

#[test]
fn a_stop_string_across_two_blocks_is_cut_and_never_streamed() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let mut checked = 0;
    for case in goldens() {
        let request = golden_request(&case);
        let (full, _, blocks) = run(&model, &request);
        // Blocks whose committed text is long enough on both sides of the boundary.
        let (Some(first), Some(second)) = (blocks.first(), blocks.get(1)) else {
            continue;
        };
        let (a, b): (Vec<char>, Vec<char>) = (first.chars().collect(), second.chars().collect());
        if a.len() < 3 || b.len() < 3 {
            continue;
        }
        let stop: String = a[a.len() - 2..].iter().chain(&b[..2]).collect();
        let cut = full
            .text
            .find(&stop)
            .expect("the stop string is in the text");
        let mut stopped = request.clone();
        stopped.stop = vec!["never appears \u{1}".into(), stop.clone()];
        let (generation, streamed, _) = run(&model, &stopped);
        assert_eq!(generation.text, full.text[..cut], "{}", case["name"]);
        assert_eq!(
            streamed, generation.text,
            "streamed text stops before {stop:?}"
        );
        assert_eq!(generation.finish_reason, FinishReason::StopSequence);
        assert_eq!(generation.stop_sequence.as_deref(), Some(stop.as_str()));
        assert!(generation.token_ids.len() <= full.token_ids.len());
        assert_eq!(
            generation.token_ids[..],
            full.token_ids[..generation.token_ids.len()],
            "the tokens are the unstopped run's, up to the stop"
        );
        checked += 1;
    }
    assert!(
        checked >= 3,
        "only {checked} golden cases span two blocks of text"
    );
}

#[test]
fn an_absent_stop_string_changes_nothing_and_held_text_is_released_at_the_end() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let case = &goldens()[0];
    let request = golden_request(case);
    let (full, _, _) = run(&model, &request);
    let last: String = full.text.chars().last().into_iter().collect();
    let mut held = request.clone();
    // Begins with the text's last character, so that character is held back to the end.
    held.stop = vec![format!("{last}\u{2}\u{3}")];
    let (generation, streamed, _) = run(&model, &held);
    assert_eq!(generation.text, full.text);
    assert_eq!(streamed, full.text);
    assert_eq!(generation.token_ids, full.token_ids);
    assert_eq!(generation.finish_reason, full.finish_reason);
    assert_eq!(generation.stop_sequence, None);
}

#[test]
fn logprobs_come_with_each_token_and_change_nothing_else() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let mut checked = 0;
    for case in goldens().iter().take(6) {
        let request = golden_request(case);
        let plain = model.generate(&request).unwrap();
        assert_eq!(plain.logprobs, None);
        let with = model.generate(&request.clone().logprobs(true)).unwrap();
        assert_eq!(with.token_ids, plain.token_ids);
        assert_eq!(with.text, plain.text);
        let logprobs = with.logprobs.expect("asked for");
        assert_eq!(logprobs.len(), with.token_ids.len());
        assert!(
            logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()),
            "{logprobs:?}"
        );
        checked += logprobs.len();
    }
    assert!(checked > 50);
}
