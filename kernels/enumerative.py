"""Enumerative coding: a K-subset of {0..V-1} and a lattice point as exact integers.

- A subset is ranked by the combinatorial number system (colex order):
  rank({c_0 < ... < c_{K-1}}) = sum_i C(c_i, i+1), in [0, C(V, K)) -- the
  ceil(log2 C(V, K)) bits of SQS eq. (5). When K > V/2 the complement (V-K
  ids) is ranked instead: same count, C(V, K) = C(V, V-K), less arithmetic.
- A lattice point b (K integer counts, each >= min_part, summing to ell) is ranked
  through stars and bars: the K-1 bar positions s_j = b_0 + ... + b_j + j form a
  (K-1)-subset of {0..n-1}, n = ell - K*min_part + K - 1, ranked as above. With
  min_part = 0 (Alg. 2's counts, which may be 0) there are C(ell+K-1, K-1) points:
  SQS eq. (2), the form this codebase uses. min_part = 1 (counts >= 1) gives C(ell-1, K-1).

The fast path works in GMP integers (gmpy2: Python's own big ints spend O(V x bits) on a
walk, ~1 s per row at V = 152064, K = 512). Ranking keeps one binomial C(c_i, i) and moves
it to the next element either by the ratio C(n2, j) / C(n, j) = C(n2, g) / C(n2 - j, g)
(g = n2 - n: a short jump, two small binomials) or, for a long jump, by C(n2, j) directly.
Unranking guesses each element from lgamma (the largest c with log C(c, i) <= log r) and
corrects the guess exactly with single-step ratios C(n +- 1, i). The `_plain` paths (Python
ints: math.comb per element for small K, an O(V) walk of exact ratios otherwise) are kept as
the slow reference and must agree; `*_reference` twins enumerate every subset with itertools
(tiny V only) and define the order both must match.

What it is not: a bit format (kernels/bitio.py) or a quantizer (kernels/lattice.py).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import gmpy2
import numpy as np

DIRECT_MAX_K = 64  # at most this many elements: math.comb per element beats an O(V) walk
WALK_MAX = 64  # unranking: a guess this close is reached by single steps, farther by C(c, i)
DENSE_GAP = 16  # unranking K of V < 16 K: every element is a short walk away, no guesses


def bits_for(count: int) -> int:
    """ceil(log2 count) for count >= 1: the bits that index `count` equally likely values."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return (count - 1).bit_length()


@functools.lru_cache(maxsize=4096)
def subset_bits(v: int, k: int) -> int:
    """ceil(log2 C(V, K)): SQS eq. (5), the cost of a K-subset of a V vocabulary."""
    return bits_for(int(gmpy2.comb(v, k)))


@functools.lru_cache(maxsize=4096)
def composition_count(ell: int, k: int, min_part: int = 0) -> int:
    """Lattice points of K counts >= min_part summing to ell: C(ell - K*min_part + K - 1, K - 1)."""
    m = ell - k * min_part
    return int(gmpy2.comb(m + k - 1, k - 1)) if m >= 0 and k >= 1 else 0


def composition_bits(ell: int, k: int, min_part: int = 0) -> int:
    """ceil(log2 C(ell+K-1, K-1)) for min_part = 0: SQS eq. (2)."""
    return bits_for(composition_count(ell, k, min_part))


# --- subsets -----------------------------------------------------------------------------


def _rank_colex_plain(c: Sequence[int]) -> int:
    """sum_i C(c_i, i+1) for ascending c (combinatorial number system), Python ints."""
    k = len(c)
    if k == 0:
        return 0
    if k <= DIRECT_MAX_K:
        return sum(math.comb(ci, i + 1) for i, ci in enumerate(c))
    total, n, j, a = 0, c[0], 0, 1  # invariant: a = C(n, j)
    for i in range(k):
        total += a * (n - j) // (j + 1)  # C(c_i, i+1) = C(c_i, i) (c_i - i) / (i + 1)
        if i + 1 < k:
            a, n, j = a * (n + 1) // (j + 1), n + 1, j + 1  # C(n+1, j+1)
            while n < c[i + 1]:
                a, n = a * (n + 1) // (n + 1 - j), n + 1  # C(n+1, j)
    return total


