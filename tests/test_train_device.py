"""`--device` of the trainers: the loop and the step timer put each batch on LoopConfig.device
and autocast on that device's type; asking for a GPU that is not there is one line, exit 2."""

import json

import pytest
import torch

from apps.train.loop import LoopConfig, train_loop
from apps.train.plan import time_steps


def _model_and_batches():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))

    def batches():
        while True:
            x = torch.randint(0, 16, (2, 5))
            yield x, x

    seen = []

    def step(x, y):
        seen.append((x.device.type, y.device.type, torch.is_autocast_enabled("cpu")))
        logits = model(x).float()
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()), {}

    return model, batches(), step, seen


@pytest.mark.parametrize("bf16", [False, True])
def test_loop_runs_on_the_config_device(tmp_path, bf16):
    model, batches, step, seen = _model_and_batches()
    cfg = LoopConfig("dev", 2, 1e-2, 1, bf16=bf16, device="cpu")
    summary = train_loop(model, step, batches, cfg, tmp_path / "log.jsonl")
    assert summary["steps"] == 2 and seen == [("cpu", "cpu", bf16)] * 2
    logged = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2]


def test_time_steps_on_the_device():
    model, batches, step, seen = _model_and_batches()
    assert time_steps(model, step, batches, n=2, bf16=False, device="cpu") > 0
    assert seen == [("cpu", "cpu", False)] * 3  # one warm-up step, then n timed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: --device cuda is valid")
def test_anchor_device_cuda_without_a_gpu_is_one_line(tiny_dir, tmp_path, capsys):
    from apps.train.__main__ import main

    base, out = tiny_dir("qwen3", num_layers=3), tmp_path / "anchor"
    capsys.readouterr()  # the checkpoint writer's progress bar
    assert main(["anchor", "--base", str(base), "--out", str(out), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0], err
    assert not out.exists()


def test_pair_pipeline_device_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    from apps.train.__main__ import main

    out = tmp_path / "pair"
    argv = ["--out", str(out), "--device", "cuda", "--target-steps", "1", "--draft-steps", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0], err
    assert not (out / "target").exists()


def test_plan_leaves_the_evaluation_reserve_only_when_evaluating():
    from apps.train.plan import EVAL_RESERVE_S, SAVE_RESERVE_S, plan_steps

    with_eval = plan_steps(600.0, 1.0, 1.0)
    without = plan_steps(600.0, 1.0, 1.0, reserve_s=SAVE_RESERVE_S)
    assert with_eval.target_time_s == pytest.approx(0.7 * (600 - EVAL_RESERVE_S))
    assert without.target_time_s == pytest.approx(0.7 * (600 - SAVE_RESERVE_S))
    assert without.draft_steps > with_eval.draft_steps
