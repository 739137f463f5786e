"""runtime's Python API (load, generate, stream_generate): the same path as runtime.generate."""

from __future__ import annotations

import json
import shutil

import pytest

from runtime import generate, load, stream_generate
from runtime.api import eos_ids, sampling_defaults
from runtime.errors import DuetError
from runtime.generate import main as generate_main


@pytest.fixture(scope="module")
def dirs(tiny_dir):
    return tiny_dir("qwen3"), tiny_dir("qwen3", num_layers=1, seed=9)


@pytest.fixture(scope="module")
def pair(dirs):
    t, d = dirs
    return load(str(t), str(d), target_backend="torch", draft_backend="torch")


def cli_json(capsys, *argv) -> dict:
    assert generate_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_greedy_text_equals_the_cli(dirs, pair, capsys, method):
    t, d = dirs
    ref = cli_json(
        capsys,
        "--target",
        str(t),
        "--draft",
        str(d),
        "--target-backend",
        "torch",
        "--draft-backend",
        "torch",
        "--method",
        method,
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "20",
    )
    text = generate(pair, "def f(x):", max_tokens=20, method=method)
    assert text == ref["text"] and len(ref["tokens"]) == 20


def test_stream_yields_the_same_tokens_and_the_step_figures(pair):
    ar = [t for r in stream_generate(pair, "def g(y):", 24, method="ar") for t in r.tokens]
    responses = list(stream_generate(pair, "def g(y):", 24, method="sd", gamma=3))
    sd = [t for r in responses for t in r.tokens]
    assert sd == ar and len(ar) == 24  # lossless: sd's greedy tokens are the target's own
    assert all(r.finish is None for r in responses[:-1]) and responses[-1].finish == "length"
    assert max(r.step.drafted for r in responses) == 3  # the step's own event (γ 3 at most)
    s = responses[-1].stats.as_dict()
    assert s["new_tokens"] == 24 and s["method"] == "sd" and s["steps"] == len(responses)
    assert "".join(r.text for r in responses) == pair.tokenizer.decode(ar)


def test_prompt_forms_agree(pair):
    ids = pair.tokenizer.encode("def h(z):")
    a = generate(pair, "def h(z):", max_tokens=8, method="ar")
    assert generate(pair, ids, max_tokens=8, method="ar") == a
    # chat messages without a chat template: their contents as plain text
    msgs = [{"role": "user", "content": "def h(z):"}]
    assert generate(pair, msgs, max_tokens=8, method="ar") == a


def test_messages_use_the_chat_template(dirs, tmp_path):
    t, _ = dirs
    d = tmp_path / "templated"
    shutil.copytree(t, d)
    tpl = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    (d / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tpl})
    )
    templated = load(str(d), target_backend="torch")  # a target alone: no draft loaded
    assert templated.draft is None
    msgs = [{"role": "user", "content": "hi"}]
    got = [t for r in stream_generate(templated, msgs, 6) for t in r.tokens]  # default: ar
    ref = [t for r in stream_generate(templated, "<user>hi", 6, method="ar") for t in r.tokens]
    assert got == ref


def test_sampling_is_seeded_and_max_tokens_cut_at_the_context(pair):
    a = generate(pair, "x", max_tokens=10, method="sd", temp=1.0, top_p=0.9, seed=3)
    assert a == generate(pair, "x", max_tokens=10, method="sd", temp=1.0, top_p=0.9, seed=3)
    ctx = pair.target.config.max_context
    last = list(stream_generate(pair, "x", ctx + 100, method="ar"))[-1]
    assert last.finish == "context" and last.stats.new_tokens == ctx - last.prompt_tokens


def test_bad_prompts_are_one_clear_error(pair):
    for bad, needle in (("", "empty"), ([10**9], "outside the vocabulary"), ([1.5j], "a prompt")):
        with pytest.raises(DuetError, match=needle):
            generate(pair, bad, max_tokens=4)


def test_generation_config_sets_chat_defaults_and_eos(dirs, tmp_path):
    t, _ = dirs
    assert sampling_defaults(t) == (0.7, 0.9)  # nothing in generation_config.json
    d = tmp_path / "genconf"
    shutil.copytree(t, d)
    (d / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "eos_token_id": [5, 7]})
    )
    assert sampling_defaults(d) == (0.6, 0.95)
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.6}))
    assert sampling_defaults(d) == (0.7, 0.9)  # both or neither
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    p = load(str(d), target_backend="torch")
    assert {5, 7} <= set(eos_ids(p))


def test_runtime_load_is_the_function_after_the_loader_module_is_imported():
    """`from runtime import load` is the API's function even once a command has imported the
    loading module (it was runtime/load.py, whose import set `runtime.load` to the module)."""
    import runtime.cli_args  # noqa: F401 (imports runtime.loading, as every command does)
    from runtime import load

    assert callable(load) and load.__module__ == "runtime.api"
