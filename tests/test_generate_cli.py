"""runtime.generate: the --json contract, and one clear line for every bad input."""

import json
import multiprocessing as mp
import subprocess
import sys

import pytest

from runtime.generate import main


def run_main(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def refusal(capsys, *argv) -> str:
    """runtime.generate ARGV exits 2 with one line on stderr: that line."""
    rc, _, err = run_main(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_json_contract(tiny_dir, capsys, method):
    t, d = tiny_dir("qwen3"), tiny_dir("qwen3", num_layers=1, seed=9)
    rc, out, _ = run_main(
        capsys,
        "--target",
        str(t),
        "--draft",
        str(d),
        "--method",
        method,
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "12",
        "--json",
    )
    assert rc == 0
    res = json.loads(out)
    assert len(res["tokens"]) == 12 and isinstance(res["text"], str)
    s = res["stats"]
    for key in ("steps", "accept_lengths", "mean_accepted", "tokens_per_s", "wall_s"):
        assert key in s
    assert sum(s["accept_lengths"]) == 12 and s["steps"] == len(s["accept_lengths"])
    assert s["mean_accepted"] == pytest.approx(12 / s["steps"])


def test_prompt_ids_and_sampling_seeded(tiny_dir, capsys):
    t = tiny_dir("llama")
    args = (
        "--target",
        str(t),
        "--draft",
        str(t),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "10",
        "--temp",
        "1",
        "--top-p",
        "0.9",
        "--seed",
        "7",
        "--json",
    )
    a = json.loads(run_main(capsys, *args)[1])
    b = json.loads(run_main(capsys, *args)[1])
    assert a["tokens"] == b["tokens"]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--gamma", "0"], "--gamma must be at least 1"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--top-p", "1.5"], "--top-p"),
        (["--prompt-ids", "1,x"], "comma-separated integers"),
        (["--prompt-ids", "5,99999"], "outside the vocabulary"),
        (["--prompt", "x" * 400], "context is 256"),
    ],
)
def test_bad_arguments_one_line(tiny_dir, capsys, extra, needle):
    t = tiny_dir("qwen3")
    argv = ["--target", str(t), "--draft", str(t)]
    if not any(a.startswith("--prompt") for a in extra):
        argv += ["--prompt", "hi"]
    rc, _, err = run_main(capsys, *argv, *extra)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_bad_checkpoints(tiny_dir, tmp_path, capsys):
    t = tiny_dir("qwen3")
    cases = {}
    (tmp_path / "missing").mkdir()
    cases["missing"] = "no config.json"
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{")
    cases["badjson"] = "not valid JSON"
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    cases["gpt2"] = "unsupported architecture model_type='gpt2'"
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text((t / "config.json").read_text())
    cases["noweights"] = "noweights"
    cases["nonexistent"] = "no such file or directory"
    for name, needle in cases.items():
        rc, _, err = run_main(
            capsys, "--target", str(tmp_path / name), "--method", "ar", "--prompt", "x"
        )
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (name, err)


def test_vocabulary_mismatch(tiny_dir, capsys):
    t, d = tiny_dir("qwen3"), tiny_dir("qwen3", vocab_size=288)
    rc, _, err = run_main(capsys, "--target", str(t), "--draft", str(d), "--prompt", "x")
    assert rc == 2 and "vocabulary size 288 differs" in err


def test_no_traceback_from_a_real_process(tmp_path):
    """The user-facing path through the interpreter: exit 2, one stderr line, no traceback."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime.generate",
            "--target",
            str(tmp_path / "nope"),
            "--method",
            "ar",
            "--prompt",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().startswith("runtime.generate: error:")


def test_emulate_labels_and_pads(tiny_dir, capsys):
    t = tiny_dir("qwen3")
    rc, out, _ = run_main(
        capsys,
        "--target",
        str(t),
        "--draft",
        str(t),
        "--prompt",
        "hi",
        "--max-tokens",
        "4",
        "--emulate",
        "m3-max:qwen3-0.6b",
        "--json",
    )
    s = json.loads(out)["stats"]
    assert rc == 0 and s["emulated"] == "emulated:m3-max:qwen3-0.6b+qwen3-4L-64d"  # target+draft
    # auto's probe ran the draft in a process, as mirror would under --emulate; the run ended it
    assert not [p for p in mp.active_children() if p.name == "duet-draft-process"]
    target = s["emulation"]["stages"]["target"]
    assert (
        target["count"] >= 1
        and target["emulated_s"] >= max(target["predicted_s"], target["measured_s"]) * 0.99
    )


def test_emulate_unknown_profile(tiny_dir, capsys):
    t = tiny_dir("qwen3")
    err = refusal(
        capsys,
        "--target",
        str(t),
        "--method",
        "ar",
        "--prompt",
        "hi",
        "--emulate",
        "no-such-device",
    )
    assert "no-such-device" in err