def _unrank_colex_plain(r: int, v: int, k: int) -> list[int]:
    """Inverse of _rank_colex_plain over {0..v-1}; caller guarantees 0 <= r < C(v, k)."""
    out = [0] * k
    if k == 0:
        return out
    if k <= DIRECT_MAX_K:
        hi = v  # c_{i-1} < hi
        for i in range(k, 0, -1):
            lo, top = i - 1, hi - 1  # largest c in [lo, top] with C(c, i) <= r
            while lo < top:
                mid = (lo + top + 1) // 2
                if math.comb(mid, i) <= r:
                    lo = mid
                else:
                    top = mid - 1
            out[i - 1], hi = lo, lo
            r -= math.comb(lo, i)
        return out
    n, j = v - 1, k
    a = math.comb(n, j)  # invariant: a = C(n, j)
    for i in range(k, 0, -1):
        while a > r:
            a, n = a * (n - j) // n, n - 1  # C(n-1, j)
        out[i - 1] = n
        r -= a
        if a == 0:  # n == j - 1: the rest are forced to 0..j-2
            out[: i - 1] = range(i - 1)
            break
        a, n, j = a * j // n, n - 1, j - 1  # C(n-1, j-1)
    return out


def _rank_colex(c: Sequence[int]) -> int:
    """sum_i C(c_i, i+1) for ascending c, in GMP integers; equals _rank_colex_plain."""
    k = len(c)
    if k == 0:
        return 0
    comb = gmpy2.comb
    total = gmpy2.mpz(0)
    n, a = c[0], gmpy2.mpz(1)  # invariant: a = C(n, i) with n = c_i (>= i, so a > 0)
    for i in range(k):
        total += a * (n - i) // (i + 1)  # C(c_i, i+1) = C(c_i, i) (c_i - i) / (i + 1)
        if i + 1 < k:
            j, n2 = i + 1, c[i + 1]
            a, n = a * (n + 1) // j, n + 1  # C(c_i + 1, i + 1)
            g = n2 - n
            if g > j:  # a long jump: the binomial itself is cheaper than the ratio
                a = comb(n2, j)
            elif g > 0:  # C(n2, j) / C(n, j) = C(n2, g) / C(n2 - j, g)
                a = a * comb(n2, g) // comb(n2 - j, g)
            n = n2
    return int(total)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _log_int(r) -> float:
    b = r.bit_length()
    shift = max(0, b - 53)
    return math.log(int(r >> shift)) + shift * math.log(2)


def _unrank_colex(r: int, v: int, k: int) -> list[int]:
    """Inverse of _rank_colex over {0..v-1}; equals _unrank_colex_plain. Single steps stay in
    Python ints (their one-limb fast paths beat gmpy2's conversions); far jumps use GMP."""
    if v < DENSE_GAP * k:  # gaps this short: the plain O(V) walk of one-limb steps is fastest
        return _unrank_colex_plain(r, v, k)
    out = [0] * k
    if k == 0:
        return out
    n = v - 1
    a = int(gmpy2.comb(n, k))  # invariant: a = C(n, i)
    for i in range(k, 0, -1):
        if a > r:  # c_i < n
            # a step down divides a by about n / (n - i): (log a - log r) / log(n / (n - i))
            # steps remain; for more than WALK_MAX of them a guess from lgamma is cheaper
            lr = _log_int(r) + 1e-9 if r > 0 else -math.inf
            if n > i + WALK_MAX and _log_int(a) - lr > WALK_MAX * -math.log1p(-i / n):
                lo, hi = i - 1, n - 1  # the largest c with log C(c, i) <= log r
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if _log_comb(mid, i) <= lr:
                        lo = mid
                    else:
                        hi = mid - 1
                n, a = lo, int(gmpy2.comb(lo, i))  # exact at the guess; corrected below
            while a > r:  # C(n-1, i) = C(n, i) (n - i) / n
                a, n = a * (n - i) // n, n - 1
            while True:  # the guess may sit low: C(n+1, i) = C(n, i) (n + 1) / (n + 1 - i)
                up = a * (n + 1) // (n + 1 - i) if n + 1 > i else 1  # C(i, i) = 1
                if up > r:
                    break
                a, n = up, n + 1
        out[i - 1] = n
        r -= a
        if a == 0:  # n == i - 1: the rest are forced to 0..i-2
            out[: i - 1] = range(i - 1)
            break
        a, n = a * i // n, n - 1  # C(n-1, i-1)
    return out


