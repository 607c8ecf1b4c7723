#!/usr/bin/env python3
"""Dump token-for-token generation goldens for IMAGE prompts from the float32 reference.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 / Pillow on the CPU. Run with the
reference venv after make_vision_checkpoints.py (which rewrites tests/fixtures/images/):

    /work/refenv/bin/python tools/reference/dump_image_generation_goldens.py

Writes tests/fixtures/goldens/generate_images.json, and first (re)writes three PNGs derived
pixel-exactly from the fixture images (make_vision_checkpoints.py deletes the image folder):
  * pair_a.png: normal.png mirrored left-right; pair_b.png: normal.png mirrored top-bottom with
    its channels reversed (BGR). Both 64 x 48, so the reference can np.stack their pixel values
    (it stacks the per-image [3, H, W] arrays, so images of one prompt must resize alike).
  * wide.png: wide.jpg as Pillow decodes it (convert("RGB")), stored losslessly: dg's JPEG
    decoder is not bit-exact to Pillow's, a PNG of the same pixels is.

Every case runs on both vision fixtures (tiny-vision: inline 4-bit tower; tiny-vision-sidecar:
bf16 sidecar tower), loaded with `optiq.vlm.diffusion_gemma.generate.load` and cast to float32
(`model.set_dtype(mx.float32)`). The inputs are built by the reference's public image path,
`optiq.vlm.diffusion_gemma.generate._build_image_inputs(model, tokenizer, prompt, images)`:

    images = [PIL.Image.open(tests/fixtures/images/<file>) for file in files]
    pv, soft = preprocess_images(images)              # convert("RGB"), BICUBIC resize, /255
    pixel_values = mx.array(np.stack(pv)).astype(mx.bfloat16)   # kept: bf16 as the public path
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "<|image|>" * len(images) + prompt}],
        tokenize=False, add_generation_prompt=True)
    raw = tokenizer.encode(text, add_special_tokens=False)
    # each <|image|> (image_token_id) -> [boi] + [image_token_id] * soft[k] + [eoi]
    mm_token_type_ids = [1 if t == image_token_id else 0 for t in input_ids]

and the generation is the call the public `stream_generate(model, tokenizer, prompt,
images=images, max_tokens=..., temperature=..., sampler=...)` makes:

    mx.random.seed(seed)          # after loading: loading consumes RNG
    stream_diffusion_generate(model, tokenizer, tokenizer, input_ids, pixel_values, None,
        max_tokens=max_tokens, skip_special_token_ids=set(), temperature=temperature,
        diffusion_sampler=sampler, mm_token_type_ids=mm_token_type_ids)

It runs through check_fixture_stability.run_case (the instrumented decode loop that records
each block's argmax canvas and steps), with pixel values and token types passed through. The
public `stream_generate` itself must emit the same ids (asserted for every case).

Only robust cases are written: each case is rerun under 3 patterns of +-1 float32 ulp noise on
1% of the quantized-matmul outputs (check_fixture_stability.perturbed; this also perturbs the
inline tower's quantized projections) and must give the identical trajectory (emitted ids,
argmax canvas and steps of every block, finish reason, generation_tokens). Cases that are not
robust are dropped and listed under "dropped" in the JSON (the script reports N of M).

JSON: per case `name`, `fixture`, `images` (file names relative to tests/fixtures/images, with
their decoded size, the resized pixel_values shape [3, H, W] and the soft token count),
`prompt` (`text`, the `content` and the `rendered` chat template, `raw_ids` before image-token
expansion, `input_ids` after, `mm_token_type_ids`, `soft_tokens`), `options`, `effective`,
`python`, `robust`, and `outputs` with the schema of generate_tiny.json
(dump_generation_goldens.summarize).
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
sys.path.insert(0, str(HERE))

import check_fixture_stability as cfs  # noqa: E402
import dump_generation_goldens as dgg  # noqa: E402

ROOT = HERE.parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
IMAGES = ROOT / "tests" / "fixtures" / "images"
OUT = ROOT / "tests" / "fixtures" / "goldens" / "generate_images.json"

FIXTURES = ["tiny-vision", "tiny-vision-sidecar"]
PERTURB_SEEDS = [101, 202, 303]
MAX_TOKENS = 24  # two blocks of the fixtures' 16-token canvas (16 + 8 emitted)

ONE = "Describe this image."
TWO = "Compare the two images."
CT = "confidence-threshold"
EB = "entropy-bound"

# name, image files, prompt text, options, seed per fixture (a fixture without a seed skips the
# case). The same list runs on both fixtures. Seeds were picked (with --seeds) so that both
# blocks run unless the case is meant to stop early: "_eos" cases stop on EOS in block 2
# (confidence-threshold) or block 1 (entropy-bound, after all 48 steps).
CASES = [
    ("one_ct_t0", ["normal.png"], ONE,
     dict(sampler=CT, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision": 0, "tiny-vision-sidecar": 4}),
    ("one_eb_t0", ["normal.png"], ONE,
     dict(sampler=EB, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision": 0, "tiny-vision-sidecar": 5}),
    ("one_ct_t0_eos", ["normal.png"], ONE,
     dict(sampler=CT, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision": 3, "tiny-vision-sidecar": 3}),
    ("one_eb_t0_eos", ["normal.png"], ONE,
     dict(sampler=EB, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision-sidecar": 0}),
    ("pair_ct_t0", ["pair_a.png", "pair_b.png"], TWO,
     dict(sampler=CT, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision": 0, "tiny-vision-sidecar": 0}),
    ("pair_eb_t0", ["pair_a.png", "pair_b.png"], TWO,
     dict(sampler=EB, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision": 0, "tiny-vision-sidecar": 0}),
    ("tall_ct_t0", ["tall.png"], ONE,
     dict(sampler=CT, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision": 0, "tiny-vision-sidecar": 5}),
    ("wide_ct_t0", ["wide.png"], ONE,
     dict(sampler=CT, temperature=0.0, max_tokens=MAX_TOKENS),
     {"tiny-vision": 0, "tiny-vision-sidecar": 0}),
]


# --------------------------------------------------------------------------------------------
# Derived test images
# --------------------------------------------------------------------------------------------


def write_derived_images() -> list[str]:
    """(Re)write pair_a.png, pair_b.png and wide.png; return their names."""
    from PIL import Image

    normal = np.asarray(Image.open(IMAGES / "normal.png").convert("RGB"))
    pair_a = np.ascontiguousarray(normal[:, ::-1, :])
    pair_b = np.ascontiguousarray(normal[::-1, :, ::-1])
    Image.fromarray(pair_a, "RGB").save(IMAGES / "pair_a.png", optimize=True)
    Image.fromarray(pair_b, "RGB").save(IMAGES / "pair_b.png", optimize=True)
    wide = np.asarray(Image.open(IMAGES / "wide.jpg").convert("RGB"))
    Image.fromarray(wide, "RGB").save(IMAGES / "wide.png", optimize=True)
    # The PNGs must decode back to exactly these pixels.
    for name, arr in (("pair_a.png", pair_a), ("pair_b.png", pair_b), ("wide.png", wide)):
        back = np.asarray(Image.open(IMAGES / name).convert("RGB"))
        assert np.array_equal(back, arr), name
    return ["pair_a.png", "pair_b.png", "wide.png"]


# --------------------------------------------------------------------------------------------
# Image inputs and the instrumented run
# --------------------------------------------------------------------------------------------


def open_images(files: list[str]):
    from PIL import Image

    return [Image.open(IMAGES / f) for f in files]


def build_inputs(model, tokenizer, files: list[str], text: str) -> tuple[dict, mx.array, list]:
    """The public path's inputs (_build_image_inputs) plus what the JSON records about them."""
    from optiq.vlm.diffusion_gemma.generate import _build_image_inputs
    from optiq.vlm.gemma4.image_processing import preprocess_images

    images = open_images(files)
    input_ids, pixel_values, mm = _build_image_inputs(model, tokenizer, text, images)
    pv, soft = preprocess_images(images)
    cfg = model._optiq_config
    content = "<|image|>" * len(files) + text
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                             tokenize=False, add_generation_prompt=True)
    raw = list(tokenizer.encode(rendered, add_special_tokens=False))
    # Re-derive the expansion independently of the reference helper and compare.
    ids, k = [], 0
    for t in raw:
        if t == cfg["image_token_id"]:
            ids += [cfg["boi_token_id"]] + [cfg["image_token_id"]] * int(soft[k]) + \
                   [cfg["eoi_token_id"]]
            k += 1
        else:
            ids.append(t)
    assert k == len(files), (k, files)
    assert ids == input_ids[0].tolist()
    mm_list = mm[0].tolist()
    assert mm_list == [1 if t == cfg["image_token_id"] else 0 for t in ids]
    assert pixel_values.dtype == mx.bfloat16
    assert tuple(pixel_values.shape) == (len(files),) + pv[0].shape
    prompt = {
        "kind": "image",
        "text": text,
        "content": content,
        "add_generation_prompt": True,
        "rendered": rendered,
        "raw_ids": raw,
        "input_ids": ids,
        "mm_token_type_ids": mm_list,
        "soft_tokens": [int(s) for s in soft],
        "boi_token_id": cfg["boi_token_id"],
        "image_token_id": cfg["image_token_id"],
        "eoi_token_id": cfg["eoi_token_id"],
    }
    image_meta = [{"file": f, "size_wh": list(im.size), "mode": im.mode,
                   "pixel_values_shape": list(p.shape), "soft_tokens": int(s)}
                  for f, im, p, s in zip(files, images, pv, soft)]
    return prompt, pixel_values, mm, image_meta


