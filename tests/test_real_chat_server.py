"""The registry's real models through the user-facing commands: `runtime.chat` applies the
model's chat template and stops at its EOS (its greedy answer is HF's greedy answer to the same
rendered conversation), a model without a template is continued as text and says so once, and
`apps.server` names the real model on /v1/models. Marked `real` (skips, naming the pull command,
where the model is absent)."""

import subprocess
import sys
from pathlib import Path

import pytest
from server_helpers import openai_client, served

from runtime.registry import cached_checkpoint, pull_command

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France? Answer in one sentence."


def pulled(name: str) -> Path:
    d = cached_checkpoint(name)
    if d is None:
        pytest.skip(f"{name} is not pulled: `{pull_command(name)}`")
    return d


def chat(name: str, stdin: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "runtime.chat", "--target", name, "--temp", "0", "--max-tokens",
           "48"]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=600)


def test_chat_answers_with_the_template_and_stops_at_eos():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = pulled("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(d)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.inference_mode():
        y = model.generate(torch.tensor([list(ids)]), max_new_tokens=48, do_sample=False)
    new = y[0, len(ids) :].tolist()
    assert tok.eos_token_id in new, "the reference answer should end within 48 tokens"
    want = tok.decode(new[: new.index(tok.eos_token_id)])  # the text before <|im_end|>
    r = chat("smollm2-135m-instruct", QUESTION + "\n")
    assert r.returncode == 0, r.stderr
    assert want.strip() in r.stdout and "<|im_end|>" not in r.stdout
    assert "no chat template" not in r.stderr


def test_a_model_without_a_template_is_continued_as_text_said_once():
    pulled("gemma-3-270m")
    r = chat("gemma-3-270m", "The capital of France is\nThe largest planet is\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("no chat template") == 1
    assert r.stdout.strip()


def test_the_server_names_the_real_model():
    pytest.importorskip("openai")
    pulled("smollm2-135m-instruct")
    with served(["--target", "smollm2-135m-instruct"], timeout=300) as url:
        c = openai_client(url, timeout=300)
        assert [x.id for x in c.models.list().data] == ["smollm2-135m-instruct"]
        r = c.chat.completions.create(
            model="smollm2-135m-instruct",
            max_tokens=16,
            temperature=0,
            messages=[{"role": "user", "content": QUESTION}],
        )
        assert "Paris" in r.choices[0].message.content
