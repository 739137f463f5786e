"""The training run in order: corpus -> tokenizer -> target -> draft -> evaluation.

Everything is seeded (python `random`, numpy, torch); with explicit step counts
and the same machine the run is repeatable. The output directory receives:

    target/, draft/          Hugging Face directories (bf16 safetensors, shared tokenizer)
    split.json               the corpus root, the rule, and the held-out file list
    loss_log.jsonl           one line per logged step of both stages
    training_report.json     arguments, plan, parameter counts, compute ratio, evaluation
    .resume/                 per-stage weights, optimizer and step at every checkpoint, so
                             `--resume` continues a stopped run (and skips a finished stage)

`arch` picks the family: Qwen3 (the embedded pair) or hybrid Qwen3.5 (`qwen3_5_text`, Gated
DeltaNet layers 3 : 1 with gated full attention; configs.py), which reuses the embedded pair's
tokenizer so both pairs share one vocabulary, and trains in float32: under bf16 autocast
transformers' pure-torch gated-delta fallback ran ~4x slower per step on this CPU.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from runtime.errors import DuetError

from . import plan as planning
from .checkpoint import check_reference, check_reload, load_model, save_model
from .configs import (
    DRAFT,
    TARGET,
    Shape,
    causal_lm,
    check_draft_budget,
    compute_summary,
    counted_summary,
    model_config,
)
from .corpus import (
    DEFAULT_EXCLUDE_DIRS,
    DEFAULT_INCLUDE,
    BatchSampler,
    eval_windows,
    load_corpus,
    token_stream,
)
from .evaluate import evaluate_pair, heldout_loss
from .loop import LoopConfig, make_optimizer, train_loop
from .losses import distill_loss, next_token_loss
from .tokenizer import eos_id, load_tokenizer, save_tokenizer, train_tokenizer


@dataclass
class TrainArgs:
    out: Path
    corpus: Path | None = None
    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude_dirs: tuple[str, ...] = DEFAULT_EXCLUDE_DIRS
    heldout_frac: float = 0.05
    vocab_size: int = 4096
    seq_len: int = 512
    batch_size: int = 8
    target_shape: Shape = TARGET
    draft_shape: Shape = DRAFT
    target_steps: int | None = None
    draft_steps: int | None = None
    time_budget_min: float | None = None
    target_lr: float = 2e-3
    draft_lr: float = 3e-3
    warmup: int = 50
    draft_ce_weight: float = 0.0
    seed: int = 0
    threads: int = 2
    log_every: int = 25
    ckpt_every: int = 200
    eval_max_new_tokens: int = 64
    eval_prompts: int | None = None
    evaluate: bool = True
    skip_target: bool = False
    allow_draft_over_budget: bool = False
    arch: str = "qwen3"
    resume: bool = False
    device: str = "cpu"  # train on the CPU or a CUDA GPU (bf16 autocast on both, as the CPU did)
    argv: list[str] = field(default_factory=list)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _ce_step(model):
    def step(x, y):
        loss = next_token_loss(model(input_ids=x).logits, y)
        return loss, {}

    return step


def _distill_step(
    draft, teacher, ce_weight: float, tv_weight: float = 0.0, temperature: float = 1.0
):
    def step(x, y):
        with torch.no_grad():
            t_logits = teacher(input_ids=x).logits
        return distill_loss(draft(input_ids=x).logits, t_logits, y, ce_weight=ce_weight,
                            temperature=temperature, tv_weight=tv_weight)  # fmt: skip

    return step


def _quick_eval(model, windows, bf16: bool = True):
    def ev():
        dev = next(model.parameters()).device
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            return {"heldout_loss_quick": round(heldout_loss(model, windows), 4)}

    return ev


def _save_state(resume_dir: Path, stage: str, model, opt, step: int, steps: int) -> None:
    """Write OUT/.resume/STAGE.pt: weights, optimizer, step and planned steps; with no model,
    mark the stage done (its saved Hugging Face directory is the result)."""
    resume_dir.mkdir(parents=True, exist_ok=True)
    st = {"step": step, "steps": steps, "done": model is None}
    if model is not None:
        st.update(model=model.state_dict(), optimizer=opt.state_dict())
    torch.save(st, resume_dir / f"{stage}.pt.tmp")
    (resume_dir / f"{stage}.pt.tmp").replace(resume_dir / f"{stage}.pt")


def _load_state(resume_dir: Path, stage: str) -> dict | None:
    f = resume_dir / f"{stage}.pt"
    return torch.load(f, weights_only=False) if f.is_file() else None


def _restore(model, cfg: LoopConfig, state: dict | None):
    """(optimizer, start step): fresh, or the resumed stage's weights and optimizer loaded."""
    opt = make_optimizer(model, cfg)
    if not state:
        return opt, 0
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    _say(f"resuming {cfg.stage} at step {state['step']} of {state['steps']}")
    return opt, state["step"]


