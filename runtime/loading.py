"""Resolve and load a target/draft pair the way every command does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.backends import load_model
from runtime.drafts import is_model_free_spec, load_model_free
from runtime.drafts.mixed import is_mixed_spec
from runtime.errors import DuetError
from runtime.placement import choose_backend, draft_backends_for
from runtime.preflight import check_checkpoint, check_pair_files
from runtime.target_loading import TARGET_BACKENDS, load_target  # noqa: F401 (re-exported)
from runtime.tokenizer import Tokenizer, check_pair


@dataclass
class Pair:
    target: object
    draft: object | None
    tokenizer: Tokenizer | None
    target_dir: Path
    draft_path: Path | None
    settings: dict  # backends and thread counts, for reports
    name: str = "duet-default"  # what the target is called (a short name, a GGUF's or dir's name)


def model_name(arg: str | None, resolved: Path | None) -> str:
    """The target's name as a user gave it: a known short name, a .gguf file's stem, else the
    directory's name; the embedded pair is `duet-default`."""
    if arg is None or resolved is None:
        return "duet-default"
    from runtime.registry import KNOWN

    if arg in KNOWN:
        return arg
    p = Path(arg)
    return p.stem if p.suffix == ".gguf" else (p.name or resolved.name)


def resolve(path: str | None, role: str) -> Path | None:
    """A local path, a .gguf file, a known model's short name (runtime/registry.py), or a Hub
    id fetched with huggingface_hub (when online)."""
    if path is None:
        return None
    from runtime.registry import KNOWN, checkpoint_for

    p = Path(path).expanduser()
    if path in KNOWN and not p.exists():  # a real model by its short name (apps.models pull)
        return checkpoint_for(path, role)
    if p.suffix == ".gguf":  # dequantized once into the cache (runtime/gguf_import.py)
        from runtime.gguf_import import checkpoint_for_gguf

        return checkpoint_for_gguf(p)
    if p.exists():
        return p
    if path.count("/") == 1 and not path.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(
                    path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]
                )
            )
        except Exception as e:  # offline, unknown repo, ...: one line, not a traceback
            raise DuetError(
                f"--{role} {path}: not a local path, and fetching it from the Hub failed "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            ) from None
    known = ", ".join(KNOWN)
    raise DuetError(
        f"--{role} {path}: no such file or directory, nor a known model ({known}; "
        "see `python -m apps.models list`)"
    )


# drafts read from beside the target: its MTP head (checkpoint or sidecar), a fitted head
OWN_HEADS = ("mtp", "head")


def _no_draft_dir(spec) -> bool:
    """Whether a --draft value names no draft checkpoint: the target's own head (`head`,
    `mtp`), a model-free draft, or one of each (`head+suffix`, runtime/drafts/mixed.py)."""
    return spec in OWN_HEADS or is_model_free_spec(spec) or is_mixed_spec(spec)


def head_backend(draft_backend: str | None, target_device: str = "cpu") -> str:
    """Where a sidecar head (fitted head, MTP) steps: PyTorch when asked for or when the target
    runs off the CPU (its features stay on the device), else ONNX Runtime with int8 weights."""
    return "torch" if draft_backend == "torch" or target_device != "cpu" else "onnx"


def load_pair(
    target: str | None,
    draft: str | None,
    *,
    need_draft: bool,
    target_backend: str = "auto",
    draft_backend: str | None = None,
    draft_threads: int = 1,
    provider: str = "cpu",
    target_threads: int | None = None,
    target_device: str = "cpu",
    adapter: str | None = None,
    hybrid_rollback: str = "replay",
    quantize: str = "auto",
    heads_from: str | Path | None = None,
    profile_roles: Mapping[str, str] | None = None,
    target_chooser=None,
) -> Pair:
    """Load target (and draft when `need_draft`); the embedded pair when neither is given.

    Thread counts are set on purpose: the draft gets `draft_threads` ONNX Runtime intra-op
    threads and a PyTorch target the remaining cores (`target_threads`), so the two
    workers of Mirror-SD do not fight over the same cores. A hybrid (Qwen3.5) target runs on
    the PyTorch or MLX backend with `hybrid_rollback` ("replay" or "redecode",
    runtime/caches/hybrid.py, runtime/caches/mlx_hybrid.py); a hybrid draft, like any
    draft, defaults to ONNX (a one-token graph whose rollback picks the states kept per
    position, runtime/caches/step_state.py).

    `adapter`: a LoRA adapter (PEFT format) for the target, checked against it and merged at
    load (runtime/adapter.py). A FlexSpec anchor draft (runtime/anchor.py) is assembled from
    its base, which must be the target given (before any adapter) or the one it names.

    `heads_from`: the checkpoint whose sidecar `--draft head` / `mtp` reads, when it is not
    the target's own (a fine-tuned copy drafted by its base's head); by default the target
    directory before any adapter is merged, so an adapter keeps its base's head.

    `profile_roles`: a device profile's {role: backend} (runtime/placement.py), which places
    the target and a draft model where the user named no backend.

    `quantize`: the ONNX target's weights; "auto" is the fidelity rule (runtime/placement.py:
    a quantized GGUF's own blocks, a float checkpoint's float32). `target_chooser`: where no
    backend is named, the command layer's measured choice among the machine's candidates
    (devices/target_placement.py; called as `chooser(tdir, candidates, load)`, it returns
    (backend, quantize, why, announce, the loaded target or None)); without one the first
    candidate runs.
    """
    tdir, ddir, home = _pair_dirs(target, draft, need_draft, adapter, heads_from)

    t, settings = load_target(
        tdir,
        not need_draft or _no_draft_dir(ddir),
        target_backend,
        quantize,
        profile_roles,
        target_device,
        target_chooser,
        target_threads,
        draft_threads,
        hybrid_rollback,
        adapter is not None,
    )
    mixed, kind = need_draft and is_mixed_spec(ddir), ddir
    if mixed:  # the head drafts, a model-free draft beside it (runtime/drafts/mixed.py)
        kind = ddir.split("+")[0]
    d = None
    if need_draft:
        d = _load_draft(
            t,
            tdir,
            ddir,
            kind,
            home,
            settings,
            draft_backend,
            draft_threads,
            provider,
            target_device,
            hybrid_rollback,
            profile_roles,
        )
    tok = Tokenizer(tdir) if (Path(tdir) / "tokenizer.json").is_file() else None
    if mixed:
        from runtime.drafts.mixed import MixedDraft

        free = ddir.split("+")[1]
        d = MixedDraft(d, load_model_free(free, t, tok), name=ddir)
        settings.update(
            draft_backend=f"{settings['draft_backend']} + {free} (model-free): the "
            f"text's chain when it offers one, else the {kind}'s"
        )
    return Pair(t, d, tok, Path(tdir), ddir, settings, model_name(target, Path(tdir)))


