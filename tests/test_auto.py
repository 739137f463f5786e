"""`--method auto`: it picks what its prediction says, never a method the pair cannot run,
and whatever it picks the output is the target's own."""

import json
import tomllib

import pytest

from devices.method_choice import StageTimes, choose, expected_tokens, predict
from devices.pair_probe import from_profile, runnable_methods
from devices.profile import PROFILES_DIR, load_profile, parse_profile
from runtime.generate import main

ALL = ["ar", "sd", "mirror"]


def times(**kw) -> StageTimes:
    base = dict(target_token=0.010, target_window=0.012, draft_token=0.002, draft_batch=0.001,
                target_slowdown=1.0, t_rv=1e-4, acceptance=0.7, omega_kappa=0.6,
                exit_fraction=0.5, source="synthetic")  # fmt: skip
    return StageTimes(**(base | kw))


def argmax(preds: dict) -> str:
    return max(preds, key=lambda m: preds[m]["tokens_per_s"])


@pytest.mark.parametrize(
    "kw,expected",
    [
        ({}, "mirror"),  # a draft that fits under the suffix, no contention: overlap pays
        ({"target_slowdown": 1.6}, "sd"),  # this machine: the target slows beside the draft
        ({"acceptance": 0.05, "draft_token": 0.004}, "ar"),  # a draft that is rarely right
    ],
)
def test_auto_picks_what_its_prediction_says(kw, expected):
    t = times(**kw)
    rec = choose(t, 4, ALL)
    assert rec["choice"] == argmax(predict(t, 4)) == expected
    assert set(rec["predictions"]) == set(ALL) and expected in rec["why"]


def test_prediction_follows_eq10_and_sd_law():
    t = times(target_slowdown=1.5)
    p = predict(t, 4)
    tau = expected_tokens(0.7, 4)
    assert p["sd"]["step_ms"] == pytest.approx(1e3 * (0.012 + 4 * 0.002))
    s_win = 1.5 * 0.012
    reuse = 0.6 * min(1.0, (s_win / 2) / (4 * 0.001))
    mirror = s_win / 2 + 1e-4 + max(s_win / 2, 4 * 0.001) + (1 - reuse) * 4 * 0.002
    assert p["mirror"]["step_ms"] == pytest.approx(1e3 * mirror)
    assert p["sd"]["tokens_per_s"] == pytest.approx(tau / (0.012 + 4 * 0.002))


def test_never_picks_a_method_the_pair_cannot_run():
    t = times()
    assert argmax(predict(t, 4)) == "mirror"
    assert choose(t, 4, ["ar", "sd"])["choice"] == "sd"

    class Target:
        supports_layer_range = False

    class CoreMLDraft:
        backend = "coreml"

    class Ok:
        supports_layer_range = True
        backend = "onnx"

    assert runnable_methods(Target(), Ok()) == ["ar", "sd"]
    assert runnable_methods(Ok(), CoreMLDraft()) == ["ar", "sd"]
    assert runnable_methods(Ok(), None) == ["ar"]
    assert runnable_methods(Ok(), Ok()) == ALL


def test_calibrated_contention_figures_are_read_from_a_profile():
    data = tomllib.loads((PROFILES_DIR / "m3-max.toml").read_text())
    data["latency"]["target_slowdown"] = {"value": 1.4, "unit": "x", "source": "calibrated on x"}
    data["latency"]["draft_batch_step"] = {"value": 0.003, "unit": "s", "source": "calibrated on x"}
    st = from_profile(parse_profile(data, "test"), gamma=4, branches=8)
    assert st["target_slowdown"] == 1.4 and st["draft_batch"] == 0.003
    plain = from_profile(load_profile("m3-max"), gamma=4, branches=8)
    assert plain["target_slowdown"] == 1.0  # uncalibrated: no contention figure


def test_generate_auto_reports_its_choice_and_stays_lossless(tiny_dir, capsys):
    t, d = str(tiny_dir("llama")), str(tiny_dir("llama", num_layers=1, seed=4))
    common = ["--target", t, "--draft", d, "--prompt-ids", "3,14,15,92,65", "--max-tokens", "12",
              "--json"]  # fmt: skip
    assert main([*common, "--method", "ar"]) == 0
    ref = json.loads(capsys.readouterr().out)["tokens"]
    assert main([*common, "--method", "auto"]) == 0
    res = json.loads(capsys.readouterr().out)
    auto = res["stats"]["auto"]
    assert res["stats"]["method"] == auto["choice"] == argmax(auto["predictions"])
    assert set(auto["predictions"]) == set(ALL) and auto["why"]
    assert res["tokens"] == ref
