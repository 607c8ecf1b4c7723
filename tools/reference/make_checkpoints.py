#!/usr/bin/env python3
"""Write small random-weight DiffusionGemma checkpoints in the real on-disk format.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run with the reference venv:

    /work/refenv/bin/python tools/reference/make_checkpoints.py

Writes tests/fixtures/models/tiny/ (one model.safetensors) and tests/fixtures/models/tiny-sharded/
(the same tensors in 3 shards). The format comes from the reference's own code path, not from a
re-implementation of it: the reference `Model` is built from the config in bfloat16, the fixture
weights are set on it, `mlx_lm.utils.quantize_model` quantizes it with the real checkpoint's bit
plan, and `mlx_lm.utils.save_model` / `save_config` write it (what OptiQ's convert does).

Bit plan (the real checkpoint's): 8-bit attention q/k/v/o, dense mlp.*,
router.proj (explicit per-module entries in config.json, as quantize_model writes for a predicate
that returns a dict); 4-bit embed_tokens, experts, self_conditioning (the config's default bits:
no per-module entry, so the loader's `<path>.scales` fallback is exercised too); norms, router
scale / per_expert_scale and layer scalars stay bfloat16.

Weights follow a recipe that makes random-weight checkpoints useful for tests: heavy-tailed tied
embedding rows, final-norm weights of magnitude 1.5-2.5 with random signs, a planted routing code
(so top-k never nearly ties), q/k norm weights 0.4-0.7, post norms 0.2-0.5,
self_conditioning.down_proj scaled by 0.1, encoder layer scalars different from the decoder's,
per_expert_scale not all ones. Everything is seeded: reruns give identical files.

Also writes generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja,
processor_config.json, optiq_metadata.json, and verifies each fixture by loading it with
`optiq.vlm.diffusion_gemma.loader.load_diffusion_gemma` and checking every module's bits.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import shutil
import sys
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fixture_tokenizer  # noqa: E402

ROOT = HERE.parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
CHAT_TEMPLATE_ASSET = HERE.parents[1] / "dg-core" / "assets" / "chat_template.jinja"

GROUP_SIZE = 64
DEFAULT_BITS = 4
HIGH_BITS = 8
N_SHARDS = 3

# Hidden dims reserved for the planted routing code (see fixture_weights).
N_CODE_DIMS = 4
# Minimum norm of the EOS-like embedding rows (<eos>, <turn|>; typical rows have norm ~1, heavy
# tailed), so that some generations stop and some run to max_tokens. Measured with the engine
# (2 prompts x 6 seeds x 2 samplers, temperature 0): norms 1.6-4.0 never stop, 7.0 stops 23 of
# 24, 6.0 stops 16 of 24. check_fixture_stability.py on the result (48 cases, T 0 and 0.7): 48 of
# 48 robust to 1-ulp noise, 29 stop on EOS after 2-39 tokens, 19 run to max_tokens.
EOS_ROW_NORM = 6.0

TINY = {
    "seed": 20260815,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_global_key_value_heads": 1,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_experts": 8,
    "top_k_experts": 2,
    "sliding_window": 8,
    "canvas_length": 16,
    "final_logit_softcapping": 30.0,
    "rms_norm_eps": 1e-6,
}


def layer_types(n_layers: int) -> list[str]:
    """The default 5 sliding : 1 full pattern, last layer full (TextConfig.__post_init__)."""
    pattern = ["sliding_attention"] * 5 + ["full_attention"]
    types = (pattern * (n_layers // len(pattern) + 1))[:n_layers]
    types[-1] = "full_attention"
    return types


def text_config(spec: dict) -> dict:
    """The text_config block, with the fields the HF DiffusionGemmaTextConfig serializes."""
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 2,
        "dtype": "bfloat16",
        "eos_token_id": 1,
        "final_logit_softcapping": spec["final_logit_softcapping"],
        "global_head_dim": spec["global_head_dim"],
        "head_dim": spec["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": spec["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate_size"],
        "layer_types": layer_types(spec["num_hidden_layers"]),
        "max_position_embeddings": 262144,
        "model_type": "diffusion_gemma_text",
        "moe_intermediate_size": spec["moe_intermediate_size"],
        "num_attention_heads": spec["num_attention_heads"],
        "num_experts": spec["num_experts"],
        "num_global_key_value_heads": spec["num_global_key_value_heads"],
        "num_hidden_layers": spec["num_hidden_layers"],
        "num_key_value_heads": spec["num_key_value_heads"],
        "pad_token_id": 0,
        "rms_norm_eps": spec["rms_norm_eps"],
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": spec["sliding_window"],
        "tie_word_embeddings": True,
        "top_k_experts": spec["top_k_experts"],
        "use_bidirectional_attention": "vision",
        "vocab_size": spec["vocab_size"],
    }


def model_config(spec: dict, token_ids: dict[str, int]) -> dict:
    """config.json before quantization: the real checkpoint's top-level fields."""
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "boi_token_id": token_ids["<|image>"],
        "canvas_length": spec["canvas_length"],
        "dtype": "bfloat16",
        "eoi_token_id": token_ids["<image|>"],
        "eos_token_id": [token_ids["<eos>"], token_ids["<turn|>"]],
        "image_token_id": token_ids["<|image|>"],
        "model_type": "diffusion_gemma",
        "text_config": text_config(spec),
        "tie_word_embeddings": True,
        # No vision tower in these fixtures yet; the key stays (as null) like the real file's.
        "vision_config": None,
        "vision_soft_tokens_per_image": 280,
    }


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def _normal(rng, shape, std):
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _uniform(rng, shape, lo, hi):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def _routing_codes(rng, n_tokens: int, code_weights: np.ndarray, top_k: int) -> np.ndarray:
    """Per-token codes c (unit norm) whose router scores code_weights @ c have a wide gap
    between the k-th and (k+1)-th expert: the best of 64 random candidates per token."""
    n_experts, n_dims = code_weights.shape
    cand = rng.standard_normal((n_tokens, 64, n_dims)).astype(np.float32)
    cand /= np.linalg.norm(cand, axis=-1, keepdims=True)
    scores = cand @ code_weights.T  # [tokens, 64, experts]
    ordered = -np.sort(-scores, axis=-1)
    gap = ordered[..., top_k - 1] - ordered[..., top_k]
    best = np.argmax(gap, axis=-1)
    return cand[np.arange(n_tokens), best]


