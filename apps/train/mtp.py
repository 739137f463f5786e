"""`python -m apps.train mtp`: fit a multi-token-prediction head for any of our targets.

    nice -n 10 python -m apps.train mtp --target runtime/assets/default/target \\
        --time-budget-min 30 --threads 1

The head (runtime/drafts/mtp/torch.py: fc over the normed next-token embedding and the
target's normed last hidden state, one decoder layer of the target's own family, a norm; the
target's LM head shared) is distilled from the frozen target on the corpus (apps/train/
corpus.py, the stdlib's source by default): at grid entry j (token x_{j+1}, RoPE position j)
it must give the target's own law of x_{j+2}, KL(p_target ‖ q_head) at temperature 1 (the
loss of apps/train/losses.py), plus `--tv-weight` x TV(p, q), whose complement is the
chance that sampling at T = 1 accepts the head's token (the committed head: KL alone to step
1110, then KL + 1.0 TV). Drafting chains the head on its own output, so the loss is
unrolled `--unroll` steps: step r reads step r-1's output at entry j-1 and attends, as at
inference, to the target-fed entries up to j-r+1 and to its own chain's entries after them
(`chain_mask`). The layer starts as a copy of the target's last layer, fc as [small; I].

Writes OUT/model.safetensors (`mtp.*` tensors, bf16: the layout Qwen3.5 checkpoints ship),
OUT/mtp.json (the target's identity, the schedule, held-out top-1 agreement per chained
step), OUT/loss_log.jsonl, and a resumable state in OUT/.resume/ (rerun the same command to
go on; --fresh to start over). OUT defaults to TARGET/.duet/mtp/, where `--draft mtp` looks
when the checkpoint itself has no `mtp.*` weights. The target is never modified.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from runtime.errors import DuetError

from .args import add_loop_args, command_parser, positive
from .corpus import BatchSampler, eval_windows, load_corpus, token_stream
from .loop import budget_s, head_config, make_optimizer, train_resumable
from .losses import distill_loss
from .resume import RESUME_DIR, resume_from, save_state
from .tokenizer import eos_id, load_tokenizer


def init_head(target):
    """An MTPHead for `target` (a TorchCausalLM): its layer copied from the target's last one
    with its two output projections zeroed (the layer starts as the identity), its output norm
    from the target's final norm, fc = [N(0, 0.02) | I]: it starts by repeating the target's
    own law at position i, a better start than the copied layer on a stream it never saw."""
    from runtime.drafts.mtp.torch import MTPHead

    m = target.module
    head = MTPHead(target.config).float()
    head.layers[0].load_state_dict(m.model.layers[-1].state_dict())
    head.norm.load_state_dict(m.model.norm.state_dict())
    H = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.normal_(0, 0.02)
        head.fc.weight[:, H:] = torch.eye(H)
        layer = head.layers[0]
        layer.mlp.down_proj.weight.zero_()
        layer.self_attn.o_proj.weight.zero_()
    return head


def chain_mask(n: int, r: int) -> torch.Tensor:
    """Which keys entry j of chained step r (1-based) sees, over r blocks of n keys (block s:
    step s's entries): target-fed entries c <= j - r + 1 and, from each later step s, entry
    j - r + s only: what the head's cache holds at inference when it drafts token r. (n, r n)."""
    j = torch.arange(n)[:, None]
    c = torch.arange(n)[None]
    blocks = [c <= j - r + 1] + [c == j - r + s for s in range(2, r + 1)]
    return torch.cat(blocks, dim=1)


def target_pass(target, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target over x (B, T): post-norm hidden (B, T, H) and logits (B, T, V)."""
    m = target.module
    with torch.inference_mode():
        h = target.forward_layers(
            x.numpy(), target.new_cache(x.shape[0]), 0, target.config.num_layers
        )
        hid, logits = m.model.norm(h), m.head(h)
    return hid.clone(), logits.clone()  # plain tensors: autograd may save them


def chain_outputs(target, head, x: torch.Tensor, hid: torch.Tensor, unroll: int) -> list:
    """The head's post-norm outputs (B, T-1, H) for chained steps 1..unroll over x (B, T).

    Entry j reads token x_{j+1} at RoPE position j; step 1 reads the target's hidden h_j, step
    r > 1 reads step r-1's output at entry j-1 and sees keys as `chain_mask` says. Output j of
    step r is meaningful for j >= r-1 (the chain starts inside the window)."""
    m = target.module
    B, T = x.shape
    n = T - 1
    emb = m.model.embed_tokens(x[:, 1:]).detach()
    pos = torch.arange(n)[None].expand(B, n)
    empty = emb.new_zeros(B, target.config.num_kv_heads, 0, target.config.head_dim)
    inp, ks, vs, outs = hid[:, :n], [], [], []
    for r in range(1, unroll + 1):
        past = (torch.cat(ks, 2), torch.cat(vs, 2)) if ks else (empty, empty)
        mask = chain_mask(n, r)[None, None].expand(B, 1, n, r * n)
        out, k, v = head.step(emb, inp, pos, mask, past, m.inv_freq)
        ks.append(k[:, :, -n:])
        vs.append(v[:, :, -n:])
        outs.append(out)
        inp = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # shift by one
    return outs


def mtp_step(target, head, unroll: int, tv_weight: float = 0.0):
    """(x, y) -> (mean loss over the unrolled steps, metrics): the step function for train_loop.

    The loss per step is KL(p_target ‖ q_head) plus `tv_weight` x TV(p, q) (1 - TV: the
    chance that rejection sampling at T = 1 accepts the head's token)."""
    m = target.module
    w = m.model.embed_tokens.weight if target.config.tie_word_embeddings else m.lm_head.weight

    def step(x, y):
        hid, teach = target_pass(target, x)
        total, metrics = 0.0, {}
        for r, out in enumerate(chain_outputs(target, head, x, hid, unroll), start=1):
            # step r at entry j predicts x_{j+2}: the teacher is the target's logits at j + 1
            loss, mt = distill_loss(
                out[:, r - 1 :] @ w.T, teach[:, r:], y[:, r:], tv_weight=tv_weight
            )
            total = total + loss
            metrics[f"kl_{r}"], metrics[f"top1_{r}"] = mt["kl"], mt["top1_agree"]
            metrics[f"tv_{r}"] = mt["tv"]
        return total / unroll, metrics

    return step


@torch.no_grad()
def heldout_agreement(target, head, windows, unroll: int) -> dict:
    """Mean KL, top-1 agreement and TV distance to the target per chained step on held-out
    windows."""
    step = mtp_step(target, head, unroll)
    acc: dict = {}
    for wdw in windows:
        x = torch.from_numpy(wdw[None, :-1])
        _, mt = step(x, torch.from_numpy(wdw[None, 1:]))
        for k, v in mt.items():
            acc.setdefault(k, []).append(v)
    return {f"heldout_{k}": round(float(np.mean(v)), 4) for k, v in acc.items()}


def save_head(head, out: Path, target_dir: Path, meta: dict) -> Path:
    """Write OUT/model.safetensors (`mtp.*`, bf16) and OUT/mtp.json."""
    from safetensors.torch import save_file

    from runtime.adapter import base_record
    from runtime.drafts.mtp.torch import WEIGHTS

    state = {
        "mtp." + k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()
    }
    tmp = out / (WEIGHTS + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / WEIGHTS)
    rec = {"kind": "duet-mtp-head", "target": base_record(target_dir), **meta}
    (out / "mtp.json").write_text(json.dumps(rec, indent=2) + "\n")
    return out / WEIGHTS


# where a loop flag means more here than in LOOP_FLAGS (apps/train/args.py)
HELPS = {
    "out": "output directory (default TARGET/.duet/mtp, where --draft mtp looks)",
}


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("mtp", __doc__)
    ap.add_argument("--target", required=True, help="target checkpoint directory (frozen)")
    add_loop_args(ap, out=None, corpus=None, steps=3000, time_budget_min=None, lr=2e-3, helps=HELPS)
    ap.add_argument("--unroll", type=int, default=3, help="chained steps in the loss (default 3)")
    ap.add_argument(
        "--tv-weight",
        type=float,
        default=0.0,
        help="add this x TV(p_target, q_head) to the KL loss: 1 - TV is the chance "
        "a token sampled at T = 1 is accepted (default 0)",
    )
    add_loop_args(ap, batch_size=8, seq_len=128, max_corpus_chars=4_000_000)
    ap.add_argument("--eval-tokens", type=int, default=4096, help="held-out tokens (default 4096)")
    add_loop_args(ap, threads=1, seed=0, ckpt_every=50, fresh=False)
    return ap


def run(a: argparse.Namespace) -> dict:
    from runtime.backends import load_model
    from runtime.drafts.mtp.torch import mtp_sidecar

    tdir = Path(a.target)
    if not (tdir / "config.json").is_file():
        raise DuetError(f"--target {tdir}: not a checkpoint directory (no config.json)")
    if not (tdir / "tokenizer.json").is_file():
        raise DuetError(f"--target {tdir}: no tokenizer.json to read the corpus with")
    positive(a, "steps", "threads", "unroll", "batch_size", "seq_len")
    if a.tv_weight < 0:
        raise DuetError(f"--tv-weight must be >= 0 (got {a.tv_weight})")
    if a.time_budget_min is not None and a.time_budget_min <= 0:
        raise DuetError(f"--time-budget-min must be positive (got {a.time_budget_min})")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    target = load_model(tdir, "torch", threads=a.threads)
    target.module.requires_grad_(False)
    head = init_head(target)
    tok = load_tokenizer(tdir / "tokenizer.json")
    corpus = load_corpus(a.corpus)

    def encode(ts):
        return [e.ids for e in tok.encode_batch(ts)]

    ids = token_stream(corpus.texts("train", a.max_corpus_chars), encode, eos_id(tok, tdir))
    held = token_stream(corpus.texts("heldout", 4 * a.eval_tokens), encode, eos_id(tok, tdir))
    out = Path(a.out) if a.out else mtp_sidecar(tdir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = head_config("mtp", a, warmup=min(20, a.steps), time_limit_s=budget_s(a))
    opt = make_optimizer(head, cfg)
    start = resume_from(out, a.fresh, opt, lambda st: head.load_state_dict(st["head"]))

    def save_resume(step: int) -> None:
        state = {"head": head.state_dict(), "optimizer": opt.state_dict(), "step": step}
        save_state(out / RESUME_DIR, state)

    t0 = time.monotonic()
    sampler = BatchSampler(ids, a.batch_size, a.seq_len, a.seed + start)
    step_fn = mtp_step(target, head, a.unroll, a.tv_weight)
    summary = train_resumable(head, step_fn, sampler, cfg, out, save_resume, opt, start)
    windows = eval_windows(held, a.seq_len, a.eval_tokens)
    meta = {
        "steps": summary["steps"],
        "unroll": a.unroll,
        "tv_weight": a.tv_weight,
        "batch_size": a.batch_size,
        "seq_len": a.seq_len,
        "lr": a.lr,
        "train_tokens": int(len(ids)),
        "final_loss_ema": summary["final_loss_ema"],
        "time_capped": summary["time_capped"],
        "wall_s": round(time.monotonic() - t0, 1),
        "seed": a.seed,
        "corpus": str(a.corpus or "stdlib source, train split (apps/train/corpus.py)"),
        **heldout_agreement(target, head, windows, a.unroll),
    }
    save_head(head, out, tdir, meta)
    return {"wrote": str(out), **meta}


def main(argv: list[str]) -> int:
    print(json.dumps(run(build_parser().parse_args(argv)), indent=2))
    return 0
