"""`python -m apps.train eagle`: fit a feature-level draft head (EAGLE-3 + FR-Spec) to any target.

    python -m apps.train eagle --target smollm2-135m-instruct --time-budget-min 90 \
        --data-budget-min 40 --batch-size 8 --seq-len 128 --lr 2e-3 --steps 3000

(SmolLM2-135M on a 2-core CPU: 87 minutes, held-out top-1 0.56; docs/benchmarks.md.)

A new subcommand rather than an extension of `apps.train mtp`: the MTP trainer runs the frozen
target on every step (on SmolLM2 that was 12-36 s a step, 25 steps in 8 minutes) and trains on
code with the full 49k-row LM head. Here the target runs once, in a data phase, and training
never touches it: what differs is the data (the target's own chat answers), what is cached
(three layers' outputs and the target's top-k law per position), the head's input (fused
taps) and its output (a cut vocabulary). The two share the unrolled "training-time test"
(`chain_outputs`, `chain_mask` from apps/train/mtp.py) and the drafting machinery.

Phases, each resumable (rerun the same command to go on; `--fresh` starts training over):
1. data (apps/train/eagle_plan.py, eagle_data.py): training prompts built offline (apps/train/
   eagle_prompts.py, disjoint from the held-out chat set) and, with `--self-prompts`, prompts
   the target writes itself (Magpie: apps/train/eagle_data.py), the target's own greedy answers
   with its chat template, batched, and the teacher's features, appended shard by shard to
   OUT/data/ for `--data-budget-min` (default: half the time budget).
2. vocabulary (FR-Spec): the `--vocab` ids the target says most often in its answers (and its
   end-of-turn ids); the head's LM head is initialised from the target's rows for them.
3. training: at entry j (token x_{j+1}, the target's taps at j) the head must give the
   target's law of x_{j+2}, chained `--unroll` steps on its own outputs, as it drafts. The
   loss is the cross-entropy to the target's top-k probabilities (T = 1) plus the mass outside
   them as one bucket, so q is fitted to p itself (calibrated, not sharpened): a draft whose
   confidence predicts acceptance (trees, HeteroSpec).

Writes OUT/model.safetensors (`eagle.*`, bf16, with the kept ids) and OUT/head.json (the
target's identity, taps, vocabulary coverage, held-out top-1 agreement per chained step, time);
OUT defaults to TARGET/.duet/eagle/, where `--draft head` looks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from runtime.errors import DuetError

from .args import add_loop_args, command_parser, positive
from .eagle_plan import data_phase
from .loop import budget_s, head_config, make_optimizer, train_resumable
from .mtp import chain_outputs
from .resume import RESUME_DIR, load_state, save_state


def kept_vocab(data: dict, k: int, vocab_size: int, eos: tuple[int, ...]) -> torch.Tensor:
    """The k ids the target says most often in its answers, its end ids first; ties and any
    shortfall filled from the prompts' counts, then by id."""
    ans = torch.zeros(vocab_size, dtype=torch.float64)
    allc = torch.zeros(vocab_size, dtype=torch.float64)
    starts, plens, ids = data["starts"], data["prompt_lens"], data["ids"]
    for s in range(len(plens)):
        a, p, e = int(starts[s]), int(plens[s]), int(starts[s + 1])
        ans += torch.bincount(ids[a + p : e], minlength=vocab_size)
    allc += torch.bincount(ids, minlength=vocab_size)
    score = ans * 1e6 + allc + torch.linspace(1e-3, 0, vocab_size, dtype=torch.float64)
    score[list(eos)] = float("inf")
    return score.topk(min(k, vocab_size)).indices.sort().values