def fixture_weights(spec: dict, names_shapes: dict[str, tuple], eos_ids: list[int]) -> dict:
    """All parameters of the reference Model as float32 numpy arrays, following the recipe."""
    rng = np.random.default_rng(spec["seed"])
    H = spec["hidden_size"]
    V = spec["vocab_size"]
    I = spec["intermediate_size"]
    Im = spec["moe_intermediate_size"]
    E = spec["num_experts"]
    K = spec["top_k_experts"]
    L = spec["num_hidden_layers"]
    code = np.arange(H - N_CODE_DIMS, H)  # the reserved routing-code dims
    keep = np.ones(H, dtype=np.float32)
    keep[code] = 0.0  # branch outputs never write the code dims

    w: dict[str, np.ndarray] = {}
    d = "model.decoder"

    # Tied embedding: heavy-tailed row norms; EOS-like rows larger so some generations stop.
    row_norm = rng.lognormal(0.0, 0.8, size=V).astype(np.float32)
    row_norm[eos_ids] = np.maximum(row_norm[eos_ids], EOS_ROW_NORM)
    embed = _normal(rng, (V, H), 1.0) * row_norm[:, None] / np.sqrt(H)
    # Router weights on the code dims, shared by all layers up to a per-layer permutation of
    # the experts; each token's code is chosen for a wide k-th/(k+1)-th score gap.
    code_weights = _normal(rng, (E, N_CODE_DIMS), 1.0)
    codes = _routing_codes(rng, V, code_weights, K)
    # The code, a unit 4-vector, times 2.5 after the sqrt(H) embed scale: entries ~1.25, a bit
    # above a typical row's ~1, so it stays a sizeable part of the router's normalized input.
    embed[:, code] = codes * (2.5 / np.sqrt(H))
    w[f"{d}.embed_tokens.weight"] = embed

    for i in range(L):
        p = f"{d}.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            name = f"{p}.self_attn.{proj}.weight"
            if name in names_shapes:
                out_dim, in_dim = names_shapes[name]
                w[name] = _normal(rng, (out_dim, in_dim), 1.0 / np.sqrt(in_dim))
        hd = names_shapes[f"{p}.self_attn.q_norm.weight"][0]
        w[f"{p}.self_attn.q_norm.weight"] = _uniform(rng, (hd,), 0.4, 0.7)
        w[f"{p}.self_attn.k_norm.weight"] = _uniform(rng, (hd,), 0.4, 0.7)

        w[f"{p}.mlp.gate_proj.weight"] = _normal(rng, (I, H), 1.0 / np.sqrt(H))
        w[f"{p}.mlp.up_proj.weight"] = _normal(rng, (I, H), 1.0 / np.sqrt(H))
        w[f"{p}.mlp.down_proj.weight"] = _normal(rng, (H, I), 1.0 / np.sqrt(I))

        w[f"{p}.input_layernorm.weight"] = _uniform(rng, (H,), 0.8, 1.2)
        w[f"{p}.pre_feedforward_layernorm.weight"] = _uniform(rng, (H,), 0.8, 1.2)
        w[f"{p}.pre_feedforward_layernorm_2.weight"] = _uniform(rng, (H,), 0.8, 1.2)
        w[f"{p}.post_attention_layernorm.weight"] = _uniform(rng, (H,), 0.2, 0.5) * keep
        w[f"{p}.post_feedforward_layernorm.weight"] = _uniform(rng, (H,), 0.2, 0.5) * keep
        w[f"{p}.post_feedforward_layernorm_1.weight"] = _uniform(rng, (H,), 0.2, 0.5)
        w[f"{p}.post_feedforward_layernorm_2.weight"] = _uniform(rng, (H,), 0.2, 0.5)

        # Router: strong weights on the code dims (experts permuted per layer so each layer
        # routes a token differently), weak ones elsewhere so the context still matters a bit.
        router = _normal(rng, (E, H), 0.02)
        router[:, code] = code_weights[rng.permutation(E)] * 4.0
        w[f"{p}.router.proj.weight"] = router
        scale = _uniform(rng, (H,), 0.5, 1.5)
        scale[code] = 1.0
        w[f"{p}.router.scale"] = scale
        w[f"{p}.router.per_expert_scale"] = _uniform(rng, (E,), 0.5, 1.5)

        w[f"{p}.experts.gate_up_proj.weight"] = _normal(rng, (E, 2 * Im, H), 1.0 / np.sqrt(H))
        w[f"{p}.experts.down_proj.weight"] = _normal(rng, (E, H, Im), 1.0 / np.sqrt(Im))

        w[f"{p}.layer_scalar"] = _uniform(rng, (1,), 0.7, 0.95)
        w[f"model.encoder.language_model.layers.{i}.layer_scalar"] = _uniform(rng, (1,), 1.05, 1.3)

    # Final norm: magnitude 1.5-2.5, random signs; zero on the code dims so the routing code does
    # not leak into the tied head (it would bias predictions toward the input token's code).
    final = _uniform(rng, (H,), 1.5, 2.5) * rng.choice([-1.0, 1.0], size=H).astype(np.float32)
    w[f"{d}.norm.weight"] = final * keep

    sc = f"{d}.self_conditioning"
    w[f"{sc}.pre_norm.weight"] = _uniform(rng, (H,), 0.8, 1.2)
    w[f"{sc}.gate_proj.weight"] = _normal(rng, (I, H), 1.0 / np.sqrt(H))
    w[f"{sc}.up_proj.weight"] = _normal(rng, (I, H), 1.0 / np.sqrt(H))
    # Scaled by 0.1 so the self-conditioning feedback is contractive.
    w[f"{sc}.down_proj.weight"] = _normal(rng, (H, I), 0.1 / np.sqrt(I)) * keep[:, None]

    missing = set(names_shapes) - set(w)
    extra = set(w) - set(names_shapes)
    assert not missing and not extra, (missing, extra)
    for k, v in w.items():
        assert v.shape == tuple(names_shapes[k]), (k, v.shape, names_shapes[k])
    return w


