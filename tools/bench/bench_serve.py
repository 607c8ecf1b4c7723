#!/usr/bin/env python3
"""Serving bench on loopback: completion tokens/s and p50/p95 latency of dg's server at several
client concurrencies, against sequential serving (one client), and side by side the reference's
`generate` called per request on the same checkpoint and request mix (its own server cannot
serve DiffusionGemma: the generation thread dies and re-execs, see the project notes), as
shipped (bf16) and cast to float32.

    python3 tools/bench/bench_serve.py                       # dg only (medium random checkpoint)
    python3 tools/bench/bench_serve.py --reference .venv-ref/bin/python

Bounded: a fixed number of requests per concurrency, each with a timeout; the server is
started on 127.0.0.1 and stopped at the end. Needs only the Python standard library (the
reference side runs in the reference venv, tools/reference/setup.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]


def requests_mix(n: int) -> list[dict]:
    """Mixed prompt lengths, both samplers, greedy and sampled, fixed seeds."""
    words = "the quick brown fox jumps over a lazy dog while rivers run to the sea".split()
    out = []
    for i in range(n):
        prompt = " ".join(words[(i * 3 + j) % len(words)] for j in range(4 + (i * 7) % 40))
        out.append(
            {
                "prompt": prompt,
                "max_tokens": 48,
                "seed": i,
                "temperature": [0.0, 0.7][i % 2],
                "sampler": ["confidence-threshold", "entropy-bound"][(i // 2) % 2],
            }
        )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def run_clients(base: str, mix: list[dict], concurrency: int, timeout: float) -> dict:
    latencies: list[float] = []
    tokens = 0
    lock = threading.Lock()
    todo = list(enumerate(mix))

    def client() -> None:
        nonlocal tokens
        while True:
            with lock:
                if not todo:
                    return
                _, r = todo.pop(0)
            body = {
                "model": "dg",
                "messages": [{"role": "user", "content": r["prompt"]}],
                "max_tokens": r["max_tokens"],
                "seed": r["seed"],
                "temperature": r["temperature"],
                "sampler": r["sampler"],
            }
            start = time.perf_counter()
            reply = post(base + "/v1/chat/completions", body, timeout)
            took = time.perf_counter() - start
            with lock:
                latencies.append(took)
                tokens += reply["usage"]["completion_tokens"]

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[max(0, int(round(0.95 * len(latencies))) - 1)],
    }


REFERENCE = r"""
import json, sys, time
import mlx.core as mx
from optiq.vlm.diffusion_gemma.generate import load
from optiq.vlm._mlxvlm.generate.diffusion import stream_diffusion_generate
model_dir, f32, mix = sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[3])
model, tok = load(model_dir)
if f32:
    model.set_dtype(mx.float32)
lat, tokens = [], 0
start = time.perf_counter()
for r in mix:
    text = tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                   add_generation_prompt=True)
    ids = mx.array(tok.encode(text, add_special_tokens=False), dtype=mx.int32)[None]
    mx.random.seed(r["seed"])
    t0 = time.perf_counter()
    n = 0
    for out in stream_diffusion_generate(model, tok, tok, ids, None, None,
            max_tokens=r["max_tokens"], skip_special_token_ids=set(),
            temperature=r["temperature"], diffusion_sampler=r["sampler"], mm_token_type_ids=None):
        n = getattr(out, "generation_tokens", n)
    lat.append(time.perf_counter() - t0)
    tokens += n
wall = time.perf_counter() - start
lat.sort()
print(json.dumps({"requests": len(lat), "wall_s": wall, "tokens_per_s": tokens / wall,
                  "p50_s": lat[len(lat) // 2], "p95_s": lat[max(0, round(0.95 * len(lat)) - 1)]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint dir (default: write the medium random one)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--reference", help="python of the reference venv: also time its generate")
    ap.add_argument("--reference-requests", type=int, default=2)
    ap.add_argument("--reference-dtypes", default="float32,bf16",
                    help="which reference runs: float32 and/or bf16 (as shipped)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="dg-bench-serve-")
    model = args.model
    build = ["cargo", "build", "--quiet", "--release", "--example", "serve",
             "--example", "write_checkpoint"]
    subprocess.run(build, cwd=ROOT, check=True)
    examples = ROOT / "target" / "release" / "examples"
    if model is None:
        model = os.path.join(tmp, "medium")
        subprocess.run([examples / "write_checkpoint", "--out", model, "--hidden", "256",
                        "--experts", "32", "--canvas", "64"], check=True)
    port = free_port()
    server = subprocess.Popen([examples / "serve", "--model", model, "--port", str(port),
                               "--max-running", "16"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    sys.exit("the server did not become ready")
                time.sleep(0.2)
        mix = requests_mix(args.requests)
        run_clients(base, mix[:2], 1, args.timeout)  # warm-up
        rows = [run_clients(base, mix, int(c), args.timeout)
                for c in args.concurrency.split(",")]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    seq = rows[0]["tokens_per_s"]
    print(f"dg serve, {args.requests} requests, model {model}")
    print("concurrency  tokens/s  vs 1 client  p50 s   p95 s")
    for r in rows:
        print(f"{r['concurrency']:>11}  {r['tokens_per_s']:8.1f}  {r['tokens_per_s'] / seq:10.2f}x"
              f"  {r['p50_s']:6.2f}  {r['p95_s']:6.2f}")
    if args.reference:
        mix = requests_mix(args.reference_requests)
        for f32 in [d == "float32" for d in args.reference_dtypes.split(",")]:
            out = subprocess.run([args.reference, "-c", REFERENCE, model, "1" if f32 else "0",
                                  json.dumps(mix)], check=True, capture_output=True, text=True,
                                 timeout=args.timeout * len(mix))
            ref = json.loads(out.stdout.strip().splitlines()[-1])
            kind = "float32" if f32 else "bf16 as shipped"
            print(f"reference generate per request ({kind}), {ref['requests']} requests: "
                  f"{ref['tokens_per_s']:.2f} tokens/s, p50 {ref['p50_s']:.2f} s; "
                  f"dg sequential / reference {seq / ref['tokens_per_s']:.1f}x, "
                  f"dg at {rows[-1]['concurrency']} clients / reference "
                  f"{rows[-1]['tokens_per_s'] / ref['tokens_per_s']:.1f}x")


if __name__ == "__main__":
    main()
