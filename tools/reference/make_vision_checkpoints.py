#!/usr/bin/env python3
"""Write small random-weight DiffusionGemma checkpoints WITH a vision tower, and test images.

Reference: mlx-optiq 0.7.7 / mlx 0.32.4 / mlx-lm 0.32.2 on the CPU. Run with the reference venv:

    /work/refenv/bin/python tools/reference/make_vision_checkpoints.py

Writes
  tests/fixtures/models/tiny-vision/          the tower inline, 4-bit quantized (the layout of the
                                             real mlx-community checkpoint's first revision)
  tests/fixtures/models/tiny-vision-sidecar/ the tower in bf16 in optiq/optiq_vision.safetensors,
                                             the model shards text-only, the index naming
                                             optiq/optiq_vision.safetensors for the tower's
                                             tensors (newer revisions)
  tests/fixtures/images/                     small test images (PNG, JPEG, GIF, WebP; one JPEG
                                             with an EXIF orientation tag)

Both checkpoints come out of the reference's own convert, not a re-implementation of it:
a bf16 "base" checkpoint is written first (the reference `Model` built from the config, the
fixture weights loaded, `mlx_lm.utils.save_model`), then
`optiq.vlm.diffusion_gemma.convert.convert_diffusion_gemma` quantizes it with the text fixture's
bit plan (`make_checkpoints.bit_plan`): with `quantize_vision=True` the tower is quantized inline
at the default 4 bits (`mlp.down_proj`, whose in-dim 96 is not a multiple of 64, stays bf16 like
the real checkpoint's 4304-wide one); with the default `quantize_vision=False` convert lifts the
tower into the bf16 sidecar through `optiq.sidecars.attach_sidecars` / `build_vision_sidecar`.
mlx-optiq 0.7.7 writes that sidecar at the checkpoint root; the published checkpoint has it
under `optiq/`, where the reference loader looks first, so it is moved there.
The published revision's `model.safetensors.index.json` also lists every sidecar tensor (under its
sidecar name, e.g. `embed_vision.embedding_projection.weight`) with the file
`optiq/optiq_vision.safetensors`: OptiQ's `optiq.vlm.sidecar._register_vision_in_index` writes
those entries so that index-reading loaders (mlx-vlm) find the tower. In 0.7.7's convert that call
runs before `save_model` writes the index, so its entries never reach the output; the fixture
gets them by calling the same function on the finished checkpoint with the published revision's
relative path. The reference loader itself never reads the index.

The text part is the `tiny` fixture's (make_checkpoints.TINY, the same seed and recipe, so the
same text weights). The tower is small but has the real geometry's quirks: head_dim 16 (the
reference zero-pads it to a fused-SDPA size, 64, as it pads the real 72 to 80), 4 heads, 2 layers,
hidden 64, intermediate 96, patch 16, pooling 3, 280 output tokens (so 2520 patches),
standardize on, a 128-entry position table (positions past it get no position embedding, as with
the reference's one-hot), and in the sidecar layout clipped linears with finite bounds that bind on part of the activations.

Everything is seeded: reruns give identical files. Verifies both by loading them with
`optiq.vlm.diffusion_gemma.loader.load_diffusion_gemma` (bits per module, sidecar mapping).
"""

from __future__ import annotations

import copy
import io
import json
import pathlib
import shutil
import sys
import tempfile

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fixture_tokenizer  # noqa: E402
import make_checkpoints as mc  # noqa: E402

ROOT = HERE.parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
IMAGES = ROOT / "tests" / "fixtures" / "images"

VISION_SEED = 20260816

VISION = {
    "model_type": "gemma4_vision",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "global_head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "patch_size": 16,
    "position_embedding_size": 128,
    "pooling_kernel_size": 3,
    "default_output_length": 280,
    "standardize": True,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
    "use_bidirectional_attention": "vision",
}

# Clip bounds for the sidecar fixture's clipped linears: about 1.3-2 standard deviations of a
# projection's input / output, so the clamps bind on a few percent of the values.
CLIP_INPUT = (-1.6, 1.4)
CLIP_OUTPUT = (-1.3, 1.5)