def _complement(c: np.ndarray, v: int) -> np.ndarray:
    keep = np.ones(v, bool)
    keep[c] = False
    return np.flatnonzero(keep)


def rank_subset(ids: Sequence[int] | np.ndarray, v: int, *, plain: bool = False) -> int:
    """Rank of a set of distinct ids in [0, v) among all subsets of its size: in [0, C(v, K)).
    plain=True takes the slow reference path (Python ints)."""
    c = np.sort(np.asarray(ids, dtype=np.int64))
    k = len(c)
    if k and (c[0] < 0 or c[-1] >= v or (np.diff(c) == 0).any()):
        raise ValueError(f"ids must be {k} distinct values in [0, {v})")
    if 2 * k > v:  # rank the complement: fewer elements, same count
        c = _complement(c, v)
    return (_rank_colex_plain if plain else _rank_colex)(c.tolist())


def unrank_subset(r: int, v: int, k: int, *, plain: bool = False) -> np.ndarray:
    """The K ascending ids whose rank_subset is r; ValueError if r is out of [0, C(v, K)).
    plain=True takes the slow reference path (Python ints)."""
    if not (0 <= k <= v) or not (0 <= r < _count(v, k)):
        raise ValueError(f"subset rank {r} out of range for C({v}, {k})")
    unrank = _unrank_colex_plain if plain else _unrank_colex
    if 2 * k > v:
        return _complement(np.asarray(unrank(r, v, v - k), dtype=np.int64), v)
    return np.asarray(unrank(r, v, k), dtype=np.int64)


@functools.lru_cache(maxsize=4096)
def _count(v: int, k: int) -> int:
    return int(gmpy2.comb(v, k))


def rank_subset_reference(ids: Sequence[int], v: int) -> int:
    """Plain twin: the index in the colex-sorted list of all subsets (of the complement if
    K > V/2)."""
    s = sorted(ids)
    if 2 * len(s) > v:
        s = [i for i in range(v) if i not in set(s)]
    allsets = sorted(itertools.combinations(range(v), len(s)), key=lambda t: t[::-1])
    return allsets.index(tuple(s))


# --- lattice points (compositions) -------------------------------------------------------


def rank_composition(
    b: Sequence[int] | np.ndarray, ell: int, min_part: int = 0, *, plain: bool = False
) -> int:
    """Rank of counts b (each >= min_part, summing to ell) in [0, composition_count)."""
    b = np.asarray(b, dtype=np.int64)
    k = len(b)
    if k < 1 or int(b.sum()) != ell or (b < min_part).any():
        raise ValueError(f"counts must be {k} >= 1 integers >= {min_part} summing to {ell}")
    m = b - min_part
    n = ell - k * min_part + k - 1
    bars = np.cumsum(m[:-1]) + np.arange(k - 1)  # stars and bars: s_j = m_0 + ... + m_j + j
    return rank_subset(bars, n, plain=plain)


def unrank_composition(
    r: int, ell: int, k: int, min_part: int = 0, *, plain: bool = False
) -> np.ndarray:
    """Inverse of rank_composition; ValueError if r is out of range."""
    count = composition_count(ell, k, min_part)
    if not (0 <= r < count):
        raise ValueError(f"lattice rank {r} out of range [0, {count}) for ell={ell}, K={k}")
    n = ell - k * min_part + k - 1
    bars = unrank_subset(r, n, k - 1, plain=plain)
    edges = np.concatenate([[-1], bars, [n]])
    return np.diff(edges) - 1 + min_part  # parts between consecutive bars


def rank_composition_reference(b: Sequence[int], ell: int, min_part: int = 0) -> int:
    """Plain twin: bar positions by a loop, then the reference subset rank."""
    n = ell - len(b) * min_part + len(b) - 1
    bars, pos = [], -1
    for part in b[:-1]:
        pos += part - min_part + 1
        bars.append(pos)
    return rank_subset_reference(bars, n)
