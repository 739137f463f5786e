"""runtime/session.py: the one code that drives a method. Its stream matches the raw steps,
keeps caches a caller passes in, adds the method's own summary and teaches auto's chooser."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.decoding import make_steps, run
from runtime.decoding.events import GREEDY
from runtime.errors import DuetError
from runtime.session import GenerationSession, record_for

PROMPT = [3, 14, 15, 92, 65, 35]


@pytest.fixture(scope="module")
def pair(tiny_dir):
    from runtime.backends import load_model

    target = load_model(tiny_dir("llama"), "torch")
    draft = load_model(tiny_dir("llama", num_layers=1, seed=4), "onnx", intra_threads=1)
    return SimpleNamespace(target=target, draft=draft, tokenizer=None, settings={})


@pytest.mark.parametrize("method", ["ar", "sd", "mirror"])
def test_a_session_commits_what_the_raw_steps_commit(pair, method):
    draft = pair.draft if method != "ar" else None
    steps = make_steps(
        method, pair.target, draft, PROMPT, max_new=12, sampling=GREEDY, seed=0, gamma=3
    )
    raw = run(steps, max_new=12)
    session = GenerationSession(pair, method=method, options={"gamma": 3}, eos=())
    rs = list(session.stream(PROMPT, 12))
    assert [t for r in rs for t in r.tokens] == raw.tokens
    stats = rs[-1].stats.extra
    assert stats["method"] == method and stats["finish"] == "length"
    assert ("mirror" in stats) == (method == "mirror")  # the method's own summary
    if method == "mirror":
        assert stats["kappa"] == 8 and session.timeline is not None


def test_caches_passed_in_hold_committed_tokens_after_an_early_close(pair):
    tc, dc = pair.target.new_cache(), pair.draft.new_cache()
    session = GenerationSession(pair, method="sd", options={"gamma": 3}, eos=())
    gen = session.stream(PROMPT, 20, target_cache=tc, draft_cache=dc)
    out = next(gen).tokens + next(gen).tokens
    gen.close()
    assert tc.offset <= len(PROMPT) + len(out) and tc.offset >= len(PROMPT)


def test_auto_asks_its_chooser_and_reports_back(pair):
    seen = []

    def chooser(ids, sampling, **caches):
        assert set(caches) == {"target_cache", "draft_cache"}  # fresh: the probe prefills them
        return "sd", {"choice": "sd", "gamma": 2, "why": "test"}

    def observe(rec, sampling, tokens, seconds, accept_lengths, branch_hits=None):
        seen.append((rec["choice"], tokens))

    chooser.observe = observe
    session = GenerationSession(pair, method="auto", chooser=chooser, summarize=False, eos=())
    rs = list(session.stream(PROMPT, 8))
    stats = rs[-1].stats.extra
    assert stats["method"] == "sd" and stats["gamma"] == 2 and stats["auto"]["why"] == "test"
    assert seen == [("sd", 8)] and "mirror" not in stats
    with pytest.raises(DuetError, match="auto needs a chooser"):
        GenerationSession(pair, method="auto")


def test_the_target_records_what_the_running_draft_reads():
    target = SimpleNamespace(record_hidden=True, record_layers=(1, 2))
    mtp = SimpleNamespace(reads_target_hidden=True, head_module=SimpleNamespace())
    record_for(target, mtp)
    assert target.record_hidden and target.record_layers is None
    head = SimpleNamespace(head_module=SimpleNamespace(layers_tapped=(3, 5)))
    record_for(target, head)
    assert not target.record_hidden and target.record_layers == (3, 5)
    record_for(target, None)  # ar: nothing to record
    assert not target.record_hidden and target.record_layers is None
    from runtime.drafts.mixed import MixedDraft  # head+suffix: the head's taps still recorded

    fitted = SimpleNamespace(
        config=None, reads_target_hidden=True, head_module=SimpleNamespace(layers_tapped=(0, 2))
    )
    record_for(target, MixedDraft(fitted, free=None))
    assert target.record_hidden and target.record_layers == (0, 2)


def test_a_methods_bad_option_is_one_line_before_any_step(pair):
    with pytest.raises(DuetError, match="--kappa must be at least 1"):
        GenerationSession(pair, method="mirror", options={"kappa": 0})
