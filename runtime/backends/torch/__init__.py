"""Load a Hugging Face checkpoint directory into the PyTorch reference model of its family:
`TorchLM` (torch_ref.py: Llama, Qwen2, Qwen3), `Qwen3_5LM` (torch_qwen3_5.py, hybrids) or
`Gemma3LM` (torch_gemma3.py). The dispatcher lives here, above the family files, so that they
import torch_ref's shared pieces without torch_ref importing them back (no circle).
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.backends.torch.llama import TorchLM
from runtime.config import ModelConfig


def load_torch_lm(path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Build a TorchLM (or, for a hybrid checkpoint, a Qwen3_5LM) from a Hugging Face
    checkpoint directory, keeping one copy of the weights resident.

    The model is built with its parameters on the meta device (accelerate's
    `init_empty_weights`, buffers such as RoPE's inverse frequencies stay real) and the
    checkpoint's tensors are assigned in place, so no randomly initialised copy sits beside the
    loaded one (on SmolLM2-135M that copy cost ~350 MB of peak memory)."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file

    from runtime.config import weight_files
    from runtime.errors import DuetError

    cfg = ModelConfig.from_dir(path)
    state = {}
    for f in weight_files(path):
        state.update(load_file(str(f)))
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    with init_empty_weights(include_buffers=False):
        if cfg.is_hybrid:
            from runtime.backends.torch.qwen3_5 import Qwen3_5LM, text_tower_state

            model, state = Qwen3_5LM(cfg), text_tower_state(state, path)
        elif cfg.model_type == "gemma3_text":  # sliding-window + global layers (own file)
            from runtime.backends.torch.gemma3_text import Gemma3LM, gemma_text_state

            model, state = Gemma3LM(cfg), gemma_text_state(state, path)
        else:
            model = TorchLM(cfg)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise DuetError(
            f"{path}: weights do not match a {cfg.model_type} model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    del state
    return model.to(dtype).eval()
