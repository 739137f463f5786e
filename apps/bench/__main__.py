"""`python -m apps.bench`: Duet vs target-alone, mlx-lm and HF assisted generation, one process.

    python -m apps.bench --limit 20 --max-tokens 128 --temps 0,1 --json
    python -m apps.bench --methods ar,sd,mlx-lm --out answers/   # Spec-Bench answer files
    python -m apps.bench edge --links 5g,4g,wifi-weak           # edge-cloud (apps/bench/edge.py)
    python -m apps.bench --methods ar,sd --drafts mtp            # sd+mtp: the target's MTP head
    python -m apps.bench --methods ar,sd,mirror --gammas 2,4     # sd@g2, sd@g4, ...: a γ sweep
    python -m apps.bench footprint --target smollm2-135m-instruct  # ar vs HF: tok/s, peak RSS
    python -m apps.bench scale --shapes smollm2-1.7b  # a 1.7 B shape vs llama.cpp (random weights)
    python -m apps.bench --target smollm2-135m-instruct --peers all --threads 2 --per-category
                                                       # llama.cpp, ort-genai, HF, mlx-lm rows

Defaults: the embedded pair and the held-out prompt set in apps/prompts/.
Methods: any of runtime.decoding.METHODS, plus `mlx-lm` (speculative_generate_step)
and `hf-assisted` (transformers assisted generation); `ar` always runs, it is
the baseline for speedups and for the greedy equality check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from runtime.cli_args import AUTO, add_auto_args, add_method_args, add_pair_args
from runtime.cli_parser import doc_parser
from runtime.decoding import METHODS
from runtime.errors import DuetError, cli_main

from .args import ALONE_METHODS, BASELINES, add_temps_arg
from .categories import add_category_args
from .compare import bench
from .runners.peers import add_peer_args

# `python -m apps.bench NAME ...`: one module per subcommand, each with its own main(argv)
SUBCOMMANDS = {
    "edge": ("edge", "FlexSpec edge-cloud baselines over emulated links (--codecs: the uplinks)"),
    "footprint": ("footprint", "Duet's ar against HF generate, a fresh process each: tok/s, RSS"),
    "evolving": ("evolving", "FlexSpec Table II: generic vs anchor draft on evolved targets"),
    "scale": ("scale", "users' model sizes (random-weight GGUFs): load, memory, disk, speed"),
    "turns": ("turns", "a chat's prefill per turn, and the cold first token, vs llama.cpp"),
}
# old spellings still accepted anywhere in the arguments (deprecated): flag -> subcommand
DEPRECATED = {"--edge": "edge"}


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.bench", __doc__, epilog=subcommand_help())
    add_pair_args(ap)
    ap.add_argument(
        "--hybrid",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="bench the hybrid Qwen3.5 pair built by `python -m apps.train --arch "
        "qwen3_5` (DIR/target, DIR/draft; default out/hybrid): the target on "
        "PyTorch, the draft on --draft-backend (default onnx, as runtime.generate "
        "runs it); a missing pair is answered with the command that builds it",
    )
    ap.add_argument(
        "--prompts",
        default=None,
        help="prompt set .jsonl or folder, or `chat` (Spec-Bench's six categories for chat "
        "models, apps/prompts/chat/) (default apps/prompts/)",
    )
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    add_category_args(ap)
    ap.add_argument("--categories", default=None, help="comma-separated categories to keep")
    ap.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated, from {', '.join((*METHODS, AUTO, *BASELINES))}; auto: the "
        "method the latency model predicts fastest, per prompt; hf: Hugging Face generate, the "
        "target alone (default: ar,sd,mirror,mlx-lm,hf-assisted; with --target and no --draft, "
        f"{ALONE_METHODS})",
    )
    add_auto_args(ap)
    add_peer_args(ap)
    ap.add_argument(
        "--drafts",
        default=None,
        help="more drafts, comma-separated (`mtp`: the target's own MTP head, `mtp-fp32`: its "
        "float32 ONNX step, or a path): every "
        "drafting method also runs with each, as METHOD+NAME, alternated (apps/bench/drafts.py)",
    )
    ap.add_argument(
        "--gammas",
        default=None,
        metavar="G1,G2,...",
        help="sweep γ instead: every method that takes γ runs once per value, as METHOD@gG "
        "(ar, tree and heterospec once), alternated in one run (Mirror-SD Fig. 3: latency "
        "against draft size x γ)",
    )
    add_method_args(ap)  # --gamma and the methods' own flags (--kappa, --tree-k, ...)
    add_temps_arg(ap, "0,1")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0 = off)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per turn (default 128)")
    ap.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i")
    ap.add_argument(
        "--samples",
        type=int,
        default=1,
        help="draws per prompt at T > 0 (draw k: seed + i + k * prompts), pooled in "
        "the rows: one draw compares methods on different sampled texts "
        "(default 1)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat the whole alternated schedule this many times, pooled in the "
        "rows (the same texts; the runner order rotated each round): for goals "
        "of a few percent on a noisy machine (default 1)",
    )
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    ap.add_argument(
        "--emulate",
        metavar="PROFILE[:MODEL][,real-vocab]",
        help="pad Duet's target and draft passes to a device profile (python -m devices list); "
        "the mlx-lm and HF baselines cannot be padded and are skipped; output labelled emulated; "
        "append ',real-vocab' to pad the logits to the emulated target's vocabulary as well",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument(
        "--json-out",
        default=None,
        metavar="FILE",
        help="also write that JSON object (settings, rows, per-category rows, "
        "mismatches) to FILE, beside the table",
    )
    ap.add_argument(
        "--out", default=None, help="write Spec-Bench answer JSONL files to this folder"
    )
    ap.add_argument(
        "--model-id", default=None, help="model_id in the answer files (default: target folder)"
    )
    return ap


def subcommand_help() -> str:
    width = max(map(len, (*SUBCOMMANDS, *DEPRECATED))) + 2
    subs = "".join(f"  {n:{width}s}{h}\n" for n, (_, h) in SUBCOMMANDS.items())
    old = "".join(
        f"  {o:{width}s}the old spelling of `{n}` (deprecated, still accepted)\n"
        for o, n in DEPRECATED.items()
    )
    return "subcommands (python -m apps.bench NAME --help):\n" + subs + old.rstrip("\n")


def subcommand(argv: list[str]) -> tuple[str, list[str]] | None:
    """The subcommand `argv` asks for and its own arguments, or None for the comparison."""
    for old, name in DEPRECATED.items():
        if old in argv:
            return name, [x for x in argv if x != old]
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return argv[0], argv[1:]
    return None


@cli_main
def main(argv: list[str] | None = None) -> int:
    from .categories import category_report
    from .report import table
    from .specbench import write_answers

    argv = list(sys.argv[1:] if argv is None else argv)
    if sub := subcommand(argv):
        import importlib

        name, rest = sub
        return importlib.import_module(f".{SUBCOMMANDS[name][0]}", __package__).main(rest)
    a = build_parser().parse_args(argv)
    if a.out:  # before the run, not after it
        from runtime.preflight import writable_dir

        writable_dir(a.out, "--out")
    if a.json_out and not os.path.isdir(os.path.dirname(os.path.abspath(a.json_out))):
        raise DuetError(f"--json-out {a.json_out}: its folder does not exist")
    res = bench(a)
    if a.out:
        files = write_answers(a.out, res["records"], res["settings"]["model_id"])
        print(f"wrote {len(files)} Spec-Bench answer files to {a.out}", file=sys.stderr)
    out = {k: res[k] for k in ("settings", "rows", "categories", "mismatches")}
    if "emulated" in res["settings"]:
        out = {"emulated": res["settings"]["emulated"]} | out
    if a.json_out:
        from pathlib import Path

        Path(a.json_out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.json_out}", file=sys.stderr)
    if a.json:
        print(json.dumps(out))
        return 0
    s = res["settings"]
    if "emulated" in s:
        print(f"{s['emulated']}: Duet's stages padded to the profile, not measured on it")
    print(
        f"{s['model_id']}: {s['prompts']} prompts, max {s['max_tokens']} tokens, gamma {s['gamma']}"
    )
    print(f"threads: {json.dumps(s['threads'])}")
    print(table(res["rows"]))
    if extra := category_report(res, a.per_category):  # Spec-Bench's table, skipped peers
        print(extra)
    for m in res["mismatches"]:
        print(
            f"greedy mismatch: {m['method']} on question {m['question_id']} differs from "
            f"{m.get('own_ar', 'ar')} "
            f"at token {m['first_diff']}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
