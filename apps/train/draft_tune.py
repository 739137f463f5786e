"""`python -m apps.train draft-tune`: continue training an existing draft against its target.

    nice -n 10 python -m apps.train draft-tune --out out/draft_tv --tv-weight 1.0 \\
        --time-budget-min 30 --threads 1
    python -m apps.train draft-tune --eval-only            # measure the committed draft
    python -m apps.train draft-tune --from-target-layers 0 --device cuda --time-budget-min 3 \\
        --batch-size 32 --out out/draft_l1     # a new draft cut from the target (not committed)

The loss is the pipeline's distillation loss (apps/train/losses.py `distill_loss`, the step of
apps/train/steps.py): KL(p_target ‖ q_draft) plus `--tv-weight` x TV(p, q). 1 - TV is
exactly the chance that rejection sampling accepts a draft token at that temperature
(Leviathan et al. 2023, §3.2), so the TV term aims at acceptance when sampling, the KL term
keeps the draft covering the target (and its argmax, which greedy acceptance needs).

Temperature and top-p: the loss is taken at `--temperature` (default 1) over the whole
vocabulary, with no top-p. A top-p loss would mask the tokens outside each law's own nucleus;
their gradient is then zero, so the draft could never learn to move mass into a token its
nucleus currently cuts, and the nucleus mask is a step function of the logits. The full-law
TV at T = 1 bounds what top-p changes (the cut tails hold 1 - top_p of the mass), and the
evaluation measures the top-p acceptance itself.

Data: the pair's own corpus and held-out split, read from the split.json apps.train wrote
beside the draft (`--split`; for the embedded pair runtime/assets/default/split.json), or
`--corpus` split by the same rule; random windows of the train files (corpus.BatchSampler),
as the draft was first trained. The optimiser is the shared loop (apps/train/loop.py: AdamW,
warm-up, cosine to 10 %, clipping) without weight decay: a short fine-tune should not shrink
weights the first run settled. It runs in float32 unless `--bf16` (the first run's autocast):
on this machine's AMD EPYC (no avx512_bf16) a step of 8 x 512 took 27 s in float32 and
145 s under bf16 autocast, 1 thread.

OUT receives the draft as pipeline.py saves it (checkpoint.save_model: bf16 safetensors,
config, tokenizer files; no model.onnx, which the runtime exports on first use), plus
loss_log.jsonl and draft_tune.json (arguments, schedule, and the evaluation of the saved
draft: apps/train/draft_eval.py). The draft and target given are only read; nothing is
written anywhere but OUT, which must be named. There is no resume: a stopped run keeps its
last checkpoint in OUT, and a new run starts from whatever --draft says.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from runtime.errors import DuetError, cli_main

from . import plan as planning
from .args import add_loop_args, check_device, command_parser, positive
from .checkpoint import check_reload, load_model, save_model
from .corpus import BatchSampler, corpus_from_split, load_corpus, token_stream
from .draft_eval import evaluate_draft as evaluate
from .layer_draft import parse_layers, target_layer_draft
from .loop import LoopConfig, budget_s, make_optimizer, train_loop
from .steps import distill_step
from .tokenizer import eos_id, load_tokenizer, save_tokenizer

# where a loop flag means more here than in LOOP_FLAGS (apps/train/args.py)
HELPS = {
    "out": "output directory for the tuned draft (required unless --eval-only; replaced; never "
    "defaults to the embedded pair)",
    "corpus": "corpus root (default: the one in the split, else the stdlib)",
    "time_budget_min": "wall-clock budget of the training (the evaluation comes after it)",
    "seq_len": "training window length (default: the split's, else 512; with a split, the "
    "held-out windows keep its length)",
    "device": "train on the CPU or a CUDA GPU (bf16 autocast is on there) (default cpu); "
    "the evaluation runs on the CPU",
}


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("draft-tune", __doc__)
    ap.add_argument("--target", default=None, help="target checkpoint (default: the embedded one)")
    ap.add_argument(
        "--draft", default=None, help="draft checkpoint to start from (default: the embedded one)"
    )
    add_loop_args(ap, out=None, helps=HELPS)
    ap.add_argument(
        "--split",
        default=None,
        help="split.json of the pair (default: DRAFT/../split.json when present)",
    )
    add_loop_args(ap, corpus=None, helps=HELPS)
    ap.add_argument(
        "--tv-weight",
        type=float,
        default=1.0,
        help="weight of TV(p, q) added to the KL loss (default 1.0)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="temperature of both laws in the loss (default 1.0)",
    )
    add_loop_args(ap, lr=1e-3, warmup=50, steps=None, time_budget_min=None, helps=HELPS)
    add_loop_args(ap, batch_size=8, seq_len=None, helps=HELPS)
    ap.add_argument(
        "--from-target-layers",
        default=None,
        metavar="I,J,...",
        help="start a new draft from the target itself instead of --draft: its embedding, "
        "decoder layers I,J,... (in that order), final norm and LM head, copied, then distilled "
        "(drafts scaled for Mirror-SD's overlap: `0` is about 0.22x the embedded target's "
        "per-token compute, `0,1,7` about 0.44x)",
    )
    add_loop_args(ap, device="cpu", threads=1, helps=HELPS)
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast, as pipeline.py trained the pair (default float32: on a "
        "CPU without native bf16 a step ran 6x slower under autocast)",
    )
    add_loop_args(ap, seed=0, log_every=25, ckpt_every=200)
    e = ap.add_argument_group("evaluation (apps/train/draft_eval.py)")
    e.add_argument(
        "--eval-only",
        action="store_true",
        help="measure --draft against --target and print JSON; train nothing",
    )
    e.add_argument(
        "--compare",
        default=None,
        metavar="DRAFT2",
        help="with --eval-only: measure DRAFT2 too on the same contexts and report "
        "draft - DRAFT2 with 95 %% bootstrap intervals over prompts",
    )
    e.add_argument("--no-eval", action="store_true", help="skip the evaluation after training")
    e.add_argument(
        "--prompts", default=None, help="prompt set for sampled contexts (default apps/prompts/)"
    )
    e.add_argument("--eval-prompts", type=int, default=24, help="prompts (default 24)")
    e.add_argument(
        "--eval-tokens", type=int, default=48, help="target tokens sampled per prompt (default 48)"
    )
    e.add_argument(
        "--eval-top-p",
        type=float,
        default=0.9,
        help="top-p of the sampled contexts and of the acceptance (default 0.9)",
    )
    e.add_argument(
        "--eval-heldout-tokens",
        type=int,
        default=8192,
        help="held-out corpus tokens for KL/TV/top-1 (default 8192)",
    )
    return ap


def _checkpoint_dir(path: str | None, which: str) -> Path:
    if path is None:
        from runtime.assets import default_pair

        return default_pair()[0 if which == "target" else 1]
    from runtime.loading import resolve

    d = Path(resolve(path, which))  # a directory, or a known model's name (runtime/registry.py)
    if not (d / "config.json").is_file() or not (d / "tokenizer.json").is_file():
        raise DuetError(
            f"--{which} {d}: not a checkpoint directory (needs config.json and tokenizer.json)"
        )
    return d


def check_args(a: argparse.Namespace) -> None:
    """Raise DuetError for values no run could use."""
    positive(
        a,
        "batch_size",
        "threads",
        "log_every",
        "eval_prompts",
        "eval_tokens",
        "eval_heldout_tokens",
        "steps",
        "seq_len",
    )
    for name in ("lr", "temperature", "time_budget_min"):
        v = getattr(a, name)
        if v is not None and not v > 0:
            raise DuetError(f"--{name.replace('_', '-')} must be positive (got {v})")
    if a.warmup < 0 or a.ckpt_every < 0:
        raise DuetError("--warmup and --ckpt-every must be >= 0")
    if not a.tv_weight >= 0:
        raise DuetError(f"--tv-weight must be >= 0 (got {a.tv_weight})")
    if not 0 < a.eval_top_p <= 1:
        raise DuetError(f"--eval-top-p must be in (0, 1] (got {a.eval_top_p})")
    if a.compare and not a.eval_only:
        raise DuetError("--compare goes with --eval-only")
    if a.from_target_layers is not None and (a.eval_only or a.draft):
        raise DuetError("--from-target-layers starts a new draft: not with --draft or --eval-only")
    check_device(a.device)
    if not a.eval_only:
        if a.out is None:
            raise DuetError("--out DIR is required to train (or pass --eval-only)")
        if a.steps is None and a.time_budget_min is None:
            raise DuetError("give --steps or --time-budget-min")


def _check_out(out: Path, target_dir: Path) -> None:
    if out.resolve() == target_dir.resolve():
        raise DuetError(f"--out {out} is the target directory; choose another")
    if out.exists() and (
        not out.is_dir() or (any(out.iterdir()) and not (out / "config.json").is_file())
    ):
        raise DuetError(
            f"--out {out} exists and is not a checkpoint directory; it would be "
            "replaced: choose a new or checkpoint directory"
        )


def _corpus(a, ddir: Path):
    split = Path(a.split) if a.split else ddir.parent / "split.json"
    if a.split and not split.is_file():
        raise DuetError(f"--split {split}: no such file")
    if split.is_file():
        corpus, seq_len = corpus_from_split(split, a.corpus)
        return corpus, seq_len, str(split)
    return load_corpus(a.corpus), a.seq_len or 512, None


def _pair(a: argparse.Namespace):
    """(target dir, draft dir, layers of --from-target-layers or None, tokenizer)."""
    tdir = _checkpoint_dir(a.target, "target")
    layers = None  # --from-target-layers, checked before the corpus is read
    if a.from_target_layers is not None:
        from transformers import AutoConfig

        n_layers = AutoConfig.from_pretrained(tdir).get_text_config().num_hidden_layers
        layers = parse_layers(a.from_target_layers, n_layers)
    # a draft copied from the target reads the target's tokenizer and split
    ddir = tdir if layers is not None else _checkpoint_dir(a.draft, "draft")
    tok = load_tokenizer(tdir)
    if load_tokenizer(ddir).get_vocab() != tok.get_vocab():
        raise DuetError(f"--draft {ddir} and --target {tdir} have different tokenizers")
    return tdir, ddir, layers, tok


def _planned_steps(a, draft, teacher, train: np.ndarray, seq_len: int, bf16: bool) -> int:
    """--steps, or as many as the budget allows, timed on a copy so the draft is untouched."""
    if a.steps is not None:
        return a.steps
    probe = BatchSampler(train, a.batch_size, seq_len, a.seed + 99)
    dm = copy.deepcopy(draft)
    step_s = planning.time_steps(
        dm,
        distill_step(dm, teacher, 0.0, a.tv_weight, a.temperature),
        probe,
        bf16=bf16,
        device=a.device,
    )
    steps = max(1, int(a.time_budget_min * 60 / step_s))
    del dm
    print(f"{step_s:.2f} s/step: planning {steps} steps", file=sys.stderr, flush=True)
    return steps


def _tokenizer_files(ddir: Path, tok_dir: Path) -> None:
    """The draft's tokenizer files into `tok_dir`, safe from a save over DRAFT."""
    tok_dir.mkdir()
    if (ddir / "tokenizer_config.json").is_file():
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(ddir / name, tok_dir / name)
    else:
        save_tokenizer(load_tokenizer(ddir), tok_dir)


