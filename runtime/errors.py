"""User-facing errors.

A `DuetError` is something the *user* caused (a bad path, a mismatched pair, an
argument out of range). Command-line entry points catch it and print its message
as one line on stderr with a non-zero exit, never a traceback. Internal
invariants use `assert`; bugs stay tracebacks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path


class DuetError(Exception):
    """An error the user can fix; its message names the problem and what to do."""


def _prog() -> str:
    """`runtime.generate` for `python -m runtime.generate`, `converters` for a package's
    __main__."""
    parts = Path(sys.argv[0] or "duet").with_suffix("").parts
    if parts and parts[-1] == "__main__":
        return parts[-2] if len(parts) > 1 else "duet"
    return ".".join(parts[-2:]) if len(parts) > 1 else parts[-1]


def cli_main(fn: Callable[..., int | None]) -> Callable[..., int]:
    """Wrap a CLI `main` so a DuetError becomes one stderr line and exit code 2."""

    @wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs) or 0
        except DuetError as e:
            print(f"{_prog()}: error: {e}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper
