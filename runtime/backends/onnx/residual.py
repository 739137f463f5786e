"""The ONNX target's hidden state between its parts (`Residual`), the padding of one-row
products (PAD_ONE_TOKEN and ONE_ROW in runtime/backends/onnx/target.py), and the forward that
records the hidden states a draft reads (`forward_recording`)."""

from __future__ import annotations

import numpy as np

from runtime.errors import DuetError


class Residual:
    """The hidden state between the ONNX target's parts: the residual stream `h` and its last
    block's output `resid`, not yet added. The next part's first norm adds and normalises them
    in one SkipSimplifiedLayerNormalization, exactly as the whole graph does at that layer
    (converters/onnx_target_graph.py, residual_inputs), so a pass through parts (Mirror-SD's
    early exit, a fitted head's taps) gives the whole graph's logits to the bit. Indexed like
    an array (both halves alike); `sum()` (and np.asarray) is the hidden state itself."""

    def __init__(self, h: np.ndarray, resid: np.ndarray):
        self.h, self.resid = h, resid

    @classmethod
    def of(cls, x) -> Residual:
        """x itself, or a plain hidden state as a Residual (its last addition already made)."""
        if isinstance(x, Residual):
            return x
        x = np.ascontiguousarray(x, dtype=np.float32)
        return cls(x, np.zeros_like(x))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.h.shape

    def __getitem__(self, key) -> Residual:
        return Residual(self.h[key], self.resid[key])

    def sum(self) -> np.ndarray:
        return self.h + self.resid

    def feed(self) -> dict:
        """The inputs of the part that takes it: `hidden_in` and `resid_in`."""
        return {
            "hidden_in": np.ascontiguousarray(self.h),
            "resid_in": np.ascontiguousarray(self.resid),
        }

    def __array__(self, dtype=None, copy=None):
        s = self.sum()
        return s if dtype is None else s.astype(dtype)


def _cat(parts: list, axis: int = 1):
    """np.concatenate over arrays or Residuals."""
    if isinstance(parts[0], Residual):
        return Residual(_cat([p.h for p in parts], axis), _cat([p.resid for p in parts], axis))
    return np.concatenate(parts, axis=axis)


def _carried(start: int, x) -> dict:
    """A pass's first inputs: ids for a part from layer 0, else the Residual's two halves."""
    return {"input_ids": x} if start == 0 else x.feed()


def _pad_one(x, pos, m):
    """A one-token pass as two rows (PAD_ONE_TOKEN): the token again, at the same position,
    seeing what the token sees and itself; the token's row does not see it. Its logits are
    never computed (head_rows), its hidden row and its key column are dropped."""
    B, _, S = m.shape
    m2 = np.zeros((B, 2, S + 1), bool)
    m2[:, :, :S] = m[:, :1]
    m2[:, 1, S] = True
    return _cat([x, x]), np.concatenate([pos, pos], axis=1), m2


def one_row_apart() -> bool:
    """Whether this CPU's MatMulNBits gives a one-row product other bits than the same row in a
    product of several (ONE_ROW in runtime/backends/onnx/target.py; cpu_int8.one_row_kernel)."""
    from runtime.backends.onnx.cpu_int8 import int8_path

    return int8_path().one_row_kernel


def head_span(lo: int, hi: int, T: int) -> tuple[int, int]:
    """The rows [lo, hi) of a T-row pass (T >= 2) the head runs on: one row widened to two where
    one_row_apart (ONE_ROW), the row before it or else the one after (a padded one-token pass's
    second row); the caller keeps only [lo, hi) of the logits."""
    if hi - lo != 1 or not one_row_apart():
        return lo, hi
    if T < 2:
        raise DuetError("ONNX target: a one-row head on a one-row pass (it must be padded)")
    return (lo - 1, hi) if lo > 0 else (lo, hi + 1)


def forward_recording(lm, ids, cache, positions, mask, last) -> np.ndarray:
    """A forward that keeps on the cache what a draft reading the target's hidden states needs
    (runtime/backends/torch/causal_lm.record_rows): a fitted head's taps (`record_layers`: read
    off the whole graph's own residual sums, one run, the graph `full.taps.*`) or an
    MTP head's post-norm last hidden state (the whole graph's hidden output through the
    checkpoint's final norm, `lm.hidden_norm`, set by the MTP draft)."""
    import torch

    from runtime.backends.torch.causal_lm import record_rows

    if ids.shape[0] != 1:
        raise DuetError("a draft that reads the target's hidden states drafts one row only")
    n = lm.config.num_layers
    if not lm.record_layers:  # MTP: the last layer's output, normed
        logits, h = lm._run(ids, cache, 0, n, True, positions, mask, last)
        with torch.inference_mode():
            record_rows(cache, lm.hidden_norm(torch.from_numpy(h))[0], ids)
        lm.last_cache = cache
        return logits
    # the whole graph with the taps as a third output (converters/onnx_target_graph.tap_output)
    logits, _h, taps = lm._run(
        ids, cache, 0, n, True, positions, mask, last, tuple(lm.record_layers)
    )
    record_rows(cache, torch.from_numpy(np.ascontiguousarray(taps[0])), ids)
    lm.last_cache = cache
    return logits
