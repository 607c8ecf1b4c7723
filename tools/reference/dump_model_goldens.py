#!/usr/bin/env python3
"""Dump model-level goldens for the `tiny` fixture from the reference.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run with the reference venv
after make_checkpoints.py:

    /work/refenv/bin/python tools/reference/dump_model_goldens.py

Writes tests/fixtures/goldens/model_tiny.safetensors (f32 tensors, i32 ids) and model_tiny.json
(config values, case descriptions, cache lengths, measured bf16 noise and fixture statistics).

Everything comes from the FLOAT32 reference (`load_diffusion_gemma`, then
`model.set_dtype(mx.float32)`: packed uint32 weights unchanged, bf16 scales/biases/norms widened
exactly), except the `bf16.*` tensors, which come from the checkpoint as shipped (bf16) and are
only good for a closeness check.

Cases (`short`: a 6-token prompt, shorter than the sliding window 8; `long`: a 21-token prompt,
longer than twice the window; `cont`: the `long` cache after the engine appends a 16-token
committed block with an encoder continuation pass):
- `{case}.prompt_ids` [P] i32 (`cont.block_ids` [16] i32 for the appended block).
- `{case}.encoder.layer.{i}` [P, H]: hidden state after decoder layer i in the encoder pass
  (EncoderModel.__call__'s loop: embed * sqrt(H), causal/sliding masks, each layer with the
  encoder's layer scalar); `{case}.encoder.final` [P, H] after the final norm.
- `{case}.cache.{i}.keys` / `.values` [n_kv_heads, T, head_dim]: the cache after the pass as the
  decoder reads it (`_cache_state` in language.py: temporal order). T per layer is in the JSON.
- `{case}.canvas_ids` [16] i32 (seeded uniform ids, like the engine's canvas init) and
  `{case}.logits` [16, V]: decoder logits (tied head + fp32 softcap), no self-conditioning.
- `short`/`long` only: `{case}.sc_logits_in` [16, V] (= `{case}.logits`) and
  `{case}.logits_sc_logits` [16, V]: the decoder given self_conditioning_logits;
  `{case}.sc_embeddings_in` [16, H]: soft embeddings computed as the entropy-bound engine does
  at its first step (`_diffusion_entropy_and_soft_embeddings(logits / 0.8, dequantized embed,
  sqrt(H))`; 0.8 = t_max, the schedule temperature at cur_step = steps) and
  `{case}.logits_sc_emb` [16, V]: the decoder given self_conditioning_embeddings; the canvas is
  the same `{case}.canvas_ids`.
- `bf16.short.logits`, `bf16.long.logits` [16, V]: the bf16 reference as shipped (cast to f32).

The tiny-sharded fixture must give bit-identical float32 results (asserted here).
"""

from __future__ import annotations

import json
import pathlib
import sys

import mlx.core as mx
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
OUT = ROOT / "tests" / "fixtures" / "goldens"

SEED = 20260816
SHORT_LEN = 6
LONG_LEN = 21
SHORT_TEXT = "Hello world! The quick brown fox."
LONG_TEXT = (
    "Why is the sky blue? Because air scatters short wavelengths of sunlight more than long "
    "ones, and the model says so."
)
MAX_STEPS = 48  # the engine's default denoising steps


def load(name: str, f32: bool):
    from optiq.vlm.diffusion_gemma.loader import load_diffusion_gemma

    model, config = load_diffusion_gemma(str(MODELS / name))
    if f32:
        model.set_dtype(mx.float32)
    return model, config


class RouterProbe:
    """Records every router's sorted scores, to measure how close top-k comes to a tie."""

    def __init__(self):
        from optiq.vlm._mlxvlm.models.diffusion_gemma import language

        self.cls = language.Router
        self.orig = self.cls.__call__
        self.gaps: list[np.ndarray] = []
        self.rel_gaps: list[np.ndarray] = []
        self.choices: list[np.ndarray] = []
        probe = self

        def call(router, x):
            out = probe.orig(router, x)
            xn = mx.fast.rms_norm(x, None, router.eps) * router.scale * router._root_size
            scores = np.array(router.proj(xn).astype(mx.float32))
            k = router.config.top_k_experts
            s = -np.sort(-scores, axis=-1)
            gap = s[:, k - 1] - s[:, k]
            probe.gaps.append(gap)
            probe.rel_gaps.append(gap / (s[:, 0] - s[:, -1]))
            probe.choices.append(np.sort(np.array(out[0]), axis=-1))
            return out

        self.call = call

    def __enter__(self):
        self.cls.__call__ = self.call
        return self

    def __exit__(self, *exc):
        self.cls.__call__ = self.orig


