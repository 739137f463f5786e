"""Every command, given inputs a user gets wrong: exit code 2, one stderr line naming it, no
traceback.

One table of (command line, words the line must contain). The commands run as real
subprocesses, two at a time, once per session (`results`); each row is then its own test.
The checkpoints here are fakes that look whole to the preflight checks (config.json, a
tokenizer, an empty but well-formed safetensors file) and are broken in one way each, so
no case needs a real model, and every one fails before torch is imported.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (id, argv after `python -m`, substring the one stderr line must contain); {name} is a fixture path
CASES = [
    ("generate-missing-target", "runtime.generate --target {tmp}/nope --method ar --prompt hi",
     "no such file or directory"),
    ("generate-empty-dir", "runtime.generate --target {empty} --method ar --prompt hi",
     "no config.json"),
    ("generate-corrupt-config", "runtime.generate --target {corrupt} --method ar --prompt hi",
     "config.json: not valid JSON"),
    ("generate-truncated-weights", "runtime.generate --target {trunc} --method ar --prompt hi",
     "truncated"),
    ("generate-no-weights", "runtime.generate --target {noweights} --method ar --prompt hi",
     "no *.safetensors"),
    ("generate-mismatched-tokenizer",
     "runtime.generate --target {good} --draft {othertok} --method sd --prompt hi",
     "tokenizers differ"),
    ("generate-mismatched-vocab",
     "runtime.generate --target {good} --draft {bigvocab} --method sd --prompt hi",
     "vocabulary size 512 differs"),
    ("generate-truncated-onnx",
     "runtime.generate --target {good} --draft {trunc_onnx} --method sd --prompt hi",
     "not a valid ONNX model"),
    ("generate-max-tokens-0", "runtime.generate --method ar --prompt hi --max-tokens 0",
     "--max-tokens must be at least 1"),
    ("generate-top-p-range", "runtime.generate --method ar --prompt hi --top-p 1.5",
     "--top-p must be in (0, 1]"),
    ("generate-prompt-ids", "runtime.generate --method ar --prompt-ids 1,x,3",
     "--prompt-ids must be comma-separated integers"),
    ("generate-unknown-profile", "runtime.generate --method ar --prompt hi --emulate nosuch-soc",
     "unknown device profile 'nosuch-soc'"),
    ("generate-trace-unwritable",
     "runtime.generate --method mirror --prompt hi --trace {file}/trace.json", "is a file"),
    ("chat-negative-temp", "runtime.chat --temp -1", "--temp must be >= 0"),
    ("chat-truncated-target", "runtime.chat --target {trunc} --method ar", "truncated"),
    ("bench-prompts-not-jsonl", "apps.bench --prompts {notjsonl} --methods ar",
     "not a JSON object"),
    ("bench-unknown-method", "apps.bench --methods ar,nosuch", "unknown nosuch"),
    ("bench-out-unwritable", "apps.bench --methods ar --out {file}/answers", "is a file"),
    ("profile-out-unwritable", "apps.profile --out {file}/prof", "is a file"),
    ("profile-gamma-0", "apps.profile --gamma 0", "--gamma must be at least 1"),
    ("companion-empty-draft", "apps.companion package --draft {empty} --out {tmp}/bundle",
     "no config.json"),
    ("companion-missing-bundle", "apps.companion run {tmp}/no-bundle --prompt hi",
     "bundle not found"),
    ("server-port-in-use", "apps.server --port {port}", "Address already in use"),
    ("server-port-range", "apps.server --port 70000", "--port must be in [0, 65535]"),
    ("server-mismatched-tokenizer", "apps.server --target {good} --draft {othertok} --port 0",
     "tokenizers differ"),
    ("converters-bad-quantize",
     "converters export --model {good} --format mlx --quantize 3 --out {tmp}/q3",
     "--quantize 3 does not apply to --format mlx"),
    ("converters-truncated-weights",
     "converters export --model {trunc} --format onnx --out {tmp}/t.onnx", "truncated"),
    ("converters-unwritable-out",
     "converters export --model {good} --format onnx --out {file}/x.onnx", "is a file"),
    ("devices-unknown-profile", "devices show nosuch-soc", "unknown device profile 'nosuch-soc'"),
    ("devices-calibrate-extension", "devices calibrate --out {tmp}/profile.txt",
     "expected a .toml or .json file name"),
    ("cloud-missing-target", "apps.cloud serve --target {tmp}/nope", "no such file or directory"),
    ("cloud-public-without-token", "apps.cloud serve --host 0.0.0.0 --port 0",
     "without --token-file"),
    ("cloud-port-range", "apps.cloud serve --port 70000", "--port must be in [0, 65535]"),
    ("cloud-missing-token-file", "apps.cloud serve --token-file {tmp}/nope-token", "no such file"),
]  # fmt: skip


def fake_checkpoint(d: Path, *, vocab: int = 320, weights: bool = True, swap: bool = False) -> Path:
    """config.json + tokenizer.json + a well-formed safetensors file holding no tensors."""
    d.mkdir(parents=True)
    cfg = {"model_type": "qwen3", "vocab_size": vocab, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256}  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    words = [f"t{i}" for i in range(vocab)]
    if swap:  # same size, different ids: another tokenizer
        words[0], words[1] = words[1], words[0]
    (d / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": {w: i for i, w in enumerate(words)}}})
    )
    if weights:
        (d / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    return d


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{case id: CompletedProcess}, every case run once, two at a time."""
    tmp = tmp_path_factory.mktemp("bad")
    paths = {
        "tmp": tmp,
        "empty": tmp / "empty",
        "good": fake_checkpoint(tmp / "good"),
        "othertok": fake_checkpoint(tmp / "othertok", swap=True),
        "bigvocab": fake_checkpoint(tmp / "bigvocab", vocab=512),
        "noweights": fake_checkpoint(tmp / "noweights", weights=False),
        "corrupt": fake_checkpoint(tmp / "corrupt"),
        "trunc": fake_checkpoint(tmp / "trunc"),
        "file": tmp / "a-file",
        "notjsonl": tmp / "prompts.jsonl",
        "trunc_onnx": tmp / "draft.onnx",
    }
    paths["empty"].mkdir()
    (paths["corrupt"] / "config.json").write_text('{"model_type": "qwen3",')
    head = json.dumps({"w": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 16384]}})
    (paths["trunc"] / "model.safetensors").write_bytes(
        struct.pack("<Q", len(head)) + head.encode() + bytes(100)
    )
    paths["file"].write_text("not a directory\n")
    paths["notjsonl"].write_text("this is not JSON\n")
    paths["trunc_onnx"].write_bytes(b"\x08\x07\x12\x07pytorch\x1a\xff\xff")  # cut mid-field
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    paths["port"] = sock.getsockname()[1]

    def run(case):
        cid, cmd, _ = case
        argv = [a.format(**paths) for a in cmd.split()]
        try:
            return cid, subprocess.run(
                [sys.executable, "-m", *argv],
                cwd=ROOT,
                text=True,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=60,
            )
        except subprocess.TimeoutExpired as e:  # a hang is a failure of that case, not the suite
            return cid, e

    try:
        with ThreadPoolExecutor(2) as ex:
            return dict(ex.map(run, CASES))
    finally:
        sock.close()


def test_table_is_wide():
    assert len({c[0] for c in CASES}) == len(CASES) >= 20
    cmds = {c[1].split()[0] for c in CASES}
    assert cmds >= {
        "runtime.generate",
        "runtime.chat",
        "apps.bench",
        "apps.profile",
        "apps.companion",
        "apps.server",
        "apps.cloud",
        "converters",
        "devices",
    }


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_line_exit_2(results, case):
    cid, cmd, expected = case
    r = results[cid]
    assert not isinstance(r, subprocess.TimeoutExpired), f"{cmd}: hung for 60 s"
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1, r.stderr
    assert expected in lines[0], lines[0]
    assert ": error: " in lines[0]
