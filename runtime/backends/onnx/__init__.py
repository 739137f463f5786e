"""Open an ONNX export as its family's CausalLM: `OnnxHybridLM` for a hybrid Qwen3.5
(onnx_hybrid.py: a one-token graph with the linear states as I/O, and a prefill graph when one
was exported), `OnnxGemma3LM` for Gemma 3 (onnx_gemma3.py: the local layers' positions as
graph I/O), else `OnnxCausalLM` (onnx_backend.py). The dispatcher sits above the family files,
which build on onnx_backend.py, so that file never imports them back (no circle).
"""

from __future__ import annotations

from pathlib import Path

from runtime.backends.onnx.llama import OnnxCausalLM, onnx_config, open_session
from runtime.errors import DuetError


def load_onnx_lm(onnx_path, config_dir=None, **kw):
    """The CausalLM of the export at `onnx_path`. The config comes from `config_dir`, else the
    `duet.config` metadata our exporter embeds, else a config.json beside the file."""
    p = Path(onnx_path)
    if not p.is_file():
        raise DuetError(f"ONNX draft not found: {p}")
    config = onnx_config(p, config_dir)
    if config.is_hybrid:
        from runtime.backends.onnx.qwen3_5 import OnnxHybridLM, prefill_path

        prov, intra, inter = (kw.get("provider", "cpu"), kw.get("intra_threads", 1),
                              kw.get("inter_threads", 1))  # fmt: skip
        pre = prefill_path(p)
        pre = open_session(pre, prov, intra, inter) if pre.is_file() else None
        return OnnxHybridLM(open_session(p, prov, intra, inter), config, p, prov,
                            (intra, inter), pre)  # fmt: skip
    if config.model_type == "gemma3_text":
        from runtime.backends.onnx.gemma3_text import OnnxGemma3LM

        return OnnxGemma3LM(p, config, **kw)
    return OnnxCausalLM(p, config, **kw)