def encoder_pass(model, ids: mx.array, cache):
    """EncoderModel.__call__, unrolled to keep each layer's output."""
    enc = model.model.encoder
    dec = model.model.decoder
    h = enc._embed_inputs(ids)
    masks = enc._make_encoder_masks(h, cache)
    layers = []
    for i, (layer, c, mask) in enumerate(zip(dec.layers, cache, masks)):
        h = layer(h, mask, c, decoder=False, layer_scalar=enc.language_model.layers[i].layer_scalar)
        layers.append(h)
    return layers, dec.norm(h)


def cache_state(cache):
    from optiq.vlm._mlxvlm.models.diffusion_gemma.language import _cache_state

    return [_cache_state(c) for c in cache]


def decoder_logits(model, cache, canvas: mx.array, **sc):
    """The engine's decoder call (mask mapping computed once per canvas, as in the engine)."""
    masks = model.model.decoder._make_decoder_masks(canvas[..., None], cache, None)
    return model(cache=cache, canvas_ids=canvas, decoder_attention_mask=masks, **sc).logits


def soft_embeddings(model, logits: mx.array) -> tuple[mx.array, float]:
    from optiq.vlm._mlxvlm.generate.diffusion import (
        _diffusion_entropy_and_soft_embeddings,
        _diffusion_linear_temperature,
        _diffusion_soft_embedding_weight,
    )

    temp = _diffusion_linear_temperature(MAX_STEPS, MAX_STEPS, {"t_min": 0.4, "t_max": 0.8})
    weight = _diffusion_soft_embedding_weight(model.model.decoder.embed_tokens)
    _, soft = _diffusion_entropy_and_soft_embeddings(
        logits / temp, weight, model.model.decoder.embed_scale
    )
    return soft, temp


def prompt_ids(text: str, n: int) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODELS / "tiny" / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=True).ids
    assert len(ids) >= n, (text, len(ids))
    return np.array(ids[:n], dtype=np.int32)


def run_cases(model, cfg: dict, rng_seed: int, full: bool):
    """All cases on one model; returns (tensors, info). `full=False` skips the unrolled layers
    and self-conditioning (used for the bf16 and sharded cross-checks)."""
    rng = np.random.default_rng(rng_seed)
    V = cfg["text_config"]["vocab_size"]
    C = cfg["canvas_length"]
    t: dict[str, mx.array] = {}
    info: dict[str, dict] = {}

    def put(name, arr):
        assert name not in t, name
        t[name] = arr

    caches = {}
    for case, text, n in (("short", SHORT_TEXT, SHORT_LEN), ("long", LONG_TEXT, LONG_LEN)):
        ids = prompt_ids(text, n)
        canvas = rng.integers(0, V, size=C).astype(np.int32)
        cache = model.make_cache()
        layers, final = encoder_pass(model, mx.array(ids)[None], cache)
        if full:
            # The unrolled loop must be exactly the reference's encoder call.
            ref_cache = model.make_cache()
            ref_final, _ = model.model.encoder(mx.array(ids)[None], cache=ref_cache)
            assert mx.array_equal(ref_final, final).item(), f"{case}: unrolled encoder differs"
            for a, b in zip(cache_state(cache), cache_state(ref_cache)):
                assert mx.array_equal(a[0], b[0]).item() and mx.array_equal(a[1], b[1]).item()
        put(f"{case}.prompt_ids", mx.array(ids))
        if full:
            for i, h in enumerate(layers):
                put(f"{case}.encoder.layer.{i}", h[0])
            put(f"{case}.encoder.final", final[0])
        for i, (k, v) in enumerate(cache_state(cache)):
            put(f"{case}.cache.{i}.keys", k[0])
            put(f"{case}.cache.{i}.values", v[0])
        info[case] = {
            "prompt_len": int(n),
            "prompt_text_prefix_of": text,
            "cache_T": [int(k.shape[2]) for k, _ in cache_state(cache)],
            "cache_offset": [int(c.offset) for c in cache],
        }
        cv = mx.array(canvas)[None]
        logits = decoder_logits(model, cache, cv)
        put(f"{case}.canvas_ids", mx.array(canvas))
        put(f"{case}.logits", logits[0])
        if full:
            put(f"{case}.sc_logits_in", logits[0])
            put(f"{case}.logits_sc_logits",
                decoder_logits(model, cache, cv, self_conditioning_logits=logits)[0])
            soft, temp = soft_embeddings(model, logits)
            put(f"{case}.sc_embeddings_in", soft[0])
            put(f"{case}.logits_sc_emb",
                decoder_logits(model, cache, cv, self_conditioning_embeddings=soft)[0])
            info[case]["sc_embeddings_temperature"] = temp
        caches[case] = cache

    # cont: append a committed 16-token block to the long cache, as the engine does after a
    # block (an encoder pass over the block, no attention mask, the same cache), then decode a
    # new canvas. The block is the argmax of long.logits (what the engine would commit).
    cache = caches["long"]
    block = np.array(mx.argmax(t["long.logits"], axis=-1)).astype(np.int32)
    layers, final = encoder_pass(model, mx.array(block)[None], cache)
    put("cont.block_ids", mx.array(block))
    if full:
        for i, h in enumerate(layers):
            put(f"cont.encoder.layer.{i}", h[0])
        put("cont.encoder.final", final[0])
    for i, (k, v) in enumerate(cache_state(cache)):
        put(f"cont.cache.{i}.keys", k[0])
        put(f"cont.cache.{i}.values", v[0])
    canvas = rng.integers(0, V, size=C).astype(np.int32)
    put("cont.canvas_ids", mx.array(canvas))
    put("cont.logits", decoder_logits(model, cache, mx.array(canvas)[None])[0])
    info["cont"] = {
        "after": "long",
        "block_len": int(C),
        "cache_T": [int(k.shape[2]) for k, _ in cache_state(cache)],
        "cache_offset": [int(c.offset) for c in cache],
    }
    mx.eval(t)
    return t, info, caches


