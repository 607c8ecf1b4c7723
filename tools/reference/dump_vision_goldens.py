#!/usr/bin/env python3
"""Dump vision goldens from the reference (mlx-optiq 0.7.7 / mlx 0.32.4 / Pillow, CPU).

Run after make_vision_checkpoints.py, with the reference venv:

    /work/refenv/bin/python tools/reference/dump_vision_goldens.py

Writes tests/fixtures/goldens/vision_preprocess.{safetensors,json} and
tests/fixtures/goldens/vision_features.{safetensors,json}.

Preprocessing (the reference's public image path, `optiq.vlm.diffusion_gemma.generate.
_build_image_inputs` -> `optiq.vlm.gemma4.image_processing.preprocess_images`):
  * decode: `PIL.Image.open(path).convert("RGB")` (no EXIF transpose anywhere in the path);
    the decoded RGB of every test image is stored whole (they are small).
  * resize: the aspect-preserving PIL BICUBIC resize. A resized image is ~645k pixels whatever
    the input (the 2520-patch budget), too big to store, so the golden is the exact resized u8
    image's FNV-1a-64 hash plus its per-row channel sums (to localize a difference). Direct
    resampler cases (small random images, up and down) are stored whole.
  * rescale: `np.asarray(img, float32) * (1/255)`, then `.astype(mx.bfloat16)`; the patch
    embedder's `2 * (x - 0.5)` in bf16, and its cast to uint32 when input_proj is quantized.
    All are functions of the u8 value: 256-entry tables from numpy and MLX are stored.
Features (float32 reference: `model.set_dtype(mx.float32)` after loading; the uint32 packed
weights stay): for each layout and image, the vision tower output [n, 64] and the multimodal
embedder output [n, text_hidden] (`encoder.get_image_features`), plus the first 32 rows of
the patch embedder output (patch projection + position embeddings) to localize a difference.
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
IMAGES = ROOT / "tests" / "fixtures" / "images"
GOLDENS = ROOT / "tests" / "fixtures" / "goldens"

DECODE_IMAGES = ["normal.png", "tall.png", "wide.jpg", "exif_rotated.jpg", "gray.png",
                 "palette.gif", "lossless.webp"]
# Features are ~72 KB per image and output; keep three images per layout, the tower output
# (before the embedder) for one.
FEATURE_IMAGES = ["normal.png", "tall.png", "exif_rotated.jpg"]
TOWER_IMAGES = ["normal.png"]
LAYOUTS = {"inline": "tiny-vision", "sidecar": "tiny-vision-sidecar"}

# Direct resampler cases: (in_h, in_w, out_h, out_w).
RESIZE_CASES = [(13, 7, 48, 96), (50, 37, 20, 30), (31, 64, 96, 48), (5, 5, 144, 48),
                (97, 61, 48, 48), (40, 40, 40, 96)]


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def fnv1a64_np(arr: np.ndarray) -> str:
    # Vectorized by chunks would be faster; the images are < 2 MB, a plain loop is fine.
    return fnv1a64(np.ascontiguousarray(arr).tobytes())


def to_np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)) if a.dtype != mx.uint32 else np.array(a)


def dump_preprocess() -> None:
    from PIL import Image
    from safetensors.numpy import save_file

    from optiq.vlm.gemma4 import image_processing as ip

    tensors: dict[str, np.ndarray] = {}
    meta: dict = {"images": [], "resize_cases": []}

    # 256-entry tables.
    levels = np.arange(256, dtype=np.uint8)
    rescaled = np.asarray(levels, dtype=np.float32) * ip.RESCALE_FACTOR
    assert rescaled.dtype == np.float32
    bf = mx.array(rescaled).astype(mx.bfloat16)
    patch = 2 * (bf - 0.5)  # exactly VisionPatchEmbedder._patchify's expression, on bf16
    assert patch.dtype == mx.bfloat16
    tensors["table.rescaled_f32"] = rescaled
    tensors["table.pixel_bf16_as_f32"] = to_np(bf)
    tensors["table.patch_bf16_as_f32"] = to_np(patch)
    tensors["table.patch_as_u32"] = np.array(patch.astype(mx.uint32))
    # The uint32 patches reach the quantized matmul cast to the scales' dtype (float32 here).
    tensors["table.patch_u32_as_f32"] = np.array(patch.astype(mx.uint32).astype(mx.float32))

    for name in DECODE_IMAGES:
        img = Image.open(IMAGES / name)
        mode = img.mode
        rgb = img.convert("RGB")
        decoded = np.asarray(rgb, dtype=np.uint8)
        pv, soft = ip.preprocess_images([img])
        resized_img = ip._aspect_ratio_preserving_resize(
            rgb, ip.PATCH_SIZE, ip.MAX_SOFT_TOKENS * ip.POOLING_KERNEL_SIZE**2,
            ip.POOLING_KERNEL_SIZE)
        resized = np.asarray(resized_img, dtype=np.uint8)
        # The processor's output is exactly the rescale table applied to the resized u8 image.
        assert np.array_equal(pv[0], np.transpose(rescaled[resized], (2, 0, 1))), name
        h, w = resized.shape[:2]
        key = name.replace(".", "_")
        tensors[f"{key}.decoded"] = decoded
        tensors[f"{key}.resized_row_sums"] = resized.astype(np.int32).sum(axis=1, dtype=np.int32)
        exif_orientation = img.getexif().get(0x0112)
        meta["images"].append({
            "file": name,
            "key": key,
            "pil_mode": mode,
            "exif_orientation": exif_orientation,
            "decoded_hw": list(decoded.shape[:2]),
            "resized_hw": [h, w],
            "soft_tokens": int(soft[0]),
            "fnv1a64_resized_rgb": fnv1a64_np(resized),
            "saturated_black": int((resized == 0).sum()),
            "saturated_white": int((resized == 255).sum()),
        })
        print(f"  {name}: mode {mode} {decoded.shape[:2]} -> {h}x{w}, {soft[0]} soft tokens")

    rng = np.random.default_rng(20260818)
    for i, (ih, iw, oh, ow) in enumerate(RESIZE_CASES):
        src = rng.integers(0, 256, size=(ih, iw, 3), dtype=np.uint8)
        # Some saturated runs so clipping at 0 and 255 is exercised.
        src[: ih // 3, : iw // 3] = 255
        src[-(ih // 3):, -(iw // 3):] = 0
        out = np.asarray(Image.fromarray(src, "RGB").resize((ow, oh), resample=Image.BICUBIC))
        tensors[f"resize{i}.in"] = src
        tensors[f"resize{i}.out"] = np.ascontiguousarray(out)
        meta["resize_cases"].append({"key": f"resize{i}", "in_hw": [ih, iw], "out_hw": [oh, ow]})

    GOLDENS.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(GOLDENS / "vision_preprocess.safetensors"))
    meta["reference"] = "mlx-optiq 0.7.7 optiq.vlm.gemma4.image_processing, Pillow " + \
        __import__("PIL").__version__
    (GOLDENS / "vision_preprocess.json").write_text(json.dumps(meta, indent=2) + "\n")


def dump_features() -> None:
    from PIL import Image
    from safetensors.numpy import save_file

    from optiq.vlm.diffusion_gemma.loader import load_diffusion_gemma
    from optiq.vlm.gemma4.image_processing import preprocess_images

    tensors: dict[str, np.ndarray] = {}
    meta: dict = {"layouts": {}}
    for layout, model_name in LAYOUTS.items():
        model, config = load_diffusion_gemma(str(MODELS / model_name))
        model.set_dtype(mx.float32)
        enc = model.model.encoder
        vt = enc.vision_tower
        entries = []
        for name in FEATURE_IMAGES:
            img = Image.open(IMAGES / name)
            pv, soft = preprocess_images([img])
            # As _build_image_inputs builds them: stacked, cast to bfloat16.
            pixel_values = mx.array(np.stack([np.array(p) for p in pv])).astype(mx.bfloat16)
            tower = vt(pixel_values)
            feats = enc.embed_vision(tower)
            via_api = enc.get_image_features(pixel_values)
            assert mx.array_equal(feats, via_api).item()
            _, _, H, W = pixel_values.shape
            n_real = (H // 16) * (W // 16)
            pos, pad, _ = vt._patch_positions_single(H, W)
            emb = vt.patch_embedder(pixel_values, mx.array(pos[None, :n_real]),
                                    mx.array(pad[None, :n_real]))
            mx.eval(tower, feats, emb)
            assert tower.shape[1] == soft[0] == feats.shape[1], (tower.shape, soft)
            key = f"{layout}.{name.replace('.', '_')}"
            tensors[f"{key}.features"] = to_np(feats[0])
            tensors[f"{key}.patch_embed_head"] = to_np(emb[0, :32])
            if name in TOWER_IMAGES:
                tensors[f"{key}.tower"] = to_np(tower[0])
            entries.append({"file": name, "key": key, "soft_tokens": int(soft[0]),
                            "has_tower": name in TOWER_IMAGES})
            f = np.array(feats[0])
            print(f"  {layout} {name}: features {tuple(f.shape)}, |f| mean "
                  f"{np.abs(f).mean():.4f}, finite {np.isfinite(f).all()}")
        meta["layouts"][layout] = {"model": f"tests/fixtures/models/{model_name}",
                                   "images": entries}
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(GOLDENS / "vision_features.safetensors"))
    meta["reference"] = ("mlx-optiq 0.7.7 / mlx 0.32.4 (CPU), model.set_dtype(float32); pixel "
                         "values as _build_image_inputs builds them (bfloat16)")
    (GOLDENS / "vision_features.json").write_text(json.dumps(meta, indent=2) + "\n")


def main() -> None:
    assert mx.__version__ == "0.32.4", mx.__version__
    mx.set_default_device(mx.cpu)
    dump_preprocess()
    dump_features()
    for f in sorted(GOLDENS.glob("vision_*")):
        print(f"  goldens/{f.name}: {f.stat().st_size} bytes")
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
