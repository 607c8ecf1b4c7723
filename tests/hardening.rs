//! Issue 17's findings, one test (or a pointer to one) each: bad input gets a typed error naming
//! the field, file or option at fault; the process goes on, and a shared model goes on serving
//! other threads. Tests that already exist elsewhere are listed here, not repeated:
//!
//! | finding | class of input | test |
//! |---|---|---|
//! | 1 prompt length | 10M-token prompt, 10 MB message, over `max_context` | `dg-engine/tests/context_limit.rs`: `a_request_over_the_context_limit_is_refused_and_names_it`, `a_huge_prompt_is_refused_while_other_requests_are_served` (scheduler, other thread served) |
//! | 1 prompt length | many messages | `many_messages_are_refused_by_the_context_limit_or_the_template_fuel` (here) |
//! | 1 memory | buffers the allocator refuses | `dg-quant/src/alloc.rs`: `impossible_sizes_are_errors_not_aborts` |
//! | 2 config numbers | layers, vision layers, canvas, rope, norm eps, quant bits, type errors | `tests/config_errors.rs`: `huge_layer_counts_are_refused_not_aborted`, `huge_canvas_is_refused`, `rope_and_norm_numbers_are_refused`, `quantization_bits_are_not_truncated`, `type_errors_name_the_field`; `dg-core/src/config.rs` unit tests |
//! | 3 generation settings | generation_config.json | `tests/config_errors.rs`: `generation_config_numbers_are_refused` |
//! | 3 generation settings | `Defaults::Custom`, request steps | `dg-engine/tests/generate_parity.rs`: `custom_settings_and_steps_are_checked_like_the_checkpoint_s` |
//! | 4 images | `Image::Rgb` sizes that overflow | `rgb_sizes_that_overflow_are_refused` (here); `dg-vision/src/preprocess.rs`: `sizes_that_overflow_are_errors` |
//! | 4 images | decode limits on the builder | `image_limits_on_the_builder_name_the_limit` (here); `dg-vision/src/decode.rs`: `pixel_limit_applies_before_decoding` |
//! | 5 templates | endless loop, huge output, huge source, special file | `dg-tokenize/src/template.rs`: `a_template_that_never_ends_runs_out_of_fuel`, `output_past_the_cap_is_an_error`, `oversized_and_special_template_files_are_refused` |
//! | 6 special files | FIFO, link to /dev/zero, oversized checkpoint files | `tests/checkpoint_errors.rs`: `a_fifo_in_place_of_a_checkpoint_file_is_refused_not_waited_on`, `a_link_to_dev_zero_is_refused_not_read`, `files_over_their_size_cap_are_refused_before_reading` |
//! | 6 special files | an image path that is a FIFO or a link to /dev/zero | `special_image_files_are_refused_not_read` (here) |
//! | 7 cancellation | `Break` on any event | `dg-engine/tests/generate_parity.rs`: `break_on_a_text_event_stops_delivery_at_once`, `cancellation_stops_within_one_step` |
//! | 8 inconsistent checkpoints | tokenizer past the model vocabulary, EOS ids past it | `tests/config_errors.rs`: `a_tokenizer_with_ids_past_the_model_vocab_is_refused`, `generation_config_eos_ids_outside_the_vocab_are_refused`, `token_ids_outside_the_vocab_are_refused` |
//! | 8 inconsistent checkpoints | a tensor in two shards | `tests/checkpoint_errors.rs`: `a_tensor_in_two_shards_names_the_tensor_and_both_files` |
//! | 9 messages | serde column, truncated shard | `tests/config_errors.rs`: `type_errors_name_the_field`; `tests/checkpoint_errors.rs`: `truncated_shard_names_the_file_and_tensor` |
//! | 9 messages | an empty chat | `an_empty_chat_names_the_messages` (here) |
//! | 10 special-token strings | typed `<eos>`, `<turn|>`, `<|image|>` | `dg-tokenize/tests/literal.rs` (all), `dg-engine/tests/chat_options.rs`: `literal_special_tokens_keeps_typed_markers_as_text` |
//! | shared model | a request error on one thread, others served | `bad_requests_leave_a_shared_model_serving_other_threads` (here) |

use std::sync::Arc;

use dg_engine::{DecodeLimits, DiffusionGemma, EngineError, Image, Message, Request, VisionError};
use dg_testkit::fixtures;

fn vision_model(limits: Option<DecodeLimits>) -> DiffusionGemma {
    let builder = DiffusionGemma::builder(fixtures().join("models/tiny-vision"));
    match limits {
        Some(l) => builder.image_limits(l),
        None => builder,
    }
    .load()
    .unwrap()
}

fn image_request(image: Image) -> Request {
    Request::with_images("What is this?", vec![image]).max_tokens(4)
}

/// The error's message, which must name each of `needles`.
fn names(err: &EngineError, needles: &[&str]) {
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "{n:?} not in {msg}");
    }
}

