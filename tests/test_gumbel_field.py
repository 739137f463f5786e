"""The counter-based Gumbel field (kernels/gumbel_field.py): its hash is SplitMix64, its
entries are i.i.d. standard Gumbel (block maxima included), its lazy top-k equals the top-k of
the whole table, and its argmax of log p is a draw from p."""

import numpy as np
import pytest
from scipy.stats import chisquare, kstest

from kernels.gumbel_field import BLOCK, DENSE_UP_TO, GumbelField, _draws, fold


def test_the_draws_are_splitmix64():
    # SplitMix64 seeded with 0: its first two outputs (the reference generator's test vector)
    got = _draws(np.zeros(1, np.uint64), np.arange(2))
    assert [int(x) for x in got] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


WIDE = DENSE_UP_TO + 3_616  # wider than the rows drawn whole: the block construction


@pytest.mark.parametrize("vocab", [20 * BLOCK + 7, WIDE])
def test_entries_are_iid_standard_gumbel(vocab):
    t = GumbelField(fold(1, 2, 3), 4, vocab).table()
    assert kstest(t.ravel(), "gumbel_r").pvalue > 1e-3
    assert kstest(t.ravel(), "gumbel_r", args=(0.1,)).pvalue < 1e-3  # negative control
    blocks = vocab // BLOCK
    full = t[:, : blocks * BLOCK].reshape(4, blocks, BLOCK)
    # a block's maximum is Gumbel with location log B (the construction draws it first)
    assert kstest(full.max(-1).ravel(), "gumbel_r", args=(np.log(BLOCK),)).pvalue > 1e-3
    assert abs(np.corrcoef(t[0, :-1], t[0, 1:])[0, 1]) < 0.05
    assert abs(np.corrcoef(t[0], t[1])[0, 1]) < 0.05


@pytest.mark.parametrize("vocab", [300, WIDE])
def test_keys_decide_the_field(vocab):
    a = GumbelField(fold(3, 5, 3), 2, vocab).table()
    assert np.array_equal(a, GumbelField(fold(3, 5, 3), 2, vocab).table())
    assert np.isclose(a, GumbelField(fold(3, 6, 3), 2, vocab).table()).mean() < 0.01
    assert np.isclose(a, GumbelField(fold(4, 5, 3), 2, vocab).table()).mean() < 0.01
    f = GumbelField(fold(3, 5, 3), 2, vocab)
    assert np.array_equal(f[1, np.array([4, 250])], a[1, [4, 250]])
    u = f.uniforms(1000)
    assert ((u > 0) & (u < 1)).all() and kstest(u, "uniform").pvalue > 1e-3


def test_top_is_the_tables_top_k():
    """However the scores spread (flat rows read many blocks, peaked ones a few), with -inf
    columns, a vocabulary that is not a whole number of blocks, and rows with fewer finite
    scores than k; rows drawn whole and rows built by blocks; scores given as masses."""
    rng = np.random.default_rng(0)
    for vocab in (10, 100, 4096, 5000, WIDE):
        f = GumbelField(fold(1, 2, 3), 6, vocab)
        assert f.dense == (vocab <= DENSE_UP_TO)
        for spread in (0.3, 3.0, 30.0):
            s = rng.normal(0, spread, (6, vocab))
            s[:, ::7] = -np.inf
            s[1, :] = -np.inf
            s[1, [3, vocab - 1]] = [0.0, 1.0]  # two finite scores, one in the last block
            ref = s + f.table()
            for k in (1, 8):
                ids, vals = f.top(s, k)
                masses = f.top(np.exp(s), k, log=True)  # the logs taken of what is read only
                assert np.array_equal(masses[0], ids) and np.allclose(masses[1], vals)
                for r in range(6):
                    want = np.lexsort((np.arange(vocab), -ref[r]))[:k]
                    finite = ref[r, want] > -np.inf
                    assert list(ids[r, finite]) == list(want[finite]), (vocab, spread, k, r)
                    assert np.allclose(vals[r, finite], ref[r, want[finite]])
                    assert (vals[r, ~finite] == -np.inf).all()


@pytest.mark.parametrize("vocab", [12, WIDE])
def test_argmax_of_log_p_is_a_draw_from_p(vocab):
    """12 tokens with mass, one of them zero; in the wide vocabulary they sit in blocks far
    apart, among columns of no mass."""
    rng = np.random.default_rng(5)
    ids = np.linspace(0, vocab - 1, 12).astype(int)
    p = rng.dirichlet(np.full(12, 0.5))
    p[3] = 0.0
    p /= p.sum()
    lp = np.full(vocab, -np.inf)
    with np.errstate(divide="ignore"):
        lp[ids] = np.log(p)
    draws = [GumbelField(fold(9, i, 3), 1, vocab).argmax(lp, 0) for i in range(3000)]
    full = np.zeros(vocab)
    full[ids] = p
    assert draws[:50] == [
        GumbelField(fold(9, i, 3), 1, vocab).argmax(full, 0, log=True) for i in range(50)
    ]
    assert set(draws) <= set(ids[p > 0].tolist())
    counts = np.array([draws.count(int(x)) for x in ids])
    keep = p > 0
    assert chisquare(counts[keep], p[keep] * 3000).pvalue > 1e-3
    # negative control: the same draws judged against another law
    other = np.roll(p[keep], 1)
    assert chisquare(counts[keep], other * 3000).pvalue < 1e-3


def test_fold_is_splitmix64s_finaliser_over_the_parts():
    """fold mixes on Python ints: the same keys as the finaliser on NumPy's uint64."""
    from kernels.gumbel_field import _GOLDEN, _M64, _mix

    def ref(*parts):
        k = np.zeros(1, np.uint64)
        for p in parts:
            k = _mix(k ^ np.uint64((p + _GOLDEN) & _M64))
        return int(k[0])

    for parts in [(0,), (1, 2, 3), (2**40, 7, 3, 9, 4095), (-1, 0)]:
        assert fold(*parts) == ref(*parts)
    assert fold(1, 2, 3) != fold(1, 3, 2)


def test_a_dense_field_draws_only_the_rows_it_reads():
    """sd's verdict reads one row of γ + 1: only that row is drawn, and it is the row the
    whole table holds, whichever rows were read before or with it."""
    vocab = 4096
    key = fold(5, 8, 3)
    table = GumbelField(key, 5, vocab).table()
    f = GumbelField(key, 5, vocab)
    p = np.random.default_rng(1).dirichlet(np.full(vocab, 0.1))
    got = f.argmax(p, 3, log=True)
    assert list(f._drawn) == [3]  # one row of five drawn
    with np.errstate(divide="ignore"):
        assert got == int(np.argmax(np.log(p) + table[3]))
    assert np.array_equal(f.values(np.array([[1], [3]]), np.arange(vocab)[None, :]), table[[1, 3]])
    assert sorted(f._drawn) == [1, 3]
    ids, _ = f.top(np.log(p + 1e-30)[None, :].repeat(2, 0), 4, rows=[4, 4])
    assert sorted(f._drawn) == [1, 3, 4] and (ids[0] == ids[1]).all()
    assert f[0, np.array([], np.int64)].shape == (0,)  # an empty read draws nothing
    assert sorted(f._drawn) == [1, 3, 4]
