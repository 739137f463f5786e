"""One Mirror-SD profile run: a pair over a prompt set, every step on one shared clock.

All prompts share one Timeline (so trace.json is the whole run, prompts one
after another) and their step events are concatenated, so the summary is an
aggregate over all steps of all prompts, not a mean of per-prompt means.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from runtime.decoding import Sampling
from runtime.decoding.events import StepEvent
from runtime.decoding.mirror import wave_shape
from runtime.errors import DuetError
from runtime.mirror.summary import mirror_summary
from runtime.mirror.timeline import Timeline
from runtime.session import GenerationSession

TRACE_LABEL = "Duet Mirror-SD profile"


@dataclass
class Setup:
    """What every run in a profile or a sweep shares: the loaded pair and the prompts' ids."""

    pair: object
    prompts: list[tuple[object, list[int]]]  # (question_id, prompt ids)
    max_new: int
    gamma: int
    sampling: Sampling
    seed: int
    emu: object | None = None  # devices.emulation.Emulator under --emulate
    branches: int | None = None  # branch rollouts per batched draft pass (None: wave_shape)
    draft_process: bool = False  # the draft worker in its own process (--draft-process)
    exit_head: str | None = None  # raw | tuned (default: tuned when stored)
    draft_branches: int | None = None  # own runner-ups before the early exit (None: default)

    @property
    def label(self) -> str:
        return TRACE_LABEL + (f" ({self.emu.label})" if self.emu else "")


@dataclass
class Run:
    events: list[StepEvent] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    per_prompt: list[dict] = field(default_factory=list)


def exit_layer_default(num_layers: int) -> int:
    return num_layers // 2


def prompt_ids(pair, records: list[dict], max_new: int) -> list[tuple[object, list[int]]]:
    """Each record's first turn as ids (chat template when the checkpoint has one), cut to fit."""
    from apps.bench.prompt_set import turn_ids
    from runtime.chat_session import ChatTemplate

    if pair.tokenizer is None:
        raise DuetError(f"{pair.target_dir}: no tokenizer.json; the profiler needs one")
    template = ChatTemplate.load(pair.target_dir)
    ctx = min(pair.target.config.max_context, pair.draft.config.max_context)
    keep = max(1, ctx - max_new - 1)  # the prompt's end, so prompt + answer fit the context
    out = []
    for r in records:
        ids = turn_ids(pair.tokenizer, template, r["turns"][:1], [])[-keep:]
        if ids:
            out.append((r["question_id"], ids))
    if not out:
        raise DuetError("every selected prompt tokenized to nothing")
    return out


def run_mirror(
    setup: Setup,
    *,
    kappa: int,
    exit_layer: int,
    desc: str = "profile",
    prompts=None,
    max_new: int | None = None,
    leave: bool = True,
) -> Run:
    """`mirror` over the prompts, one Timeline for all; prompt i uses seed + i."""
    pair, run = setup.pair, Run()
    prompts = setup.prompts if prompts is None else prompts
    max_new = setup.max_new if max_new is None else max_new
    bar = tqdm(prompts, desc=desc, unit="prompt", file=sys.stderr, disable=None, leave=leave)
    # summarize=False: the profile summarizes every prompt's steps at once (summarize below)
    session = GenerationSession(
        pair,
        method="mirror",
        eos=pair.target.config.eos_token_ids,
        summarize=False,
        options={
            "gamma": setup.gamma,
            "kappa": kappa,
            "exit_layer": exit_layer,
            "branches": setup.branches,
            "draft_process": setup.draft_process,
            "exit_head": setup.exit_head,
            "draft_branches": setup.draft_branches,
        },
    )
    for i, (qid, ids) in enumerate(bar):
        n = max(1, min(max_new, pair.target.config.max_context - len(ids) - 1))
        toks, evs, t0 = [], [], time.perf_counter()
        for r in session.stream(
            ids, n, sampling=setup.sampling, seed=setup.seed + i, timeline=run.timeline
        ):
            toks += r.tokens
            evs.append(r.step)
        wall = time.perf_counter() - t0
        run.events += evs
        run.per_prompt.append(
            {
                "question_id": qid,
                "prompt_tokens": len(ids),
                "new_tokens": len(toks),
                "steps": len(evs),
                "wall_s": round(wall, 4),
            }
        )
    return run


