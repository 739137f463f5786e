"""Qwen3.5 / Qwen3.6 hybrid text models (`qwen3_5_text`, and the text tower of multimodal
`qwen3_5`) on the MLX backend, built by mlx-lm 0.32's own `mlx_lm.models.qwen3_5` classes.

mlx-lm builds the modules and loads the weights; we walk its layers ourselves, as
llama.py does for the attention families, so that a target can run a *range* of layers
(the Mirror-SD early exit, eq. 6), attention layers take explicit positions and causal
masks, and every linear-attention layer hands its per-position inputs of the delta rule to
an MLXHybridCache (runtime/caches/mlx_hybrid.py), which lands the states on any
accepted prefix by replaying only the recurrence. mlx-lm's own forward keeps those inside
`GatedDeltaNet.__call__` and its ArraysCache cannot be trimmed (why mlx-lm refuses to
speculate on these models).

Reused from mlx-lm unchanged: the module tree and attribute (= weight) names, its loader
and `sanitize` (`model.language_model.*` -> `language_model.model.*`, `mtp.*` and
`model.visual.*` dropped, `lm_head` dropped when tied, conv1d weights moved to MLX's
(C, K, 1) layout, the (1 + w) RMSNorm weights folded to plain weights of a Hugging Face
checkpoint), the projections, conv1d, gated RMSNorm, RoPE module, `normalize_qk` and
`gated_delta_update` (the recurrence: ops on the CPU, mlx-lm's Metal kernel on a GPU).
Ours: the walk, the logged quantities and the choice of layer kinds (mlx-lm derives them
from `full_attention_interval`, so a checkpoint whose `layer_types` follow another pattern
is refused in one line). It does not run the `mtp.*` head, the vision tower, MoE variants
(`qwen3_5_moe`) or tree/branch masks (a linear layer reads no mask).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from runtime.backends.mlx.llama import MLXCausalLM, _rope, mlx_lm_load
from runtime.caches.mlx_hybrid import MLXHybridCache
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens
from runtime.text_tower import say_vision_ignored


def _gated_attention(attn, x, mask, cache: MLXHybridCache, i: int, positions, offset: int):
    """mlx-lm's Qwen3NextAttention with our cache, positions and mask: q/k (1 + w) norms,
    partial RoPE (the module's RoPE turns its first `dims` channels), a sigmoid output gate."""
    B, T, _ = x.shape
    q, gate = mx.split(attn.q_proj(x).reshape(B, T, attn.num_attention_heads, -1), 2, axis=-1)
    k = attn.k_proj(x).reshape(B, T, attn.num_key_value_heads, -1)
    v = attn.v_proj(x).reshape(B, T, attn.num_key_value_heads, -1).transpose(0, 2, 1, 3)
    q = _rope(attn.rope, attn.q_norm(q).transpose(0, 2, 1, 3), positions, offset)  # (B, H, T, D)
    k = _rope(attn.rope, attn.k_norm(k).transpose(0, 2, 1, 3), positions, offset)  # (B, KV, T, D)
    k, v = cache.update_kv(i, k, v)  # (B, KV, S, D)
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask=mask)
    o = o.transpose(0, 2, 1, 3).reshape(B, T, -1)
    return attn.o_proj(o * mx.sigmoid(gate.reshape(B, T, -1)))


def gated_delta_net(la, x, conv, rec):
    """mlx-lm's GatedDeltaNet over x (B, T, C) from states conv (B, K-1, Cc) and rec
    (B, Hv, Dv, Dk); returns (out, conv, rec, log) with log = (pre-conv inputs (B, T, Cc),
    normalised k (B, T, Hk, Dk), v (B, T, Hv, Dv), a and b (B, T, Hv)): what the recurrence
    consumed, so the cache can replay it for any prefix (`replay_recurrence`)."""
    from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

    B, T, _ = x.shape
    qkv = la.in_proj_qkv(x)  # (B, T, Cc): the conv's inputs
    z = la.in_proj_z(x).reshape(B, T, la.num_v_heads, la.head_v_dim)
    b, a = la.in_proj_b(x), la.in_proj_a(x)  # β and decay pre-activations (B, T, Hv)
    xcat = mx.concatenate([conv.astype(qkv.dtype), qkv], axis=1)  # (B, K-1+T, Cc)
    mixed = nn.silu(la.conv1d(xcat))  # (B, T, Cc)
    q, k, v = (
        t.reshape(B, T, h, d)
        for t, h, d in zip(
            mx.split(mixed, [la.key_dim, 2 * la.key_dim], -1),
            [la.num_k_heads, la.num_k_heads, la.num_v_heads],
            [la.head_k_dim, la.head_k_dim, la.head_v_dim],
            strict=True,
        )
    )
    q, k = normalize_qk(q, k, inv_scale=la.head_k_dim**-0.5, eps=1e-6)
    out, rec = gated_delta_update(
        q, k, v, a, b, la.A_log, la.dt_bias, rec, None, use_kernel=not la.training
    )
    out = la.out_proj(la.norm(out, z).reshape(B, T, -1))
    new_conv = xcat[:, xcat.shape[1] - (la.conv_kernel_size - 1) :]
    return out, new_conv, rec, (qkv, k, v, a, b)


def replay_recurrence(la, rec, k, v, a, b):
    """The recurrent state after the logged positions (k, v, a, b), from `rec`: the same
    `gated_delta_update` call as the forward (k stands in for q, which the state never
    reads), so the landed state is the forward's, bit for bit."""
    from mlx_lm.models.gated_delta import gated_delta_update

    return gated_delta_update(
        k, k, v, a, b, la.A_log, la.dt_bias, rec, None, use_kernel=not la.training
    )[1]


