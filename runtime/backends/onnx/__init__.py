"""The ONNX Runtime backend (the draft's home off Apple, and the target's on CPUs), a file per
model family named after its `model_type`, over the graphs `converters` exports.

llama        OnnxCausalLM: Llama, Qwen2, Qwen3, KV cache as graph I/O (and the sessions and
             providers every ONNX model opens)
gemma3_text  OnnxGemma3LM: the local layers' positions as graph I/O, a sliding cache
qwen3_5      OnnxHybridLM: a one-token graph with the linear states as I/O (and a prefill graph)
target       OnnxTargetLM: the target as int4/int8 graph parts (with residual, target_rows,
             gqa_buckets, cpu_int8: its hidden state, row attention, GQA's summation buckets
             and the CPU's int8 path)
static_host  StaticOnnxLM: a fixed-shape export for NPUs

`FAMILIES` (runtime/backends/families.py's, the same file names in every backend) maps a model
type to its file, each of which exports `load(path, config, **kw)`; `load_onnx_lm` calls it. The
family files build on llama.py, which never imports them back (no circle).
"""

from __future__ import annotations

from pathlib import Path

from runtime.backends.families import FAMILIES  # model_type -> the file of this folder
from runtime.errors import DuetError


def onnx_family(config) -> str:
    """The family file (a FAMILIES value) that runs `config` on this backend."""
    from runtime.backends.families import family

    return family(FAMILIES, config, "onnx")


def load_onnx_lm(onnx_path, config_dir=None, **kw):
    """The CausalLM of the export at `onnx_path`. The config comes from `config_dir`, else the
    `duet.config` metadata our exporter embeds, else a config.json beside the file."""
    from runtime.backends.families import family_module
    from runtime.backends.onnx.llama import onnx_config

    p = Path(onnx_path)
    if not p.is_file():
        raise DuetError(f"ONNX draft not found: {p}")
    config = onnx_config(p, config_dir)
    return family_module(__name__, FAMILIES, config).load(p, config, **kw)
