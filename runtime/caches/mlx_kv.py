"""The MLX KV cache: preallocated per-layer buffers, rollback by offset.

Same informal interface as mlx-lm's KVCache (`update_and_fetch`, `offset`,
`trim`, `is_trimmable`) per layer, wrapped in one model-level object with
`select` for branch rows. Buffers grow in steps of `STEP` positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

STEP = 256


class MLXLayerCache:
    def __init__(self):
        self.keys: mx.array | None = None  # (B, KV, capacity, D)
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Append k, v (B, KV, T, D) at `offset`; return the live (B, KV, offset, D) views."""
        prev, T = self.offset, k.shape[2]
        if self.keys is None or prev + T > self.keys.shape[2]:
            B, H, _, D = k.shape
            cap = ((prev + T + STEP - 1) // STEP) * STEP
            nk, nv = mx.zeros((B, H, cap, D), k.dtype), mx.zeros((B, H, cap, v.shape[3]), v.dtype)
            if self.keys is not None and prev:
                nk[..., :prev, :] = self.keys[..., :prev, :]
                nv[..., :prev, :] = self.values[..., :prev, :]
            self.keys, self.values = nk, nv
        self.keys[..., prev : prev + T, :] = k
        self.values[..., prev : prev + T, :] = v
        self.offset = prev + T
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]


class MLXKVCache:
    """All layers of one model; every row at the same length."""

    is_trimmable = True

    def __init__(self, num_layers: int, batch: int):
        self.layers = [MLXLayerCache() for _ in range(num_layers)]
        self._batch = batch

    @property
    def offset(self) -> int:
        return self.layers[-1].offset

    @property
    def batch(self) -> int:
        return self._batch

    def layer_offset(self, i: int) -> int:
        return self.layers[i].offset

    def trim(self, n: int) -> int:
        n = max(0, min(n, min(c.offset for c in self.layers)))
        for c in self.layers:
            c.offset -= n
        return n

    def fork(self, rows: Sequence[int]) -> MLXKVCache:
        """A new cache holding copies of `rows`; this one is unchanged."""
        idx = mx.array(list(rows))
        new = MLXKVCache(len(self.layers), len(rows))
        for src, dst in zip(self.layers, new.layers, strict=True):
            if src.keys is not None:
                dst.keys, dst.values = src.keys[idx], src.values[idx]
            dst.offset = src.offset
        return new

    def select(self, rows: Sequence[int]) -> None:
        idx = mx.array(list(rows))
        for c in self.layers:
            if c.keys is not None:
                c.keys, c.values = c.keys[idx], c.values[idx]
        self._batch = len(rows)

    def compact(self, base: int, cols: Sequence[int]) -> None:
        """Keep positions [0, base) and move positions `cols` (each >= base, increasing) right
        after them, in place (see ConcatKVCache.compact)."""
        cols = list(cols)
        for c in self.layers:
            if c.keys is not None and cols:
                idx = mx.array(cols, dtype=mx.int32)
                c.keys[:, :, base : base + len(cols)] = c.keys[:, :, idx]
                c.values[:, :, base : base + len(cols)] = c.values[:, :, idx]
            c.offset = base + len(cols)

    def keep_columns(self, cols: Sequence[int]) -> None:
        """Keep only these sequence positions (in this order); see ConcatKVCache.keep_columns."""
        cols = list(cols)
        idx = mx.array(cols, dtype=mx.int32)
        for c in self.layers:
            if c.keys is not None and cols:
                c.keys, c.values = c.keys[:, :, idx], c.values[:, :, idx]
            c.offset = len(cols)
