"""The link emulator's virtual clock (`apps.bench --edge --link-clock virtual`) charges exactly
the waits that sleeping would, and the bench's adaptive-vs-best-fixed-K interval."""

import time

import numpy as np

from apps.bench.edge import adaptive_vs_fixed
from devices.links import emulator
from runtime.backends import load_model
from runtime.decoding import make_steps, stream
from runtime.decoding.events import GREEDY
from runtime.edge.client import Connection

PROMPT = [11, 42, 7, 99, 5, 250]


def test_virtual_wait_adds_seconds_and_does_not_sleep():
    em = emulator("wifi-weak", seed=3, virtual=True)
    t0 = time.perf_counter()
    em.wait(5.0)
    em.wait(2.5)
    assert time.perf_counter() - t0 < 1.0  # 7.5 s of link time were not slept
    assert em.virtual_s == 7.5


def test_virtual_clock_charges_each_exchange_what_a_sleeping_link_would(tiny_dir, verifier):
    target = load_model(tiny_dir("qwen3"), "torch", threads=1)
    draft = load_model(tiny_dir("qwen3", num_layers=1, hidden_size=32, seed=7), "onnx")
    st = verifier(target)
    runs = {}
    for virtual in (False, True):
        em = emulator("5g", seed=1, virtual=virtual)
        conn = Connection(st.host, st.port, link=em)
        steps = make_steps(
            "flexspec", None, draft, PROMPT, max_new=6, sampling=GREEDY, seed=0, conn=conn, k=2
        )
        out = list(stream(steps, max_new=6, eos_ids=()))
        tokens = [t for toks, _ in out for t in toks]
        rounds = [ev.extra["edge"] for _, ev in out]
        # the same fading draws and frames: the same emulated waits per round
        expect = [em.link.rtt_s / 2 + 8 * x["bytes_up"] / x["rate_bps"] for x in rounds]
        assert all(x["uplink_s"] >= e for x, e in zip(rounds, expect, strict=True))
        runs[virtual] = (tokens, [x["rate_bps"] for x in rounds], em)
        conn.close()
    assert runs[True][:2] == runs[False][:2]
    n_requests = 1 + 1 + len(runs[True][1]) + 1  # HELLO, OPEN, each VERIFY round, CLOSE
    rtt = runs[True][2].link.rtt_s
    assert runs[True][2].virtual_s >= n_requests * rtt  # every request waited RTT/2 each way
    assert runs[False][2].virtual_s == 0.0


def test_an_edge_run_over_a_known_link_primes_k_star_with_its_codecs_row_size(tiny_dir, verifier):
    """ids and raw rows have one size (FIXED_ROWS), so over an emulated link the edge loop gives
    K* that size, the round trip and E[1/R] before round one (AdaptiveK.expect_rows); the
    compressed codecs' rows depend on q and give no such prior."""
    from devices.kstar import AdaptiveK
    from runtime.edge.codecs import CODEC_MODULES, codec

    assert {n for n in CODEC_MODULES if getattr(codec(n), "FIXED_ROWS", False)} == {"ids", "raw"}
    target = load_model(tiny_dir("qwen3"), "torch", threads=1)
    draft = load_model(tiny_dir("qwen3", num_layers=1, hidden_size=32, seed=7), "onnx")
    st = verifier(target)
    conn = Connection(st.host, st.port, link=emulator("wifi-weak", seed=1, virtual=True))
    ctl = AdaptiveK(k_min=0)
    steps = make_steps(
        "flexspec",
        None,
        draft,
        PROMPT,
        max_new=4,
        sampling=GREEDY,
        seed=0,
        conn=conn,
        controller=ctl,
    )
    list(stream(steps, max_new=4, eos_ids=()))
    conn.close()
    assert ctl.primed and ctl.history


def _runs(ms):
    """Synthetic bench records: ms[method] = per-prompt ms/token (10 tokens each)."""
    return [
        {"temp": 1.0, "link": "4g", "prompt": p, "method": m, "tokens": 10, "wall_s": v / 100}
        for m, vals in ms.items()
        for p, v in enumerate(vals)
    ]


def test_adaptive_vs_fixed_ratio_and_interval():
    rng = np.random.default_rng(0)
    base = rng.uniform(300, 700, size=40)  # prompts differ a lot; methods differ by a factor
    ms = {"k1": base * 1.5, "k3": base * 1.0, "k5": base * 1.2, "adaptive": base * 1.1}
    (row,) = adaptive_vs_fixed(_runs(ms), resamples=500)
    assert row["best_fixed"] == "k3"
    assert abs(row["ratio"] - 1.1) < 1e-9
    lo, hi = row["ci95"]
    assert lo <= 1.1 <= hi and hi - lo < 1e-6  # paired: prompt-to-prompt spread cancels
    noisy = dict(ms, adaptive=base * rng.uniform(0.8, 1.4, size=40))
    (row,) = adaptive_vs_fixed(_runs(noisy), resamples=500)
    lo, hi = row["ci95"]
    assert lo < row["ratio"] < hi and hi - lo > 0.02


def test_adaptive_k0_is_judged_against_cloud_only_too():
    """adaptive-k0 (eq. (11) over K ≥ 0) counts cloud-only (K = 0) among the fixed K; the
    paper's adaptive is judged against K ≥ 1 only."""
    ms = {"cloud-only": [300.0, 320.0], "k1": [900.0, 950.0], "k3": [2000.0, 2100.0],
          "adaptive": [950.0, 990.0], "adaptive-k0": [310.0, 330.0]}  # fmt: skip
    rows = {r["method"]: r for r in adaptive_vs_fixed(_runs(ms), resamples=0)}
    assert rows["adaptive"]["best_fixed"] == "k1"
    assert rows["adaptive-k0"]["best_fixed"] == "cloud-only"
    assert abs(rows["adaptive-k0"]["ratio"] - 640 / 620) < 1e-9


def test_keep_share_uses_only_the_prompts_both_runs_hold():
    from apps.bench.studies.edge_keep import keep_shares

    def runs(ms_cloud, ms_adapt):  # {link: {method: {prompt: (wall_s, tokens)}}}, 10 tokens
        return {
            "4g": {
                "cloud-only": {p: (v / 100, 10) for p, v in enumerate(ms_cloud)},
                "adaptive": {p: (v / 100, 10) for p, v in enumerate(ms_adapt)},
            }
        }

    t0 = runs([600, 600], [200, 200])  # 3x on prompts 0-1
    t1 = runs([600, 600, 600], [240, 240, 60])  # 2.5x on 0-1; an easy extra prompt 2
    (row,) = keep_shares(t1, t0, resamples=200)
    assert row["prompts"] == 2 and abs(row["share"] - 2.5 / 3) < 1e-9  # prompt 2 not counted
    assert abs(row["ci95"][0] - 2.5 / 3) < 1e-9 and abs(row["ci95"][1] - 2.5 / 3) < 1e-9
