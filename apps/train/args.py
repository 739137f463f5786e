"""The training loop's command-line flags, declared once for every `apps.train` subcommand.

The loop's flags (steps, learning rate, batch, seed, threads, checkpoints, resume) and the
inputs and output around it (--base, --corpus, --out).

Each subcommand passes the flags it takes, in the order it lists them, with its own defaults:

    add_loop_args(ap, out=REQUIRED, steps=2000, time_budget_min=None, lr=3e-3, threads=1)

A flag's name, type and help come from `LOOP_FLAGS`; the help states the default given, and
`helps` replaces it where a flag means more for that command (what a time budget covers).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from runtime.cli_parser import doc_parser

REQUIRED = object()  # a flag the command cannot run without (`--out` of most subcommands)


@dataclass(frozen=True)
class LoopFlag:
    """One flag: its argparse keywords and a help template (`{default}` is filled in)."""

    help: str
    kind: dict = field(default_factory=dict)  # type / action / choices for add_argument
    help_none: str | None = None  # the help when the default is None, if it says more


LOOP_FLAGS = {
    "base": LoopFlag("base target: a checkpoint directory or a known model's name "
                     "(smollm2-135m-instruct)"),
    "corpus": LoopFlag("directory of code (default: the stdlib)"),
    "max_corpus_chars": LoopFlag("train on the first N characters of the corpus's train files",
                                 {"type": int}),
    "out": LoopFlag("output directory"),
    "steps": LoopFlag("planned steps (default {default})", {"type": int},
                      "planned steps (default: as many as --time-budget-min allows)"),
    "time_budget_min": LoopFlag("wall-clock cap", {"type": float}),
    "lr": LoopFlag("peak learning rate (default {default})", {"type": float}),
    "warmup": LoopFlag("warm-up steps (default {default})", {"type": int}),
    "batch_size": LoopFlag("sequences per step (default {default})", {"type": int}),
    "seq_len": LoopFlag("training sequence length (default {default})", {"type": int}),
    "threads": LoopFlag("torch threads (default {default})", {"type": int}),
    "device": LoopFlag("train on the CPU or a CUDA GPU (default {default})",
                       {"choices": ["cpu", "cuda"]}),
    "seed": LoopFlag("random seed (default {default})", {"type": int}),
    "log_every": LoopFlag("steps between loss lines (default {default})", {"type": int}),
    "ckpt_every": LoopFlag("steps between checkpoints into OUT (default {default}; 0: end only)",
                           {"type": int}),
    "fresh": LoopFlag("ignore a resume state in OUT", {"action": "store_true"}),
    "resume": LoopFlag("continue a stopped run from OUT/.resume (same arguments); a finished "
                       "stage is kept, an unfinished one goes on from its last checkpoint",
                       {"action": "store_true"}),
}  # fmt: skip


def command_parser(name: str, description: str, **kw) -> argparse.ArgumentParser:
    """The parser of `python -m apps.train NAME`, its description printed as written."""
    return doc_parser(f"python -m apps.train {name}", description, **kw)


def number(v) -> str:
    """A default as the help writes it: 1e-3, not 0.001."""
    if isinstance(v, float) and v and abs(v) < 0.01:
        return f"{v:.0e}".replace("e-0", "e-")
    return str(v)


def loop_help(dest: str, default, helps: dict[str, str] | None = None) -> str:
    """The help of loop flag `dest` with this default (`helps[dest]` where given)."""
    flag = LOOP_FLAGS[dest]
    text = (helps or {}).get(dest) or (
        flag.help_none if default is None and flag.help_none else flag.help
    )
    return text.replace("{default}", number(default))


def add_loop_args(ap, helps: dict[str, str] | None = None, **defaults) -> None:
    """Add the loop flags named in `defaults` to `ap` (a parser or group), in that order.

    A default of `REQUIRED` makes the flag required; store-true flags take `False`. `helps`
    may hold a command's texts for flags added in several calls (one dict for the parser)."""
    unknown = (set(defaults) | set(helps or ())) - set(LOOP_FLAGS)
    if unknown:
        raise TypeError(f"add_loop_args: no loop flag {sorted(unknown)}")
    for dest, default in defaults.items():
        kw = dict(LOOP_FLAGS[dest].kind)
        if default is REQUIRED:
            kw["required"] = True
        elif kw.get("action") != "store_true":
            kw["default"] = default
        elif default is not False:
            raise TypeError(f"add_loop_args: --{dest} is a switch (False), not {default!r}")
        flag = "--" + dest.replace("_", "-")
        shown = None if default is REQUIRED else default
        ap.add_argument(flag, help=loop_help(dest, shown, helps), **kw)


def positive(a: argparse.Namespace, *names: str) -> None:
    """Raise DuetError unless each named flag (not None) is >= 1."""
    from runtime.errors import DuetError

    for name in names:
        v = getattr(a, name)
        if v is not None and v < 1:
            raise DuetError(f"--{name.replace('_', '-')} must be positive (got {v})")


def check_device(device: str) -> None:
    """Raise DuetError for `--device cuda` where PyTorch sees no GPU."""
    import torch

    from runtime.errors import DuetError

    if device == "cuda" and not torch.cuda.is_available():
        raise DuetError(f"--device cuda: PyTorch {torch.__version__} sees no CUDA GPU")
