"""Export a Gemma 3 checkpoint (runtime/backends/torch_gemma3.py) to ONNX.

The optimum-style I/O of onnx_export.py, plus the positions of the columns the local
(sliding-window) layers hold, since those layers keep only their window and a slack
(runtime/caches/sliding.py) and apply the window on positions:
  inputs  input_ids (B, T), attention_mask (B, past + T) over every column a global layer
          holds, position_ids (B, T), past_positions (B, held) int64: the positions of the
          columns every local layer holds, past_key_values.{i}.key / .value: (B, KV, past, D)
          for a global layer, (B, KV, held, D) for a local one
  outputs logits (B, T, V), present.{i}.key / .value: past (or held) + T columns
A local layer reads the last held + T columns of the mask. The host appends position_ids
to past_positions itself (runtime/backends/onnx_gemma3.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from converters.onnx_io import OPSET, padded_causal_mask


def gemma_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order."""
    ins = ["input_ids", "attention_mask", "position_ids", "past_positions"]
    outs = ["logits"]
    for i in range(num_layers):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


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
    ids = torch.zeros(B, T, dtype=torch.int64)
    am = torch.ones(B, P + T, dtype=torch.int64)
    pos = torch.arange(P, P + T, dtype=torch.int64)[None]
    held = torch.arange(P - W, P, dtype=torch.int64)[None]
    past = []
    for layer in lm.model.layers:
        n = W if layer.self_attn.sliding else P
        past += [torch.zeros(B, cfg.num_kv_heads, n, cfg.head_dim, dtype=dtype)] * 2
    ins, outs = gemma_io_names(cfg.num_layers)
    dyn = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        "past_positions": {0: "batch", 1: "held"},
        "logits": {0: "batch", 1: "seq"},
    }
    for i, layer in enumerate(lm.model.layers):
        local = layer.self_attn.sliding
        for kind in ("key", "value"):
            dyn[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: "held" if local else "past"}
            dyn[f"present.{i}.{kind}"] = {0: "batch", 2: "held_total" if local else "total"}
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # see onnx_export.py
        torch.onnx.export(GemmaOnnxGraph(lm), (ids, am, pos, held, *past), str(out),
                          input_names=ins, output_names=outs, dynamic_axes=dyn,
                          opset_version=OPSET, dynamo=False)  # fmt: skip
