"""flexspec through a real verifier on loopback is lossless: greedy tokens equal ar's on tiny
Llama/Qwen2/Qwen3 and the embedded pair; at T > 0 its law is the target's (chi-square, with a
negative control that sends the wrong q and must fail). Plus the K* controller's behaviour."""

import math

import numpy as np
import pytest
from edge_helpers import ar_tokens, flexspec
from test_sampling_gof import PROMPT as GOF_PROMPT  # the law, prompt and test of test_sampling_gof
from test_sampling_gof import SAMPLING, V, exact_joint, gof_pvalue

from devices.kstar import AdaptiveK
from devices.latency import FlexSpecParams
from runtime.backends import load_model
from runtime.edge.client import Connection

PROMPT = [11, 42, 7, 99, 5, 250]
N = 24


def test_greedy_flexspec_equals_ar(tiny_dir, arch, verifier):
    target = load_model(tiny_dir(arch), "torch", threads=1)
    draft = load_model(tiny_dir(arch, num_layers=1, hidden_size=32, seed=7), "onnx")
    ref = ar_tokens(target, PROMPT, N)
    st = verifier(target)
    conn = Connection(st.host, st.port)
    for opts in ({"k": 1}, {"k": 3}, {"k": 0}, {"controller": AdaptiveK()}):
        r = flexspec(conn, draft, PROMPT, N, **opts)
        assert r.tokens == ref, opts
    conn.close()
    assert st.open_sessions() == 0


def test_target_as_its_own_draft_accepts_every_window(tiny_dir, verifier):
    target = load_model(tiny_dir("qwen3"), "torch", threads=1)
    st = verifier(target)
    conn = Connection(st.host, st.port)
    r = flexspec(conn, target, PROMPT, 12, k=3)
    assert r.stats.accept_lengths == [4, 4, 4]
    assert r.tokens == ar_tokens(target, PROMPT, 12)


def test_embedded_pair_greedy_equals_ar(verifier):
    from runtime.loading import load_pair

    pair = load_pair(None, None, need_draft=True, target_backend="torch", target_threads=1)
    prompt = pair.tokenizer.encode("def fib(n):")
    st = verifier(pair.target)
    conn = Connection(st.host, st.port)
    r = flexspec(conn, pair.draft, prompt, 32, controller=AdaptiveK())
    assert r.tokens == ar_tokens(pair.target, prompt, 32)
    assert r.stats.as_dict()["acceptance_rate"] > 0  # the trained draft agrees sometimes


# --- T > 0: the joint law of the first two tokens, through the server -------------------------

N_GOF = 300
ALPHA = 1e-3


@pytest.fixture(scope="module")
def gof_pair(tiny_dir):
    kw = dict(vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = load_model(tiny_dir("qwen3", seed=1, **kw), "torch", threads=1)
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=2, **kw), "onnx")
    return target, draft


def sample_pairs(conn, draft) -> np.ndarray:
    counts = np.zeros((V, V))
    for i in range(N_GOF):
        toks = flexspec(conn, draft, GOF_PROMPT, 2, sampling=SAMPLING, seed=i, k=2).tokens
        counts[toks[0], toks[1]] += 1
    return counts


def test_sampling_through_the_server_matches_the_target(gof_pair, verifier):
    target, draft = gof_pair
    st = verifier(target)
    conn = Connection(st.host, st.port)
    p = gof_pvalue(sample_pairs(conn, draft), exact_joint(target))
    assert p > ALPHA, f"flexspec's joint law differs from the target's (p = {p:.2e})"


def test_negative_control_wrong_q_on_the_wire_fails(gof_pair, verifier, monkeypatch):
    from runtime.edge.codecs import raw

    real = raw.encode

    def wrong_q(tokens, q, vocab):  # sharpen q: not the law the tokens were drawn from
        q2 = np.asarray(q, np.float64) ** 3
        q2 = q2 / q2.sum(-1, keepdims=True) if len(q2) else q2
        return real(tokens, q2.astype(np.float32), vocab)

    monkeypatch.setattr(raw, "encode", wrong_q)
    target, draft = gof_pair
    st = verifier(target)
    conn = Connection(st.host, st.port)
    p = gof_pvalue(sample_pairs(conn, draft), exact_joint(target))
    print(f"negative control p = {p:.2e}")
    assert p < ALPHA, f"a wrong q went undetected (p = {p:.2e}); the test has no power"


# --- K* --------------------------------------------------------------------------------------


def _feed(ctl, *, rate, rtt, bytes_per_token, rounds=6, k=4, accepted=3):
    for _ in range(rounds):
        ctl.choose(8)
        up = 24 + bytes_per_token * k
        ctl.update(
            k=k,
            accepted=accepted,
            bytes_up=up,
            bytes_down=32,
            rate_bps=rate,
            draft_s=0.002 * k,
            uplink_s=rtt / 2 + 8 * up / rate,
            cloud_s=0.02,
            downlink_s=rtt / 2 + 8 * 32 / rate,
            header_bytes=24,
        )
    return ctl.choose(8)


