"""The speculative-streaming (SS) draft: the one-pass streams equal the explicit-sequence
reference, an SS window is token for token the AR window of its main stream (same q), it
takes fewer passes when the streams guess right, and greedy sd / mirror with it equal ar."""

import numpy as np
import pytest
from decode_helpers import ar_greedy, greedy_run

from kernels.stream_mask import multi_stream_mask, stream_positions
from runtime.backends import load_model
from runtime.decoding import Sampling
from runtime.decoding.sd import draft_window
from runtime.drafts.ss.checkpoint import is_ss_dir
from runtime.drafts.ss.torch import make_ss_checkpoint, reference_stream_logits
from runtime.errors import DuetError
from runtime.model import causal_mask

STREAMS = 3
PROMPT = [11, 42, 7, 99, 5, 250]


@pytest.fixture(scope="module")
def ss_dirs(tiny_dir, tmp_path_factory):
    """(target dir, plain draft dir, SS draft dir made from the plain one)."""
    td = tiny_dir("qwen3")
    dd = tiny_dir("qwen3", num_layers=2, seed=7)
    ss = make_ss_checkpoint(dd, tmp_path_factory.mktemp("ss") / "draft", STREAMS, scale=0.5)
    return td, dd, ss


def test_stream_mask_layout():
    m = multi_stream_mask(causal_mask(2, 3)[None], 2, [1, 2])  # 2 cached, 3 main, owners 1, 2
    assert m.shape == (1, 3 + 4, 5 + 4)
    assert not m[0, :3, 5:].any()  # main never sees a stream
    assert (m[0, 3, :5] == causal_mask(2, 3)[1]).all()  # stream (1, 1) sees what main 1 sees
    assert m[0, 4, 5:].tolist() == [True, True, False, False]  # stream (1, 2): streams 1..2 of 1
    assert m[0, 5, 5:].tolist() == [False, False, True, False]  # stream (2, 1): its own only
    pos = stream_positions(np.array([[2, 3, 4]]), 2, [1, 2])
    assert pos.tolist() == [[2, 3, 4, 4, 5, 5, 6]]


def test_one_pass_streams_equal_explicit_sequences(ss_dirs):
    _, _, ss = ss_dirs
    m = load_model(ss, "torch")
    assert m.ss_streams == STREAMS
    toks = np.random.default_rng(0).integers(0, m.config.vocab_size, 12)
    c = m.new_cache()
    m.forward(toks[None, :5], c)  # a cached prefix, then one pass of 7 main tokens
    main, lazy = m.forward_streams(toks[None, 5:12], c, first=2)
    streams = np.asarray(lazy)
    np.testing.assert_allclose(lazy[0, 3], streams[0, 3], atol=1e-5)  # the head on demand
    assert c.offset == 12 and streams.shape == (1, 5, STREAMS, m.config.vocab_size)
    for k, p in enumerate(range(7, 12)):
        ref = reference_stream_logits(m.module, toks, p, 0)
        np.testing.assert_allclose(main[0, p - 5], ref, atol=1e-4, rtol=1e-4)
        for j in range(1, STREAMS + 1):
            ref = reference_stream_logits(m.module, toks, p, j)
            np.testing.assert_allclose(streams[0, k, j - 1], ref, atol=1e-4, rtol=1e-4)
    # the main stream is the plain model: the cache it left gives the plain next logits
    nxt = m.forward(toks[None, 11:12] * 0 + 3, c)[0, -1]
    c2 = m.new_cache()
    np.testing.assert_allclose(
        nxt, m.forward(np.append(toks, 3)[None], c2)[0, -1], atol=1e-4, rtol=1e-4
    )


