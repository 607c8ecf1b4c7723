#!/usr/bin/env python3
"""Dump goldens for dg-quant (MLX affine quantization and quantized matmuls).

Reference: mlx 0.32.4 / mlx-cpu 0.32.4 on the CPU (Linux x86-64). Run with the reference venv:

    /work/refenv/bin/python tools/reference/dump_quant_goldens.py

Writes tests/fixtures/goldens/quant.safetensors (and quant.json, the list of cases).

Tensors (all from one seeded numpy generator; every name below is a safetensors key):
- `w`: bf16 [8, 256], the matrix every width quantizes. Rows: 0 constant (0.75), 1 normal with
  two large outliers, 2 all zeros, 3 all negative, 4 tiny values (1e-3 scale), 5 uniform
  integers-ish values that land on bin edges (ties for rint), 6 normal, 7 a few groups
  constant and the rest normal.
- For bits b in {2, 3, 4, 5, 6, 8} and group size g in {32, 64, 128}, key prefix `q{b}_g{g}.`:
  `packed` u32 [8, 256*b/32], `scales`/`biases` bf16 [8, 256/g] = mx.quantize(w, g, b);
  `dequant` f32 [8, 256] = mx.dequantize(packed, scales.astype(f32), biases.astype(f32), g, b)
  (the float32 reference: scales and biases upcast to float32 before dequantizing).
- `w32`: f32 [4, 256] not representable in bf16; `f32q{b}_g{g}.{packed,scales,biases}` =
  mx.quantize(w32, g, b) for (4, 64), (8, 64), (3, 128) (float32 scales and biases).
- Matmuls, for (b, g) in (4, 64), (8, 64), (3, 32), (6, 128), key prefix `mm{b}_g{g}.`:
  `packed`/`scales`/`biases` = mx.quantize of a bf16 W [48, 256]; `x_t` f32 [17, 256];
  `out_t` f32 [17, 48] = mx.quantized_matmul(x_t, packed, scales.astype(f32),
  biases.astype(f32), transpose=True); `x_n` f32 [17, 48]; `out_n` f32 [17, 256] =
  quantized_matmul(..., transpose=False). Each output row depends only on its x row, so tests
  check any subset of rows (1, 2, 5, 17 rows: both of dg-quant's strategies).
- Gathered product, for (b, g) in (4, 64), (8, 64), key prefix `gq{b}_g{g}.`: experts W
  [5, 24, 256] quantized (`packed`, `scales`, `biases`), `x` f32 [7, 256], `pairs` u32 [P, 2]
  (x row, expert), `out` f32 [P, 24] = mx.gather_qmm(x[:, None, :], packed, scales.astype(f32),
  biases.astype(f32), lhs_indices=pairs[:, 0], rhs_indices=pairs[:, 1], transpose=True).
  Expert 1 gets 6 pairs, expert 3 one, expert 0 two, experts 2 and 4 none or a few.
"""

import json
import pathlib

import mlx.core as mx
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "goldens"

BITS = [2, 3, 4, 5, 6, 8]
GROUPS = [32, 64, 128]


def to_bf16(a: np.ndarray) -> mx.array:
    return mx.array(a.astype(np.float32)).astype(mx.bfloat16)


def test_matrix(rs: np.random.RandomState) -> mx.array:
    rows, cols = 8, 256
    w = np.zeros((rows, cols), np.float32)
    w[0] = 0.75
    w[1] = rs.normal(0, 0.05, cols)
    w[1, 17] = 3.0
    w[1, 200] = -5.5
    w[2] = 0.0
    w[3] = -np.abs(rs.normal(0.3, 0.2, cols)) - 0.01
    w[4] = rs.normal(0, 1e-3, cols)
    # Values on a 1/8 grid: many (w - bias) / scale land on .5 exactly (rint ties).
    w[5] = rs.randint(-16, 17, cols) / 8.0
    w[6] = rs.normal(0, 0.02, cols)
    w[7] = rs.normal(0, 0.1, cols)
    w[7, :64] = -0.125
    w[7, 128:160] = 2.0
    return to_bf16(w)


def quant(w, g, b):
    packed, scales, biases = mx.quantize(w, group_size=g, bits=b)
    return packed, scales, biases