#[test]
fn image_limits_on_the_builder_name_the_limit() {
    let png = fixtures().join("images/normal.png"); // 64 x 48, 4894 bytes
    let cases = [
        (
            DecodeLimits::default().max_pixels(64 * 48 - 1),
            "max_pixels",
        ),
        (DecodeLimits::default().max_size(63, 1000), "max_width"),
        (DecodeLimits::default().max_size(1000, 47), "max_height"),
        (
            DecodeLimits::default().max_encoded_bytes(4000),
            "max_encoded_bytes",
        ),
    ];
    for (limits, limit) in cases {
        let model = vision_model(Some(limits));
        for image in [
            Image::from(png.clone()),
            Image::Bytes(std::fs::read(&png).unwrap()),
        ] {
            let err = model.generate(&image_request(image)).unwrap_err();
            assert!(
                matches!(err, EngineError::Vision(VisionError::TooLarge { .. })),
                "{err:?}"
            );
            names(&err, &[limit, "LoadBuilder::image_limits"]);
        }
        // Raw pixels are held to the same size limits.
        if limit != "max_encoded_bytes" {
            let rgb = Image::Rgb {
                width: 64,
                height: 48,
                pixels: vec![0; 64 * 48 * 3],
            };
            names(&model.generate(&image_request(rgb)).unwrap_err(), &[limit]);
        }
        // The same model serves an image within its limits.
        let small = Image::Rgb {
            width: 8,
            height: 8,
            pixels: vec![9; 8 * 8 * 3],
        };
        model.generate(&image_request(small)).unwrap();
    }
    // Exactly at the limits is fine; the defaults accept it too.
    let exact = DecodeLimits::default()
        .max_pixels(64 * 48)
        .max_size(64, 48)
        .max_encoded_bytes(4894);
    vision_model(Some(exact))
        .generate(&image_request(Image::from(png.clone())))
        .unwrap();
    vision_model(None)
        .generate(&image_request(Image::from(png)))
        .unwrap();
}

#[test]
fn rgb_sizes_that_overflow_are_refused() {
    let model = vision_model(None);
    for (width, height) in [(1usize << 62, 4usize), (usize::MAX, 2)] {
        let image = Image::Rgb {
            width,
            height,
            pixels: vec![0; 12],
        };
        let err = model.generate(&image_request(image)).unwrap_err();
        names(&err, &["image size", "overflows"]);
    }
}

#[cfg(unix)]
#[test]
fn special_image_files_are_refused_not_read() {
    let model = vision_model(None);
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("zero.png");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let err = model
        .generate(&image_request(Image::from(zero)))
        .unwrap_err();
    names(&err, &["zero.png", "not a regular file"]);
    let fifo = dir.path().join("fifo.png");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if made {
        // Refused without opening it (which would wait for a writer).
        let err = model
            .generate(&image_request(Image::from(fifo)))
            .unwrap_err();
        names(&err, &["fifo.png", "not a regular file"]);
    }
}

#[test]
fn an_empty_chat_names_the_messages() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let err = model.generate(&Request::chat(Vec::new())).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::InvalidArgument {
                name: "messages",
                ..
            }
        ),
        "{err:?}"
    );
    names(&err, &["no messages"]);
}

#[test]
fn many_messages_are_refused_by_the_context_limit_or_the_template_fuel() {
    let model = DiffusionGemma::builder(fixtures().join("models/tiny"))
        .max_context(4096)
        .load()
        .unwrap();
    let chat = |n: usize| {
        let messages: Vec<Message> = (0..n)
            .map(|i| match i % 2 {
                0 => Message::user("hi"),
                _ => Message::assistant("ok"),
            })
            .collect();
        Request::chat(messages).max_tokens(8)
    };
    let err = model.generate(&chat(2000)).unwrap_err();
    assert!(
        matches!(err, EngineError::InvalidArgument { name: "prompt", .. }),
        "{err:?}"
    );
    names(&err, &["context limit of 4096", "LoadBuilder::max_context"]);
    // Ten thousand messages stop in the template, before any tokenizing.
    let err = model.generate(&chat(10_000)).unwrap_err();
    assert!(matches!(err, EngineError::Tokenize(_)), "{err:?}");
    names(&err, &["chat_template", "fuel"]);
}

#[test]
fn bad_requests_leave_a_shared_model_serving_other_threads() {
    let model = Arc::new(vision_model(Some(DecodeLimits::default().max_pixels(1000))));
    let good = Request::chat(vec![Message::user("Name a river.")])
        .max_tokens(8)
        .seed(3);
    let alone = model.generate(&good).unwrap().token_ids;
    let bad = [
        image_request(Image::from(fixtures().join("images/normal.png"))),
        image_request(Image::Rgb {
            width: 1 << 62,
            height: 4,
            pixels: Vec::new(),
        }),
        Request::chat(Vec::new()),
        Request::tokens(vec![5; 100_000]),
        good.clone().temperature(f32::NAN),
    ];
    std::thread::scope(|s| {
        let served: Vec<_> = (0..3)
            .map(|_| {
                let (model, good) = (model.clone(), good.clone());
                s.spawn(move || {
                    (0..2)
                        .map(|_| model.generate(&good).unwrap().token_ids)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for request in &bad {
            assert!(model.generate(request).is_err());
        }
        for thread in served {
            for tokens in thread.join().unwrap() {
                assert_eq!(tokens, alone);
            }
        }
    });
    // And after them all, the model still answers.
    assert_eq!(model.generate(&good).unwrap().token_ids, alone);
}
