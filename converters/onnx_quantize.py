"""QDQ quantization of a static-shape ONNX export (int8 or int16 activations) with
onnxruntime's `quantize_static`, calibrated on real token sequences.

The calibration feeds are what the fp32 export itself sees when it runs the
calibration texts (a padded prefill, then decode steps), recorded per graph,
so the decode graph is calibrated with realistic cache contents.

The recipe depends on the execution provider the artefact is for (`PROVIDERS`):
- `qnn`: full-range QUInt8 activations x QInt8 weights, the pairing QNN's HTP runs natively;
- `cpu` (default): the same with `reduce_range` (7-bit weights), so that ONNX Runtime's
  U8S8 kernel on x86-64 without VNNI (VPMADDUBSW, a saturating 16-bit pair sum) cannot
  clip: 255*63*2 < 32767. It holds on every x86-64 (AVX2 or AVX-512, VNNI or not) and arm64
  (runtime/backends/onnx/cpu_int8.py). Measured on the embedded draft (AMD EPYC, AVX2 only):
  full range fused top-1 0.941, max |Δlogit| 1.15; reduce-range 0.949, 0.66;
- `cuda`: full-range QInt8 x QInt8 (symmetric int8 tensor-core kernels).
int16 (A16W8) runs as dequantize + float on the CPU provider, so it is the same for all.
The recipe is recorded in the graphs' metadata (`duet.quantization`) and the companion
manifest; the loader (runtime/backends/onnx/static_host.py) reads it back.

What is quantized: MatMul and Gather (every linear layer, the attention
products and the embedding). The attention mask is left in float: the
reference fills masked scores with float32's minimum, and a quantizer that
calibrated that range would flatten every real score to one bucket.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from converters.calibration import calibration_tokens
from converters.onnx_static import graph_paths
from runtime.errors import DuetError

SCHEMES = ("int8", "int16")
PROVIDERS = ("cpu", "qnn", "cuda")
OP_TYPES = ["MatMul", "Gather"]
# int16, or int8's provider -> (activation type, reduce_range, why); weights are QInt8 in all
RECIPES = {
    "int16": ("QUInt16", False,  # A16W8: 16-bit activations, 8-bit weights
              "A16W8; no 8-bit integer kernel path, so no provider-specific range"),
    "qnn": ("QUInt8", False, "full-range U8S8, the pairing QNN's HTP runs"),
    "cuda": ("QInt8", False, "full-range S8S8 for int8 tensor-core kernels"),
    "cpu": ("QUInt8", True, "7-bit weights: ORT's U8S8 kernel on x86-64 without VNNI sums u8*s8 "
            "pairs in a saturating int16 (VPMADDUBSW); reduce-range cannot clip there"),
}  # fmt: skip


def recipe(scheme: str, provider: str = "cpu") -> dict:
    """The quantization recipe for `scheme` on `provider`: types, range and why."""
    if scheme not in SCHEMES:
        raise DuetError(f"unknown ONNX quantization {scheme!r}; choose from {', '.join(SCHEMES)}")
    if provider not in PROVIDERS:
        raise DuetError(
            f"unknown execution provider {provider!r} to quantize for; "
            f"choose from {', '.join(PROVIDERS)}"
        )
    key = "int16" if scheme == "int16" else provider  # int16 is the same on every provider
    activation, reduce_range, why = RECIPES[key]
    return {
        "scheme": scheme,
        "provider": provider,
        "activation": activation,
        "weight": "QInt8",
        "reduce_range": reduce_range,
        "why": why,
    }


class RecordedFeeds:
    """onnxruntime CalibrationDataReader over a list of recorded feeds."""

    def __init__(self, feeds: list[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def record_feeds(model_dir: str | Path, decode_path: Path) -> dict[str, list[dict]]:
    """Run the calibration texts through the fp32 export; return feeds per graph."""
    from runtime.backends.onnx.static_host import StaticOnnxLM

    lm = StaticOnnxLM.load(decode_path)
    lm.recorder = []
    for ids in calibration_tokens(model_dir):
        ids = ids[: lm.context - 4]
        if len(ids) < 2:
            continue
        cache = lm.new_cache()
        half = len(ids) // 2
        lm.forward([ids[:half]], cache)  # a prefill ...
        for t in ids[half:]:
            lm.forward([[t]], cache)  # ... then decode steps over real tokens
    feeds: dict[str, list[dict]] = {"decode": [], "prefill": []}
    for graph, feed in lm.recorder:
        feeds[graph].append(feed)
    return feeds


def quantize_static_export(
    model_dir: str | Path, decode_path: str | Path, scheme: str, provider: str = "cpu"
) -> dict:
    """Quantize both graphs of the static export at `decode_path` in place (QDQ) with the
    recipe for `provider`; records the recipe in both graphs' metadata."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from converters.onnx_static import set_metadata

    rec = recipe(scheme, provider)
    act, weight = QuantType[rec["activation"]], QuantType[rec["weight"]]
    paths = graph_paths(decode_path)
    feeds = record_feeds(model_dir, paths["decode"])
    counts = {}
    root = logging.getLogger()
    level = root.level
    root.setLevel(
        logging.ERROR
    )  # ORT's advice to pre-process and its opset-21 upgrade note for int16
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in paths.items():
            if not feeds[name]:
                raise DuetError(
                    f"no calibration data reached the {name} graph; is the context too short?"
                )
            staged = Path(tmp) / path.name
            quantize_static(
                str(path),
                str(staged),
                RecordedFeeds(feeds[name]),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=OP_TYPES,
                per_channel=True,
                activation_type=act,
                weight_type=weight,
                calibrate_method=CalibrationMethod.MinMax,
                reduce_range=rec["reduce_range"],
                extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
            )
            shutil.move(str(staged), str(path))
            set_metadata(path, {"duet.quantization": rec})
            counts[name] = len(feeds[name])
    root.setLevel(level)
    return {**rec, "calibration_feeds": counts}
