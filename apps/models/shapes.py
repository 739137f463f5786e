"""The shapes users run, without their weights: each real model's exact layer geometry, for
`python -m apps.models synth` (apps/models/synth.py) and `python -m apps.bench scale`.

Each row is the model's published config (Hugging Face `config.json`): layers, hidden size,
feed-forward size, heads, KV heads, head size, RoPE base, context, tied head. The tokenizer and
chat template come from a model the registry ships (`donor`): SmolLM2-135M's for Llama, Qwen
and SmolLM2 shapes, Gemma 3 270M's for Gemma shapes. Where the real model's vocabulary differs
(Llama 3's 128,256 tokens, Qwen3's 151,936), the embedding and head are sized to the donor's
tokenizer instead, and `vocab_note` says so; every figure from such a file says the weights are
random. Left out on purpose: Llama 3's `rope_scaling` (llama3, factor 32) and Gemma 3 4B's linear
RoPE scaling (factor 8), which change no cost, only long-context positions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # the GGUF's general.architecture
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    real_vocab: int
    rope_base: float
    context: int
    tied: bool
    eps: float = 1e-5
    sliding_window: int = 0  # Gemma 3's local layers

    @property
    def donor(self) -> str:
        """The registry model whose tokenizer and template the file reuses."""
        return "gemma-3-270m" if self.arch == "gemma3" else "smollm2-135m-instruct"

    def params(self, vocab: int) -> int:
        """Parameters with a `vocab`-token embedding (and head, when not tied)."""
        C, D = self.hidden, self.head_dim
        attn = C * D * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attn + 3 * C * self.ffn
        return self.layers * per_layer + vocab * C * (1 if self.tied else 2)


def _s(name, arch, L, C, F, H, KV, D, V, rope, ctx, tied, **kw) -> Shape:
    return Shape(name, arch, L, C, F, H, KV, D, V, rope, ctx, tied, **kw)


# fmt: off
SHAPES = {s.name: s for s in (
    #  name             arch     L   C     FF     H   KV  D    vocab    rope     ctx     tied
    _s("smollm2-360m",  "llama", 32, 960,  2560,  15, 5,  64,  49152,   1e5,     8192,   True),
    _s("smollm2-1.7b",  "llama", 24, 2048, 8192,  32, 32, 64,  49152,   1.3e5,   8192,   True),
    _s("llama-3.2-1b",  "llama", 16, 2048, 8192,  32, 8,  64,  128256,  5e5,     131072, True),
    _s("llama-3.2-3b",  "llama", 28, 3072, 8192,  24, 8,  128, 128256,  5e5,     131072, True),
    _s("llama-3.1-8b",  "llama", 32, 4096, 14336, 32, 8,  128, 128256,  5e5,     131072, False),
    _s("qwen3-1.7b",    "qwen3", 28, 2048, 6144,  16, 8,  128, 151936,  1e6,     40960,  True,
       eps=1e-6),
    _s("qwen3-4b",      "qwen3", 36, 2560, 9728,  32, 8,  128, 151936,  1e6,     40960,  True,
       eps=1e-6),
    _s("gemma-3-1b",    "gemma3", 26, 1152, 6912, 4,  1,  256, 262144,  1e6,     32768,  True,
       eps=1e-6, sliding_window=512),
    _s("gemma-3-4b",    "gemma3", 34, 2560, 10240, 8, 4,  256, 262144,  1e6,     131072, True,
       eps=1e-6, sliding_window=1024),
    # a small shape for tests (not a real model): SmolLM2-135M's geometry, 4 layers
    _s("test-tiny",     "llama", 4,  576,  1536,  9,  3,  64,  49152,   1e5,     2048,   True),
)}
# fmt: on


def shape(name: str) -> Shape:
    from runtime.errors import DuetError

    if name not in SHAPES:
        raise DuetError(f"unknown shape {name!r}: one of {', '.join(SHAPES)}")
    return SHAPES[name]
