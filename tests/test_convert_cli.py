"""`python -m converters export`: flags reach the right converter, misuse ends in one line."""

import json

import pytest

from converters.__main__ import main

pytestmark = pytest.mark.filterwarnings("ignore")


def test_mlx_export_prints_parity(tiny_dir, tmp_path, capsys):
    assert (
        main(
            [
                "export",
                "--model",
                str(tiny_dir("qwen3")),
                "--format",
                "mlx",
                "--quantize",
                "8",
                "--group-size",
                "32",
                "--out",
                str(tmp_path / "q8"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "top-1 agreement" in out and "mean KL" in out
    assert json.loads((tmp_path / "q8" / "duet_parity.json").read_text())["bits"] == 8


def test_static_onnx_export_json(tiny_dir, tmp_path, capsys):
    assert (
        main(
            [
                "export",
                "--model",
                str(tiny_dir("llama", num_layers=1)),
                "--format",
                "onnx",
                "--static-shapes",
                "--max-context",
                "32",
                "--prefill-len",
                "4",
                "--out",
                str(tmp_path / "d.onnx"),
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] and r["context"] == 32 and (tmp_path / "genai_config.json").is_file()


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--format", "mlx", "--quantize", "int8"], "does not apply"),
        (["--format", "onnx", "--quantize", "int8"], "--static-shapes"),
        (["--format", "coreml", "--quantize", "int16"], "does not apply"),
        (["--format", "onnx", "--static-shapes", "--max-context", "1"], "at least 2"),
    ],
)
def test_misuse_is_one_line(tiny_dir, tmp_path, capsys, argv, match):
    assert (
        main(["export", "--model", str(tiny_dir("qwen3")), "--out", str(tmp_path / "x"), *argv])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
