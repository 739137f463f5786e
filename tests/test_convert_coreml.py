"""Core ML export: the traced module's numerics here, the package's structure via get_spec(),
and prediction parity on macOS (skipped elsewhere: Core ML predicts only on a Mac)."""

import json
import sys

import numpy as np
import pytest

from converters.coreml_export import compress, convert_function, export_coreml
from converters.coreml_model import load_decoder, padded_context
from converters.coreml_parity import TOL_FP16, TOL_FP32, reference_logits, torch_parity
from runtime.backends.coreml.spec import check_structure, describe
from runtime.errors import DuetError

pytestmark = pytest.mark.filterwarnings("ignore")
MAC = sys.platform == "darwin"


def _weights(package) -> int:
    return (package / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size


@pytest.fixture(scope="module")
def stateful_pkg(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("coreml") / "draft.mlpackage"
    report = export_coreml(tiny_dir("qwen3", num_layers=1), out, max_context=40, prefill_len=8)
    return out, report


def test_ane_rewrite_matches_reference(tiny_dir, arch):
    """The module we trace, driven as the host drives it, matches transformers in fp32 and fp16."""
    d = tiny_dir(arch)
    flavour = "kvio" if arch == "qwen2" else "stateful"  # both cache policies, every architecture
    par = torch_parity(d, load_decoder(d, 64), flavour)
    assert par["fp32"]["max_rel_err"] <= TOL_FP32, par
    assert par["fp16"]["max_rel_err"] <= TOL_FP16, par
    assert par["fp32"]["top1_agree"] == 1.0


def test_tied_embeddings_load(tiny_dir):
    d = tiny_dir("llama", tie_word_embeddings=True)
    par = torch_parity(d, load_decoder(d, 32), "stateful")
    assert par["fp32"]["ok"]


def test_stateful_package_structure(stateful_pkg):
    out, report = stateful_pkg
    desc = describe(out)
    assert check_structure(desc) == []
    assert desc["spec_version"] >= 9  # iOS 18 / macOS 15
    assert desc["default_function"] == "decode"
    for name, length in (("prefill", 8), ("decode", 1)):
        f = desc["functions"][name]
        assert set(f["states"]) == {"k_cache", "v_cache"}
        # context 40 padded to 64 (a multiple of 32)
        assert f["states"]["k_cache"]["shape"] == [1, 2, 64, 16]
        assert f["states"]["k_cache"]["dtype"] == "float16"
        assert f["inputs"]["input_ids"]["shape"] == [1, length]
        assert f["inputs"]["attention_mask"]["shape"] == [1, 1, length, 64]
        assert f["outputs"]["logits"]["shape"] == [1, length, 320]
    stored = desc["report"]
    assert stored["parity"]["fp32"]["ok"] and stored["parity"]["fp16"]["ok"]
    assert (
        stored["config"]["model_type"] == "qwen3" and stored["size_bytes"] == report["size_bytes"]
    )


def test_weights_shared_between_functions(stateful_pkg):
    out, _ = stateful_pkg
    weights = out / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    # 77,824 parameters in fp16 are ~156 KB; two unshared copies would be ~311 KB
    assert weights.stat().st_size < 200_000


def test_kvio_fallback_structure_int8(tiny_dir, tmp_path, stateful_pkg):
    out = tmp_path / "kvio.mlpackage"
    export_coreml(
        tiny_dir("qwen3", num_layers=1),
        out,
        max_context=32,
        prefill_len=4,
        flavour="kvio",
        compression="int8",
        parity=False,
    )
    desc = describe(out)
    assert check_structure(desc) == []
    dec = desc["functions"]["decode"]
    assert dec["states"] == {}
    assert dec["inputs"]["k_cache"]["shape"] == [1, 2, 32, 16]
    assert set(dec["outputs"]) == {"logits", "k_new", "v_new"}
    assert desc["report"]["compression"] == "int8"
    assert _weights(out) < 0.6 * _weights(stateful_pkg[0])  # int8 vs fp16, shared across functions


def test_compression_schemes(tiny_dir, tmp_path):
    ml = convert_function(load_decoder(tiny_dir("qwen3", num_layers=1), 32), 1, "stateful")
    sizes = {}
    for scheme in ("none", "int8", "int4", "palettize4"):
        p = tmp_path / f"{scheme}.mlpackage"
        compress(ml, scheme).save(str(p))
        sizes[scheme] = _weights(p)
    assert sizes["int8"] < 0.6 * sizes["none"]
    assert sizes["int4"] < 0.6 * sizes["int8"] and sizes["palettize4"] < 0.6 * sizes["int8"]


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(DuetError, match="gpt2"):
        export_coreml(tmp_path, tmp_path / "x.mlpackage")


def test_bad_output_suffix(tiny_dir, tmp_path):
    with pytest.raises(DuetError, match="mlpackage"):
        export_coreml(tiny_dir("qwen3"), tmp_path / "x.onnx")


@pytest.mark.skipif(MAC, reason="checks the Linux guard")
def test_backend_refuses_off_macos(stateful_pkg):
    from runtime.backends import load_model

    with pytest.raises(DuetError, match="macOS"):
        load_model(stateful_pkg[0])


@pytest.mark.skipif(
    not MAC, reason="Core ML prediction needs macOS 15+; this machine cannot run it"
)
def test_prediction_parity_on_mac(stateful_pkg, tiny_dir):
    from runtime.backends import load_model

    model = load_model(stateful_pkg[0], compute_units="cpu")
    tokens = np.random.default_rng(1).integers(0, 320, size=14)
    ref = reference_logits(tiny_dir("qwen3"), tokens)
    cache = model.new_cache()
    got = [model.forward(tokens[None, :10], cache)[0]]  # a padded prefill (8 + 2), then decode
    for t in tokens[10:]:
        got.append(model.forward(np.array([[t]]), cache)[0])
    got = np.concatenate(got)
    assert np.abs(got - ref).max() / np.abs(ref).max() <= TOL_FP16
    cache.trim(3)  # rollback is moving the offset
    again = model.forward(tokens[None, 11:12], cache)[0]
    np.testing.assert_allclose(again, ref[11:12], atol=TOL_FP16 * np.abs(ref).max())


def test_padded_context():
    assert padded_context(40) == 64 and padded_context(64) == 64 and padded_context(1) == 32
