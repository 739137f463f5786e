"""Emulated stages last what the profile predicts (never less than measured), from real threads too.

Durations are checked on a virtual clock, so no assertion depends on how busy the machine is
or how late the OS wakes a sleeper; the threaded test checks ordering, not magnitudes.
"""

import threading

import pytest

from devices.emulation import Emulator
from devices.latency import window_time
from devices.model_sizes import model_size
from devices.profile import load_profile
from runtime.config import ModelConfig
from runtime.errors import DuetError

SPEC = "m3-max:qwen3-8b@4+qwen3-0.6b"  # target ~9.5 ms, draft ~3 ms per token on M3 Max


class VirtualClock:
    """perf_counter/sleep stand-ins: time moves only when the code sleeps or `advance`s it."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def advance(self, s: float) -> None:
        self.now += s


def _virtual(emu):
    clock = VirtualClock()
    emu.clock, emu.sleep = clock, clock.sleep
    return clock


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
    clock = _virtual(emu)
    with emu.stage("target", n_tokens=8) as rec:
        clock.advance(0.001)  # the real work is faster than the device
    assert rec.predicted_s == pytest.approx(emu.predict("target", 8))
    assert rec.measured_s == pytest.approx(0.001)
    assert rec.emulated_s == pytest.approx(rec.predicted_s)


def test_stage_never_shorter_than_measured():
    emu = Emulator.from_spec(SPEC, _cfg(), _cfg(2))
    clock = _virtual(emu)
    with emu.stage("draft", n_tokens=1) as rec:
        clock.advance(rec.predicted_s + 0.01)  # the real work is slower than the device
    assert rec.measured_s == pytest.approx(rec.predicted_s + 0.01)
    assert rec.emulated_s == rec.measured_s  # no padding


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
    """A stage on one thread never blocks another role's stage: the draft thread's stage runs
    while the target's is open (an Event orders them, so no timing is assumed)."""
    emu = Emulator.from_spec(SPEC, _cfg(), _cfg(2))
    inside = threading.Event()

    def draft():
        for i in range(3):
            with emu.stage("draft", 1):
                if i == 0:
                    inside.set()

    th = threading.Thread(target=draft)
    with emu.stage("target", 8) as target:
        th.start()
        assert inside.wait(10), "the draft's stage could not start while the target's was open"
    th.join(10)
    assert not th.is_alive()
    s = emu.summary()
    assert s["emulated"] is True and s["label"] == emu.label
    assert s["stages"]["draft"]["count"] == 3 and s["stages"]["target"]["count"] == 1
    first = min((r for r in emu.records if r.role == "draft"), key=lambda r: r.started)
    assert target.started <= first.started < target.started + target.emulated_s  # overlapped
    for r in emu.records:  # real threads, real sleeps: each stage still lasts its prediction
        assert r.emulated_s >= r.predicted_s


def test_exception_propagates_without_padding():
    emu = Emulator.from_spec(SPEC)
    clock = _virtual(emu)
    t0 = clock()
    with pytest.raises(RuntimeError), emu.stage("target", 64):
        raise RuntimeError("boom")
    assert clock() == t0  # no padding sleep after a failed stage
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


def test_emulated_target_finds_its_tuned_exit_head_and_the_draft_stays_in_process(
    tiny_dir, tmp_path
):
    """The wrapped target keeps its checkpoint's load_spec (mirror's stored exit head is found
    through it); the wrapped draft has none, so it cannot be sent un-emulated to a process."""
    import shutil

    import numpy as np
    from safetensors.numpy import save_file

    from devices.emulated_model import emulate_pair
    from runtime.backends import load_model
    from runtime.mirror.exit_head import exit_head_path, resolve_exit_head

    tdir = tmp_path / "target"
    shutil.copytree(tiny_dir("qwen3"), tdir)
    target, draft = load_model(tdir, "torch"), load_model(tiny_dir("qwen3", seed=3), "onnx")
    h = target.config.hidden_size
    path = exit_head_path(tdir, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"weight": np.eye(h, dtype=np.float32), "bias": np.zeros(h, np.float32)}, str(path))
    _, et, ed = emulate_pair("m3-max", target, draft)
    assert resolve_exit_head(et, 1, None) is not None
    assert not hasattr(ed, "load_spec")


def test_real_vocab_pads_the_logits_and_keeps_greedy_output(tiny_dir):
    """With ",real-vocab" the emulated models' logits are as wide as the emulated target's
    vocabulary (151,936), the padded tokens at -inf (never drawn), ids past the real vocabulary
    (a probe's random windows) folded into it; greedy sd and mirror still equal ar, and a
    sampled mirror run emits only real tokens."""
    import numpy as np

    from devices.emulated_model import emulate_pair
    from runtime.backends import load_model
    from runtime.decoding import Sampling, make_steps, run
    from runtime.mirror.draft_process import close_draft_hosts

    target, draft = (
        load_model(tiny_dir("qwen3"), "torch"),
        load_model(tiny_dir("qwen3", seed=3), "onnx"),
    )
    real = target.config.vocab_size
    with pytest.raises(DuetError, match="unknown option"):
        Emulator.from_spec("m3-max:qwen3-8b+qwen3-0.6b,wide")
    emu, t, d = emulate_pair("m3-max:qwen3-8b+qwen3-0.6b,real-vocab", target, draft)
    _virtual(emu)
    assert (
        emu.label.endswith(",real-vocab") and t.config.vocab_size == d.config.vocab_size == 151936
    )
    logits = t.forward(np.array([[1, 2, real + 5]]), t.new_cache())
    assert logits.shape == (1, 3, 151936) and np.isneginf(logits[..., real:]).all()
    assert np.isfinite(logits[..., :real]).all()
    ids = [5, 9, 2, 7]
    greedy = dict(max_new=8, sampling=Sampling(), seed=0)
    small = {"draft_process": False, "branches": 4}  # mirror: 4-row waves keep the test short
    want = run(make_steps("ar", target, None, ids, **greedy), max_new=8).tokens
    for method in ("sd", "mirror"):
        kw = small if method == "mirror" else {}
        got = run(make_steps(method, t, d, ids, gamma=3, **greedy, **kw), max_new=8).tokens
        assert got == want, method
    out = run(
        make_steps(
            "mirror", t, d, ids, max_new=8, gamma=3, sampling=Sampling(1.0), seed=1, **small
        ),
        max_new=8,
    ).tokens
    assert len(out) == 8 and max(out) < real
    # at this width the waves keep logits and draw by Gumbel-max (Sampling.lazy): through the
    # draft process's shared board too, the same tokens as the thread worker's
    proc = dict(small, draft_process=True)
    got = run(
        make_steps("mirror", t, d, ids, max_new=8, gamma=3, sampling=Sampling(1.0), seed=1, **proc),
        max_new=8,
    ).tokens
    assert got == out
    close_draft_hosts(d)
