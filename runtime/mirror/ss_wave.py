"""A wave of Mirror-SD branch rollouts drafted by a speculative-streaming draft (§3.2, App. C).

The same contract as draft_worker's `Wave` (one batch of branches over a forked copy of
the shared-prefix cache, advanced one batched pass at a time, windows and commits per
row), but each pass is an SS pass: every row feeds its last drawn token and its lookahead
guesses as main-stream tokens, walks the guesses as runtime/decoding/ss_draft.py does
(a token drawn from the main stream's q with the row's own generator, kept going while it
equals the guess), and takes its next guesses from the streams where it stopped. So a row
draws exactly the tokens, and the q, an ordinary wave would (same law, same uniforms), in
fewer passes.

Rows accept different numbers of guesses, so a pass leaves holes: every row appends the
same number of main columns, and a per-row key mask marks which columns hold its tokens
(the shared prefix up to |committed| + j, then its own confirmed tokens). Commit keeps the
row's columns and closes the holes, as `Wave.commit` does.
"""

from __future__ import annotations

import numpy as np

from runtime.decoding.events import Sampling, draw
from runtime.mirror.branches import Branch
from runtime.mirror.timeline import now_ns


class SSWave:
    """Branch rows rolled out with SS passes (see module docstring)."""

    logits = False  # its windows carry laws (Window.logits)

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
        self.index = {(b.depth, b.token): r for r, b in enumerate(branches)}
        self.g2 = np.array(g2)
        self.rngs = rngs
        n = len(branches)
        self.prefix = cache.offset  # P: committed + d1..dγ
        depth = np.array([b.depth for b in branches])
        self.keys = np.arange(self.prefix)[None, :] < (base + depth)[:, None]  # (n, cols)
        self.next_pos = base + depth  # (n,): where each row's next fed token goes
        self.feed = [b.token for b in branches]  # the branch token v, then the last drawn
        self.guesses: list[list[int]] = [[] for _ in range(n)]
        self.toks: list[list[int]] = [[] for _ in range(n)]
        self.qs: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.cols: list[list[int]] = [[] for _ in range(n)]  # cache columns of v, t1, t2, ..
        self.k = 0  # passes run
        self.done_at = np.zeros(n, np.int64)  # the pass at which each row completed
        self.ready_ns: list[int] = []  # when each pass finished
        self._new_rows = np.zeros(0, np.int64)

    def finished(self) -> bool:
        return all(len(t) >= g for t, g in zip(self.toks, self.g2, strict=True))

    def completed(self) -> int:
        return sum(len(t) >= g for t, g in zip(self.toks, self.g2, strict=True))

    def just_completed(self) -> np.ndarray:
        """Rows the last pass completed."""
        return self._new_rows

    def row_ready_ns(self, row: int) -> int:
        k = int(self.done_at[row])
        return self.ready_ns[k - 1] if k else 0

    def row_passes(self, row: int) -> int:
        """Passes this row's window took (so far, when it is not complete)."""
        return int(self.done_at[row]) or self.k

    def advance(self) -> None:
        """One batched SS pass: every unfinished row draws η ≥ 1 tokens."""
        n = len(self.feed)
        G = max(len(g) for g in self.guesses)
        T = 1 + G
        off = self.cache.offset
        tokens = np.zeros((n, T), np.int64)
        real = np.zeros((n, T), bool)  # padding columns are no one's keys
        for r in range(n):
            row = [self.feed[r], *self.guesses[r]]
            tokens[r, : len(row)] = row
            real[r, : len(row)] = True
        pos = self.next_pos[:, None] + np.arange(T)[None, :]
        causal = np.tril(np.ones((T, T), bool))[None] & real[:, None, :]  # (n, T, T)
        mask = np.concatenate([np.broadcast_to(self.keys[:, None, :], (n, T, off)), causal], 2)
        mask[:, np.arange(T), off + np.arange(T)] = True  # every query sees itself
        main, streams = self.draft.forward_streams(
            tokens, self.cache, first=0, positions=pos, mask=mask
        )
        self.k += 1
        new_keys = np.zeros((n, T), bool)
        done_before = np.array([len(t) >= g for t, g in zip(self.toks, self.g2, strict=True)])
        for r in range(n):
            if done_before[r]:
                continue
            walked = self._walk(r, main[r])
            new_keys[r, : 1 + walked] = True
            self.cols[r] += list(range(off, off + 1 + walked))
            self.next_pos[r] += 1 + walked
            room = int(self.g2[r]) - len(self.toks[r]) - 1
            self.guesses[r] = (
                [int(t) for t in streams[r, walked].argmax(-1)[:room]] if room > 0 else []
            )
            self.feed[r] = self.toks[r][-1]
        self.keys = np.concatenate([self.keys, new_keys], axis=1)
        self.ready_ns.append(now_ns())
        done = np.array([len(t) >= g for t, g in zip(self.toks, self.g2, strict=True)])
        self._new_rows = np.nonzero(done & ~done_before)[0]
        self.done_at[self._new_rows] = self.k

    def _walk(self, r: int, main: np.ndarray) -> int:
        """Draw row r's tokens along its guesses; returns how many guesses it confirmed."""
        walked, guesses, g = 0, self.guesses[r], int(self.g2[r])
        while True:
            # as Wave and the fallback draw (Gumbel-max where Sampling.lazy says so)
            d, q = draw(main[walked], self.sampling, self.rngs[r], gumbel=True)
            if q is not None:  # greedy verification needs no q
                self.qs[r].append(q)
            self.toks[r].append(d)
            if len(self.toks[r]) >= g or walked >= len(guesses) or d != guesses[walked]:
                return walked
            walked += 1

    def window(self, row: int, g: int | None = None, stack: bool = True):
        """Row `row`'s first m = min(tokens drawn, g or its window size) tokens and their q
        (stack=False: a list of its rows, as Wave.window)."""
        m = min(len(self.toks[row]), int(self.g2[row]) if g is None else g)
        V = self.draft.config.vocab_size
        if self.sampling.greedy or not m:  # as sd.draft_window: no q under greedy verification
            return self.toks[row][:m], np.zeros((0, V), np.float32)
        rows = self.qs[row][:m]
        return self.toks[row][:m], (np.stack(rows) if stack else list(rows))

    def commit(self, row: int, accepted_end: int, g: int) -> tuple[list[int], np.ndarray]:
        """Make the cache row `row` alone, holes closed: `committed' + t1..t(m-1)` (its
        columns hold v, t1, t2, ..), with the next window's first m tokens returned."""
        m = min(len(self.toks[row]), g)
        self.cache.select([row])
        self.cache.keep_columns([*range(accepted_end), *self.cols[row][:m]])
        return self.window(row, g)
