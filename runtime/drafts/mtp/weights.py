"""Where a target's multi-token-prediction head (`mtp.*` weights) is found.

The checkpoint's own `mtp.*` tensors (as Qwen3.5 / Qwen3.6 releases ship them), else the
sidecar TARGET/.duet/mtp/model.safetensors that `python -m apps.train mtp` writes in the same
layout. Both MTP backends read it (runtime/drafts/mtp/torch.py, onnx.py).
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import DuetError
from runtime.paths import sidecar
from runtime.weights import weight_files

WEIGHTS = "model.safetensors"


def mtp_sidecar(target_dir) -> Path:
    """The directory `apps.train mtp` writes to by default and `--draft mtp` reads."""
    return sidecar(target_dir, "mtp")


def has_mtp_weights(path) -> bool:
    """Whether checkpoint `path` or its sidecar holds `mtp.*` tensors, from the safetensors
    headers alone (no tensor is read; a GGUF-described folder has none to look at)."""
    from safetensors import safe_open

    files = [f for f in Path(path).glob("*.safetensors")] + [mtp_sidecar(path) / WEIGHTS]
    for f in files:
        if f.is_file():
            with safe_open(str(f), "np") as st:
                if any(k.startswith("mtp.") for k in st.keys()):
                    return True
    return False


def find_mtp_weights(path) -> tuple[dict, Path]:
    """The `mtp.*` tensors (prefix stripped) of checkpoint `path` or of its sidecar, and the
    file or directory they came from; one DuetError naming both places when neither has them."""
    from safetensors.torch import load_file

    state = {}
    for f in weight_files(path):
        state.update({k[4:]: v for k, v in load_file(str(f)).items() if k.startswith("mtp.")})
    if state:
        return state, Path(path)
    side = mtp_sidecar(path) / WEIGHTS
    if side.is_file():
        state = {k[4:]: v for k, v in load_file(str(side)).items() if k.startswith("mtp.")}
        if state:
            return state, side
    raise DuetError(
        f"{path}: no mtp.* weights in the checkpoint nor in {side}; --draft mtp needs a "
        f"multi-token-prediction head (Qwen3.5 / Qwen3.6 releases ship one; fit one with "
        f"`python -m apps.train mtp --target {path}`)"
    )
