"""A NumPy KV cache of preallocated per-layer buffers, written in place by the ONNX target.

The ONNX Runtime target (runtime/backends/onnx/target.py) binds each layer's buffer
(B, KV, capacity, D) as both the graph's `past.{i}.*` input and its `present.{i}.*` output:
GroupQueryAttention then appends a pass's keys and values at the layer's offset in place (its
past/present shared-buffer mode, as onnxruntime-genai's `past_present_share_buffer` runs it),
so a decode step copies no past. With a concatenating cache every step copies each layer's
whole past twice (the kernel's present, then the host's), and allocates it afresh.

Same interface as runtime/caches/concat.py's ConcatKVCache (offsets per layer, `trim` moves an
offset, `get` returns live views; `fork`, `select`, `compact`, `keep_columns` for trees and branch
rows), plus what an in-place run needs: `reserve` (capacity for a pass, grown in steps of
STEP positions, the live prefix copied over) and `advance`. A buffer's columns past its offset
are stale: every read goes through an offset, as the MLX cache's do (runtime/caches/mlx_kv.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from runtime.caches.layer_offsets import LayerOffsets

STEP = 256  # capacity grows in steps of this many positions
_LAYOUTS = itertools.count()  # layout tokens, unique across every cache of the process


class BufferKVCache(LayerOffsets):
    """Per-layer (keys, values) buffers (B, KV, capacity, D) float32 with per-layer offsets."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        max_context: int | None = None,
    ):
        self._shape = (kv_heads, head_dim)
        self._batch = batch
        self._max = max_context
        self._kv = [self._alloc(batch, 0) for _ in range(num_layers)]
        self._offsets = [0] * num_layers
        # changes whenever any buffer is replaced (grown, rows selected): a binding of the
        # buffers (runtime/backends/onnx/target.py) made under the same token is still valid
        self.layout = next(_LAYOUTS)

    def _alloc(self, batch: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
        kv, d = self._shape
        return (
            np.zeros((batch, kv, cap, d), np.float32),
            np.zeros((batch, kv, cap, d), np.float32),
        )

    def capacity(self, i: int) -> int:
        return self._kv[i][0].shape[2]

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's live (keys, values) views, each (B, KV, offset_i, D)."""
        k, v = self._kv[i]
        n = self._offsets[i]
        return k[:, :, :n], v[:, :, :n]

    def buffers(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's whole buffers (B, KV, capacity, D): what an in-place pass binds."""
        return self._kv[i]

    def reserve(self, i: int, total: int) -> None:
        """Room for `total` positions in layer i (a pass of total - offset tokens)."""
        k, v = self._kv[i]
        if total <= k.shape[2]:
            return
        cap = -(-total // STEP) * STEP
        if self._max is not None:
            cap = max(total, min(cap, self._max))
        nk, nv = self._alloc(self._batch, cap)
        n = self._offsets[i]
        nk[:, :, :n], nv[:, :, :n] = k[:, :, :n], v[:, :, :n]
        self._kv[i] = (nk, nv)
        self.layout = next(_LAYOUTS)

    def advance(self, i: int, n: int) -> None:
        """Layer i now holds n more positions (a pass wrote them in place)."""
        self._offsets[i] += n

    def put(self, i: int, k: np.ndarray, v: np.ndarray) -> None:
        """Replace layer i with (past + new) keys and values (B, KV, S, D)."""
        S = k.shape[2]
        self._offsets[i] = min(self._offsets[i], S)
        self.reserve(i, S)
        bk, bv = self._kv[i]
        bk[:, :, :S], bv[:, :, :S] = k, v
        self._offsets[i] = S

    def fork(self, rows: Sequence[int]) -> BufferKVCache:
        """A new cache holding copies of `rows`; this one is unchanged."""
        rows = list(rows)
        new = BufferKVCache.__new__(BufferKVCache)
        new._shape, new._max, new._batch = self._shape, self._max, len(rows)
        new._offsets = list(self._offsets)
        new._kv = [(k[rows], v[rows]) for k, v in self._kv]  # fancy indexing copies
        new.layout = next(_LAYOUTS)
        return new

    def select(self, rows: Sequence[int]) -> None:
        rows = list(rows)
        self._kv = [(k[rows], v[rows]) for k, v in self._kv]
        self._batch = len(rows)
        self.layout = next(_LAYOUTS)

    def keep_columns(self, cols: Sequence[int]) -> None:
        """Keep only these sequence positions (in this order), in place: a prefix is an offset;
        otherwise the kept columns are gathered (a copy) and written back from column 0."""
        cols = list(cols)
        prefix = cols == list(range(len(cols)))
        for i, (k, v) in enumerate(self._kv):
            if not prefix:
                idx = np.asarray(cols, dtype=np.int64)
                k[:, :, : len(cols)], v[:, :, : len(cols)] = k[:, :, idx], v[:, :, idx]
            self._offsets[i] = len(cols)
