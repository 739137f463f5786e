"""`python -m apps.bench evolving`: FlexSpec's Table II, generic vs anchor draft on evolved targets.

Per-token acceptance (accepted / drafted, `sd`, γ = 4; greedy and T = 1) of the generic draft
and of the anchor draft (runtime/anchor.py) against the base target, each LoRA-evolved target
in the evolved folder's `lora-*/` (merged at load, runtime/adapter.py) and each fully
fine-tuned one in its `full-*/`. The base is the embedded target (its evolved folder
runtime/assets/evolving/, the full fine-tune out/evolving/full-stdlib-tests/, not committed) or
any checkpoint (`--base smollm2-135m-instruct`: the folder evolving/NAME/ in Duet's cache,
~/.cache/duet/evolving/NAME/ by default (runtime/paths.py), built by the commands `--help` ends
with). A missing full fine-tune is reported with the command that
rebuilds it. `--head` adds the base's fitted feature-level head (apps.train eagle; PyTorch, so
it reads each target's own embedding and LM head): it drafts from the target's features, so it
has no end-to-end column (the edge has no target). Any `anchor-*/` folder beside `anchor/`
adds its rows as an ablation (`apps.train anchor --keep-first K`: the base's first K blocks
kept too). Prompts are held-out documents of each target's own domain (apps/train/domains.py;
the base's: the stdlib held-out files), each cut to its first `--prompt-tokens` tokens; as a
control, the base also runs on each evolved domain's prompts (rows carry `prompts`, the domain
the prompts come from). All targets run on the PyTorch backend, the generic and anchor drafts
on ONNX Runtime.

`ms_per_token` is end-to-end greedy `--method flexspec` over one named link (`--link`, default
4g): **emulated link time (virtual clock) + measured compute**, with the LoRA-evolved targets
as adapters of one verifier over the base (apps/bench/evolving_e2e.py says how; each row also
carries the link's share, `link_ms_per_token`). `--link none` leaves it null.
"""

from __future__ import annotations

import argparse
import json
import sys

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main

from .evolving_rows import run
from .evolving_setup import REAL_RECIPE, evolving_dir


def summary(rows: list[dict]) -> list[str]:
    """Table II's two claims, computed from the rows (greedy and T = 1)."""
    by = {(r["draft"], r["target"], r["prompts"]): r for r in rows}
    lines = []
    for key in ("acceptance_greedy", "acceptance_t1"):
        for r in rows:
            if r["target"] == "base":
                continue
            base = by[(r["draft"], "base", "stdlib")][key]
            same = by.get((r["draft"], "base", r["prompts"]))
            pct = f"{100 * r[key] / base:.0f} %" if base else "n/a"
            ctl = ""
            if same and same[key]:
                ctl = (
                    f"; base on {r['prompts']} prompts {same[key]:.3f} "
                    f"({100 * r[key] / same[key]:.0f} %)"
                )
            lines.append(
                f"{key} {r['draft']:8s} {r['target']:22s} {r[key]:.3f} = "
                f"{pct} of its base {base:.3f}{ctl}"
            )
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser(
        "python -m apps.bench evolving",
        __doc__,
        epilog="A real base's evolved folder (SmolLM2 shown; then run "
        "with --base NAME --head):\n"
        + REAL_RECIPE.format(
            name="smollm2-135m-instruct", last=29, evolved=evolving_dir() / "smollm2-135m-instruct"
        ),
    )
    ap.add_argument(
        "--base",
        default=None,
        help="base target: a checkpoint or a known model's name (default: the embedded target)",
    )
    ap.add_argument(
        "--evolved",
        default=None,
        help="folder of the evolved targets (lora-*/, full-*/) and the anchor "
        "(anchor/) (default: runtime/assets/evolving for the embedded base, "
        f"{evolving_dir()}/NAME otherwise)",
    )
    ap.add_argument(
        "--generic",
        default=None,
        help="the generic draft (default: the embedded draft, or EVOLVED/generic*)",
    )
    ap.add_argument(
        "--head",
        action="store_true",
        help="add the base's fitted feature-level head (acceptance only)",
    )
    ap.add_argument(
        "--drafts",
        default=None,
        help="comma-separated drafts to run, of generic, anchor, anchor-*, head "
        "(default: every one found)",
    )
    ap.add_argument("--prompts", type=int, default=10, help="held-out prompts per target (10)")
    ap.add_argument("--prompt-tokens", type=int, default=48, help="tokens per prompt (48)")
    ap.add_argument("--max-tokens", type=int, default=48, help="new tokens per prompt (48)")
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens per step (4)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch target threads (1)")
    ap.add_argument(
        "--link",
        default="4g",
        help="named link of the end-to-end flexspec column: 5g, 4g, wifi-weak, none "
        "(default 4g; its time is emulated on a virtual clock)",
    )
    ap.add_argument(
        "--k",
        type=int,
        default=None,
        help="end-to-end: fixed draft length K (default adaptive K*, eq. 11)",
    )
    ap.add_argument(
        "--no-controls",
        action="store_true",
        help="skip the base target on each evolved domain's prompts",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if min(a.prompts, a.prompt_tokens, a.max_tokens, a.gamma, a.threads) < 1:
        raise DuetError("--prompts, --prompt-tokens, --max-tokens, --gamma, --threads must be >= 1")
    from devices.links import LINK_NAMES

    if a.link not in LINK_NAMES:
        raise DuetError(f"unknown --link {a.link!r}; choose from {', '.join(LINK_NAMES)}")
    if a.k is not None and a.k < 1:
        raise DuetError(f"--k must be at least 1 (got {a.k})")
    res = run(a)
    if a.json:
        print(json.dumps(res))
        return 0
    print(
        f"{'draft':8s} {'target':22s} {'prompts':13s} {'acc greedy':>10s} {'acc T=1':>8s}  "
        f"ms/token ({a.link}: emulated link time + measured compute)"
    )
    for r in res["rows"]:
        e2e = (
            f"{r['ms_per_token']:8.1f} (link {r['link_ms_per_token']:.1f})"
            if r["ms_per_token"] is not None
            else f"null ({r['ms_per_token_reason']})"
        )
        print(
            f"{r['draft']:8s} {r['target']:22s} {r['prompts']:13s} {r['acceptance_greedy']:10.3f} "
            f"{r['acceptance_t1']:8.3f}  {e2e}"
        )
    print("\n".join(summary(res["rows"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
