"""Gemma 3 (`gemma3_text`, and the text tower of `gemma3`) on the MLX backend, built by
mlx-lm 0.32's own `mlx_lm.models.gemma3_text` classes.

mlx-lm builds the modules and loads the weights (its loader, `sanitize`, quantized MLX
directories); we walk its layers ourselves, as llama.py does for the other families,
so that a target can run a range of layers (Mirror-SD's early exit), take explicit positions
and masks (trees, branch rows), and keep its KV in a SlidingKVCache (runtime/caches/sliding.py:
a local layer keeps its window and a slack, with its columns' positions, and the window is
applied on positions). What we take from the config rather than from mlx-lm, to stay equal
to transformers (the reference, runtime/backends/torch/gemma3_text.py):
- each layer's kind from `layer_types` (mlx-lm derives it from `sliding_window_pattern`),
  and the RoPE per kind: local layers `rope_local_theta`, global ones `rope_theta` and its
  scaling;
- the embedding scale sqrt(hidden) rounded to the embedding's dtype (mlx-lm rounds it to
  bfloat16 whatever the dtype, which moves float32 logits);
- the MLP activation (mlx-lm always uses the tanh GELU), the attention scale
  query_pre_attn_scalar^-1/2 and the final logit soft-cap (mlx-lm's gemma3_text has none).
The norms are mlx-lm's (`1 + weight` RMSNorm), the projections its Linear (or quantized) layers.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from runtime.backends.mlx.llama import MLXCausalLM, _rope, mlx_lm_load
from runtime.caches.sliding import SlidingKVCache
from runtime.config import ModelConfig
from runtime.model import causal_mask, check_tokens, default_positions
from runtime.text_tower import say_vision_ignored, text_tower


class MLXGemma3LM(MLXCausalLM):
    """CausalLM over mlx-lm's gemma3_text Model, with a sliding-window cache."""

    def __init__(self, model, config: ModelConfig):
        super().__init__(model, config)
        from mlx_lm.models.rope_utils import initialize_rope

        c, d = config, config.head_dim
        local = nn.RoPE(d, traditional=False, base=c.rope_local_theta or c.rope_theta)
        glob = initialize_rope(d, c.rope_theta, False, c.rope_scaling, c.max_context)
        self._sliding = c.sliding or (False,) * c.num_layers
        self._ropes = [local if s else glob for s in self._sliding]
        self._scale = c.query_pre_attn_scalar**-0.5
        self._act = nn.gelu if c.hidden_activation == "gelu" else nn.gelu_approx
        self._embed_scale = np.float32(math.sqrt(c.hidden_size))

    @classmethod
    def load(cls, path, dtype: str | None = None, **_) -> MLXGemma3LM:
        config = ModelConfig.from_dir(path)
        say_vision_ignored(path)
        model = mlx_lm_load(path, config.raw, {}, dtype, get_model_classes=_classes(config.raw))
        return cls(model, config)

    def new_cache(self, batch: int = 1) -> SlidingKVCache:
        c = self.config
        dtype = self._embed.weight.dtype if hasattr(self._embed, "weight") else mx.float32
        if dtype not in (mx.float32, mx.float16, mx.bfloat16):  # quantized embeddings
            dtype = mx.float32
        return SlidingKVCache(
            self._sliding,
            c.sliding_window,
            batch,
            lambda b: _evaluated(mx.zeros((b, c.num_kv_heads, 0, c.head_dim), dtype)),
            lambda b: np.zeros((b, 0), np.int64),
        )

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        if start == 0:
            with mx.stream(self.stream):
                x = self._embed(mx.array(check_tokens(x, self.config.vocab_size)))
                x = x * mx.array(self._embed_scale).astype(x.dtype)
        B, T = x.shape[:2]
        offset = cache.layer_offset(start)
        pos = (
            default_positions(offset, B, T)
            if positions is None
            else np.asarray(positions, np.int64).reshape(B, T)
        )
        m = causal_mask(offset, T) if mask is None else np.asarray(mask, dtype=bool)
        m = np.broadcast_to(m, (B, T, offset + T))
        full = None if mask is None and T == 1 else mx.array(m[:, None])
        local: dict = {}  # held columns -> (their positions, the window mask): one per forward
        with mx.stream(self.stream):
            for i in range(start, stop):
                layer = self._layers[i]
                h = self._attention(
                    layer.self_attn, layer.input_layernorm(x), i, cache, pos, full, m, local
                )
                x = x + layer.post_attention_layernorm(h)
                mlp, h = layer.mlp, layer.pre_feedforward_layernorm(x)
                h = mlp.down_proj(self._act(mlp.gate_proj(h)) * mlp.up_proj(h))
                x = x + layer.post_feedforward_layernorm(h)
        return x

    def _attention(self, attn, x, i, cache, pos, full, m, local):
        """Layer i's attention: q/k norms, its kind's RoPE, the cache, the (window) mask."""
        B, T, _ = x.shape
        q = attn.q_norm(attn.q_proj(x).reshape(B, T, attn.n_heads, -1))
        k = attn.k_norm(attn.k_proj(x).reshape(B, T, attn.n_kv_heads, -1))
        v = attn.v_proj(x).reshape(B, T, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = _rope(self._ropes[i], q.transpose(0, 2, 1, 3), pos, 0)  # (B, H, T, D)
        k = _rope(self._ropes[i], k.transpose(0, 2, 1, 3), pos, 0)  # (B, KV, T, D)
        past = cache.get(i)
        k = mx.concatenate([past[0], k], axis=2)  # (B, KV, S, D)
        v = mx.concatenate([past[1], v], axis=2)
        if self._sliding[i]:
            key_pos = np.concatenate([past[2], pos], axis=1)  # (B, S)
            mask = self._window(key_pos, pos, m, local)
            cache.put(i, k, v, key_pos)
        else:
            mask = full
            cache.put(i, k, v)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self._scale, mask=mask)
        return attn.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1))

    def _window(self, key_pos: np.ndarray, pos: np.ndarray, m: np.ndarray, memo: dict):
        """The mask of a local layer holding keys at key_pos (B, S): the protocol mask's last
        S columns, and only keys within the window of each query's position."""
        S = key_pos.shape[1]
        hit = memo.get(S)
        if hit is not None and np.array_equal(hit[0], key_pos):
            return hit[1]
        near = key_pos[:, None, :] > pos[:, :, None] - self.config.sliding_window  # (B, T, S)
        mask = mx.array((m[:, :, -S:] & near)[:, None])
        memo[S] = (key_pos, mask)
        return mask

    def head(self, hidden) -> np.ndarray:
        cap = self.config.final_logit_softcapping
        with mx.stream(self.stream):
            logits = self._lm_head(self._norm(hidden)).astype(mx.float32)
            if cap:
                logits = mx.tanh(logits / cap) * cap
        return np.array(logits)


def _evaluated(a: mx.array) -> mx.array:
    """`a` computed now: a cache made on one thread may be filled on another (Mirror-SD's
    draft worker), and MLX streams belong to the thread that made them."""
    mx.eval(a)
    return a


def _classes(raw: dict):
    """get_model_classes for mlx-lm's loader: gemma3_text's Model and ModelArgs, the args
    from our filled-in text config (a multimodal config leaves Gemma3TextConfig's defaults
    out, and mlx-lm's own defaults differ from them), the weights of a multimodal layout
    renamed to the text tower's and its vision weights dropped."""
    from mlx_lm.models import gemma3_text

    class Args(gemma3_text.ModelArgs):
        @classmethod
        def from_dict(cls, params):
            return super().from_dict({**raw, "model_type": "gemma3_text"})

    class TextTower(gemma3_text.Model):
        def sanitize(self, weights):
            return super().sanitize(text_tower(weights, keep_mtp=True))

    return lambda config: (TextTower, Args)


def load(path, dtype: str | None = None, hybrid_rollback: str = "replay") -> MLXGemma3LM:
    """This family's entry in runtime/backends/mlx/__init__.py's FAMILIES (hybrid_rollback: a
    hybrid's only)."""
    return MLXGemma3LM.load(path, dtype)
