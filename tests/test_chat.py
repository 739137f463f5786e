"""runtime.chat: the pipe contract, commands, and KV caches kept across turns."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.backends import load_model
from runtime.chat_session import ChatSession
from runtime.chat_template import ChatTemplate
from runtime.decoding import Sampling, make_steps, run
from runtime.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(pair_dirs):
    t, d = pair_dirs
    return load_model(t, "mlx"), load_model(d, "mlx"), Tokenizer(t)


def chat_cmd(pair_dirs, max_tokens: int, *extra: str) -> list[str]:
    """`python -m runtime.chat` with sd on the tiny MLX pair."""
    t, d = pair_dirs
    pair = ["--target", str(t), "--draft", str(d), "--draft-backend", "mlx"]
    opts = ["--max-tokens", str(max_tokens), "--method", "sd", *extra]
    return [sys.executable, "-m", "runtime.chat", *pair, *opts]


def chat(pair_dirs, stdin: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = chat_cmd(pair_dirs, 12, *extra)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_pipe_two_answers_with_reset(pair_dirs):
    r = chat(pair_dirs, "hello\n/reset\nagain\n")
    assert r.returncode == 0, r.stderr
    stats = [ln for ln in r.stderr.splitlines() if ln.startswith("[sd]")]
    assert len(stats) == 2, r.stderr
    assert all("tok/s" in s and "mean accepted" in s and "acceptance" in s for s in stats)
    assert "[conversation reset]" in r.stderr
    assert ">>>" not in r.stdout  # no prompt decoration when stdin is a pipe
    assert r.stdout.endswith("\n") and r.stdout.count("\n") >= 2  # random text may hold newlines


def test_eof_and_help_and_quit(models, monkeypatch, capsys):
    import io

    from runtime.chat import repl

    t, d, tok = models
    session = ChatSession(t, None, tok, method="ar", max_tokens=4)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert repl(session, interactive=False) == 0  # EOF at once: clean exit
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(sys, "stdin", io.StringIO("/help\n/quit\nnever answered\n"))
    assert repl(session, interactive=False) == 0
    r = capsys.readouterr()
    assert "/reset" in r.out and "[ar]" not in r.err and session.n_answers == 0


def test_bad_argument_is_one_line(pair_dirs):
    r = chat(pair_dirs, "", "--gamma", "0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


class Counting:
    """Wraps a CausalLM and records how many tokens each forward was given."""

    def __init__(self, model):
        self.m, self.fed = model, []

    def __getattr__(self, name):
        return getattr(self.m, name)

    def forward(self, tokens, cache, **kw):
        self.fed.append(np.asarray(tokens).shape[-1])
        return self.m.forward(tokens, cache, **kw)


def fresh_greedy(target, seq: list[int], n: int) -> list[int]:
    return run(
        make_steps("ar", target, None, seq, max_new=n, sampling=Sampling(), seed=0), max_new=n
    ).tokens


def test_cache_kept_across_turns(models):
    t, d, tok = models
    ct = Counting(t)
    s = ChatSession(ct, d, tok, method="sd", gamma=3, max_tokens=8)
    first = [x for toks in s.answer("hello") for x in toks]
    assert s.last_stats.prefill_tokens == len(tok.encode("hello"))
    history = list(s.tokens)
    ct.fed.clear()
    second = [x for toks in s.answer("again") for x in toks]
    new = tok.encode("\nagain")
    # only the new tokens, plus the last answer token whose KV was never written
    assert len(new) <= s.last_stats.prefill_tokens <= len(new) + 1 < len(history)
    # the target's first forward of turn 2 sees only the new tokens (+ the last answer token
    # when its KV was not written yet) plus the draft window, never the earlier turns
    assert ct.fed[0] <= len(new) + 1 + 3
    assert s.tcache.offset <= len(s.tokens) and s.tokens == history + new + second
    # lossless with a reused cache: equals the target's greedy continuation from scratch
    assert second == fresh_greedy(t, history + new, 8)
    assert len(first) == 8


def test_stopped_answer_leaves_session_consistent(models):
    t, d, tok = models
    s = ChatSession(t, d, tok, method="sd", gamma=4, max_tokens=16)
    gen = s.answer("stop me")
    next(gen)
    gen.close()  # what Ctrl-C does
    assert s.tcache.offset <= len(s.tokens) and s.dcache.offset <= len(s.tokens)
    history = list(s.tokens)
    second = [x for toks in s.answer("next") for x in toks]
    assert second == fresh_greedy(t, history + tok.encode("\nnext"), 16)


def test_history_over_context_drops_oldest_turns(models):
    t, d, tok = models  # context 256 tokens
    notes = []
    s = ChatSession(t, d, tok, method="ar", max_tokens=40, notify=notes.append)
    for i in range(8):
        for _ in s.answer(f"turn {i} " + "x" * 30):
            pass
        assert len(s.tokens) <= t.config.max_context
    assert any("dropped" in n for n in notes)
    for _ in s.answer("y" * 600):  # one message longer than the context
        pass
    assert any("keeping its last" in n for n in notes)


def test_chat_template_is_used_when_present(pair_dirs, tmp_path):
    src, _ = pair_dirs
    d = tmp_path / "templated"
    shutil.copytree(src, d)
    assert ChatTemplate.load(d) is None
    tpl = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": tpl,
                "eos_token": "<|im_end|>",
            }
        )
    )
    ct = ChatTemplate.load(d)
    ids = ct.render([{"role": "user", "content": "hi"}])
    tok = Tokenizer(d)
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_ctrl_c_stops_the_answer_not_the_session(pair_dirs):
    import signal

    cmd = chat_cmd(pair_dirs, 1000)  # answers run to the context limit
    # A shell without job control starts background jobs with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give the child a terminal's default disposition.
    p = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    p.stdin.write(b"hello\n")
    p.stdin.flush()
    first = p.stdout.read(1)  # the answer is streaming
    p.send_signal(signal.SIGINT)
    p.stdin.write(b"second\n")
    p.stdin.close()
    assert p.wait(timeout=120) == 0
    out, err = first + p.stdout.read(), p.stderr.read().decode()
    stats = [ln for ln in err.splitlines() if ln.startswith("[sd]")]
    assert b"[stopped]" in out and len(stats) == 2, err
    n_first = int(stats[0].split()[1])
    assert n_first < int(stats[1].split()[1])


def test_the_chat_defaults_to_auto_and_says_what_it_picked(pair_dirs, tmp_path):
    """Issue 11: `--method auto` is the chat's default; it says the first answer measures the
    pair, and /stats names the pick; the answer is the target's own (greedy: equal to ar). A
    second chat on the pair reads the kept measurements and says so."""
    from runtime.chat import build_parser

    assert build_parser().parse_args([]).method == "auto"
    t, d = pair_dirs
    cmd = [sys.executable, "-m", "runtime.chat", "--target", str(t), "--draft", str(d),
           "--target-backend", "torch", "--draft-backend", "onnx", "--max-tokens", "8",
           "--temp", "0"]  # fmt: skip
    env = dict(os.environ, DUET_CACHE_DIR=str(tmp_path))  # nothing kept yet
    r = subprocess.run(
        cmd, input="hello\n/stats\n", capture_output=True, text=True, cwd=ROOT, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "[auto: measuring this pair on this machine during the first answer" in r.stderr
    again = subprocess.run(
        cmd, input="hello\n", capture_output=True, text=True, cwd=ROOT, timeout=300, env=env
    )
    assert again.returncode == 0, again.stderr
    assert "[auto: using the measurements of this pair on this machine kept in" in again.stderr
    ref = subprocess.run(
        [*cmd, "--method", "ar"],
        input="hello\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert ref.returncode == 0, ref.stderr
    assert r.stdout.startswith(ref.stdout)  # the answer, then /stats with the pick
    assert "auto picked" in r.stdout[len(ref.stdout) :]
    assert again.stdout == ref.stdout  # the kept figures pick as well, and stay lossless


def test_the_chat_samples_by_default_from_generation_config(pair_dirs, tmp_path):
    """Issue 44: a chat samples by default, at generation_config.json's temperature and top-p
    when it sets both, else 0.7 / 0.9; --temp 0 is greedy."""
    from runtime.chat import build_parser, check_args, make_session

    t, d = pair_dirs
    g = tmp_path / "genconf"
    shutil.copytree(t, g)
    (g / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95}))
    base = ["--draft", str(d), "--draft-backend", "mlx", "--method", "sd"]
    for target, extra, want in (
        (t, [], (0.7, 0.9)),
        (g, [], (0.6, 0.95)),
        (g, ["--temp", "0"], (0.0, 0.95)),
        (g, ["--top-p", "0.5"], (0.6, 0.5)),
    ):
        a = build_parser().parse_args(["--target", str(target), *base, *extra])
        check_args(a)
        s = make_session(a, notify=lambda m: None).sampling
        assert (s.temp, s.top_p) == want, (target, extra)
    assert a.temp == 0.6  # resolved on the arguments too, for what reads them later


def test_without_a_template_it_says_so_once_and_stats_speak_plainly(pair_dirs):
    r = chat(pair_dirs, "hello\n/stats\nagain\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("no chat template: each line you type is continued as plain text") == 1
    stats = r.stdout[r.stdout.index("speculating with sd") :]
    assert stats.startswith("speculating with sd, 4 tokens ahead: ") and "tokens per step" in stats
    assert "details: [sd]" in stats


def test_a_target_alone_chats(pair_dirs):
    t, _ = pair_dirs
    cmd = [sys.executable, "-m", "runtime.chat", "--target", str(t), "--target-backend", "torch",
           "--max-tokens", "6", "--temp", "0"]  # fmt: skip
    r = subprocess.run(
        cmd, input="hello\n/stats\n", capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "] 6 tokens, " in r.stderr  # auto ran ar, or sd with a model-free draft
    assert "the target alone (no speculation): 6 tokens" in r.stdout or re.search(
        r"speculating with sd, \d+ tokens ahead: ", r.stdout
    )
