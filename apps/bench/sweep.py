"""The runners of a comparison: one per method, and with `--gammas` one per method and γ.

`make_runners` turns method names into runners (Duet's methods, mlx-lm, HF); `sweep_runners`
repeats the drafting ones once per γ of `--gammas` (named METHOD@gG) and adds the `--drafts`
variants (apps/bench/drafts.py). The peers are added by apps/bench/runners/peers.py.
"""

from __future__ import annotations

from runtime.cli_args import AUTO, auto_chooser, auto_options, method_kwargs

from .args import BASELINES, parse_gammas


def sweep_runners(methods: list[str], pair, a) -> list:
    """The runners of `methods` (and of every --drafts draft), once per γ of --gammas; with more
    than one γ, each drafting runner is named METHOD@gG (ar runs once)."""
    from copy import copy

    from runtime.drafts import is_model_free_spec
    from runtime.drafts.mixed import is_mixed_spec

    from .drafts import extra_runners, label

    gammas = parse_gammas(getattr(a, "gammas", None), a.gamma)
    runners, pairs = [], {}
    for i, g in enumerate(gammas):
        ag = copy(a)
        ag.gamma = g
        # ar, the methods that take no γ (tree, heterospec: --depth) and an auto that picks
        # its own γ (no --gamma) run once, unsuffixed
        ms = methods if i == 0 else [m for m in methods if sweeps(m, a)]
        if not ms:  # nothing here takes γ (e.g. ar,tree): one pass is the whole sweep
            break
        rs = make_runners(ms, pair, ag)
        if is_model_free_spec(a.draft) or is_mixed_spec(a.draft):  # sd+lookup, sd+head+suffix
            for r in rs:
                if r.name not in ("ar", AUTO, *BASELINES):
                    r.name = f"{r.name}+{label(a.draft)}"
        rs += extra_runners(ms, pair, ag, make_runners, skip=(*BASELINES, AUTO), pairs=pairs)
        if len(gammas) > 1:
            for r in rs:
                if sweeps(getattr(r, "method", r.name), a):
                    r.name = f"{r.name}@g{g}"
        runners += rs
    return runners


def sweeps(method: str, a) -> bool:
    """Does --gammas run `method` once per γ? Not ar, tree, heterospec, nor a free auto."""
    if method == AUTO and getattr(a, "gamma_free", False):
        return False
    return takes_gamma(method)


def takes_gamma(method: str) -> bool:
    """Does `method` draft γ tokens per step (so --gammas sweeps it)?"""
    from dataclasses import fields

    from runtime.decoding import method_module

    if method in ("ar", "hf"):
        return False
    if method in BASELINES or method == AUTO:
        return True
    return "gamma" in {f.name for f in fields(method_module(method).Options)}


def make_runners(methods: list[str], pair, a) -> list:
    from .runners.duet import DuetRunner

    runners = []
    for m in methods:
        if m == "mlx-lm":
            from .runners.mlx_lm import MlxLmRunner

            runners.append(MlxLmRunner(pair, gamma=a.gamma))
        elif m in ("hf-assisted", "hf"):
            from .runners.hf import HfAssistedRunner

            runners.append(HfAssistedRunner(pair, gamma=a.gamma, alone=m == "hf"))
        else:
            options = {k: v for k, v in method_kwargs(a).items() if k != "gamma"}
            chooser = auto_chooser(auto_options(a), pair) if m == AUTO else None
            runners.append(DuetRunner(m, pair, gamma=a.gamma, chooser=chooser, **options))
    return runners
