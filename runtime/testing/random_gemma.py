"""Tiny random Gemma 3 checkpoints from transformers' `Gemma3TextConfig`.

Every third layer is global, the others local with a small sliding window (8 by default), so
that short tests cross it; the attention scale (query_pre_attn_scalar) differs from the head
size, and the two RoPE bases differ, so each is exercised. Norm weights are randomised
(transformers initialises Gemma's `(1 + w)` norms to w = 0). `gemma3_text` writes the text
layout (`model.*`); `gemma3` writes the multimodal layout (`model.language_model.*`, a few
stand-in `model.vision_tower.*` / `model.multi_modal_projector.*` tensors, a nested
`text_config`) with the same text weights, so the text-tower loader can be tested without
building a vision model.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.testing.config_fields import config_fields

GEMMA_ARCHS = ("gemma3_text", "gemma3")


def gemma_config(*, sliding_window=8, softcap=None, **shared):
    """A small Gemma3TextConfig (see the module docstring); softcap sets both soft-caps;
    `shared`: config_fields.config_fields's arguments."""
    from transformers import Gemma3TextConfig

    head_dim = shared["hidden_size"] // shared["num_heads"]
    num_layers = shared["num_layers"]
    return Gemma3TextConfig(
        **config_fields(**shared),
        head_dim=head_dim,
        query_pre_attn_scalar=2 * head_dim,
        sliding_window=sliding_window,
        layer_types=[
            "full_attention" if i % 3 == 2 else "sliding_attention" for i in range(num_layers)
        ],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=softcap,
        attn_logit_softcapping=softcap,
    )


def make_gemma_checkpoint(
    path, model_type: str = "gemma3_text", *, seed: int = 0, tokenizer: bool = True, **kw
) -> Path:
    """Write a random Gemma 3 checkpoint to `path` (see the module docstring); returns it."""
    import torch
    from safetensors.torch import save_file

    from runtime.testing.random_model import save_random_model
    from runtime.testing.random_tokenizer import byte_tokenizer

    def init(name, w):
        if name.endswith("norm.weight"):
            w.normal_(0, 0.2)

    cfg = gemma_config(**kw)
    p = save_random_model(cfg, path, seed, init)
    if model_type == "gemma3":
        _multimodal_layout(p, torch, save_file)
    if tokenizer:
        byte_tokenizer(cfg.vocab_size).save(str(p / "tokenizer.json"))
    return p


def _multimodal_layout(p: Path, torch, save_file) -> None:
    """Rewrite a gemma3_text directory in the multimodal gemma3 layout."""
    from safetensors.torch import load_file

    state = load_file(str(p / "model.safetensors"))
    out = {
        ("model.language_model." + k[len("model.") :] if k.startswith("model.") else k): v
        for k, v in state.items()
    }
    out["model.vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8)
    out["model.multi_modal_projector.mm_input_projection_weight"] = torch.zeros(8, 8)
    save_file(out, str(p / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((p / "config.json").read_text())
    top = {k: text.pop(k) for k in ("eos_token_id", "tie_word_embeddings") if k in text}
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
           "text_config": text, "vision_config": {"model_type": "siglip_vision_model"},
           **top}  # fmt: skip
    (p / "config.json").write_text(json.dumps(cfg, indent=2))
