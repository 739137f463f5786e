"""Static-shape ONNX: every dimension fixed, parity vs the PyTorch reference over a prefill
and cached decode steps, QDQ quantization, metadata and genai_config.json."""

import json

import numpy as np
import onnx
import pytest

from converters.onnx_static_build import build_static_onnx
from converters.onnx_static_host import StaticOnnxLM
from converters.onnx_static_parity import TOLERANCES
from runtime.errors import DuetError


@pytest.fixture(scope="module")
def fp32_export(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("static") / "draft.onnx"
    return out, build_static_onnx(tiny_dir("qwen2"), out, context=32, prefill_len=8)


def test_all_shapes_static(fp32_export):
    out, report = fp32_export
    for path, t in ((out, 1), (out.with_name("draft.prefill.onnx"), 8)):
        g = onnx.load(str(path)).graph
        for v in list(g.input) + list(g.output):
            dims = [
                d.dim_value if d.HasField("dim_value") else d.dim_param
                for d in v.type.tensor_type.shape.dim
            ]
            assert all(isinstance(d, int) and d > 0 for d in dims), (v.name, dims)
        shapes = {
            v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(g.input) + list(g.output)
        }
        assert shapes["input_ids"] == [1, t] and shapes["attention_mask"] == [1, 32 + t]
        assert shapes["past_key_values.0.key"] == [1, 2, 32, 16] and shapes["present.3.value"] == [
            1,
            2,
            t,
            16,
        ]
        assert shapes["logits"] == [1, t, 320]


def test_fp32_parity_recorded(fp32_export):
    out, report = fp32_export
    par = report["parity"]
    assert (
        par["ok"] and par["max_abs"] <= TOLERANCES["none"]["max_abs"] and par["top1_agree"] == 1.0
    )
    meta = StaticOnnxLM.describe(out)
    assert meta["duet.parity"]["max_abs"] == par["max_abs"]
    assert meta["duet.static"] == {"context": 32, "query_len": 1}
    genai = json.loads((out.parent / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["filename"] == "draft.onnx"
    assert genai["duet"]["graphs"]["prefill"] == {"filename": "draft.prefill.onnx", "query_len": 8}
    assert genai["model"]["context_length"] == 32


def test_host_rollback_and_context_limit(fp32_export, tiny_dir):
    out, _ = fp32_export
    lm = StaticOnnxLM.load(out)
    ids = np.arange(3, 23)[None]
    cache = lm.new_cache()
    full = lm.forward(ids, cache)  # 8 + 8 prefill chunks, then 4 single steps
    cache.trim(5)
    again = lm.forward(ids[:, 15:], cache)
    np.testing.assert_allclose(again, full[:, 15:], atol=1e-4)
    with pytest.raises(DuetError, match="context"):
        lm.forward(np.zeros((1, 13), np.int64), cache)


@pytest.mark.parametrize("scheme", ["int8", "int16"])
def test_qdq_quantization(tiny_dir, tmp_path, scheme):
    out = tmp_path / "q.onnx"
    report = build_static_onnx(
        tiny_dir("qwen3"), out, context=32, prefill_len=8, quantization=scheme
    )
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    par = report["parity"]
    assert par["ok"] and par["top1_agree"] >= TOLERANCES[scheme]["min_top1"], par
    assert report["quantize"]["calibration_feeds"]["decode"] > 10
    assert StaticOnnxLM.describe(out)["duet.parity"]["quantization"] == scheme


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(DuetError, match="mamba"):
        build_static_onnx(tmp_path, tmp_path / "x.onnx")