# --------------------------------------------------------------------------------------------
# Model, quantization, saving
# --------------------------------------------------------------------------------------------


def new_model(config: dict):
    from optiq.vlm._mlxvlm.models.diffusion_gemma import Model, ModelConfig

    return Model(ModelConfig.from_dict(copy.deepcopy(config)))


def bit_plan(path: str, module: nn.Module):
    """The real checkpoint's plan: 8-bit attention, dense MLP and router; default 4-bit else."""
    if not hasattr(module, "to_quantized"):
        return False
    if ".self_attn." in path and path.endswith(("q_proj", "k_proj", "v_proj", "o_proj")):
        return {"bits": HIGH_BITS, "group_size": GROUP_SIZE}
    if "router" in path or path.endswith(("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")):
        return {"bits": HIGH_BITS, "group_size": GROUP_SIZE}
    return True


def expected_bits(path: str) -> int | None:
    """Bits each quantizable module must load with (None: stays bfloat16)."""
    if path.endswith(("q_proj", "k_proj", "v_proj", "o_proj")):
        return HIGH_BITS
    if path.endswith("router.proj") or ".mlp." in path:
        return HIGH_BITS
    if path.endswith(("embed_tokens", "experts.gate_up_proj", "experts.down_proj")):
        return DEFAULT_BITS
    if ".self_conditioning." in path and path.endswith(("gate_proj", "up_proj", "down_proj")):
        return DEFAULT_BITS
    return None


