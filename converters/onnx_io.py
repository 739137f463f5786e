"""What every decoder export shares: the opset, the optimum-style I/O names, the padded
causal mask the graphs build from `attention_mask`, the trace itself and the config it
embeds. The family exporters (onnx_export.py, onnx_hybrid_export.py, onnx_gemma3_export.py,
onnx_ss_export.py, onnx_static.py, onnx_mtp.py) import it from here, and onnx_export.py
dispatches to them, so no two of them import each other.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

OPSET = 17
# the TorchScript exporter's deprecation note, and the shape checks a trace freezes (GQA's
# repeat count: true for every shape exported); printed before a command's own one-line
# error they are noise to its user
TRACE_NOTES = (DeprecationWarning, torch.jit.TracerWarning)


def io_names(
    num_layers: int,
    inputs: tuple[str, ...] = ("input_ids", "attention_mask", "position_ids"),
    outputs: tuple[str, ...] = ("logits",),
) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order: `inputs` and `outputs`, then each layer's
    past_key_values.{i}.key / .value and present.{i}.key / .value."""
    ins, outs = list(inputs), list(outputs)
    for i in range(num_layers):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


# the dynamic axes of a window's inputs and its logits (optimum's names)
WINDOW_AXES = {
    "input_ids": {0: "batch", 1: "seq"},
    "attention_mask": {0: "batch", 1: "total"},
    "position_ids": {0: "batch", 1: "seq"},
    "logits": {0: "batch", 1: "seq"},
}


def kv_axes(num_layers: int) -> dict[str, dict[int, str]]:
    """The dynamic axes of every layer's K and V: batch and past in, batch and total out."""
    ins, outs = io_names(num_layers, (), ())
    return {
        **{n: {0: "batch", 2: "past"} for n in ins},
        **{n: {0: "batch", 2: "total"} for n in outs},
    }


def dummy_window(batch: int, length: int, past: int) -> tuple[torch.Tensor, ...]:
    """Trace inputs of a window of `length` tokens after `past` positions: input_ids (B, T),
    attention_mask (B, past + T) of ones and position_ids (1, T)."""
    ids = torch.zeros(batch, length, dtype=torch.int64)
    am = torch.ones(batch, past + length, dtype=torch.int64)
    pos = torch.arange(past, past + length, dtype=torch.int64)[None]
    return ids, am, pos


def padded_causal_mask(input_ids, attention_mask):
    """The (B, 1, T, S) boolean mask of T new tokens over S positions: causal, and hiding the
    positions a 2-D padding `attention_mask` (B, S) zeroes (the optimum calling convention)."""
    T, S = input_ids.shape[1], attention_mask.shape[1]
    q = torch.arange(T, device=input_ids.device)[:, None] + (S - T)
    k = torch.arange(S, device=input_ids.device)[None, :]
    return (k <= q)[None, None] & attention_mask[:, None, None, :].bool()


def trace_onnx(
    module,
    args: tuple,
    out: Path,
    ins: list[str],
    outs: list[str],
    dynamic_axes: dict | None = None,
    quiet: tuple = TRACE_NOTES,
) -> None:
    """Trace `module` on `args` to the ONNX file `out` with the TorchScript exporter (the one
    that keeps our I/O names) at OPSET; warnings of the classes in `quiet` are not printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(), warnings.catch_warnings():
        for category in quiet:
            warnings.simplefilter("ignore", category)
        torch.onnx.export(
            module,
            args,
            str(out),
            input_names=ins,
            output_names=outs,
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            dynamo=False,
        )


def embed_config(path: Path, cfg) -> None:
    """Store config.json in the file's metadata_props (`duet.config`) so the .onnx is
    self-describing."""
    import onnx

    m = onnx.load(str(path))
    entry = m.metadata_props.add()
    entry.key, entry.value = "duet.config", json.dumps(cfg.raw)
    onnx.save(m, str(path))
