#!/usr/bin/env python3
"""Dump goldens for dg-engine's sampler (dg-engine/src/research/sampler.rs, mlx_math.rs).

Reference: mlx-optiq 0.7.7 on mlx 0.32.4 / mlx-cpu 0.32.4 (Linux x86-64 CPU). Every output comes
from the reference's own functions in optiq/vlm/_mlxvlm/generate/diffusion.py, called on
synthetic float32 logits. Run with the reference venv:

    /work/refenv/bin/python tools/reference/dump_sampler_goldens.py

Writes tests/fixtures/goldens/sampler.{safetensors,json}:

- "table": a seeded float32 logits table (rows x 512). Each case's raw logits are a list of
  table rows (stored in the JSON), so many cases share little storage. Row kinds: peaked
  (random top gap), flat, ties (two equal maxima), very peaked (entropy ~ 0), rows tuned so the
  top probability after the case's temperature is 0.9 +- tiny deltas (confidence threshold), and
  rows tuned to a target entropy (entropy bound and stop-check boundaries).
- "cases": per case, the schedule temperature of (cur_step, steps), processed = raw / t as the
  engine does, and the reference's argmax, _diffusion_sample_canvas at temperatures 0 / 0.7 / 1 /
  1.5 (seeded), token probabilities, token entropy, the compiled entropy chain, the soft-embedding
  softmax (through _diffusion_soft_embeddings with an identity table, which is exact), confidence
  and entropy transfer masks at several thresholds and bounds.
- "schedule": _diffusion_linear_temperature values (as Python reprs) for many (cur_step, steps,
  t_min, t_max).
- "direct_masks": the two transfer-mask functions on hand-made confidence / entropy arrays (exact
  f32(0.9), neighbours, ties, NaN, batch of 2).
- "stop": _diffusion_stable_and_confident called step after step on case sequences under several
  stopping configs.
- "math": mx.exp / mx.log / mx.logsumexp on edge inputs (MLX's own exp is not libm's).
- "loops": the full stream_diffusion_generate run with a fake model whose logits are table rows
  picked from the canvas tokens or from the position alone (see _FakeModel): the canvas it was
  called with at every step, the emitted tokens and the final RNG state. This pins down how the
  pieces combine per step.
"""

import copy
import json
import pathlib
from types import SimpleNamespace

import mlx.core as mx
import numpy as np

from optiq.vlm._mlxvlm.generate import diffusion as D

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "goldens"

V = 512
STEPS = 48
T_MIN, T_MAX = 0.4, 0.8
SAMPLE_TEMPERATURES = [0.0, 0.7, 1.0, 1.5]
CONF_THRESHOLDS = [0.9, 0.5, 0.99]
ENTROPY_BOUNDS = [0.1, 0.0, 0.5, 2.0]
PROBE_COLUMNS = [0, 257, 511]
NEAR_DELTAS = [-3e-3, -1e-4, -1e-6, 0.0, 1e-6, 1e-4, 3e-3]
EOS = [1, 106]


def schedule(cur_step, steps=STEPS, t_min=T_MIN, t_max=T_MAX):
    return D._diffusion_linear_temperature(cur_step, steps, {"t_min": t_min, "t_max": t_max})


class Table:
    """The float32 logits table, grown row by row with a seeded generator."""

    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)
        self.rows = []
        self.kinds = []

    def add(self, row, kind):
        self.rows.append(np.asarray(row, dtype=np.float32))
        self.kinds.append(kind)
        return len(self.rows) - 1

    def base(self, sigma=1.5):
        return self.rs.normal(0.0, sigma, V).astype(np.float64)

    def peaked(self, gap, top=None, sigma=1.5):
        b = self.base(sigma)
        top = self.rs.randint(V) if top is None else top
        b[top] = np.max(b) + gap
        return self.add(b, f"peaked gap {gap:.3g} top {top}")

    def tie(self, gap):
        b = self.base()
        i, j = sorted(self.rs.choice(V, 2, replace=False))
        b[i] = b[j] = np.max(b) + gap
        return self.add(b, f"tie at {i} and {j}")

    def tuned(self, t, target, quantity):
        """A peaked row whose top probability or entropy at temperature t is `target`."""
        b = self.base()
        top = self.rs.randint(V)
        rest = np.max(np.delete(b, top))

        def measure(gap):
            x = b.copy()
            x[top] = np.float32(rest + gap)
            z = x.astype(np.float32).astype(np.float64) / t
            z -= z.max()
            p = np.exp(z) / np.exp(z).sum()
            if quantity == "confidence":
                return p[top]
            return -(p * np.log(np.maximum(p, 1e-300))).sum()

        lo, hi = 0.0, 60.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            # confidence grows with the gap, entropy shrinks
            if (measure(mid) < target) == (quantity == "confidence"):
                lo = mid
            else:
                hi = mid
        b[top] = np.float32(rest + 0.5 * (lo + hi))
        return self.add(b, f"{quantity} {target:.8g} at t {t:.6g}, top {top}")


