#!/usr/bin/env python3
"""Write LoRA adapter fixtures for the `tiny` checkpoint with the reference's own code.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run after make_checkpoints.py:

    .venv-ref/bin/python tools/reference/make_lora_adapters.py

Writes two adapter directories (`adapter_config.json` + `adapters.safetensors`, the layout of
`optiq.vlm.diffusion_gemma.lora._save_adapter`) under tests/fixtures/adapters/:

- `tiny-trained/`: trained by the reference's `train_diffusion_lora` (rank 8, scale 8.0, the
  default keys) for 12 iterations on tests/fixtures/adapters/train.jsonl with learning rate 1e-3
  (1e-4, the default, moves lora_b by ~1e-3 in so few steps: too little to change a generation).
  As shipped the trainer cannot take a gradient on this model; the router patch of
  lora_reference.py makes it train (see there). `mx.random.seed(0)` first: the trainer's own `seed`
  argument is never used, so without it the result depends on earlier RNG use.
- `tiny-random/`: the same layers with lora_a as mlx-lm initialises it and lora_b drawn
  N(0, 0.02^2) instead of zeros, so every factor matters (a mounted adapter whose lora_b is zero
  would test nothing). Layers 0-4 only (the adapter covers a subset, as mlx-lm's `num_layers`
  makes), rank 4, scale 6.0.

Both are loaded back with the reference's `load_diffusion_lora` and checked to change the
decoder's logits.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from lora_reference import patch_router_stop_gradient  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "tiny"
OUT = ROOT / "tests" / "fixtures" / "adapters"

TRAIN_LINES = [
    {"prompt": "What colour is the sky?", "completion": "The sky is blue."},
    {"prompt": "Name a fruit.", "completion": "An apple, a pear or a plum."},
    {"messages": [{"role": "user", "content": "Say hello."},
                  {"role": "assistant", "content": "Hello there, friend!"}]},
    {"text": "Tiny models say tiny things."},
]


def write_data() -> pathlib.Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "train.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in TRAIN_LINES))
    return OUT


def trained() -> None:
    from optiq.vlm.diffusion_gemma.lora import train_diffusion_lora

    out = OUT / "tiny-trained"
    shutil.rmtree(out, ignore_errors=True)
    mx.random.seed(0)
    train_diffusion_lora(str(MODEL), str(OUT), str(out), rank=8, scale=8.0, iters=12,
                         learning_rate=1e-3, report_every=4)
    fix_base_model(out)


def random_b() -> None:
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from optiq.vlm.diffusion_gemma.generate import load
    from optiq.vlm.diffusion_gemma.lora import DEFAULT_LORA_KEYS, _save_adapter

    out = OUT / "tiny-random"
    shutil.rmtree(out, ignore_errors=True)
    model, _ = load(str(MODEL))
    model.freeze()
    mx.random.seed(1)
    cfg = {"rank": 4, "scale": 6.0, "dropout": 0.0, "keys": DEFAULT_LORA_KEYS}
    # mlx-lm adapts the LAST num_layers layers; the tiny model has 6, so 5 skips layer 0.
    linear_to_lora_layers(model, 5, cfg)
    rng = np.random.default_rng(20261204)
    for name, value in tree_flatten(model.trainable_parameters()):
        if name.endswith(".lora_b"):
            b = rng.normal(0.0, 0.02, value.shape).astype(np.float32)
            set_param(model, name, mx.array(b))
    mx.eval(model.trainable_parameters())
    _save_adapter(model, str(out), cfg, str(MODEL))
    fix_base_model(out)


def set_param(model, dotted: str, value) -> None:
    *path, leaf = dotted.split(".")
    obj = model
    for part in path:
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    setattr(obj, leaf, value)


def fix_base_model(out: pathlib.Path) -> None:
    """The reference writes the absolute model path it was given: keep the file portable."""
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model"] = "tests/fixtures/models/tiny"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def check(name: str) -> None:
    from optiq.vlm.diffusion_gemma.generate import load
    from optiq.vlm.diffusion_gemma.lora import load_diffusion_lora

    ids = mx.array([[2, 10, 20, 30, 40, 50]], dtype=mx.int32)
    canvas = mx.array([[5] * 16], dtype=mx.int32)
    base, _ = load(str(MODEL))
    adapted, _ = load_diffusion_lora(str(MODEL), str(OUT / name))
    a = base(input_ids=ids, canvas_ids=canvas).logits
    b = adapted(input_ids=ids, canvas_ids=canvas).logits
    diff = float(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max())
    print(f"{name}: max |logit change| {diff:.4f}")
    assert diff > 1e-2, f"{name} barely changes the logits"


def main() -> None:
    mx.set_default_device(mx.cpu)
    patch_router_stop_gradient()
    write_data()
    trained()
    random_b()
    for name in ("tiny-trained", "tiny-random"):
        check(name)


if __name__ == "__main__":
    main()
