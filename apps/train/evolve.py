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
import shutil
import time
from pathlib import Path

import torch

from runtime.adapter import write_base_record
from runtime.errors import DuetError

from .checkpoint import load_model, save_model
from .corpus import BatchSampler, eval_windows, token_stream
from .domains import DOMAINS, load_domain
from .evaluate import heldout_loss
from .loop import LoopConfig, make_optimizer, train_loop
from .losses import next_token_loss
from .tokenizer import eos_id, load_tokenizer

LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m apps.train evolve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument(
        "--base",
        required=True,
        help="base target: a checkpoint directory or a known model's name (smollm2-135m-instruct)",
    )
    ap.add_argument("--domain", required=True, choices=DOMAINS, help="fine-tuning corpus")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--lora-rank", type=int, default=8, help="LoRA rank r (default 8)")
    ap.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2r)")
    ap.add_argument("--full", action="store_true", help="full fine-tune instead of LoRA")
    ap.add_argument("--steps", type=int, default=2000, help="planned steps (default 2000)")
    ap.add_argument("--time-budget-min", type=float, default=None, help="wall-clock cap")
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak LR (default 5e-3 LoRA, 1e-3 full; a pretrained model wants about 1e-4 "
        "for --full: 1e-3 raised SmolLM2-135M's held-out stdlib-tests loss from 2.68 to 2.89 "
        "in 45 steps of 8 x 128)",
    )
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt-every", type=int, default=100, help="steps between resume states")
    ap.add_argument("--fresh", action="store_true", help="ignore a resume state in OUT")
    return ap


def _trainable(model) -> dict:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def run(a: argparse.Namespace) -> dict:
    """Fine-tune, save, evaluate held-out loss before and after; returns the report."""
    if a.lora_rank < 1 or a.steps < 1 or a.threads < 1:
        raise DuetError("--lora-rank, --steps and --threads must be positive")
    from runtime.load import resolve

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
    L = model.config.num_hidden_layers
    with torch.no_grad():  # float32: CPUs without bf16 units emulate it ~15x slower
        loss_before = heldout_loss(model, windows)
    if a.full:
        model.requires_grad_(True)
    else:
        from peft import LoraConfig, get_peft_model

        r = a.lora_rank
        lcfg = LoraConfig(r=r, lora_alpha=a.lora_alpha or 2 * r, lora_dropout=0.0,
                          target_modules=LORA_MODULES, layers_to_transform=list(range(L - 1)),
                          layers_pattern="layers", task_type="CAUSAL_LM")  # fmt: skip
        model = get_peft_model(model, lcfg)  # backbone frozen; layer L-1 and lm_head untouched
    out.mkdir(parents=True, exist_ok=True)
    resume = out / ".resume"
    cfg = LoopConfig(stage=f"evolve-{'full' if a.full else 'lora'}-{a.domain}", steps=a.steps,
                     lr=a.lr or (1e-3 if a.full else 5e-3), warmup=a.warmup,
                     weight_decay=0.0 if not a.full else 0.1,
                     time_limit_s=a.time_budget_min * 60 if a.time_budget_min else None,
                     ckpt_every=a.ckpt_every, bf16=False)  # fmt: skip
    opt = make_optimizer(model, cfg)
    start = 0
    if a.fresh:
        shutil.rmtree(resume, ignore_errors=True)
    if (resume / "state.pt").is_file():
        st = torch.load(resume / "state.pt", weights_only=False)
        model.load_state_dict(st["trainable"], strict=False)
        opt.load_state_dict(st["optimizer"])
        start = st["step"]
        print(f"resuming {out} at step {start}", flush=True)

    def save_resume(step: int) -> None:
        resume.mkdir(exist_ok=True)
        tmp = resume / "state.pt.tmp"
        torch.save(
            {"trainable": _trainable(model), "optimizer": opt.state_dict(), "step": step}, tmp
        )
        tmp.replace(resume / "state.pt")

    sampler = BatchSampler(train_ids, a.batch_size, a.seq_len, a.seed + start)
    t0 = time.monotonic()
    summary = train_loop(
        model,
        lambda x, y: (next_token_loss(model(input_ids=x).logits, y), {}),
        sampler,
        cfg,
        out / "loss_log.jsonl",
        checkpoint=save_resume,
        optimizer=opt,
        start_step=start,
    )
    save_resume(summary["steps"])
    with torch.no_grad():
        loss_after = heldout_loss(model, windows)
    if a.full:
        save_model(model, out / "tmp_full", base, eos)
        for f in (out / "tmp_full").iterdir():
            f.replace(out / f.name)
        (out / "tmp_full").rmdir()
    else:
        model.save_pretrained(str(out))
        (out / "README.md").unlink(missing_ok=True)  # peft's empty model card
    write_base_record(out, base)
    report = {"domain": a.domain, "mode": "full" if a.full else f"lora-r{a.lora_rank}",
              "train_docs": len(dom.train), "heldout_docs": len(dom.heldout),
              "train_tokens": int(len(train_ids)), "heldout_loss_base": round(loss_before, 4),
              "heldout_loss_evolved": round(loss_after, 4), "wall_s": round(time.monotonic() - t0, 1),
              **{k: summary[k] for k in ("steps", "steps_planned", "time_capped")},
              "trainable_params": int(sum(v.numel() for v in _trainable(model).values())),
              "heldout_token_windows": len(windows), "seed": a.seed}  # fmt: skip
    (out / "evolve_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str]) -> int:
    report = run(build_parser().parse_args(argv))
    print(json.dumps(report, indent=2))
    return 0
