"""One static-shape ONNX artefact end to end: export both graphs, optionally QDQ-quantize,
measure parity against the PyTorch reference, record it, describe it for genai."""

from __future__ import annotations

import time
from pathlib import Path

from converters.genai_config import write_genai_config
from converters.onnx_quantize import quantize_static_export
from converters.onnx_static import export_onnx_static, graph_paths
from converters.onnx_static_parity import static_parity
from runtime.config import ModelConfig


def build_static_onnx(
    model_dir: str | Path,
    out: str | Path,
    *,
    context: int | None = None,
    prefill_len: int = 16,
    quantization: str = "none",
    provider: str = "cpu",
) -> dict:
    """Write `out` (decode graph), its `.prefill.onnx` and genai_config.json; returns the report.

    `provider` (cpu|qnn|cuda) is the execution provider the quantized artefact is for: it
    picks the quantization recipe (converters/onnx_quantize.recipe) and where parity runs.
    """
    t0 = time.perf_counter()
    cfg = ModelConfig.from_dir(model_dir)
    if cfg.is_hybrid:
        from runtime.errors import DuetError

        raise DuetError(
            f"{model_dir}: --static-shapes (and its int8/int16 quantization) is not built for "
            f"hybrid {cfg.model_type} models; export the one-token fp32 graph without it"
        )
    if any(cfg.sliding):  # Gemma 3: its local layers' windowed cache is not in the static graph
        from runtime.errors import DuetError

        raise DuetError(
            f"{model_dir}: --static-shapes is not built for sliding-window models "
            f"({cfg.model_type}); export the dynamic fp32 graph without it"
        )
    info = export_onnx_static(model_dir, out, context=context, prefill_len=prefill_len)
    report = {
        "format": "onnx",
        "static_shapes": True,
        "model_type": cfg.model_type,
        "context": info["context"],
        "prefill_len": info["prefill_len"],
        "quantization": quantization,
    }
    if quantization != "none":
        report["quantize"] = quantize_static_export(model_dir, out, quantization, provider)
    report["parity"] = static_parity(model_dir, out, quantization, provider)
    report["genai_config"] = str(
        write_genai_config(
            out,
            cfg,
            info["context"],
            info["prefill_len"],
            quantization,
            provider if quantization != "none" else "qnn",
        )
    )
    report["paths"] = {k: str(p) for k, p in graph_paths(out).items()}
    report["size_bytes"] = sum(p.stat().st_size for p in graph_paths(out).values())
    report["convert_s"] = round(time.perf_counter() - t0, 2)
    return report
