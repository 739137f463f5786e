"""Hugging Face `generate` as a peer: `hf:ar` (the target alone) and `hf:lookup` (assisted
generation with prompt lookup: `prompt_lookup_num_tokens`, `max_matching_ngram_size`).

Both load the target checkpoint once (float32, as apps/bench/runners/hf.py does) and share it.
Tokens per step are measured, not assumed: the streamer receives each target pass's committed
tokens in one `put` (apps/bench/runners/hf.py's _StepLengths).
"""

from __future__ import annotations

from .hf import HfAssistedRunner

LOOKUP_TOKENS = 10  # transformers' documented example value
LOOKUP_NGRAM = 3  # the n-gram size llama.cpp's ngram-simple and ort-genai's ngram use here


class HfPeerRunner(HfAssistedRunner):
    """`hf:ar` (lookup None) or `hf:lookup`; `shared` reuses another runner's loaded model."""

    group = "hf"

    def __init__(self, pair, *, lookup: int | None, ngram: int = LOOKUP_NGRAM, shared=None):
        if shared is None:
            super().__init__(pair, gamma=0, alone=True)
        else:
            self.torch, self.target, self.draft = shared.torch, shared.target, None
            self.gamma, self.eos = 0, shared.eos
        self.lookup, self.ngram = lookup, ngram
        self.name = f"{self.group}:{'lookup' if lookup else 'ar'}"
        self.own_ar = f"{self.group}:ar"

    def settings(self) -> dict:
        out = super().settings()
        out.pop("gamma", None)
        if self.lookup:
            out |= {"prompt_lookup_num_tokens": self.lookup, "max_matching_ngram_size": self.ngram}
        return out

    def _generate(self, x, max_new, streamer, kw):
        if self.lookup:
            kw = dict(kw, prompt_lookup_num_tokens=self.lookup, max_matching_ngram_size=self.ngram)
        return super()._generate(x, max_new, streamer, kw)
