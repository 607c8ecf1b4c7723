#!/usr/bin/env python3
"""Dump goldens for dg-engine's MLX-compatible RNG (dg-engine/src/research/rng.rs).

Reference: mlx 0.32.4 / mlx-cpu 0.32.4 on the CPU (Linux x86-64). Run with the reference venv:

    /work/refenv/bin/python tools/reference/dump_rng_goldens.py

Writes tests/fixtures/goldens/rng.safetensors (tensors) and rng.json (the cases: which calls,
in which order, with which arguments; tensor names point into the safetensors file).

Two kinds of cases:
- "sequence": the global-key sequence the engine performs: mx.random.seed(seed); randint(0, vocab,
  shape) twice (vocab 262144, the real model's); categorical(logits) with logits of shape
  shape + (512,); randint(0, 512, shape); uniform(shape). The global key is recorded after the seed
  and after every call.
- "keyed": single calls with an explicit key=, covering the corners (odd and even word counts,
  split into n keys, negative / degenerate / huge randint ranges, both categorical code paths,
  -inf and +inf logits).

Categorical logits come from one seeded numpy table (64 x 512, values exact in bfloat16 so the
file can store them in bf16; they are used as float32); logits row r is table row r % 64.
"""

import json
import pathlib

import mlx.core as mx
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "goldens"

SEEDS = [0, 1, 42, 12345, 2**31 - 1]
SHAPES = [(1, 16), (1, 64), (2, 7), (1, 256), (3, 5)]
TABLE_ROWS = 64
VOCAB = 512
BIG_VOCAB = 262144


def logits_table(rows: int, vocab: int) -> mx.array:
    """Peaked rows: gaussian base plus one boosted token, rounded to bf16 values."""
    rs = np.random.RandomState(20260801)
    base = rs.normal(0.0, 2.0, size=(rows, vocab)).astype(np.float32)
    top = rs.randint(0, vocab, size=rows)
    base[np.arange(rows), top] += rs.uniform(0.0, 8.0, size=rows).astype(np.float32)
    return mx.array(base).astype(mx.bfloat16)


