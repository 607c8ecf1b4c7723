//! Built without the `vision` feature (`cargo test -p dg-engine --no-default-features --test
//! no_vision`): text generation works on a checkpoint with a vision tower, and an image
//! request says which feature it needs.
#![cfg(not(feature = "vision"))]

use dg_engine::{DiffusionGemma, Image, Request};

use dg_testkit::fixtures;

#[test]
fn text_works_and_images_name_the_missing_feature() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny-vision")).unwrap();
    let answer = model
        .generate(&Request::text("Hello").max_tokens(8))
        .unwrap();
    assert!(answer.stats.generated_tokens <= 8);
    let image = Image::Path(fixtures().join("images/normal.png"));
    let err = model
        .generate(&Request::with_images("What is this?", vec![image]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("without its `vision` feature"), "{err}");
}
