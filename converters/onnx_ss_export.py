"""Export a speculative-streaming (SS) draft to ONNX: one graph for main and stream tokens.

The ordinary export (converters/onnx_export.py) takes a 2-D padding mask and builds the
causal mask inside; multi-stream attention is not causal-minus-holes, so this graph takes
the full mask instead:
  inputs  input_ids (B, T) int64, owners (P,) int64 (main positions that carry streams),
          position_ids (B, T + P*n) int64, attention_mask (B, T + P*n, past + T + P*n) bool,
          past_key_values.{i}.key / .value (B, KV, past, D)
  outputs logits (B, T, V) (main stream), stream_logits (B, P, n, V),
          present.{i}.key / .value (B, KV, past + T + P*n, D) (stream columns last)
kernels/stream_mask.py builds the mask and positions; runtime/drafts/ss/onnx.py runs it.
The graph is runtime/drafts/ss/torch.py's `stream_pass`, traced; every axis is dynamic.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from converters.onnx_io import embed_config, io_names, kv_axes, trace_onnx


def ss_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order."""
    return io_names(
        num_layers,
        ("input_ids", "owners", "position_ids", "attention_mask"),
        ("logits", "stream_logits"),
    )


class SSOnnxGraph(nn.Module):
    """SSTorchLM.stream_pass with flat past tensors and a (B, ., .) bool mask."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, owners, position_ids, attention_mask, *past_flat):
        past = [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(len(past_flat) // 2)]
        main, streams, presents = self.lm.stream_pass(
            input_ids, owners, position_ids, attention_mask[:, None], past
        )
        return (main, streams, *[t for kv in presents for t in kv])


def export_ss_onnx(model_dir: str | Path, out: str | Path) -> dict:
    """Export the SS draft `model_dir` to the ONNX file `out` (float32); {path, seconds, bytes}."""
    from runtime.drafts.ss.torch import load_ss_module

    t0 = time.perf_counter()
    lm = load_ss_module(model_dir)
    cfg, n = lm.cfg, lm.n_streams
    B, T, P, S0 = 1, 3, 2, 4  # dummy sizes; every axis below is declared dynamic
    ids = torch.zeros(B, T, dtype=torch.int64)
    owners = torch.tensor([1, 2], dtype=torch.int64)
    pos = torch.arange(T + P * n, dtype=torch.int64)[None] + S0
    mask = torch.ones(B, T + P * n, S0 + T + P * n, dtype=torch.bool)
    past = [torch.zeros(B, cfg.num_kv_heads, S0, cfg.head_dim) for _ in range(2 * cfg.num_layers)]
    ins, outs = ss_io_names(cfg.num_layers)
    dyn = {
        "input_ids": {0: "batch", 1: "seq"},
        "owners": {0: "owners"},
        "position_ids": {0: "batch", 1: "rows"},
        "attention_mask": {0: "batch", 1: "rows", 2: "total"},
        "logits": {0: "batch", 1: "seq"},
        "stream_logits": {0: "batch", 1: "owners"},
        **kv_axes(cfg.num_layers),
    }
    out = Path(out)
    trace_onnx(
        SSOnnxGraph(lm), (ids, owners, pos, mask, *past), out, ins, outs, dyn, quiet=(Warning,)
    )
    embed_config(out, cfg)
    return {"path": str(out), "seconds": time.perf_counter() - t0, "bytes": out.stat().st_size}
