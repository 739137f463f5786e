"""Mirror's early exit coupled to the verifier's noise when sampling (runtime/mirror/coupled.py):
the Gumbel-max verification keeps speculative sampling's law, the coupled message covers the
correction far more often than eq. 7's top-κ, and the draft's ranking of the branches puts the
realised outcome early. Mirror's output law with it is tested in test_sampling_gof.py."""

import itertools
import time

import numpy as np
from scipy.stats import chisquare

from kernels.sampling import log_probs_from_logits, probs_from_logits
from kernels.topk_channel import encode, top_rows, topk_message
from kernels.verify import verify_sampling
from runtime.decoding.events import step_noise
from runtime.mirror.branches import rank_own_branches
from runtime.mirror.coupled import coupled_message, rank_coupled, rank_own_coupled


def laws(rng, g, vocab, sharp=3.0):
    """A random target law p (g+1, V), draft law q (g, V) near it, and d ~ q."""
    p = rng.dirichlet(np.full(vocab, 0.3), size=g + 1)
    q = 0.5 * p[:g] + 0.5 * rng.dirichlet(np.full(vocab, 0.3), size=g)
    p, q = p ** (sharp / 3), q
    p /= p.sum(-1, keepdims=True)
    d = [int(rng.choice(vocab, p=q[i])) for i in range(g)]
    return p.astype(np.float32), q.astype(np.float32), d


def exact_outcome_law(p, q, d):
    """P(A = a, c = x) of speculative sampling for a fixed window d."""
    g, vocab = len(d), p.shape[-1]
    law, reach = np.zeros((g + 1, vocab)), 1.0
    for a in range(g):
        acc = min(1.0, p[a, d[a]] / q[a, d[a]])
        r = np.maximum(p[a] - q[a], 0)
        law[a] = reach * (1 - acc) * r / r.sum()
        reach *= acc
    law[g] = reach * p[g]
    return law


def outcome_counts(p, q, d, n, noise_for):
    counts = np.zeros((len(d) + 1, p.shape[-1]))
    for i in range(n):
        u, gum = noise_for(i)
        a, c = verify_sampling(p, q, np.array(d), u, gum)
        counts[a, c] += 1
    return counts


def gof(counts, law):
    e = law.ravel() * counts.sum()
    big = e >= 5
    o = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
    e = np.append(e[big], e[~big].sum())
    return chisquare(o, e * o.sum() / e.sum()).pvalue


def test_gumbel_verification_keeps_speculative_samplings_law():
    p, q, d = laws(np.random.default_rng(0), g=2, vocab=6)
    law = exact_outcome_law(p, q, d)
    fresh = outcome_counts(p, q, d, 4000, lambda i: step_noise(7, i, 2, 6))
    assert gof(fresh, law) > 1e-3
    # negative control: one noise table for every draw (the noise reused, not fresh) is no law
    u0, g0 = step_noise(7, 0, 2, 6)
    stale = outcome_counts(p, q, d, 4000, lambda i: (step_noise(7, i, 2, 6)[0], g0))
    assert gof(stale, law) < 1e-3


def test_step_noise_is_keyed_by_seed_and_step():
    u, g = step_noise(3, 5, 4, 10)
    u2, g2 = step_noise(3, 5, 4, 10)
    assert u.shape == (4,) and g.table().shape == (5, 10)
    assert np.array_equal(u, u2) and np.array_equal(g.table(), g2.table())
    assert not np.array_equal(step_noise(3, 6, 4, 10)[1].table(), g.table())
    assert not np.array_equal(step_noise(4, 5, 4, 10)[1].table(), g.table())
    assert not np.array_equal(step_noise(3, 6, 4, 10)[0], u)


def test_message_rows_carry_the_own_token_then_the_proxy_gumbel_winners():
    p, q, d = laws(np.random.default_rng(1), g=3, vocab=40)
    _, gum = step_noise(0, 0, 3, 40)
    ids, logp = coupled_message(np.log(p), d, gum, 5)
    assert ids.shape == logp.shape == (4, 5)
    score = np.log(p) + gum.table()
    for j in range(3):
        assert ids[j, 0] == d[j] and len(set(ids[j].tolist())) == 5
        rest = score[j].copy()
        rest[d[j]] = -np.inf
        assert list(ids[j, 1:]) == list(np.argsort(-rest, kind="stable")[:4])
    assert list(ids[3]) == list(np.argsort(-score[3], kind="stable")[:5])
    assert np.allclose(logp, np.log(np.take_along_axis(p, ids, -1)), atol=0.02)


