"""apps.bench: JSON shape and Spec-Bench answer files on a tiny pair (never its speed)."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from apps.bench.__main__ import main

QUESTIONS = [
    {"question_id": 1, "category": "code", "turns": ["def add(a, b):\n"]},
    {"question_id": 2, "category": "chat", "turns": ["hello", "and again"]},  # two turns
    {"question_id": 3, "category": "code", "turns": ["import os\n"]},
]
METHODS = ["ar", "sd", "mirror", "mlx-lm", "hf-assisted"]


@pytest.fixture(scope="module")
def bench_run(tiny_dir, tmp_path_factory):
    """One bench over a self-drafting tiny pair (target as its own draft: all accepted)."""
    t = tiny_dir("qwen3")
    d = tmp_path_factory.mktemp("bench")
    prompts = d / "q.jsonl"
    prompts.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    out = d / "answers"
    argv = [
        "--target",
        str(t),
        "--draft",
        str(t),
        "--draft-backend",
        "mlx",
        "--prompts",
        str(prompts),
        "--limit",
        "2",
        "--max-tokens",
        "9",
        "--gamma",
        "3",
        "--temps",
        "0,1",
        "--json",
        "--out",
        str(out),
        "--model-id",
        "tiny",
    ]
    return argv, out


def test_json_shape(bench_run, capsys):
    argv, _ = bench_run
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    rows = res["rows"]
    assert [(r["method"], r["temp"]) for r in rows] == [(m, t) for t in (0.0, 1.0) for m in METHODS]
    for r in rows:
        assert {"tokens_per_s", "mean_accepted", "speedup", "new_tokens", "wall_s"} <= r.keys()
        assert r["tokens_per_s"] > 0 and r["prompts"] == 2
    by = {(r["method"], r["temp"]): r for r in rows}
    assert by["ar", 0.0]["speedup"] == 1.0 and by["ar", 0.0]["mean_accepted"] == 1.0
    for m in ("sd", "mlx-lm", "hf-assisted"):  # self-draft, greedy: every window accepted
        assert by[m, 0.0]["mean_accepted"] > 2.5, by[m, 0.0]
        assert by[m, 0.0]["matches_ar"] == "2/2"
    assert by["sd", 1.0]["mean_accepted"] > 2.5  # rejection sampling with q == p accepts all
    assert res["mismatches"] == []
    th = res["settings"]["threads"]
    assert {"torch_threads", "mlx_device", "runners"} <= th.keys()
    assert set(th["runners"]) == set(METHODS)


def test_out_writes_spec_bench_answers(bench_run, capsys):
    argv, out = bench_run
    if not out.exists():
        assert main(argv) == 0
        capsys.readouterr()
    files = sorted(p.name for p in out.glob("*.jsonl"))
    assert files == sorted(f"tiny-{m}-temperature-{t}.jsonl" for m in METHODS for t in (0, 1))
    for f in out.glob("*.jsonl"):
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        assert [r["question_id"] for r in recs] == [1, 2]
        for r in recs:
            assert {"question_id", "model_id", "choices", "tstamp", "answer_id"} <= r.keys()
            c = r["choices"][0]
            assert c["index"] == 0
            n_turns = len(QUESTIONS[r["question_id"] - 1]["turns"])
            assert len(c["turns"]) == len(c["new_tokens"]) == len(c["wall_time"]) == n_turns
            assert sum(c["accept_lengths"]) == sum(c["new_tokens"])
            assert sum(c["decoding_steps"]) == len(c["accept_lengths"])


def test_bad_method_is_one_line(capsys):
    assert main(["--methods", "ar,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_subcommands_are_a_table_and_the_old_edge_flag_still_works(capsys):
    """`python -m apps.bench NAME` runs a subcommand from the table; `--edge` anywhere in the
    arguments is its deprecated spelling; everything else is the comparison itself."""
    from apps.bench.__main__ import SUBCOMMANDS, subcommand

    assert set(SUBCOMMANDS) == {"edge", "footprint", "evolving", "scale", "turns"}
    assert subcommand(["edge", "--links", "5g"]) == ("edge", ["--links", "5g"])
    assert subcommand(["--links", "5g", "--edge"]) == ("edge", ["--links", "5g"])
    assert subcommand(["footprint", "--rounds", "3"]) == ("footprint", ["--rounds", "3"])
    assert subcommand(["--methods", "ar,sd"]) is None
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(f"  {name}" in out for name in SUBCOMMANDS) and "--edge" in out
    with pytest.raises(SystemExit):
        main(["edge", "--help"])
    assert "usage: python -m apps.bench edge" in capsys.readouterr().out


def test_emulate_labels_output_and_skips_unpaddable_baselines(tiny_dir, tmp_path, capsys):
    t = tiny_dir("qwen3")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps(QUESTIONS[0]) + "\n")
    argv = ["--target", str(t), "--draft", str(t), "--draft-backend", "mlx", "--prompts", str(q),
            "--max-tokens", "5", "--temps", "0", "--no-warmup", "--methods", "ar,sd,mirror,mlx-lm",
            "--emulate", "m3-max"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert (
        res["emulated"].startswith("emulated:m3-max")
        and res["settings"]["emulated"] == res["emulated"]
    )
    assert [r["method"] for r in res["rows"]] == ["ar", "sd", "mirror"]
    assert all(r["emulated"] == res["emulated"] for r in res["rows"])
    assert "mlx-lm" in res["settings"]["skipped"] and "skipping mlx-lm" in cap.err
    assert main(argv) == 0
    assert res["emulated"] in capsys.readouterr().out.splitlines()[0]
    # mirror ran its draft in a process under --emulate (the default there); the run ended it
    assert res["settings"]["threads"]["runners"]["mirror"]["draft_worker"] == "process"
    assert not [p for p in mp.active_children() if p.name == "duet-draft-process"]


def test_contention_check_reports_both_loops():
    from apps.bench.studies.contention import measure

    r = measure(50, 1, None, None, 4, pair=False)
    assert r["matmul_ms_alone"] > 0 and len(r["matmul_ms_two_at_once"]) == 2
    assert r["matmul_slowdown"] == pytest.approx(
        sum(r["matmul_ms_two_at_once"]) / 2 / r["matmul_ms_alone"], rel=0.01
    )


def two_prompt_bench(tiny_dir, tmp_path, capsys, *extra: str) -> tuple[list[str], dict]:
    """apps.bench --json with ar and sd on two of QUESTIONS (6 tokens each, the tiny target
    drafting for itself) and EXTRA exits 0: its arguments, and its record."""
    t = tiny_dir("qwen3")
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    pair = ["--target", str(t), "--draft", str(t), "--draft-backend", "mlx"]
    run = ["--prompts", str(prompts), "--limit", "2", "--max-tokens", "6", "--methods", "ar,sd"]
    argv = [*pair, *run, *extra, "--json", "--no-warmup"]
    assert main(argv) == 0
    return argv, json.loads(capsys.readouterr().out)


def prompts_per_row(res: dict) -> dict:
    """(method, temp) -> how many prompts the row pools."""
    return {(r["method"], r["temp"]): r["prompts"] for r in res["rows"]}


def test_samples_draw_each_prompt_again_at_t_above_zero(tiny_dir, tmp_path, capsys):
    """--samples 2: every prompt twice at T = 1 (distinct seeds), once at T = 0 (greedy)."""
    argv, res = two_prompt_bench(tiny_dir, tmp_path, capsys, "--temps", "0,1", "--samples", "2")
    assert res["settings"]["samples"] == 2
    assert prompts_per_row(res) == {("ar", 0.0): 2, ("sd", 0.0): 2, ("ar", 1.0): 4, ("sd", 1.0): 4}
    assert main([*argv[:-4], "--samples", "0"]) == 2
    assert "--samples must be at least 1" in capsys.readouterr().err


def test_the_bench_accounts_for_tree_against_sd_by_tokens_per_step_and_step_time():
    from apps.bench.report import step_split, tree_account

    runs = [{"stage_s": {"draft": 0.30, "verify": 1.20}, "decoding_steps": [40, 20]},
            {"stage_s": {"draft": 0.10, "verify": 0.40}, "decoding_steps": [20]}]  # fmt: skip
    assert step_split(runs) == {"draft_ms_per_step": 5.0, "verify_ms_per_step": 20.0}
    assert step_split([*runs, {"stage_s": None, "decoding_steps": [3]}]) == {}
    tree = {"method": "tree", "temp": 0, "vs_sd": 0.99, "mean_accepted": 4.27,
            "draft_ms_per_step": 5.54, "verify_ms_per_step": 22.26}  # fmt: skip
    sd = {"method": "sd", "temp": 0, "mean_accepted": 3.78, "draft_ms_per_step": 4.23,
          "verify_ms_per_step": 20.41}  # fmt: skip
    line = tree_account(tree, sd)
    assert line.startswith("temp 0: tree is 0.99x sd: 1.13x its tokens per step (τ 4.27 vs 3.78)")
    assert (
        "at 1.14x its step time (drafting 5.5 vs 4.2 ms, verifying 22.3 vs 20.4 ms a step)" in line
    )
    assert tree_account(tree, None) == "temp 0: tree is 0.99x sd"


def test_rounds_repeat_the_schedule_and_pool_in_the_rows(tiny_dir, tmp_path, capsys):
    """--rounds 2: every (prompt, method) twice, the same greedy text each round; the rows
    pool both; the answer files hold round 0 only."""
    extra = ["--temps", "0", "--rounds", "2", "--out", str(tmp_path / "ans")]
    argv, res = two_prompt_bench(tiny_dir, tmp_path, capsys, *extra)
    assert res["settings"]["rounds"] == 2
    assert prompts_per_row(res) == {("ar", 0.0): 4, ("sd", 0.0): 4}
    sd = next(r for r in res["rows"] if r["method"] == "sd")
    assert sd["matches_ar"] == "4/4"  # each round's greedy text is ar's
    for f in (tmp_path / "ans").iterdir():
        assert len(f.read_text().splitlines()) == 2  # one answer per prompt, not per round
    assert main([*argv[:-6], "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
