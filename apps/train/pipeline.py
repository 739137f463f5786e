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
from .args import check_device
from .checkpoint import check_reference, check_reload, load_model, save_model
from .configs import DRAFT, TARGET, Shape, causal_lm, pair_configs
from .corpus import (
    DEFAULT_EXCLUDE_DIRS,
    DEFAULT_INCLUDE,
    BatchSampler,
    eval_windows,
    load_corpus,
    token_stream,
)
from .evaluate import evaluate_pair
from .loop import LoopConfig, make_optimizer, train_loop
from .resume import RESUME_DIR, load_state, save_state
from .steps import ce_step, distill_step, quick_eval
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


@dataclass
class Run:
    """What the stages share: the arguments, where things go, the token streams."""

    a: TrainArgs
    out: Path
    resume_dir: Path
    bf16: bool
    tok_dir: Path | None = None  # the tokenizer files every saved model carries
    eos: int = 0
    vocab: int = 0
    train_stream: np.ndarray | None = None
    held_stream: np.ndarray | None = None
    quick_windows: list | None = None
    n_bytes: int = 0  # of the train files, for bytes per token
    probe_ids: torch.Tensor | None = None  # (1, <=128) held-out ids for the reload checks

    @property
    def log_path(self) -> Path:
        return self.out / "loss_log.jsonl"

    def loop_config(self, stage: str, steps: int, lr: float, limit: float | None) -> LoopConfig:
        a = self.a
        return LoopConfig(
            stage,
            steps,
            lr,
            a.warmup,
            time_limit_s=limit,
            log_every=a.log_every,
            ckpt_every=a.ckpt_every,
            bf16=self.bf16,
            device=a.device,
        )


def _save_state(resume_dir: Path, stage: str, model, opt, step: int, steps: int) -> None:
    """Write OUT/.resume/STAGE.pt: weights, optimizer, step and planned steps; with no model,
    mark the stage done (its saved Hugging Face directory is the result)."""
    st = {"step": step, "steps": steps, "done": model is None}
    if model is not None:
        st.update(model=model.state_dict(), optimizer=opt.state_dict())
    save_state(resume_dir, st, name=stage)


def _restore(model, cfg: LoopConfig, state: dict | None):
    """(optimizer, start step): fresh, or the resumed stage's weights and optimizer loaded."""
    opt = make_optimizer(model, cfg)
    if not state:
        return opt, 0
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    _say(f"resuming {cfg.stage} at step {state['step']} of {state['steps']}")
    return opt, state["step"]


def _split(a: TrainArgs, out: Path):
    """The corpus, its held-out files written to OUT/split.json."""
    corpus = load_corpus(
        a.corpus, include=a.include, exclude_dirs=a.exclude_dirs, heldout_frac=a.heldout_frac
    )
    out.mkdir(parents=True, exist_ok=True)
    split = {
        "corpus_root": str(corpus.root),
        "corpus_is_stdlib": a.corpus is None,
        "include": list(a.include),
        "exclude_dirs": list(a.exclude_dirs),
        "rule": "held out iff sha256('duet-heldout-v1:' + relative_path) / 2**256 < heldout_frac",
        "heldout_frac": a.heldout_frac,
        "seq_len": a.seq_len,
        "train_files": len(corpus.train),
        "heldout": list(corpus.heldout),
    }
    (out / "split.json").write_text(json.dumps(split, indent=1) + "\n")
    _say(f"corpus {corpus.root}: {len(corpus.train)} train files, {len(corpus.heldout)} held out")
    return corpus


