"""Where a checkpoint directory's weights are: its safetensors files, made on first use for a
directory described from a GGUF (runtime/gguf_import.py's second stage). Every backend and
draft that reads float weights asks here, so only those that need them pay for them."""

from __future__ import annotations

from pathlib import Path

from runtime.errors import DuetError
from runtime.gguf_import import gguf_source, materialize_weights


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, or a DuetError naming what is missing.
    A directory described from a GGUF gets its dequantized weights here, on first use."""
    p = Path(path)
    files = sorted(p.glob("*.safetensors"))
    if not files and (p / "duet-source.json").is_file():  # a GGUF's description: weights on use
        if gguf_source(p) is not None:
            materialize_weights(p)
            files = sorted(p.glob("*.safetensors"))
    if not files:
        raise DuetError(f"{p}: no *.safetensors weights found")
    return files