def _pair_dirs(target, draft, need_draft: bool, adapter, heads_from) -> tuple:
    """(target dir, draft dir or spec, the sidecars' checkpoint): names resolved, an anchor
    draft assembled, an adapter merged, and headers and vocabularies checked."""
    if target is None and draft is None:
        from runtime.assets import default_pair

        tdir, ddir = default_pair()
    elif target is None and _no_draft_dir(draft):
        from runtime.assets import default_pair  # the embedded target, its own head / no model

        tdir, ddir = default_pair()[0], draft
    elif target is None:
        raise DuetError(
            "--draft given without --target; pass both, or neither for the embedded pair"
        )
    elif _no_draft_dir(draft):  # its own head, or no model, or both
        tdir, ddir = resolve(target, "target"), draft
    else:
        tdir, ddir = resolve(target, "target"), resolve(draft, "draft")
    if need_draft and ddir is None:
        raise DuetError("this method needs a draft model: pass --draft PATH")
    if need_draft:
        from runtime.anchor import is_anchor_dir, materialize

        if is_anchor_dir(ddir):
            ddir = materialize(ddir, [Path(tdir)])
    home = Path(heads_from) if heads_from is not None else tdir  # the sidecars' checkpoint
    if adapter is not None:
        from runtime.adapter import merged_target_dir

        check_checkpoint(tdir, "target")
        tdir = merged_target_dir(tdir, resolve(adapter, "adapter"))
    # headers and vocabularies first: a bad file costs a second, not a model load
    check_checkpoint(tdir, "target")
    if need_draft and not _no_draft_dir(ddir):
        check_checkpoint(ddir, "draft")
        check_pair_files(tdir, ddir)
    return tdir, ddir, home


def _load_draft(
    t,
    tdir,
    ddir,
    kind,
    home,
    settings: dict,
    draft_backend,
    draft_threads: int,
    provider: str,
    target_device: str,
    hybrid_rollback: str,
    profile_roles,
):
    """The draft `kind` names (the target's fitted head or MTP head, a model-free draft, or a
    draft checkpoint, checked against the target's vocabulary); its settings go on `settings`."""
    if kind == "head":  # a fitted feature-level head (apps.train eagle)
        from runtime.drafts.head.torch import HeadDraft

        hb = head_backend(draft_backend, target_device)
        d = HeadDraft.load(t, home, backend=hb, threads=draft_threads)
        label = "torch" if hb == "torch" else "onnx, int8 weights"
        settings.update(draft_backend=f"head (fitted feature-level head, {label})")
    elif kind == "mtp":
        from runtime.drafts.mtp.torch import MTPDraft

        mb = head_backend(draft_backend, target_device)
        d = MTPDraft.load(t, home, backend=mb, threads=draft_threads)
        label = "torch" if mb == "torch" else "onnx, int8 weights"
        settings.update(draft_backend=f"mtp (target's own head, {label})")
    elif is_model_free_spec(ddir):  # runtime/drafts/: no model loaded
        tok = Tokenizer(tdir) if (Path(tdir) / "tokenizer.json").is_file() else None
        d = load_model_free(ddir, t, tok)
        settings.update(draft_backend=f"{ddir} (model-free)")
    else:
        can = draft_backends_for(ddir)
        db, _ = choose_backend("draft", draft_backend, profile_roles, default=can[0], choices=can)
        kw = {"intra_threads": draft_threads, "provider": provider} if db == "onnx" else {}
        if db == "torch":
            kw = {"threads": draft_threads, "hybrid_rollback": hybrid_rollback}
        elif db == "mlx":
            kw = {"hybrid_rollback": hybrid_rollback}
        d = load_model(ddir, db, **kw)
        check_pair(tdir, ddir, t.config, d.config)
        settings.update(
            draft_backend=db,
            draft_threads=draft_threads if db == "onnx" else None,
            draft_provider=provider if db == "onnx" else None,
        )
    return d
