"""Per-category rows, as Spec-Bench's speed.py prints them: one line per method, a column per
category with its speedup over its own `ar`, then its mean tokens per step and the overall
speedup (and here also the overall tok/s and its greedy equality with its own `ar`).

The figures are report.summarize's, over each category's records alone; `own_ar` maps a runner
to the `ar` it is measured against (a peer's own, apps/bench/runners/peers.py).
"""

from __future__ import annotations

from .report import summarize

# Spec-Bench's column titles for the chat set's categories (apps/prompts/chat/chat.jsonl)
TITLES = {
    "mt_bench": "Multi-turn",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "QA",
    "math_reasoning": "Math",
    "rag": "RAG",
}


def add_category_args(ap) -> None:
    ap.add_argument(
        "--per-category-limit",
        type=int,
        default=None,
        metavar="N",
        help="first N prompts of each category only",
    )
    ap.add_argument(
        "--per-category",
        action="store_true",
        help="also print Spec-Bench's per-category table (the JSON always has it)",
    )


def category_report(res: dict, tables: bool) -> str:
    """What the bench prints under its table: the per-category tables (when `tables`), one
    per temperature, and a line per skipped peer with why."""
    s = res["settings"]
    out = ["\n" + category_table(res["categories"], t) for t in s["temps"]] if tables else []
    out += [f"skipped {m}: {why}" for m, why in s.get("skipped", {}).items()]
    return "\n".join(out)


def by_category(
    records: list[dict], methods: list[str], temps: list[float], own_ar: dict | None = None
) -> dict[str, list[dict]]:
    """{category: summarize rows over that category's records}, categories in first-seen
    order, plus "overall" over every record."""
    cats = list(dict.fromkeys(r["category"] for r in records))
    out = {
        c: summarize([r for r in records if r["category"] == c], methods, temps, own_ar)
        for c in cats
    }
    out["overall"] = summarize(records, methods, temps, own_ar)
    return out


def category_table(per_cat: dict[str, list[dict]], temp: float) -> str:
    """The Spec-Bench table at one temperature: speedup per category, mean tokens per step,
    overall speedup, overall tok/s, greedy = own ar."""
    cats = [c for c in per_cat if c != "overall"]
    overall = [r for r in per_cat["overall"] if r["temp"] == temp]
    cell = {(c, r["method"]): r for c in cats for r in per_cat[c] if r["temp"] == temp}
    head = ["method", *(TITLES.get(c, c) for c in cats), "tok/step", "Overall", "tok/s",
            "= own ar"]  # fmt: skip
    body = []
    for r in overall:
        if "refused" in r:
            continue
        m = r["method"]
        body.append(
            [
                m,
                *(_x(cell.get((c, m), {}).get("speedup")) for c in cats),
                "n/a" if r["mean_accepted"] is None else f"{r['mean_accepted']:.2f}",
                _x(r["speedup"]),
                f"{r['tokens_per_s']:.1f}",
                r["matches_ar"] or "",
            ]
        )
    w = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    line = lambda cells: (  # noqa: E731
        "  ".join(str(c).ljust(n) for c, n in zip(cells, w, strict=False)).rstrip()
    )
    title = f"per category, temp {temp:g} (speedup over each row's own ar)"
    return "\n".join([title, line(head), line(["-" * n for n in w]), *(line(b) for b in body)])


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"
