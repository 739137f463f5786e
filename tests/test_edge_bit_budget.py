"""SQS §4's per-batch uplink bit budget B in the edge loop (--bit-budget): every round's body
bits stay within B and, for K-SQS (a fixed row cost), the round is as long as B allows
(L^t = max{L : sum b_n <= B}, capped by --k-max); greedy runs still equal ar, sampled runs
keep the target's joint law (chi-square, tests/test_edge_codecs.py's pattern); C-SQS's
threshold takes no eq. (8) step for a row the budget stopped; bad flags exit 2 in one line."""

import numpy as np
import pytest
from edge_helpers import ar_tokens, edge_bench_json
from test_edge_codecs import ALPHA, COARSE, N_GOF, gof_pair  # noqa: F401 (fixture)
from test_edge_flexspec import GOF_PROMPT, SAMPLING, exact_joint, gof_pvalue
from test_ss_draft import OracleStreams, ss_dirs  # noqa: F401 (fixture)

from kernels.payload_sqs import row_bits
from runtime.backends import load_model
from runtime.decoding import Sampling, make_steps
from runtime.decoding.events import GREEDY
from runtime.decoding.sd import draft_window
from runtime.edge.client import Connection
from runtime.edge.codecs import codec, new_encoder
from runtime.edge.loop import edge_summary

PROMPT = [11, 42, 7, 99, 5, 250]


def rounds(conn, draft, n, sampling=GREEDY, seed=0, prompt=PROMPT, **opts):
    """(tokens, the run's stats.edge) of one flexspec run."""
    evs = list(
        make_steps(
            "flexspec",
            None,
            draft,
            prompt,
            max_new=n,
            sampling=sampling,
            seed=seed,
            conn=conn,
            **opts,
        )
    )
    return [t for ev in evs for t in ev.tokens], edge_summary(evs)


@pytest.fixture(scope="module")
def small_pair(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "torch", threads=1)
    draft = load_model(tiny_dir("qwen3", num_layers=1, hidden_size=32, seed=7), "onnx")
    return target, draft


