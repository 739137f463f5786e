"""CU-HLM's uncertainty-aware skipping (`--skip`, runtime/edge/skip.py): LOSSY and off by
default. Eq. (13)'s bound against its plain twin; the skipped-row payload round trip; forced rows
in verification; through a real verifier, a draft is committed unverified exactly when u <= u_th,
nothing is skipped without --skip (or with a threshold below every u: then the tokens equal the
run without skipping), stats say lossy with a measured R; bad combinations are one line, exit 2.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from edge_helpers import flexspec
from test_edge_flexspec import GOF_PROMPT, SAMPLING

from kernels import cuhlm, payload_cuhlm
from kernels.bitio import MalformedPayload
from kernels.verify import verify_greedy, verify_sampling
from runtime.backends import load_model
from runtime.decoding import Sampling, make_steps, stream
from runtime.edge.client import Connection
from runtime.edge.skip import SkipRule, audit, skip_rule, skip_summary, skipped_positions
from runtime.errors import DuetError
from runtime.generate import main


@pytest.mark.parametrize("u_th", [None, 0.3, 0.95])
def test_theorem1_bound_matches_its_reference(u_th):
    rng = np.random.default_rng(0)
    u = rng.integers(0, 9, 30) / 8
    fast = cuhlm.theorem1_bound(u, 0.8, -0.07, 0.6, 8, u_th)
    ref = cuhlm.theorem1_bound_reference(u.tolist(), 0.8, -0.07, 0.6, 8, u_th)
    assert fast == pytest.approx(ref, rel=2e-3) and fast > 0
    assert cuhlm.theorem1_bound(u, 0.8, -0.07, 0.6, 8, -1.0) == 0.0  # below -b/a: nothing


def test_skipped_rows_round_trip_and_version_one_is_unchanged():
    rng = np.random.default_rng(1)
    v = 50
    x = rng.dirichlet(np.ones(v))
    codec_rows = [
        payload_cuhlm.CuRow(ids, cuhlm.quantize_probs_u8(x[ids]))
        for ids in (cuhlm.topk_ids(x, 5), cuhlm.topk_ids(x, 3))
    ]
    plain = payload_cuhlm.encode(codec_rows, [int(r.ids[0]) for r in codec_rows], v)
    assert plain[1] == payload_cuhlm.VERSION  # no skipped row: version 1 as before
    rows = [codec_rows[0], None, codec_rows[1], None]
    toks = [int(codec_rows[0].ids[0]), 49, int(codec_rows[1].ids[1]), 0]
    data = payload_cuhlm.encode(rows, toks, v)
    assert data[1] == payload_cuhlm.VERSION_SKIP
    got, q_hat, back = payload_cuhlm.decode(data, v)
    assert got.tolist() == toks and [r is None for r in back] == [False, True, False, True]
    assert q_hat[1, 49] == 1.0 and q_hat[3, 0] == 1.0  # placeholders, never tested
    nbits = payload_cuhlm.body_bits(rows, v)
    assert len(data) == payload_cuhlm.HEADER_BYTES + (nbits + 7) // 8
    assert nbits == 4 + 2 * 6 + payload_cuhlm.row_bits(v, 5) + payload_cuhlm.row_bits(v, 3)
    bad = bytearray(payload_cuhlm.encode([None], [3], 60))  # 6-bit id field: 63 > V - 1
    bad[-1] |= 0x7E
    with pytest.raises(MalformedPayload, match="outside"):
        payload_cuhlm.decode(bytes(bad), 60)


def test_forced_rows_are_accepted_whatever_the_target_says():
    p = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], np.float32)
    q = np.full((2, 3), 1 / 3, np.float32)
    d = np.array([2, 0])  # p gives both 0: always rejected unless forced
    assert verify_sampling(p, q, d, np.zeros(2), 0.5)[0] == 0
    assert verify_sampling(p, q, d, np.zeros(2), 0.5, np.array([True, False]))[0] == 1
    assert verify_sampling(p, q, d, np.zeros(2), 0.5, np.array([True, True])) == (2, 2)
    logits = np.log(p + 1e-9)
    assert verify_greedy(logits, d) == (0, 0)
    assert verify_greedy(logits, d, np.array([True, False])) == (1, 1)


@pytest.fixture(scope="module")
def pair(tiny_dir):
    kw = dict(vocab_size=8, tokenizer=False)
    target = load_model(tiny_dir("qwen3", seed=1, initializer_range=0.12, **kw), "torch", threads=1)
    draft = load_model(
        tiny_dir("qwen3", num_layers=1, seed=2, initializer_range=0.08, **kw), "onnx"
    )
    return target, draft


def run_skip(conn, draft, rule, seed=0, n=24):
    """(tokens, events) of one cu-hlm flexspec run with skip rule `rule` (None: off)."""
    steps = make_steps(
        "flexspec",
        None,
        draft,
        GOF_PROMPT,
        max_new=n,
        sampling=SAMPLING,
        seed=seed,
        conn=conn,
        k=3,
        codec="cu-hlm",
        codec_params={"k": 2},
        skip=rule,
    )
    toks, events = [], []
    for t, ev in stream(steps, max_new=n, eos_ids=draft.config.eos_token_ids):
        toks += t
        events.append(ev)
    return SimpleNamespace(tokens=toks, events=events)


def test_a_draft_is_skipped_exactly_when_its_uncertainty_is_at_most_u_th(pair, verifier):
    target, draft = pair
    st = verifier(target)
    conn = Connection(st.host, st.port)
    rule = SkipRule(u_th=0.5, m=8, theta_max=1.0)
    seen = {True: 0, False: 0}
    for seed in range(4):
        r = run_skip(conn, draft, rule, seed)
        for ev in r.events:
            e = ev.extra["edge"]
            for u, s in zip(e["u"], e["skip_flags"], strict=True):
                assert s == (u <= rule.u_th)  # eq. (10)
                seen[s] += 1
            assert len(e["skipped"]) <= sum(e["skip_flags"])  # only flagged drafts are skipped
            if not e["sent"]:
                assert e["bytes_up"] == 0 and all(e["skip_flags"])  # a window not sent
    assert seen[True] and seen[False], seen  # both sides of the threshold were exercised


def test_nothing_is_skipped_without_skip_or_below_every_u(pair, verifier):
    target, draft = pair
    st = verifier(target)
    conn = Connection(st.host, st.port)
    plain = run_skip(conn, draft, None, seed=3)
    assert all("skipped" not in ev.extra["edge"] for ev in plain.events)
    never = run_skip(conn, draft, SkipRule(u_th=-1.0, m=8), seed=3)  # u >= 0 > u_th
    assert never.tokens == plain.tokens  # the skip RNG is its own: drafting draws unchanged
    assert all(not any(ev.extra["edge"]["skip_flags"]) for ev in never.events)


def test_skip_stats_say_lossy_and_measure_the_risk(pair, verifier):
    target, draft = pair
    st = verifier(target)
    r = run_skip(Connection(st.host, st.port), draft, SkipRule(0.6, 0.5, -0.05, 0.6, 8), n=20)
    prompt = list(GOF_PROMPT)
    pos, xs = skipped_positions(r.events, len(prompt), len(r.tokens))
    betas = audit(target, prompt + r.tokens, pos, xs, SAMPLING)
    s = skip_summary(r.events, SkipRule(0.6, 0.5, -0.05, 0.6, 8), len(r.tokens), betas)
    assert s["lossy"] is True and s["skipped"] == len(pos) > 0
    assert s["skip_rate"] == pytest.approx(len(pos) / len(r.tokens))
    assert all(0.0 <= b <= 1.0 for b in betas)
    assert s["measured_risk"] == pytest.approx(sum(betas) / len(r.tokens))
    assert s["theorem1_bound"] > 0 and s["audit"].startswith("teacher-forced")
    # beta_d by hand at the first skipped position: the target's law there under SAMPLING
    logits = np.asarray(
        target.forward(np.array([(prompt + r.tokens)[: pos[0]]]), target.new_cache())
    )[0, -1]
    y = Sampling(SAMPLING.temp, SAMPLING.top_p, SAMPLING.top_k).probs(logits)
    d = (prompt + r.tokens)[pos[0]]
    assert betas[0] == pytest.approx(max(0.0, 1 - y[d] / xs[0]), rel=1e-5)


def test_skip_rule_from_theorem_1_and_its_refusals():
    r = skip_rule(1.0)
    assert r.u_th == pytest.approx(cuhlm.uncertainty_threshold(r.a, r.b, r.delta))  # eq. (12)
    assert skip_rule(0.9, 0.25).u_th == 0.25
    with pytest.raises(DuetError, match="--temp > 0"):
        skip_rule(0.0)
    with pytest.raises(DuetError, match=r"\[0, 1\]"):
        skip_rule(1.0, 1.5)


def test_skip_elsewhere_is_refused_by_the_loop(pair, verifier):
    target, draft = pair
    st = verifier(target)
    with pytest.raises(DuetError, match="--codec cu-hlm"):
        flexspec(
            Connection(st.host, st.port),
            draft,
            GOF_PROMPT,
            4,
            sampling=SAMPLING,
            k=2,
            codec="k-sqs",
            skip=SkipRule(0.5),
        )


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--codec", "raw", "--temp", "1", "--skip"], "needs --codec cu-hlm"),
        (["--temp", "1", "--skip"], "needs --codec cu-hlm"),
        (["--codec", "cu-hlm", "--skip"], "--temp > 0"),
        (["--codec", "cu-hlm", "--temp", "1", "--u-th", "0.3"], "only with --skip"),
        (["--codec", "cu-hlm", "--temp", "1", "--skip", "--u-th", "2"], "[0, 1]"),
    ],
)
def test_bad_skip_combinations_are_one_line(tiny_dir, capsys, extra, needle):
    t = tiny_dir("qwen3")
    capsys.readouterr()  # the checkpoint writer's progress bar
    argv = ["--target", str(t), "--draft", str(t), "--method", "flexspec", "--prompt", "hi"]
    rc = main(argv + extra)
    _, err = capsys.readouterr()
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_generate_json_says_lossy_with_skip(tiny_dir, capsys):
    t, d = tiny_dir("qwen3"), tiny_dir("qwen3", num_layers=1, seed=9)
    argv = ["--target", str(t), "--draft", str(d), "--method", "flexspec", "--codec", "cu-hlm",
            "--temp", "1", "--prompt", "def f(x):", "--max-tokens", "10", "--json"]  # fmt: skip
    assert main(argv + ["--skip", "--u-th", "0.9"]) == 0
    s = json.loads(capsys.readouterr()[0])["stats"]
    assert s["lossy"] is True and s["skip"]["lossy"] is True
    assert s["skip"]["u_th"] == 0.9 and s["skip"]["measured_risk"] is not None
    assert 0.0 <= s["skip"]["skip_rate"] <= 1.0
