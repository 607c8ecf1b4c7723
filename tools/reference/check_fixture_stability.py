#!/usr/bin/env python3
"""Check that a fixture's generation trajectories survive float32 rounding noise.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run with the reference venv:

    /work/refenv/bin/python tools/reference/check_fixture_stability.py [--fixtures tiny ...]
        [--seeds 0 1 2 3 4 5] [--perturb-seeds 101 202] [--json out.json]

Method: load the fixture with
`load_diffusion_gemma`, cast to float32 (`model.set_dtype(mx.float32)`), run the reference's
`stream_diffusion_generate` exactly as the public `optiq.vlm.diffusion_gemma.generate.
stream_generate` calls it, then rerun every (prompt, seed, sampler, temperature, options) case with
a +-1 float32 ulp perturbation on ~1% of the outputs of every quantized matmul
(`mx.quantized_matmul`: QuantizedLinear and the tied head `QuantizedEmbedding.as_linear`;
`mx.gather_qmm`: the MoE experts' QuantizedSwitchLinear). A case is robust when the emitted token
ids, the raw argmax canvas of every block, the denoising steps per block and the finish reason are
identical under every perturbation pattern. Goldens may only use robust cases: a token mismatch
in a Rust parity test must mean a bug, not chaos.

The perturbation draws its mask and signs from explicit `mx.random.key`s, so it never touches the
global RNG that the engine uses (canvas noise, categorical sampling).

This file is also the harness `dump_generation_goldens.py` imports: `load_f32`, `run_case`
(instrumented run of the real decode loop, recording per-block argmax canvases and steps and,
on request, per-step internals) and `perturbed` (the noise context manager).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import time

import mlx.core as mx
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"

# Text prompts, encoded as the public API does (encode(prompt, add_special_tokens=True), no BOS).
PROMPTS = {
    # 6 ids: shorter than the fixture's sliding window (8).
    "short": "Hi, tiny.",
    # >= 20 ids: longer than twice the sliding window.
    "long": "Why is the sky blue? Because air scatters short wavelengths of sunlight more.",
}

PERTURB_FRACTION = 0.01


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_f32(path: pathlib.Path | str, f32: bool = True):
    """(model, tokenizer) as `optiq.vlm.diffusion_gemma.generate.load` returns them, the model
    cast to float32 (packed uint32 weights unchanged; bf16 scales/biases/norms widen exactly)."""
    from optiq.vlm.diffusion_gemma.generate import load

    model, tokenizer = load(str(path))
    if f32:
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model, tokenizer


def encode_text(tokenizer, text: str) -> list[int]:
    """The public text path: `tokenizer.encode(prompt, add_special_tokens=True)`."""
    return list(tokenizer.encode(text, add_special_tokens=True))


# --------------------------------------------------------------------------------------------
# Perturbation
# --------------------------------------------------------------------------------------------


class _Perturber:
    """Wraps a quantized-matmul function; moves ~1% of its outputs by one ulp (toward +inf or
    -inf, random per element). Keys come from (seed, call counter), never the global RNG."""

    def __init__(self, fn, seed: int, salt: int, fraction: float, ulps: int = 1):
        self.fn = fn
        self.ulps = ulps
        self.seed = seed
        self.salt = salt
        self.fraction = fraction
        self.calls = 0
        self.moved = 0
        self.total = 0

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        self.calls += 1
        key = mx.random.key((self.seed * 1_000_003 + self.salt * 7919 + self.calls) % (2**31))
        k_mask, k_sign = mx.random.split(key)
        mask = mx.random.uniform(shape=out.shape, key=k_mask) < self.fraction
        mask = mask & (out != 0) & mx.isfinite(out)
        up = mx.random.uniform(shape=out.shape, key=k_sign) < 0.5
        if out.dtype == mx.float32:
            uint = mx.uint32
        elif out.dtype in (mx.bfloat16, mx.float16):
            uint = mx.uint16
        else:
            raise TypeError(f"unexpected quantized matmul output dtype {out.dtype}")
        bits = out.view(uint)
        # nextafter(x, +inf) adds one to the magnitude bits of a positive x and subtracts one for
        # a negative x; nextafter(x, -inf) the opposite. x == 0 is left alone (masked out).
        grow = up == (out > 0)
        one = mx.array(self.ulps, dtype=uint)
        moved = mx.where(grow, bits + one, bits - one)
        result = mx.where(mask, moved, bits).view(out.dtype)
        self.moved += int(mx.sum(mask).item())
        self.total += out.size
        return result


@contextlib.contextmanager
def perturbed(seed: int | None, fraction: float = PERTURB_FRACTION, ulps: int = 1):
    """Perturb every mx.quantized_matmul / mx.gather_qmm output while active (seed None: no-op)
    by `ulps` units in the last place. Yields the list of perturbers (for counting)."""
    if seed is None:
        yield []
        return
    qmm = _Perturber(mx.quantized_matmul, seed, 1, fraction, ulps)
    gqmm = _Perturber(mx.gather_qmm, seed, 2, fraction, ulps)
    orig_qmm, orig_gqmm = mx.quantized_matmul, mx.gather_qmm
    mx.quantized_matmul, mx.gather_qmm = qmm, gqmm
    try:
        yield [qmm, gqmm]
    finally:
        mx.quantized_matmul, mx.gather_qmm = orig_qmm, orig_gqmm


# --------------------------------------------------------------------------------------------
# Instrumented run of the real decode loop
# --------------------------------------------------------------------------------------------


class _MxProxy:
    """Stands in for `mx` inside the diffusion module only, to record argmax canvases."""

    def __init__(self, recorder):
        self._rec = recorder

    def __getattr__(self, name):
        return getattr(mx, name)

    def argmax(self, a, *args, **kwargs):
        out = mx.argmax(a, *args, **kwargs)
        if a.ndim == 3:  # argmax_canvas = argmax(processed_logits) in the step loop
            self._rec.on_argmax(out, a)
        return out


class _Recorder:
    def __init__(self, detail_blocks: int, keep_logits: bool = False):
        self.detail_blocks = detail_blocks
        self.keep_logits = keep_logits
        self.logits: list[np.ndarray] = []  # block 1's processed logits per step
        self.blocks: list[dict] = []

    def _detail(self) -> bool:
        return len(self.blocks) <= self.detail_blocks

    def new_block(self):
        self.blocks.append({"argmax": [], "steps": []})

    def on_step_input(self, canvas, with_sc: bool):
        b = self.blocks[-1]
        if self._detail():
            b["steps"].append({"canvas_in": _ids(canvas), "self_conditioned": with_sc})
        else:
            b["steps"].append(None)

    def on_argmax(self, out, logits):
        b = self.blocks[-1]
        if self.keep_logits and len(self.blocks) == 1:
            self.logits.append(np.array(logits.astype(mx.float32)))
        b["argmax"].append(_ids(out))
        if self._detail():
            b["steps"][-1]["argmax"] = _ids(out)

    def on_sampled(self, out):
        if self._detail():
            self.blocks[-1]["steps"][-1]["sampled"] = _ids(out)

    def on_accept(self, mask):
        if self._detail():
            self.blocks[-1]["steps"][-1]["accept"] = "".join(
                "1" if v else "0" for v in np.array(mask).reshape(-1).tolist()
            )

    def on_stable(self, value: bool, stable: bool, entropy_mean: float):
        if self._detail():
            s = self.blocks[-1]["steps"][-1]
            s["stable"] = stable
            s["mean_entropy"] = entropy_mean
            s["stop"] = value
        self.blocks[-1].setdefault("stable_checks", []).append(
            {"value": value, "stable": stable, "mean_entropy": entropy_mean}
        )


def _ids(a) -> list[int]:
    return [int(v) for v in np.array(a).reshape(-1).tolist()]


@contextlib.contextmanager
def _instrumented(rec: _Recorder):
    from optiq.vlm._mlxvlm.generate import diffusion as D

    saved = {
        name: getattr(D, name)
        for name in (
            "mx",
            "_make_diffusion_decoder_logits_fns",
            "_diffusion_sample_canvas",
            "_diffusion_entropy_transfer_mask",
            "_diffusion_confidence_transfer_mask",
            "_diffusion_stable_and_confident",
        )
    }

    def make_fns(*args, **kwargs):
        without_sc, with_sc = saved["_make_diffusion_decoder_logits_fns"](*args, **kwargs)
        rec.new_block()

        def w_without(canvas):
            rec.on_step_input(canvas, False)
            return without_sc(canvas)

        def w_with(canvas, emb):
            rec.on_step_input(canvas, True)
            return with_sc(canvas, emb)

        return w_without, w_with

    def sample(*args, **kwargs):
        out = saved["_diffusion_sample_canvas"](*args, **kwargs)
        rec.on_sampled(out)
        return out

    def entropy_mask(*args, **kwargs):
        out = saved["_diffusion_entropy_transfer_mask"](*args, **kwargs)
        rec.on_accept(out)
        return out

    def confidence_mask(*args, **kwargs):
        out = saved["_diffusion_confidence_transfer_mask"](*args, **kwargs)
        rec.on_accept(out)
        return out

    def stable(accepted_canvas, processed_logits, history, stopping_config):
        was_stable = None
        if stopping_config is not None:
            n = int(stopping_config.get("stability_threshold", 1))
            was_stable = len(history) == n and all(
                bool(mx.all(accepted_canvas == c).item()) for c in history
            )
        out = saved["_diffusion_stable_and_confident"](
            accepted_canvas, processed_logits, history, stopping_config
        )
        if stopping_config is not None:
            ent = float(mx.mean(D._diffusion_token_entropy(processed_logits)).item())
            rec.on_stable(bool(out), bool(was_stable), ent)
        return out

    D.mx = _MxProxy(rec)
    D._make_diffusion_decoder_logits_fns = make_fns
    D._diffusion_sample_canvas = sample
    D._diffusion_entropy_transfer_mask = entropy_mask
    D._diffusion_confidence_transfer_mask = confidence_mask
    D._diffusion_stable_and_confident = stable
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(D, name, value)


def run_case(
    model,
    tokenizer,
    prompt_ids: list[int],
    *,
    seed: int,
    sampler: str = "confidence-threshold",
    temperature: float = 0.0,
    max_tokens: int = 512,
    steps: int | None = None,
    threshold: float | None = None,
    min_canvas: int | None = None,
    max_canvas: int | None = None,
    generation_config: dict | None = None,
    detail_blocks: int = 0,
    perturb_seed: int | None = None,
    perturb_ulps: int = 1,
    keep_logits: bool = False,
) -> dict:
    """One generation through the reference's `stream_diffusion_generate`, called exactly as the
    public `stream_generate` calls it (processor = tokenizer, skip_special_token_ids=set(),
    input ids [1, P] int32) plus the optional engine options. `generation_config` is set on
    `model.config.generation_config` for this run only. The global RNG is seeded with `seed`
    right before the call (after loading)."""
    from optiq.vlm._mlxvlm.generate.diffusion import stream_diffusion_generate

    kwargs = {}
    if steps is not None:
        kwargs["max_denoising_steps"] = steps
    if threshold is not None:
        kwargs["diffusion_threshold"] = threshold
    if min_canvas is not None:
        kwargs["diffusion_min_canvas_length"] = min_canvas
    if max_canvas is not None:
        kwargs["diffusion_max_canvas_length"] = max_canvas

    saved_gc = getattr(model.config, "generation_config", None)
    had_gc = hasattr(model.config, "generation_config")
    if generation_config is not None:
        model.config.generation_config = dict(generation_config)
    rec = _Recorder(detail_blocks, keep_logits)
    emitted, block_ends, final = [], [], None
    try:
        with perturbed(perturb_seed, ulps=perturb_ulps) as perturbers, _instrumented(rec):
            mx.random.seed(seed)
            input_ids = mx.array(list(prompt_ids), dtype=mx.int32)[None]
            for r in stream_diffusion_generate(
                model, tokenizer, tokenizer, input_ids, None, None,
                max_tokens=max_tokens, skip_special_token_ids=set(),
                temperature=temperature, diffusion_sampler=sampler,
                mm_token_type_ids=None, **kwargs,
            ):
                if r.is_draft:
                    continue
                if r.finish_reason is not None:
                    final = r
                elif r.diffusion_block_complete:
                    block_ends.append(r)
                else:
                    emitted.append(int(r.token))
            moved = sum(p.moved for p in perturbers)
    finally:
        if generation_config is not None:
            if had_gc:
                model.config.generation_config = saved_gc
            else:
                del model.config.generation_config

    blocks = []
    prev = 0
    for i, (b, end) in enumerate(zip(rec.blocks, block_ends)):
        n_steps = end.diffusion_denoising_steps - prev
        prev = end.diffusion_denoising_steps
        assert n_steps == len(b["argmax"]) == len(b["steps"]), (n_steps, len(b["argmax"]))
        block = {
            "canvas_length": len(b["argmax"][-1]),
            "steps": n_steps,
            "argmax_canvas": b["argmax"][-1],
        }
        if "stable_checks" in b:
            block["stable_stop"] = bool(b["stable_checks"][-1]["value"])
            # Mean entropy of the temperature-divided logits at every stop check, and the
            # (1-based) steps of this block at which the argmax canvas was stable.
            block["stop_check_mean_entropy"] = [c["mean_entropy"] for c in b["stable_checks"]]
            block["stable_at_steps"] = [
                j + 1 for j, c in enumerate(b["stable_checks"]) if c["stable"]
            ]
        if i < detail_blocks:
            block["per_step"] = b["steps"]
        blocks.append(block)
    assert len(rec.blocks) == len(block_ends), (len(rec.blocks), len(block_ends))
    return {
        "emitted_ids": emitted,
        "blocks": blocks,
        "finish_reason": final.finish_reason,
        "generation_tokens": int(final.generation_tokens),
        "prompt_tokens": int(final.prompt_tokens),
        "diffusion_canvas_tokens": int(final.diffusion_canvas_tokens),
        "diffusion_denoising_steps": int(final.diffusion_denoising_steps),
        "diffusion_work_tokens": int(final.diffusion_work_tokens),
        "perturbed_elements": moved,
        "block1_logits": rec.logits,
    }


def trajectory(out: dict) -> tuple:
    """What must be identical for a case to count as robust."""
    return (
        tuple(out["emitted_ids"]),
        tuple((b["steps"], tuple(b["argmax_canvas"])) for b in out["blocks"]),
        out["finish_reason"],
        out["generation_tokens"],
    )


def check_case(model, tokenizer, prompt_ids, perturb_seeds, ulps: int = 1, **case):
    """(clean output, [identical under perturbation p for p in perturb_seeds], [max |logit
    difference| over block 1's steps for each p, while the canvases still agree])."""
    clean = run_case(model, tokenizer, prompt_ids, keep_logits=True, **case)
    again = run_case(model, tokenizer, prompt_ids, **case)
    assert trajectory(clean) == trajectory(again), "reference run is not deterministic"
    same, drift = [], []
    for p in perturb_seeds:
        noisy = run_case(model, tokenizer, prompt_ids, perturb_seed=p, perturb_ulps=ulps,
                         keep_logits=True, **case)
        assert noisy["perturbed_elements"] > 0, "perturbation did not apply"
        same.append(trajectory(noisy) == trajectory(clean))
        d = 0.0
        for a, b in zip(clean["block1_logits"], noisy["block1_logits"]):
            if a.shape != b.shape:
                break
            d = max(d, float(np.max(np.abs(a - b))))
        drift.append(d)
    return clean, same, drift


# --------------------------------------------------------------------------------------------
# Main: the grid
# --------------------------------------------------------------------------------------------

GRID_OPTIONS = {
    # Public defaults except max_tokens (40 = 3 blocks of 16 unless EOS comes first).
    "default48": {"max_tokens": 40},
    # Fewer steps (confidence-threshold goldens use 12).
    "steps12": {"max_tokens": 40, "steps": 12},
    # Stable-and-confident stop enabled through model.config.generation_config. Stability 0
    # (every step counts as stable): the stop fires at the first step whose mean entropy is
    # below 0.1 (with stability 1 it never fires on 16-token canvases of `tiny`, whose argmax
    # canvas never repeats; dump_generation_goldens.py covers that with 2-token canvases).
    "stop0": {"max_tokens": 40, "generation_config": {"stability_threshold": 0,
                                                      "confidence_threshold": 0.1}},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", nargs="+", default=["tiny"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--perturb-seeds", nargs="+", type=int, default=[101, 202])
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    ap.add_argument("--samplers", nargs="+", default=["confidence-threshold", "entropy-bound"])
    ap.add_argument("--options", nargs="+", default=["default48"], choices=list(GRID_OPTIONS))
    ap.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=list(PROMPTS))
    ap.add_argument("--ulps", type=int, default=1, help="perturbation size (default 1 ulp)")
    ap.add_argument("--bf16", action="store_true",
                    help="keep the checkpoint's bfloat16 (negative control: not robust)")
    ap.add_argument("--json", type=pathlib.Path, help="write the per-case results here")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    report = []
    for fixture in args.fixtures:
        model, tokenizer = load_f32(MODELS / fixture, f32=not args.bf16)
        for opt_name in args.options:
            for sampler in args.samplers:
                for temp in args.temperatures:
                    n_ok = n_all = 0
                    t0 = time.time()
                    for prompt in args.prompts:
                        ids = encode_text(tokenizer, PROMPTS[prompt])
                        for seed in args.seeds:
                            case = dict(seed=seed, sampler=sampler, temperature=temp,
                                        **GRID_OPTIONS[opt_name])
                            clean, same, drift = check_case(model, tokenizer, ids,
                                                            args.perturb_seeds, args.ulps,
                                                            **case)
                            ok = all(same)
                            n_ok += ok
                            n_all += 1
                            report.append({
                                "fixture": fixture, "options": opt_name, "sampler": sampler,
                                "temperature": temp, "prompt": prompt, "seed": seed,
                                "robust": ok, "same_per_perturbation": same,
                                "max_block1_logit_drift": drift,
                                "steps": [b["steps"] for b in clean["blocks"]],
                                "finish_reason": clean["finish_reason"],
                                "generation_tokens": clean["generation_tokens"],
                            })
                            print(f"  {fixture} {opt_name} {sampler:20s} T={temp} {prompt:5s} "
                                  f"seed={seed}: {'ok ' if ok else 'DIVERGED'} steps="
                                  f"{[b['steps'] for b in clean['blocks']]} "
                                  f"{clean['finish_reason']} n={clean['generation_tokens']} "
                                  f"drift={max(drift):.2e}",
                                  flush=True)
                    print(f"{fixture} {opt_name} {sampler} T={temp}: {n_ok} of {n_all} "
                          f"identical under {len(args.perturb_seeds)} perturbation patterns of "
                          f"{args.ulps} ulp{' (bf16)' if args.bf16 else ''} "
                          f"({time.time() - t0:.1f} s)", flush=True)
        del model
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    n_ok = sum(r["robust"] for r in report)
    print(f"total: {n_ok} of {len(report)} robust")
    sys.exit(0 if n_ok == len(report) else 1)


if __name__ == "__main__":
    main()
