#!/usr/bin/env python3
"""Time the reference's quantized matmuls at the shapes of benches/quant.rs (side-by-side).

Reference: mlx 0.32.4 / mlx-cpu 0.32.4 on the CPU (Linux x86-64). Run with the reference venv:

    /work/refenv/bin/python tools/reference/bench_quant_mlx.py [--budget SECONDS] [--only NAME]

Writes nothing; prints one line per case: name, activation rows m, activation dtype, seconds
per call (best of the repetitions), GFLOP/s (2 * m * rows * cols / s) and GB/s of weights
(packed + scales + biases bytes / s).

- bf16: x, scales and biases in bfloat16, as the reference runs as shipped (MLX's CPU backend
  then accumulates in bf16 with a scalar loop).
- f32: x, scales and biases in float32, as the float32 reference (`model.set_dtype(mx.float32)`).

Weights are random bits and random scales/biases, group size 64, like benches/quant.rs. MLX's
CPU kernels loop over rows one output at a time, so their rate does not depend on the batch:
cases whose first call exceeds --budget seconds are not repeated, and the 256-row and expert
cases run on fewer rows/pairs where noted (the rate is what is compared).
"""

import argparse
import time

import mlx.core as mx
import numpy as np

GROUP = 64


def random_quantized(rs, lead, rows, cols, bits, dtype):
    words = cols * bits // 32
    packed = rs.randint(0, 2**32, size=lead + (rows, words), dtype=np.uint64).astype(np.uint32)
    groups = lead + (rows, cols // GROUP)
    scales = (rs.uniform(-1, 1, groups) * 0.01).astype(np.float32)
    biases = (rs.uniform(-1, 1, groups) * 0.1).astype(np.float32)
    return (mx.array(packed), mx.array(scales).astype(mx.bfloat16).astype(dtype),
            mx.array(biases).astype(mx.bfloat16).astype(dtype))


def weight_bytes(packed, scales, biases):
    return packed.size * 4 + (scales.size + biases.size) * 2


def timed(fn, budget):
    t = time.perf_counter()
    mx.eval(fn())
    first = time.perf_counter() - t
    best = first
    reps = 0
    total = first
    while total < budget and reps < 5 and first < budget / 3:
        t = time.perf_counter()
        mx.eval(fn())
        dt = time.perf_counter() - t
        best = min(best, dt)
        total += dt
        reps += 1
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per case")
    ap.add_argument("--only", default=None, help="substring of the case names to run")
    args = ap.parse_args()
    assert mx.__version__ == "0.32.4", mx.__version__
    mx.set_default_device(mx.cpu)
    rs = np.random.RandomState(7)

    linears = [
        ("q_proj_8b", 4096, 2816, 8),
        ("k_proj_8b", 2048, 2816, 8),
        ("o_proj_8b", 2816, 4096, 8),
        ("mlp_gate_8b", 2112, 2816, 8),
        ("mlp_down_8b", 2816, 2112, 8),
        ("head_slice_4b", 16384, 2816, 4),
    ]
    print(f"{'case':24} {'m':>5} {'dtype':>5} {'s/call':>10} {'GFLOP/s':>8} {'GB/s':>7}  note")
    for name, rows, cols, bits in linears:
        if args.only and args.only not in name:
            continue
        for dtype, dname in [(mx.bfloat16, "bf16"), (mx.float32, "f32")]:
            packed, scales, biases = random_quantized(rs, (), rows, cols, bits, dtype)
            nbytes = weight_bytes(packed, scales, biases)
            for m in [1, 16, 256]:
                # At 256 rows MLX's rate equals its 16-row rate (one output at a time); run 32
                # rows and report the rate unless the budget allows the full batch.
                run_m = m if m < 256 else 32
                x = mx.array(rs.normal(0, 1, (run_m, cols)).astype(np.float32)).astype(dtype)
                s = timed(lambda: mx.quantized_matmul(x, packed, scales, biases, transpose=True,
                                                      group_size=GROUP, bits=bits), args.budget)
                gflops = 2 * run_m * rows * cols / s / 1e9
                note = "" if run_m == m else f"ran {run_m} rows; s/call scaled to {m}"
                s_m = s * m / run_m
                print(f"{name:24} {m:5} {dname:>5} {s_m:10.4f} {gflops:8.2f} {nbytes / s_m / 1e9:7.2f}  {note}",
                      flush=True)

    # The soft-embedding product probs @ embed (transpose=False) on a 16384-row vocab slice.
    name = "embed_slice_4b_xW"
    if not args.only or args.only in name:
        rows, cols = 16384, 2816
        for dtype, dname in [(mx.bfloat16, "bf16"), (mx.float32, "f32")]:
            packed, scales, biases = random_quantized(rs, (), rows, cols, 4, dtype)
            nbytes = weight_bytes(packed, scales, biases)
            for m in [1, 16, 256]:
                run_m = m if m < 256 else 32
                x = mx.array(rs.normal(0, 1, (run_m, rows)).astype(np.float32)).astype(dtype)
                s = timed(lambda: mx.quantized_matmul(x, packed, scales, biases, transpose=False,
                                                      group_size=GROUP, bits=4), args.budget)
                gflops = 2 * run_m * rows * cols / s / 1e9
                note = "" if run_m == m else f"ran {run_m} rows; s/call scaled to {m}"
                s_m = s * m / run_m
                print(f"{name:24} {m:5} {dname:>5} {s_m:10.4f} {gflops:8.2f} {nbytes / s_m / 1e9:7.2f}  {note}",
                      flush=True)

    # MoE experts, 4-bit, 128 experts: 256 tokens x top-8 = 2048 pairs in benches/quant.rs.
    # MLX's gather_qmm computes pair by pair, so 256 pairs (32 tokens) give its rate.
    n_experts, tokens, top_k = 128, 256, 8
    run_tokens = 32
    for name, rows, cols in [("experts_gate_up_4b", 1408, 2816), ("experts_down_4b", 2816, 704)]:
        if args.only and args.only not in name:
            continue
        for dtype, dname in [(mx.bfloat16, "bf16"), (mx.float32, "f32")]:
            packed, scales, biases = random_quantized(rs, (n_experts,), rows, cols, 4, dtype)
            idx = np.stack([rs.choice(n_experts, top_k, replace=False) for _ in range(run_tokens)])
            pairs = run_tokens * top_k
            x = mx.array(rs.normal(0, 1, (pairs, 1, cols)).astype(np.float32)).astype(dtype)
            rhs = mx.array(idx.reshape(-1).astype(np.uint32))
            lhs = mx.arange(pairs, dtype=mx.uint32)
            s = timed(lambda: mx.gather_qmm(x, packed, scales, biases, lhs_indices=lhs, rhs_indices=rhs,
                                            transpose=True, group_size=GROUP, bits=4), args.budget)
            gflops = 2 * pairs * rows * cols / s / 1e9
            s_full = s * tokens / run_tokens
            print(f"{name:24} {tokens * top_k:5} {dname:>5} {s_full:10.4f} {gflops:8.2f} {'':>7}  "
                  f"ran {pairs} pairs; s/call scaled to {tokens * top_k}", flush=True)


if __name__ == "__main__":
    main()
