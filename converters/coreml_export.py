"""Draft checkpoint -> Core ML `.mlpackage`: an iOS 18 / macOS 15 mlprogram in fp16 with
`prefill` and `decode` functions sharing one copy of the weights.

Two cache flavours:
- "stateful" (default): the KV cache is Core ML state (`ct.StateType`), written in
  place with slice_update, so nothing but logits crosses the device boundary;
- "kvio": the cache goes in as inputs and the new rows come out as outputs, the
  fallback for OS versions or compute units where state fails.

This module converts and compresses; the model maths is `coreml_model.py`, the
structure check runtime/backends/coreml/spec.py (the backend reads it as well), the
numerics check `coreml_parity.py`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from converters.coreml_model import KVIODecoder, StatefulDecoder, additive_mask, load_decoder
from runtime.errors import DuetError

FLAVOURS = ("stateful", "kvio")
COMPRESSIONS = ("none", "int8", "palettize4", "int4")
DEFAULT_PREFILL = 64  # prefill query length; the host pads the last chunk to it


def _quiet_ct():
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=".*has not been tested with coremltools.*")
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    import coremltools as ct

    return ct


def io_spec(decoder, length: int, flavour: str):
    """The Core ML inputs, outputs and states of one function with query length `length`."""
    ct = _quiet_ct()
    s = decoder.context
    shape = decoder.cache_shape()  # (L, n_kv, S, D)
    inputs = [
        ct.TensorType("input_ids", shape=(1, length), dtype=np.int32),
        ct.TensorType("position_ids", shape=(1, length), dtype=np.int32),
        ct.TensorType("cache_offset", shape=(1,), dtype=np.int32),
        ct.TensorType("attention_mask", shape=(1, 1, length, s), dtype=np.float16),
    ]
    outputs = [ct.TensorType("logits", dtype=np.float16)]
    states = []
    if flavour == "stateful":
        states = [
            ct.StateType(ct.TensorType(shape=shape, dtype=np.float16), name="k_cache"),
            ct.StateType(ct.TensorType(shape=shape, dtype=np.float16), name="v_cache"),
        ]
    else:
        inputs += [
            ct.TensorType("k_cache", shape=shape, dtype=np.float16),
            ct.TensorType("v_cache", shape=shape, dtype=np.float16),
        ]
        outputs += [
            ct.TensorType("k_new", dtype=np.float16),
            ct.TensorType("v_new", dtype=np.float16),
        ]
    return inputs, outputs, states


def example_inputs(decoder, length: int, flavour: str) -> tuple[torch.Tensor, ...]:
    ids = torch.zeros((1, length), dtype=torch.int32)
    pos = torch.arange(length, dtype=torch.int32)[None]
    off = torch.zeros((1,), dtype=torch.int32)
    mask = additive_mask(0, length, decoder.context)
    if flavour == "stateful":
        return ids, pos, off, mask
    kc = torch.zeros(decoder.cache_shape())
    return ids, pos, off, mask, kc, kc.clone()


def convert_function(decoder, length: int, flavour: str):
    """Trace the wrapper at query length `length` and convert it to an fp16 MLModel."""
    ct = _quiet_ct()
    wrapper = (
        StatefulDecoder(decoder, torch.float16) if flavour == "stateful" else KVIODecoder(decoder)
    )
    wrapper.eval()
    with torch.no_grad():
        traced = torch.jit.trace(
            wrapper, example_inputs(decoder, length, flavour), check_trace=False
        )
    inputs, outputs, states = io_spec(decoder, length, flavour)
    return ct.convert(
        traced,
        inputs=inputs,
        outputs=outputs,
        states=states or None,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,  # state and int4 need iOS 18 / macOS 15
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,  # loading compiles, which only macOS can do
    )


def compress(mlmodel, scheme: str):
    """Weight compression applied to a converted model: int8 linear, 4-bit palettes, int4
    per-channel."""
    if scheme not in COMPRESSIONS:
        raise DuetError(
            f"unknown Core ML compression {scheme!r}; choose from {', '.join(COMPRESSIONS)}"
        )
    if scheme == "none":
        return mlmodel
    from coremltools.optimize.coreml import (
        OpLinearQuantizerConfig,
        OpPalettizerConfig,
        OptimizationConfig,
        linear_quantize_weights,
        palettize_weights,
    )

    # weight_threshold=0 so the tiny test models are compressed too; real drafts pass any threshold
    if scheme == "palettize4":
        # "uniform" LUT: deterministic, so both functions' weights stay identical and are shared
        op = OpPalettizerConfig(mode="uniform", nbits=4, weight_threshold=0)
        compressor = palettize_weights
    else:
        granularity = "per_channel"  # int4 per output channel needs iOS 18; int8 the same scheme
        op = OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype=scheme, granularity=granularity, weight_threshold=0
        )
        compressor = linear_quantize_weights
    # the RoPE tables stay fp16: sin at position 0 is a zero row (scale 0 -> NaN), and they
    # are small
    keep = {name: None for name in _rope_const_names(mlmodel)}
    return compressor(mlmodel, OptimizationConfig(global_config=op, op_name_configs=keep))


def _rope_const_names(mlmodel) -> list[str]:
    prog = mlmodel._mil_program
    return [
        op.name
        for fn in prog.functions.values()
        for op in fn.operations
        if op.op_type == "const" and ("cos_table" in op.name or "sin_table" in op.name)
    ]


def export_coreml(
    model_dir: str | Path,
    out: str | Path,
    *,
    max_context: int | None = None,
    prefill_len: int = DEFAULT_PREFILL,
    flavour: str = "stateful",
    compression: str = "none",
    parity: bool = True,
) -> dict:
    """Convert the checkpoint at `model_dir` to `out` (.mlpackage). Returns the report that
    is also stored in the package's metadata (`duet.report`): sizes, times, parity."""
    if flavour not in FLAVOURS:
        raise DuetError(f"unknown Core ML flavour {flavour!r}; choose from {', '.join(FLAVOURS)}")
    if compression not in COMPRESSIONS:
        raise DuetError(
            f"unknown Core ML compression {compression!r}; choose from {', '.join(COMPRESSIONS)}"
        )
    out = Path(out)
    if out.suffix != ".mlpackage":
        raise DuetError(f"{out}: a Core ML output path must end in .mlpackage")
    ct = _quiet_ct()
    t0 = time.perf_counter()
    decoder = load_decoder(model_dir, max_context)
    prefill_len = max(1, min(prefill_len, decoder.context))
    report: dict = {
        "format": "coreml",
        "flavour": flavour,
        "compression": compression,
        "context": decoder.context,
        "prefill_len": prefill_len,
        "model_type": decoder.cfg.model_type,
        "config": decoder.cfg.raw,  # so the package is self-describing, like the ONNX export
    }
    if parity:
        from converters.coreml_parity import torch_parity

        report["parity"] = torch_parity(model_dir, decoder, flavour)
    with tempfile.TemporaryDirectory() as tmp:
        parts = {}
        for name, length in (("prefill", prefill_len), ("decode", 1)):
            ml = compress(convert_function(decoder, length, flavour), compression)
            parts[name] = Path(tmp) / f"{name}.mlpackage"
            ml.save(str(parts[name]))
        desc = ct.utils.MultiFunctionDescriptor()
        for name, path in parts.items():
            desc.add_function(str(path), src_function_name="main", target_function_name=name)
        desc.default_function_name = "decode"
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        ct.utils.save_multifunction(desc, str(out))
    report["convert_s"] = round(time.perf_counter() - t0, 2)
    report["size_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    write_metadata(out, report)
    return report


def write_metadata(package: Path, report: dict) -> None:
    """Keep the conversion report inside the package (user-defined metadata)."""
    ct = _quiet_ct()
    ml = ct.models.MLModel(str(package), skip_model_load=True)
    ml.user_defined_metadata["duet.report"] = json.dumps(report, sort_keys=True)
    ml.short_description = f"Duet draft ({report['model_type']}, {report['flavour']} KV cache)"
    # MLModel.save cannot overwrite its own source: stage beside it, then swap
    staged = package.with_name(package.name + ".staged.mlpackage")
    ml.save(str(staged))
    del ml
    shutil.rmtree(package)
    staged.rename(package)
