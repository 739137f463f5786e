"""Backends behind the CausalLM protocol, and `load_model` which picks one.

mlx    mlx-lm model classes, our forward loop (the target's home)
torch  the plain PyTorch reference
onnx   ONNX Runtime over an exported .onnx (the draft's home off Apple)
coreml Core ML .mlpackage (the draft on the Neural Engine; predicts on macOS only)

Each is a folder here with a file per model family named after its `model_type` (llama,
gemma3_text, qwen3_5); `FAMILIES` in its __init__.py picks the file (families.py: the rule
and the table they share).
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import DuetError
from runtime.paths import is_stale, sidecar

BACKENDS = ("mlx", "torch", "onnx", "coreml")


def backend_for_path(path) -> str:
    """The backend a path implies: .onnx -> onnx, .mlpackage -> coreml, a directory -> mlx."""
    p = Path(path)
    if p.suffix == ".onnx":
        return "onnx"
    if p.suffix in (".mlpackage", ".mlmodelc"):
        return "coreml"
    return "mlx"


def load_model(path, backend: str | None = None, **kw):
    """Load a checkpoint (directory, .onnx or .mlpackage) as a CausalLM.

    backend: one of BACKENDS; default from the path. For "onnx" given a
    checkpoint directory, the directory's `model.onnx` is used if present,
    otherwise it is exported on the fly into a cache folder beside it.
    Keyword arguments go to the backend (threads, provider, dtype).
    The model keeps `load_spec`, (path, backend, kw): what another process needs to load it
    again (the Mirror-SD draft process).
    """
    model = _load_model(path, backend, **kw)
    try:
        model.load_spec = (str(path), backend, dict(kw))
    except AttributeError:  # a backend object that takes no attributes: no process worker
        pass
    return model


def _load_model(path, backend: str | None = None, **kw):
    p = Path(path)
    if not p.exists():
        raise DuetError(f"model not found: {p}")
    backend = backend or backend_for_path(p)
    if backend not in BACKENDS:
        raise DuetError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    from runtime.drafts.ss.checkpoint import is_ss_dir

    if p.is_dir() and is_ss_dir(p):  # a speculative-streaming draft: torch or ONNX Runtime
        if backend == "torch":
            from runtime.drafts.ss.torch import SSCausalLM

            return SSCausalLM.load(p, **kw)
        if backend == "onnx":
            from runtime.drafts.ss.onnx import OnnxSSCausalLM

            return OnnxSSCausalLM.load(ss_onnx_for_dir(p), **kw)
        raise DuetError(
            f"{p} is a speculative-streaming draft, which runs on the torch or onnx backend "
            f"(got {backend}); pass --draft-backend torch or onnx"
        )
    if backend == "onnx" and p.suffix == ".onnx" and _is_ss_onnx(p):
        from runtime.drafts.ss.onnx import OnnxSSCausalLM

        return OnnxSSCausalLM.load(p, **kw)
    if backend == "mlx":
        from runtime.backends.mlx import load_mlx_lm

        _need_dir(p, backend)
        return load_mlx_lm(p, **kw)
    if backend == "torch":
        from runtime.backends.torch.causal_lm import TorchCausalLM

        _need_dir(p, backend)
        return TorchCausalLM.load(p, **kw)
    if backend == "onnx":
        from runtime.backends.onnx import load_onnx_lm

        if p.is_dir():
            return load_onnx_lm(onnx_for_dir(p), config_dir=p, **kw)
        if _is_static_onnx(p):  # fixed-shape export for NPUs (converters --static-shapes)
            from runtime.backends.onnx.llama import PROVIDERS
            from runtime.backends.onnx.static_host import StaticOnnxLM

            ep = PROVIDERS.get(kw.get("provider", "cpu"), kw.get("provider"))
            return StaticOnnxLM.load(p, provider=ep, threads=kw.get("intra_threads", 1))
        return load_onnx_lm(p, **kw)
    from runtime.backends.coreml.causal_lm import CoreMLCausalLM  # noqa: PLC0415 (macOS-only deps)

    return CoreMLCausalLM.load(p, **kw)


def _is_static_onnx(p: Path) -> bool:
    import onnx

    try:
        meta = onnx.load(str(p), load_external_data=False).metadata_props
    except Exception:  # not ONNX at all: let the loader report it in its own words
        return False
    return any(m.key == "duet.static" for m in meta)


def _is_ss_onnx(p: Path) -> bool:
    import onnx

    try:
        meta = onnx.load(str(p), load_external_data=False).metadata_props
    except Exception:  # not ONNX at all: let the loader report it in its own words
        return False
    return any(m.key == "duet.config" and "duet_speculative_streaming" in m.value for m in meta)


def ss_onnx_for_dir(d: Path) -> Path:
    """An SS draft's ONNX export, cached under `d/.duet/` (made once, redone when older)."""
    out = sidecar(d, "model_ss.onnx")
    if is_stale(out, d.glob("*.safetensors")):
        from runtime.backends.exporters import export

        try:
            export("onnx-ss", d, out, source=d)
        except OSError as e:
            raise DuetError(f"{d}: cannot write the on-the-fly ONNX export ({e})") from None
    return out


def _need_dir(p: Path, backend: str) -> None:
    if not p.is_dir():
        raise DuetError(
            f"{p}: the {backend} backend needs a checkpoint directory (config.json + *.safetensors)"
        )


def onnx_for_dir(d: Path) -> Path:
    """`d/model.onnx` if shipped, else an export cached under `d/.duet/` (made once)."""
    shipped = d / "model.onnx"
    if shipped.is_file():
        return shipped
    from runtime.config import ModelConfig

    ModelConfig.from_dir(d)  # fail on a bad checkpoint before exporting
    out = sidecar(d, "model.onnx")
    if is_stale(out, d.glob("*.safetensors")):
        from runtime.backends.exporters import export  # converters/, registered from above

        try:
            export("onnx", d, out, source=d)
        except OSError as e:
            raise DuetError(
                f"{d}: cannot write the on-the-fly ONNX export ({e}); export it with "
                f"`python -m converters export --model {d} --format onnx --out FILE`"
            ) from None
    return out
