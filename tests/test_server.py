"""apps.server through the real `openai` client: the same tokens as runtime.generate, streams,
an interrupted stream, the queue, and OpenAI-style errors (401, 400 with the context length)."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import openai_client, served

openai = pytest.importorskip("openai")

KEY = "test-key"
PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def server(pair_dirs):
    """`python -m apps.server` on a free port with sd, a key and no waiting room (queue 0)."""
    t, d = pair_dirs
    args = ["--target", str(t), "--draft", str(d), "--draft-backend", "torch", "--method", "sd",
            "--gamma", "3", "--api-key", KEY, "--queue", "0", "--model-id", "tiny"]  # fmt: skip
    with served(args) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, KEY)


@pytest.fixture(scope="module")
def ar_reference(pair_dirs):
    """runtime.generate --method ar --json on the same target (in-process: the same code path)."""
    from runtime.generate import build_parser, generate

    t, _ = pair_dirs
    a = build_parser().parse_args(
        ["--target", str(t), "--method", "ar", "--prompt", PROMPT, "--max-tokens", "24", "--json"]
    )
    return generate(a)


def test_greedy_completion_equals_ar(client, ar_reference):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    c = r.choices[0]
    assert c.token_ids == ar_reference["tokens"]  # token for token (the server's extra field)
    assert c.text == ar_reference["text"] and c.finish_reason == "length"
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens) == (len(PROMPT), 24)  # byte tokenizer
    spec = u.speculative
    assert spec["method"] == "sd" and spec["steps"] >= 24 / 4
    assert spec["mean_accepted"] == pytest.approx(24 / spec["steps"])
    assert 0 <= spec["acceptance_rate"] <= 1


def test_stream_equals_non_stream(client, ar_reference):
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ar_reference["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # really streamed


def test_chat_stream_and_stop(client, ar_reference):
    ref = ar_reference["text"]
    msgs = [{"role": "user", "content": PROMPT}]  # no chat template: plain completion
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0)
    assert full.choices[0].message.content == ref
    stop = ref[5:7]  # a string the answer contains: the answer ends just before it
    s = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=24, temperature=0, stop=[stop], stream=True
    )
    parts = list(s)
    text = "".join(p.choices[0].delta.content or "" for p in parts)
    assert text == ref[: ref.find(stop)]
    assert parts[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, top_p=0.9)
    a = client.completions.create(seed=7, **kw).choices[0].token_ids
    b = client.completions.create(seed=7, **kw).choices[0].token_ids
    assert a == b and len(a) == 16


def test_interrupted_stream_stops_and_keeps_caches(server, client, ar_reference):
    s = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=200, temperature=0, stream=True
    )
    next(iter(s))
    s.close()  # the client goes away after the first chunk
    # --queue 0: until the server has seen the disconnect and closed the job, it answers 429
    after = client.with_options(max_retries=8).completions.create(
        model="tiny", prompt=PROMPT, max_tokens=24, temperature=0
    )
    assert after.choices[0].token_ids == ar_reference["tokens"]  # caches were left consistent
    recent = httpx.get(server + "/health").json()["recent"]
    cut = recent[-2]  # the interrupted one, closed before the next request was let in
    assert cut["finish"] == "cancelled" and cut["completion_tokens"] < 200


def test_full_queue_answers_429_at_once(client):
    s = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=200, temperature=0, stream=True
    )
    try:
        next(iter(s))  # running now, and --queue 0 leaves no waiting room
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model="tiny", prompt="x", max_tokens=2)
        assert e.value.body["code"] == "queue_full"
    finally:
        s.close()


def test_wrong_key_is_401(server):
    bad = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_over_long_prompt_is_400_naming_the_context(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x" * 300, max_tokens=2)
    assert e.value.status_code == 400
    assert "maximum context length is 256 tokens" in e.value.message
    assert e.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": PROMPT, "temperature": 5}, "temperature"),
        ({"prompt": PROMPT, "top_p": 0}, "top_p"),
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": PROMPT, "n": 2}, "n"),
        ({"prompt": PROMPT, "stop": [""]}, "stop"),
        ({"prompt": [1, 99999]}, "prompt"),
        ({"max_tokens": 2}, "prompt"),
    ],
)
def test_bad_fields_are_400(server, body, param):
    r = httpx.post(
        server + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_bad_json_and_bad_messages_are_400(server):
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(server + "/v1/chat/completions", content=b"{not json", headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(
        server + "/v1/chat/completions",
        headers=h,
        content=json.dumps({"messages": [{"role": "robot", "content": "hi"}]}),
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"


def test_models_lists_the_pair(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]  # --model-id


def test_an_unknown_model_is_openais_404_naming_the_held_one(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=2)
    err = e.value.body
    assert e.value.status_code == 404 and err["code"] == "model_not_found"
    assert err["param"] == "model" and "'gpt-4o'" in err["message"] and "'tiny'" in err["message"]


def test_a_non_loopback_host_needs_a_key(capsys):
    from apps.server.__main__ import build_parser, main

    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2  # refused before any bind or load
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to serve on 0.0.0.0 without --api-key" in err[0]
    assert "--allow-no-key" in err[0] and "--allow-no-key" in build_parser().format_help()


def test_a_target_alone_serves_ar_under_its_own_name(pair_dirs):
    """Issue 40: --target without --draft serves (ar), and /v1/models names the model."""
    t, _ = pair_dirs
    with served(["--target", str(t)]) as url:
        c = openai_client(url)
        assert [x.id for x in c.models.list().data] == [t.name]
        r = c.completions.create(model=t.name, prompt=PROMPT, max_tokens=4, temperature=0)
        assert r.usage.speculative["method"] == "ar" and r.usage.completion_tokens == 4


def test_chat_uses_the_checkpoint_template(pair_dirs, tmp_path):
    """In-process: a checkpoint with a chat template renders messages with it, and the engine's
    greedy answer is the target's own greedy continuation of that rendering."""
    import shutil

    from apps.server.engine import Engine
    from apps.server.requests import chat_request
    from runtime.decoding import make_steps, run
    from runtime.decoding.events import GREEDY
    from runtime.loading import load_pair
    from runtime.tokenizer import Tokenizer

    d = tmp_path / "templated"
    shutil.copytree(pair_dirs[0], d)
    tpl = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": tpl, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    p = load_pair(str(d), None, need_draft=False)
    engine = Engine(p, method="ar", model_id="t")
    req = chat_request(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    )
    ids = engine.prompt_ids(req)
    assert ids == Tokenizer(d).encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    job = engine.job(ids, req)
    list(job)
    want = run(
        make_steps("ar", p.target, None, ids, max_new=8, sampling=GREEDY, seed=0), max_new=8
    ).tokens
    assert job.out == want and job.finish == "length" and job.usage()["completion_tokens"] == 8
