"""Quantized MLX target: mlx-lm's converter, parity vs full precision, loadable two ways."""

import json

import numpy as np
import pytest

from converters.mlx_parity import TOLERANCES
from converters.mlx_quantize import PARITY_FILE, quantize_mlx
from runtime.errors import DuetError


def test_8bit_parity_and_loading(tiny_dir, tmp_path):
    out = tmp_path / "q8"
    report = quantize_mlx(tiny_dir("qwen3"), out, bits=8, group_size=32)
    par = report["parity"]
    assert par["ok"], par
    assert (
        par["top1_agree"] >= TOLERANCES[8]["min_top1"]
        and par["mean_kl"] <= TOLERANCES[8]["max_mean_kl"]
    )
    assert json.loads((out / PARITY_FILE).read_text())["parity"] == par
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    assert report["size_bytes"] < 0.5 * report["source_size_bytes"]

    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(str(out))  # what a Mac user already has
    assert model(mx.array([[1, 2, 3]])).shape == (1, 3, 320)

    from runtime.backends import load_model

    ours = load_model(out, backend="mlx")  # our backend
    logits = ours.forward(np.array([[1, 2, 3]]), ours.new_cache())
    assert logits.shape == (1, 3, 320) and np.isfinite(logits).all()


def test_4bit_records_parity(tiny_dir, tmp_path):
    # smaller random weights: at initializer_range 0.3 a random model's 4-bit error is far
    # above a trained model's, which says nothing about the converter
    src = tiny_dir("llama", initializer_range=0.05)
    report = quantize_mlx(src, tmp_path / "q4", bits=4, group_size=32)
    par = report["parity"]
    assert par["ok"] and par["tolerance"] == TOLERANCES[4], par
    assert par["positions"] > 100 and 0 <= par["top1_agree"] <= 1 and par["mean_kl"] >= 0


def test_parity_catches_a_wrong_model(tiny_dir):
    """Negative control: another checkpoint's weights must fail even the 4-bit floor."""
    from converters.mlx_parity import quantized_parity

    par = quantized_parity(tiny_dir("qwen3"), tiny_dir("qwen3", seed=1))
    assert not par["ok"] and par["top1_agree"] < 0.2


def test_refuses_bad_requests(tiny_dir, tmp_path):
    with pytest.raises(DuetError, match="4 or 8"):
        quantize_mlx(tiny_dir("qwen3"), tmp_path / "x", bits=3)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "f").write_text("x")
    with pytest.raises(DuetError, match="not empty"):
        quantize_mlx(tiny_dir("qwen3"), busy, parity=False)
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(DuetError, match="gpt2"):
        quantize_mlx(tmp_path / "gpt2", tmp_path / "y")