def init_head(target, taps: tuple[int, ...], vocab_ids: torch.Tensor):
    """An EagleHead whose layer copies the target's last one (outputs zeroed: it starts as the
    identity), norm the target's final norm, LM head the target's rows for the kept ids, fuse
    picking the high tap, fc = [N(0, 0.02) | I]."""
    from runtime.drafts.head.torch import EagleHead

    m, cfg = target.module, target.config
    head = EagleHead(cfg, len(taps), len(vocab_ids)).float()
    H = cfg.hidden_size
    try:
        head.layers[0].load_state_dict(m.model.layers[-1].state_dict())
        head.norm.load_state_dict(m.model.norm.state_dict())
    except (RuntimeError, KeyError):  # another layer family: the layer starts fresh
        pass
    w = m.model.embed_tokens.weight if cfg.tie_word_embeddings else m.lm_head.weight
    with torch.no_grad():
        head.vocab_ids.copy_(vocab_ids)
        head.lm_head.weight.copy_(w[vocab_ids].float())
        head.fc.weight.normal_(0, 0.02)
        head.fc.weight[:, H:] = torch.eye(H)
        head.fuse.weight.zero_()
        head.fuse.weight[:, -H:] = torch.eye(H)
        head.layers[0].mlp.down_proj.weight.zero_()
        head.layers[0].self_attn.o_proj.weight.zero_()
    head.layers_tapped = taps
    return head


def refit_rows(state: dict, old_ids: torch.Tensor, head) -> dict:
    """A trained head's state over another kept vocabulary (head.vocab_ids): the LM head rows
    of ids kept before are the trained ones, the others stay as `head` has them."""
    new, w = head.vocab_ids, head.lm_head.weight.detach().clone()
    where = {int(t): i for i, t in enumerate(old_ids.tolist())}
    for i, t in enumerate(new.tolist()):
        if t in where:
            w[i] = state["lm_head.weight"][where[t]]
    return {**state, "lm_head.weight": w, "vocab_ids": new.clone()}


def windows(data: dict, seqs: list[int], batch: int, seq_len: int, seed: int):
    """Batches (positions (B, L) into the flat arrays, -1 past a sequence's end; valid (B, L)):
    a random window per drawn sequence, half the time the one ending at its end (the answer)."""
    g = torch.Generator().manual_seed(seed)
    starts = data["starts"]
    while True:
        pick = torch.randint(len(seqs), (batch,), generator=g)
        pos = torch.full((batch, seq_len), -1, dtype=torch.long)
        for b, i in enumerate(pick.tolist()):
            a, e = int(starts[seqs[i]]), int(starts[seqs[i] + 1])
            if e - a > seq_len:
                late = torch.rand((), generator=g).item() < 0.5
                a = (
                    e - seq_len
                    if late
                    else a + int(torch.randint(e - a - seq_len + 1, (), generator=g))
                )
            n = min(seq_len, e - a)
            pos[b, :n] = torch.arange(a, a + n)
        yield pos, pos >= 0


def head_step(target, head, data: dict, remap: torch.Tensor, unroll: int):
    """(positions, valid) -> (mean loss over the unrolled steps, metrics) for train_loop."""

    def step(pos, valid):
        p = pos.clamp(min=0)
        x = data["ids"][p]
        hid = data["taps"][p].float()
        total, metrics = 0.0, {}
        for r, out in enumerate(chain_outputs(target, head, x, hid, unroll), start=1):
            lq = torch.log_softmax(head.lm_head(out[:, r - 1 :]).float(), -1)
            sub = remap[data["top_ids"][p[:, r:]]]  # teacher's top-k at j + 1, as kept indices
            tp = data["top_lp"][p[:, r:]].float().exp() * (sub >= 0)
            lq_top = lq.gather(-1, sub.clamp(min=0))
            q_top = (lq_top.exp() * (sub >= 0)).sum(-1)
            p_rest = (1 - tp.sum(-1)).clamp(min=0)
            ce = -(tp * lq_top).sum(-1) - p_rest * torch.log((1 - q_top).clamp(min=1e-6))
            m = valid[:, r:].float()
            total = total + (ce * m).sum() / m.sum().clamp(min=1)
            agree = (lq.argmax(-1) == sub[..., 0]).float()
            metrics[f"top1_{r}"] = round(float((agree * m).sum() / m.sum().clamp(min=1)), 4)
        return total / unroll, metrics

    return step


@torch.no_grad()
def heldout(target, head, data, remap, seqs, unroll, seq_len) -> dict:
    """Top-1 agreement with the target per chained step, and the loss, on held-out sequences."""
    if not seqs:
        return {}
    step = head_step(target, head, data, remap, unroll)
    acc: dict = {}
    for i in range(0, len(seqs), 8):
        sub = seqs[i : i + 8]
        pos, valid = next(windows(data, sub, len(sub), seq_len, i))
        loss, mt = step(pos, valid)
        for k, v in {"loss": float(loss), **mt}.items():
            acc.setdefault(k, []).append(v)
    return {f"heldout_{k}": round(sum(v) / len(v), 4) for k, v in acc.items()}


