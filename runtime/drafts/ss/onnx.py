"""A speculative-streaming (SS) draft on ONNX Runtime (the graph of converters/onnx_ss_export.py).

Same contract as runtime/drafts/ss/torch.py's SSCausalLM: `forward` is the main stream
alone (the same graph with no stream owners), `forward_streams` one multi-stream pass whose
stream columns are trimmed from the cache. Masks and positions are built here with
kernels/stream_mask.py and sent whole, so any main mask (branch rows with holes) works.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kernels.stream_mask import multi_stream_mask, stream_positions
from runtime.backends.onnx.llama import PROVIDERS, empty_past, run_with_past
from runtime.caches.concat import ConcatKVCache
from runtime.config import ModelConfig
from runtime.drafts.ss.checkpoint import ss_streams
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens, default_positions


class OnnxSSCausalLM:
    """CausalLM + `forward_streams` over an exported SS draft."""

    backend = "onnx"
    supports_layer_range = False

    def __init__(self, path, provider: str = "cpu", intra_threads: int = 1, inter_threads=1):
        import onnxruntime as ort

        if provider not in PROVIDERS:
            raise DuetError(f"unknown ONNX Runtime provider {provider!r}")
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = intra_threads, inter_threads
        self.session = ort.InferenceSession(str(path), so, providers=[PROVIDERS[provider]])
        meta = self.session.get_modelmeta().custom_metadata_map
        if "duet.config" not in meta:
            raise DuetError(f"{path}: no duet.config metadata (not an SS draft export)")
        self.config = ModelConfig.from_dict(json.loads(meta["duet.config"]), where=str(path))
        self.ss_streams = ss_streams(self.config)
        self.provider = provider
        self._outputs = [o.name for o in self.session.get_outputs()]

    @classmethod
    def load(cls, path, **kw) -> OnnxSSCausalLM:
        p = Path(path)
        if not p.is_file():
            raise DuetError(f"ONNX SS draft not found: {p}")
        return cls(p, **kw)

    def new_cache(self, batch: int = 1) -> ConcatKVCache:
        return ConcatKVCache(self.config.num_layers, batch, empty_past(self.config, np.float32))

    def _run(self, ids, cache, owners, positions, mask):
        n, off = self.ss_streams, cache.offset
        B, T = ids.shape
        pos = default_positions(off, B, T) if positions is None else np.asarray(positions)
        m = causal_mask(off, T) if mask is None else np.asarray(mask, dtype=bool)
        m = np.broadcast_to(m, (B, T, off + T))
        feed = {
            "input_ids": ids,
            "owners": np.asarray(owners, np.int64),
            "position_ids": stream_positions(pos, n, owners),
            "attention_mask": multi_stream_mask(m, n, owners),
        }
        res = run_with_past(self.session, self._outputs, feed, cache, self.config.num_layers, 2)
        cache.trim(len(owners) * n)  # the stream columns are laid out last
        return res[0], res[1]

    def forward(self, tokens, cache, *, positions=None, mask=None) -> np.ndarray:
        ids = check_tokens(tokens, self.config.vocab_size)
        return self._run(ids, cache, [], positions, mask)[0]

    def forward_streams(self, tokens, cache, *, first=None, positions=None, mask=None):
        """As SSCausalLM.forward_streams: main logits (B, T, V), stream logits (B, P, n, V)."""
        ids = check_tokens(tokens, self.config.vocab_size)
        T = ids.shape[1]
        first = T - 1 if first is None else first
        return self._run(ids, cache, list(range(first, T)), positions, mask)

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        raise DuetError("the ONNX backend runs whole models only")

    def head(self, hidden):
        raise DuetError("the ONNX backend runs whole models only; it has no separate LM head")
