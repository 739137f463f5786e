"""apps.profile: summary shape and ranges, a valid Chrome trace, self-contained pictures, the
sweep."""

from __future__ import annotations

import json
import re

import pytest

from apps.profile.__main__ import main
from apps.profile.sweep import exit_layers

QUESTIONS = [
    {"question_id": 1, "category": "code", "turns": ["def add(a, b):\n"]},
    {"question_id": 2, "category": "chat", "turns": ["hello there", "again"]},
    {"question_id": 3, "category": "code", "turns": ["import os\n"]},
]
REMOTE = re.compile(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", re.I)


@pytest.fixture(scope="module")
def pair_args(tiny_dir, tmp_path_factory):
    """A 4-layer target with a 1-layer random draft (some branches reused, some fallbacks)."""
    d = tmp_path_factory.mktemp("profile")
    q = d / "q.jsonl"
    q.write_text("\n".join(json.dumps(x) for x in QUESTIONS) + "\n")
    t, dr = tiny_dir("qwen3"), tiny_dir("qwen3", num_layers=1, seed=4)
    return [
        "--target",
        str(t),
        "--draft",
        str(dr),
        "--draft-backend",
        "mlx",
        "--prompts",
        str(q),
    ], d


@pytest.fixture(scope="module")
def profiled(pair_args):
    args, d = pair_args
    out = d / "out"
    return [
        *args,
        "--limit",
        "2",
        "--max-tokens",
        "24",
        "--gamma",
        "3",
        "--out",
        str(out),
        "--json",
    ], out


def test_summary_json_shape_and_ranges(profiled, capsys):
    argv, out = profiled
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s == json.loads((out / "summary.json").read_text())
    for k in (
        "overlap_fraction",
        "t_rv_ee_us",
        "t_rv_fv_us",
        "reuse_rate",
        "ff",
        "omega_kappa",
        "step_ms_measured",
        "step_ms_predicted",
    ):
        assert isinstance(s[k], float), k
    assert 0 <= s["reuse_rate"] <= 1 and 0 <= s["overlap_fraction"] <= 1 and 0 <= s["ff"] <= 1
    assert s["ff"] <= 1 - s["omega_kappa"] + 1e-9  # App. E, on this run
    assert s["bound_ff_le_1_minus_omega"]["holds"] is True
    # branch hits: own ⊆ own-or-exit; every step in the tree is a hit; a miss is never reused
    assert 0 <= s["omega_own_measured"] <= s["omega_measured"] <= 1
    assert s["omega_measured"] >= 1 - s["ff"] - 1e-9 and s["reuse_rate"] <= s["omega_measured"]
    assert s["t_rv_ee_us"] > 0 and s["step_ms_measured"] > 0 and s["eq10_rel_error"] >= 0
    assert s["settings"] | {"gamma": 3, "kappa": 8, "exit_layer": 2, "temp": 0.0} == s["settings"]
    assert {"ort_intra_op_threads", "mlx_device", "torch_threads"} <= s["threads"].keys()
    assert s["prompts"] == 2 and s["new_tokens"] == 48 and s["emulated"] is None
    assert s["steps"] == sum(p["steps"] for p in s["per_prompt"])  # aggregated, not averaged
    by = s["step_by_source"]  # the step split by where its next window came from
    assert sum(v["share"] for v in by.values()) == pytest.approx(1.0)
    assert all(by[k]["share"] == pytest.approx(s[f"{k}_rate"]) for k in by)
    assert all(v["step_ms"] > 0 for v in by.values())


def test_trace_is_a_chrome_trace_and_picture_is_self_contained(profiled, capsys):
    argv, out = profiled
    if not (out / "trace.json").exists():
        assert main(argv) == 0
        capsys.readouterr()
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert xs and all(
        isinstance(e["ts"], int | float) and isinstance(e["dur"], int | float) for e in xs
    )
    assert {e["tid"] for e in xs} == {1, 2, 3}
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"target", "draft", "channel"}
    page = (out / "timeline.html").read_text()
    assert "<svg" in page and "</svg>" in page and "<title>" in page
    assert not REMOTE.search(page) and "<script" not in page
    assert " ms</text>" in page  # the time axis


def test_sweep_writes_table_and_chart(pair_args, capsys):
    args, d = pair_args
    out = d / "sweep"
    argv = [*args, "--sweep", "--kappas", "1,4", "--limit", "2", "--max-tokens", "10",
            "--no-warmup", "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res == json.loads((out / "sweep.json").read_text())
    assert res["exit_layers"] == [1, 2, 3] and res["kappas"] == [1, 4]
    assert [(r["exit_layer"], r["kappa"]) for r in res["rows"]] == [
        (le, k) for le in (1, 2, 3) for k in (1, 4)
    ]
    for r in res["rows"]:  # the bound is in expectation; a few greedy steps at κ = 1 may exceed it
        assert (
            0 <= r["ff"] <= 1
            and 0 <= r["one_minus_omega"] <= 1
            and isinstance(r["bound_holds"], bool)
        )
    page = (out / "sweep.html").read_text()
    assert "<svg" in page and "<polyline" in page and "stroke-dasharray" in page
    assert not REMOTE.search(page) and "<script" not in page


def test_emulated_run_is_labelled_everywhere(pair_args, capsys):
    args, d = pair_args
    out = d / "emu"
    argv = [*args, "--limit", "1", "--max-tokens", "6", "--no-warmup", "--emulate", "m3-max",
            "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    label = s["emulated"]
    assert label.startswith("emulated:m3-max") and s["emulation"]["emulated"] is True
    assert label in s["label"]
    trace = json.loads((out / "trace.json").read_text())
    assert label in trace["traceEvents"][0]["args"]["name"]
    assert label in re.search(r"<title>(.*?)</title>", (out / "timeline.html").read_text()).group(1)


def test_exit_layers_rounded_and_clamped():
    assert exit_layers(4) == [1, 2, 3]
    assert exit_layers(28) == [7, 14, 21]
    assert exit_layers(2) == [1]


def test_bad_exit_layer_is_one_line(pair_args, capsys):
    args, d = pair_args
    assert main([*args, "--exit-layer", "9", "--out", str(d / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--exit-layer" in err[0]
