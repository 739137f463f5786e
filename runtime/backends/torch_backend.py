"""The PyTorch reference backend: `TorchLM` behind the CausalLM protocol."""

from __future__ import annotations

import numpy as np
import torch

from runtime.backends.torch_ref import TorchLM, load_torch_lm
from runtime.cache import ConcatKVCache
from runtime.model import causal_mask, check_tokens, default_positions


class TorchCausalLM:
    """CausalLM on CPU PyTorch (float32): the slow, obviously-correct path."""

    backend = "torch"
    supports_layer_range = True

    def __init__(self, module: TorchLM, threads: int | None = None):
        self.module = module
        self.config = module.cfg
        if threads:
            torch.set_num_threads(threads)

    @classmethod
    def load(cls, path, threads: int | None = None) -> TorchCausalLM:
        return cls(load_torch_lm(path), threads)

    def new_cache(self, batch: int = 1) -> ConcatKVCache:
        c = self.config
        dtype = next(self.module.parameters()).dtype
        return ConcatKVCache(
            c.num_layers,
            batch,
            lambda b: torch.zeros(b, c.num_kv_heads, 0, c.head_dim, dtype=dtype),
        )

    def _inputs(self, n_new: int, batch: int, offset: int, positions, mask):
        pos = (
            default_positions(offset, batch, n_new) if positions is None else np.asarray(positions)
        )
        m = causal_mask(offset, n_new) if mask is None else np.asarray(mask, dtype=bool)
        m = np.broadcast_to(m, (batch, n_new, offset + n_new))
        return torch.from_numpy(np.ascontiguousarray(pos, dtype=np.int64)), torch.from_numpy(
            m.copy()
        )[:, None]

    @torch.inference_mode()
    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        if start == 0:
            x = torch.from_numpy(check_tokens(x, self.config.vocab_size))
        B, T = x.shape[:2]
        offset = cache.layer_offset(start)
        pos, m = self._inputs(T, B, offset, positions, mask)
        past = [cache.get(i) for i in range(start, stop)]
        h, presents = self.module.run_layers(x, start, stop, pos, m, past)
        for i, (k, v) in zip(range(start, stop), presents, strict=True):
            cache.put(i, k, v)
        return h

    @torch.inference_mode()
    def head(self, hidden) -> np.ndarray:
        return self.module.head(hidden).float().numpy()

    def forward(self, tokens, cache, *, positions=None, mask=None) -> np.ndarray:
        h = self.forward_layers(
            tokens, cache, 0, self.config.num_layers, positions=positions, mask=mask
        )
        return self.head(h)
