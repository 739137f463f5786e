"""The target of a pair: where it runs (runtime/placement.py's rule, a command's measured
choice among the machine's candidates), with how many threads, loaded, and what a run reports
about it. runtime/loading.py's load_pair calls it before the draft."""

from __future__ import annotations

import os

from runtime.backends import load_model
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.placement import NAMED_NONE, choose_backend, target_candidates

TARGET_BACKENDS = ("auto", "mlx", "torch", "onnx")  # onnx: runtime/backends/onnx/target.py


def load_target(
    tdir,
    alone: bool,
    target_backend,
    quantize,
    profile_roles,
    target_device,
    chooser,
    target_threads,
    draft_threads,
    hybrid_rollback,
    adapter: bool = False,
) -> tuple:
    """(the target, its part of the settings reported with a run): placed, then loaded.
    `adapter`: a LoRA adapter was merged into `tdir` (runtime/placement.py places it)."""

    def threads_for(backend: str) -> int:
        return _threads_for(backend, target_threads, alone, draft_threads)

    placed = _place_target(
        tdir,
        target_backend,
        quantize,
        profile_roles,
        target_device,
        chooser,
        threads_for,
        hybrid_rollback,
        adapter,
    )
    target_backend, quantize, target_why, announce, t = placed
    target_threads = threads_for(target_backend)
    if t is None:
        t = _load_target(
            tdir, target_backend, target_threads, target_device, hybrid_rollback, quantize
        )[0]
    hybrid_onnx = target_backend == "onnx" and ModelConfig.from_dir(tdir).is_hybrid
    quantize = "none" if hybrid_onnx else quantize
    settings = _target_settings(
        target_backend, target_threads, target_device, target_why, quantize, hybrid_onnx
    )
    settings["target_announce"] = announce  # a new choice: the command says it, once
    return t, settings


def _place_target(
    tdir,
    target_backend,
    quantize,
    profile_roles,
    device,
    chooser,
    threads_for,
    hybrid_rollback,
    adapter: bool,
) -> tuple:
    """(backend, quantize, why it was chosen, whether to say so, the target when a probe
    loaded it): the user's or the profile's backend, else the machine's candidates
    (runtime/placement.py), measured by `chooser` where there are several."""
    from runtime.placement import named_target, resolve_quantize

    if not (profile_roles and profile_roles.get("target")):  # a profile beats the variable
        target_backend = named_target(target_backend) or "auto"
    named = target_backend not in NAMED_NONE or (profile_roles and profile_roles.get("target"))
    if named:
        backend, why = choose_backend(
            "target", target_backend, profile_roles, choices=TARGET_BACKENDS[1:]
        )
        return backend, resolve_quantize(tdir, quantize), why, False, None
    cands = target_candidates(tdir, quantize, device, adapter=adapter)
    if chooser is None:
        backend, q, why = cands[0]
        return backend, q, why, False, None

    def load(backend: str, q: str):
        th = threads_for(backend)
        return _load_target(tdir, backend, th, device, hybrid_rollback, q)[0]

    return chooser(tdir, cands, load)


def _threads_for(backend, target_threads, alone: bool, draft_threads: int) -> int:
    """The target's intra-op threads on `backend`: as given, else every core for an ONNX target
    with no draft model computing beside it, else the cores the draft leaves (the same count
    whatever the method, so ar and sd runs are comparable)."""
    if target_threads is not None:
        return target_threads
    if backend == "onnx" and alone:
        return os.cpu_count() or 1
    return max(1, (os.cpu_count() or 1) - (0 if alone else draft_threads))


def _load_target(
    tdir,
    target_backend: str,
    target_threads: int,
    target_device: str,
    hybrid_rollback: str,
    quantize: str,
) -> tuple:
    """(the target, the quantization it runs at, whether it is a hybrid on ONNX)."""
    if target_device != "cpu" and target_backend != "torch":
        raise DuetError(
            f"--target-device {target_device} runs the PyTorch target; add --target-backend torch"
        )
    if target_backend == "torch":
        kw = {
            "threads": target_threads,
            "device": target_device,
            "hybrid_rollback": hybrid_rollback,
        }
    else:
        kw = {"hybrid_rollback": hybrid_rollback}  # mlx: used by a hybrid checkpoint only
    hybrid_onnx = target_backend == "onnx" and ModelConfig.from_dir(tdir).is_hybrid
    if hybrid_onnx:  # a hybrid: the draft's one-token graph with its states (float32)
        t = load_model(tdir, "onnx", intra_threads=target_threads)
        quantize = "none"
    elif target_backend == "onnx":  # exported once, cached beside the checkpoint per quantization
        from runtime.backends.onnx.target import OnnxTargetLM

        t = OnnxTargetLM(tdir, quantize, intra_threads=target_threads)
    else:
        t = load_model(tdir, target_backend, **kw)
    return t, quantize, hybrid_onnx


def _target_settings(
    target_backend: str,
    target_threads: int,
    target_device: str,
    target_why,
    quantize: str,
    hybrid_onnx: bool,
) -> dict:
    """The target's part of the settings reported with a run."""
    settings = {"target_backend": target_backend,
                "target_threads": target_threads if target_backend in ("torch", "onnx") else None,
                "target_device": target_device,
                "target_backend_why": target_why}  # fmt: skip
    if target_backend == "onnx":
        settings["target_quantize"] = quantize
    if hybrid_onnx:  # say why --quantize did not apply
        settings["target_backend_why"] = (
            "a hybrid (linear-attention) checkpoint runs as the ONNX draft export's one-token "
            "graph with its recurrent states, float32 weights (--quantize applies to Llama, "
            "Qwen2, Qwen3 and Gemma 3)"
        )
    return settings