def main() -> None:
    assert mx.__version__ == "0.32.4", mx.__version__
    mx.set_default_device(mx.cpu)
    tensors = {}
    cases = []

    def put(name, arr):
        assert name not in tensors, name
        tensors[name] = arr
        return name

    table_bf16 = logits_table(TABLE_ROWS, VOCAB)
    put("logits_table", table_bf16)
    table = table_bf16.astype(mx.float32)

    def key_list(k):
        return [int(v) for v in np.array(k).reshape(-1)]

    # --- sequences on the global key -------------------------------------------------------
    for seed in SEEDS:
        for shape in SHAPES:
            name = f"seq_s{seed}_{'x'.join(map(str, shape))}"
            rows = int(np.prod(shape))
            logits = table[mx.arange(rows) % TABLE_ROWS].reshape(*shape, VOCAB)
            calls = []
            mx.random.seed(seed)
            states = [key_list(mx.random.state[0])]

            out = mx.random.randint(0, BIG_VOCAB, shape)
            calls.append({"op": "randint", "low": 0, "high": BIG_VOCAB,
                          "out": put(f"{name}/randint_a", out)})
            states.append(key_list(mx.random.state[0]))

            out = mx.random.randint(0, BIG_VOCAB, shape)
            calls.append({"op": "randint", "low": 0, "high": BIG_VOCAB,
                          "out": put(f"{name}/randint_b", out)})
            states.append(key_list(mx.random.state[0]))

            out = mx.random.categorical(logits)
            calls.append({"op": "categorical", "logits_rows": rows,
                          "logits_shape": list(shape) + [VOCAB],
                          "out": put(f"{name}/categorical", out)})
            states.append(key_list(mx.random.state[0]))

            out = mx.random.randint(0, VOCAB, shape)
            calls.append({"op": "randint", "low": 0, "high": VOCAB,
                          "out": put(f"{name}/randint_c", out)})
            states.append(key_list(mx.random.state[0]))

            out = mx.random.uniform(shape=shape)
            calls.append({"op": "uniform", "out": put(f"{name}/uniform", out)})
            states.append(key_list(mx.random.state[0]))

            cases.append({"kind": "sequence", "name": name, "seed": seed, "shape": list(shape),
                          "calls": calls, "states": states})

    # --- seeds beyond 32 bits: only the key -------------------------------------------------
    seed_keys = []
    for seed in SEEDS + [2**32 + 5, 2**64 - 1, 0x0123456789ABCDEF]:
        mx.random.seed(seed)
        seed_keys.append({"seed": str(seed), "state": key_list(mx.random.state[0]),
                          "key": key_list(mx.random.key(seed))})

    # --- keyed calls ------------------------------------------------------------------------
    keyed = []
    key_seeds = [0, 7, 42, 2**31 - 1, 2**40 + 3]

    def keyed_case(op, key_seed, out, **params):
        k = mx.random.key(key_seed)
        name = f"keyed_{len(keyed)}_{op}"
        keyed.append({"op": op, "key": key_list(k), "out": put(name, out), **params})

    for ks in key_seeds:
        k = mx.random.key(ks)
        # Python has no mx.random.bits: uniforms of odd and even sizes pin the word layout.
        for n in [1, 2, 3, 4, 5, 7, 8, 33, 100]:
            keyed_case("uniform", ks, mx.random.uniform(shape=(n,), key=k), shape=[n])
        for num in [1, 2, 3, 5]:
            keyed_case("split", ks, mx.random.split(k, num), num=num)
        keyed_case("uniform", ks, mx.random.uniform(shape=(3, 5), key=k), shape=[3, 5])
        keyed_case("uniform_range", ks,
                   mx.random.uniform(-2.5, 3.0, (4, 4), key=k),
                   low=-2.5, high=3.0, shape=[4, 4])
        keyed_case("gumbel", ks, mx.random.gumbel((4, 9), key=k), shape=[4, 9])
        for low, high, n in [(0, 10, 64), (-7, 9, 64), (0, 1, 8), (10, 3, 8), (5, 5, 8),
                             (0, 2**31 - 1, 64), (-2**31, 2**31 - 1, 64), (0, 262144, 64),
                             (-1000000, 30000000, 64)]:
            keyed_case("randint", ks, mx.random.randint(low, high, (n,), key=k),
                       low=low, high=high, shape=[n])

    # categorical corners, with explicit keys (each logits tensor stored once)
    masked = mx.where(mx.arange(VOCAB) % 3 == 0, -mx.inf, table[6:8])
    corners = [
        (table[0:1].reshape(1, 1, VOCAB), "one row, 3-D: inverse-CDF path"),
        (table[1:2], "one row, 2-D: inverse-CDF path"),
        (table[2], "1-D: Gumbel path"),
        (table[3:6], "three rows: Gumbel path"),
        (masked, "-inf entries, Gumbel path"),
        (masked[0:1], "-inf entries, inverse-CDF path"),
        (mx.full((1, 16), -mx.inf), "all -inf, inverse-CDF path (uniform over ties)"),
        (mx.full((2, 16), -mx.inf), "all -inf, Gumbel path (argmax of -inf = 0)"),
        (mx.where(mx.arange(16) == 5, mx.inf, mx.zeros((1, 16))),
         "one +inf entry, inverse-CDF path"),
        (table[8:9] * 40.0, "very peaked single row"),
    ]
    for i, (logits, note) in enumerate(corners):
        lname = put(f"corner_{i}_logits", logits)
        for ks in key_seeds:
            k = mx.random.key(ks)
            out = mx.random.categorical(logits, key=k)
            keyed.append({"op": "categorical", "key": key_list(k), "logits": lname,
                          "logits_shape": list(logits.shape), "note": note,
                          "out": put(f"keyed_{len(keyed)}_categorical", out)})

    OUT.mkdir(parents=True, exist_ok=True)
    mx.eval(list(tensors.values()))
    mx.save_safetensors(str(OUT / "rng.safetensors"), tensors,
                        metadata={"generator": "tools/reference/dump_rng_goldens.py",
                                  "mlx": mx.__version__})
    doc = {
        "generator": "tools/reference/dump_rng_goldens.py",
        "mlx": mx.__version__,
        "vocab": VOCAB,
        "logits_table": "logits_table",
        "logits_table_rows": TABLE_ROWS,
        "sequences": cases,
        "seed_keys": seed_keys,
        "keyed": keyed,
    }
    (OUT / "rng.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    size = (OUT / "rng.safetensors").stat().st_size
    print(f"wrote {len(tensors)} tensors ({size} bytes), {len(cases)} sequences, "
          f"{len(keyed)} keyed cases")


if __name__ == "__main__":
    main()
