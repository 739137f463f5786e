"""KV caches for the host-array backends (PyTorch reference, ONNX Runtime).

One object holds every layer's keys and values as (B, KV, S, D) arrays of the
backend's type (torch.Tensor or np.ndarray). Rollback is moving an offset: the
arrays are sliced lazily on read, so `trim` is O(1). Rows are branches:
`select` keeps, reorders or repeats rows. The MLX backend has its own
preallocated cache (runtime/caches/mlx_kv.py) with the same interface.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from runtime.caches.layer_offsets import LayerOffsets


class ConcatKVCache(LayerOffsets):
    """Per-layer (keys, values) with per-layer offsets, so a layer range can run ahead."""

    def __init__(self, num_layers: int, batch: int, empty: Callable[[int], Any]):
        self._empty = empty  # batch -> an empty (B, KV, 0, D) array
        self._batch = batch
        self._kv: list[tuple[Any, Any]] = [(empty(batch), empty(batch)) for _ in range(num_layers)]
        self._offsets = [0] * num_layers

    def get(self, i: int) -> tuple[Any, Any]:
        """Layer i's live (keys, values), each (B, KV, offset_i, D)."""
        k, v = self._kv[i]
        n = self._offsets[i]
        if k.shape[2] != n:
            k, v = k[:, :, :n], v[:, :, :n]
            self._kv[i] = (k, v)
        return k, v

    def put(self, i: int, k: Any, v: Any) -> None:
        """Replace layer i with (past + new) keys and values."""
        self._kv[i] = (k, v)
        self._offsets[i] = k.shape[2]

    def fork(self, rows: Sequence[int]) -> ConcatKVCache:
        """A new cache holding copies of `rows`; this one is unchanged."""
        rows = list(rows)
        new = ConcatKVCache.__new__(ConcatKVCache)
        new._empty, new._batch, new._offsets = self._empty, len(rows), list(self._offsets)
        new._kv = [(k[rows], v[rows]) for k, v in (self.get(i) for i in range(len(self._kv)))]
        return new

    def select(self, rows: Sequence[int]) -> None:
        rows = list(rows)
        self._kv = [(k[rows], v[rows]) for k, v in (self.get(i) for i in range(len(self._kv)))]
        self._batch = len(rows)

    def keep_columns(self, cols: Sequence[int]) -> None:
        """Keep only these sequence positions (in this order): closes the holes a masked branch
        batch leaves, once one branch row is committed. Runs of consecutive positions are
        sliced and the slices concatenated, like every forward here (inference tensors refuse
        in-place writes outside inference mode; gathering the whole prefix by an index list
        cost milliseconds per tree step on the torch backend)."""
        runs: list[list[int]] = []  # [start, stop) of each run of consecutive positions
        for c in cols:
            if runs and runs[-1][1] == c:
                runs[-1][1] += 1
            else:
                runs.append([c, c + 1])
        kv = []
        for i in range(len(self._kv)):
            k, v = self.get(i)
            if len(runs) == 1 and runs[0][0] == 0:  # a prefix: a view, like trim
                k, v = k[:, :, : runs[0][1]], v[:, :, : runs[0][1]]
            elif not runs:
                k, v = k[:, :, :0], v[:, :, :0]
            else:
                k = _cat([k[:, :, a:b] for a, b in runs])
                v = _cat([v[:, :, a:b] for a, b in runs])
            kv.append((k, v))
        self._kv = kv
        self._offsets = [len(cols)] * len(self._kv)


def _cat(parts: list) -> Any:
    """Concatenate NumPy or torch arrays along the sequence axis (2)."""
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=2)
    import torch

    return torch.cat(parts, dim=2)
