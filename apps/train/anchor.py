"""`python -m apps.train anchor`: train FlexSpec's anchor draft once against the base target.

Alg. 1 of the FlexSpec paper: copy the base's last block B_L and freeze it with the embedding,
then train the small head H_small (eq. 4) with L = λ1·L_feat + λ2·L_KD: L_feat (eq. 5) is the
mean squared distance between W_p·h_d and the base's final hidden state h_t (W_p a learnable
projection used only in training), L_KD (eq. 6) is T²·KL(σ(z_t/T) ‖ σ(z_d/T)). The data is the
base's own training corpus (the standard library's source, train split), a "general corpus" as
the paper's RedPajama is to Llama-2. How the draft is laid out and shipped: runtime/anchor.py.

Writes OUT/anchor_head.safetensors (bf16), OUT/anchor.json, OUT/loss_log.jsonl, and a
resumable state in OUT/.resume/. It does not evaluate acceptance (apps.bench evolving does).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from runtime.adapter import base_record
from runtime.anchor import ANCHOR_RECORD, HEAD_FILE, anchor_config, assemble_state, head_layer
from runtime.errors import DuetError

from .args import REQUIRED, add_loop_args, check_device, command_parser
from .corpus import BatchSampler, load_corpus, token_stream
from .loop import budget_s, head_config, make_optimizer, train_resumable
from .losses import distill_loss
from .resume import RESUME_DIR, resume_from, save_state
from .tokenizer import eos_id, load_tokenizer


def head_prefixes(keep_first: int = 0) -> tuple[str, ...]:
    """The trained tensors' name prefixes: the head layer's MLP and pre-norm, the final norm."""
    hl = f"model.layers.{head_layer(keep_first)}."
    return (hl + "mlp.", hl + "post_attention_layernorm.", "model.norm.")


class AnchorStudent(torch.nn.Module):
    """The anchor draft (2 layers; K + 2 for the `keep_first` ablation) plus W_p (eq. 5); only
    the head and W_p require gradients."""

    def __init__(self, base_dir: Path, seed: int, keep_first: int = 0):
        super().__init__()
        self.prefixes = head_prefixes(keep_first)
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModelForCausalLM

        base_cfg = json.loads((base_dir / "config.json").read_text())
        base_state = {}
        for f in sorted(base_dir.glob("*.safetensors")):
            base_state.update(load_file(str(f)))
        torch.manual_seed(seed)
        cfg = AutoConfig.for_model(**anchor_config(base_cfg, keep_first))
        self.draft = AutoModelForCausalLM.from_config(cfg).float()
        # H_small initialised randomly (Alg. 1), the final norm from the base's
        init = {k: v for k, v in self.draft.state_dict().items() if k.startswith(self.prefixes[:2])}
        init["model.norm.weight"] = base_state["model.norm.weight"]
        self.draft.load_state_dict(
            assemble_state(base_state, init, base_cfg["num_hidden_layers"], keep_first)
        )
        for name, p in self.draft.named_parameters():
            p.requires_grad_(name.startswith(self.prefixes))
        H = base_cfg["hidden_size"]
        self.w_p = torch.nn.Linear(H, H, bias=False)  # W_p of eq. (5)
        torch.nn.init.eye_(self.w_p.weight)

    def head_state(self) -> dict:
        return {
            k: v.detach().clone()
            for k, v in self.draft.state_dict().items()
            if k.startswith(self.prefixes)
        }


def anchor_step(teacher, student: AnchorStudent, lambda_feat: float, lambda_kd: float, T: float):
    """The step function of Alg. 1: (x, y) -> (λ1·L_feat + λ2·L_KD, metrics)."""

    def step(x, y):
        with torch.no_grad():
            t = teacher(input_ids=x, output_hidden_states=True)
        s = student.draft(input_ids=x, output_hidden_states=True)
        h_t, h_d = t.hidden_states[-1].float(), s.hidden_states[-1].float()  # (B, T, H)
        l_feat = ((student.w_p(h_d) - h_t) ** 2).sum(-1).mean()  # eq. (5)
        l_kd, m = distill_loss(s.logits, t.logits, y, temperature=T)  # eq. (6)
        loss = lambda_feat * l_feat + lambda_kd * l_kd  # L = λ1 L_feat + λ2 L_KD
        return loss, {"l_feat": l_feat.item(), "l_kd": l_kd.item(), "top1_agree": m["top1_agree"]}

    return step


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("anchor", __doc__)
    add_loop_args(ap, base=REQUIRED, out=REQUIRED)
    ap.add_argument("--lambda-feat", type=float, default=0.01, help="λ1 of L_feat (default 0.01)")
    ap.add_argument("--lambda-kd", type=float, default=1.0, help="λ2 of L_KD (default 1)")
    ap.add_argument("--temperature", type=float, default=1.0, help="T of eq. 6 (default 1)")
    add_loop_args(ap, steps=2000, time_budget_min=None, lr=3e-3, batch_size=8, seq_len=128)
    add_loop_args(ap, max_corpus_chars=4_000_000, threads=1, device="cpu")
    ap.add_argument(
        "--keep-first",
        type=int,
        default=0,
        metavar="K",
        help="ABLATION, not eq. 4: also keep the base's first K blocks (frozen) "
        "before the anchor block (default 0: FlexSpec's anchor)",
    )
    add_loop_args(ap, seed=0, ckpt_every=100, fresh=False)
    return ap


def save_anchor(student: AnchorStudent, out: Path, base: Path, meta: dict) -> None:
    """Write the head (bf16) and anchor.json, which names the base by its weights hash (the
    tokenizer and frozen parts are the base's: runtime/anchor.py copies them at assembly)."""
    from safetensors.torch import save_file

    head = {k: v.to("cpu", torch.bfloat16).contiguous() for k, v in student.head_state().items()}
    save_file(head, str(out / HEAD_FILE), metadata={"format": "pt"})
    rec = {"kind": "flexspec-anchor-draft", "base": base_record(base),
           "base_hint": os.path.relpath(base.resolve(), out.resolve()),
           **meta}  # fmt: skip
    (out / ANCHOR_RECORD).write_text(json.dumps(rec, indent=2) + "\n")


def run(a: argparse.Namespace) -> dict:
    from runtime.loading import resolve

    base, out = resolve(a.base, "base"), Path(a.out)
    if not (base / "config.json").is_file():
        raise DuetError(f"--base {base}: not a checkpoint directory (no config.json)")
    if a.steps < 1 or a.threads < 1 or a.temperature <= 0:
        raise DuetError("--steps, --threads and --temperature must be positive")
    n_base = json.loads((base / "config.json").read_text())["num_hidden_layers"]
    if not 0 <= a.keep_first < n_base - 1:
        raise DuetError(
            f"--keep-first {a.keep_first}: the base has {n_base} blocks; keep 0 to "
            f"{n_base - 2} of them before its last"
        )
    check_device(a.device)
    torch.set_num_threads(a.threads)
    from .checkpoint import load_model

    teacher = load_model(base).requires_grad_(False)
    student = AnchorStudent(base, a.seed, a.keep_first)
    teacher, student = teacher.to(a.device), student.to(a.device)
    tok = load_tokenizer(base / "tokenizer.json")
    eos = eos_id(tok, base)
    corpus = load_corpus()
    texts = corpus.texts("train", a.max_corpus_chars)
    ids = token_stream(texts, lambda ts: [e.ids for e in tok.encode_batch(ts)], eos)
    out.mkdir(parents=True, exist_ok=True)
    cfg = head_config("anchor", a, warmup=20, time_limit_s=budget_s(a), device=a.device)
    opt = make_optimizer(student, cfg)
    start = resume_from(
        out,
        a.fresh,
        opt,
        lambda st: student.load_state_dict(st["student"], strict=False),
        map_location=a.device,
    )

    def save_resume(step: int) -> None:
        trainable = {
            k: v
            for k, v in student.state_dict().items()
            if k.startswith("w_p") or k[len("draft.") :].startswith(student.prefixes)
        }
        state = {"student": trainable, "optimizer": opt.state_dict(), "step": step}
        save_state(out / RESUME_DIR, state)

    step_fn = anchor_step(teacher, student, a.lambda_feat, a.lambda_kd, a.temperature)
    t0 = time.monotonic()
    sampler = BatchSampler(ids, a.batch_size, a.seq_len, a.seed + start)
    summary = train_resumable(student, step_fn, sampler, cfg, out, save_resume, opt, start)
    L = teacher.config.num_hidden_layers
    meta = {"anchor_layer": L - 1, "keep_first": a.keep_first,
            "kind": "ablation: first blocks kept" if a.keep_first else "eq. 4",
            "lambda_feat": a.lambda_feat, "lambda_kd": a.lambda_kd,
            "temperature": a.temperature, "steps": summary["steps"], "train_tokens": int(len(ids)),
            "final_loss_ema": summary["final_loss_ema"],
            "wall_s": round(time.monotonic() - t0, 1),
            "corpus": "stdlib source, train split (apps/train/corpus.py)", "seed": a.seed,
            "device": a.device, "batch_size": a.batch_size, "seq_len": a.seq_len,
            "lr": a.lr}  # fmt: skip
    save_anchor(student, out, base, meta)
    return meta


def main(argv: list[str]) -> int:
    print(json.dumps(run(build_parser().parse_args(argv)), indent=2))
    return 0
