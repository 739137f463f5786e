"""The PyTorch reference backend: `TorchLM` (or the hybrid `Qwen3_5LM`) behind the CausalLM
protocol.

On the CPU (default) or a CUDA GPU (`device="cuda"`, `--target-device cuda`): weights,
cache and every intermediate stay on that device; only logits come back, as numpy.
A hybrid model gets a HybridCache (runtime/caches/hybrid.py) and runs only causal windows,
or branch rows forked at their branch points: its linear-attention layers have no mask, so
tree masks are refused.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.backends.torch import load_torch_lm
from runtime.backends.torch.llama import TorchLM
from runtime.caches.concat import ConcatKVCache
from runtime.model import causal_mask, check_tokens, default_positions

DEVICES = ("cpu", "cuda")


def torch_device(name: str) -> torch.device:
    """`cpu` or `cuda`; a clear DuetError when CUDA is asked for and PyTorch sees none."""
    from runtime.errors import DuetError

    if name not in DEVICES:
        raise DuetError(f"--target-device must be one of {', '.join(DEVICES)} (got {name!r})")
    if name == "cuda" and not torch.cuda.is_available():
        build = (
            f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        )
        raise DuetError(
            f"--target-device cuda: PyTorch {torch.__version__} ({build}) sees no CUDA GPU; "
            "use --target-device cpu"
        )
    return torch.device(name)


class TorchCausalLM:
    """CausalLM on PyTorch (float32), CPU or CUDA: the slow, obviously-correct path."""

    backend = "torch"
    supports_layer_range = True

    def __init__(
        self,
        module: TorchLM,
        threads: int | None = None,
        device: str = "cpu",
        hybrid_rollback: str = "replay",
    ):
        self.device = torch_device(device)
        self.module = module.to(self.device)
        self.config = module.cfg
        self.hybrid_rollback = hybrid_rollback  # HybridCache rollback: "replay" or "redecode"
        if threads:
            torch.set_num_threads(threads)

    @classmethod
    def load(
        cls, path, threads: int | None = None, device: str = "cpu", hybrid_rollback="replay"
    ) -> TorchCausalLM:
        dev = torch_device(device)  # before loading: a missing GPU is reported at once
        return cls(load_torch_lm(path), threads, dev.type, hybrid_rollback)

    def new_cache(self, batch: int = 1):
        c = self.config
        dtype = next(self.module.parameters()).dtype
        if c.is_hybrid:
            from runtime.caches.hybrid import HybridCache

            layers = self.module.model.layers
            return HybridCache(
                c.layer_types,
                batch,
                lambda b: torch.zeros(
                    b, c.num_kv_heads, 0, c.head_dim, dtype=dtype, device=self.device
                ),
                lambda i, b: tuple(
                    t.to(self.device) for t in layers[i].linear_attn.empty_state(b, dtype)
                ),
                rollback=self.hybrid_rollback,
                redecode=lambda t, cache: self.forward_layers(t, cache, 0, c.num_layers),
            )
        empty = lambda b: torch.zeros(  # noqa: E731
            b, c.num_kv_heads, 0, c.head_dim, dtype=dtype, device=self.device
        )
        if any(c.sliding):  # Gemma 3: local layers keep their window (runtime/caches/sliding.py)
            from runtime.caches.sliding import SlidingKVCache

            return SlidingKVCache(
                c.sliding,
                c.sliding_window,
                batch,
                empty,
                lambda b: torch.zeros(b, 0, dtype=torch.int64, device=self.device),
            )
        return ConcatKVCache(c.num_layers, batch, empty)

    def _inputs(self, n_new: int, batch: int, offset: int, positions, mask):
        pos = (
            default_positions(offset, batch, n_new) if positions is None else np.asarray(positions)
        )
        m = causal_mask(offset, n_new) if mask is None else np.asarray(mask, dtype=bool)
        m = np.broadcast_to(m, (batch, n_new, offset + n_new))
        pos = torch.from_numpy(np.ascontiguousarray(pos, dtype=np.int64)).to(self.device)
        return pos, torch.from_numpy(m.copy())[:, None].to(self.device)

    @torch.inference_mode()
    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        if start == 0:
            x = check_tokens(x, self.config.vocab_size)
            if self.config.is_hybrid:
                cache.feed(x)  # HybridCache's redecode re-runs these ids
            x = torch.from_numpy(x).to(self.device)
        B, T = x.shape[:2]
        offset = cache.layer_offset(start)
        if self.config.is_hybrid and mask is not None:
            _causal_only(np.asarray(mask, dtype=bool), offset, T, cache)
        pos, m = self._inputs(T, B, offset, positions, mask)
        if self.config.is_hybrid:
            for i in range(start, stop):
                cache.begin(i, T)
        past = [cache.get(i) for i in range(start, stop)]
        if self.config.is_hybrid:  # linear layers: which of the window's states to keep
            kinds = self.config.layer_types
            past = [
                (*p, cache.wanted(i, T)) if kinds[i] == "linear_attention" else p
                for i, p in zip(range(start, stop), past, strict=True)
            ]
        h, presents = self.module.run_layers(x, start, stop, pos, m, past)
        for i, present in zip(range(start, stop), presents, strict=True):
            cache.put(i, *present)
        return h

    @torch.inference_mode()
    def head(self, hidden) -> np.ndarray:
        return self.module.head(hidden).float().cpu().numpy()

    record_hidden = False  # set by an MTP draft: caches keep the post-norm hidden states
    last_cache = None  # the cache of the last forward (where an MTP draft reads them)
    # set by a feature-level head (--draft head, runtime/drafts/head/torch.py): record the
    # outputs of these layers (concatenated) instead of the post-norm last hidden state
    record_layers: tuple[int, ...] | None = None

    def forward(self, tokens, cache, *, positions=None, mask=None) -> np.ndarray:
        if self.record_hidden and self.record_layers:
            h, taps = self._forward_taps(tokens, cache, positions, mask)
            self._record(cache, h, tokens, taps)
            return self.head(h)
        h = self.forward_layers(
            tokens, cache, 0, self.config.num_layers, positions=positions, mask=mask
        )
        if self.record_hidden:
            self._record(cache, h, tokens)
        return self.head(h)

    def _forward_taps(self, tokens, cache, positions, mask):
        """The forward as layer ranges cut after each tapped layer: (h, taps (B, T, n*H))."""
        out, h, start = {}, tokens, 0
        for stop in sorted({i + 1 for i in self.record_layers}) + [self.config.num_layers]:
            if stop > start:
                h = self.forward_layers(h, cache, start, stop, positions=positions, mask=mask)
            out[stop - 1], start = h, stop
        return h, torch.cat([out[i] for i in self.record_layers], dim=-1)

    @torch.inference_mode()
    def _record(self, cache, h, tokens, feats=None) -> None:
        """The post-norm hidden states of row 0 (or `feats`, a fitted head's taps) kept on the
        cache for a draft that reads them (record_rows)."""
        record_rows(cache, self.module.model.norm(h)[0] if feats is None else feats[0], tokens)
        self.last_cache = cache


def record_rows(cache, rows: torch.Tensor, tokens) -> None:
    """cache.hidden: the rows (T, H or n*H) of a pass that ends at cache.offset, position-aligned
    (rows past len(cache.hidden_ids) are spare capacity), and cache.hidden_ids the token ids they
    were computed for (-1 where never recorded). Written in place into a buffer that doubles
    when full: a verify step copies its window, not the whole history. The PyTorch and the ONNX
    target (runtime/backends/onnx/target.py) both keep them so."""
    end = cache.offset
    start = end - rows.shape[0]
    buf, ids = getattr(cache, "hidden", None), getattr(cache, "hidden_ids", [])
    if buf is None or len(ids) < start:  # positions never recorded: zeros
        buf, ids = None, [-1] * start
    del ids[start:]
    if buf is None or buf.shape[0] < end:
        grown = torch.zeros(
            max(end, 2 * (0 if buf is None else buf.shape[0]), 64),
            rows.shape[1],
            dtype=rows.dtype,
            device=rows.device,
        )
        if buf is not None:
            grown[:start] = buf[:start]
        buf = grown
    buf[start:end] = rows
    ids += np.asarray(tokens)[0].tolist()
    cache.hidden, cache.hidden_ids = buf, ids


@torch.inference_mode()
def compact_rows(cache, base: int, cols) -> None:
    """The recorded rows after a tree's commit (runtime/decoding/tree_pass.commit): positions
    [0, base) kept, the accepted nodes' rows `cols` moved right after them."""
    ids = cache.hidden_ids
    keep = [c for c in cols if c < len(ids)]
    cache.hidden[base : base + len(keep)] = cache.hidden[keep]  # gathered (a copy), then moved
    cache.hidden_ids = ids[:base] + [ids[c] for c in keep]


def _causal_only(mask: np.ndarray, offset: int, length: int, cache) -> None:
    """Refuse a mask a hybrid model cannot honour: its linear-attention layers read no mask, so
    only causal windows pass, or the key holes of branch rows whose linear states were forked
    at their own branch points (HybridCache.fork_at: each row hides what its states skipped)."""
    from runtime.errors import DuetError

    want = causal_mask(offset, length)
    m = np.broadcast_to(mask, (cache.batch, *mask.shape[-2:]))
    ok = m.shape[-2:] == want.shape and not (m & ~want).any()
    if not (ok and all(cache.holes_ok(m[:, t, : offset + t + 1]) for t in range(length))):
        raise DuetError(
            "a hybrid (linear-attention) model runs causal windows only (and the branch rows "
            "of a cache forked at their branch points): a tree mask needs a state per node, "
            "which its cache does not keep"
        )
