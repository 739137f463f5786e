"""`run`: the reference client. It loads only the bundle, verifies every file before
use, and drafts greedily with the ONNX draft through onnxruntime (the Core ML draft
on macOS when asked), as the phone app would before sending drafts to a verifier.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from apps.companion.verify import verify_bundle
from runtime.errors import DuetError
from runtime.placement import choose_backend


def load_draft(bundle: Path, engine: str, threads: int = 1, roles: dict | None = None):
    """The bundle's draft as a CausalLM: "onnx", "coreml" (macOS) or "auto" (the device
    profile's draft backend when `roles` gives one, else runtime/placement.py's default)."""
    engine, _ = choose_backend("draft", engine, roles, choices=("coreml", "onnx"))
    if engine == "coreml":
        from runtime.backends.coreml.causal_lm import CoreMLCausalLM

        return CoreMLCausalLM.load(bundle / "draft.mlpackage")
    from runtime.backends.onnx.static_host import StaticOnnxLM

    return StaticOnnxLM.load(bundle / "draft.onnx", threads=threads)


def draft_greedy(model, prompt: list[int], max_tokens: int, eos: tuple[int, ...]) -> Iterator[int]:
    """Yield up to `max_tokens` greedy tokens after `prompt`, stopping at an EOS token or the
    context."""
    cache = model.new_cache()
    logits = model.forward(np.asarray([prompt], np.int64), cache)
    for _ in range(max_tokens):
        tok = int(logits[0, -1].argmax())
        yield tok
        if tok in eos or cache.offset + 1 > getattr(model, "context", 1 << 30):
            return
        logits = model.forward(np.asarray([[tok]], np.int64), cache)


def prompt_tokens(
    manifest: dict, tok, prompt: str | None, prompt_ids: list[int] | None
) -> list[int]:
    """The prompt as ids (encoded with the bundle's tokenizer), checked against its vocabulary
    and the draft's context."""
    ids = prompt_ids if prompt_ids is not None else tok.encode(prompt or "").ids
    vocab = manifest["model"]["vocab_size"]
    if not ids:
        raise DuetError("the prompt is empty")
    if min(ids) < 0 or max(ids) >= vocab:
        raise DuetError(f"prompt ids must lie in [0, {vocab}); got {min(ids)}..{max(ids)}")
    if len(ids) >= manifest["context_length"]:
        raise DuetError(
            f"the prompt ({len(ids)} tokens) does not fit the draft's context of "
            f"{manifest['context_length']}"
        )
    return ids


def bundle_prompt(b: Path, manifest: dict, prompt: str | None, prompt_ids: list[int] | None):
    """The bundle's tokenizer and the prompt as checked ids (`prompt_tokens`)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(b / "tokenizer.json"))
    return tok, prompt_tokens(manifest, tok, prompt, prompt_ids)


def answer(tok, ids: list[int], out: list[int], verify_s: float, clock: str, s: float, **stats):
    """A run's reply {tokens, text, stats}: stats open with the prompt's length, the verify
    time, the run's time under `clock` and tokens per second, then `stats`."""
    return {
        "tokens": out,
        "text": tok.decode(out),
        "stats": {
            "prompt_tokens": len(ids),
            "verify_s": round(verify_s, 4),
            clock: round(s, 4),
            "tokens_per_s": round(len(out) / s, 2) if s > 0 else None,
            **stats,
        },
    }


def run_bundle(
    bundle: str | Path,
    *,
    prompt: str | None,
    prompt_ids: list[int] | None,
    max_tokens: int,
    engine: str = "auto",
    threads: int = 1,
) -> dict:
    """Verify, load and draft; returns {tokens, text, stats}."""
    b = Path(bundle)
    t0 = time.perf_counter()
    manifest = verify_bundle(b)
    t_verify = time.perf_counter() - t0
    tok, ids = bundle_prompt(b, manifest, prompt, prompt_ids)
    model = load_draft(b, engine, threads)
    t1 = time.perf_counter()
    out = list(
        draft_greedy(model, ids, max_tokens, tuple(manifest["model"].get("eos_token_ids", ())))
    )
    dt = time.perf_counter() - t1
    return answer(tok, ids, out, t_verify, "draft_s", dt, engine=model.backend)
