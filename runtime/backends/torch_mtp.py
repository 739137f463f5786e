"""`--draft mtp`: a Qwen3.5 checkpoint's own multi-token-prediction head as the draft.

The head (`mtp.*` weights) reads the target's hidden state h_i at position i and the
embedding of the next token x_{i+1}: u = fc([norm_e(embed(x_{i+1})); norm_h(h_i)]), one
full-attention decoder layer with its own KV cache (RoPE position i), then its own norm; the
target's LM head turns that into the law of x_{i+2}. Drafting γ tokens chains the head on its
own output hidden state. Conventions (post-norm hidden states in and out, embedding first in
the concatenation, RoPE position i) follow vLLM's Qwen3-Next MTP; they are not checked here
against a released checkpoint.

`MTPDraft` is a CausalLM over the draft positions, so `sd` runs it unchanged. The target's
post-norm hidden states come from the target's own cache (the PyTorch backend records them
when asked): a hidden state is used only for positions the target cache holds, i.e. the
committed prefix. Entries of the head's cache computed from its own (chained) hidden state
are recomputed from the target's once the target has verified those positions. It runs on
the target's device and process and takes no tree/branch masks or layer ranges; it does not
train a head (no `apps.train mtp`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from runtime.backends.torch_qwen3_5 import FULL, HybridLayer, OffsetRMSNorm
from runtime.cache import ConcatKVCache
from runtime.config import ModelConfig, weight_files
from runtime.errors import DuetError
from runtime.model import check_tokens


class MTPHead(nn.Module):
    """fc over [normed embedding; normed hidden], one gated-attention layer, a final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = OffsetRMSNorm(h, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = OffsetRMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([HybridLayer(cfg, FULL)])
        self.norm = OffsetRMSNorm(h, cfg.rms_norm_eps)

    def step(self, emb, hidden, positions, mask, past, inv_freq):
        """emb, hidden (B, T, H) -> post-norm hidden (B, T, H) and the layer's (k, v)."""
        e, h = self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)
        u = self.fc(torch.cat([e, h], dim=-1))
        u, (k, v) = self.layers[0](u, positions, mask, past, inv_freq)
        return self.norm(u), k, v


def load_mtp_head(path, cfg: ModelConfig, dtype=torch.float32) -> MTPHead:
    """The `mtp.*` weights of checkpoint `path` as an MTPHead, or one DuetError."""
    from safetensors.torch import load_file

    state = {}
    for f in weight_files(path):
        state.update({k[4:]: v for k, v in load_file(str(f)).items() if k.startswith("mtp.")})
    if not state:
        raise DuetError(
            f"{path}: no mtp.* weights; --draft mtp needs a checkpoint with a "
            "multi-token-prediction head (Qwen3.5 / Qwen3.6 releases ship one)"
        )
    head = MTPHead(cfg)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DuetError(
            f"{path}: mtp.* weights do not match a one-layer MTP head "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return head.to(dtype).eval()


class MTPCache:
    """Tokens seen, and per draft position p >= 1 the head's KV entry (RoPE position p - 1),
    its output hidden state and whether its input hidden state was the target's."""

    is_trimmable = True

    def __init__(self, empty):
        self.tokens: list[int] = []
        self.kv = ConcatKVCache(1, 1, empty)  # entry j is draft position j + 1
        self.out: list[torch.Tensor] = []  # post-norm hidden (H,) per entry
        self.exact: list[bool] = []

    @property
    def offset(self) -> int:
        return len(self.tokens)

    @property
    def batch(self) -> int:
        return 1

    def trim(self, n: int) -> int:
        n = max(0, min(n, self.offset))
        self.tokens = self.tokens[: self.offset - n]
        self._keep(max(0, self.offset - 1))
        return n

    def _keep(self, entries: int) -> None:
        self.kv.trim(self.kv.offset - min(entries, self.kv.offset))
        self.out, self.exact = self.out[:entries], self.exact[:entries]

    def fork(self, rows):
        raise DuetError("--draft mtp drafts one row only (no branch rollouts)")

    select = fork


class MTPDraft:
    """The target's MTP head behind the CausalLM protocol (torch backend, batch 1)."""

    backend = "torch"
    supports_layer_range = False

    def __init__(self, target, head: MTPHead):
        if target.backend != "torch" or not target.config.is_hybrid:
            raise DuetError("--draft mtp runs on a hybrid (qwen3_5) target on the torch backend")
        self.target, self.head_module = target, head
        self.config = target.config
        target.record_hidden = True  # the target cache keeps its post-norm hidden states

    @classmethod
    def load(cls, target, path) -> MTPDraft:
        dtype = next(target.module.parameters()).dtype
        return cls(target, load_mtp_head(path, target.config, dtype))

    def new_cache(self, batch: int = 1) -> MTPCache:
        if batch != 1:
            raise DuetError("--draft mtp drafts one row only (no branch rollouts)")
        c, dtype = self.config, next(self.head_module.parameters()).dtype
        return MTPCache(lambda b: torch.zeros(b, c.num_kv_heads, 0, c.head_dim, dtype=dtype))

    def _target_hidden(self) -> torch.Tensor:
        """The target's post-norm hidden states (N, H) over its committed positions."""
        tc = getattr(self.target, "last_cache", None)
        h = getattr(tc, "hidden", None)
        return h[: tc.offset] if h is not None else torch.zeros(0, self.config.hidden_size)

    @torch.inference_mode()
    def forward(self, tokens, cache: MTPCache, *, positions=None, mask=None) -> np.ndarray:
        if positions is not None or mask is not None:
            raise DuetError("--draft mtp takes no explicit positions or masks (no trees)")
        new = check_tokens(tokens, self.config.vocab_size)
        if new.shape[0] != 1:
            raise DuetError("--draft mtp drafts one row only")
        cache.tokens += new[0].tolist()
        th = self._target_hidden()
        stale = [j for j, ok in enumerate(cache.exact) if not ok and j < th.shape[0]]
        cache._keep(stale[0] if stale else len(cache.exact))  # redo entries now verifiable
        m, emb = self.target.module, self.target.module.model.embed_tokens
        for j in range(len(cache.exact), cache.offset - 1):  # entry j: token x_{j+1}, hidden h_j
            exact = j < th.shape[0]
            if exact:
                hid = th[j]
            else:
                hid = cache.out[j - 1] if j else torch.zeros(self.config.hidden_size)
            k_past, v_past = cache.kv.get(0)
            pos = torch.tensor([[j]])
            mask_t = torch.ones(1, 1, 1, k_past.shape[2] + 1, dtype=torch.bool)
            x = emb(torch.tensor([[cache.tokens[j + 1]]]))
            out, k, v = self.head_module.step(x, hid.to(x.dtype)[None, None], pos, mask_t,
                                              (k_past, v_past), m.inv_freq)  # fmt: skip
            cache.kv.put(0, k, v)
            cache.out.append(out[0, 0])
            cache.exact.append(exact)
        T = new.shape[1]
        rows = [cache.out[p - 1] if p >= 1 else torch.zeros(self.config.hidden_size)
                for p in range(cache.offset - T, cache.offset)]  # fmt: skip
        w = emb.weight if self.config.tie_word_embeddings else m.lm_head.weight
        return (torch.stack(rows) @ w.T).float().numpy()[None]
