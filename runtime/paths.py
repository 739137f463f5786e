"""Where Duet keeps what it makes: the cache folder, and artefacts derived beside a model.

The cache root is $DUET_CACHE_DIR, else $XDG_CACHE_HOME/duet, else ~/.cache/duet (each with
`~` expanded). Every user of it takes a named subfolder: `models` (pulled models and GGUF
conversions; $DUET_MODELS_DIR overrides it alone), `auto` (`--method auto`'s kept
measurements), `llamacpp` and `ort-genai` (the bench's peers), `evolving` (FlexSpec Table II's
evolved targets). Files kept at the root itself: `gqa_buckets.json`.

A derived artefact of a model (an ONNX export, a merged adapter, an assembled anchor draft, a
fitted head's step graphs) lives in the model's own folder under `.duet/` (`sidecar`), and is
rebuilt when it is missing or older than the newest of its sources (`is_stale`).

Pure paths: nothing here creates a folder or reads a file but for its modification time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

SIDECAR = ".duet"  # a model folder's own cache of what Duet derived from it


def cache_root() -> Path:
    """$DUET_CACHE_DIR, else $XDG_CACHE_HOME/duet, else ~/.cache/duet."""
    if os.environ.get("DUET_CACHE_DIR"):
        return Path(os.environ["DUET_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "duet"


def cache_dir(name: str) -> Path:
    """The cache's subfolder `name` (`models` is $DUET_MODELS_DIR when that is set)."""
    if name == "models" and os.environ.get("DUET_MODELS_DIR"):
        return Path(os.environ["DUET_MODELS_DIR"]).expanduser()
    return cache_root() / name


def sidecar(model_dir: str | Path, *parts: str) -> Path:
    """`<model_dir>/.duet/<parts...>`: where an artefact derived from that model is kept."""
    return Path(model_dir).joinpath(SIDECAR, *parts)


def is_stale(artefact: str | Path, sources: Iterable[str | Path]) -> bool:
    """True when `artefact` is missing or older than the newest of `sources` (rebuild it).

    Sources that do not exist are left out; with none, an existing artefact is fresh."""
    a = Path(artefact)
    if not a.is_file():
        return True
    times = [p.stat().st_mtime for p in map(Path, sources) if p.is_file()]
    return a.stat().st_mtime < max(times, default=0.0)
