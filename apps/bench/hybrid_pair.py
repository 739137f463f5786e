"""Where the hybrid (Qwen3.5) pair the benches measure on lives, and how to build it.

Its weights are not committed (the repository stays under its size budget): they are built by
`python -m apps.train --arch qwen3_5` into out/hybrid (gitignored). A bench that needs the
pair and does not find it says the command, and nothing else. It does not train anything.
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import DuetError

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "out" / "hybrid"
BUILD = (
    "nice -n 10 python -m apps.train --arch qwen3_5 --out {out} --time-budget-min 35 --threads 1"
)


def hybrid_pair_dirs(out: str | Path | None = None) -> tuple[Path, Path]:
    """(target dir, draft dir) of the hybrid pair under `out` (default out/hybrid); a missing
    pair is a DuetError naming the command that builds it."""
    root = Path(out) if out is not None else DEFAULT_DIR
    t, d = root / "target", root / "draft"
    if not (t / "config.json").is_file() or not (d / "config.json").is_file():
        raise DuetError(
            f"no hybrid pair under {root} (its weights are not committed); build it with: "
            + BUILD.format(out=root)
        )
    return t, d
