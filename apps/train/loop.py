"""The optimisation loop shared by both stages.

AdamW (weight decay on matrices only), linear warm-up then cosine decay to 10 %,
gradient clipping, bf16 autocast with float32 master weights. Progress is
`step / steps`; with a `time_limit_s` it is the larger of that and
`elapsed / time_limit_s`, so a slow (shared) machine still finishes the
schedule on time, with fewer steps, and the report says so.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

StepFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]]


@dataclass
class LoopConfig:
    stage: str
    steps: int
    lr: float
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    time_limit_s: float | None = None
    log_every: int = 25
    ckpt_every: int = 0  # 0: only at the end (the caller saves)
    bf16: bool = True  # autocast; off where the CPU emulates bf16 (~15x slower than fp32 there)
    device: str = "cpu"  # where the model is: each batch is moved there, autocast is that device's


def head_config(
    stage: str, a, *, warmup: int, time_limit_s: float | None, device: str = "cpu"
) -> LoopConfig:
    """The loop of a small part (a head, a draft's streams or anchor layers) trained beside a
    frozen model from the command's loop flags (a.steps, a.lr, a.ckpt_every): no weight decay,
    float32 (CPUs without bf16 units emulate it ~15x slower)."""
    return LoopConfig(
        stage=stage,
        steps=a.steps,
        lr=a.lr,
        warmup=warmup,
        weight_decay=0.0,
        time_limit_s=time_limit_s,
        ckpt_every=a.ckpt_every,
        bf16=False,
        device=device,
    )


def budget_s(a) -> float | None:
    """--time-budget-min in seconds (None: no cap)."""
    return a.time_budget_min * 60 if a.time_budget_min else None


def lr_at(progress: float, step: int, cfg: LoopConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = min(max(progress, 0.0), 1.0)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def make_optimizer(model: torch.nn.Module, cfg: LoopConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _progress(step: int, start_step: int, elapsed: float, cfg: LoopConfig) -> float | None:
    """The schedule's progress in [0, 1]; with a time limit, the larger of steps and time
    (None once the limit is spent)."""
    progress = step / cfg.steps
    if cfg.time_limit_s:
        if elapsed >= cfg.time_limit_s:
            return None
        left = (cfg.steps - start_step) or 1
        progress = max(progress, (start_step + left * elapsed / cfg.time_limit_s) / cfg.steps)
    return progress


def _record(
    cfg: LoopConfig,
    step: int,
    loss_v: float,
    ema: float,
    lr: float,
    gnorm: float,
    tokens: int,
    el: float,
    metrics: dict,
) -> dict:
    """The loss line of `step`, also written to stderr."""
    tqdm.write(
        f"[{cfg.stage}] step {step}/{cfg.steps} loss {loss_v:.4f} (ema {ema:.4f}) "
        f"lr {lr:.2e} {tokens / el:.0f} tok/s {el / 60:.1f} min",
        file=sys.stderr,
    )
    return {
        "stage": cfg.stage,
        "step": step,
        "loss": loss_v,
        "loss_ema": ema,
        "lr": lr,
        "grad_norm": gnorm,
        "tokens": tokens,
        "elapsed_s": round(el, 1),
        "tokens_per_s": round(tokens / el, 1),
        **metrics,
    }


def _evaluate(model, evaluate: Callable[[], dict], cfg: LoopConfig, step: int, rec) -> dict:
    """`rec` with the checkpoint's evaluation, the model back in training mode."""
    model.eval()
    ev = evaluate()
    model.train()
    tqdm.write(f"[{cfg.stage}] step {step} eval {ev}", file=sys.stderr)
    return {**(rec or {"stage": cfg.stage, "step": step}), **ev}


def _step(model, step_fn: StepFn, opt, x, y, cfg: LoopConfig):
    """One optimisation step on (x, y); (loss, metrics, grad norm)."""
    x, y = x.to(cfg.device, non_blocking=True), y.to(cfg.device, non_blocking=True)
    with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.bf16):
        loss, metrics = step_fn(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
    opt.step()
    return loss, metrics, gnorm


def train_loop(
    model: torch.nn.Module,
    step_fn: StepFn,
    batches: Iterator,
    cfg: LoopConfig,
    log_path: Path,
    checkpoint: Callable[[int], None] | None = None,
    evaluate: Callable[[], dict] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    start_step: int = 0,
) -> dict:
    """Run the schedule; append one JSON line per logged step to `log_path`.

    `step_fn(x, y)` returns (loss, metrics) under autocast. `checkpoint(step)` is
    called every `cfg.ckpt_every` steps; `evaluate()` at each checkpoint and its
    dict is logged. Returns a summary: steps done, tokens, wall time, last loss,
    and whether the time limit cut the run short. A resumed run passes the `optimizer` it
    restored and the `start_step` it reached (the time limit then counts from the restart).
    """
    model.train()
    opt = optimizer if optimizer is not None else make_optimizer(model, cfg)
    t0 = time.monotonic()
    tokens, step, ema, time_capped = 0, start_step, None, False
    bar = tqdm(
        total=cfg.steps,
        initial=start_step,
        desc=cfg.stage,
        unit="step",
        mininterval=10,
        file=sys.stderr,
    )
    with log_path.open("a") as log:
        while step < cfg.steps:
            progress = _progress(step, start_step, time.monotonic() - t0, cfg)
            if progress is None:
                time_capped = True
                break
            lr = lr_at(progress, step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            x, y = next(batches)
            loss, metrics, gnorm = _step(model, step_fn, opt, x, y, cfg)
            step += 1
            tokens += x.numel()
            loss_v = loss.item()
            ema = loss_v if ema is None else 0.95 * ema + 0.05 * loss_v
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}", refresh=False)
            rec = None
            if step % cfg.log_every == 0 or step == 1 or step == cfg.steps:
                el = time.monotonic() - t0
                rec = _record(cfg, step, loss_v, ema, lr, gnorm, tokens, el, metrics)
            if cfg.ckpt_every and step % cfg.ckpt_every == 0 and step < cfg.steps:
                if checkpoint:
                    checkpoint(step)
                if evaluate:
                    rec = _evaluate(model, evaluate, cfg, step, rec)
            if rec:
                log.write(json.dumps(rec) + "\n")
                log.flush()
    bar.close()
    model.eval()
    wall = time.monotonic() - t0
    return {
        "steps": step,
        "steps_planned": cfg.steps,
        "tokens": tokens,
        "wall_s": round(wall, 1),
        "final_loss_ema": ema,
        "time_capped": time_capped,
    }


def train_resumable(
    model: torch.nn.Module,
    step_fn: StepFn,
    batches: Iterator,
    cfg: LoopConfig,
    out: Path,
    save: Callable[[int], None],
    optimizer: torch.optim.Optimizer,
    start_step: int,
) -> dict:
    """train_loop for a command that resumes from OUT (apps/train/resume.py): the log goes to
    OUT/loss_log.jsonl, `save(step)` writes the resume state at each checkpoint and once more
    at the end. Returns the loop's summary."""
    summary = train_loop(
        model,
        step_fn,
        batches,
        cfg,
        out / "loss_log.jsonl",
        checkpoint=save,
        optimizer=optimizer,
        start_step=start_step,
    )
    save(summary["steps"])
    return summary
