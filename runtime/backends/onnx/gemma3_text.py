"""Gemma 3 on ONNX Runtime: the graph of converters/onnx_gemma3_export.py over a
SlidingKVCache (runtime/caches/sliding.py) of numpy arrays.

Beside the optimum-style feed it passes `past_positions`, the positions of the columns the
local layers hold (every local layer holds the same ones: they see the same forwards), and
appends the new tokens' positions to them for the cache. Masks are what OnnxCausalLM takes:
causal, minus key holes per row (branch rows); tree masks need the mlx or torch backend.
"""

from __future__ import annotations

import numpy as np

from runtime.backends.onnx.llama import OnnxCausalLM, empty_past, key_mask
from runtime.caches.sliding import SlidingKVCache
from runtime.model import check_tokens, default_positions


class OnnxGemma3LM(OnnxCausalLM):
    """CausalLM over a Gemma 3 ONNX export."""

    def new_cache(self, batch: int = 1) -> SlidingKVCache:
        c = self.config
        return SlidingKVCache(
            c.sliding,
            c.sliding_window,
            batch,
            empty_past(c, self._kv_dtype),
            lambda b: np.zeros((b, 0), np.int64),
        )

    def forward(self, tokens, cache, *, positions=None, mask=None) -> np.ndarray:
        ids = check_tokens(tokens, self.config.vocab_size)
        B, T = ids.shape
        off = cache.offset
        pos = (
            default_positions(off, B, T)
            if positions is None
            else np.asarray(positions, np.int64).reshape(B, T)
        )
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones((B, off + T), np.int64)
            if mask is None
            else key_mask(mask, B, off, T),
            "position_ids": pos,
        }
        held = None
        for i, local in enumerate(self.config.sliding):
            got = cache.get(i)
            if local and held is None:
                held = got[2]
            assert not local or got[2].shape == held.shape, "local layers out of step"
            feed[f"past_key_values.{i}.key"] = np.ascontiguousarray(got[0])
            feed[f"past_key_values.{i}.value"] = np.ascontiguousarray(got[1])
        held = np.zeros((B, 0), np.int64) if held is None else held
        if any(self.config.sliding):  # a graph without local layers (a draft cut from the
            feed["past_positions"] = np.ascontiguousarray(held, dtype=np.int64)  # global ones)
        res = self.session.run(self._outputs, feed)
        key_pos = np.concatenate([held, pos], axis=1)  # (B, held + T)
        for i, local in enumerate(self.config.sliding):
            kv = (res[1 + 2 * i], res[2 + 2 * i])
            cache.put(i, *kv, key_pos) if local else cache.put(i, *kv)
        return res[0].astype(np.float32, copy=False)


def load(path, config, **kw) -> OnnxGemma3LM:
    """This family's entry in runtime/backends/onnx/__init__.py's FAMILIES."""
    return OnnxGemma3LM(path, config, **kw)
