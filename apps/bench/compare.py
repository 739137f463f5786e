"""The comparison `python -m apps.bench` runs: its stages from the checked flags to the rows.

settle the flags -> load the prompts and the pair (padded under --emulate) -> build the runners
(Duet's methods, each γ of a sweep, the --drafts variants, a second target backend, the peers)
-> run them alternated (apps/bench/schedule.py), closing every process they started -> the
settings a reader needs and the per-method rows (apps/bench/report.py). It prints nothing but
what it skips; __main__.py prints the report.
"""

from __future__ import annotations

import argparse
import os
import sys

from runtime.arg_rules import check_gamma, check_max_tokens
from runtime.cli_args import load_pair_from_args, resolve_gamma
from runtime.errors import DuetError

from .args import (
    ALONE_METHODS,
    BASELINES,
    NEEDS_NO_DRAFT,
    parse_gammas,
    parse_methods,
    parse_temps,
)

UNPADDED = "its own generation loop calls the model directly, so its passes cannot be padded"


def bench(a: argparse.Namespace) -> dict:
    """Run the benchmark; returns {"settings", "rows", "categories", "mismatches", "records"}."""
    from .categories import by_category
    from .prompt_set import load_prompts
    from .report import mismatches, summarize
    from .runners.peers import bench_threads, parse_peers

    methods, alone, temps, gammas = settle(a)
    cats = [c.strip() for c in a.categories.split(",")] if a.categories else None
    prompts = load_prompts(
        a.prompts, limit=a.limit, categories=cats, per_category=a.per_category_limit
    )
    peer_names = parse_peers(a.peers)
    threads = bench_threads(a)  # --threads: Duet's target, PyTorch and every peer alike
    methods, skipped = unpadded(a, methods)
    pair, emu, need = load(a, methods, alone)
    runners = build_runners(a, methods, pair, need, emu, peer_names, threads, skipped)
    records = run(a, runners, prompts, pair, temps)
    settings = run_settings(a, pair, prompts, temps, gammas, runners, threads)
    names = [r.name for r in runners]
    own_ar = {r.name: getattr(r, "own_ar", "ar") for r in runners}
    rows = summarize(records, names, temps, own_ar)
    if skipped:
        settings["skipped"] = skipped
    if emu is not None:
        settings.update(emulated=emu.label, skipped=skipped, emulation=emu.summary())
        for r in rows:
            r["emulated"] = emu.label
    return {
        "settings": settings,
        "rows": rows,
        "categories": by_category(records, names, temps, own_ar),
        "mismatches": mismatches(records),
        "records": records,
    }


def settle(a: argparse.Namespace) -> tuple[list[str], bool, list[float], list[int]]:
    """The checked methods, whether the target runs alone, the temperatures and the γ sweep; a
    bad flag fails here, before any model loads."""
    alone = a.target is not None and a.draft is None and not a.drafts and a.hybrid is None
    default = ALONE_METHODS if alone else "ar,sd,mirror,mlx-lm,hf-assisted"
    methods, temps = parse_methods(a.methods or default), parse_temps(a.temps)
    if alone and (need := [m for m in methods if m not in NEEDS_NO_DRAFT]):
        raise DuetError(
            f"--methods {','.join(need)} needs a draft: pass --draft (a target alone "
            f"runs {', '.join(NEEDS_NO_DRAFT)})"
        )
    check_max_tokens(a.max_tokens)
    resolve_gamma(a)  # no --gamma: 4 for every method, and a free γ for auto
    check_gamma(a.gamma)
    gammas = parse_gammas(a.gammas, a.gamma)
    if a.limit is not None and a.limit < 1:
        raise DuetError(f"--limit must be at least 1 (got {a.limit})")
    if a.samples < 1:
        raise DuetError(f"--samples must be at least 1 (got {a.samples})")
    if a.rounds < 1:
        raise DuetError(f"--rounds must be at least 1 (got {a.rounds})")
    return methods, alone, temps, gammas


def unpadded(a: argparse.Namespace, methods: list[str]) -> tuple[list[str], dict]:
    """Under --emulate, the methods left and the baselines skipped (with why): only Duet's own
    models can be wrapped; the baselines run their own loops."""
    if not a.emulate:
        return methods, {}
    skipped = {m: UNPADDED for m in methods if m in BASELINES}
    for m, why in skipped.items():
        print(f"skipping {m} under --emulate: {why}", file=sys.stderr)
    return [m for m in methods if m not in BASELINES], skipped


