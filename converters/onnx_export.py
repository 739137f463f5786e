"""Export a checkpoint to ONNX with the KV cache as explicit inputs and outputs.

I/O names follow optimum and onnxruntime-genai, so their tools and ours read
the same file:
  inputs  input_ids (B, T) int64, attention_mask (B, past + T) int64,
          position_ids (B, T) int64, past_key_values.{i}.key / .value (B, KV, past, D)
  outputs logits (B, T, V), present.{i}.key / .value (B, KV, past + T, D)
The graph is our PyTorch reference (runtime/backends/torch/llama.py) traced with
the TorchScript exporter; shapes are dynamic in batch, sequence and past. A hybrid
(`qwen3_5_text`) checkpoint exports the one-token graph of onnx_hybrid_export.py instead,
its linear layers' conv and recurrent states as further inputs and outputs.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from converters.onnx_io import (
    WINDOW_AXES,
    dummy_window,
    embed_config,
    io_names,
    kv_axes,
    padded_causal_mask,
    trace_onnx,
)
from runtime.backends.onnx import onnx_family
from runtime.backends.torch import load_torch_lm
from runtime.backends.torch.llama import TorchLM


class OnnxGraph(nn.Module):
    """TorchLM with the optimum calling convention: a 2-D padding mask, flat past tensors."""

    def __init__(self, lm: TorchLM):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, position_ids, *past_flat):
        mask = padded_causal_mask(input_ids, attention_mask)
        past = [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(len(past_flat) // 2)]
        logits, presents = self.lm(input_ids, position_ids, mask, past)
        return (logits, *[t for kv in presents for t in kv])


def export_onnx(
    model_dir: str | Path, out: str | Path, *, dtype: torch.dtype = torch.float32
) -> dict:
    """Export `model_dir` to the ONNX file `out`; returns {path, seconds, bytes}."""
    t0 = time.perf_counter()
    lm = load_torch_lm(model_dir, dtype)
    cfg = lm.cfg
    family = onnx_family(cfg)  # the file of runtime/backends/onnx/ that will run the export
    if family == "qwen3_5":  # states as graph I/O, one token per call (onnx_hybrid_export.py)
        from converters.onnx_hybrid_export import export_hybrid_onnx

        out = Path(out)
        from runtime.backends.onnx.qwen3_5 import prefill_path

        export_hybrid_onnx(lm, out, dtype)
        embed_config(out, cfg)
        pre = prefill_path(out)
        return {
            "path": str(out),
            "prefill_path": str(pre),
            "seconds": time.perf_counter() - t0,
            "bytes": out.stat().st_size + pre.stat().st_size,
        }
    if family == "gemma3_text":  # local layers' positions as I/O (onnx_gemma3_export.py)
        from converters.onnx_gemma3_export import export_gemma_onnx

        export_gemma_onnx(lm, Path(out), dtype)
        embed_config(Path(out), cfg)
        return {
            "path": str(out),
            "seconds": time.perf_counter() - t0,
            "bytes": Path(out).stat().st_size,
        }
    B, T, P = 1, 2, 3  # dummy sizes; every axis below is declared dynamic
    ids, am, pos = dummy_window(B, T, P)
    past = [
        torch.zeros(B, cfg.num_kv_heads, P, cfg.head_dim, dtype=dtype)
        for _ in range(2 * cfg.num_layers)
    ]
    ins, outs = io_names(cfg.num_layers)
    dyn = {**WINDOW_AXES, **kv_axes(cfg.num_layers)}
    out = Path(out)
    trace_onnx(OnnxGraph(lm), (ids, am, pos, *past), out, ins, outs, dyn)
    embed_config(out, cfg)
    return {"path": str(out), "seconds": time.perf_counter() - t0, "bytes": out.stat().st_size}
