"""A speculative-streaming (SS) draft on the PyTorch backend (Mirror-SD §3.2; Bhendawade et
al. 2024, "Speculative Streaming").

The model is an ordinary Llama/Qwen2/Qwen3 `TorchLM` plus n learned stream embeddings
E_1..E_n (`ss_stream_embeddings`, (n, H)). Lookahead stream j at main position p takes
embed(x_p) + E_j as its input, stands at position p + j, attends to the verified prefix
and to streams 1..j of p (multi-stream attention, kernels/stream_mask.py), and goes
through the same layers and the one shared LM head: its logits predict x_{p+1+j}. The
main stream is untouched by the streams, so `forward` is exactly the plain model and any
decoding method can use an SS draft as an ordinary draft.

Two paths compute the stream logits: `forward_streams`, one masked pass over the cache
(the fast one), and `reference_stream_logits`, each stream run as its own explicit causal
sequence without a cache (the slow, obviously-correct one); tests check they agree.
`load_ss_module` builds the model from an SS checkpoint (runtime/drafts/ss/checkpoint.py: the
format), `make_ss_checkpoint` makes one from an ordinary checkpoint (random stream
embeddings: the start of `python -m apps.train ss-draft` and the tests' tiny SS drafts).
This module does not decide which tokens to keep: runtime/decoding/ss_draft.py does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from kernels.stream_mask import multi_stream_mask, stream_positions
from runtime.backends.torch.causal_lm import TorchCausalLM
from runtime.backends.torch.llama import TorchLM
from runtime.config import ModelConfig
from runtime.drafts.ss.checkpoint import SS_KEY, save_ss_checkpoint, ss_streams
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens, default_positions
from runtime.weights import weight_files


class SSTorchLM(TorchLM):
    """TorchLM + n stream embeddings; `stream_pass` runs main and stream tokens in one pass."""

    def __init__(self, cfg: ModelConfig, streams: int):
        super().__init__(cfg)
        self.n_streams = streams
        # (n, H), stored under this name beside the Hugging Face weight names
        self.ss_stream_embeddings = nn.Parameter(torch.zeros(streams, cfg.hidden_size))

    def stream_inputs(self, tokens: torch.Tensor, owners) -> torch.Tensor:
        """(B, T + P*n, H): embed(tokens), then embed(x_p) + E_j for each owner p (p-major)."""
        e = self.model.embed_tokens(tokens)  # (B, T, H)
        s = e[:, owners, None, :] + self.ss_stream_embeddings.to(e.dtype)  # (B, P, n, H)
        return torch.cat([e, s.flatten(1, 2)], dim=1)

    def stream_pass(self, tokens, owners, positions, mask, past, stream_head: bool = True):
        """Main logits (B, T, V), stream logits (B, P, n, V) of the main positions `owners`
        (a list or 1-D int tensor) and the presents (main columns first, then the stream
        columns). positions (B, T + P*n), mask (B, 1, ., S + P*n) (kernels/stream_mask.py).
        stream_head=False returns the streams' last hidden states (B, P, n, H) instead, for
        a caller that needs the logits of a few of them only."""
        T = tokens.shape[1]
        h, presents = self.run_layers(
            self.stream_inputs(tokens, owners), 0, self.cfg.num_layers, positions, mask, past
        )
        B = h.shape[0]
        streams = h[:, T:].reshape(B, -1, self.n_streams, h.shape[-1])  # (B, P, n, H)
        return self.head(h[:, :T]), self.head(streams) if stream_head else streams, presents


class StreamLogits:
    """Stream logits (B, P, n, V) whose LM head runs on demand: `[b, k]` gives owner k of row
    b's n rows (what a draft walk reads: one owner per pass), `np.asarray` all of them."""

    def __init__(self, module: SSTorchLM, hidden: torch.Tensor, vocab: int):
        self.module, self.hidden = module, hidden  # (B, P, n, H)
        self.shape = (*hidden.shape[:3], vocab)

    @torch.inference_mode()
    def __getitem__(self, idx):
        if (
            isinstance(idx, tuple)
            and len(idx) == 2
            and all(isinstance(i, int | np.integer) for i in idx)
        ):
            return self.module.head(self.hidden[int(idx[0]), int(idx[1])]).float().cpu().numpy()
        return np.asarray(self)[idx]

    @torch.inference_mode()
    def __array__(self, dtype=None, copy=None):
        out = self.module.head(self.hidden).float().cpu().numpy()
        return out if dtype is None else out.astype(dtype)


