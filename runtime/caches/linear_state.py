"""One linear-attention layer's state inside a HybridCache (runtime/caches/hybrid.py): the live
conv and recurrent states, the base they stood at when the log last restarted, the log of
what each forward consumed since (replay) or the checkpoint before it (redecode), and the
recurrent states the forwards kept at some lengths (`marks`).

It answers "what are this layer's states after n tokens?" for any n between the base and the
live offset: the live states, a kept state, or a replay of the log from the nearest kept state
before n (the conv state is sliced from the last K-1 logged inputs). The policy (which lengths
to keep, when the log restarts or drops its front, what rollback mode runs) is HybridCache's.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.backends.torch.qwen3_5 import replay


class LinearLayerState:
    """One linear layer: live states, the base they were at `base` tokens, the log, and the
    recurrent states kept at some lengths since the base (`marks`, replay rollback only)."""

    def __init__(self, conv, rec, offset: int = 0):
        self.conv, self.rec, self.offset = conv, rec, offset
        self.base_conv, self.base_rec, self.base = conv, rec, offset
        # per forward: replay keeps (xin, k, v, g, beta), time on the last axis;
        # redecode keeps the checkpoint (offset, conv, rec) taken before it
        self.log: list[tuple] = []
        self.marks: dict[int, Any] = {}  # length -> the forward's recurrent state after it

    def logged(self) -> int:
        return self.offset - self.base

    def restart(self) -> None:
        self.base_conv, self.base_rec, self.base, self.log = self.conv, self.rec, self.offset, []
        self.marks = {}

    def _cat(self, j: int):
        """Component j of the log over every forward (xin (B, C, n); k, v (B, H, n, D); g, β
        (B, H, n))."""
        parts = [e[j] for e in self.log]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1 if j == 0 else 2)

    def _cat_log(self) -> tuple:
        return tuple(self._cat(j) for j in range(5))

    def conv_at(self, length: int, r=slice(None)):
        """Rows r's conv state after `length` tokens (base <= length <= offset): the K-1 inputs
        before it, sliced from the forwards that hold them (no copy of the whole log)."""
        a, width = length - self.base, self.base_conv.shape[-1]
        if a == self.logged():
            return self.conv[r]
        pieces, end, lo = [], self.logged(), a - width  # wanted: inputs [lo, a)
        for e in reversed(self.log):
            start = end - e[0].shape[-1]
            if start < a:
                pieces.append(e[0][r][..., max(start, lo) - start : min(end, a) - start])
                if start <= lo:
                    break
            end = start
        else:
            pieces.append(
                self.base_conv[r][..., width + lo :] if lo < 0 else self.base_conv[r][..., :0]
            )
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces[::-1], dim=-1)

    def rec_at(self, length: int, r=slice(None)):
        """Rows r's recurrent state after `length` tokens (base <= length <= offset): the live
        state, a kept one, or the log replayed from the nearest kept state before it."""
        if length == self.offset:
            return self.rec[r]
        if length in self.marks:
            return self.marks[length][r]
        p = max((m for m in self.marks if m < length), default=self.base)
        a0, a = p - self.base, length - self.base
        rec = self.marks[p] if p in self.marks else self.base_rec
        if a == a0:
            return rec[r]
        k, v, g, beta = (self._cat(j)[r] for j in range(1, 5))
        return replay(rec[r], k, v, g, beta, a, start=a0)

    def state_at(self, length: int, row: int) -> tuple:
        """Row `row`'s (conv, recurrent) after `length` tokens, each (1, ...) (replay only)."""
        assert 0 <= length - self.base <= self.logged(), (
            f"length {length} outside the log [{self.base}, {self.offset}]"
        )
        r = slice(row, row + 1)
        return self.conv_at(length, r), self.rec_at(length, r)

    def keep_own(self, prefix: int, m: int) -> None:
        """Commit a forked row: land on its first m own positions and re-key the base (the fork)
        to `prefix` tokens, keeping the log of those m positions so it can land on them later."""
        at = self.base
        if m < self.logged():
            self.conv, self.rec = self.conv_at(at + m), self.rec_at(at + m)
            log = tuple(
                t[..., :m] if j == 0 else t[:, :, :m] for j, t in enumerate(self._cat_log())
            )
            self.log = [log] if m else []
        self.marks = {prefix + n - at: s for n, s in self.marks.items() if at < n < at + m}
        self.base, self.offset = prefix, prefix + m

    def rows(self, rows: list[int], same: bool) -> LinearLayerState:
        """A copy holding `rows` (`same`: all rows in order, so the tensors are shared: states
        are never written in place)."""
        pick = (lambda t: t) if same else (lambda t: t[rows])
        new = LinearLayerState(pick(self.conv), pick(self.rec), self.offset)
        new.base_conv, new.base_rec, new.base = pick(self.base_conv), pick(self.base_rec), self.base
        new.log = [tuple(pick(t) if torch.is_tensor(t) else t for t in e) for e in self.log]
        new.marks = {n: pick(s) for n, s in self.marks.items()}
        return new