def _tokenize(run: Run, corpus, skip_target: bool) -> None:
    """The tokenizer (trained on train files only; reused as-is when the target is reused)
    saved to a temporary dir, and the token streams, into `run`."""
    a, out = run.a, run.out
    run.tok_dir = Path(tempfile.mkdtemp(prefix="duet-tok-"))
    if skip_target:
        if not (out / "target" / "config.json").is_file():
            raise DuetError(f"--skip-target: no trained target in {out / 'target'}")
        tok = load_tokenizer(out / "target")
    elif a.arch == "qwen3_5":
        from runtime.assets import default_pair

        tok = load_tokenizer(default_pair()[0])  # the embedded pair's vocabulary
    else:
        tok = train_tokenizer(corpus.texts("train"), a.vocab_size)
    save_tokenizer(tok, run.tok_dir)
    run.eos, run.vocab = eos_id(tok), tok.get_vocab_size()
    enc = lambda texts: [e.ids for e in tok.encode_batch(texts)]  # noqa: E731
    run.train_stream = train = token_stream(corpus.texts("train"), enc, run.eos)
    run.held_stream = held = token_stream(corpus.texts("heldout"), enc, run.eos)
    run.quick_windows = eval_windows(held, a.seq_len, 8 * a.seq_len)
    run.n_bytes = sum((corpus.root / f).stat().st_size for f in corpus.train)
    run.probe_ids = torch.from_numpy(held[: min(128, len(held))].astype(np.int64))[None]
    _say(
        f"tokenizer: vocab {run.vocab}; train {len(train)} tokens "
        f"({run.n_bytes / len(train):.2f} bytes/token), held-out {len(held)} tokens"
    )


def _plan(run: Run, t_cfg, d_cfg, deadline: float, reserve: float, skip_target: bool):
    """Step counts that fit before `deadline`, from step times measured on throwaway models."""
    a, dev, bf16 = run.a, run.a.device, run.bf16
    probe = BatchSampler(run.train_stream, a.batch_size, a.seq_len, seed=a.seed + 99)
    tm = causal_lm(t_cfg).to(dev)
    t_step = planning.time_steps(tm, ce_step(tm), probe, bf16=bf16, device=dev)
    dm = causal_lm(d_cfg).to(dev)
    d_step = planning.time_steps(
        dm, distill_step(dm, tm.eval(), a.draft_ce_weight), probe, bf16=bf16, device=dev
    )
    del tm, dm
    remaining = deadline - time.monotonic()
    plan = planning.plan_steps(remaining, t_step, d_step, reserve_s=reserve)
    if skip_target:
        plan = planning.plan_steps(remaining, t_step, d_step, target_frac=0.0, reserve_s=reserve)
    _say(plan.describe(a.batch_size * a.seq_len))
    return plan


def _train_stage(run: Run, stage: str, model, step_fn, cfg: LoopConfig, state, seed: int):
    """Train `model` as STAGE (resumed from `state`), saved to OUT/STAGE; the loop's summary
    with the reload check of the saved weights."""
    opt, start = _restore(model, cfg, state)

    def ckpt(step):
        save_model(model, run.out / stage, run.tok_dir, run.eos)
        _save_state(run.resume_dir, stage, model, opt, step, cfg.steps)

    a = run.a
    summary = train_loop(
        model,
        step_fn,
        BatchSampler(run.train_stream, a.batch_size, a.seq_len, seed + start),
        cfg,
        run.log_path,
        ckpt,
        quick_eval(model, run.quick_windows, run.bf16),
        optimizer=opt,
        start_step=start,
    )
    save_model(model, run.out / stage, run.tok_dir, run.eos)
    _save_state(run.resume_dir, stage, None, None, summary["steps"], cfg.steps)
    summary["reload_check"] = check_reload(model.cpu(), run.out / stage, run.probe_ids)
    return summary


def _train_target(run: Run, t_cfg, steps: int, limit: float | None, state) -> dict:
    """Stage 1: the target, next-token loss on the train stream."""
    a = run.a
    if not state:
        run.log_path.write_text("")
    seed_everything(a.seed)
    target = causal_lm(t_cfg).to(a.device)
    cfg = run.loop_config("target", steps, a.target_lr, limit)
    return _train_stage(run, "target", target, ce_step(target), cfg, state, a.seed + 1)


def _train_draft(run: Run, d_cfg, steps: int, deadline, reserve: float, plan) -> tuple:
    """Stage 2: the draft, distilled from the saved target; (summary, steps planned)."""
    a = run.a
    teacher = load_model(run.out / "target").to(a.device)  # as saved (bf16 weights)
    for p in teacher.parameters():
        p.requires_grad_(False)
    seed_everything(a.seed + 2)
    draft = causal_lm(d_cfg).to(a.device)
    state = load_state(run.resume_dir, "draft")
    if state:
        steps = state["steps"]
    limit = None
    if deadline is not None:
        limit = max(deadline - time.monotonic() - reserve, 30.0)
        if plan and not (a.draft_steps or state):
            steps = min(steps, max(1, int(limit * 0.9 / plan.draft_step_s)))
    cfg = run.loop_config("draft", steps, a.draft_lr, limit)
    if state and state["done"]:  # --resume after a finished draft: evaluate only
        return {"steps": state["step"], "resumed_done": True}, steps
    step_fn = distill_step(draft, teacher, a.draft_ce_weight)
    return _train_stage(run, "draft", draft, step_fn, cfg, state, a.seed + 3), steps


