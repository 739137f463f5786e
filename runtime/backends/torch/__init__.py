"""The PyTorch reference backend, a file per model family named after its `model_type`.

llama        TorchLM: Llama, Qwen2, Qwen3 (and the pieces the other families import)
gemma3_text  Gemma3LM: local sliding-window layers beside global ones
qwen3_5      Qwen3_5LM: Gated DeltaNet linear attention beside gated full attention
causal_lm    TorchCausalLM: any of them behind the CausalLM protocol

`FAMILIES` (runtime/backends/families.py's, the same file names in every backend) maps a model
type to its file, each of which exports `Model` (the nn.Module) and `sanitize(state, path)` (the
checkpoint's tensors under the module's names); `load_torch_lm` builds one. The family files
import llama.py's shared pieces without llama.py importing them back (no circle).
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.backends.families import FAMILIES  # model_type -> the file of this folder
from runtime.config import ModelConfig


def torch_family(config: ModelConfig) -> str:
    """The family file (a FAMILIES value) that runs `config` on this backend."""
    from runtime.backends.families import family

    return family(FAMILIES, config, "torch")


def load_torch_lm(path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Build the model of `path`'s family (FAMILIES) from a Hugging Face checkpoint directory,
    keeping one copy of the weights resident.

    The model is built with its parameters on the meta device (accelerate's
    `init_empty_weights`, buffers such as RoPE's inverse frequencies stay real) and the
    checkpoint's tensors are assigned in place, so no randomly initialised copy sits beside the
    loaded one (on SmolLM2-135M that copy cost ~350 MB of peak memory)."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file

    from runtime.backends.families import family_module
    from runtime.errors import DuetError
    from runtime.weights import weight_files

    cfg = ModelConfig.from_dir(path)
    fam = family_module(__name__, FAMILIES, cfg)
    state = {}
    for f in weight_files(path):
        state.update(load_file(str(f)))
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    with init_empty_weights(include_buffers=False):
        model, state = fam.Model(cfg), fam.sanitize(state, path)
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
