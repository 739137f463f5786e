"""`--draft mtp`: a target's multi-token-prediction head (`mtp.*` weights) as the draft.

The head reads the target's hidden state h_i at position i and the embedding of the next
token x_{i+1}: u = fc([norm_e(embed(x_{i+1})); norm_h(h_i)]), one decoder layer of the
target's own family with its own KV cache (RoPE position i), then its own norm; the
target's LM head turns that into the law of x_{i+2}. Drafting γ tokens chains the head on its
own output hidden state. Conventions (post-norm hidden states in and out, embedding first in
the concatenation, RoPE position i) follow vLLM's Qwen3-Next MTP; they are not checked here
against a released checkpoint. On a hybrid (qwen3_5) target the layer is its gated attention
layer and the norms are (1 + w); on Llama / Qwen2 / Qwen3 the layer is a plain decoder layer.

Where the weights are found (runtime/drafts/mtp/weights.py): the checkpoint's own `mtp.*`
tensors (as Qwen3.5 / Qwen3.6 releases ship them), else the sidecar
TARGET/.duet/mtp/model.safetensors that `python -m apps.train mtp` writes in the same layout
(`mtp.` prefix), so any of our targets gets one without copying the target.

`MTPDraft` is a CausalLM over the draft positions, so `sd` runs it unchanged. The target's
post-norm hidden states come from the target's own cache (the PyTorch backend records them
when asked): a hidden state is used only for positions the target cache holds, i.e. the
committed prefix. Entries of the head's cache computed from its own (chained) hidden state
are recomputed from the target's, in one batched pass, once the target has verified those
positions. It runs on the target's device and process and takes no tree/branch masks or
layer ranges; training lives in apps/train/mtp.py.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from runtime.backends.torch.llama import DecoderLayer, RMSNorm
from runtime.backends.torch.qwen3_5 import FULL, HybridLayer, OffsetRMSNorm
from runtime.caches.concat import ConcatKVCache
from runtime.config import ModelConfig
from runtime.drafts.base import TokenCache
from runtime.drafts.mtp.weights import WEIGHTS, find_mtp_weights, mtp_sidecar  # noqa: F401
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens


class MTPHead(nn.Module):
    """fc over [normed embedding; normed hidden], one decoder layer, a final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, norm = cfg.hidden_size, OffsetRMSNorm if cfg.is_hybrid else RMSNorm
        self.hybrid = cfg.is_hybrid
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = norm(h, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            [HybridLayer(cfg, FULL) if cfg.is_hybrid else DecoderLayer(cfg)]
        )
        self.norm = norm(h, cfg.rms_norm_eps)

    def step(self, emb, hidden, positions, mask, past, inv_freq):
        """emb, hidden (B, T, H) -> post-norm hidden (B, T, H) and the layer's (past + new) k, v.

        mask (B, 1, T, S + T) bool over past then new keys; past (k, v) each (B, KV, S, D)."""
        e, h = self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)
        u = self.fc(torch.cat([e, h], dim=-1))
        if self.hybrid:
            u, (k, v) = self.layers[0](u, positions, mask, past, inv_freq)
        else:
            u, k, v = self.layers[0](u, positions, mask, past[0], past[1], inv_freq)
        return self.norm(u), k, v


