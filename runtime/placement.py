"""Which backend runs a role (the target, the draft): one rule for every command.

In order, the first that answers:
1. the backend the user named (`--target-backend`, `--draft-backend`, the companion's
   `--engine`; for the target, $DUET_TARGET_BACKEND where neither the flag nor a device
   profile names one); "auto", "" or None names none;
2. the device profile's backend for that role (`[target] backend`, `[draft] backend` in
   devices/profiles/*.toml), when a profile is given. The engine does not import devices/
   (STYLE 11): the command layer reads the profile and passes its roles in as a plain
   `{role: backend}` dict (`profile_roles` turns a loaded profile into one);
3. the caller's own default, where it has one (a draft checkpoint's format decides its backend
   in runtime/loading.py);
4. the machine's backends (`target_candidates`, for the target): MLX on macOS (the Metal GPU);
   PyTorch for `--target-device cuda`; on an x86-64 or arm64 CPU, ONNX Runtime and PyTorch, by
   the fidelity rule: a quantized source (a GGUF) runs at its own precision, on ONNX Runtime
   from its own blocks (MatMulNBits), which is the model the user has (a float32 copy of it is
   not); a float checkpoint runs in float32 on whichever of PyTorch and ONNX Runtime a probe
   measures faster for that model on this machine (devices/target_placement.py keeps it), unless
   `--quantize int4|int8` asks for the ONNX target's quantized weights; a hybrid, one with an
   adapter merged, or one over FLOAT_PROBE_MAX of weights runs on PyTorch (`_torch_only`).
   Without a probe (a library caller that passes none) a float checkpoint runs on PyTorch. A
   bundle's draft runs on Core ML on macOS (the Neural Engine) and on ONNX Runtime elsewhere.

It picks a name and says why; loading is the caller's (runtime/loading.py, apps/companion).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from runtime.errors import DuetError

ROLES = ("target", "draft")
NAMED_NONE = (None, "", "auto")
# role -> {on macOS?: (backend, why)}
PLATFORM = {
    "target": {
        True: ("mlx", "auto on macOS: MLX on the Metal GPU"),
        False: ("torch", "auto off macOS: PyTorch, since MLX runs on the CPU here and measured "
                "slower (`python -m apps.bench footprint --backends torch,mlx` compares them)"),
    },  # the target's platform answer where the caller has no checkpoint: target_candidates
    "draft": {
        True: ("coreml", "auto on macOS: Core ML (the Neural Engine)"),
        False: ("onnx", "auto off macOS: ONNX Runtime"),
    },
}  # fmt: skip


def draft_backends_for(path) -> tuple[str, ...]:
    """The backends a draft at `path` runs on, its default first: an exported file its own
    (.onnx, .mlpackage), a checkpoint directory ONNX Runtime (exported on the fly), MLX or
    PyTorch."""
    from runtime.backends import backend_for_path

    own = backend_for_path(path)
    return ("onnx", "mlx", "torch") if own == "mlx" else (own,)


def profile_roles(profile) -> dict[str, str]:
    """A device profile's {role: backend} (devices.profile.Profile, or anything with
    `.target.backend` and `.draft.backend`), for `choose_backend`."""
    return {role: getattr(profile, role).backend for role in ROLES}


def choose_backend(
    role: str,
    requested: str | None = None,
    roles: Mapping[str, str] | None = None,
    *,
    default: str | None = None,
    choices: tuple[str, ...] | None = None,
    platform: str | None = None,
) -> tuple[str, str | None]:
    """(backend, why) for `role` by the rule in the module docstring; why is None when the
    user named the backend or the caller's default decided. `choices`: the backends the caller
    can run, checked against a profile's answer; `platform`: sys.platform (tests pass one)."""
    if role not in ROLES:
        raise DuetError(f"role {role!r}: choose from {', '.join(ROLES)}")
    if requested not in NAMED_NONE:
        return requested, None
    if roles and roles.get(role):
        picked = roles[role]
        if choices is not None and picked not in choices:
            raise DuetError(
                f"the device profile runs the {role} on {picked!r}, which this "
                f"command cannot ({', '.join(choices)}); name the {role}'s backend "
                f"instead"
            )
        return picked, f"the device profile's {role} backend"
    if default is not None:
        return default, None
    return PLATFORM[role][(platform or sys.platform) == "darwin"]


