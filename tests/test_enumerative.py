"""Exact integer coding: bit I/O, subset ranks (SQS eq. 5) and lattice ranks (eq. 2).

Fast paths against the plain twins, bijection on every small input, round trips
on random and edge-case inputs (K = 1, K = V, ell = K) up to a 152k vocabulary.
"""

import itertools
import math

import numpy as np
import pytest

from kernels import enumerative as en
from kernels.bitio import (
    BitReader,
    BitReaderReference,
    BitWriter,
    BitWriterReference,
    MalformedPayload,
)


def test_bit_writer_reader_match_reference_and_round_trip():
    rng = np.random.default_rng(0)
    fields = [(0, 0), (1, 1), (5, 3)] + [
        (int(rng.integers(0, 2**w)) if w < 63 else (1 << (w - 1)) + 12345, w)
        for w in map(int, rng.integers(1, 200, 40))
    ]
    fast, ref = BitWriter(), BitWriterReference()
    for val, w in fields:
        fast.write(val, w)
        ref.write(val, w)
    data = fast.getvalue()
    assert data == ref.getvalue() and len(data) == math.ceil(fast.nbits / 8)
    r, rr = BitReader(data, fast.nbits), BitReaderReference(data, fast.nbits)
    assert [r.read(w) for _, w in fields] == [val for val, _ in fields]
    assert [rr.read(w) for _, w in fields] == [val for val, _ in fields]
    r.expect_end()


def test_array_fields_match_scalar_fields():
    rng = np.random.default_rng(5)
    for width in [0, 1, 7, 8, 13, 32]:
        vals = rng.integers(0, 2**width, 37) if width else np.zeros(37, np.int64)
        a, b = BitWriter(), BitWriter()
        a.write(3, 2)
        b.write(3, 2)
        a.write_array(vals, width)
        for x in vals:
            b.write(int(x), width)
        assert a.getvalue() == b.getvalue() and a.nbits == b.nbits
        r = BitReader(a.getvalue(), a.nbits)
        assert r.read(2) == 3 and r.read_array(37, width).tolist() == vals.tolist()


def test_bit_reader_refuses_lies():
    w = BitWriter()
    w.write(5, 3)
    data = w.getvalue()
    with pytest.raises(MalformedPayload):
        BitReader(data, 9)  # more bits than bytes
    with pytest.raises(MalformedPayload):
        BitReader(data + b"\0", 3)  # a whole spare byte
    with pytest.raises(MalformedPayload):
        BitReader(bytes([data[0] | 1]), 3)  # nonzero padding
    r = BitReader(data, 3)
    with pytest.raises(MalformedPayload):
        r.read(4)
    with pytest.raises(ValueError):
        w.write(8, 3)


@pytest.mark.parametrize("v", [1, 5, 8, 9])
def test_subset_rank_is_a_bijection_matching_reference(v):
    for k in range(v + 1):
        ranks = []
        for s in itertools.combinations(range(v), k):
            r = en.rank_subset(list(s), v)
            assert r == en.rank_subset_reference(list(s), v)
            assert en.unrank_subset(r, v, k).tolist() == list(s)
            ranks.append(r)
        assert sorted(ranks) == list(range(math.comb(v, k)))


@pytest.mark.parametrize(
    "v,k", [(200, 65), (200, 100), (200, 150), (1000, 70), (300, 299), (300, 300)]
)
def test_subset_walk_agrees_with_direct(v, k, monkeypatch):
    """Above DIRECT_MAX_K the O(V) walk is used; it must give the same ranks as math.comb."""
    rng = np.random.default_rng(k)
    sets = [np.sort(rng.choice(v, k, replace=False)) for _ in range(5)]
    sets += [np.arange(k), np.arange(v - k, v)]  # the first and the last rank
    walk = [en.rank_subset(s, v) for s in sets]
    monkeypatch.setattr(en, "DIRECT_MAX_K", 10**9)
    direct = [en.rank_subset(s, v) for s in sets]
    assert walk == direct
    if 2 * k <= v:  # (above V/2 the complement is ranked, so the order flips)
        assert walk[-2] == 0 and walk[-1] == math.comb(v, k) - 1
    monkeypatch.undo()
    for s, r in zip(sets, walk, strict=True):
        assert en.unrank_subset(r, v, k).tolist() == s.tolist()


@pytest.mark.parametrize("k", [1, 2, 40, 1000, 152_000])
def test_subset_round_trip_large_vocabulary(k):
    v = 152_064
    rng = np.random.default_rng(k)
    ids = np.sort(rng.choice(v, k, replace=False))
    r = en.rank_subset(ids, v)
    assert r.bit_length() <= en.subset_bits(v, k)
    assert en.unrank_subset(r, v, k).tolist() == ids.tolist()


