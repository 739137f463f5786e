"""Static-shape ONNX export: a fixed query length and a fixed cache, as NPU providers
(QNN on Hexagon) require.

The graph is the PyTorch reference (`runtime/backends/torch/llama.py`) in the
optimum calling convention of `onnx_export.py`, with every shape fixed:
  inputs  input_ids (1, T) int64, position_ids (1, T) int64,
          attention_mask (1, C + T) int64 over [C cache slots ; T new tokens],
          past_key_values.{i}.key / .value (1, KV, C, D)
  outputs logits (1, T, V), present.{i}.key / .value (1, KV, T, D): only the new
          tokens' rows, which the host writes into cache slots [offset, offset + T)
Two graphs per export: `decode` (T = 1) and `prefill` (T = P, the last chunk
padded). The host side is runtime/backends/onnx/static_host.py; quantization `onnx_quantize.py`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from converters.onnx_export import OnnxGraph
from converters.onnx_io import io_names, trace_onnx
from runtime.backends.onnx.static_host import graph_paths
from runtime.backends.torch import load_torch_lm
from runtime.errors import DuetError

DEFAULT_PREFILL = 16


class StaticGraph(nn.Module):
    """OnnxGraph returning only the new rows of each present, so every output is fixed-size."""

    def __init__(self, graph: OnnxGraph, query_len: int):
        super().__init__()
        self.graph, self.query_len = graph, query_len

    def forward(self, input_ids, attention_mask, position_ids, *past_flat):
        logits, *presents = self.graph(input_ids, attention_mask, position_ids, *past_flat)
        return (logits, *[p[:, :, -self.query_len :] for p in presents])  # (1, KV, T, D)


def export_static_graph(lm, out: Path, context: int, query_len: int) -> None:
    cfg = lm.cfg
    ids = torch.zeros(1, query_len, dtype=torch.int64)
    am = torch.ones(1, context + query_len, dtype=torch.int64)
    pos = torch.arange(query_len, dtype=torch.int64)[None]
    past = [
        torch.zeros(1, cfg.num_kv_heads, context, cfg.head_dim) for _ in range(2 * cfg.num_layers)
    ]
    ins, outs = io_names(cfg.num_layers)
    # no dynamic_axes: every dimension is fixed
    trace_onnx(
        StaticGraph(OnnxGraph(lm), query_len),
        (ids, am, pos, *past),
        out,
        ins,
        outs,
        quiet=(torch.jit.TracerWarning,),
    )


def export_onnx_static(
    model_dir: str | Path,
    out: str | Path,
    *,
    context: int | None = None,
    prefill_len: int = DEFAULT_PREFILL,
) -> dict:
    """Export the decode (T=1) and prefill (T=P) graphs of `model_dir` with a cache of
    `context` slots (default the model's max_position_embeddings). Returns {paths, context,
    prefill_len, seconds, bytes}."""
    t0 = time.perf_counter()
    lm = load_torch_lm(model_dir)
    ctx = int(context or lm.cfg.max_context)
    if ctx < 2:
        raise DuetError(f"--max-context must be at least 2, not {ctx}")
    prefill_len = max(2, min(prefill_len, ctx))
    paths = graph_paths(out)
    for name, length in (("decode", 1), ("prefill", prefill_len)):
        export_static_graph(lm, paths[name], ctx, length)
        set_metadata(
            paths[name],
            {"duet.config": lm.cfg.raw, "duet.static": {"context": ctx, "query_len": length}},
        )
    return {
        "paths": {k: str(v) for k, v in paths.items()},
        "context": ctx,
        "prefill_len": prefill_len,
        "seconds": round(time.perf_counter() - t0, 2),
        "bytes": sum(p.stat().st_size for p in paths.values()),
    }


def set_metadata(path: str | Path, entries: dict) -> None:
    """Write JSON-encoded `entries` into an ONNX file's metadata_props (replacing same keys)."""
    import json

    import onnx

    m = onnx.load(str(path))
    keep = [p for p in m.metadata_props if p.key not in entries]
    del m.metadata_props[:]
    for p in keep:
        m.metadata_props.add(key=p.key, value=p.value)
    for k, v in entries.items():
        m.metadata_props.add(key=k, value=json.dumps(v, sort_keys=True))
    onnx.save(m, str(path))