def vision_config(clipped: bool) -> dict:
    cfg = copy.deepcopy(VISION)
    cfg["use_clipped_linears"] = clipped
    return cfg


def vision_weights(names_shapes: dict[str, tuple], clipped: bool) -> dict[str, np.ndarray]:
    """The tower's parameters: N(0, 1/fan_in) projections, norm weights near 1 (post norms
    smaller), a unit-scale position table, standardization that shifts and rescales."""
    rng = np.random.default_rng(VISION_SEED)
    w: dict[str, np.ndarray] = {}
    for name in sorted(names_shapes):
        shape = names_shapes[name]
        if ".vision_tower." not in name and ".embed_vision." not in name:
            continue
        if name.endswith(("input_min", "input_max", "output_min", "output_max")):
            lo_hi = CLIP_INPUT if "input" in name.rsplit(".", 1)[1] else CLIP_OUTPUT
            value = lo_hi[0] if name.endswith("_min") else lo_hi[1]
            w[name] = np.array(value if clipped else (-np.inf if value < 0 else np.inf),
                               dtype=np.float32)
        elif name.endswith("position_embedding_table"):
            w[name] = mc._normal(rng, shape, 0.5)
        elif name.endswith(("q_norm.weight", "k_norm.weight")):
            w[name] = mc._uniform(rng, shape, 0.5, 1.0)
        elif name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
            w[name] = mc._uniform(rng, shape, 0.3, 0.6)
        elif name.endswith("layernorm.weight"):
            w[name] = mc._uniform(rng, shape, 0.8, 1.2)
        elif name.endswith("std_bias"):
            w[name] = mc._normal(rng, shape, 0.2)
        elif name.endswith("std_scale"):
            w[name] = mc._uniform(rng, shape, 0.5, 1.5)
        elif name.endswith(".weight") and len(shape) == 2:
            w[name] = mc._normal(rng, shape, 1.0 / np.sqrt(shape[1]))
        else:
            raise AssertionError(f"no recipe for {name} {shape}")
    return w


def full_config(spec: dict, tok_ids: dict[str, int], clipped: bool) -> dict:
    cfg = mc.model_config(spec, tok_ids)
    cfg["vision_config"] = vision_config(clipped)
    return cfg


def text_only_names(spec: dict, tok_ids: dict[str, int]) -> dict[str, tuple]:
    return {k: tuple(v.shape)
            for k, v in tree_flatten(mc.new_model(mc.model_config(spec, tok_ids)).parameters())}


def write_base(base: pathlib.Path, config: dict, weights: dict, tokenizer) -> None:
    """The bf16 'base' checkpoint convert reads: unquantized, vision tower inline."""
    model = mc.new_model(config)
    model.load_weights([(k, mx.array(v).astype(mx.bfloat16)) for k, v in weights.items()])
    mx.eval(model.parameters())
    mc.write_fixture(base, model, copy.deepcopy(config), tokenizer, base.name, 1)
    # write_fixture's save_config keeps vision_config; make sure of it (convert's sidecar step
    # decides "is this a VLM" from the base's config).
    cfg = json.loads((base / "config.json").read_text())
    assert cfg.get("vision_config"), "base lost vision_config"


def vision_bits(path: str) -> int | None:
    """Bits each vision module loads with in the inline layout (None: stays bf16)."""
    if path.endswith("mlp.down_proj.linear"):
        return None  # in-dim 96 is not a multiple of the group size 64
    if ".vision_tower." in path or ".embed_vision." in path:
        return mc.DEFAULT_BITS
    return None


def verify(out: pathlib.Path, inline: bool) -> None:
    from optiq.vlm.diffusion_gemma.loader import load_diffusion_gemma

    cfg = json.loads((out / "config.json").read_text())
    assert cfg.get("vision_config"), f"{out.name}: no vision_config"
    model, _ = load_diffusion_gemma(str(out))
    assert model.model.encoder.vision_tower is not None
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module)):
        if not (hasattr(m, "to_quantized") or hasattr(m, "bits")):
            continue
        bits = getattr(m, "bits", None)
        if "vision" in path:
            want = vision_bits(path) if inline else None
        else:
            want = mc.expected_bits(path)
        assert bits == want, f"{out.name}: {path} loaded with bits {bits}, want {want}"
    # The loaded tower must equal the fixture's bf16 weights (sidecar) or their quantization.
    params = dict(tree_flatten(model.parameters()))
    n_vision = sum(1 for k in params if ".vision_tower." in k or ".embed_vision." in k)
    print(f"  {out.name}: {n_vision} vision tensors loaded, inline={inline}")


