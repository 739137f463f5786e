"""Which backend runs a role (the target, the draft): one rule for every command.

In order, the first that answers:
1. the backend the user named (`--target-backend`, `--draft-backend`, the companion's
   `--engine`); "auto", "" or None names none;
2. the device profile's backend for that role (`[target] backend`, `[draft] backend` in
   devices/profiles/*.toml), when a profile is given. The engine does not import devices/
   (STYLE 11): the command layer reads the profile and passes its roles in as a plain
   `{role: backend}` dict (`profile_roles` turns a loaded profile into one);
3. the caller's own default, where it has one (a draft checkpoint's format decides its backend
   in runtime/loading.py);
4. the platform's default: the target on MLX on macOS (the Metal GPU) and on PyTorch elsewhere
   (MLX off Apple silicon runs on its CPU backend, whose verification of a γ+1 window costs
   ~γ+1 single-token passes, which erases speculative decoding's gain; PyTorch's CPU matmuls
   keep a short window close to one pass, as a GPU does); a bundle's draft on Core ML on macOS
   (the Neural Engine) and on ONNX Runtime elsewhere.

It picks a name and says why; loading is the caller's (runtime/loading.py, apps/companion).
"""

from __future__ import annotations

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
    },
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
