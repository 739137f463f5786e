"""A Gumbel noise field read where it matters: i.i.d. standard Gumbel G(r, x) for rows r and
columns x of a vocabulary, defined by a counter-based hash, so that any entry can be formed
alone and the exact top-k of `scores + G` over a row needs only a few of its entries.

Why: Mirror-SD's noise-coupled early exit (runtime/mirror/coupled.py) drew a full
(γ + 1) × V table of Gumbel noise on each side of every sampled step; at V = 151,936 that took
10 ms a side on this CPU, where the top-κ of log p̃ + G and the Gumbel-max correction read a
handful of entries each.

Construction (exact, per row; blocks of B = 64 columns): the block's maximum M_b is a Gumbel
with location log B (the maximum of B i.i.d. standard Gumbels), its position a uniform column
of the block, and every other column an independent Gumbel truncated below M_b,
g = -log(exp(-M_b) + E) with E ~ Exp(1) (its CDF is F(g) / F(M_b) for g <= M_b). That is the
joint law of B i.i.d. standard Gumbels, so each row is one (columns past V, in a last partial
block, are simply never read). Every draw is SplitMix64's output for its own counter, keyed by
(row key, stream): integer arithmetic, the same on every CPU.

Exact top-k of s(x) + G(x) (`top`): no entry of block b exceeds max_b s + M_b, its bound. The
blocks are read in order of their bounds, largest first, until the k-th largest value read is
at least the largest bound of the blocks left unread. A row costs one max over its scores,
V / B block maxima, and the entries of the few blocks read (about 5 at T = 1 on Qwen-like rows).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from kernels.topk_channel import rows_torch

BLOCK = 64  # columns per block: log B = 4.2 nats of headroom above a block's best score
_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_MAX, _POS, _VAL, _UNI = 1, 2, 3, 4  # the field's streams per row
# rows up to this wide are drawn whole (each when first read) by NumPy's generator: at the
# embedded pair's 4,096 the block construction cost 5x the old table (16 one-draw rows: 2.3
# against 0.4 ms); Qwen3's 151,936 reads blocks (2.7 ms for 16 rows, where a softmax and an
# inverse CDF took 4.8)
DENSE_UP_TO = 16_384
_FIRST = 32  # blocks read per row in the first round of `top` (then 4x per round)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _mix1(z: int) -> int:
    """_mix on one Python int (a 64-bit value): the same function, without NumPy's per-call
    cost (a verdict keys its noise once a step)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def fold(*parts: int) -> int:
    """A 64-bit key from integers (seed, step, tag, ...), each mixed in turn."""
    k = 0
    for p in parts:
        k = _mix1(k ^ ((int(p) + _GOLDEN) & _M64))
    return k


def _stream(keys: np.ndarray, stream: int) -> np.ndarray:
    """Per-row bases of one stream: the rows' keys mixed with the stream's number."""
    return _mix(np.asarray(keys, np.uint64) ^ np.uint64(stream * _GOLDEN & _M64))


