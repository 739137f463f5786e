"""The transformers config fields every tiny random family shares, from make_checkpoint's names.

random_checkpoint.py (Llama, Qwen2, Qwen3), random_gemma.py and random_hybrid.py each add
their family's own fields to these: the sizes, the context, tied embeddings, the large
`initializer_range` that keeps argmax margins clear of float noise, and no BOS or padding.
"""

from __future__ import annotations


def config_fields(
    *,
    vocab_size,
    hidden_size,
    num_layers,
    num_heads,
    num_kv_heads,
    intermediate_size,
    max_context,
    eos_token_id,
    tie_word_embeddings,
    initializer_range,
) -> dict:
    """The shared keyword arguments of a transformers text config (rms_norm_eps 1e-6)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_context,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        rms_norm_eps=1e-6,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
    )
