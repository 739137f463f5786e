"""Top-1 agreement of a quantized ONNX target with the float32 PyTorch reference on text.

Teacher-forced: both models read the same tokens (each text's, cut to `per_text` tokens) in
windows of `chunk` through their caches, and the agreement is the share of positions whose
greedy next token (argmax of the logits) is the same. This is the figure issue 41 asks per
model ("the int4 target agrees with float32 on >= 95 % of greedy next tokens on held-out
text"); int4 weights are rounded to nearest from the checkpoint (no calibration data), so any
text is held out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from runtime.errors import DuetError


def read_texts(path) -> list[str]:
    """Texts of a .jsonl file (each record's `turns` and `reference` strings joined by newlines,
    or its `text`), else of a plain file (paragraphs split on blank lines)."""
    p = Path(path)
    if not p.is_file():
        raise DuetError(f"--text {p}: no such file")
    if p.suffix != ".jsonl":
        return [t.strip() for t in p.read_text().split("\n\n") if t.strip()]
    out = []
    for line in p.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        parts = [r["text"]] if "text" in r else [*r.get("turns", []), *r.get("reference", [])]
        out.append("\n".join(s for s in parts if isinstance(s, str)))
    return [t for t in out if t]


def top1_agreement(model_dir, quantize: str, texts: list[str], *, positions: int = 2048,
                   per_text: int = 256, chunk: int = 64, threads: int = 2) -> dict:  # fmt: skip
    """{agreement, positions, texts, seconds} of `quantize` against float32 over `texts`,
    stopping once `positions` positions are compared."""
    from runtime.backends import load_model
    from runtime.backends.onnx_target import OnnxTargetLM
    from runtime.tokenizer import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer(model_dir)
    lm = OnnxTargetLM(model_dir, quantize, intra_threads=threads)
    ref = load_model(model_dir, "torch", threads=threads)
    same = seen = used = 0
    for text in texts:
        ids = tok.encode(text)[:per_text]
        if len(ids) < 2:
            continue
        used += 1
        co, cr = lm.new_cache(), ref.new_cache()
        for a in range(0, len(ids), chunk):
            x = np.array([ids[a : a + chunk]])
            got = lm.forward(x, co)[0].argmax(-1)
            want = np.asarray(ref.forward(x, cr))[0].argmax(-1)
            same += int((got == want).sum())
            seen += len(got)
        if seen >= positions:
            break
    if not seen:
        raise DuetError("no text of two tokens or more to compare on")
    return {"model": str(model_dir), "quantize": quantize, "agreement": same / seen,
            "positions": seen, "texts": used, "seconds": time.perf_counter() - t0}  # fmt: skip