@pytest.mark.parametrize(
    "name, params, budget",
    [
        ("k-sqs", {"k": 4, "ell": 100}, 200),
        ("c-sqs", {"ell": 100, "alpha": 0.0005, "eta": 0.001, "beta": 0.02}, 120),
    ],
)
@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_rounds_stay_within_the_budget(small_pair, verifier, name, params, budget, temp):
    target, draft = small_pair
    st = verifier(target)
    v = draft.config.vocab_size
    n = 20
    toks, e = rounds(
        Connection(st.host, st.port),
        draft,
        n,
        sampling=SAMPLING if temp else GREEDY,
        k_max=6,
        codec=name,
        codec_params=params,
        bit_budget=budget,
    )
    head = 8 * codec(name).encoder(v, **params).kernel.header_bytes()
    assert e["body_bits"] == [m - head for m in e["model_bits"]]
    assert all(0 <= b <= budget for b in e["body_bits"]), e["body_bits"]
    assert max(e["k"]) <= 6 and sum(len(t) for t in [toks]) == n
    if name == "k-sqs":  # a fixed row cost: L^t = min(B // b, k_max, what max_new leaves)
        b = row_bits(v, params["k"], params["ell"], variable_k=False)
        left = n
        for k, a in zip(e["k"], e["accepted"], strict=True):
            assert k == min(budget // b, 6, left - 1), (k, budget // b, left)
            left -= a + 1
    if temp == 0:
        assert toks == ar_tokens(target, PROMPT, n)


def stop_after(j):
    """A draft law that passes j rows and then ends the window (as a spent budget does)."""
    calls = []

    def law(q):
        calls.append(1)
        return None if len(calls) > j else q

    return law


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_a_law_returning_none_ends_the_window_there(ss_dirs, temp):  # noqa: F811
    """Plain and speculative-streaming drafts: the window stopped after j rows is the first j
    tokens of the full one, and the cache holds seq + d1..d(j-1), as after a window of j."""
    _, dd, ss = ss_dirs
    s = Sampling(temp)
    plain, m = load_model(dd, "torch"), load_model(ss, "torch")
    full, _ = draft_window(plain, plain.new_cache(), PROMPT, 6, s, np.random.default_rng(1))
    oracle = OracleStreams(m, {len(PROMPT) + i: t for i, t in enumerate(full)})
    for draft in (plain, m, oracle):
        for j in (0, 1, 4):
            c = (plain if draft is plain else m).new_cache()
            toks, q = draft_window(
                draft, c, PROMPT, 6, s, np.random.default_rng(1), law=stop_after(j)
            )
            assert toks == full[:j] and len(q) == j
            assert c.offset == len(PROMPT) + j - 1 or (j == 0 and c.offset <= len(PROMPT))


def test_csqs_threshold_takes_no_step_for_a_row_over_the_budget():
    v = 64
    enc = new_encoder(codec("c-sqs"), v, {"ell": 100, "beta": 0.01})
    th = enc.kernel.threshold
    enc.budget = 10**6
    q = np.random.default_rng(0).dirichlet(np.full(v, 0.2), size=3)
    assert enc.draft_law(q[0]) is not None
    first = enc.spent
    enc.budget = first + 1  # the next row cannot fit
    before = (th.beta, len(th._batch))
    assert enc.draft_law(q[1]) is None
    assert (th.beta, len(th._batch), len(enc.rows)) == (*before, 1)
    enc.encode([int(np.argmax(enc.kernel.qhat(enc.rows, v)[0]))], None, v)
    assert enc.spent == 0 and enc.last_bits - 8 * enc.kernel.header_bytes() == first
    enc.verdict(1, 1)  # Alg. 1: the batch's one row kept
    enc.budget = 10**6  # a new batch starts from zero bits spent
    assert enc.draft_law(q[1]) is not None and len(th._batch) == 1


def test_sampling_with_a_budget_matches_the_target(gof_pair, verifier):  # noqa: F811
    """C-SQS at V = 8 (rows of 11, 16, 18, 21 bits for K = 1..4) with B = 34 bits: the first row
    (K = 2 here) is sent and the second only if it has K <= 3 (about half the runs), else the
    batch ends before it is drawn; the joint law of the first two tokens of 4 stays the
    target's."""
    target, draft = gof_pair
    st = verifier(target)
    conn = Connection(st.host, st.port)
    counts, ks = np.zeros((8, 8)), []
    for i in range(N_GOF):
        toks, e = rounds(
            conn,
            draft,
            4,
            sampling=SAMPLING,
            seed=i,
            prompt=GOF_PROMPT,
            k_max=3,
            codec="c-sqs",
            codec_params=COARSE["c-sqs"],
            bit_budget=34,
        )
        counts[toks[0], toks[1]] += 1
        ks.append(e["k"][0])
    assert 0 < ks.count(1) < N_GOF, "the budget never (or always) stopped a round: no test"
    p = gof_pvalue(counts, exact_joint(target))
    assert p > ALPHA, f"c-sqs with a budget: the joint law differs from the target's (p = {p:.2e})"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--codec", "raw", "--temp", "1", "--bit-budget", "5000"], "needs --codec k-sqs or c-sqs"),
        (["--codec", "k-sqs", "--temp", "1", "--bit-budget", "0"], "at least 1 bit"),
        (["--bit-budget", "5000"], "needs --codec k-sqs or c-sqs"),
    ],
)
def test_generate_refuses_bad_budget_flags_in_one_line(capsys, argv, says):
    from runtime.generate import main

    assert main(["--method", "flexspec", "--prompt-ids", "1,2", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err, err


def test_edge_bench_budget(tmp_path, capsys):
    """apps.bench --edge --codecs k-sqs,c-sqs --bit-budget B: the runs keep within B and the plot
    has both panels; a codec other than k-sqs / c-sqs in --codecs is refused in one line."""
    from apps.bench.__main__ import main

    assert main(["--edge", "--codecs", "raw,k-sqs", "--temps", "1", "--bit-budget", "500"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs --codec k-sqs or c-sqs" in err and "\n" not in err, err
    codecs = ["--codecs", "k-sqs,c-sqs", "--ell", "100", "--sqs-k", "8"]
    budget = ["--bit-budget", "500", "--k-max", "4", "--plot", str(tmp_path / "p.html")]
    runs = edge_bench_json(
        main, tmp_path / "b.json", "--edge", "--max-tokens", "6", *codecs, *budget
    )["runs"]
    assert {r["codec"] for r in runs} == {"k-sqs", "c-sqs"}
    assert all(r["max_body_bits"] is not None and r["max_body_bits"] <= 500 for r in runs)
    html = (tmp_path / "p.html").read_text()  # SQS Fig. 2's two panels
    assert html.count("<svg") == 2 and "resampling rate" in html
