"""The MLX backend: mlx-lm's model classes and loader, with a forward loop of our own.

mlx-lm builds the modules and loads the weights (Llama, Qwen2, Qwen3 and the
rest of its families, from Hugging Face or mlx-community directories, quantized
or not). We only walk its layers ourselves so that we can run a *range* of
layers, apply the final norm + LM head to any hidden state (Mirror-SD eq. 6),
and pass explicit positions and attention masks (tree and branch batches).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np

from runtime.caches.mlx_kv import MLXKVCache
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens


def _rope(rope, x: mx.array, positions: np.ndarray | None, offset: int) -> mx.array:
    """Apply the module's own RoPE at `positions` (B, T), or contiguously from `offset`."""
    if positions is None:
        return rope(x, offset=offset)
    B, H, T, D = x.shape
    if T == 1 or np.all(np.diff(positions, axis=1) == 1):
        return rope(x, offset=mx.array(positions[:, 0].astype(np.int32)))  # per-row start
    # arbitrary positions: one "row" per token so each gets its own offset
    xt = x.transpose(0, 2, 1, 3).reshape(B * T, H, 1, D)
    y = rope(xt, offset=mx.array(positions.reshape(-1).astype(np.int32)))
    return y.reshape(B, T, H, D).transpose(0, 2, 1, 3)


def _attention(attn, x, mask, layer_cache, positions, offset):
    B, T, _ = x.shape
    q = attn.q_proj(x).reshape(B, T, attn.n_heads, -1)
    k = attn.k_proj(x).reshape(B, T, attn.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(B, T, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = _rope(attn.rope, q.transpose(0, 2, 1, 3), positions, offset)  # (B, H, T, D)
    k = _rope(attn.rope, k.transpose(0, 2, 1, 3), positions, offset)  # (B, KV, T, D)
    k, v = layer_cache.update_and_fetch(k, v)  # (B, KV, S, D)
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask=mask)
    return attn.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1))


def mlx_lm_load(path, raw: dict, overrides: dict, dtype: str | None, **kw):
    """mlx-lm's `load_model` with `overrides` on config.json (`raw`), one line on failure; then
    the weights in `dtype` (None: float32 on the CPU, where bf16 matmuls are emulated, and the
    checkpoint's own on a GPU; a quantized checkpoint keeps its own), evaluated."""
    from mlx_lm.utils import load_model

    try:
        model, _ = load_model(Path(path), model_config=overrides, **kw)
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise DuetError(f"{path}: mlx-lm could not load it ({str(e).splitlines()[0]})") from None
    if dtype is None and mx.default_device() == mx.cpu:
        dtype = "float32"
    if dtype is not None and "quantization" not in raw:
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


class MLXCausalLM:
    """CausalLM over an mlx-lm `Model`."""

    backend = "mlx"
    supports_layer_range = True

    def __init__(self, model, config: ModelConfig):
        self.model = model
        self.config = config
        self._local = threading.local()
        inner = model.model
        self._embed, self._layers, self._norm = inner.embed_tokens, inner.layers, inner.norm
        tied = getattr(model.args, "tie_word_embeddings", False) or not hasattr(model, "lm_head")
        self._lm_head = inner.embed_tokens.as_linear if tied else model.lm_head

    @classmethod
    def load(cls, path, dtype: str | None = None) -> MLXCausalLM:
        """Load a Llama / Qwen2 / Qwen3 Hugging Face or mlx-community directory with mlx-lm
        (runtime/backends/mlx/__init__.py picks the family's class; hybrids and Gemma 3 have
        theirs).

        dtype: None keeps the checkpoint's on a GPU and uses float32 on the CPU
        (bf16 matmuls are emulated there, and slower).
        """
        config = ModelConfig.from_dir(path)
        raw = config.raw
        overrides = {}
        if "rope_theta" not in raw:  # transformers >= 5 writes rope_parameters instead
            overrides["rope_theta"] = config.rope_theta
            if config.rope_scaling:
                overrides["rope_scaling"] = config.rope_scaling
        return cls(mlx_lm_load(path, raw, overrides, dtype), config)

    @property
    def stream(self):
        """This thread's MLX stream: MLX streams belong to the thread that made them, so each
        worker (the target's, the draft's) computes on a stream of its own."""
        s = getattr(self._local, "stream", None)
        if s is None:
            s = self._local.stream = mx.new_stream(mx.default_device())
        return s

    def new_cache(self, batch: int = 1) -> MLXKVCache:
        return MLXKVCache(self.config.num_layers, batch)

    def _mask(self, mask, offset: int, T: int, B: int):
        if mask is None:
            return None if T == 1 else mx.array(causal_mask(offset, T))
        m = np.asarray(mask, dtype=bool)
        return mx.array(m[:, None] if m.ndim == 3 else m)  # (B, 1, T, S) or (T, S)

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        if start == 0:
            x = self._embed(mx.array(check_tokens(x, self.config.vocab_size)))
        B, T = x.shape[:2]
        offset = cache.layer_offset(start)
        m = self._mask(mask, offset, T, B)
        pos = None if positions is None else np.asarray(positions).reshape(B, T)
        with mx.stream(self.stream):
            for i in range(start, stop):
                layer, lc = self._layers[i], cache.layers[i]
                x = x + _attention(layer.self_attn, layer.input_layernorm(x), m, lc, pos, lc.offset)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def head(self, hidden) -> np.ndarray:
        with mx.stream(self.stream):
            logits = self._lm_head(self._norm(hidden)).astype(mx.float32)
        return np.array(logits)

    def forward(self, tokens, cache, *, positions=None, mask=None) -> np.ndarray:
        h = self.forward_layers(
            tokens, cache, 0, self.config.num_layers, positions=positions, mask=mask
        )
        return self.head(h)


def is_mlx_dir(path) -> bool:
    """True for an MLX-format directory (mlx-community style quantized weights)."""
    cfg = Path(path) / "config.json"
    return cfg.is_file() and "quantization" in json.loads(cfg.read_text())


def load(path, dtype: str | None = None, hybrid_rollback: str = "replay") -> MLXCausalLM:
    """This family's entry in runtime/backends/mlx/__init__.py's FAMILIES (hybrid_rollback: a
    hybrid's only)."""
    return MLXCausalLM.load(path, dtype)
