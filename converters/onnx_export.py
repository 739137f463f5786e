"""Export a checkpoint to ONNX with the KV cache as explicit inputs and outputs.

I/O names follow optimum and onnxruntime-genai, so their tools and ours read
the same file:
  inputs  input_ids (B, T) int64, attention_mask (B, past + T) int64,
          position_ids (B, T) int64, past_key_values.{i}.key / .value (B, KV, past, D)
  outputs logits (B, T, V), present.{i}.key / .value (B, KV, past + T, D)
The graph is our PyTorch reference (runtime/backends/torch_ref.py) traced with
the TorchScript exporter; shapes are dynamic in batch, sequence and past. A hybrid
(`qwen3_5_text`) checkpoint exports the one-token graph of onnx_hybrid_export.py instead,
its linear layers' conv and recurrent states as further inputs and outputs.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch
from torch import nn

from converters.onnx_io import OPSET, io_names, padded_causal_mask
from runtime.backends.torch_load import load_torch_lm
from runtime.backends.torch_ref import TorchLM


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


def _embed_config(path: Path, cfg) -> None:
    """Store config.json in the file's metadata_props so the .onnx is self-describing."""
    import json

    import onnx

    m = onnx.load(str(path))
    entry = m.metadata_props.add()
    entry.key, entry.value = "duet.config", json.dumps(cfg.raw)
    onnx.save(m, str(path))


def export_onnx(
    model_dir: str | Path, out: str | Path, *, dtype: torch.dtype = torch.float32
) -> dict:
    """Export `model_dir` to the ONNX file `out`; returns {path, seconds, bytes}."""
    t0 = time.perf_counter()
    lm = load_torch_lm(model_dir, dtype)
    cfg = lm.cfg
    if cfg.is_hybrid:  # states as graph I/O, one token per call (onnx_hybrid_export.py)
        from converters.onnx_hybrid_export import export_hybrid_onnx

        out = Path(out)
        from runtime.backends.onnx_hybrid import prefill_path

        export_hybrid_onnx(lm, out, dtype)
        _embed_config(out, cfg)
        pre = prefill_path(out)
        return {"path": str(out), "prefill_path": str(pre), "seconds": time.perf_counter() - t0,
                "bytes": out.stat().st_size + pre.stat().st_size}  # fmt: skip
    if cfg.model_type == "gemma3_text":  # local layers' positions as I/O (onnx_gemma3_export.py)
        from converters.onnx_gemma3_export import export_gemma_onnx

        export_gemma_onnx(lm, Path(out), dtype)
        _embed_config(Path(out), cfg)
        return {"path": str(out), "seconds": time.perf_counter() - t0,
                "bytes": Path(out).stat().st_size}  # fmt: skip
    B, T, P = 1, 2, 3  # dummy sizes; every axis below is declared dynamic
    ids = torch.zeros(B, T, dtype=torch.int64)
    am = torch.ones(B, P + T, dtype=torch.int64)
    pos = torch.arange(P, P + T, dtype=torch.int64)[None]
    past = [
        torch.zeros(B, cfg.num_kv_heads, P, cfg.head_dim, dtype=dtype)
        for _ in range(2 * cfg.num_layers)
    ]
    ins, outs = io_names(cfg.num_layers)
    dyn = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        "logits": {0: "batch", 1: "seq"},
    }
    for n in ins[3:]:
        dyn[n] = {0: "batch", 2: "past"}
    for n in outs[1:]:
        dyn[n] = {0: "batch", 2: "total"}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", DeprecationWarning
        )  # the TorchScript exporter is the one that keeps our I/O names
        # shape checks the trace freezes (GQA's repeat count): true for every shape exported,
        # and a warning printed before a command's own one-line error is noise to its user
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            OnnxGraph(lm),
            (ids, am, pos, *past),
            str(out),
            input_names=ins,
            output_names=outs,
            dynamic_axes=dyn,
            opset_version=OPSET,
            dynamo=False,
        )
    _embed_config(out, cfg)
    return {"path": str(out), "seconds": time.perf_counter() - t0, "bytes": out.stat().st_size}
