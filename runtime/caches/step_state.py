"""The cache of a hybrid model run one token per call (the ONNX hybrid draft): KV for
full-attention layers, and for linear-attention layers the states after each recent position.

A graph that takes and returns the conv and recurrent states (converters/onnx_hybrid_export.py)
gives, after every token, the states that follow it. This cache keeps those of the last
`window` positions, keyed by the cache length they follow, so rollback to any of them is
picking one (exact: they are the very arrays the graph returned, references, not copies, and no
model runs again). Cost per speculation window of γ tokens: nothing to compute; memory of γ + 1
states per linear layer and row, C·(K-1) + Hv·Dk·Dv floats each (conv + recurrent: about 1 MiB
per layer for Qwen3.5-0.8B's Hv=16, Dk=Dv=128), against the replay log of
runtime/caches/hybrid.py, which is smaller but needs the recurrence re-run and per-position
inputs a one-token graph does not output. Rolling back past the window (speculative decoding
never does) empties the cache, so the next forward re-runs the prefix: slower, never wrong.

Branch rows (Mirror-SD's rollouts): `fork_at(rows, lengths)` gives row r the linear states
after `lengths[r]` positions and the whole KV; the caller masks the KV columns
[lengths[r], offset) the row did not take (`holes_ok` checks exactly that), and
`keep_columns` commits one row by keeping its prefix and its own columns. It does not do tree
masks: a linear layer has no mask, so a tree needs a state per node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

LINEAR = "linear_attention"  # a layer_types entry (torch/qwen3_5.LINEAR's; no torch import here)


def branch_keys_ok(fork: tuple[int, np.ndarray] | None, keys: np.ndarray) -> bool:
    """Do `keys` (B, S) bool, one query's visible keys per row, hide exactly the columns each
    row's linear states did not take? Without a fork (None): no holes at all. With
    fork = (offset at the fork, per-row lengths): row r sees [0, length_r) and [offset, S)."""
    if fork is None:
        return bool(keys.all())
    at, lengths = fork
    cols = np.arange(keys.shape[1])[None, :]
    return bool(np.array_equal(keys, (cols < lengths[:, None]) | (cols >= at)))


class StepStateCache:
    """Per-layer KV (full attention) or per-position states (linear attention), numpy."""

    is_trimmable = True

    def __init__(
        self,
        kinds: Sequence[str],
        batch: int,
        empty_kv: Callable[[int], Any],
        empty_state: Callable[[int, int], tuple],
        *,
        window: int = 32,
    ):
        self.kinds, self.window, self._batch = list(kinds), window, batch
        self._empty_kv, self._empty_state = empty_kv, empty_state
        self._reset()

    def _reset(self) -> None:
        b = self._batch
        self._kv = {
            i: (self._empty_kv(b), self._empty_kv(b))
            for i, k in enumerate(self.kinds)
            if k != LINEAR
        }
        self._offset = 0
        # cache length -> [(conv (B, C, K-1), recurrent (B, Hv, Dk, Dv)) per linear layer]
        self._states = {
            0: [self._empty_state(i, b) for i, k in enumerate(self.kinds) if k == LINEAR]
        }
        self._fork: tuple[int, np.ndarray] | None = None  # (offset at fork_at, per-row lengths)

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def batch(self) -> int:
        return self._batch

    def layer_offset(self, i: int) -> int:
        return self._offset

    def past(self) -> list[Any]:
        """Every layer's past in graph order: (keys, values) (B, KV, offset, D) or (conv, rec)."""
        lin = iter(self._states[self._offset])
        flat = []
        for i, kind in enumerate(self.kinds):
            if kind == LINEAR:
                flat += list(next(lin))
            else:
                k, v = self._kv[i]
                flat += [k[:, :, : self._offset], v[:, :, : self._offset]]
        return flat

    def push(self, presents: Sequence[Any], n: int = 1) -> None:
        """Store the presents (graph order) of a call over `n` tokens: the KV grown by n, the
        states after the last (the positions inside a chunk get none: not landable)."""
        lin = []
        for i, kind in enumerate(self.kinds):
            a, b = presents[2 * i], presents[2 * i + 1]
            if kind == LINEAR:
                lin.append((a, b))
            else:
                self._kv[i] = (a, b)
        self._offset += n
        self._states[self._offset] = lin
        for old in [n for n in self._states if n < self._offset - self.window]:
            del self._states[old]

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens: pick the states kept for the shorter length (or empty the
        cache when that length is older than the window)."""
        n = max(0, min(n, self._offset))
        if n == 0:
            return 0
        keep = self._offset - n
        if keep not in self._states:
            dropped = self._offset
            self._reset()
            return dropped
        for later in [m for m in self._states if m > keep]:
            del self._states[later]
        self._offset = keep
        return n

    def holes_ok(self, keys: np.ndarray) -> bool:
        """Is `keys` (B, offset + 1) bool, one query's visible keys, exactly what each row's
        linear states saw: all columns, or (after fork_at) [0, length_r) and the fork's own?"""
        return branch_keys_ok(self._fork, keys)

    def _rows(self, rows: list[int], history: bool) -> dict:
        kv = {i: (k[rows], v[rows]) for i, (k, v) in self._kv.items()}
        kept = self._states if history else {self._offset: self._states[self._offset]}
        states = {n: [(c[rows], r[rows]) for c, r in s] for n, s in kept.items()}
        fork = None if self._fork is None else (self._fork[0], self._fork[1][rows])
        return {"_kv": kv, "_states": states, "_fork": fork, "_batch": len(rows)}

    def fork(self, rows: Sequence[int]) -> StepStateCache:
        """A new cache holding copies of `rows`; this one is unchanged. Only the live states
        are copied (copying each kept position's, MiBs per layer on real models, for every row
        would dwarf the KV): the fork can land back to where it was forked, not before."""
        new = StepStateCache.__new__(StepStateCache)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(self._rows(list(rows), history=False))
        return new

    def fork_at(self, rows: Sequence[int], lengths: Sequence[int]) -> StepStateCache:
        """Branch rows: row r copies row `rows[r]`'s KV (all `offset` columns) and its linear
        states after `lengths[r]` positions (each kept in the window, at most `offset`)."""
        rows, lengths = list(rows), [int(n) for n in lengths]
        new = self.fork(rows)
        src = [self._states[n] for n in lengths]  # per new row: [(conv, rec) per linear layer]
        new._states = {self._offset: [
            tuple(np.stack([src[r][j][t][rows[r]] for r in range(len(rows))]) for t in (0, 1))
            for j in range(len(src[0]) if src else 0)]}  # fmt: skip
        new._fork = (self._offset, np.array(lengths))
        return new

    def select(self, rows: Sequence[int]) -> None:
        """Keep rows `rows`, in that order (with every kept position's states)."""
        self.__dict__.update(self._rows(list(rows), history=True))

    def keep_columns(self, cols: Sequence[int]) -> None:
        """Commit a branch row: keep KV columns `cols`, which are a prefix [0, p) and then the
        row's own first m columns after the fork; the linear states become those after its m
        own tokens (on an unforked cache `cols` must be a prefix: a trim)."""
        cols = list(cols)
        if self._fork is None:
            assert cols == list(range(len(cols))), "keep_columns on an unforked cache is a trim"
            self.trim(self._offset - len(cols))
            return
        at, lengths = self._fork
        own = [c for c in cols if c >= at]
        prefix = cols[: len(cols) - len(own)]
        assert own == list(range(at, at + len(own))) and prefix == list(range(len(prefix)))
        assert self._batch > 1 or len(prefix) == lengths[0], "the prefix the row's states saw"
        p = len(prefix)  # the row's own states stay, re-keyed after the prefix: landable later
        self._states = {p + n - at: s for n, s in self._states.items() if at <= n <= at + len(own)}
        self._kv = {i: (k[:, :, cols], v[:, :, cols]) for i, (k, v) in self._kv.items()}
        self._offset, self._fork = len(cols), None

    def states(self) -> list[tuple]:
        """Every layer's live cache arrays (for parity checks against a fresh prefill)."""
        flat = self.past()
        return [(flat[2 * i], flat[2 * i + 1]) for i in range(len(self.kinds))]
