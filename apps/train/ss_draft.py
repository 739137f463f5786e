"""`python -m apps.train ss-draft`: distil a speculative-streaming draft from a target.

    nice -n 10 python -m apps.train ss-draft --target runtime/assets/default/target \\
        --out runs/ss-draft --time-budget-min 25 --threads 1
    python -m apps.train ss-draft --device cuda --batch-size 32 --stream-stride 1 \\
        --max-corpus-chars 40000000 --time-budget-min 3.5 --out runs/ss-draft   # a CUDA GPU

Mirror-SD §3.2 (Bhendawade et al. 2024): the draft (default: the embedded draft, whose
weights it starts from) gains n lookahead streams (runtime/drafts/ss/torch.py). On random
windows of the corpus' training files, one multi-stream pass gives, at every position t,
the main stream's next-token distribution and stream j's distribution of x_{t+1+j}; the
loss is KL(p_target(. | x<=t) || main_t) + sum_j KL(p_target(. | x<=t+j) || stream_{t,j}),
the target's own next-(j+1)-token distributions under teacher forcing (the streams'
"future n-gram" objective, distilled as the embedded draft was). The whole draft is trained
(the main-stream term keeps it a good ordinary draft), or with --freeze-main only the
stream embeddings, so the main stream stays the initial draft exactly. The report gives, on
held-out files, each stream's top-1 agreement with the target's argmax (what an SS pass can
confirm).

Resumable: state in OUT/.resume/ (every --ckpt-every steps); OUT is an SS checkpoint
(runtime/drafts/ss/checkpoint.py) rewritten at each checkpoint. It does not measure speed
(apps.bench does).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from runtime.errors import DuetError

from .args import REQUIRED, add_loop_args, check_device, command_parser
from .corpus import BatchSampler, eval_windows, load_corpus, token_stream
from .loop import budget_s, head_config, make_optimizer, train_resumable
from .resume import RESUME_DIR, resume_from, save_state
from .tokenizer import load_tokenizer

KEEP = (".resume", "loss_log.jsonl")  # carried over each time OUT is rewritten
DEFAULT_STREAMS = (
    3  # Mirror-SD App. D.2 Fig. 6b: "an autoregressive draft with 3 lookahead streams"
)

# where a loop flag means more here than in LOOP_FLAGS (apps/train/args.py)
HELPS = {
    "out": "output SS checkpoint directory",
    "device": "train on the CPU or a CUDA GPU (teacher and student both there)",
}


def build_parser() -> argparse.ArgumentParser:
    from runtime.assets import default_pair

    tdir, ddir = default_pair()
    ap = command_parser("ss-draft", __doc__)
    ap.add_argument("--target", default=str(tdir), help="teacher target (default: embedded)")
    ap.add_argument(
        "--draft", default=str(ddir), help="draft to start from (default: the embedded draft)"
    )
    add_loop_args(ap, out=REQUIRED, helps=HELPS)
    ap.add_argument("--streams", type=int, default=DEFAULT_STREAMS, help="lookahead streams n")
    add_loop_args(ap, steps=3000, time_budget_min=None, lr=1e-3, batch_size=8, seq_len=128)
    ap.add_argument(
        "--stream-stride",
        type=int,
        default=4,
        help="streams on every k-th position of a window, from a random offset "
        "(default 4: a quarter of the stream tokens, the same positions in time)",
    )
    add_loop_args(ap, max_corpus_chars=4_000_000, corpus=None, threads=1, device="cpu", helps=HELPS)
    add_loop_args(ap, seed=0, ckpt_every=100, fresh=False)
    ap.add_argument(
        "--freeze-main",
        action="store_true",
        help="train the stream embeddings only: the main stream stays the initial "
        "draft exactly (its tokens and acceptance unchanged; only J changes)",
    )
    return ap


def multi_stream_batch(T: int, n: int, owners: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (1, T + P*n) and mask (1, 1, ., .) of a cache-free pass, streams on `owners`."""
    from kernels.stream_mask import multi_stream_mask, stream_positions
    from runtime.model import causal_mask

    pos = stream_positions(np.arange(T, dtype=np.int64)[None], n, owners)
    mask = multi_stream_mask(causal_mask(0, T)[None], n, owners)
    return torch.from_numpy(pos), torch.from_numpy(mask)[:, None]


