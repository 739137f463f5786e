"""`--draft mtp`: the target checkpoint's own multi-token-prediction head as the draft —
lossless on a random checkpoint with `mtp.*` weights, refused in one line without them."""

import numpy as np
import pytest
from decode_helpers import ar_greedy, greedy_run

from runtime.backends import load_model
from runtime.drafts.mtp.torch import MTPDraft
from runtime.errors import DuetError

PROMPT = [5, 17, 42, 99, 7]
N_NEW = 16
ATOL = 1e-4  # the head's KV entries: one token at a time vs after recomputation


@pytest.fixture(scope="module")
def target_dir(tiny_dir):
    return tiny_dir("qwen3_5_text", seed=1, mtp=True)


def test_sd_with_the_mtp_head_equals_ar(target_dir):
    target = load_model(target_dir, "torch", threads=1)
    ar = ar_greedy(target, PROMPT, N_NEW)
    draft = MTPDraft.load(target, target_dir)
    tc, dc = target.new_cache(), draft.new_cache()
    got = greedy_run("sd", target, draft, PROMPT, N_NEW, gamma=3, target_cache=tc, draft_cache=dc)
    assert got.tokens == ar
    # every head entry the target has verified was (re)computed from the target's hidden state
    n = min(tc.offset, len(dc.exact))
    assert n > len(PROMPT) and all(dc.exact[:n])
    fresh = draft.new_cache()
    draft.forward(np.array([dc.tokens]), fresh)
    k, _ = dc.kv.get(0)
    np.testing.assert_allclose(k[:, :, :n].numpy(), fresh.kv.get(0)[0][:, :, :n].numpy(), atol=ATOL)


def test_mtp_draft_is_refused_without_mtp_weights(tiny_dir):
    plain = tiny_dir("qwen3_5_text", seed=1)
    with pytest.raises(DuetError, match="no mtp.\\* weights"):
        MTPDraft.load(load_model(plain, "torch", threads=1), plain)


def test_generate_cli_takes_draft_mtp(target_dir, tiny_dir, capsys):
    from runtime.generate import main

    assert (
        main(
            [
                "--target",
                str(target_dir),
                "--draft",
                "mtp",
                "--method",
                "sd",
                "--prompt-ids",
                "5,17,42",
                "--max-tokens",
                "4",
                "--json",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "--target",
                str(tiny_dir("qwen3_5_text", seed=1)),
                "--draft",
                "mtp",
                "--method",
                "sd",
                "--prompt-ids",
                "5,17",
                "--max-tokens",
                "4",
            ]
        )
        == 2
    )
    assert "no mtp.* weights" in capsys.readouterr().err


def test_sd_drafts_the_first_window_from_the_target_hidden_states(target_dir):
    """sd feeds the target the prompt before the head's first window, so no window is drafted
    from zero hidden states (a blind window, almost all rejected); output still equals ar."""
    target = load_model(target_dir, "torch", threads=1)
    ar = ar_greedy(target, PROMPT, N_NEW)
    draft = MTPDraft.load(target, target_dir)

    def blind(n):
        raise AssertionError(f"the head drafted {n} entries without the target's hidden state")

    draft.step.zeros = blind
    assert greedy_run("sd", target, draft, PROMPT, N_NEW, gamma=3).tokens == ar


def test_generates_default_auto_takes_draft_mtp_and_stays_lossless(target_dir, capsys):
    """auto (generate's default) with the MTP head: a draft that drafts one row only, so
    mirror cannot run and nothing in the probe may fork its rows; greedy equals ar."""
    import json

    from runtime.generate import main

    common = ["--target", str(target_dir), "--draft", "mtp", "--prompt-ids", "5,17,42",
              "--max-tokens", "6", "--json"]  # fmt: skip
    assert main([*common, "--method", "ar"]) == 0
    ref = json.loads(capsys.readouterr().out)["tokens"]
    assert main(common) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tokens"] == ref and res["stats"]["auto"]["choice"] in ("ar", "sd")
    assert "mirror" not in res["stats"]["auto"]["predictions"]


@pytest.fixture(scope="module")
def embedded_copy(tmp_path_factory):
    """The embedded target (Qwen3, with its MTP head as a sidecar), copied: the ONNX target
    and the head's step are exported beside it."""
    import shutil

    from runtime.assets import default_pair

    src = default_pair()[0]
    dst = tmp_path_factory.mktemp("embedded") / "target"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data"))
    return dst


@pytest.mark.parametrize("step", ["torch", "onnx"])
def test_the_mtp_head_beside_the_onnx_target_is_lossless(embedded_copy, step):
    """The int4 ONNX target keeps its normed last hidden state for the head (through the
    checkpoint's final norm): greedy sd with the head equals that target's own ar."""
    from runtime.backends.onnx.target import OnnxTargetLM

    target = OnnxTargetLM(embedded_copy, "int4", intra_threads=1)
    ar = ar_greedy(target, PROMPT, N_NEW)
    draft = MTPDraft.load(target, embedded_copy, backend=step)
    tc, dc = target.new_cache(), draft.new_cache()
    got = greedy_run("sd", target, draft, PROMPT, N_NEW, gamma=3, target_cache=tc, draft_cache=dc)
    assert got.tokens == ar
    assert tc.hidden_ids[: len(PROMPT)] == PROMPT and got.stats.as_dict()["mean_accepted"] > 1.0


def test_mirror_with_the_mtp_head_is_one_line(capsys):
    """Mirror-SD's draft worker rolls out branch rows, which the MTP head cannot: the worker's
    DuetError reaches the user as one line and a non-zero exit, not a traceback."""
    from runtime.generate import main as generate

    rc = generate(
        ["--method", "mirror", "--draft", "mtp", "--prompt", "def f(x):", "--max-tokens", "8"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "--method mirror" in err[-1] and "one row" in err[-1]
