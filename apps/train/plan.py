"""Turning a wall-clock budget into step counts, from measured step times.

A few optimisation steps of each stage are timed on throwaway models (the real
ones are built afterwards from the seed, so timing does not perturb them). The
remaining budget, less a reserve for saving and evaluation, is split between
target training and draft distillation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

EVAL_RESERVE_S = 420.0  # final saves, reload checks and evaluation (slow on a shared machine)
SAVE_RESERVE_S = 30.0  # the same without the evaluation (--no-eval)


@dataclass(frozen=True)
class Plan:
    target_steps: int
    draft_steps: int
    target_step_s: float
    draft_step_s: float
    target_time_s: float
    draft_time_s: float

    def describe(self, tokens_per_step: int) -> str:
        return (
            f"plan: target {self.target_steps} steps ({self.target_step_s:.2f} s/step, "
            f"{tokens_per_step / self.target_step_s:.0f} tok/s, "
            f"~{self.target_time_s / 60:.1f} min), draft {self.draft_steps} steps "
            f"({self.draft_step_s:.2f} s/step, ~{self.draft_time_s / 60:.1f} min); "
            f"to reproduce without timing: --target-steps {self.target_steps} "
            f"--draft-steps {self.draft_steps}"
        )


def time_steps(
    model: torch.nn.Module, step_fn, batches, n: int = 3, bf16: bool = True, device: str = "cpu"
) -> float:
    """Seconds per optimisation step of `step_fn` on `model` (on `device`), after one warm-up
    step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dev = torch.device(device)
    times = []
    for i in range(n + 1):
        x, y = (b.to(dev) for b in next(batches))
        t = time.monotonic()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.monotonic() - t)
    return sorted(times)[len(times) // 2]


def plan_steps(
    remaining_s: float,
    target_step_s: float,
    draft_step_s: float,
    target_frac: float = 0.7,
    safety: float = 0.9,
    reserve_s: float = EVAL_RESERVE_S,
) -> Plan:
    """Split `remaining_s` (less `reserve_s`: saves, checks and the evaluation) between the
    stages; `safety` leaves room for a busy machine."""
    usable = max(remaining_s - reserve_s, 60.0)
    tt, dt = usable * target_frac, usable * (1 - target_frac)
    return Plan(
        target_steps=max(1, int(tt * safety / target_step_s)),
        draft_steps=max(1, int(dt * safety / draft_step_s)),
        target_step_s=target_step_s,
        draft_step_s=draft_step_s,
        target_time_s=tt,
        draft_time_s=dt,
    )