def stream_logits(student, x: torch.Tensor, owners: np.ndarray):
    """Main (B, T, V) and stream (B, P, n, V) logits of one cache-free multi-stream pass."""
    B, T = x.shape
    cfg = student.cfg
    dev = x.device
    pos, mask = (t.to(dev) for t in multi_stream_batch(T, student.n_streams, owners))
    empty = torch.zeros(B, cfg.num_kv_heads, 0, cfg.head_dim, device=dev)
    past = [(empty, empty)] * cfg.num_layers
    main, streams, _ = student.stream_pass(
        x, torch.from_numpy(owners).to(dev), pos.expand(B, -1), mask, past
    )
    return main, streams


def ss_loss(main, streams, teacher_logits, owners: np.ndarray) -> tuple[torch.Tensor, dict]:
    """KL(teacher_t || main_t) + sum_j KL(teacher_{p+j} || stream_{p,j}) over the owners p
    (stream j predicts x_{p+1+j}: the teacher's distribution at p+j); p+j >= T has no label."""
    T, n = main.shape[1], streams.shape[2]
    lt = F.log_softmax(teacher_logits.float(), -1)  # (B, T, V)
    own = torch.from_numpy(owners).to(main.device)

    def kl(student_logits, teacher_lp):
        s = F.log_softmax(student_logits.float(), -1)
        return (teacher_lp.exp() * (teacher_lp - s)).sum(-1).mean()

    loss = kl(main, lt)
    metrics = {"kl_main": loss.item()}
    arg = teacher_logits.argmax(-1)
    with torch.no_grad():
        metrics["agree_main"] = (main.argmax(-1) == arg).float().mean().item()
    for j in range(1, n + 1):
        k_ok = own + j < T  # owners with a label for stream j
        if not k_ok.any():
            continue
        sl, lab = streams[:, k_ok, j - 1], own[k_ok] + j
        k = kl(sl, lt[:, lab])
        loss = loss + k
        metrics[f"kl_s{j}"] = k.item()
        with torch.no_grad():
            metrics[f"agree_s{j}"] = (sl.argmax(-1) == arg[:, lab]).float().mean().item()
    return loss, metrics


@torch.no_grad()
def heldout_agreement(student, teacher, windows: list[np.ndarray]) -> dict:
    """Mean KL and top-1 agreement with the target, main stream and each stream, held out."""
    sums: dict[str, float] = {}
    dev = next(student.parameters()).device
    for w in windows:
        x = torch.from_numpy(w[None, :-1]).to(dev)
        owners = np.arange(x.shape[1], dtype=np.int64)
        main, streams = stream_logits(student, x, owners)
        _, m = ss_loss(main, streams, teacher(input_ids=x).logits, owners)
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v
    return {k: round(v / max(1, len(windows)), 4) for k, v in sums.items()}


def _check(a: argparse.Namespace, target: Path, draft: Path) -> None:
    for name, p in (("--target", target), ("--draft", draft)):
        if not (p / "config.json").is_file():
            raise DuetError(f"{name} {p}: not a checkpoint directory (no config.json)")
    if min(a.streams, a.steps, a.threads, a.batch_size, a.stream_stride) < 1 or a.seq_len < 8:
        raise DuetError(
            "--streams, --steps, --threads, --batch-size, --stream-stride must be >= 1, "
            "--seq-len >= 8"
        )
    if a.time_budget_min is not None and a.time_budget_min <= 0:
        raise DuetError(f"--time-budget-min must be positive; got {a.time_budget_min}")