def save_head(head, out: Path, target_dir: Path, meta: dict) -> Path:
    """OUT/model.safetensors (`eagle.*`: float tensors bf16, the kept ids int64), OUT/head.json."""
    from safetensors.torch import save_file

    from runtime.adapter import base_record
    from runtime.drafts.head.torch import META, WEIGHTS

    state = {
        "eagle." + k: (v.to(torch.bfloat16) if v.is_floating_point() else v).detach().contiguous()
        for k, v in head.state_dict().items()
    }
    tmp = out / (WEIGHTS + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / WEIGHTS)
    n = sum(p.numel() for p in head.parameters())
    rec = {"kind": "duet-eagle-head", "target": base_record(target_dir),
           "layers": list(head.layers_tapped), "params": n, **meta}  # fmt: skip
    (out / META).write_text(json.dumps(rec, indent=2) + "\n")
    return out / WEIGHTS


# where a loop flag means more here than in LOOP_FLAGS (apps/train/args.py)
HELPS = {
    "out": "default TARGET/.duet/eagle (--draft head)",
    "time_budget_min": "wall-clock cap for data and training together",
    "fresh": "start training over (data is kept)",
}


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("eagle", __doc__)
    ap.add_argument("--target", required=True, help="target checkpoint (path or short name)")
    add_loop_args(ap, out=None, helps=HELPS)
    ap.add_argument(
        "--prompts",
        type=int,
        default=3000,
        help="training prompts to answer, as many as the data budget allows (3000; "
        "SmolLM2-135M answers ~1,950 in 40 minutes on 2 cores)",
    )
    ap.add_argument(
        "--self-prompts",
        type=int,
        default=0,
        help="prompts the target writes itself from its chat template's pre-query "
        "prefix (Magpie), a quarter of them document tasks over its cached answers: "
        "chat-like data the template prompts lack (default 0)",
    )
    add_loop_args(ap, time_budget_min=None, helps=HELPS)
    ap.add_argument(
        "--data-budget-min",
        type=float,
        default=None,
        help="cap for the data phase (default: half the time budget)",
    )
    ap.add_argument(
        "--doc-files",
        type=int,
        default=120,
        help="stdlib files the document prompts are cut from (default 120)",
    )
    ap.add_argument(
        "--max-prompt",
        type=int,
        default=768,
        help="skip training prompts longer than this many tokens (768)",
    )
    ap.add_argument("--gen-batch", type=int, default=24, help="prompts answered per batch")
    ap.add_argument("--max-new", type=int, default=128, help="answer tokens per prompt at most")
    ap.add_argument("--topk", type=int, default=8, help="teacher probabilities kept per position")
    ap.add_argument("--vocab", type=int, default=4096, help="kept vocabulary (FR-Spec, 4096)")
    add_loop_args(ap, steps=2000)
    ap.add_argument("--unroll", type=int, default=3, help="chained steps in the loss (3)")
    add_loop_args(ap, batch_size=8, seq_len=256, lr=1e-3, threads=2, seed=0)
    add_loop_args(ap, ckpt_every=50, fresh=False, helps=HELPS)
    return ap


def _check(a) -> None:
    positive(
        a,
        "prompts",
        "doc_files",
        "max_prompt",
        "gen_batch",
        "max_new",
        "topk",
        "vocab",
        "steps",
        "unroll",
        "batch_size",
        "seq_len",
        "threads",
    )
    if a.self_prompts < 0:
        raise DuetError(f"--self-prompts must be >= 0 (got {a.self_prompts})")
    if a.time_budget_min is not None and a.time_budget_min <= 0:
        raise DuetError("--time-budget-min must be positive")
    if a.data_budget_min is not None and a.data_budget_min < 0:
        raise DuetError("--data-budget-min must be >= 0 (0: train on the cached data only)")


