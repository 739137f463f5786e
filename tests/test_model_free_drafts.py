"""`--draft lookup` and `--draft suffix` (runtime/drafts/) are lossless in `sd` and `tree`:
greedy output equals `ar` on tiny random checkpoints of every family, a hybrid target and the
embedded pair; at T = 1 the joint law of the first two tokens is the target's (chi-square, as
tests/test_sampling_gof.py), with negative controls that must fail; other methods refuse them
in one line."""

import numpy as np
import pytest
from test_sampling_gof import ALPHA, SAMPLING, V, exact_joint, gof_pvalue

from runtime.backends import load_model
from runtime.decoding import cannot_run, make_steps, run
from runtime.decoding import sd as sd_module
from runtime.decoding import tree_pass as tree_pass_module
from runtime.decoding.events import GREEDY
from runtime.drafts import load_model_free

PROMPT = [11, 4, 7, 9, 5, 2, 11, 4, 7, 9, 3]
N = 48
SMALL = dict(vocab_size=16, tokenizer=False)  # greedy text loops soon: drafts get accepted
DRAFTS = ("lookup", "suffix")


def gen(method, target, draft, prompt=PROMPT, n=N, sampling=GREEDY, **opts):
    steps = make_steps(method, target, draft, prompt, max_new=n, sampling=sampling, seed=0, **opts)
    return run(steps, max_new=n)


def check_lossless(target, methods=("sd", "tree")):
    ref = gen("ar", target, None).tokens
    for spec in DRAFTS:
        draft = load_model_free(spec, target)
        for method in methods:
            for opts in ({"gamma": 3}, {"gamma": 8, "top_n": 6, "depth": 8}):
                r = gen(method, target, draft, **opts)
                assert r.tokens == ref, (spec, method, opts)
                assert sum(r.stats.accept_lengths) == N
        # the random models loop, so the drafts find matches and some are accepted
        assert gen("sd", target, draft, gamma=8).stats.as_dict()["mean_accepted"] > 1.0, spec


def test_greedy_equals_ar_on_every_family(tiny_dir, arch):
    check_lossless(load_model(tiny_dir(arch, **SMALL), "torch", threads=1))


def test_greedy_equals_ar_on_a_hybrid_target(tiny_dir):
    target = load_model(tiny_dir("qwen3_5_text", seed=1, **SMALL), "torch", threads=1)
    check_lossless(target, ("sd",))


def test_greedy_equals_ar_on_the_embedded_pair():
    from runtime.loading import load_pair

    for spec in DRAFTS:
        pair = load_pair(None, spec, need_draft=True)
        ids = pair.tokenizer.encode(
            "class Point:\n    def __init__(self, x, y):\n"
            "        self.x = x\n        self.y = y\n\n"
            "class Size:\n    def __init__(self, w, h):\n"
        )
        ref = gen("ar", pair.target, None, ids, 40).tokens
        for method in ("sd", "tree"):
            r = gen(method, pair.target, pair.draft, ids, 40, gamma=6)
            assert r.tokens == ref, (spec, method)
        assert pair.settings["draft_backend"] == f"{spec} (model-free)"


def test_no_match_means_the_targets_own_step(tiny_dir):
    target = load_model(tiny_dir("llama"), "torch", threads=1)
    draft = load_model_free("suffix", target)
    steps = make_steps("sd", target, draft, [1, 2, 3, 4], max_new=1, sampling=GREEDY, seed=0)
    ev = next(steps)
    steps.close()
    assert ev.drafted == 0 and ev.tokens and ev.extra["per_step"]["draft_passes"] == 0


@pytest.mark.parametrize("method", ["mirror", "heterospec", "flexspec"])
def test_methods_needing_a_model_refuse_in_one_line(tiny_dir, method):
    target = load_model(tiny_dir("qwen3"), "torch", threads=1)
    why = cannot_run(method, target, load_model_free("lookup", target))
    assert why is not None and "--draft lookup runs none" in why and "\n" not in why


# ---- T = 1: the output law is the target's ---------------------------------------------

# "1 7" was followed by 6 and by 5 before (each with p ~ 0.3 after the prompt): chains
# propose one, trees both (as siblings)
GOF_PROMPT = [1, 7, 6, 1, 7, 5, 0, 1, 7]
GOF_N = 400


@pytest.fixture(scope="module")
def gof_target(tiny_dir):
    kw = dict(vocab_size=V, tokenizer=False, initializer_range=0.12)
    return load_model(tiny_dir("qwen3", seed=1, **kw), "mlx")