@contextlib.contextmanager
def with_images(pixel_values: mx.array, mm: mx.array):
    """Make cfs.run_case's stream_diffusion_generate call carry the image inputs: it passes
    pixel_values=None and mm_token_type_ids=None (text path); the wrapper substitutes them."""
    from optiq.vlm._mlxvlm.generate import diffusion as D

    orig = D.stream_diffusion_generate

    def wrapped(model, processor, tokenizer, input_ids, pv, attention_mask, **kw):
        assert pv is None and kw.get("mm_token_type_ids") is None
        kw["mm_token_type_ids"] = mm
        return orig(model, processor, tokenizer, input_ids, pixel_values, attention_mask, **kw)

    D.stream_diffusion_generate = wrapped
    try:
        yield
    finally:
        D.stream_diffusion_generate = orig


def run(model, tokenizer, prompt, pixel_values, mm, opts, perturb_seed=None) -> dict:
    with with_images(pixel_values, mm):
        return cfs.run_case(model, tokenizer, prompt["input_ids"], perturb_seed=perturb_seed,
                            **opts)


def public_ids(model, tokenizer, files, text, opts) -> list[int]:
    from optiq.vlm.diffusion_gemma.generate import stream_generate

    images = open_images(files)
    mx.random.seed(opts["seed"])
    out = []
    for r in stream_generate(model, tokenizer, text, images=images,
                             max_tokens=opts["max_tokens"], temperature=opts["temperature"],
                             sampler=opts["sampler"]):
        if not r.is_draft and r.finish_reason is None and not r.diffusion_block_complete:
            out.append(int(r.token))
    return out


