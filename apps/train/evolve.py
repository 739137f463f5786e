"""`python -m apps.train evolve`: a target evolved from the base, by LoRA or full fine-tuning.

LoRA uses `peft` (the maintained implementation, whose adapter format every runtime reads) on a
frozen backbone, and, as FlexSpec §IV-A requires, leaves the last transformer block and the LM
head untouched: adapters go into layers 0..L-2 only (`layers_to_transform`), so the anchor
block a FlexSpec draft copies stays the one the target runs. `--full` trains every weight
(Table II's "Code (Full)" row) and writes an ordinary checkpoint.

Writes OUT/ (adapter_config.json + adapter_model.safetensors + duet_base.json, or a full
checkpoint + duet_base.json), OUT/evolve_report.json, OUT/loss_log.jsonl, and a resumable
state in OUT/.resume/ (trainable weights, optimizer, step) every --ckpt-every steps and at the
end of a time-capped run: the same command continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from runtime.adapter import write_base_record
from runtime.errors import DuetError

from .args import REQUIRED, add_loop_args, command_parser
from .checkpoint import load_model, save_model
from .corpus import BatchSampler, eval_windows, token_stream
from .domains import DOMAINS, load_domain
from .evaluate import heldout_loss
from .loop import LoopConfig, budget_s, make_optimizer, train_resumable
from .losses import next_token_loss
from .resume import RESUME_DIR, resume_from, save_state
from .tokenizer import eos_id, load_tokenizer

LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# where a loop flag means more here than in LOOP_FLAGS (apps/train/args.py)
HELPS = {
    "lr": "peak LR (default 5e-3 LoRA, 1e-3 full; a pretrained model wants about 1e-4 for "
    "--full: 1e-3 raised SmolLM2-135M's held-out stdlib-tests loss from 2.68 to 2.89 in 45 "
    "steps of 8 x 128)"
}


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("evolve", __doc__)
    add_loop_args(ap, base=REQUIRED)
    ap.add_argument("--domain", required=True, choices=DOMAINS, help="fine-tuning corpus")
    add_loop_args(ap, out=REQUIRED)
    ap.add_argument("--lora-rank", type=int, default=8, help="LoRA rank r (default 8)")
    ap.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2r)")
    ap.add_argument("--full", action="store_true", help="full fine-tune instead of LoRA")
    add_loop_args(ap, steps=2000, time_budget_min=None, lr=None, helps=HELPS)
    add_loop_args(ap, batch_size=8, seq_len=128)
    add_loop_args(ap, warmup=20, threads=1, seed=0, ckpt_every=100, fresh=False)
    return ap


def _trainable(model) -> dict:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def _to_train(model, a: argparse.Namespace):
    """The model with what is trained switched on: all of it (--full), or LoRA adapters."""
    if a.full:
        return model.requires_grad_(True)
    from peft import LoraConfig, get_peft_model

    r, L = a.lora_rank, model.config.num_hidden_layers
    lcfg = LoraConfig(
        r=r,
        lora_alpha=a.lora_alpha or 2 * r,
        lora_dropout=0.0,
        target_modules=LORA_MODULES,
        layers_to_transform=list(range(L - 1)),
        layers_pattern="layers",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lcfg)  # backbone frozen; layer L-1 and lm_head untouched


def _save(model, out: Path, base: Path, eos: int, full: bool) -> None:
    """OUT as a checkpoint (--full) or a peft adapter, with the base's record."""
    if full:
        save_model(model, out / "tmp_full", base, eos)
        for f in (out / "tmp_full").iterdir():
            f.replace(out / f.name)
        (out / "tmp_full").rmdir()
    else:
        model.save_pretrained(str(out))
        (out / "README.md").unlink(missing_ok=True)  # peft's empty model card
    write_base_record(out, base)


def run(a: argparse.Namespace) -> dict:
    """Fine-tune, save, evaluate held-out loss before and after; returns the report."""
    if a.lora_rank < 1 or a.steps < 1 or a.threads < 1:
        raise DuetError("--lora-rank, --steps and --threads must be positive")
    from runtime.loading import resolve

    base, out = resolve(a.base, "base"), Path(a.out)
    if not (base / "config.json").is_file():
        raise DuetError(f"--base {base}: not a checkpoint directory (no config.json)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dom = load_domain(a.domain)
    tok = load_tokenizer(base / "tokenizer.json")
    eos = eos_id(tok, base)
    enc = lambda texts: [e.ids for e in tok.encode_batch(texts)]  # noqa: E731
    train_ids = token_stream(iter(dom.texts("train")), enc, eos)
    held_ids = token_stream(iter(dom.texts("heldout")), enc, eos)
    windows = eval_windows(held_ids, a.seq_len, 32 * a.seq_len)
    model = load_model(base)
    with torch.no_grad():  # float32: CPUs without bf16 units emulate it ~15x slower
        loss_before = heldout_loss(model, windows)
    model = _to_train(model, a)
    out.mkdir(parents=True, exist_ok=True)
    cfg = LoopConfig(
        stage=f"evolve-{'full' if a.full else 'lora'}-{a.domain}",
        steps=a.steps,
        lr=a.lr or (1e-3 if a.full else 5e-3),
        warmup=a.warmup,
        weight_decay=0.0 if not a.full else 0.1,
        time_limit_s=budget_s(a),
        ckpt_every=a.ckpt_every,
        bf16=False,
    )
    opt = make_optimizer(model, cfg)
    start = resume_from(
        out, a.fresh, opt, lambda st: model.load_state_dict(st["trainable"], strict=False)
    )

    def save_resume(step: int) -> None:
        state = {"trainable": _trainable(model), "optimizer": opt.state_dict(), "step": step}
        save_state(out / RESUME_DIR, state)

    sampler = BatchSampler(train_ids, a.batch_size, a.seq_len, a.seed + start)
    t0 = time.monotonic()
    step_fn = lambda x, y: (next_token_loss(model(input_ids=x).logits, y), {})  # noqa: E731
    summary = train_resumable(model, step_fn, sampler, cfg, out, save_resume, opt, start)
    with torch.no_grad():
        loss_after = heldout_loss(model, windows)
    _save(model, out, base, eos, a.full)
    report = {"domain": a.domain, "mode": "full" if a.full else f"lora-r{a.lora_rank}",
              "train_docs": len(dom.train), "heldout_docs": len(dom.heldout),
              "train_tokens": int(len(train_ids)), "heldout_loss_base": round(loss_before, 4),
              "heldout_loss_evolved": round(loss_after, 4),
              "wall_s": round(time.monotonic() - t0, 1),
              **{k: summary[k] for k in ("steps", "steps_planned", "time_capped")},
              "trainable_params": int(sum(v.numel() for v in _trainable(model).values())),
              "heldout_token_windows": len(windows), "seed": a.seed}  # fmt: skip
    (out / "evolve_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str]) -> int:
    report = run(build_parser().parse_args(argv))
    print(json.dumps(report, indent=2))
    return 0
