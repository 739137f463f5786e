"""Export a target checkpoint to ONNX graphs for the ONNX Runtime target, optionally with
block-wise int4 / int8 weights (MatMulNBits).

A target is exported as *parts*, each its own graph (runtime/backends/onnx/target.py runs
them), built op by op by converters/onnx_target_graph.py (Llama, Qwen2, Qwen3) and
converters/onnx_target_gemma3.py (Gemma 3, whose local layers also read `local_mask`):
  full        layers 0..N-1 + final norm + LM head: ids -> logits, hidden (pre-norm, last layer)
  layers.a.b  layers a..b-1: ids (a == 0) or (hidden, resid) -> (hidden, resid): the residual
              stream and its last block's output, added by the next part's first norm as the
              whole graph adds them (converters/onnx_target_graph.py, residual_inputs; the
              runtime carries the two as one `Residual`). Mirror-SD's early exit runs
              layers.0.E, the head on its hidden state, then layers.E.N and the head: the
              early-exit message leaves after E layers and one head, as on the PyTorch target
  head        final norm + LM head on any hidden state (Mirror-SD eq. 6)
  full.taps.i.j.k  the full graph with a third output `taps`: layers i, j, k's outputs, what
              a fitted head reads (`--draft head`), recorded in the one run
Every graph that runs layers takes
  input_ids (B, T) int64 or hidden_in and resid_in (B, T, C) float32, position_ids (B, T) int64,
  attention_mask (B, T, past + T) bool (True = may attend: causal, tree and branch masks alike;
  Gemma 3's sliding layers read local_mask), or under the recipe's attention "rows" that mask
  as kv_index / seqlens_k / gqa_mask (converters/onnx_target_rows.py),
  past.{i}.key / past.{i}.value (B, KV, past, D) for its layers i
and returns present.{i}.key / .value (B, KV, past + T, D). Positions and the mask are explicit,
so tree verification and branch rows run on it; rollback stays an offset on the host cache.

Quantization (`quantize`): "none" keeps float32. "int4" / "int8" rewrite every MatMul with a
constant weight (packed q|k|v, o, packed gate|up, down, and the LM head; a tied model's head is
its own transposed copy of the embedding; the head keeps 8 bits under int4: on SmolLM2 an int4
head cost 11 points of top-1 agreement, 64 % against 75 %) as ONNX Runtime's MatMulNBits
(onnxruntime.quantization's MatMulNBitsQuantizer for 4 bits; 8 bits as one 8-bit MatMulNBits
on a VNNI CPU, else two 4-bit halves, converters/onnx_head_split.py): symmetric blocks of
BLOCK_SIZE along the input dimension, requantized from the checkpoint's float32 weights, at
the accuracy level of runtime/backends/onnx/target.py (4: int8 activations; why there).
Under int4, a weight that already lies on a 4-bit block grid (a checkpoint dequantized from a
Q4_0/Q4_1 GGUF) keeps its own blocks exactly instead (converters/onnx_grid_q4.py). The
embedding stays float32 (a Gather reads one row a token). The recipe is stored in the graph's
metadata (duet.quantization).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from converters.onnx_target_family import build_family_part
from converters.onnx_target_graph import Span
from converters.onnx_target_quant import quantize_graph
from runtime.backends.onnx.target import (  # noqa: F401
    HEAD_ACCURACY_LEVEL,
    QUANTIZE,
    part_name,
    recipe,
)
from runtime.backends.torch import load_torch_lm, torch_family
from runtime.config import ModelConfig
from runtime.errors import DuetError


def io_names(start: int, stop: int, head: bool) -> tuple[list[str], list[str]]:
    """(input names, output names) of a part, in graph order."""
    carried = ["hidden_in", "resid_in"]  # a later part: the residual stream as two halves
    if start == stop:
        return carried, ["logits"]
    ins = [*(["input_ids"] if start == 0 else carried), "position_ids", "attention_mask"]
    outs = ["logits", "hidden"] if head else ["hidden", "resid"]
    for i in range(start, stop):
        ins += [f"past.{i}.key", f"past.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


def export_target_part(
    model_dir,
    out,
    start: int,
    stop: int,
    head: bool,
    quantize: str = "none",
    lm=None,
    taps: tuple[int, ...] = (),
) -> dict:
    """Export one part of `model_dir`'s target to `out` (quantized when asked; `taps`: the
    whole graph with those layers' outputs as a third output); returns
    {path, seconds, bytes, quantization}."""
    t0 = time.perf_counter()
    rec = recipe(quantize)
    from converters.gguf_target import is_gguf_description

    if lm is None and quantize != "none" and is_gguf_description(Path(model_dir)):
        from converters.gguf_target import build_from_gguf

        cfg = ModelConfig.from_dir(model_dir)
        _check_range(cfg, start, stop, head)
        m = build_from_gguf(Path(model_dir), Path(out), start, stop, head, rec, taps)
        return _save_part(m, Path(out), cfg, rec, (start, stop, head), taps, t0)
    lm = lm if lm is not None else load_torch_lm(model_dir, torch.float32)
    cfg = lm.cfg
    family = torch_family(cfg)  # the file of runtime/backends/torch/ that built `lm`
    if family not in ("llama", "gemma3_text"):
        raise DuetError(
            f"{model_dir}: the ONNX target runs Llama, Qwen2, Qwen3 and Gemma 3 checkpoints "
            f"(got {cfg.model_type}); use --target-backend torch"
        )
    _check_range(cfg, start, stop, head)
    state = lm.state_dict()
    rows = rec.get("attention", "window").startswith("rows")
    m = build_family_part(family, cfg, state, lm, Span(start, stop, head, rows, tuple(taps)))
    del state
    if quantize != "none":
        m = quantize_graph(m, rec, gguf=_from_gguf(model_dir))
    return _save_part(m, Path(out), cfg, rec, (start, stop, head), taps, t0)


def _check_range(cfg, start: int, stop: int, head: bool) -> None:
    if not (0 <= start <= stop <= cfg.num_layers) or (start == stop and not head):
        raise DuetError(f"layer range [{start}, {stop}) outside 0..{cfg.num_layers}")


def _save_part(m, out: Path, cfg, rec: dict, part: tuple, taps, t0: float) -> dict:
    """Write the part with its metadata, atomically; returns export_target_part's dict."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.onnx")
    for key, value in (
        ("duet.config", json.dumps(cfg.raw)),
        ("duet.quantization", json.dumps(rec)),
        ("duet.part", json.dumps(list(part))),
        ("duet.taps", json.dumps(list(taps))),
    ):
        e = m.metadata_props.add()
        e.key, e.value = key, value
    import onnx

    onnx.save(m, str(tmp))
    tmp.replace(out)  # atomic: a reader never sees half a file
    data = out.with_name(out.name + ".data")
    return {
        "path": str(out),
        "seconds": time.perf_counter() - t0,
        "bytes": out.stat().st_size + (data.stat().st_size if data.is_file() else 0),
        "quantization": rec,
    }


