"""Numerical parity of a converted model against the PyTorch reference.

A conversion is only as good as its parity check: every export measures the
largest absolute logit difference over a prefill and several cached decode
steps, and fails past a named tolerance.
"""

from __future__ import annotations

import numpy as np

# max |Δlogit| allowed between an fp32 ONNX export and the fp32 PyTorch reference
ONNX_FP32_TOL = 1e-3


def decode_parity(
    ref, other, *, prompt_len: int = 16, decode_steps: int = 8, seed: int = 0
) -> dict:
    """Run `ref` and `other` (CausalLMs) on the same random prompt, then cached greedy steps.

    Returns {"prefill_max_abs", "decode_max_abs", "max_abs", "top1_agree"}.
    Decode steps feed the reference's argmax to both, so the caches stay aligned.
    """
    V = ref.config.vocab_size
    ids = np.random.default_rng(seed).integers(0, V, (1, prompt_len))
    cr, co = ref.new_cache(), other.new_cache()
    a, b = ref.forward(ids, cr), other.forward(ids, co)
    pre = float(np.abs(a - b).max())
    dec, agree, n = 0.0, int((a.argmax(-1) == b.argmax(-1)).sum()), prompt_len
    tok = a[:, -1:].argmax(-1)
    for _ in range(decode_steps):
        a, b = ref.forward(tok, cr), other.forward(tok, co)
        dec = max(dec, float(np.abs(a - b).max()))
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += 1
        tok = a[:, -1:].argmax(-1)
    return {
        "prefill_max_abs": pre,
        "decode_max_abs": dec,
        "max_abs": max(pre, dec),
        "top1_agree": agree / n,
    }
