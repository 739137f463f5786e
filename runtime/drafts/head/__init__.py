"""`--draft head`: a feature-level head fitted to the target (EAGLE-3, FR-Spec's vocabulary).

torch  the head in PyTorch (the reference, training's model)
onnx   its step in ONNX Runtime, beside a CPU target
"""

from pathlib import Path

from runtime.paths import sidecar

WEIGHTS, META = "model.safetensors", "head.json"


def head_sidecar(target_dir) -> Path:
    """Where `apps.train eagle` writes a target's head and `--draft head` reads it."""
    return sidecar(target_dir, "eagle")