def _report(run: Run, corpus, plan, steps: dict, summary: dict, stages: dict) -> dict:
    a = run.a
    train_stream = run.train_stream
    return {
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
            "heldout_tokens": int(len(run.held_stream)),
            "train_bytes_per_token": run.n_bytes / len(train_stream),
        },
        "plan": asdict(plan) if plan else None,
        "steps": steps,
        "tokens_per_step": a.batch_size * a.seq_len,
        **summary,
        "stages": stages,
    }


def _evaluate(a: TrainArgs, out: Path, corpus) -> dict:
    _say("evaluating the saved pair ...")
    ev = evaluate_pair(
        out / "target",
        out / "draft",
        corpus,
        seq_len=a.seq_len,
        max_new=a.eval_max_new_tokens,
        max_prompts=a.eval_prompts,
    )
    _say(
        f"held-out loss: target {ev['target_heldout_loss']:.4f}, draft "
        f"{ev['draft_heldout_loss']:.4f}; greedy acceptance {ev['greedy_acceptance']:.3f} "
        f"over {ev['positions']} positions"
    )
    return ev


def train_pair(a: TrainArgs) -> dict:
    """Run the whole pipeline; returns the report also written to training_report.json."""
    t_start = time.monotonic()
    check_device(a.device)
    deadline = t_start + a.time_budget_min * 60 if a.time_budget_min else None
    reserve = planning.EVAL_RESERVE_S if a.evaluate else planning.SAVE_RESERVE_S
    torch.set_num_threads(a.threads)
    seed_everything(a.seed)
    out = Path(a.out)
    run = Run(a, out, out / RESUME_DIR, bf16=a.arch != "qwen3_5")  # see the module docstring
    if not a.resume:
        shutil.rmtree(run.resume_dir, ignore_errors=True)
    target_state = load_state(run.resume_dir, "target")
    skip_target = a.skip_target or bool(target_state and target_state["done"])
    corpus = _split(a, out)
    _tokenize(run, corpus, skip_target)
    summary, t_cfg, d_cfg = pair_configs(a, run.vocab, run.eos)
    _say(
        f"target {summary['target_params'] / 1e6:.2f} M params, draft "
        f"{summary['draft_params'] / 1e6:.2f} M params, draft/target compute per token "
        f"{summary['draft_target_flop_ratio']:.4f}"
    )
    plan = None
    if a.time_budget_min:
        plan = _plan(run, t_cfg, d_cfg, deadline, reserve, skip_target)
    target_steps = a.target_steps or (plan.target_steps if plan else None)
    draft_steps = a.draft_steps or (plan.draft_steps if plan else None)
    if target_state and not target_state["done"]:
        target_steps = target_state["steps"]  # a resumed stage keeps its schedule
    assert target_steps and draft_steps, "the CLI requires steps or a time budget"
    stages = {}
    if not skip_target:
        limit = plan.target_time_s if plan else None
        stages["target"] = _train_target(run, t_cfg, target_steps, limit, target_state)
    stages["draft"], draft_steps = _train_draft(run, d_cfg, draft_steps, deadline, reserve, plan)
    shutil.rmtree(run.tok_dir, ignore_errors=True)
    if a.arch != "qwen3":  # our runtime's reference must read the checkpoint as transformers does
        for name in ("target", "draft"):
            if name in stages:
                stages[name]["reference_parity"] = check_reference(out / name, run.probe_ids)
    steps = {"target": target_steps, "draft": draft_steps}
    report = _report(run, corpus, plan, steps, summary, stages)
    report["train_wall_s"] = round(time.monotonic() - t_start, 1)
    if a.evaluate:
        report["evaluation"] = _evaluate(a, out, corpus)
    report["total_wall_s"] = round(time.monotonic() - t_start, 1)
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
