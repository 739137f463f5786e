"""The MLX twin of runtime/caches/hybrid.py: preallocated KV buffers for the full-attention
layers, conv and recurrent states for the Gated DeltaNet layers, and the same exact rollback.

The bookkeeping (the base each linear layer's log starts from, when the log restarts, where
`trim` lands, `redecode`'s checkpoints and its re-run of the kept tokens as a pass of their
own through the model's `forward_layers`, emptying the cache when asked to land before the
log) is HybridCache's, inherited unchanged; this class supplies the MLX arrays:

- full-attention layers keep `[keys, values, n]` with (B, KV, capacity, D) buffers that grow
  by mlx_kv.STEP positions (MLXLayerCache's growth); trimming moves n;
- linear layers keep conv (B, K-1, Cc) and recurrent (B, Hv, Dv, Dk) states (mlx-lm's
  layouts) and, under `replay`, the per-position log of each forward: pre-conv inputs (Cc),
  normalised k before the grouped-head repeat (Hk·Dk), v (Hv·Dv) and the decay and β
  pre-activations a, b (Hv each). Landing on A kept positions takes the conv state from the
  last K-1 inputs and replays only the recurrence for A steps from the base state, through
  the model's own `gated_delta_update` call (MLXQwen3_5LM.replay): no projection, no conv,
  no other layer. Memory per logged position and linear layer: Cc + Hk·Dk + Hv·Dv + 2·Hv
  values (Cc = 2·Hk·Dk + Hv·Dv); for Qwen3.5-9B's shapes (Hk=16, Hv=32, Dk=Dv=128) 14,400
  (56 KiB fp32), against 524,288 for a per-position recurrent state. No recurrent state is
  kept per position here (HybridCache's `marks` stay empty): mlx-lm's `gated_delta_update`
  returns only the state after the whole window, so every landing replays from the base.

It does not do tree or branch masks (a linear layer has no mask) nor compaction of
non-contiguous positions (`compact`/`keep_columns`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx

from runtime.caches.hybrid import HybridCache, _Linear
from runtime.caches.mlx_kv import MLXLayerCache


class MLXHybridCache(HybridCache):
    """Per-layer KV buffers (full attention) or states (linear attention), trimmable exactly."""

    fork_at = None  # no branch rows: the MLX hybrid model refuses non-causal masks

    def __init__(
        self,
        kinds: Sequence[str],
        batch: int,
        empty_state: Callable[[int, int], tuple],
        replay: Callable[..., mx.array],
        *,
        rollback: str = "replay",
        window: int = 64,
        redecode: Callable | None = None,
    ):
        super().__init__(
            kinds,
            batch,
            lambda b: None,
            empty_state,
            rollback=rollback,
            window=window,
            redecode=redecode,
        )
        self._replay = replay  # (layer, rec, k, v, a, b) -> the state after those positions

    def get(self, i: int) -> tuple:
        """Layer i's past: live (keys, values) views (B, KV, n, D), or (conv, recurrent)."""
        layer = self._layers[i]
        if isinstance(layer, _Linear):
            return layer.conv, layer.rec
        k, v, n = layer
        return (None, None) if k is None else (k[..., :n, :], v[..., :n, :])

    def states(self) -> list[tuple]:
        """Every layer's live cache arrays (for parity checks against a fresh prefill); a
        full-attention layer that holds no position gives ()."""
        empty = [not isinstance(la, _Linear) and la[2] == 0 for la in self._layers]
        return [() if e else self.get(i) for i, e in enumerate(empty)]

    def update_kv(self, i: int, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Append k, v (B, KV, T, D) to full-attention layer i; return the live views."""
        layer = self._layers[i]
        lc = MLXLayerCache()
        lc.keys, lc.values, lc.offset = layer
        keys, values = lc.update_and_fetch(k, v)
        layer[:] = [lc.keys, lc.values, lc.offset]
        return keys, values

    def put(self, i: int, conv, rec, log) -> None:
        """Store linear layer i's new states and the forward's log (time on axis 1)."""
        layer = self._layers[i]
        layer.log.append(
            log if self.rollback == "replay" else (layer.offset, layer.conv, layer.rec)
        )
        layer.conv, layer.rec = conv, rec
        layer.offset += log[0].shape[1]

    def _drop_front(self, layer: _Linear, a: int) -> None:
        layer.restart()  # MLX rows are never forked at branch points: no need to keep the front

    def _land(self, layer: _Linear, a: int) -> None:
        if self.rollback == "replay" and 0 < a < layer.logged():
            i = self._layers.index(layer)
            qkv, k, v, pa, pb = (mx.concatenate(t, axis=1) for t in zip(*layer.log, strict=True))
            width = layer.base_conv.shape[1]  # K-1
            layer.conv = mx.concatenate([layer.base_conv, qkv[:, :a]], axis=1)[:, a : a + width]
            layer.rec = self._replay(i, layer.base_rec, k[:, :a], v[:, :a], pa[:, :a], pb[:, :a])
            mx.eval(layer.conv, layer.rec)
            layer.offset = layer.base + a
            layer.restart()
            return
        super()._land(layer, a)  # a == 0, a == logged, or redecode: no arrays to build

    def _clear(self) -> int:
        dropped, self._fork = self.offset, None
        self._tokens = self._tokens[:, :0]
        for i, layer in enumerate(self._layers):
            if isinstance(layer, _Linear):
                self._layers[i] = _Linear(mx.zeros_like(layer.conv), mx.zeros_like(layer.rec))
            else:
                layer[2] = 0
        return dropped

    def fork(self, rows: Sequence[int]) -> MLXHybridCache:
        """A new cache holding copies of `rows`; this one is unchanged."""
        idx = mx.array(list(rows), dtype=mx.int32)
        new = MLXHybridCache.__new__(MLXHybridCache)
        new.kinds, new.rollback, new.window = self.kinds, self.rollback, self.window
        new.keep, new.stride = self.keep, self.stride
        new._batch, new._replay, new._layers = len(rows), self._replay, []
        new._redecode, new._tokens, new.redecoded = self._redecode, self._tokens[list(rows)], 0
        new._fork = None  # MLX rows are never forked at branch points (mirror refuses them)
        for layer in self._layers:
            if isinstance(layer, _Linear):
                copy = _Linear(layer.conv[idx], layer.rec[idx], layer.offset)
                copy.base_conv, copy.base_rec = layer.base_conv[idx], layer.base_rec[idx]
                copy.base = layer.base
                copy.log = [
                    tuple(t[idx] if isinstance(t, mx.array) else t for t in e) for e in layer.log
                ]
                new._layers.append(copy)
            else:
                k, v, n = layer
                new._layers.append([None, None, n] if k is None else [k[idx], v[idx], n])
        return new