def python_call(files, text, opts) -> str:
    return (f"images = [PIL.Image.open(IMAGES / f) for f in {files!r}]; "
            f"mx.random.seed({opts['seed']}); "
            f"stream_generate(model, tokenizer, {text!r}, images=images, "
            f"max_tokens={opts['max_tokens']}, temperature={opts['temperature']}, "
            f"sampler={opts['sampler']!r})")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", nargs="+", default=FIXTURES)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    ap.add_argument("--only", nargs="*", help="case names (debugging; not for the golden file)")
    ap.add_argument("--seeds", nargs="*", type=int,
                    help="exploration: run every case with these seeds instead, write nothing")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    import mlx_lm
    import optiq

    assert mx.__version__ == "0.32.4", mx.__version__
    assert mlx_lm.__version__ == "0.32.2", mlx_lm.__version__
    assert getattr(optiq, "__version__", "0.7.7") == "0.7.7"

    derived = write_derived_images()
    cases, dropped = [], []
    n_all = 0
    for fixture in args.fixtures:
        model, tokenizer = cfs.load_f32(MODELS / fixture)
        eos_ids = set(int(t) for t in tokenizer.stopping_criteria.eos_token_ids)
        for name, files, text, spec, fixture_seeds in CASES:
            if args.only and name not in args.only:
                continue
            if fixture not in fixture_seeds and not args.seeds:
                continue
            prompt, pixel_values, mm, image_meta = build_inputs(model, tokenizer, files, text)
            seeds = args.seeds if args.seeds else [fixture_seeds[fixture]]
            for seed in seeds:
                opts = dict(spec, seed=seed)
                t0 = time.time()
                clean = run(model, tokenizer, prompt, pixel_values, mm, opts)
                same = []
                for p in PERTURB_SEEDS:
                    noisy = run(model, tokenizer, prompt, pixel_values, mm, opts, p)
                    assert noisy["perturbed_elements"] > 0
                    same.append(cfs.trajectory(noisy) == cfs.trajectory(clean))
                res = dgg.summarize(clean, eos_ids)
                n_all += 1
                ok = all(same)
                print(f"{fixture:20s} {name:14s} seed={seed} {time.time() - t0:5.1f}s "
                      f"robust={sum(same)}/{len(same)} P={len(prompt['input_ids'])} "
                      f"steps={[b['steps'] for b in res['blocks']]} {res['finish_reason']} "
                      f"n={res['generation_tokens']} emitted={res['emitted_ids']}", flush=True)
                if args.seeds:
                    continue
                if not ok:
                    dropped.append({"name": name, "fixture": fixture, "seed": seed,
                                    "identical": same})
                    continue
                assert public_ids(model, tokenizer, files, text, opts) == res["emitted_ids"], \
                    (fixture, name)
                cases.append({
                    "name": name,
                    "fixture": fixture,
                    "images": image_meta,
                    "prompt": prompt,
                    "options": opts,
                    "effective": dgg.effective(model, eos_ids, opts),
                    "python": python_call(files, text, opts),
                    "public_api": True,
                    "robust": {"perturb_seeds": PERTURB_SEEDS, "identical": same},
                    "outputs": res,
                })
        del model

    if args.seeds:
        return
    print(f"robust: {len(cases)} of {n_all} cases kept")
    if dropped:
        print("dropped (not robust):\n  " + "\n  ".join(json.dumps(d) for d in dropped))

    doc = {
        "about": "Image-prompt generation goldens from the float32 reference (mlx-optiq 0.7.7, "
                 "mlx 0.32.4, mlx-lm 0.32.2, Pillow, CPU). Written by "
                 "tools/reference/dump_image_generation_goldens.py.",
        "conventions": {
            "model": "optiq.vlm.diffusion_gemma.generate.load(fixture dir), then "
                     "model.set_dtype(mx.float32)",
            "images": "file names relative to tests/fixtures/images; PIL.Image.open, "
                      "convert('RGB'), aspect-preserving BICUBIC resize (preprocess_images), "
                      "stacked and cast to bfloat16 as the public path does; "
                      f"{', '.join(derived)} are written by this script",
            "prompt": "apply_chat_template([{'role': 'user', 'content': '<|image|>' * n_images "
                      "+ text}], tokenize=False, add_generation_prompt=True) -> rendered; "
                      "encode(rendered, add_special_tokens=False) -> raw_ids; each "
                      "image_token_id in raw_ids -> [boi] + [image_token_id] * soft_tokens[k] "
                      "+ [eoi] -> input_ids; mm_token_type_ids = 1 where input_ids == "
                      "image_token_id else 0",
            "call": "mx.random.seed(seed) after loading; stream_diffusion_generate(model, "
                    "tokenizer, tokenizer, input_ids, pixel_values, None, max_tokens, "
                    "skip_special_token_ids=set(), temperature, diffusion_sampler=sampler, "
                    "mm_token_type_ids) = the public stream_generate(..., images=...)",
            "outputs": "as in generate_tiny.json (emitted_ids exclude the EOS; generation_tokens "
                       "counts it; blocks[].argmax_canvas is the full emitted canvas)",
            "robust": "identical trajectory under +-1 f32 ulp noise on 1% of quantized-matmul "
                      "outputs for each perturbation seed (check_fixture_stability.py)",
        },
        "dropped": dropped,
        "cases": cases,
    }
    text = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2]
    text += ',\n "cases": [\n' + ",\n".join(
        "  " + json.dumps(c, separators=(",", ":")) for c in cases) + "\n ]\n}\n"
    json.loads(text)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text)} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
