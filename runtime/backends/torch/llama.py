"""A plain PyTorch Llama / Qwen2 / Qwen3 with the KV cache as explicit tensors.

This is the reference every other backend is checked against and the graph
that `converters` exports to ONNX. Attribute names are the Hugging Face weight
names, so loading is `load_state_dict`. Attention is written out (no fused
kernel) so it traces to plain ONNX ops. It knows nothing about caching policy:
callers pass the past keys/values in and get the presents back.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import nn

from runtime.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """x / rms(x), in float32."""
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight.float() * self.normed(x)).to(x.dtype)


class OffsetRMSNorm(RMSNorm):
    """Gemma 3's and Qwen3.5's RMSNorm: weights stored around zero, applied as (1 + w)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.normed(x) * (1.0 + self.weight.float())).to(x.dtype)


def rope_inv_freq(cfg: ModelConfig, dim: int | None = None) -> torch.Tensor:
    """Inverse frequencies (D/2,) for plain, linear or Llama-3 scaled RoPE over the first
    `dim` channels of a head (default all: partial RoPE rotates fewer)."""
    d = dim or cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.rope_scaling
    if rs is None:
        return inv.float()
    kind = rs["rope_type"]
    if kind == "linear":
        return (inv / float(rs["factor"])).float()
    if kind == "llama3":
        factor, lo, hi = (
            float(rs["factor"]),
            float(rs["low_freq_factor"]),
            float(rs["high_freq_factor"]),
        )
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled).float()
    from runtime.errors import DuetError

    raise DuetError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3)")


_ROPE = threading.local()  # per thread: id(inv_freq) -> (positions, inv_freq, cos, sin)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor):
    """cos, sin (B, 1, T, D/2) of `positions` (B, T), computed once per forward: every layer of a
    forward gets the same positions tensor, so the angles are reused while both are the same
    objects (per thread and per RoPE base; identical values, 60 recomputations a step saved)."""
    memo = getattr(_ROPE, "memo", None)
    if memo is None:
        memo = _ROPE.memo = {}
    hit = memo.get(id(inv_freq))
    if hit is not None and hit[0] is positions and hit[1] is inv_freq:
        return hit[2], hit[3]
    ang = positions[:, None, :, None].float() * inv_freq  # (B, 1, T, D/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    memo[id(inv_freq)] = (positions, inv_freq, cos, sin)
    return cos, sin


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x (B, H, T, D), positions (B, T)."""
    cos, sin = rope_cos_sin(positions, inv_freq)
    x1, x2 = x[..., : x.shape[-1] // 2].float(), x[..., x.shape[-1] // 2 :].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d, kv = cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
        self.n_heads, self.n_kv, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        if cfg.qk_norm:  # Qwen3: per-head RMSNorm on q and k before RoPE
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, positions, mask, past_k, past_v, inv_freq):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), positions, inv_freq)  # (B, H, T, D)
        k = apply_rope(k.transpose(1, 2), positions, inv_freq)  # (B, KV, T, D)
        k = torch.cat([past_k, k], dim=2)  # (B, KV, S, D)
        v = torch.cat([past_v, v], dim=2)
        out = attend(q, k, v, mask, self.head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), k, v


def attend(q, k, v, mask: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Softmax attention written out: q (B, H, T, D), k/v (B, KV, S, D) with H a multiple of KV
    (grouped queries), mask bool (B, 1, T, S), scores scaled by 1/sqrt(head_dim) (a Python
    int, so an ONNX trace keeps it a constant). Returns (B, H, T, D)."""
    rep = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
    vv = v.repeat_interleave(rep, dim=1) if rep > 1 else v
    scores = (q.float() @ kk.float().transpose(-1, -2)) / math.sqrt(head_dim)
    scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    return torch.softmax(scores, dim=-1).to(vv.dtype) @ vv


class MLP(nn.Module):
    """The gated MLP, down(act(gate(x)) * up(x)); `act` SiLU (SwiGLU) unless a family says."""

    def __init__(self, cfg: ModelConfig, act=nn.functional.silu):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, positions, mask, past_k, past_v, inv_freq):
        a, k, v = self.self_attn(self.input_layernorm(h), positions, mask, past_k, past_v, inv_freq)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TorchLM(nn.Module):
    """Causal LM with explicit KV tensors: past/present are lists of (B, KV, S, D). The other
    families subclass it with their own `backbone`, `rope_dim`, `embed` and `run_layer`."""

    backbone = Backbone  # the family's embedding, layers and final norm (`model.*`)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = self.backbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg, self.rope_dim(cfg)), persistent=False)

    @staticmethod
    def rope_dim(cfg: ModelConfig) -> int | None:
        """Channels per head that RoPE turns (None: all)."""
        return None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def run_layer(self, layer, h, positions, mask, past):
        """One layer over h with its past; returns h and its present."""
        h, k, v = layer(h, positions, mask, past[0], past[1], self.inv_freq)
        return h, (k, v)

    def run_layers(self, h, start, stop, positions, mask, past):
        """Layers [start, stop): h (B, T, C) or ids when start == 0; returns h and presents."""
        if start == 0 and not torch.is_floating_point(h):
            h = self.embed(h)
        presents = []
        for i, layer in enumerate(self.model.layers[start:stop]):
            h, present = self.run_layer(layer, h, positions, mask, past[i])
            presents.append(present)
        return h, presents

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on any hidden state (Mirror-SD eq. 6)."""
        h = self.model.norm(h)
        w = self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight
        return h @ w.T

    def forward(self, input_ids, positions, mask, past):
        h, presents = self.run_layers(input_ids, 0, self.cfg.num_layers, positions, mask, past)
        return self.head(h), presents


Model = TorchLM  # this family's entry in runtime/backends/torch/__init__.py's FAMILIES


def sanitize(state: dict, path) -> dict:
    """A Llama / Qwen2 / Qwen3 checkpoint's tensors already carry TorchLM's names."""
    return state
