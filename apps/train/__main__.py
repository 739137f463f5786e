"""`python -m apps.train`: train the embedded default target/draft pair.

A thin command line over `pipeline.train_pair`; see `--help`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main

from .args import REQUIRED, add_loop_args, number
from .configs import ARCHS, DRAFT, TARGET, parse_shape
from .corpus import DEFAULT_EXCLUDE_DIRS, DEFAULT_INCLUDE
from .pipeline import TrainArgs, train_pair

# `python -m apps.train NAME ...`: one module per subcommand, each with its own main(argv)
SUBCOMMANDS = {
    "evolve": ("evolve", "evolve the target (FlexSpec): LoRA or full fine-tuning on a domain"),
    "anchor": ("anchor", "train FlexSpec's anchor draft against the base target"),
    "bins": ("bins", "fit HeteroSpec's entropy bins for a target/draft pair"),
    "exit-head": ("exit_head", "fit the tuned exit head of a target for Mirror-SD"),
    "mtp": ("mtp", "fit a multi-token-prediction head to a target"),
    "eagle": ("eagle", "fit a feature-level draft head (EAGLE-3 + FR-Spec) to a target"),
    "ss-draft": ("ss_draft", "distil a speculative-streaming draft from a target"),
    "draft-tune": ("draft_tune", "fine-tune a draft against its target (KL + TV)"),
    "gather-corpus": ("gather_corpus", "gather a larger corpus (V = 16384)"),
}

DESCRIPTION = """\
Train a target/draft pair for speculative decoding from scratch on a corpus of code:
a byte-level BPE tokenizer, a Qwen3 target (next-token loss), then a Qwen3 draft
distilled from the saved target (KL to its logits). Whole files are held out for
evaluation; the end reports held-out loss of both and the draft's greedy acceptance.
Writes OUT/target, OUT/draft (Hugging Face dirs, bf16), split.json, loss_log.jsonl,
training_report.json."""

EPILOG = """\
the embedded default pair was made with:
  nice -n 10 python -m apps.train --out runtime/assets/default --time-budget-min 85 --threads 1