def load(a: argparse.Namespace, methods: list[str], alone: bool):
    """(pair, emulation or None, whether a draft is needed); --hybrid points the pair at the
    hybrid checkpoints (a torch target, the draft where runtime.generate runs it)."""
    if a.hybrid is not None:  # apps/bench/hybrid_pair.py
        from .hybrid_pair import hybrid_pair_dirs

        t, d = hybrid_pair_dirs(a.hybrid or None)
        a.target, a.draft, a.target_backend = str(t), str(d), "torch"
    need = any(m not in NEEDS_NO_DRAFT for m in methods) or (not alone and len(methods) > 1)
    pair = load_pair_from_args(a, need_draft=need or bool(a.drafts))
    if pair.tokenizer is None:
        raise DuetError(f"{pair.target_dir}: no tokenizer.json; the bench needs one")
    emu = None
    if a.emulate:
        from devices.emulated_model import emulate_pair

        emu, pair.target, pair.draft = emulate_pair(a.emulate, pair.target, pair.draft)
    return pair, emu, need


def build_runners(a, methods, pair, need, emu, peer_names, threads, skipped: dict) -> list:
    """Duet's runners (each γ, each --drafts draft, a second target backend), then the peers';
    what is skipped is added to `skipped`."""
    from .runners.peers import peer_runners, second_backend_runners
    from .sweep import sweep_runners

    runners = sweep_runners(methods, pair, a)
    if a.also_target_backend:  # Duet's methods again over a second target backend
        runners += second_backend_runners(methods, a, sweep_runners, need or bool(a.drafts))
    if emu is not None:  # the peers run their own loops: nothing to pad
        skipped |= {f"{x}:ar": UNPADDED for x in peer_names}
        peer_names = []
    peers, peer_skips = peer_runners(peer_names, pair, a, threads)
    skipped |= peer_skips
    for m, why in peer_skips.items():
        print(f"skipping {m}: {why}", file=sys.stderr)
    return runners + peers


def run(a: argparse.Namespace, runners: list, prompts: list, pair, temps: list[float]) -> list:
    """The alternated run's records; nothing it started is left running."""
    from runtime.chat_session import ChatTemplate

    from .runners.peers import close_runners
    from .schedule import run_bench

    ctx = min(
        [pair.target.config.max_context]
        + ([pair.draft.config.max_context] if pair.draft is not None else [])
    )
    try:
        return run_bench(
            runners,
            prompts,
            pair.tokenizer,
            ChatTemplate.load(pair.target_dir),
            temps=temps,
            top_p=a.top_p,
            max_new=a.max_tokens,
            seed=a.seed,
            context=ctx,
            warmup=not a.no_warmup,
            samples=a.samples,
            rounds=a.rounds,
        )
    finally:  # mirror's draft processes, if it ran any: nothing of the run is left running
        from runtime.mirror.draft_process import close_draft_hosts

        drafts = [getattr(getattr(r, "pair", None), "draft", None) for r in runners]
        close_draft_hosts(pair.draft, *drafts)
        close_runners(runners)  # the peers' llama-server processes


def run_settings(a, pair, prompts, temps, gammas, runners, threads) -> dict:
    """What the run was: model, pair, prompt count, token budget, γ, temperatures, threads."""
    model_id = a.model_id or (
        f"duet-{pair.target_dir.parent.name}" if a.target is None else pair.name
    )
    settings = {
        "model_id": model_id,
        "target": str(pair.target_dir),
        "draft": str(pair.draft_path),
        "prompts": len(prompts),
        "max_tokens": a.max_tokens,
        "gamma": a.gamma,
        "gammas": gammas,
        "temps": temps,
        "samples": a.samples,
        "rounds": a.rounds,
        "top_p": a.top_p,
        "threads": thread_settings(runners),
        **{k: pair.settings[k] for k in ("target_backend", "draft_backend") if k in pair.settings},
    }
    settings["threads"]["bench_threads"] = threads
    return settings


def thread_settings(runners: list) -> dict:
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mlx_device": mlx_device(),
        "runners": {r.name: r.settings() for r in runners},
    }


def mlx_device() -> str | None:
    """MLX's default device, or None where MLX is not installed (a CUDA machine)."""
    try:
        import mlx.core as mx
    except ImportError:
        return None
    return str(mx.default_device())
