"""Static-shape ONNX: every dimension fixed, parity vs the PyTorch reference over a prefill
and cached decode steps, QDQ quantization, metadata and genai_config.json."""

import json

import numpy as np
import onnx
import pytest

from converters.onnx_quantize import recipe
from converters.onnx_static import graph_paths
from converters.onnx_static_build import build_static_onnx
from converters.onnx_static_parity import TOLERANCES
from runtime.backends.onnx.cpu_int8 import int8_path
from runtime.backends.onnx.static_host import StaticOnnxLM, _session
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


@pytest.fixture(scope="module")
def quantized(tiny_dir, tmp_path_factory):
    """Factory: (scheme, provider) -> (path, report) of a QDQ export of the tiny qwen3."""
    made = {}

    def get(scheme: str, provider: str):
        if (scheme, provider) not in made:
            out = tmp_path_factory.mktemp(f"{scheme}-{provider}") / "q.onnx"
            made[scheme, provider] = out, build_static_onnx(
                tiny_dir("qwen3"), out, context=32, prefill_len=8, quantization=scheme,
                provider=provider,
            )  # fmt: skip
        return made[scheme, provider]

    return get


# Each case holds on every x86-64 (AVX2 or AVX-512, with or without VNNI) and on arm64: the
# cpu recipe cannot clip in ORT's U8S8 kernel, and a qnn (full-range) artefact runs unfused on a
# CPU whose kernel would clip. The floors catch a broken quantization (top-1 near 1/V = 0.003).
@pytest.mark.parametrize("scheme,provider", [("int8", "cpu"), ("int8", "qnn"), ("int16", "cpu")])
def test_qdq_quantization(quantized, scheme, provider):
    out, report = quantized(scheme, provider)
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    par = report["parity"]
    assert par["ok"] and par["top1_agree"] >= TOLERANCES[scheme]["min_top1"], par
    assert report["quantize"]["calibration_feeds"]["decode"] > 10
    meta = StaticOnnxLM.describe(out)
    assert meta["duet.parity"]["quantization"] == scheme
    assert meta["duet.quantization"] == recipe(scheme, provider)
    assert par["measured_on"] == "CPUExecutionProvider"  # no QNN here: the CPU stands in
    assert par["cpu_int8_path"] == int8_path().name
    assert ("stand_in" in par) == (provider != "cpu")


def test_cpu_recipe_fused_kernels_equal_qdq_semantics(quantized):
    """The cpu recipe's fused int8 kernels compute what its QDQ graph means (dequantize +
    float ops), on whatever CPU runs the test: nothing clips."""
    out, _ = quantized("int8", "cpu")
    assert recipe("int8", "cpu")["reduce_range"]
    fused = StaticOnnxLM.load(out)
    assert "fused int8 kernels" in fused.qdq_path
    exact = StaticOnnxLM.load(out)
    exact.sessions = {
        k: _session(p, "CPUExecutionProvider", 1, unfuse_qdq=True)
        for k, p in graph_paths(out).items()
    }
    ids = np.random.default_rng(1).integers(0, fused.config.vocab_size, (1, 20))
    np.testing.assert_allclose(
        fused.forward(ids, fused.new_cache()), exact.forward(ids, exact.new_cache()), atol=0.05
    )


def test_full_range_artefact_runs_unfused_where_the_kernel_clips(quantized, monkeypatch):
    from runtime.backends.onnx import cpu_int8

    out, _ = quantized("int8", "qnn")
    for flags, unfused in ((set(), True), ({"avx512_vnni"}, False)):
        path = cpu_int8.int8_path_from_flags("x86_64", flags)
        monkeypatch.setattr(cpu_int8, "int8_path", lambda p=path: p)
        lm = StaticOnnxLM.load(out)
        assert ("unfused" in lm.qdq_path) == unfused, lm.qdq_path
        assert path.name in lm.qdq_path
    cpu_out, _ = quantized("int8", "cpu")  # reduce-range never needs it
    monkeypatch.setattr(
        cpu_int8, "int8_path", lambda: cpu_int8.int8_path_from_flags("x86_64", set())
    )
    assert "fused int8 kernels" in StaticOnnxLM.load(cpu_out).qdq_path


def test_int8_path_classification():
    from runtime.backends.onnx.cpu_int8 import int8_path_from_flags

    assert int8_path_from_flags("x86_64", {"avx2", "fma"}).saturates_u8s8
    assert int8_path_from_flags("x86_64", {"avx2", "fma"}).name == "x86-64 avx2 (no VNNI)"
    assert not int8_path_from_flags("x86_64", {"avx2", "avx_vnni"}).saturates_u8s8
    assert not int8_path_from_flags("x86_64", {"avx512f", "avx512_vnni"}).saturates_u8s8
    assert not int8_path_from_flags("aarch64", set()).saturates_u8s8
    with pytest.raises(DuetError, match="provider"):
        recipe("int8", "npu")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(DuetError, match="mamba"):
        build_static_onnx(tmp_path, tmp_path / "x.onnx")