def test_a_one_token_message_ranks_only_the_bonus_position():
    """κ = 1: each window row carries only the draft's own token, so no correction candidate
    is left there (an empty read of the noise, which once raised in the worker: `generate
    --method mirror --temp 1 --kappa 1`); the bonus position's one candidate is its branch."""
    p, q, d = laws(np.random.default_rng(2), g=3, vocab=40)
    u, gum = step_noise(0, 1, 3, 40)
    ids, logp = coupled_message(np.log(p), d, gum, 1)
    assert ids.shape == (4, 1) and list(ids[:3, 0]) == d
    branches = rank_coupled(ids, logp, d, q, u, gum)
    assert [(b.depth, b.token) for b in branches] == [(3, int(ids[3, 0]))]


def test_top_rows_is_a_full_sort_s_head_however_the_scores_spread():
    """top_rows skips the partition of whole rows (V = 151,936 at a real vocabulary): its
    top-k must be a stable full sort's, with ties by lower id, -inf rows and scores spread far
    wider than its first window δ (it widens it)."""
    rng = np.random.default_rng(4)
    for (spread, k), V in itertools.product(
        ((1.0, 8), (40.0, 8), (1e4, 30), (0.0, 5)), (300, 9000)
    ):
        score = (rng.standard_normal((6, V)) * spread).astype(np.float32)
        score[:, 7] = score[:, 3]  # a tie: the lower id first
        score[1, : V - 10] = -np.inf  # a row with few finite scores
        score[2] = np.round(score[2])  # many ties
        want = np.argsort(-score, axis=-1, kind="stable")[:, :k]
        assert np.array_equal(top_rows(score, k), want), (spread, k, V)


def test_the_message_from_log_probs_is_the_message_from_probs():
    """mirror's target builds the message from the early exit's log-softmax (one exp pass):
    the same message as from the log of the law (top-p's cuts included)."""
    rng = np.random.default_rng(2)
    for top_p in (1.0, 0.8):
        logits = (rng.standard_normal((4, 50)) * 3).astype(np.float32)
        _, gum = step_noise(1, 2, 3, 50)
        lp = log_probs_from_logits(logits, 0.7, top_p)
        assert np.allclose(np.exp(lp), probs_from_logits(logits, 0.7, top_p), atol=1e-6)
        d = [int(x) for x in rng.integers(0, 50, 3)]
        with np.errstate(divide="ignore"):
            a = coupled_message(np.log(probs_from_logits(logits, 0.7, top_p)), d, gum, 6)
        b = coupled_message(lp, d, gum, 6)
        assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1], atol=0.02)


def test_step_noise_is_finite_standard_gumbel():
    """The field's rows: no +inf (a uniformly random winner), and the standard Gumbel's mean
    (Euler's γ) and variance (π²/6)."""
    _, g = step_noise(0, 1, 7, 50_000)
    t = g.table()
    assert np.isfinite(t).all()
    assert abs(t.mean() - 0.5772) < 0.01 and abs(t.var() - np.pi**2 / 6) < 0.02


def coverage_and_rank(proxy_of, n=300, g=3, vocab=64, kappa=8):
    """Over n random steps: how often the correction is in its row of the coupled message and
    of eq. 7's, and how often rank_coupled puts the realised (A, c) among the first 8 branches."""
    rng = np.random.default_rng(11)
    hit_c = hit_7 = early = 0
    for step in range(n):
        p, q, d = laws(rng, g, vocab)
        u, gum = step_noise(5, step, g, vocab)
        a, c = verify_sampling(p, q, np.array(d), u, gum)
        proxy = proxy_of(p, rng)
        ids, logp = coupled_message(np.log(proxy), d, gum, kappa)
        hit_c += c in ids[a]
        hit_7 += c in topk_message(np.log(proxy), kappa)[0][a]
        ranked = [(b.depth, b.token) for b in rank_coupled(ids, logp, d, q, u, gum)]
        early += (a, c) in ranked[:8]
    return hit_c / n, hit_7 / n, early / n


