"""What the bench_*step.py side-by-sides share: their options, the random checkpoint written by
dg's Rust writer (examples/write_checkpoint.rs), the reference timed in a child process per
dtype (bf16 as shipped, cast to float32), and dg's timing example on the same checkpoint."""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cargo_example(name: str, *args: str) -> str:
    cmd = ["cargo", "run", "--quiet", "--release", "--example", name, "--", *args]
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def last_json(out: str) -> dict:
    """The JSON line a timing process prints last."""
    return json.loads(out.strip().splitlines()[-1])


def parse_args(doc: str | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--canvas", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--child", choices=["bf16", "f32"])
    ap.add_argument("--model")
    return ap.parse_args()


def print_child(per_step: float) -> None:
    """A child's result: seconds per step and its peak RSS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"per_step_s": per_step, "peak_rss_mb": peak}))


def side_by_side(a: argparse.Namespace, script: str, run_dg: Callable[[str], dict]) -> dict:
    """Writes the checkpoint, times the reference (`script --child bf16|f32`) and dg
    (`run_dg(checkpoint_dir)`) on it; returns every result and the ratios reference / dg."""
    with tempfile.TemporaryDirectory() as tmp:
        cargo_example(
            "write_checkpoint", "--out", tmp, "--hidden", str(a.hidden), "--experts",
            str(a.experts), "--canvas", str(a.canvas), "--vocab", str(a.vocab),
        )
        results = {}
        for kind in ["bf16", "f32"]:
            out = subprocess.run(
                [sys.executable, script, "--child", kind, "--model", tmp, "--prompt-len",
                 str(a.prompt_len), "--steps", str(a.steps)],
                check=True, capture_output=True, text=True,
            ).stdout
            results[f"reference_{kind}"] = last_json(out)
        dg = run_dg(tmp)
        results["dg"] = dg
    results["ratio_vs_bf16"] = results["reference_bf16"]["per_step_s"] / dg["per_step_s"]
    results["ratio_vs_f32"] = results["reference_f32"]["per_step_s"] / dg["per_step_s"]
    return results