def _student(dcfg, draft: Path, a: argparse.Namespace):
    """The SS student on --device: the draft's weights, fresh stream embeddings E_1..E_n."""
    from runtime.backends.torch import load_torch_lm
    from runtime.drafts.ss.torch import SSTorchLM

    student = SSTorchLM(dcfg, a.streams)
    student.load_state_dict(load_torch_lm(draft).state_dict(), strict=False)
    student.to(a.device)
    with torch.no_grad():
        student.ss_stream_embeddings.normal_(0.0, 0.02)
    if a.freeze_main:  # only E_1..E_n learn; the main-stream term is then a constant
        student.requires_grad_(False)
        student.ss_stream_embeddings.requires_grad_(True)
    return student


def run(a: argparse.Namespace) -> dict:
    from runtime.config import ModelConfig
    from runtime.drafts.ss.checkpoint import save_ss_checkpoint
    from runtime.drafts.ss.torch import load_ss_module
    from runtime.tokenizer import check_pair

    from .checkpoint import load_model

    target, draft, out = Path(a.target), Path(a.draft), Path(a.out)
    _check(a, target, draft)
    tcfg, dcfg = ModelConfig.from_dir(target), ModelConfig.from_dir(draft)
    check_pair(target, draft, tcfg, dcfg)
    dev = a.device
    check_device(dev)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    teacher = load_model(target).requires_grad_(False).to(dev)
    student = _student(dcfg, draft, a)
    tok = load_tokenizer(target / "tokenizer.json")
    eos = tcfg.eos_token_ids[0] if tcfg.eos_token_ids else 0
    corpus = load_corpus(a.corpus)
    enc = lambda ts: [e.ids for e in tok.encode_batch(ts)]  # noqa: E731
    ids = token_stream(corpus.texts("train", a.max_corpus_chars), enc, eos)
    held = eval_windows(token_stream(corpus.texts("heldout"), enc, eos), a.seq_len, 8 * a.seq_len)
    out.mkdir(parents=True, exist_ok=True)
    cfg = head_config("ss-draft", a, warmup=20, time_limit_s=budget_s(a), device=dev)
    opt = make_optimizer(student, cfg)
    resume = out / RESUME_DIR

    def load(st: dict) -> None:
        if st.get("streams") != a.streams:
            raise DuetError(f"{resume}: a run with {st.get('streams')} streams; pass --fresh")
        student.load_state_dict(st["student"])

    start = resume_from(out, a.fresh, opt, load, map_location=dev)
    before = None if start else heldout_agreement(student.eval(), teacher, held)
    meta = {"init_draft": str(draft), "target": str(target), "corpus": "train split "
            "(apps/train/corpus.py)", "seed": a.seed, "seq_len": a.seq_len,
            "batch_size": a.batch_size, "stream_stride": a.stream_stride,
            "freeze_main": a.freeze_main, "device": dev}  # fmt: skip

    def save(step: int) -> None:
        state = {"student": student.state_dict(), "optimizer": opt.state_dict(), "step": step}
        save_state(resume, {**state, "streams": a.streams})
        save_ss_checkpoint(student, out, draft, extra={**meta, "steps": step}, keep=KEEP)

    pick = np.random.default_rng([a.seed, start])

    def step_fn(x, y):
        with torch.no_grad():
            t_logits = teacher(input_ids=x).logits
        owners = np.arange(int(pick.integers(a.stream_stride)), x.shape[1], a.stream_stride)
        main, streams = stream_logits(student, x, owners)
        return ss_loss(main, streams, t_logits, owners)

    t0 = time.monotonic()
    sampler = BatchSampler(ids, a.batch_size, a.seq_len, a.seed + start)
    summary = train_resumable(student, step_fn, sampler, cfg, out, save, opt, start)
    after = heldout_agreement(load_ss_module(out).to(dev).eval(), teacher, held)
    report = {"out": str(out), "streams": a.streams, "steps": summary["steps"],
              "time_capped": summary["time_capped"], "wall_s": round(time.monotonic() - t0, 1),
              "heldout_before": before, "heldout_after": after, **meta}  # fmt: skip
    (out / "ss_train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str]) -> int:
    print(json.dumps(run(build_parser().parse_args(argv)), indent=2))
    return 0
