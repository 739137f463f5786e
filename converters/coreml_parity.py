"""Numerics of the Core ML draft that can be checked without macOS.

Core ML prediction only runs on a Mac, so on any machine we check the module we
trace: the ANE rewrite (fp32, then fp16) driven exactly as the host drives the
converted model (a padded prefill, then cached decode steps through the same
cache policy) must match the Hugging Face reference logits. On macOS,
`tests/test_convert_coreml.py` adds prediction parity of the package itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from converters.coreml_model import DecoderANE, KVIODecoder, StatefulDecoder, additive_mask

# Named tolerances: max |logit difference| relative to the reference's max |logit|.
TOL_FP32 = 1e-4  # rewrite vs reference in fp32: only reassociation error
TOL_FP16 = 2e-2  # the same rewrite run in fp16, the precision Core ML computes in


def reference_logits(model_dir: str | Path, tokens: np.ndarray) -> np.ndarray:
    """Full-sequence logits (T, V) from Hugging Face transformers in fp32."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.as_tensor(tokens)[None]).logits[0].float().numpy()


def run_like_host(
    decoder: DecoderANE, tokens: np.ndarray, prefill: int, flavour: str, dtype=torch.float32
) -> np.ndarray:
    """Logits (T, V) from a prefill of `prefill` tokens padded to the prefill length used
    in conversion, then one decode call per remaining token."""
    dec = decoder.to(dtype)
    t = torch.as_tensor(tokens, dtype=torch.int32)[None]
    s = dec.context
    pad = 2 * prefill  # padded prefill: queries past the prompt are junk and get overwritten
    steps = [(0, prefill, pad)] + [(i, i + 1, 1) for i in range(prefill, t.shape[1])]
    out = []
    if flavour == "stateful":
        w = StatefulDecoder(dec, dtype)
    else:
        w = KVIODecoder(dec)
        kc = torch.zeros(dec.cache_shape(), dtype=dtype)
        vc = torch.zeros_like(kc)
    with torch.no_grad():
        for start, stop, length in steps:
            ids = torch.zeros((1, length), dtype=torch.int32)
            ids[:, : stop - start] = t[:, start:stop]
            pos = torch.arange(start, start + length, dtype=torch.int32)[None]
            args = (
                ids,
                pos,
                torch.tensor([start], dtype=torch.int32),
                additive_mask(start, length, s, dtype),
            )
            if flavour == "stateful":
                logits = w(*args)
            else:
                logits, kn, vn = w(*args, kc, vc)
                kc[:, :, start : start + length] = kn
                vc[:, :, start : start + length] = vn
            out.append(logits[0, : stop - start].float().numpy())
    decoder.to(torch.float32)
    return np.concatenate(out)


def torch_parity(model_dir: str | Path, decoder: DecoderANE, flavour: str, seed: int = 0) -> dict:
    """Parity figures of the traced module vs the reference over a prefill + 4 decode steps."""
    rng = np.random.default_rng(seed)
    prefill = min(8, decoder.context // 4)
    tokens = rng.integers(0, decoder.cfg.vocab_size, size=prefill + 4)
    ref = reference_logits(model_dir, tokens)
    scale = float(np.abs(ref).max())
    figures = {"reference": "transformers fp32", "prefill": prefill, "decode_steps": 4}
    for name, dtype, tol in (("fp32", torch.float32, TOL_FP32), ("fp16", torch.float16, TOL_FP16)):
        got = run_like_host(decoder, tokens, prefill, flavour, dtype)
        rel = float(np.abs(got - ref).max()) / scale
        figures[name] = {
            "max_rel_err": rel,
            "tolerance": tol,
            "top1_agree": float((got.argmax(-1) == ref.argmax(-1)).mean()),
            "ok": rel <= tol,
        }
    return figures
