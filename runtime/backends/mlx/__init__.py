"""The MLX backend (the target's home on a Mac), a file per model family named after its
`model_type`, each built by mlx-lm's own model classes with a forward loop of ours.

llama        MLXCausalLM: Llama, Qwen2, Qwen3 (and the base the other families subclass)
gemma3_text  MLXGemma3LM: local sliding-window layers beside global ones
qwen3_5      MLXQwen3_5LM: Gated DeltaNet linear attention beside gated full attention

`FAMILIES` (runtime/backends/families.py's, the same file names in every backend) maps a model
type to its file, each of which exports `load(path, dtype, hybrid_rollback)`; `load_mlx_lm`
calls it. The family files subclass MLXCausalLM; llama.py never imports them back (no circle).
"""

from __future__ import annotations

from runtime.backends.families import FAMILIES  # model_type -> the file of this folder
from runtime.config import ModelConfig


def load_mlx_lm(path, dtype: str | None = None, hybrid_rollback: str = "replay"):
    """The MLX model of `path`'s family. dtype: None keeps the checkpoint's on a GPU and uses
    float32 on the CPU; `hybrid_rollback` applies to a hybrid Qwen3.5 checkpoint."""
    from runtime.backends.families import family_module

    config = ModelConfig.from_dir(path)
    return family_module(__name__, FAMILIES, config).load(path, dtype, hybrid_rollback)