def move_sidecar_under_optiq(out: pathlib.Path) -> None:
    """The published sidecar layout: the sidecar under `optiq/`, and the index naming it there."""
    from optiq.sidecar_layout import SIDECAR_SUBDIR, VISION_BASENAME
    from optiq.vlm.sidecar import _register_vision_in_index

    root = out / VISION_BASENAME
    assert root.is_file(), "convert wrote no vision sidecar"
    (out / SIDECAR_SUBDIR).mkdir(exist_ok=True)
    sidecar = out / SIDECAR_SUBDIR / VISION_BASENAME
    shutil.move(str(root), sidecar)
    # build_vision_sidecar notes the sidecar in config.json ("optiq_vision"), but convert's
    # save_config rewrites config.json after it, so 0.7.7's output carries no such key.
    assert "optiq_vision" not in json.loads((out / "config.json").read_text())
    # The index entries build_vision_sidecar would have written, with the published path.
    index = out / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    assert not any(f != "model.safetensors" for f in weight_map.values()), "unexpected index"
    keys = sorted(mx.load(str(sidecar)))
    rel = f"{SIDECAR_SUBDIR}/{VISION_BASENAME}"
    assert _register_vision_in_index(out, rel, keys), "no index to register the sidecar in"
    weight_map = json.loads(index.read_text())["weight_map"]
    assert sum(f == rel for f in weight_map.values()) == len(keys), "sidecar entries missing"


def finish_fixture(out: pathlib.Path, name: str, inline: bool) -> None:
    """Files the real pipeline adds after convert (optiq_metadata.json), index for one shard."""
    from optiq.vlm.diffusion_gemma.loader import load_diffusion_gemma

    model, cfg = load_diffusion_gemma(str(out))
    meta = mc.optiq_metadata(model, cfg, name)
    meta["base_model"] = f"dg-fixtures/{name} (random weights, tools/reference/make_vision_checkpoints.py)"
    meta["vision_towers"] = "inline" if inline else "bf16"
    n_vision = sum(1 for k in meta["per_layer"] if "vision" in k)
    meta["n_vision_layers_bf16"] = 0 if inline else len(
        [p for p, _ in tree_flatten(model.model.encoder.vision_tower.leaf_modules(),
                                    is_leaf=lambda m: isinstance(m, nn.Module))])
    del n_vision
    mc.write_json(out / "optiq_metadata.json", meta)
    # convert copies the base's config-free aux files; write the processor config the real
    # checkpoint ships (the reference ignores it).
    mc.write_json(out / "processor_config.json", mc.processor_config())


# --------------------------------------------------------------------------------------------
# Test images
# --------------------------------------------------------------------------------------------