def _from_gguf(model_dir) -> bool:
    """Whether the checkpoint was dequantized from a GGUF (runtime/gguf_import.py notes it)."""
    f = Path(model_dir) / "duet-source.json"
    try:
        return f.is_file() and bool(json.loads(f.read_text()).get("gguf"))
    except (OSError, ValueError, AttributeError):
        return False


def export_target(
    model_dir, out_dir, quantize: str = "int4", exit_layer: int | None = None
) -> list:
    """Ahead-of-time build (`converters export --role target`): the full graph, and with
    `exit_layer` the early-exit parts (layers.0.E, layers.E.N, head), into `out_dir` under the
    names runtime/backends/onnx/target.py caches them by."""
    from runtime.backends.onnx.target import part_path

    lm = load_torch_lm(model_dir, torch.float32)
    n = lm.cfg.num_layers
    parts = [(0, n, True)]
    if exit_layer is not None:
        if not 0 < exit_layer < n:
            raise DuetError(f"--exit-layer {exit_layer} out of range 1..{n - 1}")
        parts += [(0, exit_layer, False), (exit_layer, n, False), (n, n, True)]
    done = []
    for a, b, h in parts:
        name = part_path(Path(model_dir), quantize, part_name(a, b, n, h)).name
        p = Path(out_dir) / name  # the runtime's cache name: DIR can seed <checkpoint>/.duet
        done.append(export_target_part(model_dir, p, a, b, h, quantize, lm=lm))
    return done