def warm_up(setup: Setup, *, kappa: int, exit_layer: int) -> None:
    """An untimed short run: the first passes pay for graph building and allocations."""
    run_mirror(
        setup,
        kappa=kappa,
        exit_layer=exit_layer,
        desc="warm-up",
        prompts=setup.prompts[:1],
        max_new=min(setup.max_new, 8),
        leave=False,
    )


def thread_settings(pair) -> dict:
    """The thread counts the two workers actually ran with (they share the CPU cores)."""
    import torch

    from apps.bench.compare import mlx_device

    s = pair.settings
    return {
        "cpu_count": os.cpu_count(),
        "target_backend": s.get("target_backend"),
        "draft_backend": s.get("draft_backend"),
        "ort_intra_op_threads": s.get("draft_threads"),
        "ort_provider": s.get("draft_provider"),
        "mlx_device": mlx_device(),
        "torch_threads": torch.get_num_threads(),
    }


def target_alone_ms(setup: Setup, exit_layer: int, repeats: int = 20) -> float:
    """The target's Mirror-SD pass (layers 1..ℓe, head, ℓe+1..N, head over a γ+1 window) with
    no draft running: the denominator of the target's slowdown beside the draft worker."""
    import numpy as np

    from runtime.decoding.events import rewind

    t = setup.pair.target
    ids = setup.prompts[0][1]
    cache = t.new_cache()
    t.forward(np.array([ids]), cache)
    window = np.array([[ids[-1]] * (setup.gamma + 1)])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        h = t.forward_layers(window, cache, 0, exit_layer)
        t.head(h)
        t.head(t.forward_layers(h, cache, exit_layer, t.config.num_layers))
        times.append(time.perf_counter() - t0)
        rewind(cache, len(ids))
    return 1e3 * float(np.median(times))


def summarize(run: Run, setup: Setup, *, kappa: int, exit_layer: int) -> dict:
    """mirror_summary over every step of every prompt, with the settings and App. E's check."""
    s = mirror_summary(run.events, run.timeline)
    cfg = setup.pair.target.config
    toks = sum(p["new_tokens"] for p in run.per_prompt)
    wall = sum(p["wall_s"] for p in run.per_prompt)
    committed = [len(e.tokens) for e in run.events]
    alone = target_alone_ms(setup, exit_layer)
    beside = (s["prefix_ms"] or 0) + (s["suffix_ms"] or 0)
    out = {
        "label": setup.label,
        "emulated": setup.emu.label if setup.emu else None,
        **s,
        "bound_ff_le_1_minus_omega": None,
        "eq10_rel_error": None,
        "prompts": len(run.per_prompt),
        "new_tokens": toks,
        "wall_s": round(wall, 4),
        "tokens_per_s": round(toks / wall, 2) if wall > 0 else None,
        "mean_committed_per_step": sum(committed) / len(committed) if committed else None,
        "target_alone_ms": round(alone, 3),  # the same window pass with no draft running
        "target_slowdown": round(beside / alone, 3) if alone and beside else None,
        "settings": {
            "method": "mirror",
            "gamma": setup.gamma,
            "kappa": kappa,
            "branches": wave_shape(setup.pair.draft, setup.branches, setup.draft_branches)[0],
            "draft_worker": "process" if setup.draft_process else "thread",
            "exit_head": run.events[0].extra.get("exit_head") if run.events else None,
            "exit_layer": exit_layer,
            "num_layers": cfg.num_layers,
            "temp": setup.sampling.temp,
            "seed": setup.seed,
            "max_tokens": setup.max_new,
            "target": str(setup.pair.target_dir),
            "draft": str(setup.pair.draft_path),
        },
        "threads": thread_settings(setup.pair),
        "per_prompt": run.per_prompt,
    }
    if s["ff"] is not None and s["omega_kappa"] is not None:
        out["bound_ff_le_1_minus_omega"] = {
            "ff": s["ff"],
            "one_minus_omega": 1 - s["omega_kappa"],
            "holds": s["ff"] <= 1 - s["omega_kappa"] + 1e-12,
        }
    m, p = s["step_ms_measured"], s["step_ms_predicted"]
    if m and p is not None:
        out["eq10_rel_error"] = abs(m - p) / m
    if setup.emu is not None:
        out["emulation"] = setup.emu.summary()
    return out
