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


class DuetError(Exception):
    """An error the user can fix; its message names the problem and what to do."""


def cli_main(fn: Callable[..., int | None]) -> Callable[..., int]:
    """Wrap a CLI `main` so a DuetError becomes one stderr line and exit code 2."""

    @wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs) or 0
        except DuetError as e:
            prog = (sys.argv[0].rsplit("/", 1)[-1] or "duet").removesuffix(".py")
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper
