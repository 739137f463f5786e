"""One check per argument rule: every command and every method asks these, so a rule (γ ≥ 1,
a temperature ≥ 0, ...) is written, and worded, once. Each raises a one-line DuetError naming
the flag the user gave."""

from __future__ import annotations

from runtime.errors import DuetError


def at_least(flag: str, value, least: int = 1, *, context: str = "") -> None:
    """`flag` (e.g. "--kappa") must be >= `least`; None (not given) passes."""
    if value is not None and value < least:
        raise DuetError(f"{flag} must be at least {least}{context} (got {value})")


def check_gamma(gamma, method: str | None = None) -> None:
    """γ ≥ 1 for every method that drafts (all but ar; None: every method of a run)."""
    if method != "ar":
        at_least("--gamma", gamma, context=f" for --method {method}" if method else "")


def check_max_tokens(n: int) -> None:
    at_least("--max-tokens", n)


def check_sampling(temp: float, top_p: float = 1.0, top_k: int = 0) -> None:
    """A temperature ≥ 0, a nucleus mass in (0, 1] and a top-k ≥ 0."""
    if temp < 0:
        raise DuetError(f"--temp must be >= 0 (got {temp})")
    if not 0 < top_p <= 1:
        raise DuetError(f"--top-p must be in (0, 1] (got {top_p})")
    if top_k < 0:
        raise DuetError(f"--top-k must be >= 0 (got {top_k})")
