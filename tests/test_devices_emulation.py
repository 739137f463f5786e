"""Emulated stages last what the profile predicts (never less than measured), from real threads too."""

import threading
import time

import pytest

from devices.emulation import Emulator
from devices.latency import window_time
from devices.model_sizes import model_size
from devices.profile import load_profile
from runtime.config import ModelConfig
from runtime.errors import DuetError

SPEC = "m3-max:qwen3-8b@4+qwen3-0.6b"  # target ~9.5 ms, draft ~3 ms per token on M3 Max
TOL = 0.006  # seconds of sleep overshoot allowed on a loaded 2-core machine


def _cfg(layers=4):
    return ModelConfig.from_dict(
        {
            "model_type": "qwen3",
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
    )


def test_label_and_prediction_is_the_profiles_roofline():
    emu = Emulator.from_spec(SPEC, _cfg(), _cfg(2))
    assert emu.label == "emulated:m3-max:qwen3-8b@4+qwen3-0.6b"
    bw, peak = load_profile("m3-max").hardware("target")
    assert emu.predict("target", 8) == pytest.approx(
        window_time(model_size("qwen3-8b@4"), 8, bw, peak)
    )
    assert 0.005 < emu.predict("target", 8) < 0.02 and 0.001 < emu.predict("draft", 1) < 0.006


def test_stage_sleeps_to_the_prediction():
    emu = Emulator.from_spec(SPEC, _cfg(), _cfg(2))
    with emu.stage("target", n_tokens=8) as rec:
        pass
    assert rec.predicted_s == pytest.approx(emu.predict("target", 8))
    assert rec.predicted_s <= rec.emulated_s < rec.predicted_s + TOL
    assert rec.measured_s < rec.predicted_s


def test_stage_never_shorter_than_measured():
    emu = Emulator.from_spec(SPEC, _cfg(), _cfg(2))
    with emu.stage("draft", n_tokens=1) as rec:
        time.sleep(rec.predicted_s + 0.01)  # the real work is slower than the device
    assert rec.measured_s >= rec.predicted_s + 0.01
    assert rec.emulated_s == pytest.approx(rec.measured_s, abs=TOL)


def test_layer_ranges_map_to_the_same_share_of_the_emulated_model():
    emu = Emulator.from_spec(SPEC, _cfg(4), _cfg(2))
    prefix = emu.predict("target", 8, layers=(0, 1))  # early exit after 1 of 4 real layers
    suffix = emu.predict("target", 8, layers=(1, 4))
    body = emu.predict("target", 8, head=False)
    assert prefix + suffix == pytest.approx(body)
    assert suffix == pytest.approx(3 * prefix)
    with pytest.raises(ValueError):
        emu.predict("target", 8, layers=(2, 5))


def test_concurrent_stages_on_two_threads_and_summary():
    emu = Emulator.from_spec(SPEC, _cfg(), _cfg(2))

    def draft():
        for _ in range(3):
            with emu.stage("draft", 1):
                pass

    th = threading.Thread(target=draft)
    t0 = time.perf_counter()
    th.start()
    with emu.stage("target", 8):
        pass
    th.join()
    wall = time.perf_counter() - t0
    s = emu.summary()
    assert s["emulated"] is True and s["label"] == emu.label
    assert s["stages"]["draft"]["count"] == 3 and s["stages"]["target"]["count"] == 1
    # the two roles overlap: wall time is the longer lane, not the sum
    lanes = (s["stages"]["draft"]["emulated_s"], s["stages"]["target"]["emulated_s"])
    assert max(lanes) <= wall < sum(lanes) + TOL


def test_exception_propagates_without_padding():
    emu = Emulator.from_spec(SPEC)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError), emu.stage("target", 64):
        raise RuntimeError("boom")
    assert time.perf_counter() - t0 < emu.predict("target", 64)
    assert emu.records == []


def test_spec_defaults_and_errors():
    emu = Emulator.from_spec("m3-max")  # the profile's reference pair
    assert emu.models["target"].name == "qwen3-8b@4" and emu.models["draft"].name == "qwen3-0.6b"
    remote = Emulator.from_spec("a17-pro:llama-2-70b+qwen3-0.6b")  # target on the a800 cloud
    assert remote.hardware["target"] == load_profile("a800").hardware("target")
    for bad, msg in [
        ("nope", "unknown device profile"),
        ("m3-max:gpt-9", "unknown model size"),
        ("a17-pro", "not a preset"),
        ("", "PROFILE"),
    ]:
        with pytest.raises(DuetError, match=msg):
            Emulator.from_spec(bad)
