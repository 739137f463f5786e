"""A method option that is also a command-line flag.

    @dataclass
    class Options:
        kappa: int = flag(8, "mirror: top-κ width of the early-exit message (default 8)")

`flag` is a dataclass field whose metadata carries the flag's help, type and choices;
runtime/cli_args_methods.py turns every such field of every method's `Options` into one
argparse flag (`--kappa`), in a group per method, the same for every command. A field made
with plain `field()` or a bare default is an option only (set by code or by another group).
"""

from __future__ import annotations

from dataclasses import Field, field


def flag(default, help: str, *, type=int, choices: tuple | None = None, name: str | None = None):
    """A dataclass field that is the flag `--<name with dashes>` (default: the field's name)."""
    meta = {"help": help, "type": type, "choices": choices, "flag": name}
    return field(default=default, metadata=meta)


def is_flag(f: Field) -> bool:
    """Is this Options field a command-line flag?"""
    return "help" in f.metadata


def flag_name(f: Field) -> str:
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")
