"""`converters export --format onnx --out DIR` writes a folder the real onnxruntime-genai runs,
with the same greedy tokens as our own `ar` on the checkpoint."""

import numpy as np
import pytest

from converters.__main__ import main
from runtime.errors import DuetError

og = pytest.importorskip("onnxruntime_genai")
pytestmark = pytest.mark.filterwarnings("ignore")

PROMPT = "def fib(n):"


def genai_greedy(folder, prompt: str, n: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy tokens) from onnxruntime_genai on the exported folder."""
    model = og.Model(str(folder))
    ids = [int(t) for t in og.Tokenizer(model).encode(prompt)]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(ids, dtype=np.int32))
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return ids, out


def test_genai_loads_the_folder_and_agrees(tiny_dir, tmp_path, capsys):
    src = tiny_dir("qwen3")
    out = tmp_path / "genai"
    assert main(["export", "--model", str(src), "--format", "onnx", "--out", str(out)]) == 0
    assert "genai_config.json" in capsys.readouterr().out
    for f in ("model.onnx", "genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / f).is_file(), f

    from runtime.generate import build_parser, generate

    ours = generate(
        build_parser().parse_args(
            [
                "--target",
                str(src),
                "--method",
                "ar",
                "--prompt",
                PROMPT,
                "--max-tokens",
                "16",
                "--json",
            ]
        )
    )
    ids, theirs = genai_greedy(out, PROMPT, 16)
    from runtime.tokenizer import Tokenizer

    assert ids == Tokenizer(src).encode(PROMPT)  # genai's tokenizer reads our tokenizer files
    assert len(theirs) == 16 and theirs == ours["tokens"]


def test_folder_must_be_empty(tiny_dir, tmp_path):
    from converters.onnx_genai import prepare_folder

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(DuetError, match="not an empty directory"):
        prepare_folder(tiny_dir("qwen3"), busy)


def test_embedded_draft_with_its_trained_tokenizer(tmp_path, capsys):
    """The shipped draft: a real BPE tokenizer and an EOS id; genai must encode, generate and
    decode as we do."""
    from runtime.assets import default_pair
    from runtime.generate import build_parser, generate
    from runtime.tokenizer import Tokenizer

    _, draft = default_pair()
    out = tmp_path / "draft-genai"
    assert main(["export", "--model", str(draft), "--format", "onnx", "--out", str(out)]) == 0
    prompt = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    ours = generate(
        build_parser().parse_args(
            [
                "--target",
                str(draft),
                "--method",
                "ar",
                "--prompt",
                prompt,
                "--max-tokens",
                "24",
                "--json",
            ]
        )
    )
    ids, theirs = genai_greedy(out, prompt, 24)
    assert ids == Tokenizer(draft).encode(prompt)
    assert theirs == ours["tokens"]
    model = og.Model(str(out))
    assert og.Tokenizer(model).decode(np.array(theirs, dtype=np.int32)) == ours["text"]