class OracleStreams:
    """An SS draft whose streams guess `future` (absolute position -> token) exactly."""

    def __init__(self, inner, future: dict[int, int]):
        self.inner, self.future = inner, future
        self.config, self.ss_streams = inner.config, inner.ss_streams

    def forward_streams(self, tokens, cache, *, first=None):
        off = cache.offset
        main, streams = self.inner.forward_streams(tokens, cache, first=first)
        streams = np.array(streams)
        first = tokens.shape[1] - 1 if first is None else first
        for k in range(streams.shape[1]):
            for j in range(1, self.ss_streams + 1):
                t = self.future.get(off + first + k + 1 + j)
                if t is not None:
                    streams[0, k, j - 1, t] = 1e4
        return main, streams


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_ss_window_is_the_main_stream_window(ss_dirs, temp):
    _, dd, ss = ss_dirs
    plain, m = load_model(dd, "torch"), load_model(ss, "torch")
    s = Sampling(temp)
    for gamma in (1, 4, 7):
        c1, c2 = plain.new_cache(), m.new_cache()
        a, qa = draft_window(plain, c1, PROMPT, gamma, s, np.random.default_rng(1))
        info = {}
        b, qb = draft_window(m, c2, PROMPT, gamma, s, np.random.default_rng(1), info=info)
        assert a == b and c1.offset == c2.offset == len(PROMPT) + gamma - 1
        np.testing.assert_allclose(qa, qb, atol=1e-5)  # each token's q is the law it came from
        assert 1 <= info["passes"] <= gamma
        # streams that guess right: the same tokens, fewer passes (η up to n + 1 per pass)
        oracle = OracleStreams(m, {len(PROMPT) + i: t for i, t in enumerate(a)})
        c3 = m.new_cache()
        info = {}
        b, qb = draft_window(oracle, c3, PROMPT, gamma, s, np.random.default_rng(1), info=info)
        assert b == a and c3.offset == c1.offset
        np.testing.assert_allclose(qa, qb, atol=1e-5)
        assert info["passes"] == {1: 1, 4: 2, 7: 3}[gamma]


def test_greedy_sd_and_mirror_with_ss_draft_equal_ar(ss_dirs):
    td, _, ss = ss_dirs
    target, draft = load_model(td, "mlx"), load_model(ss, "torch")
    n = 20
    ref = ar_greedy(target, PROMPT, n)
    for method, gammas in (("sd", (1, 4)), ("mirror", (3,))):
        for gamma in gammas:
            r = greedy_run(method, target, draft, PROMPT, n, gamma=gamma, kappa=3, exit_layer=2)
            assert r.tokens == ref, (method, gamma)
            j = r.stats.as_dict()["per_step"]["draft_passes"]  # J per window, reported
            assert len(j) == r.stats.as_dict()["steps"] and all(0 <= x <= gamma for x in j)


def test_an_emulated_ss_draft_stays_one_and_its_passes_are_padded(ss_dirs):
    """Under --emulate the SS draft must still run its streams (an emulated wrapper that hid
    ss_streams made it an AR draft), and a --drafts draft is padded by the same emulation."""
    from devices.emulated_model import emulate_draft, emulate_pair

    td, dd, ss = ss_dirs
    target, plain, draft = load_model(td, "torch"), load_model(dd, "torch"), load_model(ss, "torch")
    emu, et, ep = emulate_pair("m3-max:qwen3-8b+qwen3-0.6b", target, plain)
    emu.sleep = lambda s: None  # the records, not the wall time, are checked here
    ed = emulate_draft(ep, draft)
    assert ed.ss_streams == STREAMS and ed.emu is not emu and ed.emu.records is emu.records
    n = 12
    ref = ar_greedy(target, PROMPT, n)
    ed.emu.sleep = lambda s: None
    passes, real = [], draft.forward_streams

    def counted(t, c, first=None, **kw):
        T = np.shape(t)[1]
        passes.append(T + (T - (T - 1 if first is None else first)) * STREAMS)
        return real(t, c, first=first, **kw)

    draft.forward_streams = counted
    r = greedy_run("sd", et, ed, PROMPT, n, gamma=4)
    assert r.tokens == ref
    assert passes  # the SS windows ran stream passes through the wrapper
    # each was one padded draft stage counting its tokens: T main + STREAMS per owner position
    assert [x.n_tokens for x in emu.records if x.role == "draft"][-len(passes) :] == passes


def test_ss_checkpoint_marked_and_mlx_refused(ss_dirs):
    _, dd, ss = ss_dirs
    assert is_ss_dir(ss) and not is_ss_dir(dd)
    with pytest.raises(DuetError, match="speculative-streaming draft"):
        load_model(ss, "mlx")