def test_k_star_is_small_when_each_token_is_costly_to_send_and_large_when_not():
    p = FlexSpecParams(alpha_edge=0.002, beta=0.0, delta_cloud=0.0005, t_base=0.02)
    # ids (1.5 B/token) over 5G: the round trip dominates, speculate far
    assert _feed(AdaptiveK(params=p), rate=300e6, rtt=0.42, bytes_per_token=1.5) >= 6
    # raw float32 q rows of a 32k vocabulary (128 KB/token, ~0.1 s each at 10 Mbit/s) over a
    # 200 ms round trip: T_marginal / T_fixed ≈ 0.5, a short window
    assert _feed(AdaptiveK(params=p), rate=10e6, rtt=0.2, bytes_per_token=131072) <= 2


def test_k_star_follows_acceptance():
    p = FlexSpecParams(alpha_edge=0.01, beta=0.0, delta_cloud=0.005, t_base=0.02)
    hi = _feed(AdaptiveK(params=p), rate=math.inf, rtt=0.05, bytes_per_token=2, accepted=4)
    lo = _feed(AdaptiveK(params=p), rate=math.inf, rtt=0.05, bytes_per_token=2, accepted=0)
    assert lo < hi


def test_devices_latency_reports_the_ratio_k_star_2_needs():
    from devices.__main__ import latency_table
    from devices.latency import k_star

    t = latency_table("a17-pro", "wifi-weak", gamma_hat=0.8)
    r2 = t["shift"]["ratio_for_k_star_2"]
    assert k_star(1.0, r2, 0.8, 8, "geometric") <= 2 < k_star(1.0, 0.99 * r2, 0.8, 8, "geometric")
    # the ids payload (15 bits) is far below what K* = 2 would need on the weak link
    assert t["shift"]["bits_per_token_for_k_star_2"] > 1e5 * t["params"]["bits_per_token"]
    big = latency_table(
        "a17-pro", "wifi-weak", bits_per_token=t["shift"]["bits_per_token_for_k_star_2"] * 1.01
    )
    assert big["k_star"] <= 2


def test_k_star_may_choose_no_drafts_only_when_asked():
    """eq. (11) over K ≥ 0 (`k_min` 0, beyond the paper): a round that drafts nothing yields
    the cloud's own token at T_fixed; it wins where each draft costs much and is rarely kept."""
    from devices.latency import k_star

    dear = {"t_fixed": 0.1, "t_marginal": 1.0, "gamma_hat": 0.05, "k_max": 8, "model": "geometric"}
    assert k_star(**dear, k_min=0) == 0 and k_star(**dear) == 1  # the paper's range: K ≥ 1
    cheap = {**dear, "t_marginal": 0.001, "gamma_hat": 0.8}
    assert k_star(**cheap, k_min=0) == k_star(**cheap) >= 4
    p = FlexSpecParams(alpha_edge=0.002, beta=0.0, delta_cloud=0.0005, t_base=0.02)
    raw = {"rate": 10e6, "rtt": 0.2, "bytes_per_token": 1 << 20, "accepted": 0}  # 8 Mbit rows
    assert _feed(AdaptiveK(params=p, k_min=0), **raw) == 0
    assert _feed(AdaptiveK(params=p), **raw) == 1


def test_flexspec_that_stops_drafting_equals_ar(tiny_dir, verifier):
    """Rounds with K* = 0 (drafting made dear: 1 s a draft token) are the cloud's own tokens,
    and the output is still ar's."""
    target = load_model(tiny_dir("llama"), "torch", threads=1)
    draft = load_model(tiny_dir("llama", num_layers=1, hidden_size=32, seed=7), "onnx")
    st = verifier(target)
    conn = Connection(st.host, st.port)
    ctl = AdaptiveK(
        params=FlexSpecParams(alpha_edge=1.0, beta=0.0, delta_cloud=0.0, t_base=0.0), k_min=0
    )
    r = flexspec(conn, draft, PROMPT, N, controller=ctl)
    conn.close()
    assert r.tokens == ar_tokens(target, PROMPT, N)
    ks = [h["k"] for h in ctl.history]
    assert ks[0] == 4 and ks.count(0) >= N - 6  # the first round drafts; then none


def test_the_first_round_is_chosen_from_the_priors_it_has():
    """Primed with the codec's row size, the link's round trip and E[1/R] (`expect_rows`,
    `expect_link`), round one is eq. (11)'s choice, not k_first: raw 8.4 Mbit rows over a
    10 Mbit/s link draft nothing (K ≥ 0) or one token (the paper's K ≥ 1); ids over 300 Mbit/s
    with a 0.42 s round trip draft far."""
    slow = AdaptiveK(k_min=0)
    slow.expect_link(1 / 10e6)
    slow.expect_rows(262144 * 32, 0.2, 8 * 24)
    assert slow.choose(8) == 0
    paper = AdaptiveK()
    paper.expect_link(1 / 10e6)
    paper.expect_rows(262144 * 32, 0.2, 8 * 24)
    assert paper.choose(8) == 1
    fast = AdaptiveK(k_min=0)
    fast.expect_link(1 / 300e6)
    fast.expect_rows(12, 0.42, 8 * 24)
    assert fast.choose(8) >= 6
    assert AdaptiveK().choose(8) == 4  # nothing known: k_first
