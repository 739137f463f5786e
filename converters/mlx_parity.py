"""How far a quantized MLX target is from its full-precision self.

Quantization changes the numbers on purpose, so parity here is statistical:
over held-out prompts, the fraction of positions whose argmax agrees (top-1
agreement) and the mean KL(full || quantized) of the next-token distributions.
Both models are loaded with `mlx_lm.load` and run without a cache, the plain
path, so nothing of ours sits between the weights and the figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Named tolerances per bit width: minimum top-1 agreement, maximum mean KL (nats). They are
# floors that catch a broken conversion (a wrong group axis or dropped scales gives top-1
# near 1/V and KL of several nats), loose enough for the tests' random checkpoints, whose
# large weights make 4-bit error much worse than on a trained model.
TOLERANCES = {4: {"min_top1": 0.25, "max_mean_kl": 1.0}, 8: {"min_top1": 0.9, "max_mean_kl": 0.05}}

HELD_OUT = (
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Speculative decoding drafts several tokens and verifies them in one pass.",
    "Paris is the capital of France, and Berlin is the capital of",
)


def held_out_tokens(model_dir: str | Path, max_len: int = 48) -> list[list[int]]:
    """The held-out prompts tokenized with the checkpoint's own tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    return [tok.encode(p).ids[:max_len] for p in HELD_OUT]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def quantized_parity(full_dir: str | Path, quant_dir: str | Path, prompts=None) -> dict:
    """Top-1 agreement and mean/max KL of `quant_dir` against `full_dir` on held-out prompts."""
    import mlx.core as mx
    from mlx_lm import load

    prompts = prompts or held_out_tokens(full_dir)
    full, _ = load(str(full_dir))
    quant, _ = load(str(quant_dir))
    agree, kls = [], []
    for ids in prompts:
        x = mx.array(np.asarray(ids, np.int32)[None])
        lp = _log_softmax(np.array(full(x).astype(mx.float32))[0])
        lq = _log_softmax(np.array(quant(x).astype(mx.float32))[0])
        agree.append(lp.argmax(-1) == lq.argmax(-1))
        kls.append((np.exp(lp) * (lp - lq)).sum(-1))
    agree, kls = np.concatenate(agree), np.concatenate(kls)
    bits = int(_quant_bits(quant_dir))
    tol = TOLERANCES.get(bits, TOLERANCES[4])
    top1, mean_kl = float(agree.mean()), float(kls.mean())
    return {
        "reference": "mlx full precision",
        "prompts": len(prompts),
        "positions": int(agree.size),
        "top1_agree": top1,
        "mean_kl": mean_kl,
        "max_kl": float(kls.max()),
        "tolerance": tol,
        "ok": top1 >= tol["min_top1"] and mean_kl <= tol["max_mean_kl"],
    }


def _quant_bits(d: str | Path) -> int:
    import json

    cfg = json.loads((Path(d) / "config.json").read_text())
    return int((cfg.get("quantization") or {}).get("bits", 4))
