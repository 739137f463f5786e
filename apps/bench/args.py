"""What the comparison's list flags mean: `--methods`, `--temps` and `--gammas` as checked lists,
and which methods run without a draft. The flags are declared in __main__.py's build_parser,
but for `--temps`, which every bench that sweeps temperatures declares through add_temps_arg."""

from __future__ import annotations

from runtime.cli_args import AUTO
from runtime.decoding import METHODS
from runtime.errors import DuetError

BASELINES = ("mlx-lm", "hf-assisted", "hf")
NEEDS_NO_DRAFT = ("ar", AUTO, "mlx-lm", "hf")  # with a target alone: mlx-lm and auto run it alone
ALONE_METHODS = "ar,hf,mlx-lm"  # the default rows for a target alone (--target, no --draft)


def parse_methods(text: str) -> list[str]:
    ms = [m.strip() for m in text.split(",") if m.strip()]
    known = (*METHODS, AUTO, *BASELINES)
    bad = [m for m in ms if m not in known]
    if bad:
        raise DuetError(f"--methods: unknown {', '.join(bad)}; choose from {', '.join(known)}")
    return ["ar"] + [m for m in dict.fromkeys(ms) if m != "ar"]


def parse_numbers(text: str, flag: str, cast, least) -> list:
    """A comma-separated `flag` value as numbers >= `least` (DuetError otherwise)."""
    kind = "integers" if cast is int else "numbers"
    try:
        xs = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DuetError(f"{flag} must be comma-separated {kind}, got {text!r}") from None
    if not xs or any(x < least for x in xs):
        raise DuetError(f"{flag} must be {kind} >= {least}, got {text!r}")
    return xs


def add_temps_arg(ap, default: str) -> None:
    """--temps: the temperatures a bench runs each prompt at, read by `parse_temps`."""
    ap.add_argument(
        "--temps", default=default, help=f"comma-separated temperatures (default {default})"
    )


def parse_temps(text: str) -> list[float]:
    return parse_numbers(text, "--temps", float, 0)


def parse_gammas(text: str | None, default: int) -> list[int]:
    """`--gammas` as distinct values >= 1, or [default] when not given."""
    if text is None:
        return [default]
    return list(dict.fromkeys(parse_numbers(text, "--gammas", int, 1)))
