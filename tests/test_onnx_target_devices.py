"""The ONNX target in devices/: profiles say the target's quantization (and refuse an unknown
one in one line); `python -m devices calibrate --target-backend onnx` measures the int4 target
and writes a profile that says so; `--method auto` over an ONNX target chooses from measured
stage times, stays lossless, and keeps its measurements for the next process (the target is
identified like load_model's models)."""

import json
import tomllib

import pytest

from devices.probe_store import cache_dir, model_key
from devices.profile import (
    PROFILES_DIR,
    ProfileError,
    load_profile,
    parse_profile,
    read_profile_file,
)
from runtime.backends.onnx.target import OnnxTargetLM


def test_profiles_say_the_targets_backend_and_quantization():
    mac = load_profile("m3-max").target
    assert (mac.backend, mac.quantize) == ("mlx", "int4")
    assert load_profile("a800").target.quantize == "none"
    data = tomllib.loads((PROFILES_DIR / "m3-max.toml").read_text())
    data["target"] |= {
        "accelerator": "cpu",
        "backend": "onnx",
        "provider": "cpu",
        "quantize": "int8",
    }
    assert parse_profile(data, "test").target.quantize == "int8"
    data["target"]["quantize"] = "int3"
    with pytest.raises(ProfileError, match="target.quantize.*int3"):
        parse_profile(data, "test")


def test_calibrate_measures_the_int4_onnx_target(tmp_path, tiny_dir, capsys):
    from devices.__main__ import main

    out = tmp_path / "host.toml"
    args = ["calibrate", "--out", str(out), "--target", str(tiny_dir("qwen3")),
            "--draft", str(tiny_dir("qwen3", num_layers=1, seed=4)), "--target-backend", "onnx",
            "--draft-backend", "onnx", "--k-max", "3", "--repeats", "1",
            "--no-progress"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    prof = read_profile_file(out)
    assert (prof.target.backend, prof.target.quantize) == ("onnx", "int4")
    assert "onnx/cpu int4" in prof.description
    assert prof.param("t_base") > 0 and prof.latency["t_base"].source.startswith("calibrated on")


def test_auto_over_an_onnx_target_is_lossless_and_keeps_its_measurements(tiny_dir, capsys):
    from runtime.generate import main

    t, d = str(tiny_dir("llama")), str(tiny_dir("llama", num_layers=1, seed=4))
    common = ["--target", t, "--draft", d, "--target-backend", "onnx", "--quantize", "int4",
              "--prompt-ids", "3,14,15,92,65", "--max-tokens", "12", "--json"]  # fmt: skip
    assert main([*common, "--method", "ar"]) == 0
    ref = json.loads(capsys.readouterr().out)["tokens"]
    stored = set(cache_dir().glob("pair-*.json"))
    assert main([*common, "--method", "auto"]) == 0
    res = json.loads(capsys.readouterr().out)
    auto = res["stats"]["auto"]
    assert res["stats"]["method"] == auto["choice"] and auto["predictions"]
    assert res["tokens"] == ref
    key = model_key(OnnxTargetLM(t, "int4", intra_threads=1))
    assert key["backend"] == "onnx" and "int4" in key["options"]  # identified like the others
    assert set(cache_dir().glob("pair-*.json")) - stored  # auto's figures kept for next time
