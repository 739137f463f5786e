"""`python -m apps.train`: train the embedded default target/draft pair.

A thin command line over `pipeline.train_pair`; see `--help`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.errors import DuetError, cli_main

from .configs import ARCHS, DRAFT, TARGET, parse_shape
from .corpus import DEFAULT_EXCLUDE_DIRS, DEFAULT_INCLUDE
from .pipeline import TrainArgs, train_pair

# `python -m apps.train NAME ...`: one module per subcommand, each with its own main(argv)
SUBCOMMANDS = (
    "evolve",
    "anchor",
    "bins",
    "exit-head",
    "mtp",
    "eagle",
    "ss-draft",
    "draft-tune",
    "gather-corpus",
)


def _shape_str(s) -> str:
    return f"{s.hidden_size},{s.num_layers},{s.intermediate_size},{s.num_heads},{s.num_kv_heads},{s.head_dim}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m apps.train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Train a target/draft pair for speculative decoding from scratch on a corpus of code:\n"
            "a byte-level BPE tokenizer, a Qwen3 target (next-token loss), then a Qwen3 draft\n"
            "distilled from the saved target (KL to its logits). Whole files are held out for\n"
            "evaluation; the end reports held-out loss of both and the draft's greedy acceptance.\n"
            "Writes OUT/target, OUT/draft (Hugging Face dirs, bf16), split.json, loss_log.jsonl,\n"
            "training_report.json."
        ),
        epilog=(
            "the embedded default pair was made with:\n"
            "  nice -n 10 python -m apps.train --out runtime/assets/default --time-budget-min 85 --threads 1\n"
            "(its training_report.json records the step counts that reproduce it without timing)\n"
            "evaluate an existing pair: python -m apps.train.evaluate OUT\n"
            "tuned exit head for Mirror-SD: python -m apps.train exit-head --target DIR --layer L\n"
            "HeteroSpec entropy bins:   python -m apps.train bins --help\n"
            "write the prompt set:      python -m apps.train.prompts\n"
            "evolve the target (FlexSpec): python -m apps.train evolve --help\n"
            "train an anchor draft:        python -m apps.train anchor --help\n"
            "fine-tune a draft (KL + TV):  python -m apps.train draft-tune --help\n"
            "fit a draft head (EAGLE-3):   python -m apps.train eagle --help\n"
            "a larger corpus (V = 16384):  python -m apps.train gather-corpus --help"
        ),
    )
    g = ap.add_argument_group("data")
    g.add_argument(
        "--out", required=True, help="output directory (created; target/ and draft/ are replaced)"
    )
    g.add_argument(
        "--corpus",
        default=None,
        help="directory of text/code files (default: this Python's standard library source)",
    )
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
    g.add_argument(
        "--heldout-frac", type=float, default=0.05, help="fraction of files held out (default 0.05)"
    )
    g.add_argument(
        "--vocab-size", type=int, default=4096, help="BPE vocabulary size (default 4096)"
    )
    g.add_argument(
        "--seq-len", type=int, default=512, help="training sequence length (default 512)"
    )
    g.add_argument("--batch-size", type=int, default=8, help="sequences per step (default 8)")
    m = ap.add_argument_group("models")
    m.add_argument(
        "--arch",
        choices=ARCHS,
        default="qwen3",
        help="qwen3 (default; the embedded pair) or qwen3_5: hybrid Gated DeltaNet / gated "
        "attention layers 3 : 1 (qwen3_5_text), on the embedded pair's tokenizer; e.g. "
        "nice -n 10 python -m apps.train --arch qwen3_5 --out out/hybrid --time-budget-min 35 "
        "--threads 1",
    )
    m.add_argument(
        "--target-shape",
        default=_shape_str(TARGET),
        metavar="D,L,FFN,H,KV,HD",
        help=f"target hidden,layers,ffn,heads,kv_heads,head_dim (default {_shape_str(TARGET)}, untied)",
    )
    m.add_argument(
        "--draft-shape",
        default=_shape_str(DRAFT),
        metavar="D,L,FFN,H,KV,HD",
        help=f"draft shape, tied embeddings (default {_shape_str(DRAFT)})",
    )
    m.add_argument(
        "--allow-draft-over-budget",
        action="store_true",
        help="allow a draft costing more than 1/8 of the target per token",
    )
    s = ap.add_argument_group("schedule")
    s.add_argument("--target-steps", type=int, default=None, help="target optimisation steps")
    s.add_argument("--draft-steps", type=int, default=None, help="draft distillation steps")
    s.add_argument(
        "--time-budget-min",
        type=float,
        default=None,
        help="wall-clock budget for the whole run: step counts not given are planned from "
        "measured step times, and each stage's schedule is cut to fit",
    )
    s.add_argument(
        "--target-lr",
        type=float,
        default=2e-3,
        help="peak learning rate of the target (default 2e-3)",
    )
    s.add_argument(
        "--draft-lr",
        type=float,
        default=3e-3,
        help="peak learning rate of the draft (default 3e-3)",
    )
    s.add_argument("--warmup", type=int, default=50, help="warm-up steps (default 50)")
    s.add_argument(
        "--draft-ce-weight",
        type=float,
        default=0.0,
        help="weight of the data loss added to the draft's KL (default 0: pure distillation)",
    )
    r = ap.add_argument_group("run")
    r.add_argument(
        "--seed", type=int, default=0, help="seed for python, numpy and torch (default 0)"
    )
    r.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch intra-op threads (default 2; on a machine busy with other work 1 is "
        "faster, as no thread waits for a descheduled sibling)",
    )
    r.add_argument(
        "--log-every", type=int, default=25, help="steps between loss lines (default 25)"
    )
    r.add_argument(
        "--ckpt-every",
        type=int,
        default=200,
        help="steps between checkpoints saved into OUT/target or OUT/draft (default 200; 0: end only)",
    )
    r.add_argument(
        "--skip-target",
        action="store_true",
        help="reuse OUT/target (and its tokenizer) and only distil the draft",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue a stopped run from OUT/.resume (same arguments); a finished stage is "
        "kept, an unfinished one goes on from its last checkpoint",
    )
    r.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    r.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="train on the CPU or a CUDA GPU (default cpu); the evaluation runs on the CPU",
    )
    r.add_argument(
        "--eval-prompts",
        type=int,
        default=None,
        help="first N held-out prompts for greedy acceptance (default: all)",
    )
    r.add_argument(
        "--eval-max-new-tokens", type=int, default=64, help="target tokens per prompt (default 64)"
    )
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
    return TrainArgs(
        out=Path(ns.out),
        corpus=Path(ns.corpus) if ns.corpus else None,
        include=tuple(ns.include),
        exclude_dirs=tuple(ns.exclude_dirs),
        heldout_frac=ns.heldout_frac,
        vocab_size=ns.vocab_size,
        seq_len=ns.seq_len,
        batch_size=ns.batch_size,
        target_shape=parse_shape(ns.target_shape, tie=False),
        draft_shape=parse_shape(ns.draft_shape, tie=True),
        target_steps=ns.target_steps,
        draft_steps=ns.draft_steps,
        time_budget_min=ns.time_budget_min,
        target_lr=ns.target_lr,
        draft_lr=ns.draft_lr,
        warmup=ns.warmup,
        draft_ce_weight=ns.draft_ce_weight,
        seed=ns.seed,
        threads=ns.threads,
        log_every=ns.log_every,
        ckpt_every=ns.ckpt_every,
        eval_max_new_tokens=ns.eval_max_new_tokens,
        eval_prompts=ns.eval_prompts,
        evaluate=not ns.no_eval,
        skip_target=ns.skip_target,
        allow_draft_over_budget=ns.allow_draft_over_budget,
        arch=ns.arch,
        resume=ns.resume,
        device=ns.device,
        argv=argv,
    )


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        module = argv[0].replace("-", "_")
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
