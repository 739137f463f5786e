"""A GGUF straight into the ONNX target (converters/gguf_target.py), and the random-weight GGUFs
of real shapes it is measured on (apps/models/synth.py). The donor tokenizer is tests/tiny_gguf's
byte tokenizer, so nothing here needs a pulled model."""

import json
import tracemalloc

import numpy as np
import pytest
from tiny_gguf import write_llama_gguf

from apps.models.shapes import Shape
from apps.models.synth import synth, tensor_type, use_more_bits

# small enough for a test, wide enough for K-quants' rows of 256
SMALL = Shape("test-small", "llama", 2, 256, 512, 4, 2, 64, 320, 1e4, 512, True)


@pytest.fixture(scope="module")
def donor(tiny_dir, tmp_path_factory):
    ck = tiny_dir("llama", vocab_size=320)
    return write_llama_gguf(ck, tmp_path_factory.mktemp("donor") / "donor.gguf")


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DUET_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path / "models"


def small_gguf(tmp_path, donor, mix="Q4_0", shape=SMALL):
    out = tmp_path / f"{shape.name}-{mix}.gguf"
    synth(shape, out, mix, 0, donor)
    return out


def test_synth_writes_the_shape_and_says_its_weights_are_random(tmp_path, donor):
    from gguf import GGUFReader

    r = GGUFReader(str(small_gguf(tmp_path, donor)))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.t")}
    assert f["duet.random"] is True and "RANDOM" in f["general.description"]
    assert f["llama.block_count"] == 2 and f["llama.embedding_length"] == 256
    shapes = {t.name: (t.tensor_type.name, list(t.shape)) for t in r.tensors}
    assert shapes["blk.1.ffn_down.weight"] == ("Q4_0", [512, 256])  # GGUF lists (in, out)
    assert shapes["token_embd.weight"] == ("Q8_0", [256, 320])
    assert "output.weight" not in shapes  # tied, as the shape says
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    assert tokens == GGUFReader(str(donor)).fields["tokenizer.ggml.tokens"].contents()