class OracleRows:
    """An SS draft whose streams guess, per batch row, the tokens `rows[r]` holds at each
    position (absolute position -> token)."""

    def __init__(self, inner, rows: list[dict[int, int]]):
        self.inner, self.rows = inner, rows
        self.config, self.ss_streams = inner.config, inner.ss_streams

    def forward_streams(self, tokens, cache, *, first=None, positions=None, mask=None):
        main, streams = self.inner.forward_streams(
            tokens, cache, first=first, positions=positions, mask=mask
        )
        streams = np.array(streams)
        for r, future in enumerate(self.rows):
            for k in range(streams.shape[1]):
                for j in range(1, self.ss_streams + 1):
                    t = future.get(int(positions[r, first + k]) + 1 + j)
                    if t is not None:
                        streams[r, k, j - 1, t] = 1e4
        return main, streams


@pytest.mark.parametrize(
    "temp,oracle,wide",
    [(1.0, False, False), (0.0, True, False), (1.0, True, False), (1.0, False, True)],
)
def test_ss_branch_wave_equals_the_ar_wave(ss_dirs, monkeypatch, temp, oracle, wide):
    """Mirror-SD branch rows drafted with SS passes: the same tokens and q as the ordinary
    wave, each row's committed cache the same, and fewer passes when the streams guess right.
    wide: the vocabulary taken as wide, where both draw by Gumbel-max (Sampling.lazy)."""
    from kernels import gumbel_field
    from runtime.decoding import events
    from runtime.mirror.branches import Branch

    if wide:
        monkeypatch.setattr(events, "DENSE_UP_TO", 4)
        monkeypatch.setattr(gumbel_field, "DENSE_UP_TO", 4)
    from runtime.mirror.ss_wave import SSWave
    from runtime.mirror.wave import Wave

    _, _, ss = ss_dirs
    m = load_model(ss, "torch")
    s = Sampling(temp)
    window = [17, 23, 5]  # d1..dγ after PROMPT
    cache = m.new_cache()
    m.forward(np.array([PROMPT + window]), cache)
    base = len(PROMPT)
    branches = [Branch(0, 40, 0.0), Branch(2, 41, 0.0), Branch(3, 42, 0.0), Branch(1, 43, 0.0)]
    g2 = [5, 4, 5, 2]

    def rngs():
        return [np.random.default_rng([9, r]) for r in range(len(branches))]

    ar = Wave(m, cache.fork([0] * 4), branches, base, g2, rngs(), s)
    while not ar.finished():
        ar.advance()
    future = [
        {base + b.depth + 1 + i: t for i, t in enumerate(ar.toks[r, : g2[r]].tolist())}
        for r, b in enumerate(branches)
    ]
    draft = OracleRows(m, future) if oracle else m
    ssw = SSWave(draft, cache.fork([0] * 4), branches, base, g2, rngs(), s)
    while not ssw.finished():
        ssw.advance()
    assert ssw.k <= ar.k
    if oracle:
        assert ssw.k == 2  # one pass for t1 and the guesses, one to confirm them (g ≤ n + 1)
    for r in range(len(branches)):
        ta, qa = ar.window(r)
        tb, qb = ssw.window(r)
        assert ta == tb
        assert ar.logits == wide and not ssw.logits  # laws: only the AR wave keeps logits
        np.testing.assert_allclose(s.probs(qa) if ar.logits and len(qa) else qa, qb, atol=1e-5)
    for r in (1, 3):  # commit: row r alone, holes closed, the same cache as the AR wave's
        b, ta = branches[r], ar.window(r)[0]
        ca, cb = cache.fork([0] * 4), cache.fork([0] * 4)  # commit row r of fresh copies
        ar2 = Wave(m, ca, branches, base, g2, rngs(), s)
        while not ar2.finished():
            ar2.advance()
        ss2 = SSWave(draft, cb, branches, base, g2, rngs(), s)
        while not ss2.finished():
            ss2.advance()
        end = base + b.depth
        ar2.commit(r, end, g2[r])
        ss2.commit(r, end, g2[r])
        assert ca.offset == cb.offset == end + g2[r]
        probe = np.array([[ta[-1]]])
        np.testing.assert_allclose(m.forward(probe, ca), m.forward(probe, cb), atol=1e-4)