def main() -> None:
    assert mx.__version__ == "0.32.4", mx.__version__
    mx.set_default_device(mx.cpu)
    rs = np.random.RandomState(20260802)
    tensors = {}
    cases = {"quantize": [], "quantize_f32": [], "matmul": [], "gather": []}

    def put(name, arr):
        assert name not in tensors, name
        tensors[name] = arr

    w = test_matrix(rs)
    put("w", w)
    for b in BITS:
        for g in GROUPS:
            packed, scales, biases = quant(w, g, b)
            assert packed.dtype == mx.uint32 and scales.dtype == mx.bfloat16
            deq = mx.dequantize(packed, scales.astype(mx.float32), biases.astype(mx.float32),
                                group_size=g, bits=b)
            assert deq.dtype == mx.float32
            p = f"q{b}_g{g}."
            put(p + "packed", packed)
            put(p + "scales", scales)
            put(p + "biases", biases)
            put(p + "dequant", deq)
            cases["quantize"].append({"bits": b, "group_size": g, "prefix": p, "rows": 8, "cols": 256})

    w32 = mx.array(rs.normal(0, 0.1, (4, 256)).astype(np.float32))
    put("w32", w32)
    for b, g in [(4, 64), (8, 64), (3, 128)]:
        packed, scales, biases = quant(w32, g, b)
        assert scales.dtype == mx.float32
        p = f"f32q{b}_g{g}."
        put(p + "packed", packed)
        put(p + "scales", scales)
        put(p + "biases", biases)
        cases["quantize_f32"].append({"bits": b, "group_size": g, "prefix": p, "rows": 4, "cols": 256})

    for b, g in [(4, 64), (8, 64), (3, 32), (6, 128)]:
        rows, cols, m = 48, 256, 17
        wm = to_bf16(rs.normal(0, 0.05, (rows, cols)))
        packed, scales, biases = quant(wm, g, b)
        s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
        x_t = mx.array(rs.normal(0, 1, (m, cols)).astype(np.float32))
        out_t = mx.quantized_matmul(x_t, packed, s32, b32, transpose=True, group_size=g, bits=b)
        x_n = mx.array(rs.normal(0, 1, (m, rows)).astype(np.float32))
        out_n = mx.quantized_matmul(x_n, packed, s32, b32, transpose=False, group_size=g, bits=b)
        assert out_t.dtype == mx.float32 and out_n.dtype == mx.float32
        p = f"mm{b}_g{g}."
        for k, v in [("packed", packed), ("scales", scales), ("biases", biases), ("x_t", x_t),
                     ("out_t", out_t), ("x_n", x_n), ("out_n", out_n)]:
            put(p + k, v)
        cases["matmul"].append({"bits": b, "group_size": g, "prefix": p, "rows": rows, "cols": cols, "m": m})

    for b, g in [(4, 64), (8, 64)]:
        experts, rows, cols, x_rows = 5, 24, 256, 7
        we = to_bf16(rs.normal(0, 0.05, (experts, rows, cols)))
        packed, scales, biases = quant(we, g, b)
        x = mx.array(rs.normal(0, 1, (x_rows, cols)).astype(np.float32))
        pairs = [(0, 1), (1, 1), (2, 3), (3, 1), (4, 0), (5, 1), (6, 1), (0, 0), (2, 1), (6, 4)]
        pairs_np = np.array(pairs, dtype=np.uint32)
        lhs = mx.array(pairs_np[:, 0])
        rhs = mx.array(pairs_np[:, 1])
        out = mx.gather_qmm(x[:, None, :], packed, scales.astype(mx.float32), biases.astype(mx.float32),
                            lhs_indices=lhs, rhs_indices=rhs, transpose=True, group_size=g, bits=b)
        out = out.reshape(len(pairs), rows)
        assert out.dtype == mx.float32
        p = f"gq{b}_g{g}."
        for k, v in [("packed", packed), ("scales", scales), ("biases", biases), ("x", x),
                     ("pairs", mx.array(pairs_np)), ("out", out)]:
            put(p + k, v)
        cases["gather"].append({"bits": b, "group_size": g, "prefix": p, "experts": experts, "rows": rows,
                                "cols": cols, "x_rows": x_rows, "pairs": len(pairs)})

    mx.eval(tensors)
    OUT.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(OUT / "quant.safetensors"), tensors,
                        metadata={"generator": "tools/reference/dump_quant_goldens.py", "mlx": mx.__version__})
    doc = {"mlx": mx.__version__, "cases": cases}
    (OUT / "quant.json").write_text(json.dumps(doc, indent=1) + "\n")
    size = (OUT / "quant.safetensors").stat().st_size
    print(f"wrote {OUT / 'quant.safetensors'} ({size} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
