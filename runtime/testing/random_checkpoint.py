"""Tiny random checkpoints: real Hugging Face directories, written offline.

Used by the tests and by `python -m devices calibrate` when no model is at hand.

Each is config.json + model.safetensors + tokenizer.json (a byte-level tokenizer
with no merges, so every vocabulary fits), built from a `transformers` config
with a large `initializer_range` so outputs vary and argmax margins are clear of
float noise.
"""

from __future__ import annotations

from pathlib import Path

from runtime.testing.config_fields import config_fields
from runtime.testing.random_model import save_random_model
from runtime.testing.random_tokenizer import byte_tokenizer

ARCHS = ("llama", "qwen2", "qwen3")  # attention-only families; HYBRID_ARCHS below
HYBRID_ARCHS = ("qwen3_5_text", "qwen3_5")  # Gated DeltaNet + gated attention (text, multimodal)
GEMMA_ARCHS = ("gemma3_text", "gemma3")  # local sliding-window + global layers (random_gemma.py)


def make_checkpoint(
    path: str | Path,
    model_type: str = "qwen3",
    *,
    vocab_size: int = 320,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_context: int = 256,
    eos_token_id: int | None = None,
    tie_word_embeddings: bool = False,
    initializer_range: float = 0.3,
    seed: int = 0,
    tokenizer: bool = True,
    mtp: bool = False,
    sliding_window: int = 8,
    softcap: float | None = None,
) -> Path:
    """Write a random checkpoint of `model_type` to `path` and return it."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    shared = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_context=max_context,
        eos_token_id=eos_token_id,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
    )
    if model_type in HYBRID_ARCHS:
        from runtime.testing.random_hybrid import make_hybrid_checkpoint

        return make_hybrid_checkpoint(
            path, model_type, seed=seed, tokenizer=tokenizer, mtp=mtp, **shared
        )
    if model_type in GEMMA_ARCHS:  # sliding_window and softcap are Gemma's alone
        from runtime.testing.random_gemma import make_gemma_checkpoint

        return make_gemma_checkpoint(
            path,
            model_type,
            seed=seed,
            tokenizer=tokenizer,
            sliding_window=sliding_window,
            softcap=softcap,
            **shared,
        )
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[model_type]
    kw = config_fields(**shared)
    if model_type == "qwen3":
        kw["head_dim"] = hidden_size // num_heads

    def init(name, w):  # qwen2: random biases, so the bias path is exercised
        if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
            w.normal_(0, initializer_range)

    p = save_random_model(cls(**kw), path, seed, init if model_type == "qwen2" else None)
    if tokenizer:  # a byte tokenizer needs vocab_size >= 259; tiny-vocabulary models go without
        byte_tokenizer(vocab_size).save(str(p / "tokenizer.json"))
    return p