def sample_pairs(method, target, draft, n) -> tuple[np.ndarray, int]:
    counts, drafted = np.zeros((V, V)), 0
    tc, dc = target.new_cache(), draft.new_cache()
    for i in range(n):
        out = []
        for ev in make_steps(
            method,
            target,
            draft,
            GOF_PROMPT,
            max_new=3,
            gamma=2,
            top_n=4,
            depth=2,
            sampling=SAMPLING,
            seed=i,
            target_cache=tc,
            draft_cache=dc,
        ):
            out += ev.tokens
            drafted += ev.drafted
        counts[out[0], out[1]] += 1
        tc.trim(tc.offset - len(GOF_PROMPT))
    return counts, drafted


CASES = [(m, d) for m in ("sd", "tree") for d in DRAFTS]


@pytest.mark.parametrize("method,spec", CASES)
def test_law_is_the_targets_at_t1(gof_target, method, spec):
    draft = load_model_free(spec, gof_target)
    counts, drafted = sample_pairs(method, gof_target, draft, GOF_N)
    assert drafted >= GOF_N  # every first step drafted (trees: both siblings)
    p = gof_pvalue(counts, exact_joint(gof_target, prompt=GOF_PROMPT))
    assert p > ALPHA, f"{method} + {spec}: the joint law differs from the target's (p = {p:.2e})"


@pytest.mark.parametrize("method,spec", [("sd", "suffix"), ("tree", "lookup")])
def test_negative_control_correction_from_p_fails(gof_target, monkeypatch, method, spec):
    """Drawing the correction from p instead of p with the rejected token removed (a verifier
    that forgets q = δ) must break the law: the drafted token comes out too often."""
    if method == "sd":
        real = sd_module.verify_sampling

        class NoDelta:  # q_i(d_i) = 1 as before, but the residual keeps d_i
            def __init__(self, q):
                self.token_probs, self.row = q.token_probs, lambda i: np.zeros(V, np.float32)

        monkeypatch.setattr(
            sd_module, "verify_sampling", lambda p, q, d, u, r: real(p, NoDelta(q), d, u, r)
        )
    else:

        def no_residual(p, tokens, parents, u, uf, q):  # every sibling against the full p
            from kernels.sampling import sample
            from kernels.tree_mask import children_lists

            kids, node, path = children_lists(parents), -1, []
            while True:
                row = p[node + 1] / p[node + 1].sum()
                nxt = next((k for k in kids[node + 1] if u[k] < row[tokens[k]]), None)
                if nxt is None:
                    return path, int(sample(row, uf))
                path.append(nxt)
                node = nxt

        monkeypatch.setattr(tree_pass_module, "verify_tree_sampling", no_residual)
    draft = load_model_free(spec, gof_target)
    p = gof_pvalue(
        sample_pairs(method, gof_target, draft, GOF_N)[0],
        exact_joint(gof_target, prompt=GOF_PROMPT),
    )
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"


# ---- auto for a target alone (devices/model_free_choice.py) ----------------------------


@pytest.mark.parametrize("per_token,choice", [(0.2, "sd"), (1.5, "ar")])
def test_auto_alone_takes_sd_where_a_verified_token_costs_less_than_a_step(
    tiny_dir, monkeypatch, per_token, choice
):
    import devices.pair_stages as stages
    from devices.model_free_choice import choose_alone

    step = 0.05  # a one-token target step; each verified token costs per_token of it
    monkeypatch.setattr(
        stages,
        "measure_windows",
        lambda target, gammas, **k: {
            g: {"target_window": step * (1 + per_token * g)} for g in gammas
        },
    )
    target = load_model(tiny_dir("llama", **SMALL), "torch", threads=1)
    draft = load_model_free("suffix", target)
    rec = choose_alone(target, draft, PROMPT * 3)
    assert rec["choice"] == choice and rec["alone"] and rec["draft"] == "suffix"
    assert rec["verify_token_share"] == pytest.approx(per_token) and 0 < rec["draft_share"] < 0.1
    if choice == "sd":  # a token is drafted only where its chance beats its cost
        assert rec["min_prob"] == pytest.approx(per_token) == draft.min_prob
        assert rec["gamma"] == 16
        # prompt lookup's chances come from a few occurrences: its ceiling is the default γ
        assert choose_alone(target, load_model_free("lookup", target), PROMPT * 3)["gamma"] == 4