def test_onnx_ss_draft_equals_torch_and_stays_lossless(ss_dirs):
    """The exported SS graph (converters/onnx_ss_export.py): same main and stream logits as
    the PyTorch one, the same windows, and greedy mirror with it equals ar."""
    td, _, ss = ss_dirs
    o, t = load_model(ss, "onnx"), load_model(ss, "torch")
    assert o.ss_streams == t.ss_streams == STREAMS
    toks = np.random.default_rng(1).integers(0, t.config.vocab_size, 12)
    c1, c2 = o.new_cache(), t.new_cache()
    np.testing.assert_allclose(
        o.forward(toks[None, :5], c1), t.forward(toks[None, :5], c2), atol=1e-4, rtol=1e-4
    )
    ma, sa = o.forward_streams(toks[None, 5:12], c1, first=2)
    mb, sb = t.forward_streams(toks[None, 5:12], c2, first=2)
    assert c1.offset == c2.offset == 12
    np.testing.assert_allclose(ma, mb, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(sa, np.asarray(sb), atol=1e-4, rtol=1e-4)
    s = Sampling(1.0)
    a = draft_window(o, o.new_cache(), PROMPT, 5, s, np.random.default_rng(2))[0]
    assert a == draft_window(t, t.new_cache(), PROMPT, 5, s, np.random.default_rng(2))[0]
    target = load_model(td, "mlx")
    ref = ar_greedy(target, PROMPT, 16)
    assert greedy_run("mirror", target, o, PROMPT, 16, gamma=3, kappa=3, exit_layer=2).tokens == ref


def test_bench_rows_report_j():
    from apps.bench.report import summarize

    rec = {"method": "sd", "temp": 0.0, "new_tokens": [6], "wall_time": [1.0],
           "accept_lengths": [3, 3], "matches_ar": True, "note": None,
           "draft_passes": [2, 3]}  # fmt: skip
    (row,) = summarize([rec], ["sd"], [0.0])
    assert row["draft_passes_per_window"] == 2.5


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_autos_probe_times_an_ss_drafts_branch_pass_as_its_worker_runs_it(
    ss_dirs, temp, monkeypatch
):
    """pair_probe.wave_pass builds the wave the worker would: an SSWave for an SS draft."""
    import runtime.mirror.ss_wave as ssw
    from devices.pair_stages import measure_stages

    built = []

    class Spy(ssw.SSWave):
        def __init__(self, *a, **k):
            built.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(ssw, "SSWave", Spy)
    td, _, ss = ss_dirs
    target, draft = load_model(td, "torch"), load_model(ss, "torch")
    st = measure_stages(
        target, draft, gamma=3, branches=4, repeats=1, sampling=Sampling(temp), exit_layer=1
    )
    assert st["draft_batch"] > 0 and built


def test_an_ss_draft_gets_its_kinds_wave_shape_and_rolls_out_its_own_branches(ss_dirs):
    """Mirror with an SS draft defaults to SS_BRANCH_BATCH rows a wave and SS_DRAFT_BRANCHES own
    runner-ups (its wave pass carries (1 + n)^2 tokens a row); the own branches run (the window
    is re-run by the main stream) and greedy output stays the target's."""
    from runtime.decoding import mirror as m
    from runtime.mirror.draft_worker import DEFAULT_BRANCH_BATCH
    from runtime.mirror.timeline import Timeline

    td, dd, ss = ss_dirs
    target, draft = load_model(td, "mlx"), load_model(ss, "torch")
    assert m.wave_shape(draft) == (m.SS_BRANCH_BATCH, m.SS_DRAFT_BRANCHES)
    assert m.wave_shape(draft, 4, 0) == (4, 0)  # given values win
    plain = load_model(dd, "torch")
    assert m.wave_shape(plain) == (DEFAULT_BRANCH_BATCH, m.DEFAULT_DRAFT_BRANCHES)
    n = 16
    ref = ar_greedy(target, PROMPT, n)
    tl = Timeline()
    opts = dict(gamma=3, kappa=3, exit_layer=2, timeline=tl, draft_process=False)
    assert greedy_run("mirror", target, draft, PROMPT, n, **opts).tokens == ref
    assert any(iv.name == "re-run own window" for iv in tl.intervals)
