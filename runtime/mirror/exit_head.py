"""The tuned exit head: an affine map applied to the exit layer's hidden state before the
final norm + LM head, so the early-exit proposal (Mirror-SD eq. 6-7) better matches the
final layer's distribution (a "tuned lens"). Trained by `python -m apps.train exit-head`
and stored beside the checkpoint as `.duet/exit_head_L{ℓe}.safetensors` (`weight` (d, d),
`bias` (d,); h' = h @ weight + bias).

It changes only what the early-exit message proposes (hence reuse / FF / Ω_κ), never the
target's output: the suffix ℓe+1..N continues from the raw hidden state. Not here: training
(apps/train/exit_head.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.errors import DuetError
from runtime.paths import sidecar

MODES = ("raw", "tuned")


def exit_head_path(target_dir, layer: int) -> Path:
    """Where the tuned exit head for layer ℓe of this checkpoint lives."""
    return sidecar(target_dir, f"exit_head_L{layer}.safetensors")


class ExitHead:
    """h -> h @ W + b on the target backend's own arrays (torch tensors or MLX arrays)."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, path: Path | None = None):
        self.weight, self.bias, self.path = weight.astype(np.float32), bias.astype(np.float32), path
        self._on: dict = {}  # backend-typed copies, by (module, device)

    @classmethod
    def load(cls, path: Path) -> ExitHead:
        from safetensors.numpy import load_file

        t = load_file(str(path))
        return cls(t["weight"], t["bias"], path)

    def save(self, path: Path, metadata: dict[str, str] | None = None) -> None:
        from safetensors.numpy import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"weight": self.weight, "bias": self.bias}, str(path), metadata=metadata)

    def apply(self, h):
        """The tuned hidden state, same type, device and dtype as `h` ((B, T, d))."""
        mod = type(h).__module__
        if mod.startswith("torch"):
            import torch

            key = ("torch", str(h.device), h.dtype)
            if key not in self._on:
                self._on[key] = tuple(
                    torch.from_numpy(x).to(h.device, h.dtype) for x in (self.weight, self.bias)
                )
            w, b = self._on[key]
            return h @ w + b
        if mod.startswith("mlx"):
            import mlx.core as mx

            key = ("mlx", h.dtype)
            if key not in self._on:
                self._on[key] = tuple(mx.array(x).astype(h.dtype) for x in (self.weight, self.bias))
            w, b = self._on[key]
            return h @ w + b
        return np.asarray(h) @ self.weight + self.bias


def resolve_exit_head(target, layer: int, mode: str | None) -> ExitHead | None:
    """The exit head to use at ℓe: None for raw; the stored tuned one for `tuned`, or by
    default (mode None) when one is stored beside the target's checkpoint."""
    if mode not in (None, *MODES):
        raise DuetError(f"--exit-head must be raw or tuned (got {mode!r})")
    if mode == "raw":
        return None
    spec = getattr(target, "load_spec", None)
    path = exit_head_path(spec[0], layer) if spec else None
    if path is not None and path.is_file():
        return ExitHead.load(path)
    if mode == "tuned":
        where = path if path is not None else "beside the target checkpoint"
        raise DuetError(
            f"--exit-head tuned: no tuned exit head for layer {layer} at {where}; train one with "
            f"`python -m apps.train exit-head --target DIR --layer {layer}`"
        )
    return None