def load_mtp_head(path, cfg: ModelConfig, dtype=torch.float32) -> MTPHead:
    """The `mtp.*` weights of checkpoint `path` (or its sidecar) as an MTPHead, or a DuetError."""
    state, src = find_mtp_weights(path)
    head = MTPHead(cfg)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DuetError(
            f"{src}: mtp.* weights do not match a one-layer MTP head for this target "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return head.to(dtype).eval()


class MTPCache(TokenCache):
    """Tokens seen, and per draft position p >= 1 the head's KV entry (RoPE position p - 1),
    its output hidden state and logits, and whether its input hidden state was the target's."""

    def __init__(self, empty):
        self.tokens: list[int] = []
        self.kv = ConcatKVCache(1, 1, empty)  # entry j is draft position j + 1
        self.out: list = []  # post-norm hidden (H,) per entry (the stepper's array type)
        self.logits: list[np.ndarray] = []  # (V,) float32 per entry
        self.exact: list[bool] = []

    def dropped(self, n: int) -> None:
        self._keep(max(0, self.offset - 1))

    def _keep(self, entries: int) -> None:
        self.kv.trim(self.kv.offset - min(entries, self.kv.offset))
        self.out, self.exact = self.out[:entries], self.exact[:entries]
        self.logits = self.logits[:entries]

    def fork(self, rows) -> MTPCache:
        """A copy (this cache unchanged) that a tree drafter extends along its chain: one row
        only, so `tree` and `heterospec` expand one node per level (--expand 1)."""
        _one_row(rows)
        new = MTPCache.__new__(MTPCache)
        new.tokens, new.kv = list(self.tokens), self.kv.fork([0])
        new.out, new.logits, new.exact = list(self.out), list(self.logits), list(self.exact)
        return new

    def select(self, rows) -> None:
        _one_row(rows)  # the one row is the one expanded node's path already


def _one_row(rows) -> None:
    if list(rows) != [0]:
        raise DuetError(
            "--draft mtp/head draft one row: a tree expands one node per level (--expand 1)"
        )


def _check_target(target) -> None:
    if target.backend not in ("torch", "onnx") or not hasattr(target, "record_hidden"):
        raise DuetError(
            "--draft mtp runs beside a PyTorch or an ONNX target (--target-backend torch or "
            "onnx): it reads the target's last hidden state"
        )


class TorchTwin:
    """What a head step reads of a target that does not run in PyTorch (the ONNX target): the
    checkpoint as a PyTorch module (its embedding, LM head and RoPE frequencies), loaded once
    on the CPU; the target itself otherwise."""

    backend = "torch"
    device = torch.device("cpu")

    def __init__(self, target):
        from runtime.backends.torch import load_torch_lm

        self.config, self.module = target.config, load_torch_lm(target.dir, torch.float32).eval()

    @staticmethod
    def of(target):
        return TorchTwin(target) if target.backend == "onnx" else target


class TorchMTPStep:
    """One head step in PyTorch on the target's device: the reference twin of the ONNX step
    (runtime/drafts/mtp/onnx.py)."""

    def __init__(self, target, head: MTPHead):
        self.m, self.cfg = target.module, target.config
        self.device = getattr(target, "device", torch.device("cpu"))
        self.head = head.to(self.device)
        self.dtype = next(head.parameters()).dtype

    def empty(self, b: int):
        c = self.cfg
        return torch.zeros(b, c.num_kv_heads, 0, c.head_dim, dtype=self.dtype, device=self.device)

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        return h

    def zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, self.cfg.hidden_size, dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def __call__(self, ids: list[int], hidden, j: int, past):
        """Entries j.. for tokens `ids` reading `hidden` (n, H): (outs, logits rows, (k, v))."""
        n, m, dev = len(ids), self.m, self.device
        pos = torch.arange(j, j + n, device=dev)[None]
        mask = torch.from_numpy(causal_mask(past[0].shape[2], n))[None, None].to(dev)
        x = m.model.embed_tokens(torch.tensor([ids], device=dev))
        out, k, v = self.head.step(x, hidden.to(x.dtype)[None], pos, mask, past, m.inv_freq)
        w = m.model.embed_tokens.weight if self.cfg.tie_word_embeddings else m.lm_head.weight
        return list(out[0]), list((out[0] @ w.T).float().cpu().numpy()), (k, v)


class MTPDraft:
    """The target's MTP head behind the CausalLM protocol (batch 1), stepped in PyTorch or,
    on a CPU target, in ONNX Runtime (`load(..., backend="onnx")`)."""

    supports_layer_range = False
    reads_target_hidden = True  # the target must record its hidden states while this drafts

    def __init__(self, target, head: MTPHead, step=None):
        _check_target(target)
        self.target, self.config = target, target.config
        self.step = step if step is not None else TorchMTPStep(target, head)
        self.head_module = head
        self.backend = "onnx" if step is not None else "torch"
        target.record_hidden = True  # the target cache keeps its post-norm hidden states

    @classmethod
    def load(
        cls, target, path, backend: str = "torch", threads: int = 1, quant: str = "int8"
    ) -> MTPDraft:
        """The head of checkpoint `path` (or its sidecar) beside `target`; `backend` onnx runs
        its steps in ONNX Runtime (exported once into the sidecar folder), with int8 weights
        unless `quant` is fp32 (runtime/drafts/mtp/onnx.py)."""
        _check_target(target)
        twin = TorchTwin.of(target)  # an ONNX target's embedding and LM head, in PyTorch
        dtype = next(twin.module.parameters()).dtype
        head = load_mtp_head(path, target.config, dtype)
        if twin is not target:  # the ONNX target norms its last hidden state as PyTorch does
            target.hidden_norm = twin.module.model.norm
        if backend == "onnx":
            from runtime.drafts.mtp.onnx import OnnxMTPStep

            return cls(target, head, OnnxMTPStep.for_target(twin, head, path, threads, quant))
        return cls(target, head, TorchMTPStep(twin, head) if twin is not target else None)

    def new_cache(self, batch: int = 1) -> MTPCache:
        if batch != 1:
            raise DuetError("--draft mtp drafts one row only (no branch rollouts)")
        return MTPCache(self.step.empty)

    def _target_hidden(self, tokens: list[int]) -> torch.Tensor | None:
        """The target's post-norm hidden states (N, H) over the committed positions its last
        cache shares with `tokens` (a cache of another sequence shares only a common prefix,
        where causal hidden states are the same); None when there are none."""
        tc = getattr(self.target, "last_cache", None)
        h, ids = getattr(tc, "hidden", None), getattr(tc, "hidden_ids", [])
        n = 0 if h is None else min(tc.offset, len(ids), len(tokens))
        if n and ids[:n] != tokens[:n]:  # usually equal; a stale cache shares only a prefix
            n = next(i for i, (a, b) in enumerate(zip(ids, tokens, strict=False)) if a != b)
        return h[:n] if n else None

    def _run(self, cache: MTPCache, j: int, hidden, exact: bool) -> None:
        """Append head entries j .. j+n-1 (tokens x_{j+1..j+n}, hidden (n, H), RoPE j..)."""
        n = hidden.shape[0]
        outs, logits, (k, v) = self.step(
            cache.tokens[j + 1 : j + 1 + n], hidden, j, cache.kv.get(0)
        )
        cache.kv.put(0, k, v)
        cache.out += outs
        cache.logits += logits
        cache.exact += [exact] * n

    def forward(self, tokens, cache: MTPCache, *, positions=None, mask=None) -> np.ndarray:
        if positions is not None or mask is not None:
            raise DuetError(
                "--draft mtp takes no explicit positions or masks (trees: one row per level)"
            )
        new = check_tokens(tokens, self.config.vocab_size)
        if new.shape[0] != 1:
            raise DuetError("--draft mtp drafts one row only")
        cache.tokens += new[0].tolist()
        th = self._target_hidden(cache.tokens)
        n_th = 0 if th is None else th.shape[0]
        first = len(cache.exact)  # chained (inexact) entries are a suffix of the cache
        while first and not cache.exact[first - 1]:
            first -= 1
        if first < min(len(cache.exact), n_th):
            cache._keep(first)  # redo the chained entries the target has now verified
        j, end = len(cache.exact), cache.offset - 1  # entry j: token x_{j+1}, hidden h_j
        if j < min(end, n_th):  # every entry the target has verified, in one pass
            self._run(cache, j, self.step.hidden(th[j : min(end, n_th)]), True)
        j = len(cache.exact)
        if end - j > 1:  # no target hidden yet (a fresh prompt): zeros, one pass, redone later
            self._run(cache, j, self.step.zeros(end - 1 - j), False)
        for j in range(len(cache.exact), end):  # chained on the head's own output
            self._run(cache, j, cache.out[j - 1][None] if j else self.step.zeros(1), False)
        T, V = new.shape[1], self.config.vocab_size
        if T == 1 and cache.offset >= 2:  # a drafting step: one row (a copy: callers may scale it)
            return cache.logits[cache.offset - 2][None, None].copy()
        rows = [
            cache.logits[p - 1] if p >= 1 else np.zeros(V, np.float32)
            for p in range(cache.offset - T, cache.offset)
        ]
        return np.stack(rows)[None]
