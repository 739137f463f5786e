"""Model sizes for latency prediction: parameter counts, bytes and FLOPs of a decoder LM.

A `ModelSize` is the arithmetic of a Llama/Qwen-style decoder (no weights): how
many bytes a forward must stream and how many FLOPs it does, per layer and for
the embedding/head. It is built from a real `runtime.config.ModelConfig` or from
a named preset of a public checkpoint, so emulation can pretend the target is
an 8B model while a tiny one actually runs. It knows nothing about devices.

Preset names take an optional weight precision: "qwen3-8b" (bf16) or
"qwen3-8b@4" (4-bit weights, as mlx-community ships them).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import DuetError


@dataclass(frozen=True)
class ModelSize:
    """The shape of a decoder-only LM, enough to count its bytes and FLOPs."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    weight_bits: int = 16  # bf16 unless quantized
    kv_bits: int = 16
    source: str = ""

    @classmethod
    def from_config(cls, cfg, name: str | None = None, weight_bits: int = 16) -> ModelSize:
        """From a runtime.config.ModelConfig (or anything with the same fields)."""
        return cls(
            name=name or f"{cfg.model_type}-{cfg.num_layers}L-{cfg.hidden_size}d",
            num_layers=cfg.num_layers,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size,
            tie_word_embeddings=cfg.tie_word_embeddings,
            weight_bits=weight_bits,
            source="config.json of the loaded checkpoint",
        )

    # -- parameter counts --------------------------------------------------
    @property
    def layer_params(self) -> int:
        """Parameters of one decoder block: q,k,v,o projections + gated MLP + 2 norms."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d + 2 * h * self.num_kv_heads * d + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size  # gate, up, down (SwiGLU)
        return attn + mlp + 2 * h

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        """Final norm + LM head (the head's matrix is the embedding's when tied)."""
        return self.hidden_size + self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Total stored parameters (a tied head is not counted twice)."""
        head_matrix = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return (
            self.embed_params + self.num_layers * self.layer_params + self.hidden_size + head_matrix
        )

    # -- bytes and FLOPs of one forward ------------------------------------
    def layer_weight_bytes(self) -> float:
        return self.layer_params * self.weight_bits / 8

    def head_weight_bytes(self) -> float:
        return self.head_params * self.weight_bits / 8

    def kv_bytes_per_layer(self, context: int) -> float:
        """K and V of `context` cached positions in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * context * self.kv_bits / 8

    def layer_flops(self, n_tokens: int, context: int = 0) -> float:
        """One layer over `n_tokens` new positions attending to `context` + themselves."""
        matmul = 2 * self.layer_params * n_tokens  # 2 FLOPs per weight per token
        attn = 4 * self.num_heads * self.head_dim * n_tokens * (context + n_tokens)  # QK^T and PV
        return matmul + attn

    def head_flops(self, n_tokens: int) -> float:
        return 2 * self.head_params * n_tokens

    def weight_bytes(self) -> float:
        """Bytes a full forward streams: all layers + the head (an embedding row is negligible)."""
        return self.num_layers * self.layer_weight_bytes() + self.head_weight_bytes()


# Public configs (config.json of each checkpoint on the Hugging Face Hub; param totals from the
# model cards). name: layers, hidden, intermediate, heads, kv heads, head dim, vocab, tied head;
# then the checkpoint whose config.json gives them (https://huggingface.co/<repo>/blob/main/
# config.json) and a note
_PRESET_ROWS = {
    "qwen3-0.6b":   (    28,   1024,   3072,     16,      8,    128, 151936,  True,
                     "Qwen/Qwen3-0.6B", "card: 0.6B params"),
    "qwen3-1.7b":   (    28,   2048,   6144,     16,      8,    128, 151936,  True,
                     "Qwen/Qwen3-1.7B", "card: 1.7B params"),
    "qwen3-8b":     (    36,   4096,  12288,     32,      8,    128, 151936, False,
                     "Qwen/Qwen3-8B", "card: 8.2B params"),
    "llama-3.2-1b": (    16,   2048,   8192,     32,      8,     64, 128256,  True,
                     "meta-llama/Llama-3.2-1B", "card: 1.23B params"),
    "llama-3.1-8b": (    32,   4096,  14336,     32,      8,    128, 128256, False,
                     "meta-llama/Llama-3.1-8B", "card: 8.03B params"),
    "llama-2-7b":   (    32,   4096,  11008,     32,     32,    128,  32000, False,
                     "meta-llama/Llama-2-7b-hf", "FlexSpec's Std. SD draft"),
    "llama-2-70b":  (    80,   8192,  28672,     64,      8,    128,  32000, False,
                     "meta-llama/Llama-2-70b-hf", "FlexSpec's target"),
}  # fmt: skip
_COLUMNS = (
    "num_layers",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)
_PRESETS: dict[str, dict] = {
    name: dict(
        zip(_COLUMNS, row[:-2], strict=True),
        source=f"https://huggingface.co/{row[-2]}/blob/main/config.json ({row[-1]})",
    )
    for name, row in _PRESET_ROWS.items()
}

# The totals the model cards state, to check the arithmetic above (tests/test_devices_models.py).
CARD_PARAMS = {
    "qwen3-0.6b": 0.6e9,
    "qwen3-1.7b": 1.7e9,
    "qwen3-8b": 8.2e9,
    "llama-3.2-1b": 1.23e9,
    "llama-3.1-8b": 8.03e9,
    "llama-2-7b": 6.74e9,
    "llama-2-70b": 69.0e9,
}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def model_size(spec: str) -> ModelSize:
    """A preset by name, optionally with weight bits: "qwen3-8b" or "qwen3-8b@4"."""
    name, _, bits = spec.partition("@")
    if name not in _PRESETS:
        raise DuetError(f"unknown model size {name!r}; choose from {', '.join(preset_names())}")
    try:
        weight_bits = int(bits) if bits else 16
    except ValueError:
        raise DuetError(
            f"model size {spec!r}: weight bits after '@' must be an integer, e.g. qwen3-8b@4"
        ) from None
    if weight_bits not in (2, 3, 4, 6, 8, 16, 32):
        raise DuetError(
            f"model size {spec!r}: weight bits {weight_bits} not one of 2,3,4,6,8,16,32"
        )
    return ModelSize(name=spec, weight_bits=weight_bits, **_PRESETS[name])
