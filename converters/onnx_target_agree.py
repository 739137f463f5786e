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


class _GenaiLM:
    """An onnxruntime-genai model folder's decoder (its genai_config.json names the graph and
    its I/O) as the two calls top1_agreement makes: new_cache and forward (logits)."""

    def __init__(self, folder, threads: int):
        import onnxruntime as ort

        d = Path(folder)
        try:
            dec = json.loads((d / "genai_config.json").read_text())["model"]["decoder"]
        except (OSError, ValueError, KeyError) as e:
            raise DuetError(
                f"--ort-genai {d}: not an onnxruntime-genai model folder ({e})"
            ) from None
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        self.s = ort.InferenceSession(
            str(d / dec["filename"]), so, providers=["CPUExecutionProvider"]
        )
        self.io, self.n, self.kv = (
            dec["inputs"],
            dec["num_hidden_layers"],
            dec["num_key_value_heads"],
        )
        self.hd, self.out = dec["head_size"], dec["outputs"]

    def new_cache(self):
        z = np.zeros((1, self.kv, 0, self.hd), np.float32)
        return {"past": [(z, z)] * self.n}

    def forward(self, x, cache):
        past = cache["past"]
        f = {self.io["input_ids"]: x, self.io["attention_mask"]:
             np.ones((1, past[0][0].shape[2] + x.shape[1]), np.int64)}  # fmt: skip
        for i, (k, v) in enumerate(past):
            f[self.io["past_key_names"] % i], f[self.io["past_value_names"] % i] = k, v
        names = [o.name for o in self.s.get_outputs()]
        r = dict(zip(names, self.s.run(names, f), strict=True))
        keys, values = self.out["present_key_names"], self.out["present_value_names"]
        cache["past"] = [(r[keys % i], r[values % i]) for i in range(self.n)]
        return r[self.out["logits"]]


def top1_agreement(
    model_dir,
    quantize: str,
    texts: list[str],
    *,
    positions: int = 2048,
    per_text: int = 256,
    chunk: int = 64,
    threads: int = 2,
    genai_dir=None,
) -> dict:
    """{agreement, positions, texts, seconds} of `quantize` against float32 over `texts`,
    stopping once `positions` positions are compared; with `genai_dir`, of that
    onnxruntime-genai build instead (the peer in apps.bench; the same text and reference)."""
    from runtime.backends import load_model
    from runtime.backends.onnx.target import OnnxTargetLM
    from runtime.tokenizer import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer(model_dir)
    if genai_dir is not None:
        lm = _GenaiLM(genai_dir, threads)
    else:
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
    return {
        "model": str(model_dir),
        "quantize": f"ort-genai {genai_dir}" if genai_dir else quantize,
        "agreement": same / seen,
        "positions": seen,
        "texts": used,
        "seconds": time.perf_counter() - t0,
    }
