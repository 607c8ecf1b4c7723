#!/usr/bin/env python3
"""Dump token-for-token generation goldens for the Rust engine from the float32 reference.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run with the reference venv
after make_checkpoints.py:

    /work/refenv/bin/python tools/reference/dump_generation_goldens.py [--fixture tiny]

Writes tests/fixtures/goldens/generate_<fixture>.json. Every case runs the reference's own
`stream_diffusion_generate` (optiq/vlm/_mlxvlm/generate/diffusion.py) on the fixture loaded with
`optiq.vlm.diffusion_gemma.generate.load` and cast to float32 (`model.set_dtype(mx.float32)`),
called exactly as the public `stream_generate` calls it:

    mx.random.seed(seed)          # after loading: loading consumes RNG
    stream_diffusion_generate(model, tokenizer, tokenizer, mx.array(ids, mx.int32)[None],
        None, None, max_tokens=max_tokens, skip_special_token_ids=set(),
        temperature=temperature, diffusion_sampler=sampler, mm_token_type_ids=None,
        [max_denoising_steps=steps], [diffusion_threshold=threshold],
        [diffusion_min_canvas_length=min_canvas], [diffusion_max_canvas_length=max_canvas])

with `model.config.generation_config = {...}` set for the cases that enable the
stable-and-confident stop (the reference never reads generation_config.json). Cases without
engine-only options are also run through the public
`optiq.vlm.diffusion_gemma.generate.stream_generate(model, tokenizer, prompt, max_tokens=...,
temperature=..., sampler=...)`, which must emit the same tokens (asserted).

Only robust cases are written: each case is rerun under 3 patterns of +-1 float32 ulp noise on
1% of the quantized-matmul outputs (check_fixture_stability.py) and must give the identical
trajectory (emitted ids, argmax canvas and steps of every block, finish reason); the script fails
otherwise. `tiny-sharded` must give the same output as `tiny` (asserted on the first case).

JSON layout (see "conventions" inside the file): per case the prompt (text / chat messages,
rendered text and ids), the options as passed and as effective, and the outputs:
`emitted_ids` (tokens yielded by the stream: an EOS is not emitted), `eos` (the EOS id that
stopped generation and its index in the last block's canvas, or null), `generation_tokens`
(the reference's count, which includes the EOS), `blocks[]` (`canvas_length`, `steps` =
denoising steps run in that block, `argmax_canvas` = the raw emitted canvas, i.e. the argmax of
the last computed logits over every position, even past EOS / max_tokens), `finish_reason`,
`n_canvases`, and for two cases `blocks[0].per_step[]`: per step the canvas fed to the decoder
(`canvas_in`), whether self-conditioning was fed, `argmax` of the temperature-divided logits,
`sampled` (temperature > 0: the categorical draw), `accept` (the sampler's transfer mask as a
0/1 string; absent on the final step, which breaks right after the argmax), and for stop cases
`stable` / `mean_entropy` / `stop` at the stop check.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import mlx.core as mx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import check_fixture_stability as cfs  # noqa: E402

ROOT = HERE.parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
OUT = ROOT / "tests" / "fixtures" / "goldens"

PERTURB_SEEDS = [101, 202, 303]
DEFAULT_STEPS = 48
DEFAULT_THRESHOLD = 0.9
DEFAULT_MIN_CANVAS = 64

SHORT = cfs.PROMPTS["short"]  # 6 ids: shorter than the sliding window (8)
LONG = cfs.PROMPTS["long"]  # 45 ids: longer than the sliding window
CHAT = [{"role": "user", "content": "Hi, tiny."}]

# name, prompt, options, per-step detail for block 1.
# Prompt: ("text", str) encoded as the public API does, or ("chat", messages) rendered with the
# fixture's chat template (apply_chat_template(..., tokenize=False, add_generation_prompt=True))
# and encoded with add_special_tokens=False, as the reference's image path does.
CASES = [
    # Public default sampler (confidence-threshold, 0.9, 48 steps), multi-block, long prompt.
    ("ct_t0_long_40", ("text", LONG),
     dict(sampler="confidence-threshold", temperature=0.0, max_tokens=40, seed=1), True),
    ("ct_t07_long_40", ("text", LONG),
     dict(sampler="confidence-threshold", temperature=0.7, max_tokens=40, seed=0), False),
    # A generation that ends on EOS (finish "stop").
    ("ct_t0_short_eos", ("text", SHORT),
     dict(sampler="confidence-threshold", temperature=0.0, max_tokens=40, seed=0), False),
    # Fewer steps and a non-default threshold.
    ("ct_t0_long_steps12", ("text", LONG),
     dict(sampler="confidence-threshold", temperature=0.0, max_tokens=40, seed=3, steps=12),
     False),
    ("ct_t07_short_steps12_thr05", ("text", SHORT),
     dict(sampler="confidence-threshold", temperature=0.7, max_tokens=40, seed=2, steps=12,
          threshold=0.5), False),
    # Canvas-length rule: min/max canvas options (blocks of 8, 8, 4) ...
    ("ct_t0_long_canvas_4_8", ("text", LONG),
     dict(sampler="confidence-threshold", temperature=0.0, max_tokens=20, seed=4,
          min_canvas=4, max_canvas=8), False),
    # ... max_tokens below the canvas: min canvas 64 capped at 16, 10 of 16 tokens emitted ...
    ("ct_t0_short_max10", ("text", SHORT),
     dict(sampler="confidence-threshold", temperature=0.0, max_tokens=10, seed=3), False),
    # ... and min canvas 4: a 10-token canvas.
    ("eb_t0_short_min4_max10", ("text", SHORT),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=10, seed=3, min_canvas=4),
     False),
    # Entropy-bound (the engine's own default), 48 steps.
    ("eb_t0_short_16", ("text", SHORT),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=16, seed=2), False),
    ("eb_t07_short_16", ("text", SHORT),
     dict(sampler="entropy-bound", temperature=0.7, max_tokens=16, seed=1), True),
    ("eb_t0_long_40", ("text", LONG),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=40, seed=1), False),
    ("eb_t07_long_40", ("text", LONG),
     dict(sampler="entropy-bound", temperature=0.7, max_tokens=40, seed=2), False),
    ("eb_t0_long_eos", ("text", LONG),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=40, seed=0), False),
    ("eb_t0_long_steps12", ("text", LONG),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=40, seed=5, steps=12), False),
    # Stable-and-confident stop (model.config.generation_config). stability 1: the argmax canvas
    # of 2-token blocks settles in block 2 (stable at step 12, unstable at 13-15, stable again
    # from 16 on) and the mean entropy falls below 0.3 at step 20; block 3 follows.
    ("eb_t0_long_stop1_canvas2", ("text", LONG),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=6, seed=3, min_canvas=2,
          max_canvas=2, generation_config={"stability_threshold": 1,
                                           "confidence_threshold": 0.3}), True),
    # stability 0 (every step counts as stable): stops at the first step whose mean entropy is
    # below the threshold.
    ("eb_t0_long_stop0", ("text", LONG),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=40, seed=0,
          generation_config={"stability_threshold": 0, "confidence_threshold": 0.1}), False),
    ("ct_t0_long_stop0", ("text", LONG),
     dict(sampler="confidence-threshold", temperature=0.0, max_tokens=40, seed=0,
          generation_config={"stability_threshold": 0, "confidence_threshold": 0.3}), False),
    # stability 1 with an always-true confidence: a stop that never fires on these canvases
    # (the argmax canvas of a 16-token block never repeats), so a port that mistakes the
    # stability test stops early.
    ("eb_t0_short_stop1_never", ("text", SHORT),
     dict(sampler="entropy-bound", temperature=0.0, max_tokens=16, seed=2,
          generation_config={"stability_threshold": 1, "confidence_threshold": 100.0}), False),
    # Chat-templated prompt (fixture chat_template.jinja).
    ("ct_t0_chat", ("chat", CHAT),
     dict(sampler="confidence-threshold", temperature=0.0, max_tokens=32, seed=1), False),
]

PUBLIC_KEYS = {"sampler", "temperature", "max_tokens", "seed"}


def prompt_of(tokenizer, spec) -> dict:
    kind, value = spec
    if kind == "text":
        return {"kind": "text", "text": value, "ids": cfs.encode_text(tokenizer, value)}
    rendered = tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
    return {
        "kind": "chat",
        "messages": value,
        "add_generation_prompt": True,
        "rendered": rendered,
        "ids": list(tokenizer.encode(rendered, add_special_tokens=False)),
    }


def effective(model, eos_ids: set[int], opts: dict) -> dict:
    """The values stream_diffusion_generate derives from the options (diffusion.py 531-620)."""
    model_canvas = int(model.config.canvas_length)
    max_canvas = min(model_canvas, int(opts.get("max_canvas") or model_canvas))
    min_canvas = min(max_canvas, int(opts.get("min_canvas") or DEFAULT_MIN_CANVAS))
    gc = opts.get("generation_config") or {}
    stop = None
    if "stability_threshold" in gc or "confidence_threshold" in gc:
        stop = {"stability_threshold": int(gc.get("stability_threshold", 1)),
                "confidence_threshold": float(gc.get("confidence_threshold", 0.005))}
    return {
        "steps": int(opts.get("steps") or gc.get("max_denoising_steps") or DEFAULT_STEPS),
        "threshold": float(opts.get("threshold", DEFAULT_THRESHOLD)),
        "min_canvas": min_canvas,
        "max_canvas": max_canvas,
        "t_min": 0.4,
        "t_max": 0.8,
        "entropy_bound": 0.1,
        "eos_ids": sorted(eos_ids),
        "stop": stop,
    }


def python_call(opts: dict) -> str:
    kw = [f"max_tokens={opts['max_tokens']}", "skip_special_token_ids=set()",
          f"temperature={opts['temperature']}", f"diffusion_sampler={opts['sampler']!r}",
          "mm_token_type_ids=None"]
    for key, arg in (("steps", "max_denoising_steps"), ("threshold", "diffusion_threshold"),
                     ("min_canvas", "diffusion_min_canvas_length"),
                     ("max_canvas", "diffusion_max_canvas_length")):
        if key in opts:
            kw.append(f"{arg}={opts[key]}")
    lines = []
    if "generation_config" in opts:
        lines.append(f"model.config.generation_config = {opts['generation_config']!r}")
    lines.append(f"mx.random.seed({opts['seed']})")
    lines.append("stream_diffusion_generate(model, tokenizer, tokenizer, "
                 "mx.array(prompt['ids'], dtype=mx.int32)[None], None, None, "
                 + ", ".join(kw) + ")")
    return "; ".join(lines)


def public_ids(model, tokenizer, prompt_arg, opts: dict) -> list[int]:
    from optiq.vlm.diffusion_gemma.generate import stream_generate

    mx.random.seed(opts["seed"])
    out = []
    for r in stream_generate(model, tokenizer, prompt_arg, max_tokens=opts["max_tokens"],
                             temperature=opts["temperature"], sampler=opts["sampler"]):
        if not r.is_draft and r.finish_reason is None and not r.diffusion_block_complete:
            out.append(int(r.token))
    return out


def run(model, tokenizer, prompt: dict, opts: dict, detail: bool) -> dict:
    kw = {k: v for k, v in opts.items()}
    return cfs.run_case(model, tokenizer, prompt["ids"], detail_blocks=1 if detail else 0, **kw)


def summarize(out: dict, eos_ids: set[int]) -> dict:
    last = out["blocks"][-1]["argmax_canvas"]
    # Generation only stops in the last block, so every earlier block was consumed whole.
    n_before_last = sum(b["canvas_length"] for b in out["blocks"][:-1])
    eos = None
    if out["finish_reason"] == "stop":
        idx = out["generation_tokens"] - n_before_last - 1
        eos = {"id": last[idx], "index_in_last_block": idx}
        assert last[idx] in eos_ids, (last, idx)
    blocks = []
    for b in out["blocks"]:
        block = {"canvas_length": b["canvas_length"], "steps": b["steps"],
                 "argmax_canvas": b["argmax_canvas"]}
        for key in ("stable_stop", "stable_at_steps", "stop_check_mean_entropy", "per_step"):
            if key in b:
                block[key] = b[key]
        if "stop_check_mean_entropy" in block:
            block["stop_check_mean_entropy"] = [round(v, 6)
                                                for v in block["stop_check_mean_entropy"]]
        blocks.append(block)
    return {
        "emitted_ids": out["emitted_ids"],
        "eos": eos,
        "generation_tokens": out["generation_tokens"],
        "finish_reason": out["finish_reason"],
        "n_canvases": len(out["blocks"]),
        "denoising_steps": out["diffusion_denoising_steps"],
        "canvas_tokens": out["diffusion_canvas_tokens"],
        "blocks": blocks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default="tiny")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--only", nargs="*", help="case names (debugging; not for the golden file)")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    out_path = args.out or OUT / f"generate_{args.fixture}.json"

    import mlx_lm
    import optiq

    assert mx.__version__ == "0.32.4", mx.__version__
    assert mlx_lm.__version__ == "0.32.2", mlx_lm.__version__
    assert getattr(optiq, "__version__", "0.7.7") == "0.7.7"

    fixture_dir = MODELS / args.fixture
    model, tokenizer = cfs.load_f32(fixture_dir)
    eos_ids = set(int(t) for t in tokenizer.stopping_criteria.eos_token_ids)
    has_template = (fixture_dir / "chat_template.jinja").is_file()

    cases, skipped, unstable = [], [], []
    for name, spec, opts, detail in CASES:
        if args.only and name not in args.only:
            continue
        if spec[0] == "chat" and not has_template:
            skipped.append(f"{name}: no chat_template.jinja in {args.fixture}")
            continue
        t0 = time.time()
        prompt = prompt_of(tokenizer, spec)
        clean = run(model, tokenizer, prompt, opts, detail)
        same = []
        for p in PERTURB_SEEDS:
            noisy = cfs.run_case(model, tokenizer, prompt["ids"], perturb_seed=p, **opts)
            assert noisy["perturbed_elements"] > 0
            same.append(cfs.trajectory(noisy) == cfs.trajectory(clean))
        if not all(same):
            unstable.append(f"{name}: identical under {sum(same)} of {len(same)} perturbations")
        if set(opts) <= PUBLIC_KEYS:
            arg = prompt["text"] if prompt["kind"] == "text" else prompt["ids"]
            assert public_ids(model, tokenizer, arg, opts) == clean["emitted_ids"], name
        res = summarize(clean, eos_ids)
        case = {
            "name": name,
            "fixture": args.fixture,
            "prompt": prompt,
            "options": {k: v for k, v in opts.items()},
            "effective": effective(model, eos_ids, opts),
            "python": python_call(opts),
            "public_api": set(opts) <= PUBLIC_KEYS,
            "robust": {"perturb_seeds": PERTURB_SEEDS, "identical": same},
            "outputs": res,
        }
        cases.append(case)
        print(f"{name:28s} {time.time() - t0:5.1f}s robust={sum(same)}/{len(same)} "
              f"steps={[b['steps'] for b in res['blocks']]} "
              f"L={[b['canvas_length'] for b in res['blocks']]} {res['finish_reason']} "
              f"n={res['generation_tokens']} emitted={len(res['emitted_ids'])}"
              f"{' eos=' + str(res['eos']) if res['eos'] else ''}", flush=True)

    if unstable:
        print("UNSTABLE cases (pick other seeds/options):\n  " + "\n  ".join(unstable))
        sys.exit(1)

    # The sharded copy of the checkpoint must generate the same tokens.
    if args.fixture == "tiny" and cases and not args.only:
        m2, t2 = cfs.load_f32(MODELS / "tiny-sharded")
        first = CASES[0]
        o2 = cfs.run_case(m2, t2, cases[0]["prompt"]["ids"], **first[2])
        o1 = cfs.run_case(model, tokenizer, cases[0]["prompt"]["ids"], **first[2])
        assert cfs.trajectory(o1) == cfs.trajectory(o2), "tiny-sharded differs from tiny"
        del m2

    doc = {
        "about": "Generation goldens from the float32 reference (mlx-optiq 0.7.7, mlx 0.32.4, "
                 "mlx-lm 0.32.2, CPU). Written by tools/reference/dump_generation_goldens.py.",
        "conventions": {
            "model": "load_diffusion_gemma via optiq.vlm.diffusion_gemma.generate.load, then "
                     "model.set_dtype(mx.float32)",
            "seed": "mx.random.seed(seed) right before the call, after loading",
            "prompt": "text: tokenizer.encode(text, add_special_tokens=True) (no BOS); chat: "
                      "apply_chat_template(messages, tokenize=False, add_generation_prompt=True) "
                      "then encode(rendered, add_special_tokens=False)",
            "canvas_length": "min(max_canvas, max(max_tokens - generated, min_canvas)); "
                             "max_canvas = min(model canvas_length 16, option), min_canvas = "
                             "min(max_canvas, option or 64)",
            "emitted_ids": "tokens yielded by the stream; generation stops at the first EOS "
                           "(eos_ids), which is counted in generation_tokens but not emitted; "
                           "or when generation_tokens reaches max_tokens",
            "argmax_canvas": "per block, argmax of the last computed temperature-divided logits "
                             "over all positions (the committed block, fed to the encoder for "
                             "the next block), including positions past EOS / max_tokens",
            "steps": "denoising steps run in the block (decoder calls), including the final "
                     "step that breaks right after its argmax",
            "per_step": "block 1 only; canvas_in = canvas fed to the decoder at that step",
            "skip_special_token_ids": "set() (public generate); irrelevant to the ids",
            "robust": "identical trajectory under +-1 f32 ulp noise on 1% of quantized-matmul "
                      "outputs for each perturbation seed (check_fixture_stability.py)",
        },
        "skipped": skipped,
        "cases": cases,
    }
    # One line per case keeps diffs readable without the size of indent=2.
    text = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2]
    text += ',\n "cases": [\n' + ",\n".join(
        "  " + json.dumps(c, separators=(",", ":")) for c in cases) + "\n ]\n}\n"
    json.loads(text)
    out_path.write_text(text)
    print(f"wrote {out_path} ({len(text)} bytes, {len(cases)} cases)")
    if skipped:
        print("skipped:\n  " + "\n  ".join(skipped))


if __name__ == "__main__":
    main()
