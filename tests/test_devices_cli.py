"""python -m devices: list --json shape, latency output, calibrate on a tiny model, one-line
errors."""

import json
import subprocess
import sys

import pytest

from devices.__main__ import main
from devices.profile import read_profile_file


def test_list_json(capsys):
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) >= 13
    for r in rows:
        assert isinstance(r["name"], str) and r["name"]
        assert isinstance(r["sources"], dict) and r["sources"]
        assert all(isinstance(v, str) and v for v in r["sources"].values())


def test_show(capsys):
    assert main(["show", "a800"]) == 0
    assert 'name = "a800"' in capsys.readouterr().out
    assert main(["show", "a800", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "cloud"


@pytest.mark.parametrize("link", ["5g", "4g", "wifi-weak"])
def test_latency_json(capsys, link):
    assert main(["latency", "--profile", "a17-pro", "--link", link, "--json", "--k-max", "6"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert [s["k"] for s in t["steps"]] == list(range(1, 7))
    assert 1 <= t["k_star"] <= 6
    times = [s["step_time_s"] for s in t["steps"]]
    assert times == sorted(times)  # eq. (10) is increasing in K
    best = max(t["steps"], key=lambda s: s["tokens_per_s"])
    assert best["k"] == t["k_star"]


def test_latency_text(capsys):
    assert main(["latency", "--profile", "m3-max", "--link", "5g"]) == 0
    out = capsys.readouterr().out
    assert "k_star =" in out and "<- k_star" in out and "T_fixed" in out


def test_bad_input_is_one_stderr_line():
    for args in (
        ["latency", "--profile", "nope", "--link", "5g"],
        ["latency", "--profile", "m3-max", "--link", "3g"],
        ["show", "/no/such.toml"],
    ):
        r = subprocess.run([sys.executable, "-m", "devices", *args], capture_output=True, text=True)
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_calibrate_on_a_tiny_model(tmp_path, tiny_dir, capsys):
    out = tmp_path / "host.toml"
    rc = main(
        [
            "calibrate",
            "--out",
            str(out),
            "--model",
            str(tiny_dir("qwen3")),
            "--k-max",
            "3",
            "--repeats",
            "1",
            "--no-progress",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "alpha_edge" in text and "R²" in text
    prof = read_profile_file(out)
    assert prof.kind == "host"
    for k in ("alpha_edge", "t_base", "c_layer", "t_rv"):
        assert prof.param(k) >= 0 and prof.latency[k].source.startswith("calibrated on")
    assert prof.param("alpha_edge") > 0  # drafting K tokens takes longer for larger K
    assert prof.latency["alpha_edge"].r2 is not None
    # the written profile drives the latency model like any shipped one
    assert main(["latency", "--profile", str(out), "--link", "4g", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "host"
