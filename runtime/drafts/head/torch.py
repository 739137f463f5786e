"""`--draft head`: a feature-level draft head fitted to the target (EAGLE-3, FR-Spec's vocabulary).

The head reads, at position i, the outputs of three of the target's layers (low, middle, high:
`tap_layers`, recorded by the PyTorch target as it verifies, `TorchCausalLM.record_layers`),
each RMS-normed and fused by one linear map 3H -> H, and the embedding of the next token
x_{i+1}: u = fc([norm_e(embed(x_{i+1})); norm_h(g_i)]), one decoder layer (its own KV cache,
RoPE position i), a norm, then its own LM head over a cut vocabulary: the K tokens the target
says most often in its own answers (FR-Spec), initialised from the target's rows. Drafting
chains the head on its own output (g = the previous output, not fused), as it was trained
("training-time test", apps/train/eagle.py).

Exact sampling over a cut vocabulary: the head's law over the full vocabulary is its softmax
over the K kept ids and exactly 0 elsewhere. Each drafted row is returned as full-vocabulary
logits with -inf outside the kept ids, so the q that every strategy computes from a draft's
logits (temperature, top-p, Gumbel draws) is that law, the drafted token is always a kept id,
and the target's acceptance rule min(1, p/q) with residual max(0, p - q) stays exact. The
ids a head keeps come back as full-vocabulary ids; nothing else in the engine changes.

Stored as a sidecar TARGET/.duet/eagle/ (model.safetensors with `eagle.*` tensors and the kept
ids, head.json with the taps and training record) by `python -m apps.train eagle`. It rides on
the MTP draft's machinery (runtime/drafts/mtp/torch.py: the head's cache, the redo of
chained entries once the target has verified them) and so runs where it does: one row, so
`sd` chains and `tree` / `heterospec` trees that expand one node per level. The head steps
in PyTorch, or beside a CPU target in ONNX Runtime (its step as two graphs with int8 weights,
runtime/drafts/head/onnx.py: a PyTorch step is ~30 ops whose dispatch outweighs their
arithmetic); the target is the PyTorch one or the ONNX one (runtime/backends/onnx/target.py
records the taps as its whole graph's third output, and the head step reads the token
embedding from the checkpoint's PyTorch twin: runtime/drafts/mtp/torch.py's TorchTwin).
"""

from __future__ import annotations

import json

import numpy as np
import torch
from torch import nn

from runtime.backends.torch.llama import DecoderLayer, RMSNorm, rope_inv_freq
from runtime.config import ModelConfig
from runtime.drafts.head import META, WEIGHTS, head_sidecar  # noqa: F401 (re-exported)
from runtime.drafts.mtp.torch import MTPDraft, TorchMTPStep, TorchTwin
from runtime.errors import DuetError


