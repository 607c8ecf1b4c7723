//! One denoising step (a decoder pass over a canvas) and one whole generation, single and
//! batched (four sequences sharing each forward pass vs one after another), on a random
//! checkpoint written by `dg_core::synthetic` at the size `tools/reference/bench_step.py` uses
//! for the side-by-side comparison with the reference (hidden 256, 32 experts, canvas 64).
//!
//! `cargo bench --bench denoise`

use std::ops::ControlFlow;

use criterion::{criterion_group, criterion_main, Criterion};
use dg_core::synthetic::{write_checkpoint, SyntheticSpec};
use dg_core::{DecoderInput, SelfConditioning};
use dg_engine::{Defaults, DiffusionGemma, Request, Sampler};
use dg_quant::{Kernels, Plan, Product, QuantSpec};

fn bench_spec() -> SyntheticSpec {
    SyntheticSpec {
        vocab_size: 4096,
        hidden_size: 256,
        intermediate_size: 512,
        moe_intermediate_size: 128,
        num_hidden_layers: 6,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        num_global_key_value_heads: 1,
        head_dim: 64,
        global_head_dim: 128,
        num_experts: 32,
        top_k_experts: 4,
        sliding_window: 64,
        canvas_length: 64,
        shards: 1,
        seed: 7,
    }
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    write_checkpoint(dir.path(), &bench_spec()).expect("write checkpoint");
    let model = DiffusionGemma::load(dir.path()).expect("load");
    // What the quantized products run on this CPU (the plan depends on the bits only).
    for bits in [4, 8] {
        let spec = QuantSpec::new(bits, 64).expect("spec");
        let plan = |product| Plan::for_weights(product, spec, Kernels::best());
        eprintln!(
            "{bits}-bit weights: {}; {}",
            plan(Product::XWt),
            plan(Product::XW)
        );
    }
    let prompt: Vec<u32> = (10..42).collect();
    let cache = model.prefill(&prompt).expect("prefill");
    let canvas: Vec<u32> = (0..64).map(|i| (i * 37 + 11) % 4096).collect();
    let logits = model
        .decoder_logits(&cache, &canvas, SelfConditioning::None)
        .expect("decode");

    let mut group = c.benchmark_group("denoise");
    group.sample_size(10);
    group.bench_function("decoder_step_canvas64", |b| {
        b.iter(|| {
            model
                .decoder_logits(&cache, &canvas, SelfConditioning::Logits(&logits))
                .unwrap()
        })
    });
    // Four canvases after four prompts: one batched decoder pass against four single ones.
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| (10 + i..42 + 3 * i).collect()).collect();
    let caches: Vec<_> = prompts.iter().map(|p| model.prefill(p).unwrap()).collect();
    let batch: Vec<DecoderInput<'_>> = caches
        .iter()
        .map(|cache| DecoderInput {
            cache,
            canvas: &canvas,
            self_conditioning: SelfConditioning::Logits(&logits),
        })
        .collect();
    group.bench_function("decoder_step_4_canvases_batched", |b| {
        b.iter(|| model.model().decode_batch(&batch).unwrap())
    });
    group.bench_function("decoder_step_4_canvases_one_by_one", |b| {
        b.iter(|| {
            for input in &batch {
                model
                    .decoder_logits(input.cache, input.canvas, input.self_conditioning)
                    .unwrap();
            }
        })
    });

    let request = |prompt: Vec<u32>, seed: u64| {
        let mut request = Request::tokens(prompt);
        request.max_tokens = 64;
        request.steps = Some(16);
        request.sampler = Sampler::ConfidenceThreshold { threshold: 0.9 };
        request.defaults = Defaults::Reference;
        request.seed = seed;
        request
    };
    let single = request(prompt.clone(), 0);
    group.bench_function("generate_64_tokens_confidence", |b| {
        b.iter(|| {
            model
                .generate_stream(&single, |_| ControlFlow::Continue(()))
                .unwrap()
        })
    });
    let requests: Vec<Request> = prompts
        .iter()
        .zip(0..)
        .map(|(p, seed)| request(p.clone(), seed))
        .collect();
    group.bench_function("generate_4x64_tokens_batched", |b| {
        b.iter(|| model.generate_batch(&requests).unwrap())
    });
    group.bench_function("generate_4x64_tokens_one_by_one", |b| {
        b.iter(|| {
            for r in &requests {
                model.generate(r).unwrap();
            }
        })
    });
    group.finish();
}

criterion_group!(denoise, benches);
criterion_main!(denoise);
