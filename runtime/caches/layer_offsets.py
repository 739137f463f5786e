"""What the host-array KV caches share (concat.py's ConcatKVCache, buffer.py's BufferKVCache):
one offset per layer, so a layer range can run ahead, the last layer's read as the cache's;
`trim` moves every offset back (rollback is moving an offset) and `compact` is `keep_columns`
of the committed prefix and the accepted tree nodes. The arrays, their reads and writes, stay
with each cache."""

from __future__ import annotations

from collections.abc import Sequence


class LayerOffsets:
    """Per-layer offsets `_offsets` and a row count `_batch`, set by the subclass."""

    is_trimmable = True
    _offsets: list[int]
    _batch: int

    @property
    def offset(self) -> int:
        return self._offsets[-1]

    @property
    def batch(self) -> int:
        return self._batch

    def layer_offset(self, i: int) -> int:
        return self._offsets[i]

    def trim(self, n: int) -> int:
        n = max(0, min(n, min(self._offsets)))
        self._offsets = [o - n for o in self._offsets]
        return n

    def compact(self, base: int, cols: Sequence[int]) -> None:
        """Keep positions [0, base) and move positions `cols` (each >= base, increasing) right
        after them: commits the accepted nodes of a verified tree."""
        self.keep_columns(list(range(base)) + list(cols))

    def keep_columns(self, cols: Sequence[int]) -> None:
        raise NotImplementedError
