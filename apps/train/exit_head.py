"""`python -m apps.train exit-head`: fit the tuned exit head of a target at layer ℓe.

    python -m apps.train exit-head --target runtime/assets/default/target --layer 4

An affine map h -> h @ W + b (W initialised to the identity, b to zero) applied to layer
ℓe's hidden state before the target's own final norm + LM head, fitted with Adam to
minimise KL(p_final || p_exit) over corpus positions, p_final being the target's
last-layer distribution (a "tuned lens"). The target is frozen. Positions come from the
corpus' training files (apps/train/corpus.py; the stdlib by default); the report's KL and
top-κ mass overlap Ω_κ (Mirror-SD eq. 9) are measured on its held-out files, raw and tuned.
Writes TARGET/.duet/exit_head_L{ℓe}.safetensors (runtime/mirror/exit_head.py uses it).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from runtime.errors import DuetError

from .args import add_loop_args, command_parser
from .corpus import load_corpus


def _positions(target, texts, tok, layer: int, max_tokens: int, seq_len: int):
    """(hidden at ℓe (n, d), final log-probs (n, V)) over up to `max_tokens` positions."""
    stream = []
    for t in texts:
        stream += tok.encode(t)
        if len(stream) >= max_tokens:
            break
    stream = np.array(stream[: max_tokens - max_tokens % seq_len] or stream[:seq_len])
    hs, lps = [], []
    m = target.module
    with torch.inference_mode():
        for i in range(0, len(stream) - 1, seq_len):
            x = torch.from_numpy(stream[i : i + seq_len][None].astype(np.int64))
            n = x.shape[1]
            pos = torch.arange(n)[None]
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None]
            empty = [
                (torch.zeros(1, m.cfg.num_kv_heads, 0, m.cfg.head_dim),) * 2
            ] * m.cfg.num_layers
            h, _ = m.run_layers(x, 0, layer, pos, mask, empty[:layer])
            hf, _ = m.run_layers(h, layer, m.cfg.num_layers, pos, mask, empty[layer:])
            hs.append(h[0].float())
            lps.append(torch.log_softmax(m.head(hf)[0].float(), -1))
    return torch.cat(hs), torch.cat(lps)


def _kl_and_omega(m, h, lp_final, w, b, kappa: int) -> tuple[float, float]:
    with torch.inference_mode():
        lq = torch.log_softmax(m.head(h @ w + b).float(), -1)
        kl = (lp_final.exp() * (lp_final - lq)).sum(-1).mean().item()
        top = lq.topk(kappa, -1).indices
        omega = lp_final.exp().gather(-1, top).sum(-1).mean().item()
    return kl, omega


def fit(
    target,
    tok,
    corpus,
    layer: int,
    *,
    steps: int,
    batch: int,
    lr: float,
    max_tokens: int,
    seq_len: int = 256,
    kappa: int = 8,
    seed: int = 0,
    log=print,
) -> dict:
    """Fit W, b; returns {"weight", "bias", "report"}."""
    torch.manual_seed(seed)
    m = target.module
    h, lp = _positions(target, corpus.texts("train"), tok, layer, max_tokens, seq_len)
    hv, lpv = _positions(target, corpus.texts("heldout"), tok, layer, max_tokens // 4, seq_len)
    d = h.shape[-1]
    eye = torch.eye(d)
    dw = torch.zeros(d, d, requires_grad=True)
    b = torch.zeros(d, requires_grad=True)
    opt = torch.optim.Adam([dw, b], lr=lr)
    for p in m.parameters():
        p.requires_grad_(False)
    kl0, om0 = _kl_and_omega(m, hv, lpv, eye, torch.zeros(d), kappa)
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, h.shape[0], (batch,))
        lq = torch.log_softmax(m.head(h[idx] @ (eye + dw) + b).float(), -1)
        loss = (lp[idx].exp() * (lp[idx] - lq)).sum(-1).mean()  # KL(p_final || p_exit)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"step {step:4d}  KL {loss.item():.4f}")
    w = (eye + dw).detach()
    kl1, om1 = _kl_and_omega(m, hv, lpv, w, b.detach(), kappa)
    report = {"layer": layer, "steps": steps, "batch": batch, "lr": lr,
              "train_positions": int(h.shape[0]), "heldout_positions": int(hv.shape[0]),
              "heldout_kl_raw": round(kl0, 4), "heldout_kl_tuned": round(kl1, 4),
              f"heldout_omega_{kappa}_raw": round(om0, 4),
              f"heldout_omega_{kappa}_tuned": round(om1, 4),
              "fit_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    return {"weight": w.numpy(), "bias": b.detach().numpy(), "report": report}


# where a loop flag means more here than in LOOP_FLAGS (apps/train/args.py): a plain Adam
HELPS = {
    "steps": "Adam steps (default {default})",
    "lr": "Adam learning rate (default {default})",
}


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("exit-head", __doc__)
    ap.add_argument("--target", required=True, help="target checkpoint directory")
    ap.add_argument("--layer", type=int, required=True, help="exit layer ℓe (1..N-1)")
    add_loop_args(ap, corpus=None, steps=300, helps=HELPS)
    ap.add_argument("--batch", type=int, default=512, help="positions per step (default 512)")
    add_loop_args(ap, lr=1e-3, helps=HELPS)
    ap.add_argument(
        "--max-tokens", type=int, default=16384, help="training positions at most (default 16384)"
    )
    add_loop_args(ap, threads=1)
    return ap


def main(argv: list[str]) -> int:
    from runtime.backends import load_model
    from runtime.mirror.exit_head import ExitHead, exit_head_path
    from runtime.tokenizer import Tokenizer

    a = build_parser().parse_args(argv)
    torch.set_num_threads(max(1, a.threads))
    target = load_model(a.target, "torch")
    n = target.config.num_layers
    if not 1 <= a.layer <= n - 1:
        raise DuetError(f"--layer must be in 1..{n - 1} for a {n}-layer target (got {a.layer})")
    if a.steps < 1 or a.batch < 1 or a.max_tokens < 512:
        raise DuetError("--steps and --batch must be >= 1 and --max-tokens >= 512")
    res = fit(
        target,
        Tokenizer(a.target),
        load_corpus(a.corpus),
        a.layer,
        steps=a.steps,
        batch=a.batch,
        lr=a.lr,
        max_tokens=a.max_tokens,
    )
    path = exit_head_path(a.target, a.layer)
    ExitHead(res["weight"], res["bias"]).save(path, {k: str(v) for k, v in res["report"].items()})
    print(json.dumps({"wrote": str(path), **res["report"]}))
    return 0