def _train(a, draft, teacher, train, seq_len: int, bf16: bool, ddir: Path, out: Path, eos):
    """Distil `draft` from `teacher` and save it to OUT; (the loop's summary, its config)."""
    step_fn = distill_step(draft, teacher, 0.0, a.tv_weight, a.temperature)
    steps = _planned_steps(a, draft, teacher, train, seq_len, bf16)
    cfg = LoopConfig(
        "draft-tune",
        steps,
        a.lr,
        min(a.warmup, steps),
        weight_decay=0.0,
        time_limit_s=budget_s(a),
        log_every=a.log_every,
        ckpt_every=a.ckpt_every,
        bf16=bf16,
        device=a.device,
    )
    logdir = Path(tempfile.mkdtemp(prefix="duet-draft-tune-"))
    log_path = logdir / "loss_log.jsonl"
    tok_dir = logdir / "tokenizer"
    _tokenizer_files(ddir, tok_dir)

    def save(step: int | None = None) -> None:
        save_model(draft, out, tok_dir, eos)
        shutil.copy(log_path, out / "loss_log.jsonl")

    sampler = BatchSampler(train, a.batch_size, seq_len, a.seed + 5)
    opt = make_optimizer(draft, cfg)
    summary = train_loop(draft, step_fn, sampler, cfg, log_path, checkpoint=save, optimizer=opt)
    save()
    shutil.rmtree(logdir, ignore_errors=True)
    return summary, cfg