def _resume(st: dict | None, head, opt, vocab: torch.Tensor, out: Path) -> int:
    """The step to start at, the head (and, with the same kept vocabulary, the optimizer)
    restored from the resume state `st`."""
    if not st:
        return 0
    print(f"resuming {out} at step {st['step']}", flush=True)
    if torch.equal(st["vocab_ids"], vocab):
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["optimizer"])
    else:  # more data, another kept vocabulary: trained rows kept, new ids from the target
        fresh = len(set(vocab.tolist()) - set(st["vocab_ids"].tolist()))
        print(
            f"vocabulary refreshed: {fresh} new ids (their rows from the target; the "
            "optimizer restarts)",
            flush=True,
        )
        head.load_state_dict(refit_rows(st["head"], st["vocab_ids"], head), strict=True)
    return st["step"]


def run(a: argparse.Namespace) -> dict:
    from runtime.backends import load_model
    from runtime.drafts.head.torch import head_sidecar
    from runtime.loading import resolve

    from .eagle_data import load_shards

    _check(a)
    t0 = time.monotonic()
    tdir = resolve(a.target, "target")
    if not (tdir / "config.json").is_file() or not (tdir / "tokenizer.json").is_file():
        raise DuetError(f"--target {tdir}: not a checkpoint directory with a tokenizer.json")
    out = Path(a.out) if a.out else head_sidecar(tdir)
    out.mkdir(parents=True, exist_ok=True)
    budget = budget_s(a)
    data_s = (
        a.data_budget_min * 60
        if a.data_budget_min is not None
        else (budget / 2 if budget else None)
    )
    torch.manual_seed(a.seed)
    stats = data_phase(a, tdir, out / "data", t0 + data_s if data_s else None, data_s == 0)
    data_wall = time.monotonic() - t0
    torch.set_num_threads(a.threads)
    target = load_model(tdir, "torch", threads=a.threads)
    target.module.requires_grad_(False)
    data = load_shards(out / "data")
    n_seq = len(data["prompt_lens"])
    n_held = max(1, n_seq // 20) if n_seq > 1 else 0
    train_seqs, held_seqs = list(range(n_seq - n_held)), list(range(n_seq - n_held, n_seq))
    cfg_v, resume = target.config.vocab_size, out / RESUME_DIR
    if a.fresh:
        shutil.rmtree(resume, ignore_errors=True)
    st = load_state(resume)
    vocab = kept_vocab(data, a.vocab, cfg_v, target.config.eos_token_ids)
    head = init_head(target, data["layers"], vocab)
    remap = torch.full((cfg_v,), -1, dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))
    left = (budget - (time.monotonic() - t0)) if budget else None
    if left is not None and left < 30:
        raise DuetError("the time budget is spent before training: raise --time-budget-min")
    lc = head_config("eagle", a, warmup=min(20, a.steps), time_limit_s=left - 20 if left else None)
    opt = make_optimizer(head, lc)
    start = _resume(st, head, opt, vocab, out)

    def save_resume(step: int) -> None:
        state = {"head": head.state_dict(), "optimizer": opt.state_dict(), "step": step}
        save_state(resume, {**state, "vocab_ids": vocab})

    step_fn = head_step(target, head, data, remap, a.unroll)
    batches = windows(data, train_seqs, a.batch_size, a.seq_len, a.seed + start)
    summary = train_resumable(head, step_fn, batches, lc, out, save_resume, opt, start)
    ans = sum(
        int(data["starts"][s + 1] - data["starts"][s] - data["prompt_lens"][s])
        for s in range(n_seq)
    )
    kept = torch.zeros(cfg_v, dtype=torch.bool)
    kept[vocab] = True
    meta = {"vocab": len(vocab), "steps": summary["steps"], "unroll": a.unroll,
            "batch_size": a.batch_size, "seq_len": a.seq_len, "lr": a.lr, "seed": a.seed,
            "data": {**stats, "sequences": n_seq, "heldout_sequences": n_held,
                     "positions": int(data["ids"].numel()), "answer_tokens": ans},
            "vocab_coverage_all_positions": round(float(kept[data["ids"]].float().mean()), 4),
            "final_loss_ema": summary["final_loss_ema"], "time_capped": summary["time_capped"],
            "data_wall_s": round(data_wall, 1), "train_wall_s": summary["wall_s"],
            "wall_s": round(time.monotonic() - t0, 1),
            **heldout(target, head, data, remap, held_seqs, a.unroll, a.seq_len)}  # fmt: skip
    save_head(head, out, tdir, meta)
    return {"wrote": str(out), **meta}


def main(argv: list[str]) -> int:
    print(json.dumps(run(build_parser().parse_args(argv)), indent=2))
    return 0
