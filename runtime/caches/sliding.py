"""The KV cache of a model with local sliding-window layers (Gemma 3) beside global ones.

A global layer keeps every column, as ConcatKVCache (runtime/caches/concat.py) does. A local layer,
whose query at position p attends only to keys at positions (p - window, p], keeps its window
and `slack` positions more: after each forward it drops its leading columns whose positions
(in every row) are at most `highest position that forward fed - slack - window`.

Rollback. A speculative step feeds positions ahead of the committed prefix and may then roll
back to it (sd's draft and verify windows, a tree's nodes, a Mirror-SD wave's branch rows);
no step reaches back more than its window and branch depth below the highest position it
fed: γ + 1 for sd, about 2γ for a Mirror-SD wave (its rows sit at depths 0..γ), a tree's
depth. The slack, SLACK = 64 positions or twice the widest spread of positions seen in one
forward whose positions are not its columns (tree nodes, branch rows) if that is more,
holds every key that such a step may evict until its verdict is in, so `trim`, `fork`,
`select`, `keep_columns` and `compact` land on the accepted prefix exactly, with the same keys
a fresh prefill of it would hold. Columns are not positions (a tree's nodes, the holes of
branch rows), so each local layer keeps its columns' positions per row, (B, S), which the
model reads to apply the window (runtime/backends/torch/gemma3_text.py), and drops columns by
position, never by count.

The cache checks that invariant instead of trusting it: a forward whose queries needed a
dropped key raises a DuetError, and a trim further back than the slack (a chat turn that
rewinds to an earlier prefix) empties the cache, whose caller then feeds the whole sequence
again (runtime.decoding.events.pending does). Arrays are the backend's own (torch, numpy or
mlx); positions too, except that decisions are taken on a host (numpy) view of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from runtime.errors import DuetError

SLACK = 64  # positions a local layer keeps beyond its window, for rollback


class SlidingKVCache:
    """Per-layer (keys, values) like ConcatKVCache; local layers also carry their columns'
    positions, get(i) -> (k, v, positions (B, S)) for them and (k, v) for global layers."""

    is_trimmable = True

    def __init__(
        self,
        sliding: Sequence[bool],
        window: int,
        batch: int,
        empty: Callable[[int], Any],
        empty_pos: Callable[[int], Any],
        slack: int | None = None,
    ):
        self.sliding, self.window = tuple(sliding), int(window)
        self.base_slack = SLACK if slack is None else int(slack)  # read now: tests lower it
        self.reach = 0  # the widest spread of positions in one tree / branch-row forward
        self._empty, self._empty_pos, self._batch = empty, empty_pos, batch
        self.resets = 0  # trims that reached behind the slack and emptied the cache
        self._reset()

    def _reset(self) -> None:
        b, n = self._batch, len(self.sliding)
        self._kv: list[tuple[Any, Any]] = [(self._empty(b), self._empty(b)) for _ in range(n)]
        self._pos: list[Any] = [self._empty_pos(b) if s else None for s in self.sliding]
        self._held = [0] * n  # live columns stored
        self._base = [0] * n  # columns dropped from the front (local layers)
        self._gone: list[int | None] = [None] * n  # the highest position dropped

    @property
    def slack(self) -> int:
        """Positions a local layer keeps beyond its window (see the module docstring)."""
        return max(self.base_slack, 2 * self.reach + 2)

    @property
    def offset(self) -> int:
        return self._base[-1] + self._held[-1]

    @property
    def batch(self) -> int:
        return self._batch

    def layer_offset(self, i: int) -> int:
        return self._base[i] + self._held[i]

    def held(self, i: int) -> int:
        """Columns layer i stores (a local layer: at most its window + slack, once past it)."""
        return self._held[i]

    def get(self, i: int) -> tuple:
        """Layer i's live (keys, values), each (B, KV, S, D), and for a local layer the
        positions of those S columns, (B, S)."""
        k, v = self._kv[i]
        n = self._held[i]
        if k.shape[2] != n:
            k, v = k[:, :, :n], v[:, :, :n]
            self._kv[i] = (k, v)
        if not self.sliding[i]:
            return k, v
        if self._pos[i].shape[1] != n:
            self._pos[i] = self._pos[i][:, :n]
        return k, v, self._pos[i]

    def put(self, i: int, k: Any, v: Any, pos: Any = None) -> None:
        """Replace layer i with (past + new) keys and values (and a local layer's positions);
        a local layer then drops what no query within the slack can see."""
        if not self.sliding[i]:
            self._kv[i], self._held[i] = (k, v), k.shape[2]
            return
        T = k.shape[2] - self._held[i]
        hp = _host(pos)  # (B, S)
        if T > 0:
            new = hp[:, -T:]
            off = (new != self.layer_offset(i) + np.arange(T)).any(axis=0)  # positions != columns
            if off.any():  # tree nodes or branch rows (after any plain prefill in the same pass)
                j = max(int(np.argmax(off)) - 1, 0)
                self.reach = max(self.reach, int(new[:, j:].max()) - int(new[:, j:].min()))
            gone = self._gone[i]
            if gone is not None and gone > int(new.min()) - self.window:
                raise DuetError(
                    f"sliding-window cache: a query at position {int(new.min())} needs keys "
                    f"dropped up to position {gone}; the step reached back further than the "
                    f"cache's slack of {self.slack} positions (use a smaller --gamma or tree)"
                )
            S = hp.shape[1]
            if S > self.window + self.slack:
                ok = (hp <= int(new.max()) - self.slack - self.window).all(axis=0)
                e = S if ok.all() else int(np.argmin(ok))
                if e:
                    top = int(hp[:, :e].max())
                    self._gone[i] = top if gone is None else max(gone, top)
                    k, v, pos = k[:, :, e:], v[:, :, e:], pos[:, e:]
                    self._base[i] += e
        self._kv[i], self._pos[i], self._held[i] = (k, v), pos, k.shape[2]

    def _serves(self, i: int, next_pos: int) -> bool:
        """Whether local layer i still holds every key a query at next_pos can see."""
        gone = self._gone[i]
        return not self.sliding[i] or gone is None or gone <= next_pos - self.window

    def trim(self, n: int) -> int:
        """Drop the last n columns of every layer. A trim that lands behind what a local
        layer still holds empties the whole cache (returns the old offset): the caller feeds
        the sequence again."""
        offs = [self.layer_offset(i) for i in range(len(self.sliding))]
        n = max(0, min(n, min(offs)))
        if not all(self._serves(i, offs[i] - n) for i in range(len(offs))):
            self.resets += 1
            self._reset()
            return min(offs)
        for i, off in enumerate(offs):
            new = off - n
            if new < self._base[i]:
                self._base[i], self._held[i] = new, 0
            else:
                self._held[i] = new - self._base[i]
        return n

    def fork(self, rows: Sequence[int]) -> SlidingKVCache:
        """A new cache holding copies of `rows`; this one is unchanged."""
        new = SlidingKVCache.__new__(SlidingKVCache)
        new.__dict__.update(self.__dict__)
        new._held, new._base, new._gone = list(self._held), list(self._base), list(self._gone)
        new._kv, new._pos = list(self._kv), list(self._pos)
        new.select(rows)
        return new

    def select(self, rows: Sequence[int]) -> None:
        """Keep rows `rows`, in that order (repeats fork a row; one index commits a branch)."""
        rows = list(rows)
        for i in range(len(self.sliding)):
            got = self.get(i)
            self._kv[i] = (_rows(got[0], rows), _rows(got[1], rows))
            if self.sliding[i]:
                self._pos[i] = _rows(got[2], rows)
        self._batch = len(rows)

    def compact(self, base: int, cols: Sequence[int]) -> None:
        """Keep positions [0, base) and move positions `cols` (each >= base, increasing) right
        after them: commits the accepted nodes of a verified tree."""
        self.keep_columns(list(range(base)) + list(cols))

    def keep_columns(self, cols: Sequence[int]) -> None:
        """Keep only these columns (in this order): closes the holes a branch batch leaves.
        Columns a local layer has dropped may only lead `cols` (the committed prefix's start);
        they stay dropped."""
        cols = list(cols)
        for i in range(len(self.sliding)):
            got, b = self.get(i), self._base[i]
            lead = next((j for j, c in enumerate(cols) if c >= b), len(cols))
            rest = [c - b for c in cols[lead:]]
            assert min(rest, default=0) >= 0, "keep_columns: a dropped column after a held one"
            runs = _runs(rest)
            self._kv[i] = (_take(got[0], runs, 2), _take(got[1], runs, 2))
            if self.sliding[i]:
                self._pos[i] = _take(got[2], runs, 1)
            self._base[i], self._held[i] = lead, len(rest)
            if not self._serves(i, len(cols)):
                raise DuetError(
                    f"sliding-window cache: keeping {len(cols)} columns needs keys dropped up "
                    f"to position {self._gone[i]} (beyond the slack of {self.slack} positions)"
                )


def _runs(cols: list[int]) -> list[tuple[int, int]]:
    """[start, stop) of each run of consecutive columns."""
    runs: list[list[int]] = []
    for c in cols:
        if runs and runs[-1][1] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, c + 1])
    return [(a, b) for a, b in runs]


def _take(x: Any, runs: list[tuple[int, int]], axis: int) -> Any:
    """Columns `runs` of x along `axis` (2: keys/values, 1: positions), sliced and joined."""
    cut = (slice(None),) * axis
    if len(runs) == 1 and runs[0][0] == 0:  # a prefix: a view, like trim
        return x[(*cut, slice(0, runs[0][1]))]
    if not runs:
        return x[(*cut, slice(0, 0))]
    return _cat([x[(*cut, slice(a, b))] for a, b in runs], axis)


def _kind(x: Any) -> str:
    return "numpy" if isinstance(x, np.ndarray) else type(x).__module__.split(".")[0]


def _cat(parts: list, axis: int) -> Any:
    kind = _kind(parts[0])
    if kind == "torch":
        import torch

        return torch.cat(parts, dim=axis)
    if kind == "mlx":
        import mlx.core as mx

        return mx.concatenate(parts, axis=axis)
    return np.concatenate(parts, axis=axis)


def _rows(x: Any, rows: list[int]) -> Any:
    if _kind(x) == "mlx":
        import mlx.core as mx

        return x[mx.array(rows)]
    return x[rows]


def _host(x: Any) -> np.ndarray:
    """A numpy view (or copy) of positions."""
    kind = _kind(x)
    if kind == "torch":
        return x.detach().cpu().numpy()
    return np.asarray(x)
