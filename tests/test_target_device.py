"""--target-device for the PyTorch target: cpu runs here; cuda without a GPU is one clear line.
Nothing here needs a GPU (the lead runs the CUDA bench on a lent machine)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_generate_cli import refusal

from runtime.backends import load_model
from runtime.errors import DuetError
from runtime.generate import main

ROOT = Path(__file__).resolve().parents[1]


def test_cuda_without_a_gpu_is_one_clear_line(tiny_dir, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    t = tiny_dir("qwen3")
    capsys.readouterr()  # building the checkpoint may print progress
    ar = ["--method", "ar", "--prompt-ids", "1,2,3", "--max-tokens", "2"]
    pair = ["--target", str(t), "--draft", str(t), "--target-backend", "torch"]
    err = refusal(capsys, *pair, "--target-device", "cuda", *ar)
    assert "--target-device cuda" in err and "sees no CUDA GPU" in err


def test_cuda_needs_the_torch_target(tiny_dir, capsys):
    rc = main(
        [
            "--target",
            str(tiny_dir("qwen3")),
            "--target-backend",
            "mlx",
            "--target-device",
            "cuda",
            "--method",
            "ar",
            "--prompt-ids",
            "1,2",
        ]
    )
    assert rc == 2 and "add --target-backend torch" in capsys.readouterr().err


def test_explicit_cpu_device_matches_the_default(tiny_dir):
    a = load_model(tiny_dir("llama"), "torch")
    b = load_model(tiny_dir("llama"), "torch", device="cpu")
    ids = np.array([[3, 14, 15, 92]])
    np.testing.assert_array_equal(a.forward(ids, a.new_cache()), b.forward(ids, b.new_cache()))
    with pytest.raises(DuetError, match="must be one of cpu, cuda"):
        load_model(tiny_dir("llama"), "torch", device="tpu")


def test_torch_target_with_a_draft_process_needs_neither_mlx_nor_coremltools(tiny_dir):
    """The GPU machine has no MLX: the torch target + process-draft path must not import it."""
    code = (
        "import sys\n"
        "for m in ('mlx', 'mlx.core', 'mlx_lm', 'coremltools'): sys.modules[m] = None\n"
        "from runtime.generate import main\n"
        "if __name__ == '__main__':\n"
        f"    sys.exit(main(['--target', {str(tiny_dir('qwen2'))!r}, '--draft', "
        f"{str(tiny_dir('qwen2', num_layers=1, seed=4))!r}, '--target-backend', 'torch', "
        "'--method', 'mirror', '--draft-process', '--prompt-ids', '5,6,7', '--max-tokens', '8', "
        "'--json']))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert '"draft_worker": "process"' in r.stdout


def test_a_cuda_target_runs_the_draft_worker_in_a_process_unless_told_otherwise(capsys):
    """No flag: the draft process beside a CUDA target (a draft thread slows its Python-bound
    pass through the GIL), a thread beside any other; --draft-process/--draft-thread decide."""
    from types import SimpleNamespace

    from runtime.cli_args import add_pair_args
    from runtime.decoding.mirror import draft_in_process

    on = {d: SimpleNamespace(device=torch.device(d)) for d in ("cuda", "cpu")}
    draft = SimpleNamespace(load_spec=("dir", "onnx", {}))
    in_memory = SimpleNamespace()  # no load spec: it cannot be sent to another process
    assert draft_in_process(on["cuda"], draft, None)
    assert not draft_in_process(on["cpu"], draft, None)
    assert not draft_in_process(SimpleNamespace(), draft, None)  # an MLX target has no .device
    assert not draft_in_process(on["cuda"], in_memory, None)
    assert not draft_in_process(on["cuda"], draft, False)
    assert draft_in_process(on["cpu"], draft, True)
    # an emulated device (--emulate) stands for an accelerator pair: the process there too
    emulated = SimpleNamespace(backend="torch+emulated", device=torch.device("cpu"))
    assert draft_in_process(emulated, draft, None)
    assert not draft_in_process(emulated, in_memory, None)
    assert not draft_in_process(emulated, draft, False)
    import argparse

    ap = argparse.ArgumentParser()
    add_pair_args(ap)
    assert ap.parse_args([]).draft_process is None
    assert ap.parse_args(["--draft-thread"]).draft_process is False
    assert ap.parse_args(["--draft-process"]).draft_process is True
    rc = main(["--method", "sd", "--draft-thread", "--prompt-ids", "1,2"])
    assert rc == 2 and "--draft-thread places Mirror-SD's draft worker" in capsys.readouterr().err