def main():
    assert mx.__version__ == "0.32.4", mx.__version__
    mx.set_default_device(mx.cpu)
    tensors = {}

    def put(name, arr):
        assert name not in tensors, name
        tensors[name] = arr
        return name

    tab = Table(20260802)
    peaked = [tab.peaked(g) for g in np.linspace(1.0, 14.0, 40)]
    flat = [tab.add(tab.base(0.7), "flat") for _ in range(6)]
    ties = [tab.tie(g) for g in (0.5, 3.0, 8.0, 20.0)]
    very = [tab.peaked(45.0 + i) for i in range(6)]
    eos_rows = [tab.peaked(9.0 + i, top=EOS[i % 2]) for i in range(3)]
    near = {}
    for cur in (48, 24, 2):
        t = schedule(cur)
        near[cur] = [tab.tuned(t, 0.9 + d, "confidence") for d in NEAR_DELTAS]
    ent_cur = 40
    ent_rows = {e: tab.tuned(schedule(ent_cur), e, "entropy") for e in (0.02, 0.025, 0.05)}
    stop_steps = list(range(10, 0, -1))
    stop_rows = [tab.tuned(schedule(c, 10), 0.005, "entropy") for c in (9, 6, 3)]
    table = np.stack(tab.rows)
    put("table", mx.array(table))
    R = len(tab.rows)

    rs = np.random.RandomState(7)
    cases = []

    def add_case(name, rows, cur_step, steps=STEPS, unrevealed=None, full=False):
        L = len(rows)
        if unrevealed is None:
            unrevealed = rs.uniform(size=L) < 0.7
        cases.append(dict(name=name, rows=[int(r) for r in rows], cur_step=cur_step, steps=steps,
                          unrevealed=[bool(u) for u in unrevealed], full=full))
        return len(cases) - 1

    def mixed(L, cur_step):
        pool = peaked * 3 + flat + ties + very + eos_rows + near.get(cur_step, [])
        rows = list(rs.choice(pool, L))
        for _ in range(L // 8):  # duplicated rows: exact ties in entropy and confidence
            rows[rs.randint(L)] = rows[rs.randint(L)]
        return rows

    for seed, cur in enumerate([48, 36, 24, 12, 5, 2]):
        add_case(f"mixed16_cur{cur}", mixed(16, cur), cur, full=(seed == 0))
    for cur in (47, 20, 3):
        add_case(f"mixed64_cur{cur}", mixed(64, cur), cur)
    for cur, rows in near.items():
        low = list(rs.choice(peaked[:12], 16 - len(rows)))
        add_case(f"near_threshold_cur{cur}", rows + low, cur, unrevealed=[True] * 16)
        add_case(f"near_threshold_cur{cur}_some_revealed", low + rows, cur,
                 unrevealed=[i % 3 != 0 for i in range(16)])
    for e, row in ent_rows.items():
        others = list(rs.choice(peaked, 8))
        add_case(f"entropy_bound_{e}", [row] * 8 + others, ent_cur)
    mix_ent = [ent_rows[0.02]] * 3 + [ent_rows[0.025]] * 2 + [ent_rows[0.05]] * 3
    add_case("entropy_bound_mix", mix_ent + list(rs.choice(flat, 8)), ent_cur)
    forced = [flat[0]] * 8 + [flat[1]] * 8
    add_case("forced_pick_tie", forced, 30, unrevealed=[True] * 16)
    add_case("forced_pick_first_revealed", forced, 30, unrevealed=[i != 0 for i in range(16)])
    add_case("all_revealed", mixed(16, 30), 30, unrevealed=[False] * 16)
    add_case("one_unrevealed", mixed(16, 30), 30, unrevealed=[i == 9 for i in range(16)])

    # stop-check trajectories (steps = 10): a list of case indices per trajectory
    stable_rows = list(rs.choice(very, 16))
    other_rows = list(stable_rows)
    other_rows[5] = very[(very.index(stable_rows[5]) + 1) % len(very)]
    traj_stable = [add_case(f"stop_stable_cur{c}", stable_rows, c, steps=10)
                   for c in stop_steps[:5]]
    traj_flip = [
        add_case(f"stop_flip_cur{c}", other_rows if c == 8 else stable_rows, c, steps=10)
        for c in stop_steps[:6]
    ]
    # one row, 16 times, whose entropy crosses 0.005 at step 9, 6 or 3
    traj_near = [[add_case(f"stop_near{k}_cur{c}", [r] * 16, c, steps=10) for c in stop_steps]
                 for k, r in enumerate(stop_rows)]
    traj_mixed = [add_case(f"stop_mixed_cur{c}", mixed(16, c), c, steps=10)
                  for c in stop_steps[:4]]

    eye = mx.eye(V)
    for i, case in enumerate(cases):
        raw = mx.array(table[case["rows"]])
        t = schedule(case["cur_step"], case["steps"])
        case["temperature"] = repr(t)
        processed = raw[None] / t  # exactly `processed_logits / schedule_temperature`
        argmax = mx.argmax(processed, axis=-1).astype(mx.int32)
        tokens = [argmax]
        case["sample_seeds"] = []
        case["sample_states"] = []
        for tau in SAMPLE_TEMPERATURES:
            seed = 7919 * i + 17
            mx.random.seed(seed)
            s = D._diffusion_sample_canvas(processed, mx.int32, tau)
            mx.eval(s)
            tokens.append(s)
            case["sample_seeds"].append(seed)
            case["sample_states"].append([int(v) for v in np.array(mx.random.state[0])])
        unrevealed = mx.array(case["unrevealed"])[None]
        values, masks = [], []
        for denoiser in (argmax, tokens[2]):  # argmax, and the sample at temperature 0.7
            conf = D._diffusion_token_probability(processed, denoiser)
            values.append(conf)
            for thr in CONF_THRESHOLDS:
                for force_all in (False, True):
                    masks.append(D._diffusion_confidence_transfer_mask(
                        conf, unrevealed, thr, force_all=force_all))
        entropy = D._diffusion_token_entropy(processed)
        probs, chain_entropy = D._diffusion_entropy_probs_chain(processed.astype(mx.float32))
        assert mx.array_equal(chain_entropy, entropy).item()
        ent2, soft_chain = D._diffusion_entropy_and_soft_embeddings(processed, eye, 1.0)
        assert mx.array_equal(soft_chain, probs).item() and mx.array_equal(ent2, entropy).item()
        soft = D._diffusion_soft_embeddings(processed, eye, 1.0)
        assert mx.array_equal(soft, mx.softmax(processed, axis=-1, precise=True)).item()
        values += [entropy, mx.logsumexp(processed, axis=-1)]
        probes = []
        for pr in (probs, soft):
            values.append(mx.sum(pr, axis=-1))
            values.append(mx.take_along_axis(pr, argmax[..., None], -1)[..., 0])
            probes.append(pr[0][:, PROBE_COLUMNS])
        for b in ENTROPY_BOUNDS:
            masks.append(D._diffusion_entropy_transfer_mask(entropy, b))
        p = f"c{i}/"
        put(p + "tokens", mx.concatenate(tokens, axis=0))
        put(p + "values", mx.concatenate(values, axis=0))
        put(p + "masks", mx.concatenate(masks, axis=0).astype(mx.int32))
        put(p + "probes", mx.stack(probes))
        if case["full"]:
            put(p + "processed", processed[0])
            put(p + "chain_probs", probs[0])
            put(p + "softmax_probs", soft[0])

    # stop check: decisions per step, per config
    stop_configs = [
        None,
        {"stability_threshold": 1, "confidence_threshold": 0.005},
        {"stability_threshold": 2, "confidence_threshold": 0.005},
        {"stability_threshold": 0, "confidence_threshold": 0.005},
        {"stability_threshold": 1, "confidence_threshold": 1e-30},
        {"stability_threshold": 3, "confidence_threshold": 3.0},
        {},  # a config without keys: the reference's defaults
    ]
    stop = []
    trajectories = [("stable", traj_stable), ("flip", traj_flip), ("mixed", traj_mixed)]
    trajectories += [(f"near{k}", traj) for k, traj in enumerate(traj_near)]
    for tname, traj in trajectories:
        for cfg in stop_configs:
            history = []
            decisions = []
            for ci in traj:
                case = cases[ci]
                processed = mx.array(table[case["rows"]])[None] / float(case["temperature"])
                argmax = mx.argmax(processed, axis=-1).astype(mx.int32)
                decisions.append(bool(D._diffusion_stable_and_confident(
                    argmax, processed, history, cfg)))
            stop.append({"trajectory": tname, "cases": traj, "config": cfg,
                         "decisions": decisions})

    # schedule values
    sched = []
    for steps, t_min, t_max in ((48, 0.4, 0.8), (10, 0.4, 0.8), (7, 0.1, 1.3), (12, 0.5, 0.5),
                                (64, 0.8, 0.4), (3, 0.0, 1.0)):
        for cur in range(1, steps + 1):
            sched.append({"cur_step": cur, "steps": steps, "t_min": t_min, "t_max": t_max,
                          "value": repr(schedule(cur, steps, t_min, t_max))})

    # transfer masks on hand-made inputs
    f9 = float(np.float32(0.9))
    below = float(np.nextafter(np.float32(0.9), np.float32(0)))
    above = float(np.nextafter(np.float32(0.9), np.float32(1)))
    nan = float("nan")
    direct = []
    conf_inputs = [
        ([[f9, below, above, 0.5, 0.3, 0.95, 0.2, 0.1],
          [0.2, 0.7, 0.7, 0.1, 0.95, 0.7, 0.3, below]],
         [[1, 1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 1, 1, 1]]),
        ([[below, below, 0.3, 0.2, 0.1, 0.0, 0.05, below],
          [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]],
         [[0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]]),
        ([[nan, 0.5, 0.6, 0.6, 0.1, 0.2, 0.3, 0.4],
          [0.5, nan, 0.95, 0.1, 0.1, 0.1, 0.1, 0.1]],
         [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1, 1, 1]]),
        ([[0.0] * 8, [1.0] * 8], [[1] * 8, [1] * 8]),
    ]
    for ci, (conf, unrev) in enumerate(conf_inputs):
        c = mx.array(np.array(conf, dtype=np.float32))
        u = mx.array(np.array(unrev, dtype=bool))
        cname = put(f"direct_conf_{ci}", c)
        for thr in (0.9, f9, below, 0.5, 1.0, 0.0):
            for force_all in (False, True):
                m = D._diffusion_confidence_transfer_mask(c, u, thr, force_all=force_all)
                direct.append({"kind": "confidence", "input": cname, "unrevealed": unrev,
                               "threshold": repr(thr), "force_all": force_all,
                               "out": put(f"direct_cmask_{len(direct)}", m.astype(mx.int32))})
    f05 = float(np.float32(0.05))
    ent_inputs = [
        [[0.05] * 8, [f05, f05, f05, 0.3, 0.0, 0.0, 0.06, 0.01]],
        [[0.02, 0.03, 0.06, 0.9, 0.01, 0.01, 0.5, 0.0], [1.0] * 8],
        [[0.0, -0.0, 0.0, 0.1, 0.1, 0.0, 2.0, 0.1], [nan, 0.01, 0.02, nan, 0.03, 0.04, 0.0, 5.0]],
        [[0.025] * 16],
        [[0.02] * 16],
    ]
    for ei, ent in enumerate(ent_inputs):
        e = mx.array(np.array(ent, dtype=np.float32))
        ename = put(f"direct_entropy_{ei}", e)
        for b in (0.1, 0.05, 0.0, 0.3, 1.0):
            m = D._diffusion_entropy_transfer_mask(e, b)
            direct.append({"kind": "entropy", "input": ename, "bound": repr(b),
                           "out": put(f"direct_emask_{len(direct)}", m.astype(mx.int32))})

    # MLX elementwise math on edge inputs
    special = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 88.0, 88.00001, -88.0, -88.00001, -87.5, -87.3,
               -87.0, 87.9, 1e-8, -1e-8, 1e-30, 20.0, -20.0, float("inf"), float("-inf"), nan]
    # x * log2(e) within one ulp of k + 0.5: where the double-precision rounding of MLX matters
    for k in range(-126, 127, 7):
        y = np.float32(k + 0.5)
        for d in (-2, -1, 0, 1, 2):
            yy = np.float32(y)
            for _ in range(abs(d)):
                yy = np.nextafter(yy, np.float32(np.sign(d) * np.inf))
            special.append(float(np.float32(yy / np.float32(1.442695))))
    rs_m = np.random.RandomState(11)
    xs = np.concatenate([np.array(special, dtype=np.float32),
                         rs_m.uniform(-90, 90, 2000).astype(np.float32),
                         rs_m.uniform(-1, 0, 2000).astype(np.float32),
                         -np.abs(rs_m.standard_cauchy(1000)).astype(np.float32)])
    x = mx.array(xs)
    put("math_x", x)
    put("math_exp", mx.exp(x))
    pos = mx.array(np.concatenate([
        np.array([1.0, 2.0, 0.5, 1e-30, 1e-40, 3.4e38, 0.0, float("inf")], dtype=np.float32),
        rs_m.uniform(0, 1, 2000).astype(np.float32),
        np.exp(rs_m.uniform(-80, 80, 2000)).astype(np.float32)]))
    put("math_log_x", pos)
    put("math_log", mx.log(pos))
    lse_in = mx.array(rs_m.normal(0, 5, (16, 512)).astype(np.float32))
    put("math_lse_x", lse_in)
    put("math_lse", mx.logsumexp(lse_in, axis=-1))

    loop_rows = peaked + very + ties + eos_rows[:1]
    loops = run_loops(table, loop_rows, put)

    OUT.mkdir(parents=True, exist_ok=True)
    mx.eval(list(tensors.values()))
    mx.save_safetensors(str(OUT / "sampler.safetensors"), tensors,
                        metadata={"generator": "tools/reference/dump_sampler_goldens.py",
                                  "mlx": mx.__version__})
    doc = {
        "generator": "tools/reference/dump_sampler_goldens.py",
        "mlx": mx.__version__,
        "vocab": V,
        "table": "table",
        "table_rows": R,
        "table_kinds": tab.kinds,
        "probe_columns": PROBE_COLUMNS,
        "case_layout": {
            "tokens": ["argmax"] + [f"sample at temperature {t}" for t in SAMPLE_TEMPERATURES],
            "sample_temperatures": SAMPLE_TEMPERATURES,
            "values": ["confidence of argmax", "confidence of sample at 0.7", "token entropy",
                       "logsumexp", "chain probs row sum", "chain probs at argmax",
                       "softmax row sum", "softmax at argmax"],
            "masks": [f"confidence mask of {d}, threshold {t}, force_all {f}"
                      for d in ("argmax", "sample at 0.7") for t in CONF_THRESHOLDS
                      for f in (False, True)]
            + [f"entropy mask, bound {b}" for b in ENTROPY_BOUNDS],
            "conf_thresholds": CONF_THRESHOLDS,
            "entropy_bounds": ENTROPY_BOUNDS,
            "probes": "[chain probs, softmax probs] x rows x probe_columns",
        },
        "cases": cases,
        "schedule": sched,
        "direct_masks": direct,
        "stop": stop,
        "loop_rows": [int(r) for r in loop_rows],
        "loops": loops,
    }
    (OUT / "sampler.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    size = (OUT / "sampler.safetensors").stat().st_size
    print(f"wrote {len(tensors)} tensors ({size} bytes), {len(cases)} cases, {R} table rows, "
          f"{len(stop)} stop trajectories, {len(direct)} direct masks, {len(loops)} loops")


# --------------------------------------------------------------------------------------------
# The whole denoising loop with a fake model


class _Detokenizer:
    emitted = []

    def reset(self):
        pass

    def add_token(self, token, skip_special_token_ids=None):
        _Detokenizer.emitted.append(int(token))

    @property
    def last_segment(self):
        return ""

    def finalize(self):
        pass


class _FakeModel:
    """Logits of canvas position l: table row LOOP_ROWS[k], with k = (7 * token + 3 * l) % K
    ("token" mode, the row follows the canvas) or k = (3 * l + 11 * block) % K ("position" mode,
    the canvas is ignored, so argmax canvases repeat and the stop check can fire). `block`
    counts encoder calls from 0. Ignores everything else (self-conditioning included)."""

    def __init__(self, table, loop_rows, mode, canvas_length, generation_config):
        self.table = mx.array(table)
        self.loop_rows = np.array(loop_rows)
        self.mode = mode
        self.block = -1
        self.calls = []
        text_config = SimpleNamespace(vocab_size=table.shape[1])
        self.config = SimpleNamespace(canvas_length=canvas_length, text_config=text_config,
                                      generation_config=generation_config)
        decoder = SimpleNamespace(
            embed_tokens=SimpleNamespace(weight=mx.zeros((table.shape[1], 4))),
            embed_scale=1.0,
            _make_decoder_masks=lambda *args, **kwargs: None,
        )

        def encoder(input_ids, attention_mask=None, cache=None, **kwargs):
            self.block += 1
            return None, cache

        self.model = SimpleNamespace(decoder=decoder, encoder=encoder)

    def make_cache(self, **kwargs):
        return []

    def __call__(self, cache=None, canvas_ids=None, decoder_attention_mask=None, **kwargs):
        ids = np.array(canvas_ids)[0].astype(np.int64)
        self.calls.append([int(v) for v in ids])
        pos = np.arange(ids.shape[0])
        k = len(self.loop_rows)
        if self.mode == "token":
            index = (7 * ids + 3 * pos) % k
        else:
            index = (3 * pos + 11 * self.block) % k
        return SimpleNamespace(logits=self.table[mx.array(self.loop_rows[index])][None])


def run_loops(table, loop_rows, put):
    loops = []
    stop_cfg = {"diffusion_stopping_config": {"stability_threshold": 1,
                                              "confidence_threshold": 1.0}}
    for sampler in ("entropy-bound", "confidence-threshold"):
        for temperature in (0.0, 0.8):
            for mode in ("token", "position"):
                for gen_cfg in (None, stop_cfg):
                    for seed in (0, 1):
                        model = _FakeModel(table, loop_rows, mode, 16, copy.deepcopy(gen_cfg))
                        tokenizer = SimpleNamespace(stopping_criteria=lambda t: int(t) in EOS)
                        processor = SimpleNamespace(detokenizer=_Detokenizer())
                        _Detokenizer.emitted = []
                        prompt = mx.array([[2, 10, 20, 30]], dtype=mx.int32)
                        mx.random.seed(seed)
                        results = list(D.stream_diffusion_generate(
                            model, processor, tokenizer, prompt, None, None,
                            max_tokens=40, skip_special_token_ids=[], temperature=temperature,
                            max_denoising_steps=10, diffusion_min_canvas_length=8,
                            diffusion_sampler=sampler, diffusion_threshold=0.9))
                        final = results[-1]
                        loops.append({
                            "sampler": sampler, "temperature": temperature, "mode": mode,
                            "seed": seed, "generation_config": gen_cfg, "canvas_length": 16,
                            "min_canvas": 8, "max_tokens": 40, "steps": 10, "threshold": 0.9,
                            "entropy_bound": 0.1, "eos": EOS, "calls": model.calls,
                            "emitted": list(_Detokenizer.emitted),
                            "generation_tokens": final.generation_tokens,
                            "finish_reason": final.finish_reason,
                            "state_after": [int(v) for v in np.array(mx.random.state[0])],
                        })
    return loops


if __name__ == "__main__":
    main()
