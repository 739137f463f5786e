"""Target checkpoint -> quantized MLX directory (4 or 8 bits) with mlx-lm's own converter.

The output is an ordinary mlx-community style directory (config.json with a
`quantization` entry, safetensors, tokenizer), so `mlx_lm.load` and our MLX
backend both load it. Parity against the full-precision model is measured by
`mlx_parity.py` and kept beside the weights in `duet_parity.json`.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

from runtime.config import ModelConfig
from runtime.errors import DuetError

BITS = (4, 8)
DEFAULT_GROUP = 64
PARITY_FILE = "duet_parity.json"


def quantize_mlx(
    model_dir: str | Path,
    out: str | Path,
    *,
    bits: int = 4,
    group_size: int = DEFAULT_GROUP,
    parity: bool = True,
) -> dict:
    """Quantize the checkpoint at `model_dir` into the directory `out`; returns the report
    (bits, sizes, time, parity) also written to `out/duet_parity.json`."""
    from mlx_lm import convert

    if bits not in BITS:
        raise DuetError(f"MLX quantization takes --bits 4 or 8, not {bits}")
    src, out = Path(model_dir), Path(out)
    cfg = ModelConfig.from_dir(src)  # names an unsupported architecture before any work
    if cfg.raw.get("quantization"):
        raise DuetError(
            f"{src}: already quantized ({cfg.raw['quantization']}); start from full precision"
        )
    if cfg.is_hybrid:
        _check_hybrid(src, cfg)
    if cfg.hidden_size % group_size:
        raise DuetError(f"group size {group_size} does not divide hidden_size {cfg.hidden_size}")
    if out.exists() and any(out.iterdir()):
        raise DuetError(
            f"{out}: output directory exists and is not empty; remove it or choose another"
        )
    if out.exists():
        out.rmdir()  # mlx_lm.convert insists on creating it
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints [INFO] lines
        convert(str(src), str(out), quantize=True, q_bits=bits, q_group_size=group_size)
    report = {
        "format": "mlx",
        "bits": bits,
        "group_size": group_size,
        "model_type": cfg.model_type,
        "source": str(src),
        "convert_s": round(time.perf_counter() - t0, 2),
        "size_bytes": _weights_size(out),
        "source_size_bytes": _weights_size(src),
    }
    if parity:
        from converters.mlx_parity import quantized_parity

        report["parity"] = quantized_parity(src, out)
    (out / PARITY_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def _weights_size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.safetensors"))


def _check_hybrid(src: Path, cfg: ModelConfig) -> None:
    """mlx_lm.convert builds a hybrid Qwen3.5 only from the multimodal `qwen3_5` layout (it
    has no `qwen3_5_text` module), with full attention every `full_attention_interval`-th
    layer: refuse in one line what it would build wrongly or not at all."""
    from runtime.backends.mlx.qwen3_5 import attention_interval

    if not cfg.raw.get("multimodal"):
        raise DuetError(
            f"{src}: mlx-lm's converter has no qwen3_5_text model; quantize a multimodal "
            "qwen3_5 checkpoint, or run this one unquantized with --target-backend mlx"
        )
    every = int(cfg.raw.get("full_attention_interval", 4))
    if attention_interval(cfg.layer_types) != every:
        raise DuetError(
            f"{src}: layer_types do not put full attention every {every}th layer "
            "(full_attention_interval), which is how mlx-lm's converter builds the model"
        )