def run(a: argparse.Namespace) -> dict:
    """Train (unless --eval-only) and evaluate; returns the report."""
    check_args(a)
    tdir, ddir, layers, tok = _pair(a)
    out = Path(a.out) if a.out else None
    if out is not None and not a.eval_only:
        _check_out(out, tdir)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    corpus, eval_len, split = _corpus(a, ddir)  # held-out windows keep the split's length
    seq_len = a.seq_len or eval_len
    eos = eos_id(tok, tdir)

    def enc(texts):
        return [e.ids for e in tok.encode_batch(texts)]

    held = token_stream(corpus.texts("heldout", 8 * a.eval_heldout_tokens), enc, eos)
    if a.eval_only:
        cmp = _checkpoint_dir(a.compare, "compare") if a.compare else None
        return {"evaluation": evaluate(tdir, ddir, held, eval_len, a, cmp)}

    train = token_stream(corpus.texts("train"), enc, eos)
    print(
        f"corpus {corpus.root}: {len(corpus.train)} train files, {len(train)} tokens; "
        f"split {split or 'recomputed'}",
        file=sys.stderr,
        flush=True,
    )
    teacher = load_model(tdir).requires_grad_(False)
    if layers is not None:
        draft = target_layer_draft(teacher, layers)
    else:
        draft = load_model(ddir)
    dev = torch.device(a.device)
    teacher, draft = teacher.to(dev), draft.to(dev)
    # hybrids: fp32 (pipeline.py); a GPU has native bf16, so it autocasts there
    bf16 = (a.bf16 or dev.type == "cuda") and "qwen3_5" not in draft.config.model_type
    summary, cfg = _train(a, draft, teacher, train, seq_len, bf16, ddir, out, eos)
    draft = draft.cpu()  # the reload check compares on the CPU
    probe_ids = torch.from_numpy(held[: min(128, len(held))].astype(np.int64))[None]
    start = f"target layers {a.from_target_layers}" if layers is not None else str(ddir)
    report = {
        "command": "python -m apps.train draft-tune " + " ".join(a.argv),
        "target": str(tdir),
        "start_draft": start,
        "device": a.device,
        "out": str(out),
        "split": split,
        "loss": "KL + tv_weight x TV (distill_loss)",
        "tv_weight": a.tv_weight,
        "temperature": a.temperature,
        "lr": a.lr,
        "warmup": cfg.warmup,
        "weight_decay": 0.0,
        "batch_size": a.batch_size,
        "seq_len": seq_len,
        "seed": a.seed,
        "threads": a.threads,
        "bf16_autocast": bf16,
        "train_tokens": int(len(train)),
        **summary,
        "reload_check": check_reload(draft, out, probe_ids),
    }
    if not a.no_eval:
        report["evaluation"] = evaluate(tdir, out, held, eval_len, a)
    (out / "draft_tune.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    a.argv = argv
    print(json.dumps(run(a), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
