"""One wave of Mirror-SD's branch rollouts: rows over a forked copy of the draft's cache.

A wave holds a batch of branches (j, v) rolled out together, one batched draft pass per
token for every depth at once: row (j, v) attends to `committed + d1..dj` only (a per-row
key mask hides d_{j+1}..dγ) and its v sits at position |committed| + j. Rows may join a
wave in flight (`join`), and each row's window and its q are read back when the verdict
names it (`window`, `commit`). runtime/mirror/draft_worker.py drives the waves;
runtime/mirror/ss_wave.py is the same for a speculative-streaming draft.
"""

from __future__ import annotations

import numpy as np

from kernels.sampling import sample
from runtime.decoding.events import Sampling, gumbel_draws
from runtime.mirror.branches import Branch
from runtime.mirror.timeline import now_ns


def fork_rows(cache, chunk: list[Branch], base: int):
    """The wave's rows over the shared prefix cache. A hybrid draft's cache forks each row's
    linear states at its own branch point |committed| + j (fork_at): its mask hides the later
    KV columns from attention layers, but a linear layer reads no mask."""
    rows = [0] * len(chunk)
    if getattr(cache, "fork_at", None) is not None:
        return cache.fork_at(rows, [base + b.depth for b in chunk])
    return cache.fork(rows)