def noise(bf16: mx.array, f32: mx.array) -> dict:
    a = np.array(bf16, dtype=np.float64)
    b = np.array(f32, dtype=np.float64)
    return {
        "rel_rms": float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2))),
        "max_abs": float(np.max(np.abs(a - b))),
        "argmax_differs": float(np.mean(a.argmax(-1) != b.argmax(-1))),
    }


def quality(t: dict, model, cfg: dict, caches) -> dict:
    """How usable the fixture is for tests (see the recipe in make_checkpoints.py)."""
    out = {}
    tops, gaps, eos = [], [], []
    eos_ids = set(cfg["eos_token_id"])
    for case in ("short", "long", "cont"):
        z = np.array(t[f"{case}.logits"], dtype=np.float64) / 0.8
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        s = -np.sort(-z, axis=-1)
        tops += list(p.max(-1))
        gaps += list(s[:, 0] - s[:, 1])
        eos += [int(i in eos_ids) for i in z.argmax(-1)]
    out["median_top1_prob_at_t0.8"] = float(np.median(tops))
    out["min_top1_top2_logit_gap_at_t0.8"] = float(np.min(gaps))
    out["median_top1_top2_logit_gap_at_t0.8"] = float(np.median(gaps))
    out["argmax_is_eos_fraction"] = float(np.mean(eos))
    # How much the prompt matters: the long canvas decoded against the short prompt's cache.
    cv = t["long.canvas_ids"][None]
    other = decoder_logits(model, caches["short"], cv)[0]
    out["prompt_changes_argmax_fraction"] = float(
        np.mean(np.array(mx.argmax(other, -1)) != np.array(mx.argmax(t["long.logits"], -1)))
    )
    return out