def reference_stream_logits(module: SSTorchLM, tokens: np.ndarray, p: int, j: int) -> np.ndarray:
    """The slow path: stream j (0 = main) at position p of `tokens` (L,), run as the explicit
    causal sequence [x_0..x_p, embed(x_p)+E_1, .., embed(x_p)+E_j] without a cache.
    Returns float32 logits (V,): the distribution of x_{p+1+j}."""
    cfg = module.cfg
    ids = torch.as_tensor(np.asarray(tokens[: p + 1], dtype=np.int64))[None]
    with torch.inference_mode():
        e = module.model.embed_tokens(ids)  # (1, p+1, H)
        h = torch.cat([e, e[:, -1:] + module.ss_stream_embeddings[:j][None]], dim=1)
        n = h.shape[1]
        pos = torch.arange(n)[None]
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None]
        empty = torch.zeros(1, cfg.num_kv_heads, 0, cfg.head_dim, dtype=h.dtype)
        out, _ = module.run_layers(
            h, 0, cfg.num_layers, pos, mask, [(empty, empty)] * cfg.num_layers
        )
        return module.head(out[:, -1])[0].float().numpy()


def load_ss_module(path, dtype: torch.dtype | None = None) -> SSTorchLM:
    """Build an SSTorchLM (float32 unless `dtype`) from an SS checkpoint directory (strict:
    every weight present)."""
    from safetensors.torch import load_file

    cfg = ModelConfig.from_dir(path)
    n = ss_streams(cfg)
    if n < 1 or cfg.is_hybrid:
        raise DuetError(f"{path}: not a speculative-streaming draft (no {SS_KEY} in config.json)")
    state = {}
    for f in weight_files(path):
        state.update(load_file(str(f)))
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model = SSTorchLM(cfg, n)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DuetError(
            f"{path}: weights do not match an SS {cfg.model_type} draft with {n} streams "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return model.to(dtype or torch.float32).eval()


def make_ss_checkpoint(
    src_dir, out, streams: int, *, seed: int = 0, scale: float = 0.02, dtype=None
) -> Path:
    """An SS checkpoint in `out` from the ordinary checkpoint `src_dir`: its weights, and
    stream embeddings drawn N(0, scale^2) (seeded). dtype: that of the source by default."""
    from runtime.backends.torch import load_torch_lm

    if streams < 1:
        raise DuetError(f"--streams must be at least 1 (got {streams})")
    base = load_torch_lm(src_dir)
    cfg = ModelConfig.from_dir(src_dir)
    module = SSTorchLM(cfg, streams)
    module.load_state_dict(base.state_dict(), strict=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.ss_stream_embeddings.copy_(
            torch.randn(streams, cfg.hidden_size, generator=g) * scale
        )
    if dtype is None:
        from safetensors import safe_open

        with safe_open(str(weight_files(src_dir)[0]), "pt") as f:
            dtype = f.get_slice(next(iter(f.keys()))).get_dtype()
        dtype = {"BF16": torch.bfloat16, "F16": torch.float16}.get(dtype, torch.float32)
    return save_ss_checkpoint(module, out, src_dir, dtype=dtype)


class SSCausalLM(TorchCausalLM):
    """CausalLM over an SS draft: `forward` is the main stream alone; `forward_streams`
    also returns the lookahead streams' logits of the last main positions."""

    def __init__(self, module: SSTorchLM, threads: int | None = None, device: str = "cpu"):
        super().__init__(module, threads, device)
        self.ss_streams = module.n_streams

    @classmethod
    def load(cls, path, threads: int | None = None, device: str = "cpu", hybrid_rollback=None):
        """Load an SS checkpoint directory (runtime/drafts/ss/checkpoint.py wrote it)."""
        return cls(load_ss_module(path), threads, device)

    @torch.inference_mode()
    def forward_streams(
        self, tokens, cache, *, first: int | None = None, positions=None, mask=None
    ) -> tuple[np.ndarray, StreamLogits]:
        """One SS pass over `tokens` (B, T) appended to `cache`, streams on main positions
        `first`..T-1 (default: the last one only). Returns float32 main logits (B, T, V) and
        stream logits (B, P, n, V) (a StreamLogits: the head runs for the owners read). The cache
        keeps only the T main columns (the stream columns are laid out last and trimmed).
        positions/mask are the main tokens' (as
        `forward`'s: (B, T) and (B, T, offset + T) or (T, offset + T))."""
        ids = check_tokens(tokens, self.config.vocab_size)
        B, T = ids.shape
        first = T - 1 if first is None else first
        assert 0 <= first < T, f"streams from main position {first} of {T}"
        n, off = self.ss_streams, cache.offset
        pos = default_positions(off, B, T) if positions is None else np.asarray(positions)
        m = causal_mask(off, T) if mask is None else np.asarray(mask, dtype=bool)
        m = np.broadcast_to(m, (B, T, off + T))
        owners = list(range(first, T))
        full_pos = torch.from_numpy(stream_positions(pos, n, owners)).to(self.device)
        full_mask = torch.from_numpy(multi_stream_mask(m, n, owners))[:, None].to(self.device)
        past = [cache.get(i) for i in range(self.config.num_layers)]
        x = torch.from_numpy(ids).to(self.device)
        main, hidden, presents = self.module.stream_pass(
            x, owners, full_pos, full_mask, past, stream_head=False
        )
        for i, present in enumerate(presents):
            cache.put(i, *present)
        cache.trim((T - first) * n)  # drop the stream columns: the cache holds main tokens only
        return main.float().cpu().numpy(), StreamLogits(self.module, hidden, self.config.vocab_size)
