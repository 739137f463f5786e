"""One backend choice per role (runtime/placement.py): the user's word, else the device
profile's role, else the caller's default, else the platform's; load_pair and the companion
client both ask it."""

import json

import pytest

from devices.profile import load_profile
from runtime.errors import DuetError
from runtime.placement import (
    choose_backend,
    draft_backends_for,
    profile_roles,
    resolve_quantize,
    target_candidates,
)


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


def described(tmp_path, file_type):
    """A folder described from a GGUF of `file_type` (runtime/gguf_import.py's note of it)."""
    (tmp_path / "duet-source.json").write_text(
        json.dumps({"gguf": "m.gguf", "file_type": file_type})
    )
    return tmp_path


def test_the_machines_candidates_follow_the_fidelity_rule(tmp_path):
    q4 = described(tmp_path, 2)  # a Q4_0 GGUF: its own blocks, on ONNX Runtime
    [(b, q, why)] = target_candidates(q4, "auto", platform="linux")
    assert (b, q) == ("onnx", "int4") and "Q4_0" in why and "own precision" in why
    assert resolve_quantize(q4, "auto") == "int4"
    (tmp_path / "f16").mkdir()
    f16 = described(tmp_path / "f16", 1)
    assert resolve_quantize(f16, "auto") == "none"  # a float GGUF stays float
    float_dir = tmp_path / "float"
    float_dir.mkdir()
    assert [c[:2] for c in target_candidates(float_dir, "auto", platform="linux")] == [
        ("torch", "none"),
        ("onnx", "none"),
    ]  # measured by the command's probe; a library call without one takes the first
    assert target_candidates(float_dir, "int8", platform="linux")[0][:2] == ("onnx", "int8")
    assert target_candidates(q4, "auto", platform="darwin")[0][0] == "mlx"
    assert target_candidates(float_dir, "auto", device="cuda")[0][:2] == ("torch", "none")


class Timed:
    """A stand-in target whose passes the probe's timer reads as `ms` milliseconds."""

    def __init__(self, ms):
        self.ms = ms


def test_the_probe_keeps_the_faster_backend_and_says_so_once(tmp_path, monkeypatch):
    from devices import target_placement as tp

    monkeypatch.setattr(tp, "pass_costs", lambda m: {1: m.ms / 1e3, 5: m.ms * 1.5 / 1e3})
    cands = [("torch", "none", "float (PyTorch)"), ("onnx", "none", "float (ONNX Runtime)")]
    loads = []

    def load(b, q):
        loads.append(b)
        return Timed({"torch": 9.0, "onnx": 3.0}[b])

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    b, q, why, announce, model = tp.choose_target(ckpt, cands, load)
    assert (b, q, announce) == ("onnx", "none", True) and model.ms == 3.0  # the last one, kept
    assert "torch 9.0/13.5 ms, onnx 3.0/4.5 ms" in why and loads == ["torch", "onnx"]
    b, q, why, announce, model = tp.choose_target(ckpt, cands, load)  # kept: nothing loads
    assert (b, announce, model, loads) == ("onnx", False, None, ["torch", "onnx"])
    b, *_, announce, model = tp.choose_target(ckpt, cands, load, refresh=True)
    assert b == "onnx" and announce and loads[2:] == ["torch", "onnx"]
    (ckpt / "config.json").write_text('{"changed": 1}')  # a changed checkpoint is a new file
    monkeypatch.setattr(tp, "pass_costs", lambda m: {1: 1 / m.ms, 5: 1 / m.ms})
    b, q, why, announce, model = tp.choose_target(ckpt, cands, load)
    assert b == "torch" and announce and model is None  # the first won: the caller loads it


def test_the_plain_command_runs_where_the_probe_put_it(tiny_dir, capsys, monkeypatch):
    """Greedy output of the plain command equals the chosen backend's own ar, and the line that
    says where the target runs comes once."""
    from runtime.generate import main

    monkeypatch.delenv("DUET_TARGET_BACKEND")  # the rule itself (tests/conftest.py pins it)
    t = str(tiny_dir("llama"))
    argv = ["--target", t, "--prompt-ids", "1,2,3,4", "--max-tokens", "12", "--json"]
    main([*argv, "--method", "ar", "--reprobe"])
    out, err = capsys.readouterr()
    plain = json.loads(out)
    backend = plain["stats"]["target_backend"]
    assert backend in ("torch", "onnx") and err.count("[target on ") == 1
    main([*argv, "--method", "ar"])
    out, err = capsys.readouterr()
    assert "[target on " not in err and json.loads(out)["stats"]["target_backend"] == backend
    main([*argv, "--method", "ar", "--target-backend", backend])
    assert json.loads(capsys.readouterr()[0])["tokens"] == plain["tokens"]


def test_the_environment_names_the_backend_where_no_flag_does(monkeypatch, tmp_path):
    from runtime.placement import named_target

    monkeypatch.setenv("DUET_TARGET_BACKEND", "onnx")
    assert named_target(None) == "onnx" and named_target("mlx") == "mlx"
    monkeypatch.setenv("DUET_TARGET_BACKEND", "auto")
    assert named_target("auto") is None
    monkeypatch.setenv("DUET_TARGET_BACKEND", "tpu")
    with pytest.raises(DuetError, match="choose from auto, mlx, torch, onnx"):
        named_target(None)


def test_a_float_checkpoint_goes_to_pytorch_where_onnx_would_not_pay(tiny_dir, tmp_path):
    t = tiny_dir("llama")
    assert target_candidates(t, platform="linux", adapter=True)[0][2].endswith(
        "a LoRA adapter is merged into it (--target-backend onnx exports the merge)"
    )
    [(b, q, why)] = target_candidates(tiny_dir("qwen3_5_text"), platform="linux")
    assert b == "torch" and "hybrid" in why
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "model.safetensors", "wb") as f:  # sparse: its size is all that is read
        f.truncate(3 * 2**30)
    [(b, q, why)] = target_candidates(big, platform="linux")
    assert b == "torch" and "3.0 GiB of float weights" in why


@pytest.mark.real
def test_the_plain_command_runs_a_gguf_at_its_own_precision(capsys, monkeypatch):
    """SmolLM2 (a Q4_1 GGUF): the plain command runs on ONNX Runtime from its own blocks, and
    its greedy tokens are that target's own `ar`, token for token."""
    from runtime.generate import main
    from runtime.registry import models_dir

    if not (models_dir() / "smollm2-135m-instruct" / "checkpoint").is_dir():
        pytest.skip("needs the real model: python -m apps.models pull smollm2-135m-instruct")
    monkeypatch.delenv("DUET_TARGET_BACKEND")
    base = ["--target", "smollm2-135m-instruct", "--prompt", "Name three colours.", "--json"]
    base += ["--max-tokens", "24"]
    main(base)
    plain = json.loads(capsys.readouterr()[0])
    s = plain["stats"]
    assert (s["target_backend"], s["target_quantize"]) == ("onnx", "int4")
    main([*base, "--target-backend", "onnx", "--quantize", "int4", "--method", "ar"])
    assert json.loads(capsys.readouterr()[0])["tokens"] == plain["tokens"]
