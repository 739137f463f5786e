"""Mirror-SD: lossless greedy output, the §3.1 reuse rule, App. E's bound, and failure behaviour."""

import threading
import time

import numpy as np
import pytest
from decode_helpers import greedy_run, greedy_steps

from kernels.topk_channel import encode
from runtime.backends import load_model
from runtime.decoding import Sampling, make_steps, run
from runtime.decoding.events import StepEvent
from runtime.decoding.sd import draft_window
from runtime.mirror.branches import in_tree, rank_branches, rank_own_branches
from runtime.mirror.draft_worker import DraftWorker
from runtime.mirror.messages import EarlyExit, FinalVerify
from runtime.mirror.summary import mirror_summary
from runtime.mirror.timeline import Timeline, now_ns

PROMPT = [11, 42, 7, 99, 5, 250]


def mirror(target, draft, n=30, timeline=None, **kw):
    steps = make_steps(
        "mirror",
        target,
        draft,
        PROMPT,
        max_new=n,
        sampling=Sampling(kw.pop("temp", 0.0)),
        seed=0,
        timeline=timeline,
        **kw,
    )
    return run(steps, max_new=n)


def ar(target, n=30):
    return greedy_run("ar", target, None, PROMPT, n)


def no_worker_threads(wait_s: float = 5.0) -> bool:
    """No draft worker thread left, allowing a loaded machine `wait_s` to finish the join."""
    deadline = time.monotonic() + wait_s
    while any(t.name == "duet-draft" and t.is_alive() for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# own: the draft's own runner-up branches per position (draft_branches), rolled out early
@pytest.mark.parametrize(
    "gamma,kappa,exit_layer,own", [(4, 8, 2, 0), (1, 1, 1, 0), (3, 4, 3, 2), (6, 16, None, 1)]
)
def test_greedy_mirror_equals_ar(tiny_dir, arch, gamma, kappa, exit_layer, own):
    target = load_model(tiny_dir(arch), "mlx")
    ref = ar(target).tokens
    for draft in (
        load_model(tiny_dir(arch), "onnx"),
        load_model(tiny_dir(arch, num_layers=1, seed=4), "onnx"),
    ):
        r = mirror(
            target, draft, gamma=gamma, kappa=kappa, exit_layer=exit_layer, draft_branches=own
        )
        assert r.tokens == ref
    assert no_worker_threads()


def test_greedy_waves_make_no_generators_and_sampled_ones_do(tiny_dir, monkeypatch):
    """A greedy wave draws by argmax: its rows get no keyed generator (16 of them cost 0.2 ms
    a wave; the step's own window still makes one); a sampled wave's rows each get theirs."""
    import runtime.mirror.draft_worker as dw

    made = []
    real = dw.window_rng
    monkeypatch.setattr(dw, "window_rng", lambda *a: made.append(a) or real(*a))
    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx")
    r = mirror(target, draft, gamma=3, draft_branches=1)
    assert r.tokens == ar(target).tokens
    steps = len(r.stats.accept_lengths)
    assert len(made) <= steps + 1  # a step's own window at most: none per branch row
    made.clear()
    r = mirror(target, draft, gamma=3, draft_branches=1, temp=1.0)
    assert len(made) > 2 * len(r.stats.accept_lengths)  # and one per branch row


def test_target_as_its_own_draft_accepts_everything(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "mlx")
    r = mirror(target, load_model(tiny_dir("qwen3"), "onnx"), n=25, gamma=4)
    assert r.stats.accept_lengths == [5] * 5


def test_embedded_pair_greedy_equals_ar():
    from runtime.assets import default_pair
    from runtime.errors import DuetError

    try:
        tdir, ddir = default_pair()
    except DuetError:
        pytest.skip("the embedded pair is not built in this checkout")
    target = load_model(tdir, "mlx")
    draft = load_model(ddir, "onnx")
    ref = ar(target, n=40).tokens
    for gamma, kappa in ((4, 8), (2, 2)):
        assert mirror(target, draft, n=40, gamma=gamma, kappa=kappa).tokens == ref


# ---- the reuse rule (§3.1), driven through the real worker with a scripted target ----------


class Scripted:
    """Drive a DraftWorker by hand: one step with a chosen early-exit message and (A, c)."""

    def __init__(self, draft, gamma=3, draft_branches=0):
        self.draft, self.gamma = draft, gamma
        self.tl = Timeline()
        self.w = DraftWorker(
            draft,
            sampling=Sampling(),
            seed=0,
            gamma=gamma,
            max_new=100,
            ctx=256,
            timeline=self.tl,
            draft_branches=draft_branches,
        )
        self.w.start(PROMPT)
        self.win = self.w.receive(0)

    def step(self, ee_ids, a, c, wait_all=True):
        k = ee_ids.shape[1]
        logp = np.log(np.full(ee_ids.shape, 1.0 / (k + 1), np.float32))
        self.w.send(EarlyExit(0, encode(ee_ids.astype(np.int32), logp), now_ns()))
        n = len(rank_branches(ee_ids, logp, self.win.tokens))
        waves = -(-n // self.w.branch_batch)
        deadline = time.time() + 10
        while wait_all and sum(i.name.startswith("rollout") for i in self.tl.intervals) < waves:
            assert time.time() < deadline
            time.sleep(0.005)
        self.w.send(FinalVerify(0, a, c, now_ns()))
        nxt = self.w.receive(1)
        self.w.stop()
        return nxt

    def cut_short(self, settle=0.0):
        """(A = 1, c) sent while a Gate draft holds the wave with c's branch at its second pass:
        the worker's next window, and c (`settle` s are left to the worker before it stops)."""
        c = (self.win.tokens[1] + 5) % 300
        ids = ee_with(self.win.tokens, {1: [c]})
        logp = np.log(np.full(ids.shape, 0.2, np.float32))
        self.w.send(EarlyExit(0, encode(ids.astype(np.int32), logp), now_ns()))
        assert self.draft.entered.wait(10)
        self.w.send(FinalVerify(0, 1, c, now_ns()))
        self.draft.release.set()
        nxt = self.w.receive(1)
        if settle:
            time.sleep(settle)
        self.w.stop()
        return nxt, c

    def fresh(self, a, c):
        """What a fresh rollout from committed + d1..dA + c gives (greedy)."""
        seq = PROMPT + self.win.tokens[:a] + [c]
        d = getattr(self.draft, "m", self.draft)
        return draft_window(d, d.new_cache(), seq, self.gamma, Sampling(), None)[0]


def ee_with(win_tokens, extra):
    """An early-exit message: row j holds the draft's own token (if any) and `extra[j]`
    candidates."""
    rows = []
    for j in range(len(win_tokens) + 1):
        own = [win_tokens[j]] if j < len(win_tokens) else []
        cands = [v for v in extra.get(j, []) if v not in own]
        rows.append((own + cands + [t for t in range(300, 320) if t not in own + cands])[:4])
    return np.array(rows)


@pytest.fixture
def scripted(tiny_dir):
    return Scripted(load_model(tiny_dir("llama", num_layers=2, seed=11), "onnx"))


def test_reuse_when_first_token_corrected_into_top_kappa(scripted):
    c = (scripted.win.tokens[0] + 1) % 300
    nxt = scripted.step(ee_with(scripted.win.tokens, {0: [c]}), a=0, c=c)
    assert nxt.source == "reuse" and nxt.tokens == scripted.fresh(0, c)


def test_reuse_when_corrected_prefix_is_a_precomputed_path(scripted):
    c = (scripted.win.tokens[2] + 7) % 300
    nxt = scripted.step(ee_with(scripted.win.tokens, {2: [c]}), a=2, c=c)
    assert nxt.source == "reuse" and nxt.tokens == scripted.fresh(2, c)


def test_reuse_of_the_bonus_branch_when_all_accepted(scripted):
    c = 17
    nxt = scripted.step(ee_with(scripted.win.tokens, {3: [c]}), a=3, c=c)
    assert nxt.source == "reuse" and nxt.tokens == scripted.fresh(3, c)


def test_completed_branch_is_taken_at_once_and_not_sent_again(scripted):
    sc, c = scripted, (scripted.win.tokens[1] + 3) % 300
    ids = ee_with(sc.win.tokens, {1: [c]})
    logp = np.log(np.full(ids.shape, 0.2, np.float32))
    sc.w.send(EarlyExit(0, encode(ids.astype(np.int32), logp), now_ns()))
    deadline = time.time() + 10
    while (win := sc.w.take(0, 1, c)) is None:  # published when its wave's last pass ends
        assert time.time() < deadline
        time.sleep(0.002)
    # the target can run a whole step ahead of the worker: its miss on the next step's board
    # must not cancel the claim the worker has not read yet
    assert sc.w.take(1, 0, c) is None
    sc.w.send(FinalVerify(0, 1, c, now_ns()))
    while len(sc.w.seq) == len(PROMPT):  # the worker commits the branch on (A, c)
        assert time.time() < deadline
        time.sleep(0.002)
    time.sleep(0.05)
    sc.w.stop()
    assert win.source == "reuse" and win.tokens == sc.fresh(1, c)
    assert sc.w.outbox.empty()  # the target already has it: no second copy
    assert sc.w.take(0, 1, c) is None  # the board closes with the step


def test_fallback_when_correction_not_in_top_kappa(scripted):
    c = 123
    ids = ee_with(scripted.win.tokens, {})
    assert not in_tree(1, c, ids)
    nxt = scripted.step(ids, a=1, c=c)
    assert nxt.source == "fallback" and nxt.tokens == scripted.fresh(1, c)


def test_draft_runner_up_branch_is_reused_when_the_early_exit_misses_it(tiny_dir):
    """With draft branches, the worker rolls out the draft's own runner-ups while the target
    runs its prefix; a correction the early-exit top-κ does not hold is then still reused."""
    sc = Scripted(load_model(tiny_dir("llama", num_layers=2, seed=11), "onnx"), draft_branches=2)
    d = sc.draft
    logits = d.forward(np.array([PROMPT + sc.win.tokens]), d.new_cache())[0, len(PROMPT) - 1 :]
    own = rank_own_branches(logits, sc.win.tokens, 2)
    c = next(b.token for b in own if b.depth == 1)  # the draft's runner-up after d1
    deadline = time.time() + 10  # all own waves done before the early exit is sent
    while sum(i.name.startswith("rollout") for i in sc.tl.intervals) < -(-len(own) // 8):
        assert time.time() < deadline
        time.sleep(0.005)
    assert "re-run own window" in [i.name for i in sc.tl.intervals]
    ids = ee_with(sc.win.tokens, {})  # its top-κ misses c: only the draft's branch has it
    assert not in_tree(1, c, ids)
    nxt = sc.step(ids, a=1, c=c, wait_all=False)
    assert nxt.source == "reuse" and nxt.tokens == sc.fresh(1, c)


def test_own_ranking_skips_own_token_and_scores_the_draft_path():
    logits = np.log(
        np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]) + 1e-12
    )
    ranked = rank_own_branches(logits, drafts=[0, 3], m=1)
    # (0, 1): .3; (1, 2): .5 * .3 = .15; (2, 0): .5 * .4 * .7 = .14 (the bonus position, no own)
    assert [(b.depth, b.token) for b in ranked] == [(0, 1), (1, 2), (2, 0)]
    assert [round(float(np.exp(b.score)), 3) for b in ranked] == [0.3, 0.15, 0.14]
    assert len(rank_own_branches(logits, drafts=[0, 3], m=2)) == 6


@pytest.mark.parametrize("V", [50, 9000])
def test_own_ranking_reads_log_q_only_where_it_needs_it(V):
    """rank_own_branches takes the candidates from the logits' top (kernels top_rows) and
    forms log q only for them: the same branches and scores as a full log-softmax and a
    stable sort (ties: lower id first), at a narrow and a wide vocabulary."""
    from kernels.topk_channel import log_softmax

    logits = (np.random.default_rng(6).standard_normal((4, V)) * 3).astype(np.float32)
    logits[1, 5:9] = logits[1].max()  # tied candidates
    drafts = [int(logits[0].argmax()), 6, 2]
    logq = log_softmax(logits)
    want, path = [], 0.0
    for j in range(4):
        own = drafts[j] if j < 3 else None
        top = [int(v) for v in np.argsort(-logq[j], kind="stable")[:4] if v != own][:3]
        want += [(j, v, path + float(logq[j, v])) for v in top]
        path += float(logq[j, own]) if own is not None else 0.0
    got = rank_own_branches(logits, drafts, 3)
    assert sorted((b.depth, b.token) for b in got) == sorted((j, v) for j, v, _ in want)
    score = {(j, v): x for j, v, x in want}
    assert all(abs(b.score - score[(b.depth, b.token)]) < 1e-4 for b in got)


class Gate:
    """A draft that stops inside its `at`-th batched pass until the test lets it go."""

    def __init__(self, model, at):
        self.m, self.at, self.batched = model, at, 0
        self.config, self.backend, self.supports_layer_range = model.config, "test", False
        self.entered, self.release = threading.Event(), threading.Event()

    def new_cache(self, batch=1):
        return self.m.new_cache(batch)

    def forward(self, tokens, cache, **kw):
        if np.shape(tokens)[0] > 1:
            self.batched += 1
            if self.batched == self.at:
                self.entered.set()
                assert self.release.wait(10)
        return self.m.forward(tokens, cache, **kw)


def test_branch_cut_short_is_resumed_where_it_stopped(tiny_dir):
    """(A, c) arrives during the second pass of the wave holding its branch: the worker
    continues that row for the remaining tokens instead of starting over."""
    sc = Scripted(Gate(load_model(tiny_dir("llama", num_layers=2, seed=11), "onnx"), at=2))
    nxt, c = sc.cut_short()
    assert nxt.source == "resume" and nxt.tokens == sc.fresh(1, c)
    assert "resume rollout" in [i.name for i in sc.tl.intervals if i.lane == "draft"]


def test_ranking_orders_branches_most_likely_first_and_skips_own_token():
    ids = np.array([[5, 6], [7, 8], [9, 10]])
    logp = np.log(np.array([[0.6, 0.3], [0.9, 0.05], [0.5, 0.4]], np.float32))
    ranked = rank_branches(ids, logp, drafts=[5, 7])
    # P(j, v): (0, 6) .3; (1, 8) .6 * .05 = .03; (2, 9) .6 * .9 * .5 = .27; (2, 10) .216
    assert [(b.depth, b.token) for b in ranked] == [(0, 6), (2, 9), (2, 10), (1, 8)]
    assert [round(float(np.exp(b.score)), 3) for b in ranked] == [0.3, 0.27, 0.216, 0.03]
    # a draft token outside a row's top-κ is charged that row's κ-th log-prob (an upper bound)
    ranked = rank_branches(ids, logp, drafts=[4, 7])
    assert {(b.depth, b.token) for b in ranked} >= {(0, 5), (0, 6)}
    assert (
        round(float(np.exp(next(b.score for b in ranked if b.depth == 1 and b.token == 8))), 3)
        == 0.015
    )


# ---- App. E, trace, failure behaviour ---------------------------------------------------------


def test_fallback_frequency_bounded_by_top_kappa_mass(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx")
    tl = Timeline()
    steps = list(greedy_steps("mirror", target, draft, PROMPT, 60, gamma=3, kappa=8, timeline=tl))
    s = mirror_summary(steps, tl)
    assert s["ff"] <= 1 - s["omega_kappa"] + 1e-9  # App. E corollary, on a real run
    assert 0 <= s["reuse_rate"] <= 1 and s["reuse_rate"] + s["resume_rate"] + s[
        "fallback_rate"
    ] == pytest.approx(1)
    assert s["t_rv_ee_us"] > 0 and s["step_ms_predicted"] > 0
    lanes = {e.get("tid") for e in tl.chrome_trace()["traceEvents"] if e["ph"] == "X"}
    assert lanes == {1, 2, 3}


class Failing:
    """A draft that raises on its n-th forward."""

    def __init__(self, model, n):
        self.m, self.n, self.calls = model, n, 0
        self.config, self.backend, self.supports_layer_range = model.config, "test", False

    def new_cache(self, batch=1):
        return self.m.new_cache(batch)

    def forward(self, tokens, cache, **kw):
        self.calls += 1
        if self.calls >= self.n:
            raise ValueError("NPU fell over")
        return self.m.forward(tokens, cache, **kw)


class Slow(Failing):
    def forward(self, tokens, cache, **kw):
        time.sleep(0.01)
        return self.m.forward(tokens, cache, **kw)


@pytest.mark.parametrize("n", [1, 6])
def test_worker_that_raises_surfaces_within_a_second(tiny_dir, n):
    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = Failing(load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx"), n)
    t0 = time.time()
    with pytest.raises(RuntimeError, match="draft worker failed.*NPU fell over"):
        mirror(target, draft, n=50)
    assert time.time() - t0 < 5  # surfaced, not hung (the worker notices within its poll)
    assert no_worker_threads()


def test_closing_early_stops_the_worker_and_rewinds(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx")
    tc = target.new_cache()
    steps = greedy_steps("mirror", target, draft, PROMPT, 50, target_cache=tc)
    got = list(PROMPT)
    for _ in range(3):
        got += next(steps).tokens
    steps.close()
    assert no_worker_threads() and tc.offset <= len(got)


def test_slow_draft_degrades_without_hanging(tiny_dir):
    target = load_model(tiny_dir("qwen2"), "mlx")
    draft = Slow(load_model(tiny_dir("qwen2", num_layers=1, seed=4), "onnx"), 0)
    assert mirror(target, draft, n=12, gamma=2).tokens == ar(target, n=12).tokens


def test_mlx_draft_runs_on_its_own_thread_stream(tiny_dir):
    """MLX streams belong to a thread: the draft worker must compute on one of its own."""
    target = load_model(tiny_dir("llama"), "mlx")
    draft = load_model(tiny_dir("llama", num_layers=1, seed=4), "mlx")
    assert mirror(target, draft, n=15, gamma=3).tokens == ar(target, n=15).tokens


class SlowDraft:
    """The draft with every batched pass (branch rows) held to `pass_s`, so a test can send a
    message while a wave of branch rollouts is in flight."""

    def __init__(self, draft, pass_s: float):
        self.m, self.pass_s = draft, pass_s

    def __getattr__(self, name):
        return getattr(self.m, name)

    def forward(self, tokens, cache, **kw):
        out = self.m.forward(tokens, cache, **kw)
        if np.shape(tokens)[0] > 1:
            time.sleep(self.pass_s)
        return out


def test_the_own_wave_in_flight_runs_to_its_end_when_the_early_exit_comes(tiny_dir):
    """An own-branch row begun in the prefix is the only kind that can be complete when (A, c)
    comes at a γ whose rollout outlasts the suffix: the early exit must not cut its wave short
    (cut, this (A, c) was a resume, not a reuse)."""
    sc = Scripted(
        SlowDraft(load_model(tiny_dir("llama", num_layers=2, seed=11), "onnx"), 0.05),
        draft_branches=2,
    )
    d = sc.draft.m
    logits = d.forward(np.array([PROMPT + sc.win.tokens]), d.new_cache())[0, len(PROMPT) - 1 :]
    c = next(b.token for b in rank_own_branches(logits, sc.win.tokens, 2) if b.depth == 1)
    deadline = time.time() + 10
    while "re-run own window" not in [i.name for i in sc.tl.intervals]:
        assert time.time() < deadline
        time.sleep(0.002)
    time.sleep(0.075)  # mid-wave: 1-2 of its γ = 3 passes done
    nxt = sc.step(ee_with(sc.win.tokens, {}), a=1, c=c, wait_all=False)
    first = next(i for i in sc.tl.intervals if i.name.startswith("rollout"))
    assert first.args["tokens"] == sc.gamma  # the wave ran all its passes
    assert nxt.source == "reuse" and nxt.tokens == sc.fresh(1, c)


def _step(prefix_ms, suffix_ms, rv_fv_ms, ee_sent, draft):
    ms = 1_000_000
    x = {"prefix_s": prefix_ms / 1e3, "suffix_s": suffix_ms / 1e3, "ee_sent_ns": ee_sent,
         "rv_fv_ns": rv_fv_ms * ms, "draft": draft, "step_s": 0.05, "taken": True,
         "reuse": True, "resume": False, "fallback": False, "in_tree": True,
         "omega_kappa": 1.0, "payload_bytes": 1}  # fmt: skip
    return StepEvent(tokens=[1], accepted=0, drafted=1, draft_s=0.0, verify_s=0.0, extra=x)


def test_eq10_prediction_puts_no_early_exit_rendezvous_on_an_own_branch_path():
    """Eq. (10) per step: a window made after the early exit pays T_rv(ee) + its rollout beside
    the suffix; an own branch begun in the prefix pays only what ran past the early exit's send
    (it waited for no message), even when the worker read the early exit late."""
    ms = 1_000_000
    after = _step(20, 20, 1, 100 * ms, {"ee_recv_ns": 103 * ms, "ready_ns": 128 * ms})
    own = _step(20, 20, 1, 100 * ms, {"ee_recv_ns": 0, "ready_ns": 125 * ms})
    own_read_late = _step(20, 20, 1, 100 * ms, {"ee_recv_ns": 108 * ms, "ready_ns": 104 * ms})
    pred = [
        mirror_summary([e], Timeline())["step_ms_predicted"] for e in (after, own, own_read_late)
    ]
    assert pred == pytest.approx([20 + 3 + 25 + 1, 20 + 25 + 1, 20 + 20 + 1])


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_rows_that_join_a_wave_in_flight_draft_what_a_wave_of_their_own_would(tiny_dir, temp):
    """Wave.join: rows added after two passes (the early exit's, into the own wave) see the
    shared prefix and their own columns only, so their tokens, laws and committed cache are
    those of a wave of their own; the rows already there are unchanged by them."""
    from runtime.mirror.branches import Branch
    from runtime.mirror.wave import Wave

    m = load_model(tiny_dir("llama", num_layers=2, seed=11), "onnx")
    s, window, base = Sampling(temp), [17, 23, 5], len(PROMPT)
    cache = m.new_cache()
    m.forward(np.array([PROMPT + window]), cache)
    own = [Branch(0, 40, 0.0), Branch(2, 41, 0.0), Branch(3, 42, 0.0)]
    late = [Branch(1, 43, 0.0), Branch(0, 44, 0.0), Branch(3, 45, 0.0)]
    g_own, g_late = [4, 4, 3], [4, 2, 4]

    def rngs(bs):
        return [np.random.default_rng([9, b.depth, b.token]) for b in bs]

    def alone(bs, g2):
        w = Wave(m, cache.fork([0] * len(bs)), bs, base, g2, rngs(bs), s)
        while not w.finished():
            w.advance()
        return w

    merged = Wave(m, cache.fork([0] * 3), own, base, g_own, rngs(own), s)
    merged.advance()
    merged.advance()
    merged.join(late, g_late, rngs(late))
    assert not merged.finished(3) and merged.completed() == 0
    while not merged.finished():
        merged.advance()
    assert merged.k == 2 + max(g_late)  # the joined rows drafted from their own first pass
    for bs, g2, off in ((own, g_own, 0), (late, g_late, 3)):
        ref = alone(bs, g2)
        for r in range(len(bs)):
            ta, qa = ref.window(r)
            tb, qb = merged.window(off + r)
            assert ta == tb and merged.row_passes(off + r) == g2[r]
            np.testing.assert_allclose(qa, qb, atol=1e-4)
    for r in (0, 2):  # commit a joined row: the cache continues its path as the lone wave's
        ref, again = alone(late, g_late), Wave(m, cache.fork([0] * 3), own, base, g_own,
                                               rngs(own), s)  # fmt: skip
        again.advance()
        again.join(late, g_late, rngs(late))
        while not again.finished():
            again.advance()
        end, g = base + late[r].depth, g_late[r]
        ta, _ = ref.commit(r, end, g)
        tb, _ = again.commit(3 + r, end, g)
        assert ta == tb and ref.cache.offset == again.cache.offset == end + g
        la = m.forward(np.array([[ta[-1]]]), ref.cache)
        lb = m.forward(np.array([[tb[-1]]]), again.cache)
        np.testing.assert_allclose(la, lb, atol=1e-4)


def test_early_exit_branches_join_the_own_wave_in_flight_and_are_reused(tiny_dir):
    """The early exit arrives during the own wave's second pass: its branches join that wave
    (the timeline says how many), and a correction among them is reused with the tokens a
    fresh rollout gives."""
    gate = Gate(load_model(tiny_dir("llama", num_layers=2, seed=11), "onnx"), at=2)
    sc = Scripted(gate, draft_branches=1)
    logits = gate.m.forward(np.array([PROMPT + sc.win.tokens]), gate.m.new_cache())
    own = {
        (b.depth, b.token)
        for b in rank_own_branches(logits[0, len(PROMPT) - 1 :], sc.win.tokens, 1)
    }
    c = next(v for v in range(300) if (1, v) not in own and v != sc.win.tokens[1])
    ids = ee_with(sc.win.tokens, {1: [c]})
    logp = np.log(np.full(ids.shape, 0.2, np.float32))
    assert gate.entered.wait(10)  # the own wave's second pass
    sc.w.send(EarlyExit(0, encode(ids.astype(np.int32), logp), now_ns()))
    gate.release.set()
    deadline = time.time() + 10
    while not [i for i in sc.tl.intervals if i.name == "rollout wave 1"]:
        assert time.time() < deadline
        time.sleep(0.005)
    first = next(i for i in sc.tl.intervals if i.name == "rollout wave 1")
    assert first.args["joined"] > 0 and first.args["tokens"] > sc.gamma
    sc.w.send(FinalVerify(0, 1, c, now_ns()))
    nxt = sc.w.receive(1)
    sc.w.stop()
    assert nxt.source == "reuse" and nxt.tokens == sc.fresh(1, c)
    assert not nxt.info["own"]
