"""Companion bundle: package once, draft with the reference client (tokens equal the
PyTorch reference's greedy tokens), and refuse tampered, truncated or incomplete bundles."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from apps.companion.__main__ import main
from apps.companion.package import package_bundle
from apps.companion.verify import verify_bundle
from runtime.errors import DuetError

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def bundle(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("companion") / "bundle"
    package_bundle(tiny_dir("qwen3", num_layers=1), out, max_context=32, prefill_len=4)
    return out


@pytest.fixture
def copy(bundle, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(bundle, dst)
    return dst


def test_manifest_contents(bundle):
    m = verify_bundle(bundle)
    assert m["format_version"] == 2 and m["context_length"] == 32
    assert {"draft.onnx", "draft.prefill.onnx", "tokenizer.json", "genai_config.json"} <= set(
        m["files"]
    )
    assert any(f.startswith("draft.mlpackage/") for f in m["files"])
    assert all(len(e["sha256"]) == 64 and e["size"] > 0 for e in m["files"].values())
    assert (
        m["pairs_with"]["family"] == "qwen3"
        and m["tokenizer"]["vocab_hash"] == m["pairs_with"]["vocab_hash"]
    )
    assert m["io"]["onnx"]["decode"]["inputs"]["past_key_values.0.key"] == [1, 2, 32, 16]
    assert set(m["io"]["coreml"]["functions"]) == {"prefill", "decode"}
    assert m["parity"]["onnx"]["ok"] and m["parity"]["coreml"]["fp16"]["ok"]
    # the provider the ONNX draft is made for (the phone's NPU by default), recorded beside it
    assert m["conversion"]["onnx"]["recipe"] == {"scheme": "none", "provider": "qnn"}
    assert m["parity"]["onnx"]["provider"] == "qnn" and "stand_in" in m["parity"]["onnx"]


def test_run_matches_reference_greedy(bundle, tiny_dir, capsys):
    from runtime.backends.torch.causal_lm import TorchCausalLM

    prompt = [5, 17, 99, 3, 250, 11]
    assert (
        main(
            [
                "run",
                str(bundle),
                "--prompt-ids",
                ",".join(map(str, prompt)),
                "--max-tokens",
                "6",
                "--engine",
                "onnx",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)["tokens"]
    ref = TorchCausalLM.load(tiny_dir("qwen3", num_layers=1))
    cache, ids, want = ref.new_cache(), np.array([prompt]), []
    for _ in range(6):
        want.append(int(ref.forward(ids, cache)[0, -1].argmax()))
        ids = np.array([[want[-1]]])
    assert got == want


def test_run_text_prompt(bundle, capsys):
    assert (
        main(["run", str(bundle), "--prompt", "Hi", "--max-tokens", "3", "--engine", "onnx"]) == 0
    )
    assert "3 tokens drafted" in capsys.readouterr().err


def _refused(bundle, capsys, match):
    assert (
        main(["run", str(bundle), "--prompt", "Hi", "--max-tokens", "2", "--engine", "onnx"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err


def test_tampered_file_refused(copy, capsys):
    p = copy / "draft.onnx"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    _refused(copy, capsys, "sha256")


def test_truncated_file_refused(copy, capsys):
    p = next((copy / "draft.mlpackage").rglob("weight.bin"))
    p.write_bytes(p.read_bytes()[:100])
    _refused(copy, capsys, "truncated")


def test_incomplete_bundles_refused(copy, capsys):
    (copy / "tokenizer.json").unlink()
    _refused(copy, capsys, "tokenizer.json is missing")
    (copy / "manifest.json").unlink()
    _refused(copy, capsys, "no manifest.json")


def test_unlisted_file_and_edited_manifest_refused(copy, capsys):
    (copy / "extra.bin").write_bytes(b"x")
    _refused(copy, capsys, "not in the manifest")
    (copy / "extra.bin").unlink()
    m = json.loads((copy / "manifest.json").read_text())
    del m["files"]["draft.prefill.onnx"]
    (copy / "manifest.json").write_text(json.dumps(m))
    _refused(copy, capsys, "incomplete bundle")


def test_package_refuses_unsupported_architecture(tmp_path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "falcon"}))
    assert main(["package", "--draft", str(d), "--out", str(tmp_path / "o")]) == 2
    assert "falcon" in capsys.readouterr().err


def test_package_refuses_mismatched_target(tiny_dir, tmp_path):
    with pytest.raises(DuetError, match="vocabulary"):
        package_bundle(
            tiny_dir("qwen3", num_layers=1),
            tmp_path / "o",
            target=tiny_dir("llama", vocab_size=300),
        )


def test_package_anchor_draft_records_its_base(tmp_path, capsys):
    """--anchor: the shipped anchor draft is assembled from its base and the manifest names the
    base it anchors to (FlexSpec §IV-A), so the phone keeps it while the target evolves."""
    from runtime.adapter import base_fingerprint

    assets = Path(__file__).parents[1] / "runtime" / "assets"
    base = assets / "default" / "target"
    out = tmp_path / "anchor-bundle"
    assert (
        main(
            [
                "package",
                "--anchor",
                str(assets / "evolving" / "anchor"),
                "--target",
                str(base),
                "--out",
                str(out),
                "--no-coreml",
                "--max-context",
                "16",
            ]
        )
        == 0
    )
    m = verify_bundle(out)
    assert m["anchor"]["anchors_to"]["base_sha256"] == base_fingerprint(base)
    assert m["anchor"]["anchor_layer"] == 7 and m["parity"]["onnx"]["ok"]
    capsys.readouterr()
    assert main(["package", "--anchor", str(base), "--out", str(tmp_path / "x")]) == 2
    assert "not an anchor draft" in capsys.readouterr().err
