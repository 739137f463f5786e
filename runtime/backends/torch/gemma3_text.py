"""Gemma 3 (`gemma3_text`, and the text tower of `gemma3`) in plain PyTorch, the reference.

What sets it apart from llama.py's Llama/Qwen family:
- local sliding-window layers beside global ones (config `sliding`), each kind with its own
  RoPE base (`rope_local_theta` for local, `rope_theta` and its scaling for global). A local
  layer's query at position p sees keys at positions (p - window, p]: its past carries its
  columns' positions (B, S) (runtime/caches/sliding.py keeps only the window and a slack), and
  the window is applied on positions, so tree masks and branch rows with holes stay right;
- q/k RMSNorm, and RMSNorms before and after both attention and the MLP, each Gemma's
  `(1 + weight)` form computed in float32;
- the embedding scaled by sqrt(hidden) (rounded to the embedding's dtype, as transformers
  does), tied embeddings, a GELU-tanh gated MLP;
- attention scores scaled by query_pre_attn_scalar^-1/2, and the final logits soft-capped
  (cap * tanh(x / cap)) where the config sets final_logit_softcapping. Gemma 3 dropped
  Gemma 2's attention soft-cap: transformers' Gemma 3 ignores attn_logit_softcapping, and so
  do we (parity with it is the contract).

Same interface as TorchLM (cfg, model.embed_tokens / layers / norm, run_layers, head,
forward), so the torch backend, the ONNX exporter and every decoding method use it unchanged.
Attribute names are the Hugging Face weight names.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from runtime.backends.torch.llama import (
    MLP,
    OffsetRMSNorm,
    TorchLM,
    apply_rope,
    attend,
    rope_inv_freq,
)
from runtime.config import ModelConfig
from runtime.text_tower import text_tower


class GemmaRMSNorm(OffsetRMSNorm):
    """x / rms(x) * (1 + weight), in float32, its weights made as zeros (as transformers'
    Gemma makes them: offsets from one)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        self.weight = nn.Parameter(torch.zeros(dim))


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap): Gemma's soft-capping of the final logits."""
    return torch.tanh(x / cap) * cap


def window_mask(mask, key_pos, positions, window: int) -> torch.Tensor:
    """The last S columns of mask (B, 1, T, S_all), those a local layer holds, limited to keys
    whose positions key_pos (B, S) lie in (p - window, p] for a query at p (positions (B, T))."""
    S = key_pos.shape[1]
    near = key_pos[:, None, None, :] > positions[:, None, :, None] - window  # (B, 1, T, S)
    return mask[..., -S:] & near


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, sliding: bool):
        super().__init__()
        h, d, kv = cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
        self.n_heads, self.n_kv, self.head_dim, self.sliding = h, kv, d, sliding
        self.window = cfg.sliding_window
        qpas = cfg.query_pre_attn_scalar
        self.scalar = int(qpas) if qpas == int(qpas) else qpas  # an int stays a trace constant
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = GemmaRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, positions, mask, past, inv_freq):
        """past: (k, v) for a global layer, (k, v, key positions (B, S)) for a local one.
        Returns the output and the presents in the same form."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim))
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q = apply_rope(q.transpose(1, 2), positions, inv_freq)  # (B, H, T, D)
        k = torch.cat([past[0], apply_rope(k.transpose(1, 2), positions, inv_freq)], dim=2)
        v = torch.cat([past[1], v], dim=2)  # (B, KV, S, D)
        if self.sliding:
            key_pos = torch.cat([past[2], positions], dim=1)  # (B, S)
            m, present = window_mask(mask, key_pos, positions, self.window), (k, v, key_pos)
        else:
            m, present = mask, (k, v)
        out = attend(q, k, v, m, self.scalar)  # scores / sqrt(query_pre_attn_scalar)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), present


def activation(name: str):
    """The MLP's gate activation: the GELU tanh forms, or exact GELU."""
    if name == "gelu":
        return nn.functional.gelu
    return lambda x: nn.functional.gelu(x, approximate="tanh")


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, sliding: bool):
        super().__init__()
        eps, c = cfg.rms_norm_eps, cfg.hidden_size
        self.self_attn = Gemma3Attention(cfg, sliding)
        self.mlp = MLP(cfg, activation(cfg.hidden_activation))
        self.input_layernorm = GemmaRMSNorm(c, eps)
        self.post_attention_layernorm = GemmaRMSNorm(c, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(c, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(c, eps)

    def forward(self, h, positions, mask, past, inv_freq):
        a, present = self.self_attn(self.input_layernorm(h), positions, mask, past, inv_freq)
        h = h + self.post_attention_layernorm(a)
        h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        return h, present


class Gemma3Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        kinds = cfg.sliding or (False,) * cfg.num_layers
        self.layers = nn.ModuleList(Gemma3Layer(cfg, s) for s in kinds)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Gemma3LM(TorchLM):
    """Gemma 3 causal LM with explicit KV tensors: past/presents are lists of (k, v) for global
    layers and (k, v, key positions) for local ones (runtime/caches/sliding.py's get/put)."""

    backbone = Gemma3Backbone

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)  # inv_freq: the global layers' RoPE
        local = replace(cfg, rope_theta=cfg.rope_local_theta or cfg.rope_theta, rope_scaling=None)
        self.register_buffer("inv_freq_local", rope_inv_freq(local), persistent=False)
        self.embed_scale = math.sqrt(cfg.hidden_size)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings times sqrt(hidden), the scale rounded to the weights' dtype."""
        w = self.model.embed_tokens.weight
        return self.model.embed_tokens(ids) * torch.tensor(self.embed_scale, dtype=w.dtype)

    def run_layer(self, layer, h, positions, mask, past):
        inv = self.inv_freq_local if layer.self_attn.sliding else self.inv_freq
        return layer(h, positions, mask, past, inv)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head (soft-capped where the config says) on any hidden state."""
        logits = super().head(h)
        cap = self.cfg.final_logit_softcapping
        return soft_cap(logits, cap) if cap else logits


def sanitize(state: dict, path) -> dict:
    """A multimodal gemma3 checkpoint's language model under our names, its vision tower and
    projector set aside with one line on stderr (runtime/text_tower.py)."""
    return text_tower(state, path)


Model = Gemma3LM  # this family's entry in runtime/backends/torch/__init__.py's FAMILIES
