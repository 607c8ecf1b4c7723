#!/usr/bin/env python3
"""Side-by-side: one denoising step (decoder pass with self-conditioning logits) in the
reference (mlx-optiq 0.7.7, as shipped in bf16 and cast to float32) and in dg, on the same
random checkpoint written by dg's Rust writer, in one run.

    /work/refenv/bin/python tools/reference/bench_step.py [--hidden 256 --experts 32 --canvas 64]

Prints per-step seconds, the ratios reference / dg, and each process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cargo_example(name: str, *args: str) -> str:
    cmd = ["cargo", "run", "--quiet", "--release", "--example", name, "--", *args]
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout


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
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--canvas", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--child", choices=["bf16", "f32"])
    ap.add_argument("--model")
    a = ap.parse_args()

    if a.child:
        per_step = reference_step(a.model, a.child == "f32", a.prompt_len, a.steps)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"per_step_s": per_step, "peak_rss_mb": peak}))
        return

    with tempfile.TemporaryDirectory() as tmp:
        cargo_example(
            "write_checkpoint", "--out", tmp, "--hidden", str(a.hidden), "--experts",
            str(a.experts), "--canvas", str(a.canvas), "--vocab", str(a.vocab),
        )
        results = {}
        for kind in ["bf16", "f32"]:
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--model", tmp, "--prompt-len",
                 str(a.prompt_len), "--steps", str(a.steps)],
                check=True, capture_output=True, text=True,
            ).stdout
            results[f"reference_{kind}"] = json.loads(out.strip().splitlines()[-1])
        out = cargo_example(
            "step_time", "--model", tmp, "--prompt-len", str(a.prompt_len), "--steps",
            str(max(a.steps, 10)),
        )
        dg = json.loads(out.strip().splitlines()[-1])
        results["dg"] = dg
    fastest_ref = min(results["reference_bf16"]["per_step_s"], results["reference_f32"]["per_step_s"])
    results["ratio_vs_bf16"] = results["reference_bf16"]["per_step_s"] / dg["per_step_s"]
    results["ratio_vs_f32"] = results["reference_f32"]["per_step_s"] / dg["per_step_s"]
    results["ratio_vs_faster_reference"] = fastest_ref / dg["per_step_s"]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