def train_pair(a: TrainArgs) -> dict:
    """Run the whole pipeline; returns the report also written to training_report.json."""
    t_start = time.monotonic()
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        raise DuetError(f"--device cuda: PyTorch {torch.__version__} sees no CUDA GPU")
    deadline = t_start + a.time_budget_min * 60 if a.time_budget_min else None
    reserve = planning.EVAL_RESERVE_S if a.evaluate else planning.SAVE_RESERVE_S
    torch.set_num_threads(a.threads)
    seed_everything(a.seed)
    bf16 = a.arch != "qwen3_5"  # see the module docstring
    resume_dir = Path(a.out) / ".resume"
    if not a.resume:
        shutil.rmtree(resume_dir, ignore_errors=True)
    target_state = _load_state(resume_dir, "target")
    skip_target = a.skip_target or bool(target_state and target_state["done"])

    corpus = load_corpus(
        a.corpus, include=a.include, exclude_dirs=a.exclude_dirs, heldout_frac=a.heldout_frac
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "split.json").write_text(
        json.dumps(
            {
                "corpus_root": str(corpus.root),
                "corpus_is_stdlib": a.corpus is None,
                "include": list(a.include),
                "exclude_dirs": list(a.exclude_dirs),
                "rule": "held out iff sha256('duet-heldout-v1:' + relative_path) / 2**256 < heldout_frac",
                "heldout_frac": a.heldout_frac,
                "seq_len": a.seq_len,
                "train_files": len(corpus.train),
                "heldout": list(corpus.heldout),
            },
            indent=1,
        )
        + "\n"
    )
    _say(f"corpus {corpus.root}: {len(corpus.train)} train files, {len(corpus.heldout)} held out")

    # Tokenizer: trained on train files only; reused as-is when the target is reused.
    tok_dir = Path(tempfile.mkdtemp(prefix="duet-tok-"))
    if skip_target:
        if not (out / "target" / "config.json").is_file():
            raise DuetError(f"--skip-target: no trained target in {out / 'target'}")
        tok = load_tokenizer(out / "target")
    elif a.arch == "qwen3_5":
        from runtime.assets import default_pair

        tok = load_tokenizer(default_pair()[0])  # the embedded pair's vocabulary
    else:
        tok = train_tokenizer(corpus.texts("train"), a.vocab_size)
    save_tokenizer(tok, tok_dir)
    eos, vocab = eos_id(tok), tok.get_vocab_size()
    enc = lambda texts: [e.ids for e in tok.encode_batch(texts)]  # noqa: E731
    train_stream = token_stream(corpus.texts("train"), enc, eos)
    held_stream = token_stream(corpus.texts("heldout"), enc, eos)
    quick_windows = eval_windows(held_stream, a.seq_len, 8 * a.seq_len)
    n_bytes = sum((corpus.root / f).stat().st_size for f in corpus.train)
    _say(
        f"tokenizer: vocab {vocab}; train {len(train_stream)} tokens ({n_bytes / len(train_stream):.2f} bytes/token), "
        f"held-out {len(held_stream)} tokens"
    )

    summary = compute_summary(a.target_shape, a.draft_shape, vocab, a.seq_len)
    t_cfg = model_config(a.arch, a.target_shape, vocab, eos)
    d_cfg = model_config(a.arch, a.draft_shape, vocab, eos)
    if a.arch != "qwen3":
        summary = counted_summary(summary, t_cfg, d_cfg)
    summary["arch"] = a.arch
    check_draft_budget(summary, a.allow_draft_over_budget)
    _say(
        f"target {summary['target_params'] / 1e6:.2f} M params, draft {summary['draft_params'] / 1e6:.2f} M params, "
        f"draft/target compute per token {summary['draft_target_flop_ratio']:.4f}"
    )
    tokens_per_step = a.batch_size * a.seq_len

    plan = None
    if a.time_budget_min:
        probe = BatchSampler(train_stream, a.batch_size, a.seq_len, seed=a.seed + 99)
        tm = causal_lm(t_cfg).to(dev)
        t_step = planning.time_steps(tm, _ce_step(tm), probe, bf16=bf16, device=dev)
        dm = causal_lm(d_cfg).to(dev)
        d_step = planning.time_steps(
            dm, _distill_step(dm, tm.eval(), a.draft_ce_weight), probe, bf16=bf16, device=dev
        )
        del tm, dm
        remaining = deadline - time.monotonic()
        plan = planning.plan_steps(remaining, t_step, d_step, reserve_s=reserve)
        if skip_target:
            plan = planning.plan_steps(remaining, t_step, d_step, target_frac=0.0,
                                       reserve_s=reserve)  # fmt: skip
        _say(plan.describe(tokens_per_step))
    target_steps = a.target_steps or (plan.target_steps if plan else None)
    draft_steps = a.draft_steps or (plan.draft_steps if plan else None)
    if target_state and not target_state["done"]:
        target_steps = target_state["steps"]  # a resumed stage keeps its schedule
    assert target_steps and draft_steps, "the CLI requires steps or a time budget"

    log_path = out / "loss_log.jsonl"
    probe_ids = torch.from_numpy(held_stream[: min(128, len(held_stream))].astype(np.int64))[None]
    stages = {}

    # Stage 1: the target, next-token loss on the train stream.
    if not skip_target:
        if not target_state:
            log_path.write_text("")
        seed_everything(a.seed)
        target = causal_lm(t_cfg).to(dev)
        limit = plan.target_time_s if plan else None
        cfg = LoopConfig(
            "target",
            target_steps,
            a.target_lr,
            a.warmup,
            time_limit_s=limit,
            log_every=a.log_every,
            ckpt_every=a.ckpt_every,
            bf16=bf16,
            device=dev,
        )
        opt, start = _restore(target, cfg, target_state)

        def ckpt(step):
            save_model(target, out / "target", tok_dir, eos)
            _save_state(resume_dir, "target", target, opt, step, target_steps)

        stages["target"] = train_loop(
            target,
            _ce_step(target),
            BatchSampler(train_stream, a.batch_size, a.seq_len, a.seed + 1 + start),
            cfg,
            log_path,
            ckpt,
            _quick_eval(target, quick_windows, bf16),
            optimizer=opt,
            start_step=start,
        )
        save_model(target, out / "target", tok_dir, eos)
        _save_state(resume_dir, "target", None, None, stages["target"]["steps"], target_steps)
        stages["target"]["reload_check"] = check_reload(target.cpu(), out / "target", probe_ids)
        del target
    teacher = load_model(out / "target").to(dev)  # distil from the target as saved (bf16 weights)
    for p in teacher.parameters():
        p.requires_grad_(False)

    # Stage 2: the draft, distilled from the saved target.
    seed_everything(a.seed + 2)
    draft = causal_lm(d_cfg).to(dev)
    draft_state = _load_state(resume_dir, "draft")
    if draft_state:
        draft_steps = draft_state["steps"]
    limit = None
    if deadline is not None:
        limit = max(deadline - time.monotonic() - reserve, 30.0)
        if plan:
            draft_steps = (
                min(draft_steps, max(1, int(limit * 0.9 / plan.draft_step_s)))
                if not (a.draft_steps or draft_state)
                else draft_steps
            )
    cfg = LoopConfig(
        "draft",
        draft_steps,
        a.draft_lr,
        a.warmup,
        time_limit_s=limit,
        log_every=a.log_every,
        ckpt_every=a.ckpt_every,
        bf16=bf16,
        device=dev,
    )
    if draft_state and draft_state["done"]:  # --resume after a finished draft: evaluate only
        stages["draft"] = {"steps": draft_state["step"], "resumed_done": True}
    else:
        opt, start = _restore(draft, cfg, draft_state)

        def ckpt(step):
            save_model(draft, out / "draft", tok_dir, eos)
            _save_state(resume_dir, "draft", draft, opt, step, draft_steps)

        stages["draft"] = train_loop(
            draft,
            _distill_step(draft, teacher, a.draft_ce_weight),
            BatchSampler(train_stream, a.batch_size, a.seq_len, a.seed + 3 + start),
            cfg,
            log_path,
            ckpt,
            _quick_eval(draft, quick_windows, bf16),
            optimizer=opt,
            start_step=start,
        )
        save_model(draft, out / "draft", tok_dir, eos)
        _save_state(resume_dir, "draft", None, None, stages["draft"]["steps"], draft_steps)
        stages["draft"]["reload_check"] = check_reload(draft.cpu(), out / "draft", probe_ids)

    shutil.rmtree(tok_dir, ignore_errors=True)
    if a.arch != "qwen3":  # our runtime's reference must read the checkpoint as transformers does
        for name in ("target", "draft"):
            if name in stages:
                stages[name]["reference_parity"] = check_reference(out / name, probe_ids)

    report = {
        "command": "python -m apps.train " + " ".join(a.argv),
        "args": {
            k: (str(v) if isinstance(v, Path) else asdict(v) if isinstance(v, Shape) else v)
            for k, v in asdict(a).items()
            if k != "argv"
        },
        "torch": torch.__version__,
        "threads": a.threads,
        "corpus": {
            "root": str(corpus.root),
            "train_files": len(corpus.train),
            "heldout_files": len(corpus.heldout),
            "train_tokens": int(len(train_stream)),
            "heldout_tokens": int(len(held_stream)),
            "train_bytes_per_token": n_bytes / len(train_stream),
        },
        "plan": asdict(plan) if plan else None,
        "steps": {"target": target_steps, "draft": draft_steps},
        "tokens_per_step": tokens_per_step,
        **summary,
        "stages": stages,
        "train_wall_s": round(time.monotonic() - t_start, 1),
    }
    if a.evaluate:
        _say("evaluating the saved pair ...")
        report["evaluation"] = evaluate_pair(
            out / "target",
            out / "draft",
            corpus,
            seq_len=a.seq_len,
            max_new=a.eval_max_new_tokens,
            max_prompts=a.eval_prompts,
        )
        ev = report["evaluation"]
        _say(
            f"held-out loss: target {ev['target_heldout_loss']:.4f}, draft {ev['draft_heldout_loss']:.4f}; "
            f"greedy acceptance {ev['greedy_acceptance']:.3f} over {ev['positions']} positions"
        )
    report["total_wall_s"] = round(time.monotonic() - t_start, 1)
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
