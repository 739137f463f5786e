"""OneRowSlots: the bookkeeping of a batch-1 cache of fixed slots (a static-shape export's).

The Core ML draft (runtime/backends/coreml/causal_lm.py) and the static-shape ONNX draft
(runtime/backends/onnx/static_host.py) each hold their keys and values in a fixed number of
slots; rollback is moving the offset, because the additive mask hides slots at or past it
and the next call overwrites them. They hold one row, so only row 0 can be selected.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.errors import DuetError


class OneRowSlots:
    """The offset, trim and the one row of a fixed-slot cache; `holder` names it in errors."""

    is_trimmable = True
    holder = "this cache"

    _offset = 0

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def batch(self) -> int:
        return 1

    def advance(self, n: int) -> None:
        self._offset += n

    def trim(self, n: int) -> int:
        n = max(0, min(n, self._offset))
        self._offset -= n  # the mask hides the dropped slots; the next call overwrites them
        return n

    def select(self, rows: Sequence[int]) -> None:
        if list(rows) != [0]:
            raise DuetError(f"{self.holder} holds one cache row; cannot select rows {list(rows)}")
