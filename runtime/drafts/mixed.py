"""`--draft head+suffix` (also `head+lookup`, `mtp+suffix`, `mtp+lookup`): a model draft and a
model-free one in the same `sd` run, the model-free chain taken when the text predicts well.

Each step asks the model-free draft first (it only reads text: no model runs). When its chain
is long and likely enough, at least `min_len` tokens whose estimated chances sum to at least
`min_score` (the tokens the text expects accepted: runtime/drafts/base.py `scored_chain`; a
window cut shorter than that, near `max_new`, asks as much as it holds), that chain is the
window, drafted with no model pass. Otherwise the model draft drafts up to γ tokens as it would
alone. By default any chain the text offers is taken (min_len 1, min_score 0): on SmolLM2's
held-out chat prompts that was 1.25x `ar` against 1.17-1.21x with bars of (2, 1.0), (3, 2.0)
or (4, 3.0) (`python -m apps.train.eagle_eval --draft head+suffix --mix-min-len N
--mix-min-score S`, docs/benchmarks.md): a text chain costs no model pass, and a two-token
verify pass costs what a one-token one does. A summary or an answer read out of a document
repeats the prompt, where a suffix match is long and a feature head is unsure; an answer in
the model's own words is the head's. The head skips the steps the text drafts; when it drafts
again it reads the target's features of the tokens committed meanwhile in one pass
(runtime/drafts/mtp/torch.py, its catch-up of verified entries).

Lossless at every temperature: which draft drafts is a function of the committed sequence
alone, never of a draw, so each step's window comes from one law, the point masses of the
model-free chain (q = δ) or the model draft's q, and is verified against that law exactly
(runtime/drafts/base.py, kernels/verify.py). Chains only: `sd`. A tree mixing both laws would
need a verifier that takes q per branch, which this does not build.
"""

from __future__ import annotations

import numpy as np

from runtime.drafts.base import DeltaRows
from runtime.errors import DuetError

MODEL_PARTS = ("head", "mtp")
FREE_PARTS = ("suffix", "lookup")


def is_mixed_spec(spec) -> bool:
    """Whether a --draft value names a mixed draft (`head+suffix`, `mtp+lookup`, ...)."""
    parts = str(spec).split("+") if spec is not None else []
    return len(parts) == 2 and parts[0] in MODEL_PARTS and parts[1] in FREE_PARTS


def is_mixed(draft) -> bool:
    return getattr(draft, "mixed", False)


class MixedCache:
    """The model draft's cache and the model-free draft's index, trimmed together."""

    is_trimmable = True

    def __init__(self, model_cache, free_cache):
        self.model, self.free = model_cache, free_cache

    @property
    def offset(self) -> int:
        return max(self.model.offset, self.free.offset)

    @property
    def batch(self) -> int:
        return 1

    def trim(self, n: int) -> int:
        keep = self.offset - n
        for c in (self.model, self.free):
            if c.offset > keep:
                c.trim(c.offset - keep)
        return n


class MixedDraft:
    """A model draft (`model`: the fitted head or the MTP head) and a model-free one (`free`)."""

    mixed = True
    model_free = False
    supports_layer_range = False

    def __init__(
        self, model, free, name: str = "head+suffix", min_len: int = 1, min_score: float = 0.0
    ):
        if min_len < 1 or min_score < 0:
            raise DuetError("a mixed draft needs min_len >= 1 and min_score >= 0")
        self.model, self.free, self.name = model, free, name
        self.config = model.config
        self.min_len, self.min_score = min_len, min_score
        self.reads_target_hidden = getattr(model, "reads_target_hidden", False)
        self.head_module = getattr(model, "head_module", None)  # a head's taps (session.record_for)
        self.backend = getattr(model, "backend", "torch")
        self.free_steps = self.model_steps = 0  # which draft drafted, over this draft's life

    def new_cache(self, batch: int = 1) -> MixedCache:
        if batch != 1:
            raise DuetError(f"--draft {self.name} drafts one row (sd chains only)")
        return MixedCache(self.model.new_cache(1), self.free.new_cache(1))

    def forward(self, *a, **k):
        raise DuetError(f"--draft {self.name} drafts `sd` chains only: use --method sd")

    def free_window(self, cache: MixedCache, seq: list[int], gamma: int, sampling):
        """The model-free chain and its q when it clears the bar, else None."""
        if gamma < 1:
            return None
        toks, probs = self.free.scored_chain(cache.free, seq, gamma)
        if len(toks) < min(self.min_len, gamma) or sum(probs) < min(self.min_score, gamma):
            return None
        self.free_steps += 1
        if sampling.greedy:
            return toks, np.zeros((0, self.config.vocab_size), np.float32)
        return toks, DeltaRows(toks, self.config.vocab_size)
