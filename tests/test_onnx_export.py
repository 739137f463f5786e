"""`python -m converters export --format onnx`: the file, its parity report, its I/O names."""

import json

import onnx

from converters.__main__ import main
from converters.onnx_io import io_names
from runtime.backends import load_model


def export_onnx_cli(model, out, *extra: str) -> int:
    """`python -m converters export --model MODEL --format onnx --out OUT EXTRA`'s exit code."""
    return main(["export", "--model", str(model), "--format", "onnx", "--out", str(out), *extra])


def test_export_cli_reports_parity(tiny_dir, tmp_path, capsys):
    d = tiny_dir("qwen2")
    out = tmp_path / "draft.onnx"
    assert export_onnx_cli(d, out, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ok"] and info["parity"]["max_abs"] <= info["tolerance"] == 1e-3
    assert info["parity"]["top1_agree"] == 1.0
    m = onnx.load(str(out))
    ins, outs = io_names(4)
    assert [i.name for i in m.graph.input] == ins and [o.name for o in m.graph.output] == outs
    # self-describing: loads with no config.json beside it
    model = load_model(out)
    assert model.config.model_type == "qwen2" and model.backend == "onnx"


def test_export_fails_past_tolerance(tiny_dir, tmp_path, capsys):
    d = tiny_dir("qwen2")
    rc = export_onnx_cli(d, tmp_path / "x.onnx", "--tol", "0")
    assert rc == 2 and "exceeds tolerance" in capsys.readouterr().err


def test_export_unsupported_architecture(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "mamba"}')
    rc = export_onnx_cli(tmp_path, tmp_path / "x.onnx")
    assert rc == 2 and "model_type='mamba'" in capsys.readouterr().err
