"""The decoding methods' flags, made once from each method's `Options` for every command.

Every field of a method's Options made with runtime/decoding/flags.py's `flag` becomes one
flag (`kappa` -> `--kappa`), with the field's default, type, choices and help; a flag that
several methods take (tree and heterospec's `--tree-k`) is declared once, its help prefixed
with the methods that take it, in an argparse group named after them. `--gamma` (every
drafting method's γ, which `--method auto` may pick) heads them. runtime.generate,
runtime.chat, apps.server, apps.bench and apps.profile all call `add_method_args`, so they
take the same flags with the same defaults and help (tests/test_method_flags.py holds them
to it). The edge flags (`--method flexspec`) are their own group: runtime/edge/cli_args.py.
"""

from __future__ import annotations

import argparse
from dataclasses import Field, fields

from runtime.arg_rules import check_gamma, check_max_tokens, check_sampling
from runtime.decoding import METHODS, method_module, method_options
from runtime.decoding.flags import flag_name, is_flag
from runtime.errors import DuetError

DEFAULT_GAMMA = 4  # draft tokens per step when --gamma is not given (auto: its own pick)
# options every command passes through to the method besides the generated flags: --gamma,
# and --draft-process / --draft-thread (placement flags of runtime/cli_args.py add_pair_args)
SHARED_OPTIONS = ("gamma", "draft_process")


def method_flags() -> dict[str, tuple[Field, tuple[str, ...]]]:
    """option name -> (its Options field, the methods that take it), in METHODS order."""
    out: dict[str, tuple[Field, tuple[str, ...]]] = {}
    for m in METHODS:
        for f in fields(method_module(m).Options):
            if not is_flag(f):
                continue
            if f.name in out:
                first = out[f.name][0]
                if (first.default, first.metadata) != (f.default, f.metadata):
                    raise AssertionError(f"--{f.name}: {m}'s default or help differs")
                out[f.name] = (first, (*out[f.name][1], m))
            else:
                out[f.name] = (f, (m,))
    return out


def add_gamma_arg(ap) -> None:
    """--gamma, whose absence `--method auto` reads as "choose γ too" (resolve_gamma)."""
    from devices.method_choice import AUTO_GAMMAS

    ap.add_argument(
        "--gamma",
        type=int,
        default=None,
        help=f"draft tokens per step (default {DEFAULT_GAMMA}; --method auto "
        f"picks it among {','.join(map(str, AUTO_GAMMAS))} unless given)",
    )


def add_method_args(ap: argparse.ArgumentParser) -> None:
    """--gamma and every method's flags, in a group per set of methods that take them."""
    add_gamma_arg(ap.add_argument_group("speculation (every drafting method)"))
    groups: dict[tuple[str, ...], argparse._ArgumentGroup] = {}
    for f, methods in method_flags().values():
        g = groups.get(methods)
        if g is None:
            title = "--method " + " / ".join(methods)
            g = groups[methods] = ap.add_argument_group(title)
        kw = {
            "type": f.metadata["type"],
            "default": f.default,
            "dest": f.name,
            "help": f"{', '.join(methods)}: {f.metadata['help']}",
        }
        if f.metadata.get("choices"):
            kw["choices"] = f.metadata["choices"]
        g.add_argument(flag_name(f), **kw)


def method_kwargs(a: argparse.Namespace) -> dict:
    """The methods' options from the flags of add_method_args (and --draft-process): what a
    command hands its session (each method takes those its Options names)."""
    names = (*SHARED_OPTIONS, *method_flags())
    return {k: getattr(a, k) for k in names if hasattr(a, k)}


def resolve_gamma(a: argparse.Namespace) -> None:
    """a.gamma_free: no --gamma was given; a.gamma: the given value or DEFAULT_GAMMA.
    A command without --gamma (apps.bench --edge's per-temperature checks) is left alone."""
    if not hasattr(a, "gamma"):
        return
    if getattr(a, "gamma_free", None) is None:
        a.gamma_free = a.gamma is None
    if a.gamma is None:
        a.gamma = DEFAULT_GAMMA


def check_decoding_args(a: argparse.Namespace) -> None:
    """One clear error for an out-of-range --max-tokens, --temp, --top-p, --top-k or --gamma."""
    resolve_gamma(a)
    check_max_tokens(a.max_tokens)
    check_sampling(a.temp, getattr(a, "top_p", 1.0), getattr(a, "top_k", 0))
    check_gamma(getattr(a, "gamma", 1), getattr(a, "method", "mirror"))


def check_method_args(a: argparse.Namespace, method: str | None = None) -> None:
    """The method's own checks of its flags (its `check`), and a placement flag
    (--draft-process / --draft-thread) given with a method that has no draft worker to place.
    `method`: the one to check (default a.method; "auto" checks γ only)."""
    resolve_gamma(a)
    method = method or a.method
    check_gamma(a.gamma, method)
    if method in METHODS:
        method_module(method).check(method_options(method, **method_kwargs(a)))
    place = getattr(a, "draft_process", None)
    takers = [m for m in METHODS if "draft_process" in _names(m)]
    if place is not None and method not in (*takers, "auto"):
        flag = "--draft-process" if place else "--draft-thread"
        raise DuetError(f"{flag} places Mirror-SD's draft worker; use it with --method mirror")


def _names(method: str) -> set[str]:
    return {f.name for f in fields(method_module(method).Options)}
