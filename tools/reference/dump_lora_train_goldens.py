#!/usr/bin/env python3
"""Goldens for dg's LoRA trainer (dg-engine/src/train/), from the reference's own training loop.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run after make_checkpoints.py:

    .venv-ref/bin/python tools/reference/dump_lora_train_goldens.py

Runs `optiq.vlm.diffusion_gemma.lora.train_diffusion_lora` itself on the `tiny` fixture and
tests/fixtures/lora/train.jsonl (the three line formats, a blank line, an empty completion),
with three interventions, each by patching a name the trainer looks up at call time:

- the model is cast to float32 after loading (`lora.load` wrapped: `model.set_dtype(mx.float32)`,
  as every golden script does);
- the router's top-k indices are stop-gradiented (lora_reference.py): as shipped the trainer
  cannot take a gradient;
- `mx.random.seed(SEED)` right before `linear_to_lora_layers` (wrapped): the trainer's own `seed`
  parameter is never used (a reference bug), so without it the LoRA init and the corruption draws
  depend on the wall clock. dg's `--seed S` starts from exactly this state.

`diffusion_loss` is wrapped (same arithmetic, called the same way) to record what each iteration
drew. The trainer runs ITERS iterations at its defaults (rank 8, scale 8.0, dropout 0, lr 1e-4,
max_canvas 256, data order `it % len(pairs)`); the empty completion's iterations are skipped
without drawing, as the trainer skips them, so ITERS = 12 gives 10 AdamW steps.

Writes tests/fixtures/goldens/lora_train.{json,safetensors}:
- `pairs`: each pair's prompt/completion strings and `_encode_pair`'s ids (`encode.{i}.prompt`,
  `encode.{i}.target`, max_canvas 256);
- `steps`: per AdamW step, the pair index, t (float32 bits as a float), the loss (float32) and
  tensors `step.{k}.{corrupt,noise,canvas}` [L] (i32; corrupt 0/1);
- `init`: the global key after the seed and after the LoRA init, `lora_a.<module path>` for a
  few modules (the first and last created, a full-attention layer's), and `lora_a_sums`: the f64
  sum of every module's lora_a;
- `adamw`: mlx.optimizers.AdamW on its own (no model): `adamw.{case}.param0`, `.grad{k}`,
  `.param{k}` after step k, for lr 1e-4 and 1e-2 at mlx's defaults (betas 0.9/0.999, eps 1e-8,
  weight_decay 0.01, no bias correction).
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from lora_reference import setup_reference  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "tiny"
DATA = ROOT / "tests" / "fixtures" / "lora"
OUT = ROOT / "tests" / "fixtures" / "goldens"
SEED = 7
ITERS = 12
RECORDED_LORA_A = [
    "model.decoder.layers.0.mlp.down_proj",   # created first
    "model.decoder.layers.0.self_attn.q_proj",
    "model.decoder.layers.5.self_attn.k_proj",  # the full-attention layer (no v_proj)
    "model.decoder.layers.5.self_attn.q_proj",  # created last
]


def main() -> None:
    import mlx_lm.tuner.utils as tuner_utils
    from optiq.vlm.diffusion_gemma import lora

    setup_reference()

    tensors: dict[str, mx.array] = {}
    doc: dict = {
        "about": "LoRA training goldens from the float32 reference's train_diffusion_lora "
                 "(mlx-optiq 0.7.7, mlx 0.32.4, mlx-lm 0.32.2, CPU), router patched, "
                 "mx.random.seed(seed) before the LoRA init. Written by "
                 "tools/reference/dump_lora_train_goldens.py.",
        "seed": SEED, "iters": ITERS, "rank": 8, "scale": 8.0, "learning_rate": 1e-4,
        "max_canvas": 256,
    }

    # float32 model, and the tokenizer kept for the encodings.
    loaded = {}
    original_load = lora.load

    def load_f32(path):
        model, tokenizer = original_load(path)
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        loaded["model"], loaded["tokenizer"] = model, tokenizer
        return model, tokenizer

    lora.load = load_f32

    original_l2l = tuner_utils.linear_to_lora_layers

    def seeded_l2l(model, num_layers, config, *args, **kwargs):
        mx.random.seed(SEED)
        doc["key_after_seed"] = [int(v) for v in np.array(mx.random.state[0])]
        original_l2l(model, num_layers, config, *args, **kwargs)
        params = dict(tree_flatten(model.trainable_parameters()))
        mx.eval(params)
        doc["key_after_init"] = [int(v) for v in np.array(mx.random.state[0])]
        sums = {}
        for name, value in params.items():
            if name.endswith(".lora_a"):
                sums[name[: -len(".lora_a")]] = float(np.array(value, dtype=np.float64).sum())
        doc["lora_a_sums"] = sums
        for path in RECORDED_LORA_A:
            tensors[f"lora_a.{path}"] = params[f"{path}.lora_a"]

    tuner_utils.linear_to_lora_layers = seeded_l2l

    steps = []
    original_loss = lora.diffusion_loss

    def recording_loss(model, prompt_ids, target_ids, *, t_min, t_max, vocab_size):
        # The trainer's diffusion_loss, line for line, keeping its draws.
        B, L = target_ids.shape
        t = mx.random.uniform(low=t_min, high=t_max)
        corrupt = mx.random.uniform(shape=(B, L)) < t
        noise = mx.random.randint(0, vocab_size, (B, L)).astype(target_ids.dtype)
        canvas = mx.where(corrupt, noise, target_ids)
        logits = model(input_ids=prompt_ids, canvas_ids=canvas).logits
        ce = nn.losses.cross_entropy(logits, target_ids, reduction="none")
        denom = mx.maximum(corrupt.sum(), 1)
        loss = (ce * corrupt).sum() / denom
        steps.append({"t": t, "corrupt": corrupt, "noise": noise, "canvas": canvas,
                      "loss": loss, "prompt": prompt_ids, "target": target_ids})
        return loss

    lora.diffusion_loss = recording_loss
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            lora.train_diffusion_lora(str(MODEL), str(DATA), out_dir, iters=ITERS,
                                      report_every=ITERS)
    finally:
        lora.load = original_load
        tuner_utils.linear_to_lora_layers = original_l2l
        lora.diffusion_loss = original_loss

    # The encodings, as the trainer computes them.
    tokenizer = loaded["tokenizer"]
    pairs = lora._read_pairs(str(DATA / "train.jsonl"))
    doc["pairs"] = []
    encoded = []
    for i, (prompt, completion) in enumerate(pairs):
        p, t = lora._encode_pair(tokenizer, prompt, completion, 256)
        encoded.append((p, t))
        tensors[f"encode.{i}.prompt"] = p[0]
        tensors[f"encode.{i}.target"] = t[0]
        doc["pairs"].append({"prompt": prompt, "completion": completion,
                             "prompt_len": int(p.shape[1]), "target_len": int(t.shape[1])})

    # Which pair each step used: the trainer's `it % len(pairs)`, skipping empty targets.
    used = [it % len(pairs) for it in range(ITERS) if encoded[it % len(pairs)][1].shape[1] > 0]
    assert len(used) == len(steps), (len(used), len(steps))
    doc["steps"] = []
    for k, (pair, s) in enumerate(zip(used, steps)):
        assert np.array_equal(np.array(s["target"]), np.array(encoded[pair][1]))
        tensors[f"step.{k}.corrupt"] = s["corrupt"][0].astype(mx.int32)
        tensors[f"step.{k}.noise"] = s["noise"][0]
        tensors[f"step.{k}.canvas"] = s["canvas"][0]
        doc["steps"].append({"pair": pair, "t": float(s["t"].item()),
                             "loss": float(s["loss"].item()),
                             "corrupted": int(s["corrupt"].sum().item())})
        print(f"step {k}: pair {pair} t {s['t'].item():.6f} loss {s['loss'].item():.6f}")

    # AdamW alone, at mlx's defaults.
    rng = np.random.default_rng(20261204)
    doc["adamw"] = []
    for case, lr in (("lr1e-4", 1e-4), ("lr1e-2", 1e-2)):
        p = mx.array(rng.normal(0, 0.5, (3, 5)).astype(np.float32))
        opt = optim.AdamW(learning_rate=lr)
        tensors[f"adamw.{case}.param0"] = p
        params = {"w": p}
        for k in range(1, 4):
            g = mx.array(rng.normal(0, 1.0 / k, (3, 5)).astype(np.float32))
            params = opt.apply_gradients({"w": g}, params)
            mx.eval(params)
            tensors[f"adamw.{case}.grad{k}"] = g
            tensors[f"adamw.{case}.param{k}"] = params["w"]
        doc["adamw"].append({"case": case, "learning_rate": lr, "steps": 3})

    mx.eval(list(tensors.values()))
    mx.save_safetensors(str(OUT / "lora_train.safetensors"), tensors)
    (OUT / "lora_train.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote lora_train.safetensors ({len(tensors)} tensors), lora_train.json")


if __name__ == "__main__":
    main()