def test_coupled_message_covers_the_correction_that_eq7_misses():
    cov, cov7, early = coverage_and_rank(lambda p, rng: p)  # an exact proxy
    assert cov > 0.95 and cov > cov7 + 0.3, (cov, cov7)
    assert early > 0.8, early

    def noisy(p, rng):  # a proxy off by about a nat per token
        z = np.log(p) + rng.normal(0, 1.0, p.shape)
        e = np.exp(z - z.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)).astype(np.float32)

    cov, cov7, early = coverage_and_rank(noisy)
    assert cov > cov7 + 0.15, (cov, cov7)


def test_the_drafts_own_branches_coupled_to_the_noise_hold_the_outcome_more_than_its_runner_ups():
    """Before the early exit the draft has only its own law; ranked with the verifier's noise
    (rank_own_coupled) its m·(γ+1) branches hold the step's (A, c) far more often than its m
    runner-ups per position, which ignore the noise that decides the correction."""
    rng = np.random.default_rng(3)
    g, vocab, m, n = 3, 64, 2, 300
    coupled = runner = 0
    for step in range(n):
        p, q, d = laws(rng, g, vocab)
        own = np.concatenate([q, p[g:]])  # the draft's law at 0..γ (its bonus row: near p)
        u, gum = step_noise(9, step, g, vocab)
        a, c = verify_sampling(p, q, np.array(d), u, gum)
        ranked = rank_own_coupled(np.log(own), d, q, u, gum, m)
        assert len(ranked) == m * (g + 1)
        coupled += (a, c) in {(b.depth, b.token) for b in ranked}
        runner += (a, c) in {(b.depth, b.token) for b in rank_own_branches(np.log(own), d, m)}
    assert coupled / n > runner / n + 0.15, (coupled / n, runner / n)


def test_the_worker_rolls_out_its_noise_coupled_own_branches_when_sampling(tiny_dir, monkeypatch):
    """At T > 0 the own wave (begun before the early exit) rolls out rank_own_coupled's
    branches of the step's noise, not the draft's runner-ups."""
    from runtime.backends import load_model
    from runtime.decoding import Sampling
    from runtime.mirror.draft_worker import DraftWorker
    from runtime.mirror.messages import EarlyExit, FinalVerify
    from runtime.mirror.timeline import Timeline, now_ns

    prompt, gamma, seed, m = [11, 42, 7, 99, 5, 250], 3, 4, 2
    draft = load_model(tiny_dir("llama", num_layers=2, seed=11), "onnx")
    rolled = []
    waves = DraftWorker._waves

    def spy(self, step, ranked, produced, finish=False, **kw):
        if finish:
            rolled.append([(b.depth, b.token) for b in ranked])
        return waves(self, step, ranked, produced, finish, **kw)

    monkeypatch.setattr(DraftWorker, "_waves", spy)
    samp = Sampling(1.0)
    w = DraftWorker(
        draft,
        sampling=samp,
        seed=seed,
        gamma=gamma,
        max_new=100,
        ctx=256,
        timeline=Timeline(),
        draft_branches=m,
    )
    w.start(prompt)
    win = w.receive(0)
    try:
        deadline = time.time() + 10
        while not rolled:
            assert time.time() < deadline
            time.sleep(0.005)
    finally:
        ee = np.tile(np.array(win.tokens + [1], np.int32)[:, None], (1, 2))
        w.send(EarlyExit(0, encode(ee, np.zeros(ee.shape, np.float32)), now_ns()))
        w.send(FinalVerify(0, 0, 1, now_ns()))
        w.stop()
    logits = draft.forward(np.array([prompt + win.tokens]), draft.new_cache())[0, len(prompt) - 1 :]
    u, gum = step_noise(seed, 0, gamma, win.q.shape[-1])
    want = rank_own_coupled(samp.log_probs(logits), win.tokens, win.q, u, gum, m)
    assert rolled[0] == [(b.depth, b.token) for b in want]
    assert rolled[0] != [(b.depth, b.token) for b in rank_own_branches(logits, win.tokens, m)]
