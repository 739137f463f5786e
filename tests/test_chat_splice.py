"""Multi-turn chats keep every earlier turn (issue 57): the earlier answers stay the ids that
were generated, each turn prefills only the new message and the template's own tokens
(runtime/chat_splice.py), on the ChatML, Llama 3 and Gemma 3 template shapes over the tiny
byte-level checkpoints and on SmolLM2's real template; greedy answers equal a fresh run on the
whole conversation; apps.server's next request of a conversation reuses the whole exchange."""

from __future__ import annotations

import json
import shutil

import pytest

from runtime.backends import load_model
from runtime.chat_session import ChatSession
from runtime.chat_splice import MISMATCH, SPLICED, splice
from runtime.chat_template import ChatTemplate
from runtime.decoding import Sampling, make_steps, run
from runtime.decoding.events import common_prefix
from runtime.tokenizer import Tokenizer

TEMPLATES = {  # the families' shapes: role headers, end markers, `trim` on the content
    "chatml": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "llama3": "<|endoftext|>{% for m in messages %}<|start_header_id|>{{ m.role }}"
    "<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    "gemma3": "{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
}
QUESTIONS = ["hello there", "and then?", "tell me more", "why?"]


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def templated(request, tiny_dir, tmp_path_factory):
    """(name, target dir with the template, draft dir): the tiny Qwen3 pair with a context
    that holds every turn (the byte tokenizer spells each marker out) and <|im_end|> as EOS."""
    src = tiny_dir("qwen3", max_context=1024, eos_token_id=258)
    draft = tiny_dir("qwen3", num_layers=1, seed=1, max_context=1024, eos_token_id=258)
    d = tmp_path_factory.mktemp(request.param)
    shutil.copytree(src, d, dirs_exist_ok=True)
    cfg = {"chat_template": TEMPLATES[request.param], "tokenizer_class": "PreTrainedTokenizerFast"}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return request.param, d, draft


def fresh(target, seq: list[int], n: int, eos=()) -> list[int]:
    """The target's greedy answer to `seq` from empty caches."""
    steps = make_steps("ar", target, None, seq, max_new=n, sampling=Sampling(), seed=0)
    return run(steps, max_new=n, eos_ids=eos).tokens


def chat_turns(s: ChatSession, tpl: ChatTemplate):
    """Per turn: (held before it, its prompt ids, its answer ids, the full rendering's text)."""
    for q in QUESTIONS:
        held = list(s.tokens)
        out = [t for toks in s.answer(q) for t in toks]
        seq = s.tokens[: len(s.tokens) - len(out)]
        yield held, seq, out, tpl.render_text(s._messages(s.turns[:-1], q))


def test_sampled_turns_prefill_only_what_is_new(templated):
    name, d, draft_dir = templated
    tpl, tok = ChatTemplate.load(d), Tokenizer(d)
    t, dr = load_model(d, "mlx"), load_model(draft_dir, "mlx")
    notes = []
    s = ChatSession(
        t,
        dr,
        tok,
        method="sd",
        gamma=3,
        sampling=Sampling(1.0, 1.0),
        max_tokens=24,
        template=tpl,
        notify=notes.append,
    )
    broke, lost, answer = 0, 0, []  # answers whose ids do not come back from their text,
    # turns where re-tokenizing the rendering would prefill an earlier answer again; last answer
    for held, seq, out, text in chat_turns(s, tpl):
        assert tpl.decode(seq) == text  # the splice is the full rendering, as text
        whole = len(held) - (bool(held) and held[-1] in s.eos)
        trimmed = tok.decode(answer).strip() != tok.decode(answer)  # `trim` re-renders it
        if held and (name == "chatml" or not trimmed):  # every id kept: only the new text
            assert seq[:whole] == held[:whole] and s.splice.how in (SPLICED, "prefix")
            new = tpl.encode(text[len(tpl.decode(held[:whole])) :])
            assert seq[whole:] == new
            assert len(new) <= s.last_stats.prefill_tokens <= len(new) + 1 + (whole < len(held))
            lost += common_prefix(held, tpl.encode(text)) < whole
        assert common_prefix(held, seq) >= len(held) - len(answer) - 1  # earlier turns kept
        answer = out[:-1] if out and out[-1] in s.eos else out
        broke += tpl.encode(tpl.decode(answer)) != answer
    assert broke and lost, "the sampled answers should include ids that do not round-trip"
    assert len(notes) <= 1 and not [n for n in notes if "cannot be spliced" in n]


def test_greedy_turns_equal_a_fresh_run(templated):
    name, d, draft_dir = templated
    tpl, tok = ChatTemplate.load(d), Tokenizer(d)
    t, dr = load_model(d, "mlx"), load_model(draft_dir, "mlx")
    s = ChatSession(t, dr, tok, method="sd", gamma=3, max_tokens=12, template=tpl)
    for _, seq, out, text in chat_turns(s, tpl):
        assert tpl.decode(seq) == text
        assert out == fresh(t, seq, 12, s.eos)  # the reused caches change nothing, token for token


def smollm2():
    from runtime.registry import cached_checkpoint, pull_command

    d = cached_checkpoint("smollm2-135m-instruct")
    if d is None:
        pytest.skip(
            f"smollm2-135m-instruct is not pulled: `{pull_command('smollm2-135m-instruct')}`"
        )
    return d


@pytest.mark.real
def test_a_non_round_trip_answer_is_spliced_on_smollm2_template():
    """SmolLM2's real template and tokenizer (no weights read): an answer held as ids the text
    would not re-tokenize to keeps them all; only the template's tokens and the message follow."""
    tpl = ChatTemplate.load(smollm2())
    first = [{"role": "user", "content": "What is the capital of France?"}]
    answer = "Paris is the capital of France."
    odd = [i for ch in answer for i in tpl.encode(ch)]  # one token a character: not canonical
    assert tpl.decode(odd) == answer and tpl.encode(answer) != odd
    held = tpl.render(first) + odd + tpl.encode("<|im_end|>")
    convo = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
    text = tpl.render_text(convo)
    sp = splice(held, text, tpl)
    assert sp.how == SPLICED and sp.kept == len(held) and sp.ids[: len(held)] == held
    assert sp.ids[len(held) :] == tpl.encode(
        "\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tpl.decode(sp.ids) == text
    plain = tpl.render(convo)
    assert common_prefix(held, plain) < len(held) - len(odd) + 2  # what re-tokenizing kept


@pytest.mark.real
@pytest.mark.parametrize("sampling", [Sampling(0.7, 0.9), Sampling()], ids=["sampled", "greedy"])
def test_smollm2_turns_prefill_only_what_is_new(sampling):
    """SmolLM2 on its real template: each turn prefills the new message and the template's
    tokens (plus the last answer token, never fed); greedy answers equal a fresh run."""
    from runtime.api import eos_ids
    from runtime.loading import load_pair

    p = load_pair(str(smollm2()), None, need_draft=False, target_backend="torch")
    tpl = ChatTemplate.load(p.target_dir)
    s = ChatSession(
        p.target,
        None,
        p.tokenizer,
        method="ar",
        sampling=sampling,
        max_tokens=16,
        template=tpl,
        eos=eos_ids(p),
    )
    for held, seq, out, text in chat_turns(s, tpl):
        assert tpl.decode(seq) == text and seq[: len(held)] == held
        new = len(seq) - len(held)
        assert new <= s.last_stats.prefill_tokens <= new + 1
        if sampling.greedy:
            assert out == fresh(p.target, seq, 16, s.eos)


def test_a_tokenizer_that_cannot_splice_falls_back_to_the_common_prefix():
    class Lossy:  # decode forgets case: no splice decodes back to the text
        def encode(self, text):
            return [ord(c) for c in text]

        def decode(self, ids):
            return "".join(chr(i) for i in ids).lower()

    sp = splice([ord(c) for c in "Ab"], "abC", Lossy())  # "Ab" reads as "ab", yet "abc" != "abC"
    assert sp.how == MISMATCH and sp.ids == [ord(c) for c in "abC"] and sp.kept == 0


def test_server_conversation_reuses_the_whole_first_exchange(templated):
    """Two requests of one conversation, the second sending the first answer back as text:
    its cached_tokens covers the whole first exchange, its ids are the kept ones."""
    from apps.server.engine import Engine
    from apps.server.requests import chat_request
    from runtime.loading import load_pair

    name, d, _ = templated
    engine = Engine(load_pair(str(d), None, need_draft=False), method="ar", model_id="t")
    msgs = [{"role": "user", "content": "hello there"}]
    body = {"messages": msgs, "max_tokens": 16, "temperature": 1.0, "seed": 3}
    req = chat_request(body)
    first = engine.job(engine.prompt_ids(req), req)
    list(first)
    exchange = first.ids + first.out
    msgs = msgs + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "ok"}]
    req = chat_request({**body, "messages": msgs, "temperature": 0.0})
    plain = engine.prompt_ids(req)
    second = engine.job(plain, req)
    list(second)
    answer = first.out[:-1] if first.out and first.out[-1] in engine.eos else first.out
    if name == "chatml" or engine.tok.decode(answer).strip() == engine.tok.decode(answer):
        whole = len(exchange) - (len(answer) < len(first.out))
        assert second.usage()["prompt_tokens_details"]["cached_tokens"] >= whole
        assert second.ids[:whole] == exchange[:whole]
    assert engine.template.decode(second.ids) == engine.template.render_text(msgs)
    assert second.out == fresh(engine.pair.target, second.ids, 16, engine.eos)


def test_the_turns_bench_reports_prefill_against_new_tokens(tiny_dir, tmp_path, capsys):
    """`apps.bench turns` (Duet alone): each turn's prefill, the turn's new tokens by the
    template, and a cold first token; turns 2.. prefill what is new (plus the last answer
    token, never fed)."""
    from apps.bench.turns import main

    d = tmp_path / "chatml"
    shutil.copytree(tiny_dir("qwen3", max_context=1024, eos_token_id=258), d)
    cfg = {"chat_template": TEMPLATES["chatml"], "tokenizer_class": "PreTrainedTokenizerFast"}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    argv = ["--target", str(d), "--no-peers", "--turns", "3", "--repeats", "1"]
    assert main([*argv, "--max-tokens", "6", "--temp", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    turns = res["duet_turns"]
    assert len(turns) == 3 and turns[0]["prefill"] == turns[0]["new"]
    assert all(0 < t["prefill"] <= t["new"] + 1 for t in turns[1:])
    assert res["prefill_over_new"] <= 2 and res["duet_first_token_s"][0] > 0
