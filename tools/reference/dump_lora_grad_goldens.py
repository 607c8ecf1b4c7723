#!/usr/bin/env python3
"""Goldens for dg's LoRA backward pass (dg-core/src/train/): the diffusion loss and the gradient
of every adapter factor, from `nn.value_and_grad` on the float32 reference.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run after make_checkpoints.py:

    .venv-ref/bin/python tools/reference/dump_lora_grad_goldens.py

The model is the `tiny` fixture loaded by the reference's `optiq.vlm.diffusion_gemma.generate.load`
and cast with `model.set_dtype(mx.float32)` (as every golden script does); the
router's top-k indices are stop-gradiented (lora_reference.py: as shipped the reference cannot
take this gradient). `linear_to_lora_layers` adapts every layer with DEFAULT_LORA_KEYS, rank 8,
scale 8.0, dropout 0; then every factor is set to seeded random values: lora_a U(+-1/sqrt(in))
(mlx-lm's init), lora_b N(0, 0.05^2) (not zeros: with lora_b = 0 every d lora_a is zero and
the test would check nothing). The adapter is written with the reference's `_save_adapter` to
tests/fixtures/adapters/tiny-grad/ (dg loads it with `Adapter::load`).

The loss is the trainer's `diffusion_loss` with its random draws replaced by fixed inputs, in
`model.train()` mode as the trainer runs it:
`logits = model(input_ids=prompt, canvas_ids=canvas).logits` (encoder pass over the prompt into a
fresh cache, decoder over the canvas with no self-conditioning, tied soft-capped head);
`loss = sum(cross_entropy(logits, target) * corrupt) / max(sum(corrupt), 1)`.

Cases (each a 16-token target, a fixed corrupt mask and noise, canvas = where(corrupt, noise,
target)):
- `short`: a 6-token raw prompt (no chat template), shorter than the sliding window 8;
- `long`: the prompt chat-templated as the trainer's `_encode_pair` does it (longer than twice
  the window, so the encoder's sliding masks and the decoder's window over the cache matter).

Writes tests/fixtures/goldens/lora_grads.{safetensors,json}: `{case}.prompt_ids`,
`{case}.target_ids`, `{case}.canvas_ids` (i32), `{case}.corrupt` (i32 0/1), `{case}.loss` [1]
(f32), and `{case}.grad.<module path>.lora_a` / `.lora_b` (f32, the factors' shapes). The JSON
lists the cases, their lengths and losses and every tensor.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from lora_reference import setup_reference  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "tiny"
ADAPTER = ROOT / "tests" / "fixtures" / "adapters" / "tiny-grad"
OUT = ROOT / "tests" / "fixtures" / "goldens"
SEED = 20261205
RANK, SCALE = 8, 8.0
TARGET_LEN = 16
PROMPT = "Why is the sky blue? Tell me in one short sentence."
COMPLETION = "The sky looks blue because air scatters the short blue wavelengths of sunlight."


def set_param(model, dotted: str, value) -> None:
    *path, leaf = dotted.split(".")
    obj = model
    for part in path:
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    setattr(obj, leaf, value)


def loss_fn(model, prompt_ids, canvas_ids, target_ids, corrupt):
    """The trainer's diffusion_loss after its draws (lora.py), on fixed inputs."""
    logits = model(input_ids=prompt_ids, canvas_ids=canvas_ids).logits
    ce = nn.losses.cross_entropy(logits, target_ids, reduction="none")
    denom = mx.maximum(corrupt.sum(), 1)
    return (ce * corrupt).sum() / denom