def test_full_vocabulary_subset_costs_zero_bits():
    v = 152_064
    assert en.subset_bits(v, v) == 0 and en.rank_subset(np.arange(v), v) == 0
    assert en.subset_bits(v, 1) == math.ceil(math.log2(v))


def test_subset_refuses_out_of_range():
    with pytest.raises(ValueError):
        en.unrank_subset(math.comb(10, 3), 10, 3)
    with pytest.raises(ValueError):
        en.rank_subset([1, 1], 10)
    with pytest.raises(ValueError):
        en.rank_subset([10], 10)


@pytest.mark.parametrize("min_part", [0, 1])
@pytest.mark.parametrize("ell,k", [(5, 1), (5, 3), (6, 6), (7, 4), (4, 5)])
def test_composition_rank_is_a_bijection(ell, k, min_part):
    comps = [
        c
        for c in itertools.product(range(ell + 1), repeat=k)
        if sum(c) == ell and min(c) >= min_part
    ]
    assert len(comps) == en.composition_count(ell, k, min_part)
    ranks = []
    for c in comps:
        r = en.rank_composition(c, ell, min_part)
        assert r == en.rank_composition_reference(list(c), ell, min_part)
        assert en.unrank_composition(r, ell, k, min_part).tolist() == list(c)
        ranks.append(r)
    assert sorted(ranks) == list(range(len(comps)))


def test_composition_bits_follow_eq2_and_edge_cases():
    assert en.composition_bits(100, 10) == math.ceil(math.log2(math.comb(109, 9)))  # eq. (2)
    assert en.composition_bits(7, 7, min_part=1) == 0  # ell = K with counts >= 1: one point
    assert en.composition_bits(7, 1) == 0  # K = 1: all mass on one token
    b = np.zeros(152_064, np.int64)
    b[[3, 77, 151_000]] = [50, 30, 20]  # K = V with ell = 100: the full-support C-SQS row
    r = en.rank_composition(b, 100)
    assert r.bit_length() <= en.composition_bits(100, len(b))
    assert en.unrank_composition(r, 100, len(b)).tolist() == b.tolist()
    with pytest.raises(ValueError):
        en.rank_composition([3, 3], 7)  # does not sum to ell
    with pytest.raises(ValueError):
        en.unrank_composition(en.composition_count(7, 3), 7, 3)


FAST_VS_PLAIN = [(1, 1), (10, 1), (10, 10), (64, 64), (200, 65), (300, 150), (4096, 1),
                 (4096, 512), (4096, 4095), (4096, 4096), (5000, 70), (5000, 300),
                 (152_064, 1), (152_064, 2), (152_064, 40)]  # fmt: skip


@pytest.mark.parametrize("v,k", FAST_VS_PLAIN)
def test_fast_subset_coder_agrees_with_the_plain_one(v, k):
    """The GMP path (jumps, lgamma guesses) and the plain walk give the same ranks and ids, on
    random sets, the first and last sets in colex order, and random ranks."""
    rng = np.random.default_rng(v + k)
    sets = [np.sort(rng.choice(v, k, replace=False)), np.arange(k), np.arange(v - k, v)]
    for s in sets:
        r = en.rank_subset(s, v)
        assert r == en.rank_subset(s, v, plain=True)
        assert en.unrank_subset(r, v, k).tolist() == s.tolist()
        assert en.unrank_subset(r, v, k, plain=True).tolist() == s.tolist()
    count = math.comb(v, k)
    for r in [0, count - 1] + [int(x) * count >> 53 for x in rng.integers(0, 2**53, 4)]:
        assert en.unrank_subset(r, v, k).tolist() == en.unrank_subset(r, v, k, plain=True).tolist()


def test_fast_subset_coder_agrees_at_k512_of_152064():
    v, k = 152_064, 512
    ids = np.sort(np.random.default_rng(3).choice(v, k, replace=False))
    r = en.rank_subset(ids, v)
    assert r == en.rank_subset(ids, v, plain=True)
    assert en.unrank_subset(r, v, k).tolist() == ids.tolist()


@pytest.mark.parametrize("ell,k", [(4000, 512), (512, 512), (4000, 1), (100, 99), (300, 40)])
def test_fast_composition_coder_agrees_with_the_plain_one(ell, k):
    rng = np.random.default_rng(ell + k)
    for b in (
        rng.multinomial(ell, np.ones(k) / k),
        np.full(k, ell // k) + np.eye(k, dtype=int)[0] * (ell % k),
    ):
        r = en.rank_composition(b, ell)
        assert r == en.rank_composition(b, ell, plain=True)
        assert en.unrank_composition(r, ell, k).tolist() == b.tolist()
        assert en.unrank_composition(r, ell, k, plain=True).tolist() == b.tolist()
