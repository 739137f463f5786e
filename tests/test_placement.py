"""One backend choice per role (runtime/placement.py): the user's word, else the device
profile's role, else the caller's default, else the platform's; load_pair and the companion
client both ask it."""

import pytest

from devices.profile import load_profile
from runtime.errors import DuetError
from runtime.placement import choose_backend, draft_backends_for, profile_roles


@pytest.mark.parametrize("asked", [None, "auto"])
def test_the_default_is_todays(asked):
    assert choose_backend("target", asked, platform="darwin")[0] == "mlx"
    assert choose_backend("target", asked, platform="linux")[0] == "torch"
    assert choose_backend("draft", asked, platform="darwin")[0] == "coreml"
    assert choose_backend("draft", asked, platform="linux")[0] == "onnx"
    why = choose_backend("target", asked, platform="linux")[1]
    assert why.startswith("auto off macOS: PyTorch")


def test_a_named_backend_wins_over_the_profile_and_says_no_reason():
    roles = {"target": "mlx", "draft": "coreml"}
    assert choose_backend("target", "onnx", roles) == ("onnx", None)
    assert choose_backend("draft", "torch", roles, default="onnx") == ("torch", None)


def test_a_device_profile_places_each_role():
    m3 = profile_roles(load_profile("m3-max"))
    assert m3 == {"target": "mlx", "draft": "coreml"}
    assert choose_backend("target", "auto", m3, platform="linux")[0] == "mlx"  # not the platform
    assert choose_backend("draft", None, m3, default="onnx")[0] == "coreml"  # not the default
    v100 = profile_roles(load_profile("v100"))
    b, why = choose_backend("target", "auto", v100, platform="darwin")
    assert b == v100["target"] and "device profile" in why


def test_a_profile_role_the_command_cannot_run_is_one_line():
    pi = profile_roles(load_profile("raspberry-pi-5"))
    assert pi["target"] == "remote"
    with pytest.raises(DuetError, match="profile runs the target on 'remote'"):
        choose_backend("target", "auto", pi, choices=("mlx", "torch", "onnx"))
    with pytest.raises(DuetError, match="role 'verifier'"):
        choose_backend("verifier")


def test_a_drafts_own_default_comes_from_its_format(tmp_path):
    assert draft_backends_for(tmp_path) == ("onnx", "mlx", "torch")  # a checkpoint directory
    assert draft_backends_for(tmp_path / "d.onnx") == ("onnx",)
    assert draft_backends_for(tmp_path / "d.mlpackage") == ("coreml",)
    assert choose_backend("draft", None, None, default="onnx", platform="darwin") == ("onnx", None)


def test_load_pair_reads_the_profile_roles_and_keeps_its_default(tiny_dir):
    from runtime.loading import load_pair

    t, d = tiny_dir("llama"), tiny_dir("llama", num_layers=1, seed=4)
    pair = load_pair(str(t), str(d), need_draft=True, target_backend="torch")
    assert pair.settings["target_backend"] == "torch" and pair.draft.backend == "onnx"
    assert pair.settings["target_backend_why"] is None  # named by the user
    roles = {"target": "torch", "draft": "torch"}
    pair = load_pair(str(t), str(d), need_draft=True, profile_roles=roles)
    assert pair.settings["target_backend"] == "torch" and pair.draft.backend == "torch"
    assert pair.settings["target_backend_why"] == "the device profile's target backend"


def test_the_companion_client_asks_the_same_rule(monkeypatch, tmp_path):
    import runtime.backends.onnx.static_host as host
    from apps.companion import client

    monkeypatch.setattr(host.StaticOnnxLM, "load", staticmethod(lambda p, threads=1: ("onnx", p)))
    monkeypatch.setattr("runtime.placement.sys.platform", "linux")
    assert client.load_draft(tmp_path, "auto") == ("onnx", tmp_path / "draft.onnx")
    with pytest.raises(DuetError, match="profile runs the draft on 'mlx'"):
        client.load_draft(tmp_path, "auto", roles={"draft": "mlx"})