(its training_report.json records the step counts that reproduce it without timing)
evaluate an existing pair: python -m apps.train.evaluate OUT
write the prompt set:      python -m apps.train.prompts
subcommands (python -m apps.train NAME --help):
"""

ARCH_HELP = (
    "qwen3 (default; the embedded pair) or qwen3_5: hybrid Gated DeltaNet / gated attention "
    "layers 3 : 1 (qwen3_5_text), on the embedded pair's tokenizer; e.g. nice -n 10 python -m "
    "apps.train --arch qwen3_5 --out out/hybrid --time-budget-min 35 --threads 1"
)

# where a loop flag means more here than in LOOP_FLAGS (apps/train/args.py)
HELPS = {
    "out": "output directory (created; target/ and draft/ are replaced)",
    "corpus": "directory of text/code files (default: this Python's standard library source)",
    "time_budget_min": "wall-clock budget for the whole run: step counts not given are planned "
    "from measured step times, and each stage's schedule is cut to fit",
    "seed": "seed for python, numpy and torch (default {default})",
    "threads": "torch intra-op threads (default {default}; on a machine busy with other work 1 "
    "is faster, as no thread waits for a descheduled sibling)",
    "device": "train on the CPU or a CUDA GPU (default {default}); the evaluation runs on the CPU",
}


def _shape_str(s) -> str:
    return ",".join(
        str(v)
        for v in (
            s.hidden_size,
            s.num_layers,
            s.intermediate_size,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
        )
    )


def _data_args(g) -> None:
    add_loop_args(g, out=REQUIRED, corpus=None, helps=HELPS)
    g.add_argument(
        "--include",
        nargs="+",
        default=list(DEFAULT_INCLUDE),
        metavar="GLOB",
        help="file name patterns to train on (default: *.py)",
    )
    g.add_argument(
        "--exclude-dirs",
        nargs="*",
        default=list(DEFAULT_EXCLUDE_DIRS),
        metavar="NAME",
        help=f"directory names to skip (default: {' '.join(DEFAULT_EXCLUDE_DIRS)})",
    )
    for flag, kind, default, what in (
        ("--heldout-frac", float, 0.05, "fraction of files held out"),
        ("--vocab-size", int, 4096, "BPE vocabulary size"),
    ):
        g.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    add_loop_args(g, seq_len=512, batch_size=8)


def _model_args(m) -> None:
    m.add_argument("--arch", choices=ARCHS, default="qwen3", help=ARCH_HELP)
    for role, shape, what in (
        ("target", TARGET, "target hidden,layers,ffn,heads,kv_heads,head_dim (default {}, untied)"),
        ("draft", DRAFT, "draft shape, tied embeddings (default {})"),
    ):
        m.add_argument(
            f"--{role}-shape",
            default=_shape_str(shape),
            metavar="D,L,FFN,H,KV,HD",
            help=what.format(_shape_str(shape)),
        )
    m.add_argument(
        "--allow-draft-over-budget",
        action="store_true",
        help="allow a draft costing more than 1/8 of the target per token",
    )


def _schedule_args(s) -> None:
    s.add_argument("--target-steps", type=int, default=None, help="target optimisation steps")
    s.add_argument("--draft-steps", type=int, default=None, help="draft distillation steps")
    add_loop_args(s, time_budget_min=None, helps=HELPS)
    for role, lr in (("target", 2e-3), ("draft", 3e-3)):
        s.add_argument(
            f"--{role}-lr",
            type=float,
            default=lr,
            help=f"peak learning rate of the {role} (default {number(lr)})",
        )
    add_loop_args(s, warmup=50)
    s.add_argument(
        "--draft-ce-weight",
        type=float,
        default=0.0,
        help="weight of the data loss added to the draft's KL (default 0: pure distillation)",
    )


def _run_args(r) -> None:
    add_loop_args(r, seed=0, threads=2, log_every=25, ckpt_every=200, helps=HELPS)
    r.add_argument(
        "--skip-target",
        action="store_true",
        help="reuse OUT/target (and its tokenizer) and only distil the draft",
    )
    add_loop_args(r, resume=False)
    r.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    add_loop_args(r, device="cpu", helps=HELPS)
    r.add_argument(
        "--eval-prompts",
        type=int,
        default=None,
        help="first N held-out prompts for greedy acceptance (default: all)",
    )
    r.add_argument(
        "--eval-max-new-tokens", type=int, default=64, help="target tokens per prompt (default 64)"
    )


def build_parser() -> argparse.ArgumentParser:
    width = max(map(len, SUBCOMMANDS)) + 2
    subs = "".join(f"  {n:{width}s}{h}\n" for n, (_, h) in SUBCOMMANDS.items())
    ap = doc_parser("python -m apps.train", DESCRIPTION, epilog=EPILOG + subs.rstrip("\n"))
    _data_args(ap.add_argument_group("data"))
    _model_args(ap.add_argument_group("models"))
    _schedule_args(ap.add_argument_group("schedule"))
    _run_args(ap.add_argument_group("run"))
    return ap


def args_from(ns: argparse.Namespace, argv: list[str]) -> TrainArgs:
    for name in (
        "target_steps",
        "draft_steps",
        "vocab_size",
        "seq_len",
        "batch_size",
        "threads",
        "eval_prompts",
    ):
        v = getattr(ns, name)
        if v is not None and v <= 0:
            raise DuetError(f"--{name.replace('_', '-')} must be positive; got {v}")
    if ns.time_budget_min is not None and ns.time_budget_min <= 0:
        raise DuetError(f"--time-budget-min must be positive; got {ns.time_budget_min}")
    if (
        not ns.time_budget_min
        and not (ns.target_steps or ns.skip_target)
        or not ns.time_budget_min
        and not ns.draft_steps
    ):
        raise DuetError("give --target-steps and --draft-steps, or --time-budget-min to plan them")
    if not 256 + 3 <= ns.vocab_size <= 65536:
        raise DuetError(
            f"--vocab-size must be between 259 (bytes + specials) and 65536; got {ns.vocab_size}"
        )
    same = {f.name: getattr(ns, f.name) for f in fields(TrainArgs) if hasattr(ns, f.name)}
    return TrainArgs(
        **{
            **same,
            "out": Path(ns.out),
            "corpus": Path(ns.corpus) if ns.corpus else None,
            "include": tuple(ns.include),
            "exclude_dirs": tuple(ns.exclude_dirs),
            "target_shape": parse_shape(ns.target_shape, tie=False),
            "draft_shape": parse_shape(ns.draft_shape, tie=True),
            "evaluate": not ns.no_eval,
            "argv": argv,
        }
    )


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        module = SUBCOMMANDS[argv[0]][0]
        return importlib.import_module(f".{module}", __package__).main(argv[1:])
    args = args_from(build_parser().parse_args(argv), argv)
    report = train_pair(args)
    brief = {
        k: report[k]
        for k in ("target_params", "draft_params", "draft_target_flop_ratio", "train_wall_s")
    }
    if "evaluation" in report:
        ev = report["evaluation"]
        brief.update(
            {k: ev[k] for k in ("target_heldout_loss", "draft_heldout_loss", "greedy_acceptance")}
        )
    print(json.dumps(brief, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
