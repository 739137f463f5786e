"""A tiny random Hugging Face checkpoint for calibrating when no real model is at hand.

Calibration on a fresh checkout (no embedded pair yet) still has to run the real
backends on something; this writes a small Qwen3 config.json + safetensors +
tokenizer.json into a directory, offline. It is independent of tests/tiny.py
on purpose: devices/ must not import from tests/.
"""

from __future__ import annotations

from pathlib import Path


def write_tiny_checkpoint(
    path: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vocab_size: int = 512,
    seed: int = 0,
) -> Path:
    """Write a random Qwen3 checkpoint with a byte-level tokenizer to `path`; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    from transformers.utils import logging as hf_logging

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # calibrate's own bar is the one the user watches
    model.save_pretrained(p, safe_serialization=True)

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}  # 256 byte symbols
    while len(vocab) < vocab_size:
        vocab[f"<|unused{len(vocab)}|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(p / "tokenizer.json"))
    return p