class Wave:
    """One batch of branch rollouts over a forked copy of the shared-prefix cache.

    The cache holds `committed + d1..dγ` (P columns) followed by one column per pass.
    Row r = (j, v) sees columns [0, |committed| + j) of the prefix and the pass columns from
    the pass it joined at (`start`: 0, or the pass at which `join` added it); its tokens sit
    at positions |committed| + j, + j + 1, ...
    """

    def __init__(
        self,
        draft,
        cache,
        branches: list[Branch],
        base: int,
        g2: list[int],
        rngs,
        sampling: Sampling,
    ):
        self.draft, self.cache, self.sampling = draft, cache, sampling
        self.index: dict[tuple[int, int], int] = {}
        self.base, self.prefix = base, cache.offset  # P
        self.g2 = np.zeros(0, np.int64)
        self.rngs: list = []
        self.start = np.zeros(0, np.int64)  # the pass each row joined at
        self.keys = np.zeros((0, self.prefix), bool)  # (n, P): the prefix columns each row sees
        self.pos = np.zeros((0, 1), np.int64)  # (n, 1): where v goes
        self.feed = np.zeros((0, 1), np.int64)
        self.toks = np.zeros((0, max(g2, default=0)), np.int64)  # each row's own tokens
        # per pass, the (n, V) rows each token was drawn from: the logits under plain sampling
        # (`logits`: no softmax of n rows a pass, only of the γ rows of a window used), else q
        self.rows: list[np.ndarray] = []
        self.logits = False  # decided on the first pass, by the width of the logits
        self.k = 0  # passes run
        self.ready_ns: list[int] = []  # when each pass finished
        self._add(branches, g2, rngs)

    def _add(self, branches: list[Branch], g2: list[int], rngs) -> None:
        n = len(self.g2)
        self.index.update({(b.depth, b.token): n + r for r, b in enumerate(branches)})
        depth = np.array([b.depth for b in branches], np.int64)
        self.g2 = np.concatenate([self.g2, np.asarray(g2, np.int64)])
        self.rngs = self.rngs + list(rngs)
        self.start = np.concatenate([self.start, np.full(len(branches), self.k, np.int64)])
        keys = np.arange(self.prefix)[None, :] < (self.base + depth)[:, None]
        self.keys = np.concatenate([self.keys, keys])
        self.pos = np.concatenate([self.pos, (self.base + depth)[:, None]])
        self.feed = np.concatenate(
            [self.feed, np.array([[b.token] for b in branches], np.int64).reshape(-1, 1)]
        )
        width = max(self.toks.shape[1], max(g2, default=0))
        toks = np.zeros((len(self.g2), width), np.int64)
        toks[:n, : self.toks.shape[1]] = self.toks
        self.toks = toks

    def join(self, branches: list[Branch], g2: list[int], rngs) -> None:
        """Add rows between passes (the early exit's branches, into the own wave in flight):
        their cache rows are copies of row 0's, whose pass columns their masks hide, so they
        see the shared prefix only, as rows forked from it do."""
        self.cache.select([*range(len(self.g2)), *([0] * len(branches))])
        self._add(branches, g2, rngs)

    def _local(self) -> np.ndarray:
        """Tokens drafted per row so far."""
        return self.k - self.start

    def finished(self, rows: int | None = None) -> bool:
        """Every row (or the first `rows`) has its window."""
        return bool((self._local() >= self.g2)[:rows].all())

    def completed(self) -> int:
        return int((self._local() >= self.g2).sum())

    def row_ready_ns(self, row: int) -> int:
        g = int(self.g2[row])
        return self.ready_ns[int(self.start[row]) + g - 1] if g else 0

    def just_completed(self) -> np.ndarray:
        """Rows the last pass completed."""
        return np.nonzero((self._local() == self.g2) & (self.k > self.start))[0]

    def row_passes(self, row: int) -> int:
        """Passes this row's window took: one per token."""
        return min(int(self._local()[row]), int(self.g2[row]))

    def advance(self) -> None:
        """One batched draft pass: every row gets its next token."""
        k, local = self.k, self._local()
        seen = np.arange(k + 1)[None, :] >= self.start[:, None]  # the pass columns of its own
        mask = np.concatenate([self.keys, seen], axis=1)[:, None, :]
        pos = self.pos + local[:, None]
        logits = self.draft.forward(self.feed, self.cache, positions=pos, mask=mask)[:, -1]
        if k == 0:
            self.logits = self.sampling.lazy(logits.shape[-1])
        if self.sampling.greedy:
            drawn = logits.argmax(-1)
        elif self.logits:  # Gumbel-max, as the fallback draws (sd.draft_window(gumbel=True))
            self.rows.append(logits)
            drawn = gumbel_draws(self.rngs, self.sampling.scaled(logits))
        else:
            self.rows.append(self.sampling.probs(logits))
            drawn = sample(self.rows[-1], np.array([r.random() for r in self.rngs]))
        room = local < self.toks.shape[1]
        self.toks[np.nonzero(room)[0], local[room]] = np.asarray(drawn)[room]
        self.feed = np.asarray(drawn, np.int64).reshape(-1, 1)
        self.k += 1
        self.ready_ns.append(now_ns())

    def window(self, row: int, g: int | None = None, stack: bool = True):
        """Row `row`'s first m = min(passes run, g or its window size) tokens and their q (their
        logits when `self.logits`: Window.laws forms q); stack=False: q as a list of the
        wave's own rows (views), for a caller that copies them anyway."""
        s0 = int(self.start[row])
        m = min(self.k - s0, int(self.g2[row]) if g is None else g)
        toks, vocab = self.toks[row, :m].tolist(), self.draft.config.vocab_size
        if self.sampling.greedy or not m:  # as sd.draft_window: no q under greedy verification
            return toks, np.zeros((0, vocab), np.float32)
        rows = [r[row] for r in self.rows[s0 : s0 + m]]
        return toks, (np.stack(rows) if stack else rows)

    def commit(self, row: int, accepted_end: int, g: int) -> tuple[list[int], np.ndarray]:
        """Make the cache row `row` alone, holes closed: `committed' + t1..t(m-1)` with m =
        min(passes run, g) tokens of the next window, which are returned with their q (laws:
        the draft ranks its next branches with them)."""
        s0 = self.prefix + int(self.start[row])
        m = min(self.k - int(self.start[row]), g)
        self.cache.select([row])
        self.cache.keep_columns([*range(accepted_end), *range(s0, s0 + m)])
        toks, q = self.window(row, g)
        return toks, (self.sampling.probs(q) if self.logits and len(q) else q)
