#!/usr/bin/env python3
"""Side-by-side: one LoRA training step (forward + backward + AdamW update) in the reference
(mlx-optiq 0.7.7's `diffusion_loss` under `nn.value_and_grad`, as `train_diffusion_lora` runs it,
router patched as lora_reference.py explains; as shipped in bf16 and cast to float32) and in dg
(examples/lora_step_time.rs), on the same random checkpoint written by dg's Rust writer (the
"medium" size of bench_step.py by default), in one run.

    .venv-ref/bin/python tools/reference/bench_lora_step.py [--hidden 256 --experts 32 --canvas 64]

Both sides: rank 8, scale 8.0, the default keys on every layer, AdamW lr 1e-4, a prompt of
--prompt-len ids and a full-canvas target; one warm-up step, then the mean of --steps steps.
Prints per-step seconds, the ratios reference / dg and the reference processes' peak RSS.
"""

from __future__ import annotations

import json
import time

from bench_common import cargo_example, last_json, parse_args, print_child, side_by_side


def reference_step(model_dir: str, f32: bool, prompt_len: int, steps: int) -> float:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from optiq.vlm.diffusion_gemma import lora
    # The loader, not generate.load: the random checkpoint's tokenizer is not a real one.
    from optiq.vlm.diffusion_gemma.loader import load_diffusion_gemma

    from lora_reference import patch_router_stop_gradient

    patch_router_stop_gradient()
    model, config = load_diffusion_gemma(model_dir)
    if f32:
        model.set_dtype(mx.float32)
    vocab = config["text_config"]["vocab_size"]
    canvas_len = config["canvas_length"]
    model.freeze()
    linear_to_lora_layers(model, len(model.layers), {"rank": 8, "scale": 8.0, "dropout": 0.0,
                                                     "keys": lora.DEFAULT_LORA_KEYS})
    model.train()
    opt = optim.AdamW(learning_rate=1e-4)
    loss_and_grad = nn.value_and_grad(model, lora.diffusion_loss)
    prompt = mx.array([[(i * 7 + 3) % vocab for i in range(prompt_len)]], dtype=mx.int32)
    target = mx.array([[(i * 37 + 11) % vocab for i in range(canvas_len)]], dtype=mx.int32)

    def step():
        loss, grads = loss_and_grad(model, prompt, target, t_min=0.4, t_max=0.8,
                                    vocab_size=vocab)
        opt.update(model, grads)
        mx.eval(model.trainable_parameters(), opt.state, loss)

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    a = parse_args(__doc__)
    if a.child:
        import mlx.core as mx
        mx.set_default_device(mx.cpu)
        print_child(reference_step(a.model, a.child == "f32", a.prompt_len, a.steps))
        return

    def run_dg(model_dir: str) -> dict:
        start = time.perf_counter()
        dg = last_json(cargo_example("lora_step_time", "--model", model_dir, "--prompt-len",
                                     str(a.prompt_len), "--steps", str(a.steps)))
        dg["wall_s_with_build"] = time.perf_counter() - start
        return dg

    print(json.dumps(side_by_side(a, __file__, run_dg), indent=1))


if __name__ == "__main__":
    main()
