#!/usr/bin/env python3
"""Goldens for mounted LoRA adapters, from the float32 reference.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run after
make_lora_adapters.py:

    .venv-ref/bin/python tools/reference/dump_lora_goldens.py

For each adapter under tests/fixtures/adapters/ (`tiny-trained`, `tiny-random`), the `tiny`
fixture is loaded as every other golden script loads it (`generate.load`, then
`model.set_dtype(mx.float32)`) and the adapter is mounted the way the reference's
`load_diffusion_lora` mounts it (`linear_to_lora_layers` with the adapter's rank/scale/keys on
the last `n` layers, `n` = the layers its tensors cover, then `model.update` with
adapters.safetensors). Then:

- tests/fixtures/goldens/lora_logits.safetensors: `{adapter}.{case}.prompt_ids` [P] i32,
  `{adapter}.{case}.canvas_ids` [16] i32 (seeded uniform ids) and `{adapter}.{case}.logits`
  [16, V]: `model(input_ids=prompt, canvas_ids=canvas).logits` (encoder pass with the adapter,
  then the decoder with the adapter, no self-conditioning), for `short` (6 ids, inside the
  sliding window) and `long` (longer than twice the window).
- tests/fixtures/goldens/lora_generate.json: generation cases of dump_generation_goldens.py
  (same options, same JSON layout, plus `adapter`) run with the adapter mounted; only cases whose
  trajectory is identical under the three +-1-ulp perturbations are written, and the script fails
  unless each adapter keeps at least one robust case per sampler.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import mlx.core as mx
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import check_fixture_stability as cfs  # noqa: E402
import dump_generation_goldens as dgg  # noqa: E402

MODEL = ROOT / "tests" / "fixtures" / "models" / "tiny"
ADAPTERS = ROOT / "tests" / "fixtures" / "adapters"
OUT = ROOT / "tests" / "fixtures" / "goldens"
ADAPTER_NAMES = ["tiny-trained", "tiny-random"]
CANVAS_SEED = 20261204
GENERATION_CASES = ["ct_t0_long_40", "ct_t07_long_40", "ct_t0_short_eos", "eb_t0_short_16",
                    "eb_t07_short_16", "eb_t0_long_40", "eb_t07_long_40", "ct_t0_chat"]


def mount(model, adapter_dir: pathlib.Path) -> None:
    """What load_diffusion_lora does after loading, on an already loaded (float32) model."""
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import linear_to_lora_layers

    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    lp = cfg["lora_parameters"]
    weights = mx.load(str(adapter_dir / "adapters.safetensors"))
    covered = {int(k.split(".")[3]) for k in weights}
    n_layers = len(model.layers) - min(covered)
    model.freeze()
    linear_to_lora_layers(model, n_layers, {"rank": lp["rank"], "scale": lp["scale"],
                                            "dropout": lp.get("dropout", 0.0),
                                            "keys": lp["keys"]})
    model.update(tree_unflatten(list(weights.items())))
    mx.eval(model.parameters())
    model.eval()


def logits_cases(model, tokenizer, name: str, put) -> None:
    vocab = model.config.text_config.vocab_size
    rng = np.random.default_rng(CANVAS_SEED)
    for case in ("short", "long"):
        ids = cfs.encode_text(tokenizer, cfs.PROMPTS[case])
        canvas = rng.integers(0, vocab, size=16).astype(np.int32)
        logits = model(input_ids=mx.array(ids, dtype=mx.int32)[None],
                       canvas_ids=mx.array(canvas)[None]).logits[0]
        put(f"{name}.{case}.prompt_ids", mx.array(ids, dtype=mx.int32))
        put(f"{name}.{case}.canvas_ids", mx.array(canvas))
        put(f"{name}.{case}.logits", logits.astype(mx.float32))


def generation_cases(model, tokenizer, name: str) -> list[dict]:
    eos_ids = set(int(t) for t in tokenizer.stopping_criteria.eos_token_ids)
    by_name = {c[0]: c for c in dgg.CASES}
    out, samplers = [], set()
    for case_name in GENERATION_CASES:
        _, spec, opts, detail = by_name[case_name]
        t0 = time.time()
        prompt = dgg.prompt_of(tokenizer, spec)
        clean = dgg.run(model, tokenizer, prompt, opts, detail)
        same = [cfs.trajectory(cfs.run_case(model, tokenizer, prompt["ids"], perturb_seed=p,
                                            **opts)) == cfs.trajectory(clean)
                for p in dgg.PERTURB_SEEDS]
        res = dgg.summarize(clean, eos_ids)
        print(f"{name:13s} {case_name:24s} {time.time() - t0:5.1f}s robust={sum(same)}/3 "
              f"{res['finish_reason']} emitted={res['emitted_ids']}", flush=True)
        if not all(same):
            continue
        samplers.add(opts["sampler"])
        out.append({
            "name": f"{name}/{case_name}",
            "adapter": f"tests/fixtures/adapters/{name}",
            "fixture": "tiny",
            "prompt": prompt,
            "options": dict(opts),
            "effective": dgg.effective(model, eos_ids, opts),
            "robust": {"perturb_seeds": dgg.PERTURB_SEEDS, "identical": same},
            "outputs": res,
        })
    assert samplers == {"confidence-threshold", "entropy-bound"}, (name, samplers)
    return out


def main() -> None:
    mx.set_default_device(mx.cpu)
    tensors: dict[str, mx.array] = {}
    cases: list[dict] = []
    for name in ADAPTER_NAMES:
        model, tokenizer = cfs.load_f32(MODEL)
        mount(model, ADAPTERS / name)
        logits_cases(model, tokenizer, name, tensors.__setitem__)
        cases += generation_cases(model, tokenizer, name)
        del model
    mx.save_safetensors(str(OUT / "lora_logits.safetensors"), tensors)
    doc = {
        "about": "Generations with a mounted LoRA adapter, from the float32 reference "
                 "(mlx-optiq 0.7.7, mlx 0.32.4, mlx-lm 0.32.2, CPU). Written by "
                 "tools/reference/dump_lora_goldens.py; layout as generate_tiny.json.",
        "cases": cases,
    }
    text = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2]
    text += ',\n "cases": [\n' + ",\n".join(
        "  " + json.dumps(c, separators=(",", ":")) for c in cases) + "\n ]\n}\n"
    json.loads(text)
    (OUT / "lora_generate.json").write_text(text)
    print(f"wrote lora_logits.safetensors ({len(tensors)} tensors), lora_generate.json "
          f"({len(cases)} cases)")


if __name__ == "__main__":
    main()
