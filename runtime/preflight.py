"""Cheap checks of what a user passed, run before anything heavy is imported or loaded.

A missing, empty or truncated checkpoint, a draft whose tokenizer is not the
target's, or an output path that cannot be written should cost the user one
second and one line, not a torch import, a model load and a traceback at the
end of a long run. Everything here reads JSON and file headers with the
standard library only. It does not load models or decide what is valid beyond
what it can see in those headers (the loaders still check the rest).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from runtime.errors import DuetError


def check_safetensors(f: Path) -> None:
    """A DuetError when `f` is not a complete safetensors file (header, then every tensor)."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise DuetError(f"{f}: empty or truncated safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise DuetError(
                f"{f}: truncated or not a safetensors file (header of {n} bytes, file of {size})"
            )
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DuetError(f"{f}: corrupt safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise DuetError(f"{f}: corrupt safetensors header (not a JSON object)")
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
    ]
    need = 8 + n + max(ends, default=0)
    if need > size:
        raise DuetError(f"{f}: truncated safetensors file ({size} bytes, its header needs {need})")


def check_checkpoint(path: Path, role: str) -> None:
    """config.json, weights and (if present) tokenizer.json of a checkpoint directory look whole.

    An exported draft file (`.onnx`) must parse as an ONNX model (graph only, not its weights
    in external files); ONNX Runtime checks the rest when it loads.
    """
    from runtime.config import ModelConfig
    from runtime.weights import weight_files

    p = Path(path)
    if p.is_file():
        if p.stat().st_size == 0:
            raise DuetError(f"--{role} {p}: the file is empty")
        if p.suffix == ".onnx":
            check_onnx(p, role)
        return
    ModelConfig.from_dir(p)
    mlx_style = any(p.glob("*.npz"))
    from runtime.gguf_import import gguf_source

    described = gguf_source(p) is not None and not any(p.glob("*.safetensors"))
    if not mlx_style and not described:  # a GGUF's description: its weights come on use
        for f in weight_files(p):
            check_safetensors(f)
    tok = p / "tokenizer.json"
    if tok.is_file():
        try:
            json.loads(tok.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DuetError(f"{tok}: not valid JSON ({e})") from None


def check_onnx(p: Path, role: str) -> None:
    """A DuetError when `p` does not parse as an ONNX model (a truncated or foreign file)."""
    import onnx  # protobuf only: far lighter than the runtime that would load it

    try:
        onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends: one line, not a traceback
        raise DuetError(
            f"--{role} {p}: not a valid ONNX model, truncated or corrupt ({type(e).__name__})"
        ) from None


def check_pair_files(target: Path, draft: Path) -> None:
    """The draft shares the target's vocabulary (config sizes and tokenizer.json), from files."""
    from runtime.config import ModelConfig
    from runtime.tokenizer import check_pair

    if Path(draft).is_file():  # an exported .onnx carries its config inside; checked on load
        return
    check_pair(target, draft, ModelConfig.from_dir(target), ModelConfig.from_dir(draft))


def writable_dir(path: str | Path, flag: str) -> Path:
    """Create directory `path` (and parents) now, or a DuetError naming why it cannot be."""
    p = Path(path)
    up = next((a for a in (p, *p.parents) if a.exists()), None)
    if up is not None and not up.is_dir():
        raise DuetError(f"{flag} {p}: {up} is a file, not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DuetError(f"{flag} {p}: cannot create the directory ({e.strerror})") from None
    if not os.access(p, os.W_OK):
        raise DuetError(f"{flag} {p}: the directory is not writable")
    return p


def writable_file(path: str | Path, flag: str) -> Path:
    """A file path whose directory exists (created now) and is writable, and that is no
    directory."""
    p = Path(path)
    if p.is_dir():
        raise DuetError(f"{flag} {p}: is a directory; give a file name")
    up = next((a for a in p.parents if a.exists()), None)
    if up is not None and not up.is_dir():
        raise DuetError(f"{flag} {p}: {up} is a file, not a directory")
    writable_dir(p.parent, flag)
    return p
