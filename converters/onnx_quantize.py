"""QDQ quantization of a static-shape ONNX export (int8 or int16 activations) with
onnxruntime's `quantize_static`, calibrated on real token sequences.

The calibration feeds are what the fp32 export itself sees when it runs the
calibration texts (a padded prefill, then decode steps), recorded per graph,
so the decode graph is calibrated with realistic cache contents.

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
OP_TYPES = ["MatMul", "Gather"]


class RecordedFeeds:
    """onnxruntime CalibrationDataReader over a list of recorded feeds."""

    def __init__(self, feeds: list[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def record_feeds(model_dir: str | Path, decode_path: Path) -> dict[str, list[dict]]:
    """Run the calibration texts through the fp32 export; return feeds per graph."""
    from converters.onnx_static_host import StaticOnnxLM

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


def quantize_static_export(model_dir: str | Path, decode_path: str | Path, scheme: str) -> dict:
    """Quantize both graphs of the static export at `decode_path` in place (QDQ)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if scheme not in SCHEMES:
        raise DuetError(f"unknown ONNX quantization {scheme!r}; choose from {', '.join(SCHEMES)}")
    act, weight = {
        "int8": (QuantType.QUInt8, QuantType.QInt8),  # the pairing QNN's HTP runs
        "int16": (QuantType.QUInt16, QuantType.QInt8),  # A16W8: 16-bit activations, 8-bit weights
    }[scheme]
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
                extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
            )
            shutil.move(str(staged), str(path))
            counts[name] = len(feeds[name])
    root.setLevel(level)
    return {
        "scheme": scheme,
        "activation": act.name,
        "weight": weight.name,
        "calibration_feeds": counts,
    }