def test_k_quant_mixes_follow_llama_cpps_rules():
    n = 16
    assert [i for i in range(n) if use_more_bits(i, n)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert tensor_type("Q4_K_M", "attn_v", 0, n, 2048) == "Q6_K"
    assert tensor_type("Q4_K_M", "attn_v", 2, n, 2048) == "Q4_K"
    assert tensor_type("Q4_K_M", "attn_q", 0, n, 2048) == "Q4_K"
    assert tensor_type("Q4_K_M", "attn_q", 0, n, 576) == "Q5_0"  # rows of 576: no K-quant
    assert tensor_type("Q6_K", "ffn_up", 3, n, 576) == "Q8_0"
    assert tensor_type("Q4_0", "embed", 0, n, 2048) == "Q8_0"


def _logits(d, quantize="int4"):
    from runtime.backends.onnx.target import OnnxTargetLM

    lm = OnnxTargetLM(d, quantize)
    out = lm.forward(np.array([[5, 70, 80, 90, 100, 33, 7, 300]]), lm.new_cache())
    return np.asarray(out[0] if isinstance(out, tuple) else out)


@pytest.mark.parametrize("mix", ["Q4_0", "Q4_K_M"])
def test_the_onnx_target_from_a_gguf_matches_its_dequantized_checkpoint(
    tmp_path, donor, models_dir, mix
):
    """Q4_K_M's weights go through the very quantizer the float checkpoint's export runs:
    equal logits. Q4_0's become MatMulNBits over their own blocks (no correction nodes):
    the same weights exactly, only the int8 activations' sums are ordered differently."""
    import converters  # noqa: F401  (registers the exporter)
    from runtime.gguf_import import checkpoint_for_gguf, convert_gguf

    g = small_gguf(tmp_path, donor, mix)
    direct = checkpoint_for_gguf(g)
    full = convert_gguf(g, tmp_path / "float")
    a, b = _logits(direct), _logits(full)
    assert not any(direct.glob("*.safetensors"))  # the ONNX target never asked for floats
    if mix == "Q4_K_M":
        np.testing.assert_array_equal(a, b)
    else:
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= 0.01 * scale, (np.abs(a - b).max(), scale)
        assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.75
    # and the float32 reference (PyTorch on the dequantized checkpoint) is near both
    from runtime.backends import load_model

    t = load_model(full, "torch")
    ref = np.asarray(t.forward(np.array([[5, 70, 80, 90, 100, 33, 7, 300]]), t.new_cache()))
    assert np.abs(a - ref).max() <= 0.05 * np.abs(ref).max()


def test_the_streamed_export_holds_about_one_tensor(tmp_path, donor, models_dir):
    """Python-side allocations while the whole target is built from a GGUF do not grow with
    the model: three times the layers, the same peak (one tensor's worth, below the file's
    size); each initializer goes to the external-data file as it is made."""
    import converters  # noqa: F401
    from converters.onnx_target_export import export_target_part
    from runtime.gguf_import import checkpoint_for_gguf

    peaks, sizes = [], []
    for layers in (2, 6):
        s = Shape(f"test-mem{layers}", "llama", layers, 512, 2048, 8, 4, 64, 320, 1e4, 512, True)
        g = small_gguf(tmp_path, donor, "Q4_0", s)
        d = checkpoint_for_gguf(g)
        tracemalloc.start()
        r = export_target_part(d, tmp_path / f"part{layers}.onnx", 0, layers, True, "int4")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        sizes.append(g.stat().st_size)
        assert r["bytes"] <= 1.5 * sizes[-1], (r["bytes"], sizes[-1])
    assert peaks[1] <= 1.25 * peaks[0] and peaks[1] < sizes[1], (peaks, sizes)


def test_generate_on_a_gguf_with_the_onnx_target_is_lossless(tmp_path, donor, models_dir, capsys):
    """ar on the GGUF's ONNX target, then sd with the same GGUF as a PyTorch draft (whose
    float weights are made only then): the same tokens."""
    from runtime.generate import main

    g = small_gguf(tmp_path, donor)
    common = ["--target", str(g), "--target-backend", "onnx", "--prompt-ids", "5,70,80,90"]
    outs = []
    for extra in (["--method", "ar"], ["--method", "sd", "--draft", str(g), "--gamma", "3"]):
        assert main([*common, *extra, "--max-tokens", "12", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out)["tokens"])
        made = list((models_dir / "gguf").glob("*/*.safetensors"))
        assert bool(made) == (extra[1] == "sd")  # floats only once a draft asked for them
    assert outs[0] == outs[1] and len(outs[0]) == 12


@pytest.mark.real
def test_the_scale_bench_measures_a_shape_from_its_synth_gguf(tmp_path, monkeypatch, capsys):
    """`apps.bench scale` on the smallest shape (SmolLM2-135M's tokenizer, from the registry):
    the file written, both loads run in their own processes, each figure labelled random. The
    cache holds no float copy: at most the file and one more 8-bit copy of the tied embedding
    (the head's), which at this vocabulary-heavy shape is most of the file."""
    from apps.bench.scale import main
    from runtime.registry import KNOWN, model_home, pull_command

    if not (
        model_home("smollm2-135m-instruct") / KNOWN["smollm2-135m-instruct"].gguf_name
    ).is_file():
        pytest.skip(f"the donor tokenizer is not pulled: `{pull_command('smollm2-135m-instruct')}`")
    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["--shapes", "test-tiny", "--no-peers", "--no-pass-cost", "--max-tokens", "8"]
    assert main([*argv, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    d = row["duet"]
    assert row["random_weights"] and row["file_bytes"] > 10e6
    head8 = 49152 * 576 * 1.25  # the tied head's two 4-bit halves and their scales
    assert d["tokens_per_s"] > 0 and d["disk_bytes"] < 1.2 * (row["file_bytes"] + head8)
    assert d["first_peak_bytes"] > 0 and d["cached_s"] > 0


def test_a_gguf_too_large_for_float_weights_is_refused_naming_the_onnx_target(
    tmp_path, donor, models_dir, monkeypatch, capsys
):
    """PyTorch needs the GGUF's weights in float32; where they would not fit, one line says
    which backend runs the file as it is (the ONNX target still does)."""
    import runtime.gguf_import as gi
    from runtime.generate import main

    g = small_gguf(tmp_path, donor)
    monkeypatch.setattr(gi, "physical_memory", lambda: 1_000_000)  # a 1 MB machine
    capsys.readouterr()  # the synth's progress
    common = ["--target", str(g), "--prompt-ids", "5,70", "--max-tokens", "2", "--json"]
    assert main([*common, "--target-backend", "torch"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target-backend onnx" in err[0]
    assert main([*common, "--target-backend", "onnx", "--method", "ar"]) == 0
