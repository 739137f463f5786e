"""App. E Fig. 7 on our pair: fallback frequency FF against κ, one line per exit layer ℓe.

Each (ℓe, κ) point is a real Mirror-SD run over the prompts on its own
Timeline; FF is mirror_summary's `ff` (App. E's F_t averaged over steps), and
the bound 1 - Ω_κ comes from the same run.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from runtime.errors import DuetError
from runtime.mirror.summary import mirror_summary

from .run import Setup, run_mirror

KAPPAS = (1, 2, 4, 8, 16)
EXIT_FRACTIONS = (0.25, 0.5, 0.75)  # ℓe ∈ {N/4, N/2, 3N/4}


def exit_layers(num_layers: int, fractions=EXIT_FRACTIONS) -> list[int]:
    """round(f·N) clamped to 1..N-1, duplicates dropped (a 2-layer target has only ℓe = 1)."""
    if num_layers < 2:
        raise DuetError(f"the sweep needs a target with at least 2 layers (got {num_layers})")
    les = [min(max(round(f * num_layers), 1), num_layers - 1) for f in fractions]
    return list(dict.fromkeys(les))


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DuetError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not xs or any(x < 1 for x in xs):
        raise DuetError(f"{flag} must be integers >= 1, got {text!r}")
    return sorted(set(xs))


def run_sweep(setup: Setup, kappas: list[int], les: list[int]) -> list[dict]:
    """One row per (ℓe, κ): FF, Ω_κ, the bound, reuse and step time."""
    rows = []
    grid = [(le, k) for le in les for k in kappas]
    for le, k in tqdm(grid, desc="sweep", unit="run", file=sys.stderr, disable=None):
        run = run_mirror(setup, kappa=k, exit_layer=le, desc=f"ℓe={le} κ={k}", leave=False)
        s = mirror_summary(run.events, run.timeline)
        om = s["omega_kappa"]
        rows.append(
            {
                "exit_layer": le,
                "kappa": k,
                "ff": s["ff"],
                "omega_kappa": om,
                "one_minus_omega": None if om is None else 1 - om,
                "bound_holds": None if s["ff"] is None or om is None else s["ff"] <= 1 - om + 1e-12,
                "reuse_rate": s["reuse_rate"],
                "fallback_rate": s["fallback_rate"],
                "steps": s["steps"],
                "step_ms_measured": s["step_ms_measured"],
            }
        )
    return rows


def sweep_table(rows: list[dict]) -> str:
    head = ["ℓe", "κ", "FF", "1-Ω_κ", "FF<=1-Ω", "reuse", "steps", "step ms"]
    f = lambda v, p=3: "n/a" if v is None else f"{v:.{p}f}"  # noqa: E731
    body = [
        [
            r["exit_layer"],
            r["kappa"],
            f(r["ff"]),
            f(r["one_minus_omega"]),
            {True: "yes", False: "NO", None: "n/a"}[r["bound_holds"]],
            f(r["reuse_rate"]),
            r["steps"],
            f(r["step_ms_measured"], 2),
        ]
        for r in rows
    ]
    w = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    line = lambda cells: (  # noqa: E731
        "  ".join(str(c).ljust(n) for c, n in zip(cells, w, strict=False)).rstrip()
    )
    return "\n".join([line(head), line(["-" * n for n in w])] + [line(b) for b in body])