def tap_layers(num_layers: int) -> tuple[int, ...]:
    """The low, middle and high layers whose outputs the head fuses (0-based; EAGLE-3's choice
    as SpecForge makes it: 1, L/2 - 1, L - 4), clipped below the last layer for tiny targets."""
    want = (1, num_layers // 2 - 1, num_layers - 4)
    return tuple(min(max(0, i), max(0, num_layers - 2)) for i in want)


class EagleHead(nn.Module):
    """Fuse the taps, fc over [normed embedding; normed feature], one decoder layer, a norm,
    an LM head over `vocab` kept ids (the buffer `vocab_ids`, full-vocabulary ids)."""

    def __init__(self, cfg: ModelConfig, n_taps: int, vocab: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.n_taps, self.hidden = n_taps, h
        self.tap_norm = nn.Parameter(torch.ones(n_taps, h))
        self.eps = eps
        self.fuse = nn.Linear(n_taps * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, eps)
        self.pre_fc_norm_hidden = RMSNorm(h, eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg)])
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.register_buffer("vocab_ids", torch.zeros(vocab, dtype=torch.long))

    def feature(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's taps (..., n_taps*H) fused to (..., H); a chained output passes as is."""
        if hidden.shape[-1] == self.hidden:
            return hidden
        lead = hidden.shape[:-1]  # sizes read off the tensor: an ONNX trace keeps them dynamic
        x = hidden.float().reshape(*lead, self.n_taps, self.hidden)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.tap_norm.float()
        return self.fuse(x.reshape(*lead, self.n_taps * self.hidden).to(self.fuse.weight.dtype))

    def step(self, emb, hidden, positions, mask, past, inv_freq):
        """emb (B, T, H), hidden (B, T, n_taps*H or H) -> output (B, T, H) and the layer's k, v
        (past + new). mask (B, 1, T, S + T) bool; past (k, v) each (B, KV, S, D)."""
        e = self.pre_fc_norm_embedding(emb)
        g = self.pre_fc_norm_hidden(self.feature(hidden))
        u = self.fc(torch.cat([e, g.to(e.dtype)], dim=-1))
        u, k, v = self.layers[0](u, positions, mask, past[0], past[1], inv_freq)
        return self.norm(u), k, v


def head_meta(target_dir) -> dict:
    """head.json of the target's head; a DuetError saying how to fit one when there is none."""
    side = head_sidecar(target_dir)
    if not (side / WEIGHTS).is_file() or not (side / META).is_file():
        raise DuetError(
            f"--draft head: no fitted head beside the target ({side / WEIGHTS}); fit one with "
            f"`python -m apps.train eagle --target {target_dir}`"
        )
    return json.loads((side / META).read_text())


def load_eagle_head(target_dir, cfg: ModelConfig, dtype=torch.float32) -> EagleHead:
    """The sidecar head of `target_dir`, checked against the target's shape."""
    from safetensors.torch import load_file

    meta = head_meta(target_dir)
    path = head_sidecar(target_dir) / WEIGHTS
    state = {k[6:]: v for k, v in load_file(str(path)).items() if k.startswith("eagle.")}
    taps, vocab = meta.get("layers", []), int(state.get("vocab_ids", torch.zeros(0)).shape[0])
    if not taps or max(taps) >= cfg.num_layers or vocab == 0 or vocab > cfg.vocab_size:
        raise DuetError(
            f"{path}: this head was not fitted for this target (taps {taps}, "
            f"{vocab} kept ids; the target has {cfg.num_layers} layers)"
        )
    head = EagleHead(cfg, len(taps), vocab)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DuetError(
            f"{path}: weights do not match a head for this target (missing "
            f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    head.layers_tapped = tuple(int(i) for i in taps)
    return head.to(dtype).eval()


class TorchEagleStep(TorchMTPStep):
    """One head step in PyTorch on the target's device; rows come back as full-vocabulary
    logits, -inf outside the kept ids (the law is exactly the softmax over the kept ids)."""

    def __init__(self, target, head: EagleHead):
        super().__init__(target, head)
        self.inv_freq = rope_inv_freq(self.cfg).to(self.device)
        self.ids = head.vocab_ids.to(self.device)

    @torch.inference_mode()
    def __call__(self, ids: list[int], hidden, j: int, past):
        n, dev = len(ids), self.device
        from runtime.model import causal_mask

        pos = torch.arange(j, j + n, device=dev)[None]
        mask = torch.from_numpy(causal_mask(past[0].shape[2], n))[None, None].to(dev)
        x = self.m.model.embed_tokens(torch.tensor([ids], device=dev))
        out, k, v = self.head.step(x, hidden.to(x.dtype)[None], pos, mask, past, self.inv_freq)
        small = self.head.lm_head(out[0]).float()
        full = torch.full((n, self.cfg.vocab_size), -np.inf, device=dev)
        full[:, self.ids] = small
        return list(out[0]), list(full.cpu().numpy()), (k, v)


class HeadDraft(MTPDraft):
    """The fitted head behind the CausalLM protocol (batch 1: chains, and `tree` or
    `heterospec` trees that expand one node per level), stepped in PyTorch or ONNX Runtime.

    An `sd` chain ends once the chance that all its drafts are accepted (the product of their
    max probabilities: the head's confidence is calibrated) falls below `stop_below`
    (runtime/decoding/sd.py draft_window). 0.45 measured best of 0, 0.15, 0.3 and 0.45 on
    SmolLM2's held-out chat prompts: 1.05x `ar` against 0.83x with none (docs/benchmarks.md)."""

    stop_below = 0.45

    def __init__(self, target, head: EagleHead, twin=None, step=None):
        """`twin`: what the head step reads of the target (TorchTwin.of(target)); `step`: the
        step's runner (default TorchEagleStep; OnnxEagleStep in ONNX Runtime)."""
        _check_target_records(target)
        twin = twin if twin is not None else TorchTwin.of(target)
        super().__init__(target, head, step=step or TorchEagleStep(twin, head))
        self.backend = "torch" if step is None else "onnx"
        target.record_layers = head.layers_tapped  # record these layers' outputs, not h_L

    @classmethod
    def load(
        cls, target, path, backend: str = "torch", threads: int = 1, quant: str = "int8"
    ) -> HeadDraft:
        """The sidecar head of checkpoint `path` beside `target`; `backend` onnx steps it in
        ONNX Runtime (runtime/drafts/head/onnx.py, int8 weights unless `quant` is fp32)."""
        _check_target_records(target)
        twin = TorchTwin.of(target)
        dtype = next(twin.module.parameters()).dtype
        head = load_eagle_head(path, target.config, dtype)
        if backend != "onnx":
            draft = cls(target, head, twin)
        else:
            from runtime.drafts.head.onnx import OnnxEagleStep

            step = OnnxEagleStep.for_target(
                twin, head, head_sidecar(path) / WEIGHTS, threads, quant
            )
            draft = cls(target, head, twin, step=step)
        draft.bins_file = head_sidecar(path) / "bins.json"  # heterospec's, if fitted (pair_bins)
        return draft


def _check_target_records(target) -> None:
    if target.backend not in ("torch", "onnx") or not hasattr(target, "record_layers"):
        raise DuetError(
            "--draft head runs beside a PyTorch or an ONNX target (--target-backend "
            "torch or onnx): it reads the outputs of the target's layers"
        )
