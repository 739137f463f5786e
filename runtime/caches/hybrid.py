"""The cache of a hybrid model: KV for full-attention layers, states for linear ones, and
exact rollback of those states to any accepted prefix without running the model again.

A Gated DeltaNet layer's cache is a conv state (B, C, K-1) and a recurrent state
(B, Hv, Dk, Dv); unlike keys and values they cannot be sliced back (one layer's states, log
and kept states: runtime/caches/linear_state.py; the policy is here). Two rollbacks:

- `replay` (default): no second pass. The recurrent form computes the state after every
  position of a window anyway; the cache keeps, per linear layer, the forward's own recurrent
  states after the last `keep` (8) positions and at every `stride`-th (32) length ("marks",
  references to tensors the forward made, not copies), so landing a verify window of γ ≤ 7 on
  its accepted prefix is a pick, and the conv state is a slice of the last K-1 pre-conv inputs.
  Behind the marks sits the replay log: since the last landing point ("base"), the base states
  and the per-position quantities each forward consumed: pre-conv inputs (C), l2-normalised k
  (Hv·Dk, after the grouped-head repeat), v (Hv·Dv), log decay g (Hv) and β (Hv). A length
  with no mark (a longer window, a Mirror-SD branch point deep in the log) lands by replaying
  only the recurrence from the nearest mark before it (no projection, no conv, no attention,
  no other layer). Both are bit-identical to the forward's states (a mark is the forward's
  tensor; a replay calls the same `delta_step` on the same inputs; tests check it).
  Memory per window and linear layer: at most keep + window/stride + 1 = 11 recurrent states
  of Hv·Dk·Dv floats (96 KiB fp32 at the trained hybrid pair's Hv=6, Dk=Dv=64: ~1 MiB; 2 MiB
  each, 22 MiB, at Qwen3.5-9B's Hv=32, Dk=Dv=128), plus the log: C + Hv·(Dk + Dv + 2) floats
  per logged position (16,448, 64 KiB, at 9B's shapes, where Hk=16). `keep=0, stride=0`
  keeps no state and lands every length by replay from the base: the log's memory only.
- `redecode` (llama.cpp's approach, the baseline). A checkpoint of the states is kept before
  each forward (references, no copies: states are never written in place), and the cache
  keeps the token ids it was fed. `restore(keep)` lands every layer on the latest checkpoint at
  or before the kept length and drops every later position: that is what llama.cpp's
  speculative loop does on a partial acceptance (examples/speculative-simple, and the server's
  speculative checkpointing: restore the target's and the draft's checkpoints, make the
  accepted tokens and the correction the next "draft", `continue`), and `sd` then re-verifies
  [last, d1..dA, c] as its next window, with no new drafts, which re-decodes the A + 1 kept
  tokens and yields one more token, as llama.cpp's re-verification does (that token shifts
  the next windows by one, which on repetitive text can change acceptance either way).
  `trim` (every other caller, and `sd` when `reverify` is False) restores the checkpoint and
  re-runs the kept tokens at once, as their own pass (the `redecode` callback: the model's
  layers, no head), yielding nothing. A draft that fed one token per forward
  lands on a checkpoint with nothing to re-run (llama.cpp restores its draft to the
  checkpoint taken before drafting and re-decodes the accepted tokens there: the draft side
  of this baseline is cheaper than llama.cpp's, never dearer). As llama.cpp, `sd` with a
  redecode target prefills the prompt but its last token first, so a rejection in the first
  round does not re-run the prompt.

The log restarts at each landing. A forward that would take it past `window` positions first
drops its front (replay: the base moves to the latest mark at most that far on, or, with none
kept there, is landed by replaying the dropped positions, so the positions just before the live
offset stay landable; redecode: it restarts). Rolling back past
its start (rare: speculative decoding never does) empties the whole cache, so the next forward
re-runs the prefix: slower, never wrong.

Branch rows (Mirror-SD's rollouts, replay only): `fork_at(rows, lengths)` lands each new row's
linear states on its own branch point and copies the whole KV; the caller's mask hides the KV
columns the row did not take (`holes_ok` checks exactly that: a linear layer reads no mask), and
`keep_columns` commits one row, keeping its own positions' log so it can still land on them.
It does not do tree masks (a state per node) nor other compactions of non-contiguous positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from runtime.backends.torch.qwen3_5 import LINEAR, conv_state_after, replay
from runtime.caches.linear_state import LinearLayerState as _Linear
from runtime.caches.step_state import branch_keys_ok
from runtime.errors import DuetError

ROLLBACKS = ("replay", "redecode")
KEEP = 8  # replay: recurrent states kept for the last KEEP positions (γ ≤ 7 lands by a pick)
STRIDE = 32  # ... and at every STRIDE-th length, where the log's front moves without a replay


class HybridCache:
    """Per-layer KV (full attention) or states (linear attention), trimmable exactly."""

    is_trimmable = True
    # redecode: `sd` re-verifies the restored tokens as its next window (llama.cpp's loop);
    # False: it trims, re-running them as a pass of their own (no token; the earlier baseline)
    reverify = True

    def __init__(
        self,
        kinds: Sequence[str],
        batch: int,
        empty_kv: Callable[[int], Any],
        empty_state: Callable[[int, int], tuple],
        *,
        rollback: str = "replay",
        window: int = 64,
        keep: int = KEEP,
        stride: int = STRIDE,
        redecode: Callable[[np.ndarray, Any], Any] | None = None,
    ):
        """`redecode(tokens (B, T), cache)` runs tokens through all layers of the model into
        `cache` (no head): how `redecode` rollback re-runs the kept tokens. `keep` and `stride`
        (replay): the forward's recurrent states kept for the last `keep` positions and every
        `stride`-th (0 and 0: none, every landing replays from the base)."""
        if rollback not in ROLLBACKS:
            raise DuetError(f"--hybrid-rollback {rollback!r}: choose from {', '.join(ROLLBACKS)}")
        self.kinds, self.rollback, self.window = list(kinds), rollback, window
        self.keep, self.stride = (keep, stride) if rollback == "replay" else (0, 0)
        self._batch, self._redecode = batch, redecode
        self._fork: tuple[int, Any] | None = None  # (offset at fork_at, per-row lengths)
        self._tokens = np.zeros((batch, 0), np.int64)  # redecode: the ids fed, per position
        self.redecoded = 0  # redecode: tokens re-run by `trim` so far
        self._layers: list[Any] = [
            _Linear(*empty_state(i, batch))
            if k == LINEAR
            else [empty_kv(batch), empty_kv(batch), 0]
            for i, k in enumerate(self.kinds)
        ]

    @property
    def offset(self) -> int:
        return self.layer_offset(len(self._layers) - 1)

    @property
    def batch(self) -> int:
        return self._batch

    def layer_offset(self, i: int) -> int:
        layer = self._layers[i]
        return layer.offset if isinstance(layer, _Linear) else layer[2]

    def get(self, i: int) -> tuple:
        """Layer i's past: (keys, values) each (B, KV, offset, D), or (conv, recurrent)."""
        layer = self._layers[i]
        if isinstance(layer, _Linear):
            return layer.conv, layer.rec
        k, v, n = layer
        if k.shape[2] != n:
            layer[0], layer[1] = k[:, :, :n], v[:, :, :n]
        return layer[0], layer[1]

    def feed(self, tokens: np.ndarray) -> None:
        """Before a forward from layer 0: note its token ids (B, T) (redecode re-runs them)."""
        if self.rollback == "redecode":
            self._tokens = np.concatenate([self._tokens, np.asarray(tokens, np.int64)], axis=1)

    def wanted(self, i: int, length: int) -> frozenset:
        """The lengths j (1 <= j < length) of a forward of `length` tokens through linear layer
        i after which its recurrent state is to be kept: the last `keep` positions, and those
        at multiples of `stride` (where the log's front can later move without a replay)."""
        o = self._layers[i].offset
        recent = range(max(1, length - self.keep), length)
        strided = range(self.stride - o % self.stride, length, self.stride) if self.stride else ()
        return frozenset(recent).union(strided)

    def begin(self, i: int, length: int) -> None:
        """Before a forward of `length` tokens through layer i: shorten an over-long log so that
        it keeps its last `window - length` positions (replay) or restart it (redecode)."""
        layer = self._layers[i]
        if isinstance(layer, _Linear) and layer.logged() and layer.logged() + length > self.window:
            self._drop_front(layer, layer.logged() + length - self.window)

    def _drop_front(self, layer: _Linear, a: int) -> None:
        """Move the log's base at least `a` positions on, so the positions just before the live
        offset stay landable (Mirror-SD forks a hybrid draft at the committed length, which may
        lie before a forward that overflows the log). The new base is the latest kept state at
        most `a` on (no replay; the log may then overrun the window by less than `stride`), or,
        with none kept there, the base landed `a` on by replay."""
        if self.rollback != "replay" or a >= layer.logged():
            layer.restart()
            return
        to = max((m for m in layer.marks if layer.base < m <= layer.base + a), default=None)
        if to is None and a < self.stride:
            return  # the next kept state is less than `stride` on: move there later
        a = a if to is None else to - layer.base
        xin, k, v, g, beta = layer._cat_log()
        layer.base_conv = conv_state_after(layer.base_conv, xin, a)
        layer.base_rec = replay(layer.base_rec, k, v, g, beta, a) if to is None else layer.marks[to]
        layer.base += a
        layer.log = [(xin[..., a:], k[:, :, a:], v[:, :, a:], g[:, :, a:], beta[:, :, a:])]
        layer.marks = {m: st for m, st in layer.marks.items() if m > layer.base}

    def put(self, i: int, *present) -> None:
        """Store layer i's present: (keys, values) or (conv, recurrent, log[, kept]), kept the
        recurrent states after the window lengths `wanted` named."""
        layer = self._layers[i]
        if not isinstance(layer, _Linear):
            k, v = present
            self._layers[i] = [k, v, k.shape[2]]
            return
        conv, rec, log, *kept = present
        layer.log.append(
            log if self.rollback == "replay" else (layer.offset, layer.conv, layer.rec)
        )
        o = layer.offset
        layer.conv, layer.rec = conv, rec
        layer.offset += log[0].shape[-1]
        if kept and (self.keep or self.stride):
            marks, recent = layer.marks, layer.offset - self.keep
            marks.update((o + j, st) for j, st in kept[0].items())
            marks[layer.offset] = rec  # the live state: a landing point once the next forward ran
            for m in [m for m in marks if m < recent and (not self.stride or m % self.stride)]:
                del marks[m]

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens of every layer (redecode: restore the checkpoint at or
        before the kept length, then re-run the kept tokens after it as their own pass)."""
        n = max(0, min(n, min(self.layer_offset(i) for i in range(len(self._layers)))))
        if n == 0:
            return 0
        keep = [self.layer_offset(i) - n for i in range(len(self._layers))]
        if self.rollback == "redecode":
            return self._restore_and_redecode(min(keep), n)
        if any(keep[i] < la.base for i, la in enumerate(self._layers) if isinstance(la, _Linear)):
            return self._clear()  # before the log: no state to land on, start over
        for i, layer in enumerate(self._layers):
            if isinstance(layer, _Linear):
                self._land(layer, keep[i] - layer.base)
            else:
                layer[2] = keep[i]
        return n

    def restore(self, keep: int) -> int:
        """Redecode rollback inside llama.cpp's speculative loop: land every layer on the latest
        checkpoint at or before `keep` tokens and re-run nothing; returns the length landed on.
        The caller re-feeds the tokens from there (`sd` re-verifies them, with the correction,
        as its next window, as llama.cpp does); they count in `redecoded`."""
        if self.rollback != "redecode" or self.offset <= keep:
            self.trim(self.offset - keep)
            return self.offset
        self._restore_and_redecode(keep, self.offset - keep, rerun=False)
        return self.offset

    def _restore_and_redecode(self, keep: int, n: int, rerun: bool = True) -> int:
        """llama.cpp's rollback: land every layer on the latest checkpoint at or before
        `keep`, then (`rerun`) run the tokens from there to `keep` through the whole model
        again."""
        at = self._checkpoint_at(keep)
        if at < 0:
            return self._clear()  # no checkpoint that early: start over
        known = self._redecode is not None and self._tokens.shape[1] == self.layer_offset(0)
        for layer in self._layers:
            if isinstance(layer, _Linear):
                self._land(layer, at - layer.base)
            else:
                layer[2] = at
        again, self._tokens = self._tokens[:, at:keep], self._tokens[:, :at]
        if not rerun:
            self.redecoded += keep - at  # the caller re-feeds them
        elif known and again.shape[1]:
            self._redecode(again, self)  # feeds the ids back and appends their positions
            self.redecoded += again.shape[1]  # the next forward checkpoints at `keep`
            return n
        return n + keep - at  # nothing to re-run with: decoding re-feeds the dropped tokens

    def _clear(self) -> int:
        """Empty every layer (the next forward re-runs the whole prefix); returns tokens dropped."""
        dropped, self._fork = self.offset, None
        self._tokens = self._tokens[:, :0]
        for i, layer in enumerate(self._layers):
            if isinstance(layer, _Linear):
                zero = (torch.zeros_like(layer.conv), torch.zeros_like(layer.rec))
                self._layers[i] = _Linear(*zero)
            else:
                layer[2] = 0
        return dropped

    def _checkpoint_at(self, keep: int) -> int:
        """Where redecode lands: the latest checkpoint (the base, or the start of a logged
        forward) at or before `keep` in every linear layer (-1 when some layer has none)."""
        lands = [
            max((e[0] for e in la.log if e[0] <= keep), default=la.base if la.base <= keep else -1)
            for la in self._layers
            if isinstance(la, _Linear)
        ]
        return min(lands, default=keep)

    def _land(self, layer: _Linear, a: int) -> None:
        """Set the live states to those after `a` logged positions, and make that the base."""
        if a == 0:
            layer.conv, layer.rec = layer.base_conv, layer.base_rec
        elif self.rollback == "redecode" and a < layer.logged():
            _, layer.conv, layer.rec = next(e for e in layer.log if e[0] == layer.base + a)
        elif a < layer.logged():  # a kept state, or a replay from the nearest one before
            at = layer.base + a
            layer.conv, layer.rec = layer.conv_at(at), layer.rec_at(at)
        layer.offset = layer.base + a
        layer.restart()

    def fork(self, rows: Sequence[int]) -> HybridCache:
        """A new cache holding copies of `rows`; this one is unchanged."""
        rows = list(rows)
        new = HybridCache.__new__(HybridCache)
        new.kinds, new.rollback, new.window, new._batch = (
            self.kinds,
            self.rollback,
            self.window,
            len(rows),
        )
        new.keep, new.stride = self.keep, self.stride
        new._fork = None if self._fork is None else (self._fork[0], self._fork[1][rows])
        new._redecode, new._tokens, new.redecoded = self._redecode, self._tokens[rows], 0
        new._layers = []
        same = rows == list(range(self._batch))
        for i, layer in enumerate(self._layers):
            if isinstance(layer, _Linear):
                new._layers.append(layer.rows(rows, same))
            else:
                k, v = self.get(i)
                new._layers.append([k[rows], v[rows], layer[2]])
        return new

    def select(self, rows: Sequence[int]) -> None:
        """Keep rows `rows`, in that order."""
        other = self.fork(rows)
        self._layers, self._batch, self._fork = other._layers, other._batch, other._fork
        self._tokens = other._tokens

    def fork_at(self, rows: Sequence[int], lengths: Sequence[int]) -> HybridCache:
        """Branch rows (Mirror-SD's rollouts): row r copies row `rows[r]`'s KV (all `offset`
        columns) and its linear states after `lengths[r]` tokens, landed by replay from the log.
        The caller masks the KV columns [lengths[r], offset) (`holes_ok` checks exactly that)."""
        if self.rollback != "replay":
            raise DuetError(
                "branch rows of a hybrid draft land by replay; run the torch draft "
                "with --hybrid-rollback replay (or the ONNX draft)"
            )
        rows, lengths = list(rows), [int(n) for n in lengths]
        new, at = self.fork(rows), self.offset
        keys = list(zip(rows, lengths, strict=True))  # (source row, length) per new row
        for i, layer in enumerate(self._layers):
            if isinstance(layer, _Linear):
                got = {key: layer.state_at(key[1], key[0]) for key in set(keys)}
                conv, rec = (torch.cat([got[key][t] for key in keys]) for t in (0, 1))
                new._layers[i] = _Linear(conv, rec, at)
        new._fork = (at, np.array(lengths))
        return new

    def holes_ok(self, keys) -> bool:
        """Do `keys` (B, S) hide exactly what each row's linear states did not see?"""
        return branch_keys_ok(self._fork, keys)

    def keep_columns(self, cols: Sequence[int]) -> None:
        """Commit a branch row: keep KV columns `cols`, a prefix [0, p) and then the row's own
        first m columns after the fork; its linear states land on its m own tokens (on an
        unforked cache `cols` must be a prefix: a trim)."""
        cols = list(cols)
        if self._fork is None:
            assert cols == list(range(len(cols))), "keep_columns on an unforked cache is a trim"
            self.trim(self.offset - len(cols))
            return
        at, lengths = self._fork
        own = [c for c in cols if c >= at]
        prefix = len(cols) - len(own)
        assert own == list(range(at, at + len(own))) and cols[:prefix] == list(range(prefix))
        assert self._batch > 1 or prefix == lengths[0], "the prefix the row's states saw"
        for i, layer in enumerate(self._layers):
            if isinstance(layer, _Linear):
                assert layer.base == at, "the log restarted after the fork"
                layer.keep_own(prefix, len(own))
            else:
                k, v = self.get(i)
                self._layers[i] = [k[:, :, cols], v[:, :, cols], len(cols)]
        self._fork = None

    def states(self) -> list[tuple]:
        """Every layer's live cache tensors (for parity checks against a fresh prefill)."""
        return [self.get(i) for i in range(len(self._layers))]
