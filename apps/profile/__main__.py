"""`python -m apps.profile`: profile Mirror-SD on a pair and a prompt set; or sweep FF against κ.

    python -m apps.profile --limit 8 --max-tokens 64 --out profile-out    # trace, picture, summary
    python -m apps.profile --json                                         # the summary as JSON
    python -m apps.profile --sweep --limit 2                              # App. E Fig. 7

Writes into --out: trace.json (Chrome trace of the whole run: one Timeline,
prompts one after another; open in Perfetto), timeline.html (self-contained
picture) and summary.json; with --sweep: sweep.json and sweep.html.
Defaults: the embedded pair and the held-out prompt set apps.bench uses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.arg_rules import at_least, check_max_tokens, check_sampling
from runtime.cli_args import (
    add_method_args,
    add_pair_args,
    check_method_args,
    load_pair_from_args,
)
from runtime.cli_parser import doc_parser
from runtime.decoding import Sampling
from runtime.decoding.mirror import check_mirror_args, draft_in_process
from runtime.errors import cli_main
from runtime.mirror.draft_process import close_draft_hosts
from runtime.preflight import writable_dir

LIMIT, SWEEP_LIMIT = 8, 2  # prompts: the sweep is 15 runs, keep it to minutes on 2 cores


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.profile", __doc__)
    add_pair_args(ap)
    ap.add_argument(
        "--prompts", default=None, help="prompt set .jsonl or folder (default apps/prompts/)"
    )
    ap.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"first N prompts (default {LIMIT}; {SWEEP_LIMIT} with --sweep)",
    )
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    ap.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy (default 0)")
    ap.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run")
    ap.add_argument(
        "--sweep", action="store_true", help="App. E Fig. 7: FF against κ for ℓe in N/4, N/2, 3N/4"
    )
    ap.add_argument(
        "--kappas", default="1,2,4,8,16", help="--sweep: κ values (default %(default)s)"
    )
    ap.add_argument(
        "--emulate",
        metavar="PROFILE[:MODEL][,real-vocab]",
        help="pad every stage to a device profile's prediction; output labelled emulated; "
        "append ',real-vocab' to pad the logits to its target's vocabulary too",
    )
    ap.add_argument("--out", default="profile-out", help="output folder (default ./profile-out)")
    ap.add_argument(
        "--json", action="store_true", help="print the summary (or sweep table) as JSON"
    )
    add_method_args(ap)  # --gamma, --kappa, --exit-layer, ...: mirror's are the ones it reads
    return ap


def check_args(a: argparse.Namespace) -> None:
    check_max_tokens(a.max_tokens)
    check_method_args(a, "mirror")  # --gamma, --kappa, --branches, ... as mirror checks them
    at_least("--draft-threads", a.draft_threads)
    at_least("--limit", a.limit)
    check_sampling(a.temp)


def make_setup(a: argparse.Namespace):
    from apps.bench.prompt_set import load_prompts

    from .run import Setup, prompt_ids

    limit = a.limit or (SWEEP_LIMIT if a.sweep else LIMIT)
    records = load_prompts(a.prompts, limit=limit)
    pair = load_pair_from_args(a, need_draft=True)
    emu = None
    if a.emulate:
        from devices.emulated_model import emulate_pair

        emu, pair.target, pair.draft = emulate_pair(a.emulate, pair.target, pair.draft)
    ids = prompt_ids(pair, records, a.max_tokens)
    in_process = draft_in_process(pair.target, pair.draft, a.draft_process)
    return Setup(
        pair,
        ids,
        a.max_tokens,
        a.gamma,
        Sampling(a.temp),
        a.seed,
        emu,
        a.branches,
        in_process,
        a.exit_head,
        a.draft_branches,
    )


def profile(a: argparse.Namespace, out: Path) -> dict:
    """The profile run: writes trace.json, timeline.html, summary.json; returns the summary."""
    from .picture import timeline_page
    from .run import run_mirror, summarize, warm_up

    setup = make_setup(a)
    le = check_mirror_args(setup.pair.target, a.gamma, a.kappa, a.exit_layer)
    try:
        if not a.no_warmup:
            warm_up(setup, kappa=a.kappa, exit_layer=le)
        run = run_mirror(setup, kappa=a.kappa, exit_layer=le)
    finally:
        close_draft_hosts(setup.pair.draft)
    s = summarize(run, setup, kappa=a.kappa, exit_layer=le)
    out.mkdir(parents=True, exist_ok=True)
    run.timeline.write(out / "trace.json", label=setup.label)
    (out / "timeline.html").write_text(timeline_page(run.timeline, s, setup.label))
    (out / "summary.json").write_text(json.dumps(s, indent=1))
    return s


def sweep(a: argparse.Namespace, out: Path) -> dict:
    """The App. E sweep: writes sweep.json and sweep.html; returns {"label", "settings", ...,
    "rows"}."""
    from .chart import sweep_page
    from .run import thread_settings, warm_up
    from .sweep import exit_layers, parse_ints, run_sweep

    kappas = parse_ints(a.kappas, "--kappas")
    setup = make_setup(a)
    n = setup.pair.target.config.num_layers
    les = exit_layers(n)
    for le in les:
        check_mirror_args(setup.pair.target, a.gamma, max(kappas), le)
    try:
        if not a.no_warmup:
            warm_up(setup, kappa=kappas[0], exit_layer=les[0])
        rows = run_sweep(setup, kappas, les)
    finally:
        close_draft_hosts(setup.pair.draft)
    title = "Duet Mirror-SD: FF against κ (App. E Fig. 7)" + (
        f" ({setup.emu.label})" if setup.emu else ""
    )
    info = {"emulated": setup.emu.label if setup.emu else None, "num_layers": n, "exit_layers": les,
            "kappas": kappas, "gamma": a.gamma, "temp": a.temp, "prompts": len(setup.prompts),
            "max_tokens": a.max_tokens, "seed": a.seed}  # fmt: skip
    res = {"label": title, **info, "threads": thread_settings(setup.pair), "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(res, indent=1))
    (out / "sweep.html").write_text(sweep_page(rows, info | res["threads"], title))
    return res


@cli_main
def main(argv: list[str] | None = None) -> int:
    from .report import summary_text
    from .sweep import sweep_table

    a = build_parser().parse_args(argv)
    check_args(a)
    out = writable_dir(a.out, "--out")
    if a.sweep:
        res = sweep(a, out)
        if a.json:
            print(json.dumps(res))
        else:
            if res["emulated"]:
                print(f"EMULATED: {res['emulated']}")
            print(res["label"])
            print(sweep_table(res["rows"]))
            print(f"wrote {out / 'sweep.json'}, {out / 'sweep.html'}")
        return 0
    s = profile(a, out)
    if a.json:
        print(json.dumps(s))
    else:
        print(summary_text(s))
        print(f"wrote {out / 'trace.json'}, {out / 'timeline.html'}, {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
