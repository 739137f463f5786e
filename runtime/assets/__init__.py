"""The embedded default pair that ships in the repository (made by `python -m apps.train`)."""

from __future__ import annotations

from pathlib import Path

from runtime.errors import DuetError

DEFAULT_DIR = Path(__file__).parent / "default"


def default_pair() -> tuple[Path, Path]:
    """(target dir, draft dir) of the embedded pair."""
    t, d = DEFAULT_DIR / "target", DEFAULT_DIR / "draft"
    if not (t / "config.json").is_file() or not (d / "config.json").is_file():
        raise DuetError(
            f"the embedded default pair is missing under {DEFAULT_DIR}; "
            "rebuild it with `python -m apps.train` or pass --target and --draft"
        )
    return t, d