def build_quantized(config: dict, weights: dict[str, np.ndarray]):
    """bf16 reference Model with the fixture weights, quantized with mlx_lm.quantize_model."""
    from mlx_lm.utils import quantize_model

    model = new_model(config)
    model.load_weights([(k, mx.array(v).astype(mx.bfloat16)) for k, v in weights.items()])
    mx.eval(model.parameters())
    model, qconfig = quantize_model(
        model, copy.deepcopy(config), GROUP_SIZE, DEFAULT_BITS, quant_predicate=bit_plan
    )
    mx.eval(model.parameters())
    return model, qconfig


@contextmanager
def shards_of(n: int):
    """Make mlx_lm.utils.save_model split into n shards (its own limit is in whole GB)."""
    import mlx_lm.utils as mu

    original = mu.make_shards

    def make_n_shards(weights: dict, max_file_size_gb=None) -> list:
        total = sum(v.nbytes for v in weights.values())
        target = total / n
        shards, size = [{}], 0
        for k, v in weights.items():
            if size >= target * len(shards) and len(shards) < n:
                shards.append({})
            shards[-1][k] = v
            size += v.nbytes
        assert len(shards) == n, len(shards)
        return shards

    mu.make_shards = make_n_shards
    try:
        yield
    finally:
        mu.make_shards = original


def generation_config(token_ids: dict[str, int]) -> dict:
    """HF-style generation_config.json as the real model ships it (DiffusionGemmaGeneration-
    Config fields). The reference never reads it: the real file lists
    eos [1, 106, 50], while the reference stops on {1, 106}; the fixture mirrors that."""
    return {
        "bos_token_id": token_ids["<bos>"],
        "confidence_threshold": 0.005,
        "eos_token_id": [token_ids["<eos>"], token_ids["<turn|>"], token_ids["<|tool_response>"]],
        "max_denoising_steps": 48,
        "max_new_tokens": 256,
        "pad_token_id": token_ids["<pad>"],
        "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
        "stability_threshold": 1,
        "t_max": 0.8,
        "t_min": 0.4,
        "transformers_version": "5.12.1",
    }