def _gradient(h: int, w: int, rng) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = 128 + 100 * np.sin(x / 5.0) * np.cos(y / 7.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def make_images() -> None:
    from PIL import Image

    rng = np.random.default_rng(20260817)
    if IMAGES.exists():
        shutil.rmtree(IMAGES)
    IMAGES.mkdir(parents=True)

    # normal.png: 64 x 48 RGB with a pure black and a pure white block: the inline 4-bit
    # tower only sees saturated pixels, so both must occur.
    a = _gradient(48, 64, rng)
    a[6:22, 8:30] = 0
    a[28:44, 36:60] = 255
    Image.fromarray(a, "RGB").save(IMAGES / "normal.png", optimize=True)

    # tall.png: 24 x 170 RGBA (alpha varies; convert("RGB") drops it without compositing).
    # Tall enough that its patch rows run past the tiny tower's 128-entry position table.
    t = _gradient(170, 24, rng)
    alpha = np.tile(np.linspace(0, 255, 24).astype(np.uint8), (170, 1))[..., None]
    t[100:130, :] = 0
    Image.fromarray(np.concatenate([t, alpha], axis=-1), "RGBA").save(IMAGES / "tall.png")

    # wide.jpg: 160 x 40, default 4:2:0 chroma subsampling, quality 90.
    wd = _gradient(40, 160, rng)
    wd[10:30, 100:140] = 255
    Image.fromarray(wd, "RGB").save(IMAGES / "wide.jpg", quality=90)

    # exif_rotated.jpg: 48 x 64 stored, EXIF Orientation 6 ("rotate 90 CW to display").
    # The reference never calls ImageOps.exif_transpose: it sees the stored 48 x 64 pixels.
    e = _gradient(64, 48, rng)
    e[:16, :16] = 0
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(e, "RGB").save(IMAGES / "exif_rotated.jpg", quality=92, exif=exif,
                                   subsampling=0)

    # gray.png: 40 x 40 8-bit grayscale (convert("RGB") replicates the channel).
    g = _gradient(40, 40, rng)[..., 1]
    Image.fromarray(g, "L").save(IMAGES / "gray.png")

    # palette.gif: 36 x 30 palette image.
    p = Image.fromarray(_gradient(30, 36, rng), "RGB").quantize(colors=32, dither=Image.Dither.NONE)
    p.save(IMAGES / "palette.gif")

    # lossless.webp: 32 x 24 lossless WebP.
    Image.fromarray(_gradient(24, 32, rng), "RGB").save(IMAGES / "lossless.webp", lossless=True)

    # Not images: a truncated PNG and a text file, for the error paths.
    raw = (IMAGES / "normal.png").read_bytes()
    (IMAGES / "truncated.png").write_bytes(raw[: len(raw) // 2])
    (IMAGES / "not_an_image.txt").write_bytes(b"this is not an image\n")

    for f in sorted(IMAGES.iterdir()):
        print(f"  images/{f.name}: {f.stat().st_size} bytes")


def main() -> None:
    import mlx_lm
    import optiq

    assert mx.__version__ == "0.32.4", mx.__version__
    assert mlx_lm.__version__ == "0.32.2", mlx_lm.__version__
    assert getattr(optiq, "__version__", "0.7.7") == "0.7.7", optiq.__version__
    mx.set_default_device(mx.cpu)
    from optiq.vlm.diffusion_gemma.convert import convert_diffusion_gemma

    make_images()

    spec = mc.TINY
    tokenizer, tok_ids = fixture_tokenizer.build_tokenizer(spec["vocab_size"])
    text_names = text_only_names(spec, tok_ids)
    text_w = mc.fixture_weights(spec, text_names, [tok_ids["<eos>"], tok_ids["<turn|>"]])

    total = 0
    for name, inline in (("tiny-vision", True), ("tiny-vision-sidecar", False)):
        clipped = not inline
        config = full_config(spec, tok_ids, clipped)
        names = {k: tuple(v.shape) for k, v in tree_flatten(mc.new_model(config).parameters())}
        weights = dict(text_w)
        weights.update(vision_weights(names, clipped))
        assert set(weights) == set(names), set(names) ^ set(weights)

        out = MODELS / name
        with tempfile.TemporaryDirectory() as tmp:
            base = pathlib.Path(tmp) / "tiny-vision-base"
            write_base(base, config, weights, tokenizer)
            convert_diffusion_gemma(str(base), str(out), group_size=mc.GROUP_SIZE,
                                    quant_predicate=mc.bit_plan, quantize_vision=inline)
        if not inline:
            move_sidecar_under_optiq(out)
        finish_fixture(out, name, inline)
        verify(out, inline)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        total += size
        print(f"  {name}: {size} bytes")

    # The text tensors equal the tiny fixture's (same seed, recipe and quantization).
    tiny = MODELS / "tiny" / "model.safetensors"
    if tiny.is_file():
        a = mx.load(str(tiny))
        for name in ("tiny-vision", "tiny-vision-sidecar"):
            b = mx.load(str(MODELS / name / "model.safetensors"))
            for k, v in a.items():
                assert k in b and mx.array_equal(v, b[k]).item(), (name, k)
        print("  text tensors identical to tests/fixtures/models/tiny")
    assert total < 2_000_000, total
    print("ok")


if __name__ == "__main__":
    main()
