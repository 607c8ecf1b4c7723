#!/usr/bin/env python3
"""Check that an adapter trained by dg loads in the reference and changes generation as in dg.

    .venv-ref/bin/python tools/reference/check_dg_adapter.py [--iters 30 --lr 1e-2 --seed 0]

1. dg trains an adapter on the `tiny` fixture with tests/fixtures/lora/train.jsonl
   (`cargo run --release --example train_lora`, lr 1e-2 so that 30 iterations move it enough
   to change generations).
2. The reference loads it with its own `load_diffusion_lora` (mlx-optiq 0.7.7, bf16 as shipped)
   and must see its logits change; then, in float32 (as every golden is compared),
   the adapter is mounted the same way (dump_lora_goldens.mount) and generations run through the
   reference's `stream_diffusion_generate` for both samplers.
3. dg generates the same cases with `--adapter` (examples/generate.rs --json) and the tokens
   must be identical; each case must also differ from the base model's generation somewhere
   (at least one case per sampler), so the adapter demonstrably acts.

Prints one line per case and exits non-zero on a mismatch. Not run in CI (it builds and runs
release examples; about a minute).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import mlx.core as mx

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import check_fixture_stability as cfs  # noqa: E402
from dump_lora_goldens import mount  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "tiny"
DATA = ROOT / "tests" / "fixtures" / "lora"
CASES = [(sampler, prompt, seed)
         for sampler in ("confidence-threshold", "entropy-bound")
         for prompt in ("short", "long")
         for seed in (0, 1)]
MAX_TOKENS = 32


def cargo_example(name: str, *args: str) -> str:
    cmd = ["cargo", "run", "--quiet", "--release", "--example", name, "--", *args]
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def dg_tokens(adapter: pathlib.Path | None, ids: list[int], sampler: str, seed: int) -> list[int]:
    args = ["--model", str(MODEL), "--prompt-ids", ",".join(map(str, ids)), "--sampler", sampler,
            "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--seed", str(seed),
            "--reference-defaults", "--json"]
    if adapter is not None:
        args += ["--adapter", str(adapter)]
    out = json.loads(cargo_example("generate", *args).strip().splitlines()[-1])
    return out["token_ids"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    mx.set_default_device(mx.cpu)
    from optiq.vlm.diffusion_gemma.generate import load
    from optiq.vlm.diffusion_gemma.lora import load_diffusion_lora

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        adapter = pathlib.Path(tmp) / "adapter"
        cargo_example("train_lora", "--model", str(MODEL), "--data", str(DATA), "--out",
                      str(adapter), "--iters", str(a.iters), "--lr", str(a.lr), "--seed",
                      str(a.seed))
        print(f"dg trained {adapter} ({a.iters} iterations, lr {a.lr})")

        # The reference's own loader, as shipped.
        ids = mx.array([[2, 10, 20, 30, 40, 50]], dtype=mx.int32)
        canvas = mx.array([[5] * 16], dtype=mx.int32)
        base, _ = load(str(MODEL))
        adapted, _ = load_diffusion_lora(str(MODEL), str(adapter))
        diff = float(mx.abs(base(input_ids=ids, canvas_ids=canvas).logits.astype(mx.float32)
                            - adapted(input_ids=ids, canvas_ids=canvas).logits
                            .astype(mx.float32)).max())
        print(f"load_diffusion_lora: max |logit change| {diff:.4f}")
        if not diff > 1e-2:
            print("FAIL: the adapter barely changes the reference's logits")
            failures += 1
        del base, adapted

        base, tokenizer = cfs.load_f32(MODEL)
        model, _ = cfs.load_f32(MODEL)
        mount(model, adapter)
        eos = set(int(t) for t in tokenizer.stopping_criteria.eos_token_ids)
        changed = set()
        for sampler, prompt, seed in CASES:
            prompt_ids = cfs.encode_text(tokenizer, cfs.PROMPTS[prompt])
            opts = dict(sampler=sampler, temperature=0.0, max_tokens=MAX_TOKENS, seed=seed)
            ref = cfs.run_case(model, tokenizer, prompt_ids, **opts)["emitted_ids"]
            ref_base = cfs.run_case(base, tokenizer, prompt_ids, **opts)["emitted_ids"]
            dg = dg_tokens(adapter, prompt_ids, sampler, seed)
            # dg's token_ids end with the EOS it stopped on; the reference's stream omits it.
            if dg and dg[-1] in eos and len(dg) == len(ref) + 1:
                dg = dg[:-1]
            same = dg == ref
            if ref != ref_base:
                changed.add(sampler)
            failures += not same
            print(f"{sampler:22s} {prompt:5s} seed {seed}: {'identical' if same else 'DIFFERENT'}"
                  f" ({len(ref)} tokens; adapter changes the reference's output: "
                  f"{ref != ref_base})")
        for sampler in ("confidence-threshold", "entropy-bound"):
            if sampler not in changed:
                print(f"FAIL: the adapter changes no {sampler} generation")
                failures += 1
    print("OK" if failures == 0 else f"{failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
