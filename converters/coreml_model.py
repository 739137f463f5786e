"""The draft rewritten for the Apple Neural Engine: a Llama/Qwen2/Qwen3 decoder in
ml-ane-transformers layout over a fixed-size KV cache.

This is the maths the Core ML converter traces, nothing else: it knows no
coremltools, no states and no compression (those are applied from outside in
`coreml_export.py`). Weights come unchanged from a Hugging Face checkpoint; the
loading hook reshapes each linear into a 1x1 convolution.

Cache slots vs positions: a call writes its T new keys/values into cache slots
[cache_offset, cache_offset + T) and rotates them by `position_ids`; the
additive `attention_mask` (1, 1, T, C) says which slots each query may read.
Rolling back is therefore just moving the host's offset: stale slots are masked
out and overwritten by the next call.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from runtime.backends.torch.llama import RMSNorm, rope_inv_freq
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.weights import weight_files


def padded_context(max_context: int, multiple: int = 32) -> int:
    """Cache length rounded up to a multiple of 32 (ANE-friendly state dimension)."""
    return -(-max_context // multiple) * multiple


class RMSNormANE(RMSNorm):
    """RMSNorm over the channel axis of a (B, C, 1, S) tensor: the reference's weight and eps
    (runtime/backends/torch/llama.py), normalised in the ANE layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # ml-ane-transformers: normalise over dim=1 (channels) of the (B, C, 1, S) layout,
        # no transpose
        var = x.pow(2).mean(dim=1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight.view(1, -1, 1, 1)


def conv1x1(cin: int, cout: int, bias: bool) -> nn.Conv2d:
    # ml-ane-transformers: nn.Linear -> nn.Conv2d(kernel_size=1) on (B, C, 1, S)
    return nn.Conv2d(cin, cout, kernel_size=1, bias=bias)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half convention) on one head (B, D, 1, T); cos/sin (1, D, 1, T)."""
    x1, x2 = x.chunk(2, dim=1)  # chunk, not shape arithmetic: keeps the trace free of dynamic ints
    rot = torch.cat([-x2, x1], dim=1)
    return x * cos + rot * sin


def _rows(heads: list[torch.Tensor]) -> torch.Tensor:
    """n_kv x (1, D, 1, T) -> (n_kv, T, D): the rows a cache stores."""
    return torch.cat(heads, dim=0).squeeze(2).transpose(1, 2)


class AttentionANE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d, kv = cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
        self.n_heads, self.n_kv, self.head_dim = h, kv, d
        self.q_proj = conv1x1(cfg.hidden_size, h * d, cfg.attention_bias)
        self.k_proj = conv1x1(cfg.hidden_size, kv * d, cfg.attention_bias)
        self.v_proj = conv1x1(cfg.hidden_size, kv * d, cfg.attention_bias)
        self.o_proj = conv1x1(h * d, cfg.hidden_size, False)
        if cfg.qk_norm:
            self.q_norm = RMSNormANE(d, cfg.rms_norm_eps)
            self.k_norm = RMSNormANE(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.scale = d**-0.5

    def forward(self, x, cos, sin, mask, store):
        """x (1, C, 1, T) -> (1, C, 1, T); `store(k_rows, v_rows)` files this call's
        keys/values, each (n_kv, T, D), and returns the whole cache (n_kv, S, D) x 2."""
        d = self.head_dim
        # ml-ane-transformers: split heads with .split on the channel axis instead of
        # reshape + transpose
        qs = self.q_proj(x).split(d, dim=1)  # n_heads x (1, D, 1, T)
        ks = self.k_proj(x).split(d, dim=1)  # n_kv x (1, D, 1, T)
        vs = self.v_proj(x).split(d, dim=1)
        if self.qk_norm:
            qs = [self.q_norm(q) for q in qs]
            ks = [self.k_norm(k) for k in ks]
        qs = [rotate(q, cos, sin) for q in qs]
        ks = [rotate(k, cos, sin) for k in ks]
        kc, vc = store(_rows(ks), _rows(vs))
        group = self.n_heads // self.n_kv
        outs = []
        for i, q in enumerate(qs):
            k, v = kc[i // group], vc[i // group]  # (S, D): grouped-query heads share a kv head
            # ml-ane-transformers: attention as einsum over the (B, C, 1, S) layout, one head
            # at a time
            scores = torch.einsum("bdhq,kd->bkhq", q, k) * self.scale  # (1, S, 1, T)
            probs = torch.softmax(scores + mask, dim=1)
            outs.append(torch.einsum("bkhq,kd->bdhq", probs, v))  # (1, D, 1, T)
        return self.o_proj(torch.cat(outs, dim=1))


class MLPANE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = conv1x1(cfg.hidden_size, cfg.intermediate_size, False)
        self.up_proj = conv1x1(cfg.hidden_size, cfg.intermediate_size, False)
        self.down_proj = conv1x1(cfg.intermediate_size, cfg.hidden_size, False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LayerANE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNormANE(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = AttentionANE(cfg)
        self.post_attention_layernorm = RMSNormANE(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLPANE(cfg)


class DecoderANE(nn.Module):
    """The decoder maths over a cache of S slots, (L, n_kv, S, D) per K and V.

    How the cache is held (Core ML state, or tensors in and out) is the wrapper's
    business: StatefulDecoder and KVIODecoder below.
    """

    def __init__(self, cfg: ModelConfig, context: int):
        super().__init__()
        self.cfg, self.context = cfg, context
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LayerANE(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNormANE(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = conv1x1(cfg.hidden_size, cfg.vocab_size, False)
        inv = rope_inv_freq(cfg)  # (D/2,): plain, linear or Llama-3 scaled, as the reference
        ang = torch.arange(context).float()[:, None] * inv[None, :]  # (S, D/2), computed in fp32
        # cos/sin looked up by position, never computed on device: pos * freq in fp16 is too coarse
        self.register_buffer(
            "cos_table", torch.cat([ang.cos(), ang.cos()], dim=-1), persistent=False
        )
        self.register_buffer(
            "sin_table", torch.cat([ang.sin(), ang.sin()], dim=-1), persistent=False
        )

    def cache_shape(self) -> tuple[int, int, int, int]:
        c = self.cfg
        return (c.num_layers, c.num_kv_heads, self.context, c.head_dim)

    def forward(self, input_ids, position_ids, attention_mask, store):
        """input_ids int (1, T); position_ids int (1, T); attention_mask float (1, 1, T, S),
        additive (0 or -1e4); store(layer, k_rows, v_rows) -> (k, v) is the cache policy.
        Returns logits (1, T, V)."""
        pos = position_ids[0].long()
        cos = self.cos_table[pos].transpose(0, 1)[None, :, None, :]  # (1, D, 1, T)
        sin = self.sin_table[pos].transpose(0, 1)[None, :, None, :]
        mask = attention_mask.permute(0, 3, 1, 2)  # (1, S, 1, T): keys on the channel axis
        # ml-ane-transformers: hidden states travel as (B, C, 1, S)
        x = self.embed_tokens(input_ids.long()).transpose(1, 2).unsqueeze(2)
        for i, layer in enumerate(self.layers):
            x = x + layer.self_attn(
                layer.input_layernorm(x), cos, sin, mask, lambda k, v, i=i: store(i, k, v)
            )
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = self.lm_head(self.norm(x))  # (1, V, 1, T)
        return logits.squeeze(2).transpose(1, 2)


class StatefulDecoder(nn.Module):
    """KV cache as module buffers written in place: what becomes Core ML state.

    forward(input_ids, position_ids, cache_offset (1,), attention_mask) -> logits.
    """

    def __init__(self, decoder: DecoderANE, dtype=torch.float16):
        super().__init__()
        self.decoder = decoder
        shape = decoder.cache_shape()
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype))

    def forward(self, input_ids, position_ids, cache_offset, attention_mask):
        t = input_ids.shape[1]
        o = cache_offset[0]

        def store(i, k_rows, v_rows):
            # a dynamic-offset slice write: converts to slice_update + coreml_update_state
            self.k_cache[i, :, o : o + t, :] = k_rows.to(self.k_cache.dtype)
            self.v_cache[i, :, o : o + t, :] = v_rows.to(self.v_cache.dtype)
            return self.k_cache[i].to(k_rows.dtype), self.v_cache[i].to(v_rows.dtype)

        return self.decoder(input_ids, position_ids, attention_mask, store)


class KVIODecoder(nn.Module):
    """KV cache passed in and the new rows passed out: the fallback where state fails.

    forward(input_ids, position_ids, cache_offset (1,), attention_mask, k_cache, v_cache)
    -> (logits (1, T, V), k_new, v_new (L, n_kv, T, D)); the host writes the new rows
    into its cache at slots [cache_offset, cache_offset + T).
    """

    def __init__(self, decoder: DecoderANE):
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids, position_ids, cache_offset, attention_mask, k_cache, v_cache):
        t, s = input_ids.shape[1], k_cache.shape[2]
        slots = cache_offset.long() + torch.arange(t)  # (T,)
        write = (slots[:, None] == torch.arange(s)[None, :]).to(k_cache.dtype)  # (T, S) one-hot
        keep = (1.0 - write.sum(dim=0))[:, None]  # (S, 1): 0 on the slots this call writes
        new_k, new_v = [], []

        def store(i, k_rows, v_rows):
            new_k.append(k_rows)
            new_v.append(v_rows)
            # static-shape placement: (S, T) @ (T, D) puts row t in slot cache_offset + t
            place = write.transpose(0, 1)
            return k_cache[i] * keep + place @ k_rows, v_cache[i] * keep + place @ v_rows

        logits = self.decoder(input_ids, position_ids, attention_mask, store)
        return logits, torch.stack(new_k), torch.stack(new_v)


def load_decoder(path: str | Path, context: int | None = None) -> DecoderANE:
    """Build a DecoderANE from an unchanged Hugging Face checkpoint directory (fp32, eval)."""
    from safetensors.torch import load_file

    cfg = ModelConfig.from_dir(path)
    ctx = padded_context(context or cfg.max_context)
    model = DecoderANE(cfg, ctx)
    state = {}
    for f in weight_files(path):
        state.update(load_file(str(f)))
    renamed = {}
    for name, w in state.items():
        if "rotary_emb" in name:
            continue
        key = name.removeprefix("model.")
        if w.ndim == 2 and not key.startswith("embed_tokens"):
            w = w[:, :, None, None]  # (out, in) linear -> (out, in, 1, 1) conv
        renamed[key] = w.float()
    if "lm_head.weight" not in renamed:  # tied embeddings
        renamed["lm_head.weight"] = renamed["embed_tokens.weight"][:, :, None, None]
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        raise DuetError(
            f"{path}: weights do not match a {cfg.model_type} model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return model.eval()


def additive_mask(offset: int, length: int, context: int, dtype=torch.float32) -> torch.Tensor:
    """Causal additive mask (1, 1, T, S) for T new tokens written at slot `offset`."""
    q = torch.arange(offset, offset + length)[:, None]
    k = torch.arange(context)[None, :]
    return torch.where(k <= q, 0.0, -1e4).to(dtype)[None, None]