class MLXQwen3_5LM(MLXCausalLM):
    """CausalLM over mlx-lm's qwen3_5 `Model`: causal windows only, an MLXHybridCache."""

    def __init__(self, model, config: ModelConfig, hybrid_rollback: str = "replay"):
        self.model, self.config, self.hybrid_rollback = model, config, hybrid_rollback
        self._local = threading.local()  # per-thread MLX streams (MLXCausalLM.stream)
        lm = model.language_model
        inner = lm.model
        self._embed, self._layers, self._norm = inner.embed_tokens, inner.layers, inner.norm
        tied = lm.args.tie_word_embeddings
        self._lm_head = inner.embed_tokens.as_linear if tied else lm.lm_head

    @classmethod
    def load(cls, path, dtype: str | None = None, hybrid_rollback: str = "replay"):
        """Load a Hugging Face or mlx-community qwen3_5(_text) directory with mlx-lm's loader
        and its qwen3_5 classes (float32 on the CPU, as MLXCausalLM.load)."""
        config = ModelConfig.from_dir(path)
        raw = json.loads((Path(path) / "config.json").read_text())
        every = attention_interval(config.layer_types)
        if every is None:
            raise DuetError(
                f"{path}: mlx-lm's qwen3_5 places full attention every n-th layer; this "
                "checkpoint's layer_types do not follow one interval: use --target-backend torch"
            )
        if "text_config" in raw:
            overrides = {"text_config": {**raw["text_config"], "full_attention_interval": every}}
        else:
            overrides = {"full_attention_interval": every}
        say_vision_ignored(path)
        model = mlx_lm_load(path, raw, overrides, dtype, get_model_classes=_classes)
        return cls(model, config, hybrid_rollback)

    def new_cache(self, batch: int = 1) -> MLXHybridCache:
        return MLXHybridCache(
            self.config.layer_types,
            batch,
            self._empty_state,
            self.replay,
            rollback=self.hybrid_rollback,
            redecode=self._redecode,
        )

    def _redecode(self, tokens: np.ndarray, cache: MLXHybridCache) -> None:
        """Re-run `tokens` through every layer into `cache` (redecode rollback; no head)."""
        mx.eval(self.forward_layers(tokens, cache, 0, self.config.num_layers))

    def _empty_state(self, i: int, batch: int) -> tuple[mx.array, mx.array]:
        """Zero conv state (B, K-1, Cc) and recurrent state (B, Hv, Dv, Dk) of layer i."""
        la = self._layers[i].linear_attn
        dtype = la.in_proj_qkv.weight.dtype if hasattr(la.in_proj_qkv, "weight") else mx.float32
        if dtype not in (mx.float32, mx.float16, mx.bfloat16):  # quantized weights
            dtype = mx.float32
        conv = mx.zeros((batch, la.conv_kernel_size - 1, la.conv_dim), dtype)
        return conv, mx.zeros((batch, la.num_v_heads, la.head_v_dim, la.head_k_dim), mx.float32)

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        if start == 0:
            ids = check_tokens(x, self.config.vocab_size)
            cache.feed(ids)  # redecode rollback re-runs these ids
            x = self._embed(mx.array(ids))
        B, T = x.shape[:2]
        offset = cache.layer_offset(start)
        if mask is not None:
            _causal_only(np.asarray(mask, dtype=bool), offset, T)
        m = None if T == 1 else mx.array(causal_mask(offset, T))
        pos = None if positions is None else np.asarray(positions).reshape(B, T)
        with mx.stream(self.stream):
            for i in range(start, stop):
                layer = self._layers[i]
                h = layer.input_layernorm(x)
                cache.begin(i, T)
                if layer.is_linear:
                    out, conv, rec, log = gated_delta_net(layer.linear_attn, h, *cache.get(i))
                    cache.put(i, conv, rec, log)
                else:
                    off = cache.layer_offset(i)
                    out = _gated_attention(layer.self_attn, h, m, cache, i, pos, off)
                x = x + out
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def replay(self, i: int, rec, k, v, a, b):
        """Layer i's recurrent state after the logged positions (the cache's rollback)."""
        with mx.stream(self.stream):
            return replay_recurrence(self._layers[i].linear_attn, rec, k, v, a, b)


def _classes(config: dict):
    """mlx-lm's qwen3_5 classes for both layouts: its `ModelArgs.from_dict` wraps a text-only
    config as the `text_config` (mlx-lm has no `qwen3_5_text` module to find by model_type)."""
    from mlx_lm.models import qwen3_5

    return qwen3_5.Model, qwen3_5.ModelArgs


def attention_interval(kinds) -> int | None:
    """n when layer i is full attention exactly when (i + 1) % n == 0, else None."""
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    if not full:
        return len(kinds) + 1
    n = full[0] + 1
    ok = all((k == "full_attention") == ((i + 1) % n == 0) for i, k in enumerate(kinds))
    return n if ok else None


def _causal_only(mask: np.ndarray, offset: int, length: int) -> None:
    """Refuse a non-causal mask: linear-attention layers read no mask."""
    want = causal_mask(offset, length)
    if mask.shape[-2:] != want.shape or not (mask == want).all():
        raise DuetError(
            "a hybrid (linear-attention) model runs causal windows only: tree and branch masks "
            "need a state per branch, which its cache does not keep"
        )


def load(path, dtype: str | None = None, hybrid_rollback: str = "replay") -> MLXQwen3_5LM:
    """This family's entry in runtime/backends/mlx/__init__.py's FAMILIES."""
    return MLXQwen3_5LM.load(path, dtype, hybrid_rollback)
