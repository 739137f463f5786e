"""Tiny random Qwen3.5 (hybrid) checkpoints from transformers' `Qwen3_5TextConfig`.

`qwen3_5_text` is the text-only layout (`model.*`); `qwen3_5` writes the multimodal
layout (`model.language_model.*`, a few stand-in `model.visual.*` tensors and a nested
`text_config`) with the same text weights, so the text-tower loader can be tested without
building a vision model. Norm weights, decay and β biases are randomised (transformers
initialises them to constants) so every path of the maths is exercised.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.testing.config_fields import config_fields


def hybrid_config(**shared):
    """A small Qwen3_5TextConfig: linear layers with 2 key / 4 value heads, full attention
    every 2nd layer, partial RoPE over a quarter of each head; `shared`:
    config_fields.config_fields's arguments."""
    from transformers import Qwen3_5TextConfig

    num_layers = shared["num_layers"]
    return Qwen3_5TextConfig(
        **config_fields(**shared),
        head_dim=shared["hidden_size"] // shared["num_heads"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        layer_types=[
            "linear_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)
        ],
    )


def make_hybrid_checkpoint(
    path,
    model_type: str = "qwen3_5_text",
    *,
    seed: int = 0,
    tokenizer: bool = True,
    mtp: bool = False,
    **kw,
) -> Path:
    """Write a random hybrid checkpoint to `path` (see the module docstring) and return it;
    `mtp` adds a random multi-token-prediction head (`mtp.*`, runtime/drafts/mtp/torch.py)."""
    import torch
    from safetensors.torch import save_file

    from runtime.testing.random_model import save_random_model
    from runtime.testing.random_tokenizer import byte_tokenizer

    def init(name, w):
        if name.endswith("norm.weight"):
            w.normal_(0, 0.2) if "linear_attn" not in name else w.uniform_(0.5, 1.5)
        elif name.endswith("dt_bias"):
            w.normal_(0, 0.5)
        elif name.endswith("A_log"):
            w.uniform_(-2, 1)

    p = save_random_model(hybrid_config(**kw), path, seed, init)
    if model_type == "qwen3_5":  # the multimodal layout, text weights under the language model
        from safetensors.torch import load_file

        files = sorted(p.glob("*.safetensors"))
        state = {}
        for f in files:
            state.update(load_file(str(f)))
            f.unlink()
        state = {
            ("model.language_model." + k[6:] if k.startswith("model.") else k): v
            for k, v in state.items()
        }
        state["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3, 2, 2)
        save_file({k: v.contiguous() for k, v in state.items()}, str(p / "model.safetensors"))
        text = json.loads((p / "config.json").read_text())
        cfg_mm = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                  "text_config": text, "vision_config": {"depth": 1},
                  "tie_word_embeddings": text.get("tie_word_embeddings", False)}  # fmt: skip
        (p / "config.json").write_text(json.dumps(cfg_mm, indent=2))
    if mtp:
        _add_mtp(p, kw["initializer_range"], seed)
    if tokenizer and kw["vocab_size"] >= 259:
        byte_tokenizer(kw["vocab_size"]).save(str(p / "tokenizer.json"))
    return p


def _add_mtp(p: Path, std: float, seed: int) -> None:
    """Append random `mtp.*` weights to the checkpoint's safetensors file."""
    import torch
    from safetensors.torch import load_file, save_file

    from runtime.config import ModelConfig
    from runtime.drafts.mtp.torch import MTPHead
    from runtime.weights import weight_files

    torch.manual_seed(seed + 1)
    head = MTPHead(ModelConfig.from_dir(p))
    with torch.no_grad():
        for name, w in head.named_parameters():
            w.normal_(0, 0.2 if name.endswith("norm.weight") else std)
    (f,) = weight_files(p)
    state = load_file(str(f))
    state.update({"mtp." + k: v.contiguous() for k, v in head.state_dict().items()})
    save_file(state, str(f), metadata={"format": "pt"})
