"""Parity of a static-shape ONNX export against the PyTorch reference, with named
tolerances per quantization scheme, recorded in the files' metadata_props.

fp32 must match the reference's logits (max |Δlogit|); a QDQ-quantized export
changes the numbers on purpose, so it is held to top-1 agreement over the same
prefill and cached greedy decode steps, with max |Δlogit| reported beside it.
"""

from __future__ import annotations

from pathlib import Path

from converters.onnx_static import graph_paths, set_metadata
from converters.parity import ONNX_FP32_TOL, decode_parity

# scheme -> the named tolerance it must meet. The quantized ones are floors that catch a
# broken quantization (top-1 near 1/V); the tests' random checkpoints, with large weights,
# sit far below what a trained draft reaches.
TOLERANCES = {
    "none": {"max_abs": ONNX_FP32_TOL},
    "int16": {"min_top1": 0.85},
    "int8": {"min_top1": 0.6},
}


def static_parity(model_dir: str | Path, decode_path: str | Path, scheme: str = "none") -> dict:
    """Measure, judge and record parity of the export at `decode_path` (both graphs)."""
    from converters.onnx_static_host import StaticOnnxLM
    from runtime.backends.torch_backend import TorchCausalLM

    lm = StaticOnnxLM.load(decode_path)
    prompt = max(
        2, min(16, lm.context // 2)
    )  # longer than one prefill chunk where the context allows
    figures = decode_parity(TorchCausalLM.load(model_dir), lm, prompt_len=prompt, decode_steps=8)
    tol = TOLERANCES[scheme]
    ok = (
        figures["max_abs"] <= tol["max_abs"]
        if "max_abs" in tol
        else figures["top1_agree"] >= tol["min_top1"]
    )
    figures.update(reference="torch_ref fp32", quantization=scheme, tolerance=tol, ok=ok)
    for path in graph_paths(decode_path).values():
        set_metadata(path, {"duet.parity": figures})
    return figures
