#!/usr/bin/env python3
"""Side-by-side: one denoising step (decoder pass with self-conditioning logits) in the
reference (mlx-optiq 0.7.7, as shipped in bf16 and cast to float32) and in dg, on the same
random checkpoint written by dg's Rust writer, in one run.

    /work/refenv/bin/python tools/reference/bench_step.py [--hidden 256 --experts 32 --canvas 64]

Prints per-step seconds, the ratios reference / dg, and each process's peak RSS.
"""

from __future__ import annotations

import json
import time

from bench_common import cargo_example, last_json, parse_args, print_child, side_by_side


def reference_step(model_dir: str, f32: bool, prompt_len: int, steps: int) -> float:
    import mlx.core as mx
    from optiq.vlm.diffusion_gemma.loader import load_diffusion_gemma

    model, config = load_diffusion_gemma(model_dir)
    if f32:
        model.set_dtype(mx.float32)
    vocab = config["text_config"]["vocab_size"]
    canvas_len = config["canvas_length"]
    prompt = mx.array([[(i * 7 + 3) % vocab for i in range(prompt_len)]], dtype=mx.int32)
    cache = model.make_cache()
    model.model.encoder(prompt, cache=cache)
    mx.eval([c.state for c in cache])
    canvas = mx.array([[(i * 37 + 11) % vocab for i in range(canvas_len)]], dtype=mx.int32)
    masks = model.model.decoder._make_decoder_masks(canvas[..., None], cache, None)
    logits = model(cache=cache, canvas_ids=canvas, decoder_attention_mask=masks).logits
    mx.eval(logits)
    start = time.perf_counter()
    for _ in range(steps):
        out = model(
            cache=cache,
            canvas_ids=canvas,
            self_conditioning_logits=logits,
            decoder_attention_mask=masks,
        ).logits
        mx.eval(out)
    return (time.perf_counter() - start) / steps


def main() -> None:
    a = parse_args(__doc__)
    if a.child:
        print_child(reference_step(a.model, a.child == "f32", a.prompt_len, a.steps))
        return

    def run_dg(model_dir: str) -> dict:
        return last_json(cargo_example(
            "step_time", "--model", model_dir, "--prompt-len", str(a.prompt_len), "--steps",
            str(max(a.steps, 10)),
        ))

    results = side_by_side(a, __file__, run_dg)
    dg = results["dg"]
    fastest_ref = min(results["reference_bf16"]["per_step_s"], results["reference_f32"]["per_step_s"])
    results["ratio_vs_faster_reference"] = fastest_ref / dg["per_step_s"]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