def tokenizer_config() -> dict:
    """transformers-5 style tokenizer_config.json for GemmaTokenizer. add_bos_token is false:
    the reference encodes a text prompt with add_special_tokens=True and gets no BOS."""
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "backend": "tokenizers",
        "bos_token": "<bos>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<eos>",
        "extra_special_tokens": {
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "boi_token": "<|image>",
            "eoa_token": "<audio|>",
            "eoi_token": "<image|>",
            "image_token": "<|image|>",
        },
        "mask_token": "<mask>",
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": "<pad>",
        "padding_side": "left",
        "processor_class": "Gemma4Processor",
        "tokenizer_class": "GemmaTokenizer",
        "unk_token": "<unk>",
    }


def processor_config() -> dict:
    """Gemma 4 processor defaults (transformers 5.12). The reference's public path ignores this
    file and hard-codes patch 16 / pooling 3 / 280 soft tokens."""
    return {
        "audio_ms_per_token": 40,
        "audio_seq_length": 750,
        "image_processor": {
            "do_convert_rgb": True,
            "do_normalize": False,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": [0.0, 0.0, 0.0],
            "image_processor_type": "Gemma4ImageProcessor",
            "image_std": [1.0, 1.0, 1.0],
            "max_soft_tokens": 280,
            "patch_size": 16,
            "pooling_kernel_size": 3,
            "resample": 3,
            "rescale_factor": 0.00392156862745098,
        },
        "image_seq_length": 280,
        "processor_class": "Gemma4Processor",
    }


def chat_template() -> str:
    """The real DiffusionGemma (Gemma 4) template, byte for byte (dg-core/assets/SOURCE.md says
    where it comes from; dg-core's Rust checkpoint writer embeds the same file)."""
    if not CHAT_TEMPLATE_ASSET.is_file():
        raise FileNotFoundError(f"{CHAT_TEMPLATE_ASSET} is missing (see dg-core/assets/SOURCE.md)")
    return CHAT_TEMPLATE_ASSET.read_text(encoding="utf-8")


def optiq_metadata(model, qconfig: dict, name: str) -> dict:
    """optiq_metadata.json in the shape OptiQ's diffusion pipeline writes (models/diffusion.py)."""
    from mlx_lm.utils import compute_bits_per_weight

    per_layer = {}
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module)):
        if hasattr(m, "bits"):
            per_layer[path] = {"bits": int(m.bits), "group_size": int(m.group_size)}
    bits = [v["bits"] for v in per_layer.values()]
    return {
        "achieved_bpw": round(float(compute_bits_per_weight(model)), 4),
        "base_model": f"dg-fixtures/{name} (random weights, tools/reference/make_checkpoints.py)",
        "calibration": {"kind": "none (random-weight fixture)", "n_denoise_steps": 0, "n_samples": 0},
        "candidate_bits": [DEFAULT_BITS, HIGH_BITS],
        "method": "optiq",
        "model_type": "diffusion",
        "n_high_bits": sum(b == HIGH_BITS for b in bits),
        "n_low_bits": sum(b == DEFAULT_BITS for b in bits),
        "n_vision_layers_bf16": 0,
        "per_layer": per_layer,
        "target_bpw": None,
        "vision_towers": "none",
    }


def write_json(path: pathlib.Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_fixture(out: pathlib.Path, model, qconfig: dict, tokenizer, name: str, shards: int):
    from mlx_lm.utils import save_config, save_model

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if shards > 1:
        with shards_of(shards):
            save_model(out, model)
    else:
        save_model(out, model)
    save_config(copy.deepcopy(qconfig), config_path=out / "config.json", keep_vision_config=True)
    ids = {tok: tokenizer.token_to_id(tok) for tok in ("<bos>", "<eos>", "<pad>", "<turn|>",
                                                         "<|tool_response>")}
    write_json(out / "generation_config.json", generation_config(ids))
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config())
    (out / "chat_template.jinja").write_text(chat_template(), encoding="utf-8")
    write_json(out / "processor_config.json", processor_config())
    write_json(out / "optiq_metadata.json", optiq_metadata(model, qconfig, name))


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------