def main() -> None:
    from importlib.metadata import version

    assert mx.__version__ == "0.32.4", mx.__version__
    assert version("mlx-lm") == "0.32.2", version("mlx-lm")
    assert version("mlx-optiq") == "0.7.7", version("mlx-optiq")
    mx.set_default_device(mx.cpu)

    model, cfg = load("tiny", f32=True)
    with RouterProbe() as probe:
        t, info, caches = run_cases(model, cfg, SEED, full=True)
    stats = quality(t, model, cfg, caches)
    gaps = np.concatenate(probe.gaps)
    rel = np.concatenate(probe.rel_gaps)
    choices = np.concatenate(probe.choices)
    stats["router_calls"] = int(gaps.size)
    stats["router_min_kth_gap"] = float(gaps.min())
    stats["router_min_relative_kth_gap"] = float(rel.min())
    stats["router_distinct_expert_sets"] = int(len({tuple(c) for c in choices}))

    # The sharded fixture: same weights, so bit-identical float32 results.
    sharded, _ = load("tiny-sharded", f32=True)
    t2, _, _ = run_cases(sharded, cfg, SEED, full=False)
    for k, v in t2.items():
        assert mx.array_equal(v, t[k]).item(), f"tiny-sharded differs from tiny at {k}"

    # bf16 as shipped.
    bf16_model, _ = load("tiny", f32=False)
    tb, _, _ = run_cases(bf16_model, cfg, SEED, full=False)
    bf16_noise = {}
    for case in ("short", "long"):
        for k in (f"{case}.prompt_ids", f"{case}.canvas_ids"):
            assert mx.array_equal(tb[k], t[k]).item()
        t[f"bf16.{case}.logits"] = tb[f"{case}.logits"].astype(mx.float32)
        bf16_noise[case] = noise(tb[f"{case}.logits"], t[f"{case}.logits"])

    tensors = {}
    for k, v in t.items():
        tensors[k] = v.astype(mx.int32) if v.dtype in (mx.int32, mx.uint32, mx.int64) else v
        assert tensors[k].dtype in (mx.float32, mx.int32), (k, tensors[k].dtype)
    OUT.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(OUT / "model_tiny.safetensors"), tensors,
                        metadata={"generator": "tools/reference/dump_model_goldens.py",
                                  "fixture": "tests/fixtures/models/tiny"})

    tc = cfg["text_config"]
    doc = {
        "generator": "tools/reference/dump_model_goldens.py",
        "mlx": mx.__version__,
        "mlx_lm": version("mlx-lm"),
        "optiq": version("mlx-optiq"),
        "fixture": "tests/fixtures/models/tiny",
        "same_results": ["tests/fixtures/models/tiny-sharded"],
        "dtype": "float32 reference (model.set_dtype(mx.float32)); bf16.* from the bf16 model",
        "config": {
            "vocab_size": tc["vocab_size"], "hidden_size": tc["hidden_size"],
            "intermediate_size": tc["intermediate_size"],
            "moe_intermediate_size": tc["moe_intermediate_size"],
            "num_hidden_layers": tc["num_hidden_layers"], "layer_types": tc["layer_types"],
            "num_attention_heads": tc["num_attention_heads"],
            "num_key_value_heads": tc["num_key_value_heads"],
            "num_global_key_value_heads": tc["num_global_key_value_heads"],
            "head_dim": tc["head_dim"], "global_head_dim": tc["global_head_dim"],
            "num_experts": tc["num_experts"], "top_k_experts": tc["top_k_experts"],
            "sliding_window": tc["sliding_window"], "canvas_length": cfg["canvas_length"],
            "final_logit_softcapping": tc["final_logit_softcapping"],
            "rms_norm_eps": tc["rms_norm_eps"], "rope_parameters": tc["rope_parameters"],
            "eos_token_id": cfg["eos_token_id"],
        },
        "cases": info,
        "cache_notes": (
            "cache.{i} is _cache_state(cache[i]) after the pass: [n_kv_heads, T, head_dim], "
            "temporal order. Full-attention layers (KVCache) keep every position: T = offset. "
            "Sliding layers use mlx_lm's RotatingKVCache(max_size=sliding_window=8): a first "
            "multi-token update stores ALL its tokens (no trim), so after a 21-token prefill "
            "T = 21, not 8; the next multi-token update first trims to the last "
            "max_size - 1 = 7 positions and then appends, so after the 16-token continuation "
            "T = 7 + 16 = 23 (offset 37). The decoder's sliding layers use only the last "
            "sliding_window - 1 = 7 cached positions (it slices when offset >= T > 7)."
        ),
        "soft_embeddings": (
            "sc_embeddings_in = _diffusion_entropy_and_soft_embeddings(logits / 0.8, "
            "dequantize(embed_tokens), sqrt(hidden)): probs = exp(z - logsumexp(z)) in f32, "
            "probs @ W (W = dequantized embedding in the model dtype), times sqrt(H). "
            "0.8 = t_min + (t_max - t_min) * 48/48, the entropy-bound engine's first step."
        ),
        "sc_logits": (
            "logits_sc_logits: decoder with self_conditioning_logits = {case}.logits "
            "(softmax(precise) then quantized_matmul(probs, embed, transpose=False) * sqrt(H))."
        ),
        "bf16_noise_vs_f32": bf16_noise,
        "fixture_stats_f32": stats,
        "tensors": {k: {"dtype": str(v.dtype).split(".")[-1], "shape": list(v.shape)}
                    for k, v in sorted(tensors.items())},
    }
    (OUT / "model_tiny.json").write_text(json.dumps(doc, indent=1) + "\n")

    size = (OUT / "model_tiny.safetensors").stat().st_size
    print(f"model_tiny.safetensors: {len(tensors)} tensors, {size} bytes")
    for case, info_case in info.items():
        print(f"  {case}: cache T per layer {info_case['cache_T']}")
    for case, n in bf16_noise.items():
        print(f"  bf16 vs f32 {case}: rel RMS {n['rel_rms']:.3e}, max abs {n['max_abs']:.3e}, "
              f"argmax differs at {n['argmax_differs']:.3f} of positions")
    for k, v in stats.items():
        print(f"  {k}: {v}")
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
