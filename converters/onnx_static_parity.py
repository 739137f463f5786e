"""Parity of a static-shape ONNX export against the PyTorch reference, with named
tolerances per quantization scheme, recorded in the files' metadata_props.

fp32 must match the reference's logits (max |Δlogit|); a QDQ-quantized export
changes the numbers on purpose, so it is held to top-1 agreement over the same
prefill and cached greedy decode steps, with max |Δlogit| reported beside it.

Parity is measured on the execution provider the artefact was quantized for when ONNX
Runtime has it here; otherwise the CPU provider stands in, and the report says so and
names the CPU's int8 path (x86-64 with or without VNNI, arm64) and which kernels ran.
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


# the artefact's provider (converters/onnx_quantize.PROVIDERS) -> ONNX Runtime's name for it
ORT_PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "cuda": "CUDAExecutionProvider",
}


def static_parity(
    model_dir: str | Path, decode_path: str | Path, scheme: str = "none", provider: str = "cpu"
) -> dict:
    """Measure, judge and record parity of the export at `decode_path` (both graphs)."""
    import onnxruntime as ort

    from runtime.backends.onnx.cpu_int8 import int8_path
    from runtime.backends.onnx.static_host import StaticOnnxLM
    from runtime.backends.torch.causal_lm import TorchCausalLM

    want = ORT_PROVIDERS[provider]
    measured_on = want if want in ort.get_available_providers() else "CPUExecutionProvider"
    lm = StaticOnnxLM.load(decode_path, provider=measured_on)
    prompt = max(
        2, min(16, lm.context // 2)
    )  # longer than one prefill chunk where the context allows
    figures = decode_parity(TorchCausalLM.load(model_dir), lm, prompt_len=prompt, decode_steps=8)
    figures.update(provider=provider, measured_on=measured_on, kernels=lm.qdq_path)
    if measured_on != want:
        figures["stand_in"] = f"CPUExecutionProvider stands in for {want} (not present here)"
    if measured_on == "CPUExecutionProvider":
        figures["cpu_int8_path"] = int8_path().name
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
