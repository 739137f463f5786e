"""A plain PyTorch Qwen3.5 / Qwen3.6 text model (`qwen3_5_text`): Gated DeltaNet linear
attention beside gated full attention, with every state an explicit tensor.

The hybrid twin of llama.py (its RMSNorm, RoPE, softmax attention and MLP are imported,
not copied). A linear-attention layer takes its conv state (B, C, K-1) (the last K-1
pre-conv inputs) and its recurrent state (B, Hv, Dk, Dv) in and returns the new ones, like
a KV cache; it also returns the per-position quantities of the window (pre-conv inputs, k,
v, decay g, β) and the recurrent states after the window positions the cache asks for, which
is what runtime/caches/hybrid.py keeps to land the state on any accepted prefix: by picking a
kept state, or by replaying only the recurrence (`delta_step` is the one function both the
forward and the replay call, so a replayed state is bit-identical to the forward's).

The delta rule runs token by token (the recurrent form) for decode and for windows alike:
slow and obviously correct. Numbers follow transformers' modeling_qwen3_5.py: (1 + w)
RMSNorms, l2-normalized q/k, q scaled by 1/sqrt(Dk), a gated RMSNorm on the output, partial
rotary embedding, an output gate on full attention. Text-only positions make the
multimodal RoPE sections identical, so plain RoPE over the rotary channels is exact.
It does not run the `mtp.*` head (that is not built yet) nor the vision tower.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.backends.torch.llama import (
    MLP,
    OffsetRMSNorm,
    RMSNorm,
    TorchLM,
    apply_rope,
    attend,
)
from runtime.config import ModelConfig
from runtime.text_tower import text_tower

LINEAR, FULL = "linear_attention", "full_attention"


class GatedRMSNorm(RMSNorm):
    """RMSNorm(x) * w * silu(gate): the output norm of a Gated DeltaNet layer."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return (super().forward(x).float() * F.silu(gate.float())).to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_step(state, k, v, g, beta):
    """One step of the gated delta rule: S <- exp(g) S + k (β (v - Sᵀk))ᵀ.

    state (B, H, Dk, Dv), k (B, H, Dk), v (B, H, Dv), g and beta (B, H). Forward and
    rollback replay both call this, so they agree bit for bit.
    """
    state = state * g.exp()[..., None, None]
    kv_mem = (state * k[..., None]).sum(dim=-2)  # Sᵀk (B, H, Dv)
    delta = (v - kv_mem) * beta[..., None]
    return state + k[..., None] * delta[..., None, :]