def _draws(base: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """64-bit draws: SplitMix64 at state base + (counter + 1) * golden (broadcast)."""
    return _mix(base + (np.asarray(counters).astype(np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN))


def _best_blocks(bound: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the n blocks of largest bound (R, n), and the largest bound left (R,)."""
    nb = bound.shape[1]
    if n >= nb:
        return np.broadcast_to(np.arange(nb), bound.shape), np.full(len(bound), -np.inf)
    part = np.argpartition(-bound, n, axis=-1)[:, : n + 1]
    part = np.take_along_axis(part, np.argsort(-np.take_along_axis(bound, part, -1), -1), -1)
    return part[:, :n], np.take_along_axis(bound, part[:, n:], -1)[:, 0]


def _uniform(bits: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float64: the top 53 bits plus half a step."""
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _exp1(bits: np.ndarray) -> np.ndarray:
    return -np.log(_uniform(bits))


class GumbelField:
    """The field's rows 0..rows-1 under `key` (fold(seed, step, tag) for instance), over a
    vocabulary of `vocab` columns. Rows up to DENSE_UP_TO wide are drawn whole, from NumPy's
    generator keyed by the row's key (its ziggurat beats reading blocks there); wider ones
    are the block construction above. Either is an i.i.d. standard Gumbel row, the same for
    every reader that knows (key, vocab)."""

    def __init__(self, key: int, rows: int, vocab: int):
        key = int(key) & _M64
        keys = [_mix1(key ^ ((r * _GOLDEN) & _M64)) for r in range(int(rows))]
        self._keyed(np.array(keys, np.uint64), vocab)

    @classmethod
    def of_rows(cls, keys, vocab: int) -> GumbelField:
        """A field whose row r is keyed by keys[r] alone (one row per draw of a generator)."""
        field = cls.__new__(cls)
        field._keyed(_mix(np.asarray(keys, np.uint64)), vocab)
        return field

    def _keyed(self, keys: np.ndarray, vocab: int) -> None:
        self.rows, self.vocab, self._keys = len(keys), int(vocab), keys
        self.dense = self.vocab <= DENSE_UP_TO
        self._drawn: dict[int, np.ndarray] = {}  # dense: the rows drawn so far, at first use

    # each stream's per-row bases, formed when first read (a dense field reads none)
    _max = cached_property(lambda self: _stream(self._keys, _MAX))
    _pos = cached_property(lambda self: _stream(self._keys, _POS))
    _val = cached_property(lambda self: _stream(self._keys, _VAL))

    def uniforms(self, n: int) -> np.ndarray:
        """n uniforms of the key's own stream (Mirror-SD's acceptance uniforms u): _draws and
        _uniform on Python ints (a verdict's few cost 9 us through NumPy's small arrays)."""
        base = _mix1(int(self._keys[0]) ^ (_UNI * _GOLDEN & _M64))  # _stream(keys[:1], _UNI)
        bits = [_mix1((base + (c + 1) * _GOLDEN) & _M64) for c in range(int(n))]
        return np.array([((b >> 11) + 0.5) * 2.0**-53 for b in bits], np.float64)

    def _dense(self, rows) -> np.ndarray:
        """Rows `rows` (any int array) of a dense field, shaped rows.shape + (V,): row r is
        -log of Exp(1) draws from NumPy's generator keyed by the row's own key, drawn the first
        time it is read. Only the rows read are drawn: sd's verdict reads one row of γ + 1 (a
        whole (γ + 1) x 4,096 table cost 0.2 ms on this CPU, the one row 0.03)."""
        rows = np.asarray(rows, np.int64)
        for r in np.unique(rows).tolist():
            if r not in self._drawn:
                e = np.random.default_rng(int(self._keys[r])).standard_exponential(self.vocab)
                self._drawn[r] = -np.log(e)
        if rows.ndim == 0:
            return self._drawn[int(rows)]
        if rows.size == 0:  # nothing read (a message with no candidate left): no row drawn
            return np.empty((*rows.shape, self.vocab))
        return np.stack([self._drawn[r] for r in rows.ravel().tolist()]).reshape(
            *rows.shape, self.vocab
        )

    def _block_max(self, rows, blocks) -> np.ndarray:
        """M_b: each block's maximum, Gumbel with location log B."""
        return np.log(BLOCK) - np.log(_exp1(_draws(self._max[rows], blocks)))

    def _entries(self, rows, blocks, cols, top) -> np.ndarray:
        """G at (rows, cols), given their blocks and those blocks' maxima `top` (broadcast
        alike; the maximum's column is drawn once per block the shapes hold): M_b at it, an
        Exp(1) draw E truncated below M_b elsewhere, -log(exp(-M_b) + E)."""
        at = (_draws(self._pos[rows], blocks) & np.uint64(BLOCK - 1)).astype(np.int64)
        under = -np.log(np.exp(-top) + _exp1(_draws(self._val[rows], cols)))
        return np.where(at == cols % BLOCK, top, under)

    def values(self, rows, cols) -> np.ndarray:
        """G at (rows, cols), broadcast together; float64."""
        rows, cols = np.broadcast_arrays(np.asarray(rows, np.int64), np.asarray(cols, np.int64))
        if not self.dense:
            blocks = cols // BLOCK
            return self._entries(rows, blocks, cols, self._block_max(rows, blocks))
        uniq, at = np.unique(rows, return_inverse=True)  # each row drawn (and stacked) once
        return self._dense(uniq)[at.reshape(rows.shape), cols]

    def __getitem__(self, index) -> np.ndarray:
        """field[j, cols]: G at row j's columns (the noise table's indexing)."""
        j, cols = index
        return self.values(j, cols)

    def table(self) -> np.ndarray:
        """Every entry of every row, (rows, vocab): the reference the tests compare with."""
        return self.values(np.arange(self.rows)[:, None], np.arange(self.vocab)[None, :])

    def top(self, scores: np.ndarray, k: int, rows=None, log: bool = False):
        """Exact top-k of scores + G per row, largest first (ties: lower id first).

        scores (R, V) float (-inf: never chosen); rows: the field rows they go with (default
        0..R-1); log: scores are masses (>= 0) and their logs are the scores, taken only of
        the blocks' maxima and the entries read (a log of a whole row of 151,936 cost 1.9 ms
        of the verifier's step). Returns ids int64 (R, k) and their values scores + G,
        float64 (R, k). All rows read their _FIRST best blocks at once; a row whose k-th value
        read is below a bound left unread reads on alone, 4x as many blocks a round."""
        s = np.asarray(scores)
        R, V = s.shape
        rows = np.arange(R) if rows is None else np.asarray(rows, np.int64)
        k = min(k, V)
        nb, full = -(-V // BLOCK), V // BLOCK
        assert V == self.vocab, f"scores over {V} columns for a field over {self.vocab}"
        if self.dense:
            if log:
                s = _log(s)
            g = self._dense(rows)
            v = np.where(s > -np.inf, s + g, -np.inf)
            return _select(v, np.broadcast_to(np.arange(V), v.shape), k)
        bmax = np.empty((R, nb), np.float64)  # each block's best score
        if s.dtype == np.float32:  # PyTorch's: 3x NumPy's (the bound must not round down)
            bmax[:, :full] = (
                rows_torch(s).narrow(1, 0, full * BLOCK).reshape(R, full, BLOCK).amax(-1)
            )
        else:
            bmax[:, :full] = s[:, : full * BLOCK].reshape(R, full, BLOCK).max(-1)
        if nb > full:
            bmax[:, full] = s[:, full * BLOCK :].max(-1)
        if log:  # log is increasing: the blocks' best log-masses are the logs of their best
            bmax = _log(bmax)
        top = self._block_max(rows[:, None], np.arange(nb)[None, :])  # (R, nb): each M_b
        bound = bmax + top
        n = min(_FIRST, nb)
        pick, rest = _best_blocks(bound, n)
        ids, vals = self._read(s, rows[:, None], pick, top, k, log)
        ids, vals = ids[:, :k], vals[:, :k]
        for r in np.flatnonzero(~((vals[:, -1] >= rest) & (vals[:, -1] > -np.inf))):
            if n < nb:  # this row's k-th value may lie in a block not read yet: read on
                ids[r], vals[r] = self._top_row(s[r], bound[r], top[r], int(rows[r]), k, n * 4, log)
        return ids, vals

    def _read(self, s, rows, pick, top, k: int, log: bool = False):
        """The entries of blocks `pick` (R, n) of rows `rows` (R, 1): their k best columns by
        scores + G (fewer where fewer exist, padded with -inf), ids and values (R, k)."""
        R, V = s.shape[0], s.shape[1]
        cols = pick[..., None] * BLOCK + np.arange(BLOCK)  # (R, n, B)
        m = np.take_along_axis(top, pick, -1)[..., None]  # block by block: M_b once a block
        g = self._entries(rows[..., None], pick[..., None], cols, m).reshape(R, -1)
        cols = cols.reshape(R, -1)
        inside = cols < V
        cols = np.minimum(cols, V - 1)
        sc = np.take_along_axis(s, cols, -1).astype(np.float64)
        if log:
            sc = _log(sc)
        sc[~inside] = -np.inf
        return _select(np.where(sc > -np.inf, sc + g, -np.inf), cols, k)

    def _top_row(self, s, bound, top, row: int, k: int, n: int, log: bool = False):
        """`top` for one row, reading its n best blocks, then 4x as many, until exact."""
        nb = len(bound)
        while True:
            n = min(n, nb)
            pick, rest = _best_blocks(bound[None, :], n)
            ids, vals = self._read(s[None, :], np.array([[row]]), pick, top[None, :], k, log)
            if n >= nb or (vals[0, -1] >= rest[0] and vals[0, -1] > -np.inf):
                return ids[0], vals[0]
            n *= 4

    def argmax(self, scores: np.ndarray, row: int, log: bool = False) -> int:
        """argmax_x scores(x) + G(row, x) over one row (V,): a Gumbel-max draw from
        softmax(scores) (-inf: never chosen); log: scores are masses, a draw from them."""
        if self.dense:  # top's answer for k = 1 (ties: the lower id), without its machinery
            s = _log(scores) if log else np.asarray(scores, np.float64)
            return int(np.argmax(s + self._dense(row)))  # -inf + G stays -inf: never chosen
        return int(self.top(np.asarray(scores)[None, :], 1, [row], log)[0][0, 0])


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(x, np.float64))  # zero mass: -inf, never chosen


def _select(v: np.ndarray, cols: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of values v (R, n) at columns cols (R, n): the k largest, largest first (ties:
    lower column first), ids and values (R, k), padded with -inf where n < k."""
    kk = min(k, v.shape[1])
    part = np.argpartition(-v, kk - 1, axis=-1)[:, :kk] if kk < v.shape[1] else np.argsort(-v, -1)
    pv, pc = np.take_along_axis(v, part, -1), np.take_along_axis(cols, part, -1)
    order = np.lexsort((pc, -pv), axis=-1)
    pv, pc = np.take_along_axis(pv, order, -1), np.take_along_axis(pc, order, -1)
    if kk < k:
        pad = ((0, 0), (0, k - kk))
        pv, pc = np.pad(pv, pad, constant_values=-np.inf), np.pad(pc, pad)
    return pc, pv
