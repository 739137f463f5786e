"""Load a checkpoint directory on MLX as its family's CausalLM: `MLXQwen3_5LM` for a hybrid
(mlx_qwen3_5.py), `MLXGemma3LM` for Gemma 3 (mlx_gemma3.py), else `MLXCausalLM`
(mlx_backend.py). The dispatcher sits above the family files, which subclass MLXCausalLM, so
mlx_backend.py never imports them back (no circle).
"""

from __future__ import annotations

from runtime.backends.mlx.llama import MLXCausalLM
from runtime.config import ModelConfig


def load_mlx_lm(path, dtype: str | None = None, hybrid_rollback: str = "replay") -> MLXCausalLM:
    """The MLX model of `path`'s family. dtype: None keeps the checkpoint's on a GPU and uses
    float32 on the CPU; `hybrid_rollback` applies to a hybrid Qwen3.5 checkpoint."""
    config = ModelConfig.from_dir(path)
    if config.is_hybrid:
        from runtime.backends.mlx.qwen3_5 import MLXQwen3_5LM

        return MLXQwen3_5LM.load(path, dtype, hybrid_rollback)
    if config.model_type == "gemma3_text":  # local + global layers, a sliding-window cache
        from runtime.backends.mlx.gemma3_text import MLXGemma3LM

        return MLXGemma3LM.load(path, dtype)
    return MLXCausalLM.load(path, dtype)