def test_auto_alone_under_sampling_measures_sd_against_ar(monkeypatch):
    """Greedy, the law's choice (sd) stands; sampling, sd runs first, ar once, then the faster
    of the two measured rates (a deterministic draft is accepted with the target's own
    probability of its token, which the draft's greedy chances overstate)."""
    import devices.model_free_choice as mfc
    from runtime.cli_args import CORRECTION_MIN_TOKENS, alone_chooser
    from runtime.decoding import Sampling

    monkeypatch.setattr(
        mfc,
        "choose_alone",
        lambda *a, **k: {"alone": True, "choice": "sd", "gamma": 16, "why": "the law"},
    )
    monkeypatch.setattr(
        mfc, "target_costs", lambda t: {"target_step_s": 0.01, "verify_token_share": 0.1}
    )

    class Pair:  # what alone_chooser reads: a target and a draft already attached
        target, draft = object(), object()

    choose = alone_chooser(Pair())
    hot, n = Sampling(1.0, 1.0), CORRECTION_MIN_TOKENS
    assert choose([1, 2], None)[0] == "sd"
    m, rec = choose([1, 2], hot)
    assert m == "sd"
    choose.observe(rec, hot, n, n / 40.0)  # sd: 40 tok/s
    m, rec = choose([1, 2], hot)
    assert m == "ar" and "once to compare" in rec["why"]
    choose.observe(rec, hot, n, n / 60.0)  # ar: 60 tok/s
    m, rec = choose([1, 2], hot)
    assert m == "ar" and "60.0" in rec["why"]
    assert choose([1, 2], Sampling(0.0, 1.0))[0] == "sd"  # greedy: the law's choice
    choose.observe(rec, hot, n, n / 90.0)  # ar slower than sd now would flip it back
    choose.observe({"choice": "sd"}, hot, n, n / 200.0)
    assert choose([1, 2], hot)[0] == "sd"


def test_auto_alone_keeps_the_targets_costs_for_the_next_process(tiny_dir, monkeypatch, tmp_path):
    """The target's step cost and cost per verified token are measured once per target and
    machine and kept (as a pair's probe is): a later chooser reads them and measures nothing;
    --reprobe measures again."""

    import devices.model_free_choice as mfc
    from runtime.cli_args import AutoOptions, alone_chooser

    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path))
    calls = []

    def costs(target):
        calls.append(target)
        return {"target_step_s": 0.02, "verify_token_share": 0.15}

    monkeypatch.setattr(mfc, "target_costs", costs)
    target = load_model(tiny_dir("llama", **SMALL), "torch", threads=1)

    class Pair:
        pass

    def chooser(reprobe=False):
        pair = Pair()
        pair.target, pair.draft = target, load_model_free("lookup", target)
        return alone_chooser(pair, AutoOptions(reprobe=reprobe, gamma_free=True))

    first = chooser()([5, 6, 7, 5, 6], None)[1]
    again = chooser()([5, 6, 7, 5, 6], None)[1]
    assert len(calls) == 1 and not first["kept"] and again["kept"]
    assert again["verify_token_share"] == first["verify_token_share"] == 0.15
    chooser(reprobe=True)([5, 6, 7, 5, 6], None)
    assert len(calls) == 2


def test_generate_with_a_target_alone_under_auto_equals_ar(tiny_dir, capsys):
    import json

    from runtime.generate import main

    t = str(tiny_dir("llama"))
    args = ["--target", t, "--prompt-ids", ",".join(map(str, PROMPT * 2)), "--max-tokens", "24",
            "--json"]  # fmt: skip
    outs = {}
    for method in ("auto", "ar"):
        assert main(args + ["--method", method]) == 0
        outs[method] = json.loads(capsys.readouterr().out)
    auto = outs["auto"]["stats"]["auto"]
    assert auto["alone"] and auto["choice"] in ("ar", "sd") and auto["draft"] == "suffix"
    assert outs["auto"]["tokens"] == outs["ar"]["tokens"]


def test_suffix_draft_proposes_from_a_corpus_file(tiny_dir, tmp_path):
    from runtime.errors import DuetError
    from runtime.tokenizer import Tokenizer

    d = tiny_dir("llama")
    target, tok = load_model(d, "torch", threads=1), Tokenizer(d)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n\nan unrelated second document")
    draft = load_model_free(f"suffix:{corpus}", target, tok)
    seq = tok.encode("I saw the quick brown fox")
    want = tok.encode("the quick brown fox jumps over the lazy dog")
    got = draft.chain(draft.new_cache(), seq, 16)
    k = len(tok.encode("the quick brown fox"))
    assert got and want[k : k + len(got)] == got  # the corpus's continuation, nothing else
    assert load_model_free("suffix", target).chain(draft.new_cache(), seq, 16) == []
    with pytest.raises(DuetError, match="no such corpus file"):
        load_model_free(f"suffix:{tmp_path / 'missing.txt'}", target, tok)
