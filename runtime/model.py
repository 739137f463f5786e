"""The one protocol every backend implements: a causal LM over a trimmable KV cache.

Arrays that cross this boundary are NumPy: token ids int64 (B, T), logits
float32 (B, T, V), masks bool. Hidden states stay backend-native (an mx.array,
a torch.Tensor) because they only travel between `forward_layers` and `head`
of the same model. This module knows nothing about decoding or tokenization.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from runtime.config import ModelConfig


@runtime_checkable
class KVCache(Protocol):
    """A per-model KV cache (all layers), every row at the same length.

    Rollback is moving an offset; branches are rows.
    """

    @property
    def offset(self) -> int:
        """Tokens held per row (after the last full forward)."""

    @property
    def batch(self) -> int:
        """Number of rows."""

    is_trimmable: bool

    def trim(self, n: int) -> int:
        """Drop the last `n` tokens of every row and layer; returns how many were dropped."""

    def select(self, rows: Sequence[int]) -> None:
        """Keep rows `rows`, in that order (repeats fork a row; one index commits a branch)."""

    def fork(self, rows: Sequence[int]) -> KVCache:
        """A new cache with copies of `rows` (branch rollouts); this one is unchanged."""


@runtime_checkable
class CausalLM(Protocol):
    """A causal LM with an incremental, trimmable cache, whatever runs it."""

    config: ModelConfig
    backend: str  # "mlx", "onnx", "torch", "coreml"
    supports_layer_range: bool  # can run layers [start, stop) and apply the head to any hidden

    def new_cache(self, batch: int = 1) -> KVCache:
        """An empty cache with `batch` rows."""

    def forward(
        self,
        tokens: np.ndarray,
        cache: KVCache,
        *,
        positions: np.ndarray | None = None,
        mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Run all layers over `tokens` (B, T), appending T positions to `cache`.

        positions: int (B, T), default `cache.offset + arange(T)`.
        mask: bool (B, T, offset + T) or (T, offset + T), True = may attend;
        default causal. Returns float32 logits (B, T, V).
        """

    def forward_layers(
        self,
        x: Any,
        cache: KVCache,
        start: int,
        stop: int,
        *,
        positions: np.ndarray | None = None,
        mask: np.ndarray | None = None,
    ) -> Any:
        """Run layers [start, stop) (0-based). `x` is token ids (B, T) when start == 0,
        else the hidden state returned by the previous range. Returns the hidden state."""

    def head(self, hidden: Any) -> np.ndarray:
        """Final norm + LM head on any hidden state (Mirror-SD eq. 6): float32 (B, T, V)."""


def default_positions(offset: int, batch: int, length: int) -> np.ndarray:
    """Contiguous positions continuing a cache of `offset` tokens: int64 (B, T)."""
    return np.broadcast_to(
        np.arange(offset, offset + length, dtype=np.int64), (batch, length)
    ).copy()


def causal_mask(offset: int, length: int) -> np.ndarray:
    """bool (T, offset + T): token t sees the cache and itself and earlier new tokens."""
    q = np.arange(length)[:, None] + offset
    k = np.arange(offset + length)[None, :]
    return k <= q


def check_tokens(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Validate and normalize token ids to int64 (B, T)."""
    t = np.asarray(tokens)
    if t.ndim == 1:
        t = t[None, :]
    assert t.ndim == 2, f"tokens must be (B, T), got {t.shape}"
    t = t.astype(np.int64, copy=False)
    if t.size and (t.min() < 0 or t.max() >= vocab_size):
        from runtime.errors import DuetError

        raise DuetError(f"token id out of range [0, {vocab_size}): min {t.min()}, max {t.max()}")
    return t
