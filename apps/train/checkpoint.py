"""Saving a trained model as a Hugging Face directory, and checking it reloads.

Weights are stored in bfloat16 (the size budget for the committed pair is
60 MB; float32 would not fit). After saving, the directory is loaded back with
`transformers.AutoModelForCausalLM` and its logits are compared with the
in-memory float32 model's on a probe sequence.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch

from runtime.config import replace_dir

# Rounding the weights to bf16 (8 bits of mantissa) moves logits by ~0.4 % of
# their scale; this bound leaves room for depth without hiding a real mismatch.
BF16_LOGIT_RTOL = 0.05


def save_model(model, out_dir: str | Path, tokenizer_dir: str | Path, eos_token_id: int) -> Path:
    """Write config.json, model.safetensors (bf16), generation_config.json and the tokenizer
    files."""
    from transformers import GenerationConfig

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.config.eos_token_id = eos_token_id
    m.config.pad_token_id = eos_token_id
    m.config.bos_token_id = None
    # sampling defaults a chat reads (runtime/api.py sampling_defaults): on the embedded code
    # completer, T 1.0 / top-p 0.95 left 2 of 50 answers with a line repeated > 3 times in 256
    # tokens, where 0.7 / 0.9 left 12 of 30 (five code prompts, ten seeds, /tmp sweep, 2026-11-27)
    m.generation_config = GenerationConfig(
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=0.95,
    )
    m.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer_dir) / name, tmp / name)
    return replace_dir(tmp, out)


def load_model(path: str | Path, dtype=torch.float32):
    """Load a saved directory with transformers, upcast to `dtype`, in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


def _compare(ref: torch.Tensor, got: torch.Tensor, rtol: float, what: str, digits: int) -> dict:
    """{"max_abs_diff", "logit_scale", "argmax_agree"} of two logit tensors; AssertionError
    (`what` by DIFF, shown to `digits` places) above `rtol` times the logit scale (at least 1).
    The difference is recorded to one place more."""
    diff = (ref - got).abs().max().item()
    scale = ref.abs().max().item()
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert diff <= rtol * max(scale, 1.0), f"{what} {diff:.{digits}f} (scale {scale:.2f})"
    return {
        "max_abs_diff": round(diff, digits + 1),
        "logit_scale": round(scale, 3),
        "argmax_agree": agree,
    }


@torch.no_grad()
def check_reload(model, path: str | Path, probe: torch.Tensor) -> dict:
    """Reload `path` and compare logits with `model` on probe (1, T) int64.

    Returns {"max_abs_diff", "logit_scale", "argmax_agree"}; raises AssertionError
    if the difference exceeds BF16_LOGIT_RTOL of the logit scale.
    """
    model.eval()
    ref = model(input_ids=probe).logits.float()
    got = load_model(path)(input_ids=probe).logits.float()
    return _compare(ref, got, BF16_LOGIT_RTOL, f"{path}: reloaded logits differ by", 4)


# Our PyTorch reference runs the delta rule token by token, transformers in chunks: the same
# sums in another order (tests/test_hybrid.py holds random checkpoints to 2e-4).
REFERENCE_ATOL = 1e-3


@torch.no_grad()
def check_reference(path: str | Path, probe: torch.Tensor) -> dict:
    """Logits of Duet's own PyTorch backend (runtime/backends, e.g. torch/qwen3_5.py for a
    hybrid) against transformers' on the saved checkpoint `path`, probe (1, T) int64.

    Returns {"max_abs_diff", "logit_scale", "argmax_agree"}; raises AssertionError above
    REFERENCE_ATOL times the logit scale (at least 1)."""
    from runtime.backends import load_model as load_runtime

    ours = load_runtime(path, "torch", threads=torch.get_num_threads())
    got = torch.from_numpy(ours.forward(probe.numpy(), ours.new_cache())).float()
    ref = load_model(path)(input_ids=probe).logits.float()
    what = f"{path}: Duet's reference differs from transformers by"
    return _compare(ref, got, REFERENCE_ATOL, what, 5)
