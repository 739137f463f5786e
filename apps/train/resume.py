"""Resume states: what a stopped training run left in OUT/.resume, written and read back.

A state is a dict saved with torch.save (weights, optimizer, step and what else the command
needs to go on), written to NAME.pt.tmp and renamed over NAME.pt, so a run killed mid-write
leaves the previous state whole. Rerunning a command with the same OUT goes on from there;
`--fresh` drops it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch

RESUME_DIR = ".resume"


def save_state(resume_dir: Path, state: dict, name: str = "state") -> None:
    """Write `state` to RESUME_DIR/NAME.pt atomically (through NAME.pt.tmp)."""
    resume_dir.mkdir(parents=True, exist_ok=True)
    tmp = resume_dir / f"{name}.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(resume_dir / f"{name}.pt")


def load_state(resume_dir: Path, name: str = "state", map_location=None) -> dict | None:
    """The state saved under NAME, or None when there is none."""
    f = resume_dir / f"{name}.pt"
    if not f.is_file():
        return None
    return torch.load(f, weights_only=False, map_location=map_location)


def resume_from(
    out: Path, fresh: bool, opt, load: Callable[[dict], None], map_location=None
) -> int:
    """The step to start at: 0, or that of OUT's resume state, after `load(state)` restored its
    weights and the optimizer its own. `fresh` first removes the state."""
    if fresh:
        shutil.rmtree(out / RESUME_DIR, ignore_errors=True)
    st = load_state(out / RESUME_DIR, map_location=map_location)
    if st is None:
        return 0
    load(st)
    opt.load_state_dict(st["optimizer"])
    print(f"resuming {out} at step {st['step']}", flush=True)
    return st["step"]
