"""`--drafts`: the same methods with other drafts beside the pair's own, alternated in one run.

    python -m apps.bench --methods ar,sd --drafts mtp --gamma 4 --temps 0,1

Each entry is `lookup` or `suffix` (a model-free draft, runtime/drafts/), `head+suffix`
(`head+lookup`, `mtp+suffix`, `mtp+lookup`: a head with a model-free draft beside it,
runtime/drafts/mixed.py), `mtp` (the target's multi-token-prediction head: its checkpoint's `mtp.*`
weights or the sidecar `python -m apps.train mtp` writes, runtime/drafts/mtp/torch.py; on a
CPU target its ONNX step with int8 weights), `mtp-fp32` (the same head's float32 ONNX step,
to compare) or a draft checkpoint path. Every drafting method then also runs with that draft,
as a runner named `METHOD+LABEL` (`sd+mtp`), in the same round-robin as the others
(apps/bench/schedule.py), so the rows compare drafts under the same drift. The target is shared,
not reloaded.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from runtime.errors import DuetError

MTP_NAMES = {"mtp": "int8", "mtp-fp32": "fp32"}  # --drafts name -> the ONNX step's weights


def parse_drafts(text: str | None) -> list[str]:
    """Comma-separated draft names; [] for None or empty."""
    return [d.strip() for d in (text or "").split(",") if d.strip()]


def label(name: str) -> str:
    """The suffix of the runner name: `mtp` / `mtp-fp32`, `lookup` / `suffix`, or the draft
    folder's name."""
    if name in MTP_NAMES or name in ("lookup", "suffix"):
        return name
    return Path(name).name or name


def extra_pair(pair, name: str, a):
    """`pair` with its draft replaced by `name` (same target object, same tokenizer)."""
    from devices.emulated_model import EmulatedModel, emulate_draft
    from runtime.drafts import is_model_free_spec, load_model_free
    from runtime.drafts.mixed import is_mixed_spec
    from runtime.loading import head_backend, load_pair, resolve

    emulated = isinstance(pair.draft, EmulatedModel)
    if is_model_free_spec(name):  # runtime/drafts/: prompt lookup, suffix tries; no model
        if emulated:
            raise DuetError(f"--drafts {name} cannot be emulated (it runs no model)")
        draft = load_model_free(name, pair.target, pair.tokenizer)
        settings = pair.settings | {"draft_backend": f"{name} (model-free)"}
        return replace(pair, draft=draft, draft_path=Path(name), settings=settings)
    if is_mixed_spec(name):  # the head or MTP head with a model-free draft beside it
        if emulated:
            raise DuetError(
                f"--drafts {name} cannot be emulated (its model-free part runs no model)"
            )
        return mixed_pair(pair, name, a)
    if name in MTP_NAMES and emulated:
        raise DuetError(
            f"--drafts {name} cannot be emulated (the target's MTP head is no "
            "profile model size); drop it or --emulate"
        )
    if name in MTP_NAMES:
        from runtime.drafts.mtp.torch import MTPDraft

        mb = head_backend(a.draft_backend, a.target_device)
        quant = MTP_NAMES[name]
        draft = MTPDraft.load(
            pair.target, pair.target_dir, backend=mb, threads=a.draft_threads, quant=quant
        )
        how = "torch" if mb == "torch" else f"onnx, {quant} weights"
        settings = pair.settings | {"draft_backend": f"mtp (target's own head, {how})"}
        return replace(pair, draft=draft, draft_path=Path("mtp"), settings=settings)
    path = resolve(name, "drafts")
    other = load_pair(
        str(pair.target_dir),
        str(path),
        need_draft=True,
        target_backend=pair.settings["target_backend"],
        draft_backend=a.draft_backend,
        draft_threads=a.draft_threads,
        provider=a.provider,
        target_threads=pair.settings.get("target_threads"),
        target_device=pair.settings.get("target_device", "cpu"),
    )
    draft = emulate_draft(pair.draft, other.draft) if emulated else other.draft
    return replace(pair, draft=draft, draft_path=path, settings=other.settings)


def mixed_pair(pair, name: str, a):
    """`pair` drafting with `name` (`head+suffix`, ...: runtime/drafts/mixed.py) beside the
    same target object."""
    from runtime.drafts import load_model_free
    from runtime.drafts.head.torch import HeadDraft
    from runtime.drafts.mixed import MixedDraft
    from runtime.drafts.mtp.torch import MTPDraft
    from runtime.loading import head_backend

    kind, free = name.split("+")
    mb = head_backend(a.draft_backend, a.target_device)
    cls = HeadDraft if kind == "head" else MTPDraft
    model = cls.load(pair.target, pair.target_dir, backend=mb, threads=a.draft_threads)
    draft = MixedDraft(model, load_model_free(free, pair.target, pair.tokenizer), name=name)
    how = "torch" if mb == "torch" else "onnx, int8 weights"
    settings = pair.settings | {"draft_backend": f"{kind} ({how}) + {free} (model-free)"}
    return replace(pair, draft=draft, draft_path=Path(name), settings=settings)


def extra_runners(methods: list[str], pair, a, make_runners, skip=(), pairs=None) -> list:
    """Runners `METHOD+LABEL` for every drafting method in `methods` and every `--drafts`;
    `pairs` (a dict) keeps each draft's pair for the next call (one load per draft)."""
    names = parse_drafts(getattr(a, "drafts", None))
    drafting = [m for m in methods if m != "ar" and m not in skip]
    if names and not drafting:
        raise DuetError("--drafts needs a drafting method in --methods (e.g. sd)")
    out = []
    pairs = {} if pairs is None else pairs
    for name in names:
        if name not in pairs:
            pairs[name] = extra_pair(pair, name, a)
        p = pairs[name]
        ms = drafting
        if getattr(p.draft, "mixed", False):  # chains only: it joins the sd rows
            from runtime.decoding import cannot_run

            ms = [m for m in drafting if cannot_run(m, p.target, p.draft) is None]
        for r in make_runners(ms, p, a):
            r.name = f"{r.name}+{label(name)}"
            out.append(r)
    return out