def main() -> None:
    from importlib.metadata import version

    from mlx_lm.tuner.utils import linear_to_lora_layers
    from optiq.vlm.diffusion_gemma.generate import load
    from optiq.vlm.diffusion_gemma.lora import DEFAULT_LORA_KEYS, _encode_pair, _save_adapter

    setup_reference()

    model, tokenizer = load(str(MODEL))
    model.set_dtype(mx.float32)
    model.freeze()
    cfg = {"rank": RANK, "scale": SCALE, "dropout": 0.0, "keys": DEFAULT_LORA_KEYS}
    linear_to_lora_layers(model, len(model.layers), cfg)
    model.train()

    rng = np.random.default_rng(SEED)
    params = tree_flatten(model.trainable_parameters())
    for name, value in params:
        if name.endswith(".lora_a"):
            bound = 1.0 / np.sqrt(value.shape[0])
            v = rng.uniform(-bound, bound, value.shape)
        else:
            v = rng.normal(0.0, 0.05, value.shape)
        set_param(model, name, mx.array(v.astype(np.float32)))
    mx.eval(model.parameters())

    shutil.rmtree(ADAPTER, ignore_errors=True)
    _save_adapter(model, str(ADAPTER), cfg, "tests/fixtures/models/tiny")
    # The reference writes the base path it was given; keep the file portable.
    cfg_path = ADAPTER / "adapter_config.json"
    acfg = json.loads(cfg_path.read_text())
    acfg["base_model"] = "tests/fixtures/models/tiny"
    cfg_path.write_text(json.dumps(acfg, indent=2))

    vocab = model.config.text_config.vocab_size
    window = model.config.text_config.sliding_window
    long_prompt, target = _encode_pair(tokenizer, PROMPT, COMPLETION, TARGET_LEN)
    assert target.shape[1] == TARGET_LEN, target.shape
    short_prompt = mx.array(tokenizer.encode(PROMPT, add_special_tokens=True)[:6],
                            dtype=mx.int32)[None]
    assert short_prompt.shape[1] < window < 2 * window < long_prompt.shape[1]

    value_and_grad = nn.value_and_grad(model, loss_fn)
    tensors: dict[str, mx.array] = {}
    doc = {
        "generator": "tools/reference/dump_lora_grad_goldens.py",
        "mlx": mx.__version__, "mlx_lm": version("mlx-lm"), "optiq": version("mlx-optiq"),
        "fixture": "tests/fixtures/models/tiny",
        "adapter": "tests/fixtures/adapters/tiny-grad",
        "dtype": "float32 reference (model.set_dtype(mx.float32)), router indices "
                 "stop-gradiented, model.train()",
        "rank": RANK, "scale": SCALE, "cases": {},
    }
    for case, prompt in (("short", short_prompt), ("long", long_prompt)):
        corrupt = mx.array(rng.random(TARGET_LEN) < 0.6)[None]
        noise = mx.array(rng.integers(0, vocab, TARGET_LEN).astype(np.int32))[None]
        canvas = mx.where(corrupt, noise, target)
        loss, grads = value_and_grad(model, prompt, canvas, target, corrupt)
        grads = dict(tree_flatten(grads))
        mx.eval(loss, grads)
        tensors[f"{case}.prompt_ids"] = prompt[0].astype(mx.int32)
        tensors[f"{case}.target_ids"] = target[0].astype(mx.int32)
        tensors[f"{case}.canvas_ids"] = canvas[0].astype(mx.int32)
        tensors[f"{case}.corrupt"] = corrupt[0].astype(mx.int32)
        tensors[f"{case}.loss"] = loss.reshape(1).astype(mx.float32)
        n = 0
        for name, g in grads.items():
            assert name.endswith((".lora_a", ".lora_b")), name
            assert g.dtype == mx.float32, (name, g.dtype)
            tensors[f"{case}.grad.{name}"] = g
            n += 1
        doc["cases"][case] = {
            "prompt_len": int(prompt.shape[1]), "target_len": TARGET_LEN,
            "corrupted": int(corrupt.sum().item()), "loss": float(loss.item()),
            "gradients": n,
        }
        print(f"{case}: prompt {prompt.shape[1]} tokens, corrupted "
              f"{int(corrupt.sum().item())}, loss {loss.item():.6f}, {n} gradients")

    mx.eval(list(tensors.values()))
    OUT.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(OUT / "lora_grads.safetensors"), tensors,
                        metadata={"generator": "tools/reference/dump_lora_grad_goldens.py"})
    doc["tensors"] = {k: {"dtype": str(v.dtype).split(".")[-1], "shape": list(v.shape)}
                      for k, v in sorted(tensors.items())}
    (OUT / "lora_grads.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote lora_grads.safetensors ({len(tensors)} tensors), lora_grads.json")


if __name__ == "__main__":
    main()