QUANTIZE = ("auto", "int4", "int8", "none")  # --quantize; auto: the fidelity rule
FLOAT_GGUF_TYPES = {0: "F32", 1: "F16", 32: "BF16"}  # general.file_type values of float files


def source_precision(tdir) -> str | None:
    """The GGUF quantization a checkpoint was described from ("file type 3", ...), or None for
    a float checkpoint (or a GGUF of float weights)."""
    from runtime.gguf_import import gguf_source

    if gguf_source(tdir) is None:
        return None
    import json
    from pathlib import Path

    try:
        kind = json.loads((Path(tdir) / "duet-source.json").read_text()).get("file_type")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind in FLOAT_GGUF_TYPES:
        return None
    try:
        from gguf import LlamaFileType

        return LlamaFileType(kind).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return f"file type {kind}"


def resolve_quantize(tdir, quantize: str | None) -> str:
    """`--quantize auto` by the fidelity rule: a quantized GGUF's own blocks ("int4": its 4-bit
    blocks kept, its finer ones at 8 bits), else float32 ("none"); a named one as given."""
    if quantize not in (None, "auto"):
        return quantize
    return "int4" if source_precision(tdir) is not None else "none"


ENV = "DUET_TARGET_BACKEND"  # names the target's backend where no flag does (the tests pin it)
FLOAT_PROBE_MAX = 2 * 2**30  # float weights above this run on PyTorch: no ONNX export to probe


def named_target(requested: str | None) -> str | None:
    """The target backend the user named: the flag, else $DUET_TARGET_BACKEND, else None."""
    if requested not in NAMED_NONE:
        return requested
    env = os.environ.get(ENV, "").strip()
    if env in NAMED_NONE:
        return None
    if env not in ("mlx", "torch", "onnx"):
        raise DuetError(f"${ENV}={env!r}: choose from auto, mlx, torch, onnx")
    return env


def target_candidates(
    tdir,
    quantize: str | None = "auto",
    device: str = "cpu",
    platform: str | None = None,
    adapter: bool = False,
) -> list[tuple[str, str, str]]:
    """[(backend, quantize, why)]: where the target may run on this machine when the user and
    the profile name no backend (rule 4 of the module docstring), the library's default first.
    More than one: a probe decides (devices/target_placement.py). `adapter`: the checkpoint is
    a base with a LoRA adapter merged (PyTorch's, as the cloud verifier's adapter views are)."""
    q = resolve_quantize(tdir, quantize)
    if device != "cpu":
        return [("torch", "none", f"--target-device {device}: PyTorch on the {device} device")]
    if (platform or sys.platform) == "darwin":
        return [("mlx", q, "auto on macOS: MLX on the Metal GPU")]
    if quantize in ("int4", "int8"):
        return [("onnx", q, f"--quantize {q}: the ONNX target's {q} MatMulNBits weights")]
    own = source_precision(tdir)
    if own is not None:
        return [
            (
                "onnx",
                q,
                f"a quantized GGUF ({own}) runs at its own precision: ONNX Runtime "
                "from its own blocks (4-bit MatMulNBits; finer blocks at 8 bits)",
            )
        ]
    why = "a float checkpoint runs in float32"
    torch_only = _torch_only(tdir, adapter)
    if torch_only:
        return [("torch", "none", f"{why} on PyTorch: {torch_only}")]
    return [("torch", "none", f"{why} (PyTorch)"), ("onnx", "none", f"{why} (ONNX Runtime)")]


def _torch_only(tdir, adapter: bool) -> str | None:
    """Why a float checkpoint is not offered to ONNX Runtime by default, or None."""
    from pathlib import Path

    from runtime.config import ModelConfig

    if adapter:
        return "a LoRA adapter is merged into it (--target-backend onnx exports the merge)"
    if (Path(tdir) / "config.json").is_file() and ModelConfig.from_dir(tdir).is_hybrid:
        return (
            "a hybrid (linear-attention) checkpoint's ONNX form is a one-token graph, whose "
            "verify window costs a pass a token"
        )
    size = sum(f.stat().st_size for f in Path(tdir).glob("*.safetensors"))
    if size > FLOAT_PROBE_MAX:
        return (
            f"its {size / 2**30:.1f} GiB of float weights would take minutes and memory to "
            "export for a probe (--target-backend onnx exports them)"
        )
    return None