def verify_fixture(out: pathlib.Path, tok_ids: dict[str, int]) -> None:
    from optiq.vlm.diffusion_gemma.loader import load_diffusion_gemma

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == cfg["quantization_config"], "quantization_config differs"
    per_module = {k: v for k, v in cfg["quantization"].items() if isinstance(v, dict)}
    assert per_module, "no per-module quantization entries"

    model, _ = load_diffusion_gemma(str(out))
    seen: dict[str, set] = {}
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module)):
        bits = getattr(m, "bits", None)
        want = expected_bits(path)
        if hasattr(m, "to_quantized") or hasattr(m, "bits"):
            assert bits == want, f"{out.name}: {path} loaded with bits {bits}, want {want}"
        if hasattr(m, "to_quantized") or hasattr(m, "bits"):
            key = f"{type(m).__name__:22s} {re.sub(r'[.]layers[.][0-9]+[.]', '.layers.N.', path)}"
            seen.setdefault(key, set()).add(bits)
    print(f"  {out.name}: quantizable modules (class, path) -> bits as loaded")
    for key in sorted(seen):
        print(f"    {key:66s} {sorted(seen[key], key=str)}")
    # Non-module parameters (norms, router scale, layer scalars) must be bfloat16.
    for k, v in tree_flatten(model.parameters()):
        if k.endswith((".scales", ".biases")):
            assert v.dtype == mx.bfloat16, k
        elif v.dtype != mx.uint32:
            assert v.dtype == mx.bfloat16, (k, v.dtype)

    # Tokenizer: AutoTokenizer (what the reference uses) must agree with tokenizer.json as read
    # by `tokenizers` (what the Rust port reads), and add no BOS.
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert len(hf) == cfg["text_config"]["vocab_size"], len(hf)
    for text in ["Hello world! The quick brown fox.", "Café naïve 日本語 🙂 — привет",
                 "<|turn>user\nHi there<turn|>\n<|turn>model\n", "  two  spaces\tand\ttabs\n"]:
        a = hf.encode(text, add_special_tokens=True)
        b = raw.encode(text, add_special_tokens=True).ids
        assert a == b, (text, a, b)
        assert a[:1] != [tok_ids["<bos>"]], "BOS added"
        assert hf.decode(a) == text, (hf.decode(a), text)
    assert hf.boi_token == "<|image>" and hf.image_token == "<|image|>", "multimodal tokens"
    assert hf.convert_tokens_to_ids("<|image|>") == cfg["image_token_id"]
    assert hf.eos_token_id == tok_ids["<eos>"]
    # The real chat template renders with this tokenizer, and its markers map to special ids.
    text = hf.apply_chat_template([{"role": "user", "content": "Hi there"}],
                                  tokenize=False, add_generation_prompt=True)
    ids = hf.encode(text, add_special_tokens=False)
    assert tok_ids["<|turn>"] in ids and tok_ids["<turn|>"] in ids, (text, ids)
    assert hf.decode(ids) == text, (hf.decode(ids), text)


def main() -> None:
    from importlib.metadata import version

    assert mx.__version__ == "0.32.4", mx.__version__
    assert version("mlx-lm") == "0.32.2", version("mlx-lm")
    assert version("mlx-optiq") == "0.7.7", version("mlx-optiq")
    mx.set_default_device(mx.cpu)

    spec = TINY
    tokenizer, tok_ids = fixture_tokenizer.build_tokenizer(spec["vocab_size"])
    config = model_config(spec, tok_ids)
    names_shapes = {k: tuple(v.shape) for k, v in tree_flatten(new_model(config).parameters())}
    weights = fixture_weights(spec, names_shapes, [tok_ids["<eos>"], tok_ids["<turn|>"]])
    model, qconfig = build_quantized(config, weights)

    for name, shards in (("tiny", 1), ("tiny-sharded", N_SHARDS)):
        out = MODELS / name
        write_fixture(out, model, qconfig, tokenizer, name, shards)
        verify_fixture(out, tok_ids)
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"  {name}: {size} bytes in {len(list(out.iterdir()))} files")

    # Both fixtures hold identical tensors.
    a = mx.load(str(MODELS / "tiny" / "model.safetensors"))
    b = {}
    for f in sorted((MODELS / "tiny-sharded").glob("model-*.safetensors")):
        b.update(mx.load(str(f)))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), k
    print("ok")


if __name__ == "__main__":
    main()