def replay(state, k, v, g, beta, n: int, start: int = 0):
    """The recurrent state after logged positions [start, n), from `state` (the state after
    the first `start`).

    k/v (B, H, T, D), g/β (B, H, T)."""
    for t in range(start, n):
        state = delta_step(state, k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
    return state


def conv_state_after(conv_base: torch.Tensor, xin: torch.Tensor, n: int) -> torch.Tensor:
    """The conv state (B, C, K-1) after the first `n` of the pre-conv inputs xin (B, C, T)."""
    width = conv_base.shape[-1]
    return torch.cat([conv_base, xin[:, :, :n]], dim=-1)[:, :, -width:] if width else conv_base


class GatedDeltaNet(nn.Module):
    """Linear attention with a causal depthwise conv and the gated delta rule."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        r = cfg.raw
        self.n_k, self.n_v = int(r["linear_num_key_heads"]), int(r["linear_num_value_heads"])
        self.dk, self.dv = int(r["linear_key_head_dim"]), int(r["linear_value_head_dim"])
        self.kernel = int(r.get("linear_conv_kernel_dim", 4))
        key_dim, value_dim = self.n_k * self.dk, self.n_v * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.kernel, bias=False, groups=self.conv_dim
        )
        self.dt_bias = nn.Parameter(torch.ones(self.n_v))
        self.A_log = nn.Parameter(torch.zeros(self.n_v))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.n_v, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.n_v, bias=False)

    def empty_state(self, batch: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv state (B, C, K-1) and recurrent state (B, Hv, Dk, Dv)."""
        return (
            torch.zeros(batch, self.conv_dim, self.kernel - 1, dtype=dtype),
            torch.zeros(batch, self.n_v, self.dk, self.dv, dtype=torch.float32),
        )

    def forward(self, x, conv_state, rec_state, keep=()):
        """x (B, T, C) -> (out, new conv state, new recurrent state, log, kept).

        log = (xin (B, C, T) pre-conv inputs, k (B, Hv, T, Dk), v (B, Hv, T, Dv), g, β (B, Hv, T)):
        everything the recurrence consumed, so a cache can land on any prefix of the window.
        kept = {j: the recurrent state after the window's first j tokens} for j in `keep`: the
        recurrent form computes each of them anyway, so keeping one costs only its memory.
        """
        B, T, _ = x.shape
        xin = self.in_proj_qkv(x).transpose(1, 2)  # (B, C, T)
        xcat = torch.cat([conv_state.to(xin.dtype), xin], dim=-1)  # (B, C, K-1+T)
        mixed = F.silu(F.conv1d(xcat, self.conv1d.weight, groups=self.conv_dim))  # (B, C, T)
        mixed = mixed.transpose(1, 2)
        kd = self.n_k * self.dk
        q, k, v = torch.split(mixed, [kd, kd, self.n_v * self.dv], dim=-1)
        rep = self.n_v // self.n_k  # each q/k head serves `rep` consecutive value heads
        q = q.reshape(B, T, self.n_k, self.dk).repeat_interleave(rep, dim=2).transpose(1, 2)
        k = k.reshape(B, T, self.n_k, self.dk).repeat_interleave(rep, dim=2).transpose(1, 2)
        v = v.reshape(B, T, self.n_v, self.dv).transpose(1, 2).float()  # (B, Hv, T, Dv)
        q = l2norm(q.float()) / (self.dk**0.5)
        k = l2norm(k.float())
        beta = self.in_proj_b(x).sigmoid().float().transpose(1, 2)  # (B, Hv, T)
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        g = g.transpose(1, 2)  # log decay (B, Hv, T)
        state, outs, kept = rec_state, [], {}
        for t in range(T):  # the recurrent form, one token at a time
            state = delta_step(state, k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
            outs.append((state * q[:, :, t, :, None]).sum(dim=-2))  # (B, Hv, Dv)
            if t + 1 in keep:
                kept[t + 1] = state
        core = torch.stack(outs, dim=1).to(x.dtype)  # (B, T, Hv, Dv)
        z = self.in_proj_z(x).reshape(B, T, self.n_v, self.dv)
        out = self.out_proj(self.norm(core, z).reshape(B, T, -1))
        new_conv = xcat[:, :, xcat.shape[-1] - (self.kernel - 1) :]
        return out, new_conv, state, (xin, k, v, g, beta), kept


class GatedAttention(nn.Module):
    """Full attention with q/k (1 + w) norms, partial RoPE and a sigmoid output gate."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d, kv = cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
        self.n_heads, self.n_kv, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(cfg.hidden_size, 2 * h * d, bias=cfg.attention_bias)  # q, gate
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, positions, mask, past_k, past_v, inv_freq):
        B, T, _ = x.shape
        q, gate = self.q_proj(x).view(B, T, self.n_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        rot = 2 * inv_freq.shape[0]  # partial RoPE: only the first `rot` channels turn
        q = torch.cat([apply_rope(q[..., :rot], positions, inv_freq), q[..., rot:]], dim=-1)
        k = torch.cat([apply_rope(k[..., :rot], positions, inv_freq), k[..., rot:]], dim=-1)
        k = torch.cat([past_k, k], dim=2)  # (B, KV, S, D)
        v = torch.cat([past_v, v], dim=2)
        out = attend(q, k, v, mask, self.head_dim).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(out * torch.sigmoid(gate.reshape(B, T, -1))), k, v


class HybridLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, kind: str):
        super().__init__()
        self.kind = kind
        if kind == LINEAR:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, positions, mask, past, inv_freq):
        """past: (k, v) for full attention, (conv, recurrent[, keep]) for linear (keep: the
        window lengths whose recurrent states to return). Returns h, present."""
        x = self.input_layernorm(h)
        if self.kind == LINEAR:
            a, conv, rec, log, kept = self.linear_attn(x, *past)
            present = (conv, rec, log, kept)
        else:
            a, k, v = self.self_attn(x, positions, mask, *past, inv_freq)
            present = (k, v)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), present


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(cfg, kind) for kind in cfg.layer_types)
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def rotary_dim(cfg: ModelConfig) -> int:
    """Channels per head that RoPE turns (`partial_rotary_factor`, 0.25 by default)."""
    r = cfg.raw
    f = r.get(
        "partial_rotary_factor", (r.get("rope_parameters") or {}).get("partial_rotary_factor")
    )
    return int(cfg.head_dim * (0.25 if f is None else float(f)))


class Qwen3_5LM(TorchLM):
    """The hybrid causal LM: per-layer past/present are (k, v) or (conv, recurrent[, ...])."""

    backbone = Backbone
    rope_dim = staticmethod(rotary_dim)

    def run_layer(self, layer, h, positions, mask, past):
        return layer(h, positions, mask, past, self.inv_freq)


def sanitize(state: dict, path) -> dict:
    """The language model's weights under our names: a multimodal checkpoint's text tower, its
    vision weights (with one line on stderr) and the `mtp.*` head set aside
    (runtime/text_tower.py)."""
    return text_tower(state, path)


Model = Qwen3_5LM  # this family's entry in runtime/backends/torch/__init__.py's FAMILIES
