"""Export a Gemma 3 checkpoint (runtime/backends/torch/gemma3_text.py) to ONNX.

The optimum-style I/O of onnx_export.py, plus the positions of the columns the local
(sliding-window) layers hold, since those layers keep only their window and a slack
(runtime/caches/sliding.py) and apply the window on positions:
  inputs  input_ids (B, T), attention_mask (B, past + T) over every column a global layer
          holds, position_ids (B, T), past_positions (B, held) int64: the positions of the
          columns every local layer holds, past_key_values.{i}.key / .value: (B, KV, past, D)
          for a global layer, (B, KV, held, D) for a local one
  outputs logits (B, T, V), present.{i}.key / .value: past (or held) + T columns
A local layer reads the last held + T columns of the mask. The host appends position_ids
to past_positions itself (runtime/backends/onnx/gemma3_text.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from converters.onnx_io import (
    WINDOW_AXES,
    dummy_window,
    io_names,
    padded_causal_mask,
    trace_onnx,
)


def gemma_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order."""
    return io_names(num_layers, ("input_ids", "attention_mask", "position_ids", "past_positions"))


class GemmaOnnxGraph(nn.Module):
    """Gemma3LM with a 2-D padding mask, flat past tensors and the local layers' positions."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, position_ids, past_positions, *past_flat):
        mask = padded_causal_mask(input_ids, attention_mask)  # (B, 1, T, past + T)
        past = []
        for i, layer in enumerate(self.lm.model.layers):
            kv = (past_flat[2 * i], past_flat[2 * i + 1])
            past.append((*kv, past_positions) if layer.self_attn.sliding else kv)
        logits, presents = self.lm(input_ids, position_ids, mask, past)
        return (logits, *[t for p in presents for t in p[:2]])


def export_gemma_onnx(lm, out: Path, dtype: torch.dtype) -> None:
    """Trace `lm` (a Gemma3LM) to the ONNX file `out`."""
    cfg = lm.cfg
    B, T, P, W = 1, 2, 5, 3  # dummy sizes (global past P, local held W); all dynamic below
    ids, am, pos = dummy_window(B, T, P)
    held = torch.arange(P - W, P, dtype=torch.int64)[None]
    past = []
    for layer in lm.model.layers:
        n = W if layer.self_attn.sliding else P
        past += [torch.zeros(B, cfg.num_kv_heads, n, cfg.head_dim, dtype=dtype)] * 2
    ins, outs = gemma_io_names(cfg.num_layers)
    dyn = {**WINDOW_AXES, "past_positions": {0: "batch", 1: "held"}}
    for i, layer in enumerate(lm.model.layers):
        local = layer.self_attn.sliding
        for kind in ("key", "value"):
            dyn[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: "held" if local else "past"}
            dyn[f"present.{i}.{kind}"] = {0: "batch", 2: "held_total" if local else "total"}
    trace_onnx(GemmaOnnxGraph(lm), (ids, am, pos, held, *past), out, ins, outs, dyn)
