"""Mirror-SD with a hybrid (Qwen3.5) draft, on the torch reference and as ONNX: branch rows fork
both kinds of state, greedy output equals `ar`, and the draft's states equal a fresh prefill
of what it holds at every step and after every kind of window (reuse, resume, fallback)."""

import numpy as np
import pytest
from decode_helpers import ar_greedy, greedy_run, prefill
from test_hybrid import ATOL_STATE, PROMPT, near_copy
from test_mirror import Gate, Scripted, ee_with

import runtime.decoding.mirror as mirror_mod
from converters.onnx_hybrid_export import export_hybrid_onnx
from runtime.backends import load_model
from runtime.backends.onnx import load_onnx_lm
from runtime.backends.torch.causal_lm import TorchCausalLM
from runtime.decoding import cannot_run
from runtime.mirror.draft_worker import DraftWorker

N_NEW = 16


@pytest.fixture(scope="module")
def models(tiny_dir, tmp_path_factory):
    tdir = tiny_dir("qwen3_5_text", seed=1)
    near = near_copy(tdir)  # accepts some of each window, rejects the rest
    path = tmp_path_factory.mktemp("hybrid_mirror") / "near.onnx"
    export_hybrid_onnx(near.module, path)
    return {
        "dir": tdir,
        "target": load_model(tdir, "torch", threads=1),
        "torch_near": near,
        "onnx_near": load_onnx_lm(path, config_dir=tdir),
        "torch_small": load_model(tiny_dir("qwen3_5_text", num_layers=2, seed=2), "torch"),
    }


def state_err(model, cache, seq) -> float:
    """Largest |Δ| between `cache`'s states and a fresh prefill of seq[:offset] (same model)."""
    fresh = prefill(model, seq[: cache.offset])
    assert cache.offset == fresh.offset
    return max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max()) if np.size(a) else 0.0
        for x, y in zip(cache.states(), fresh.states(), strict=True)
        for a, b in zip(x, y, strict=True)
    )


class CheckedWorker(DraftWorker):
    """The real worker, which at the start of every step (its cache holding a prefix of
    committed + the window, before d_γ is fed) records how far its states are from a fresh
    prefill of that prefix: a fixed point of its loop, so the check does not depend on timing."""

    errors: list[float] = []

    def _extend(self, step, full):
        CheckedWorker.errors.append(state_err(self.draft, self.cache, full))
        super()._extend(step, full)


@pytest.mark.parametrize("draft", ["torch_near", "onnx_near", "torch_small"])
@pytest.mark.parametrize("exit_layer", [1, 2])  # exit after a linear / an attention layer
def test_greedy_mirror_with_a_hybrid_draft_equals_ar(models, draft, exit_layer, monkeypatch):
    target, d = models["target"], models[draft]
    monkeypatch.setattr(mirror_mod, "DraftWorker", CheckedWorker)
    CheckedWorker.errors = []
    ar = ar_greedy(target, PROMPT, N_NEW)
    dc = d.new_cache()
    r = greedy_run(
        "mirror", target, d, PROMPT, N_NEW, gamma=3, exit_layer=exit_layer, draft_cache=dc
    )
    assert r.tokens == ar
    # the worker reached at least every step whose window the target used (it may reach one
    # more before it is stopped: how far is timing, the states at each are not)
    assert len(CheckedWorker.errors) >= len(r.stats.accept_lengths) - 1
    assert max(CheckedWorker.errors) <= ATOL_STATE
    assert state_err(d, dc, PROMPT + r.tokens) <= ATOL_STATE  # what the caller gets back


@pytest.fixture(params=["torch_near", "onnx_near"])
def hybrid_draft(request, models):
    return models[request.param]


def after(sc, ids, a, c):
    """One scripted step; the next window, and the worker's state error once it is ready."""
    nxt = sc.step(ids, a=a, c=c)
    return nxt, state_err(sc.draft, sc.w.cache, sc.w.seq + nxt.tokens)


@pytest.mark.parametrize("a", [0, 2, 3])  # a corrected first token, a deeper path, the bonus
def test_reused_branch_is_the_fresh_rollout_and_its_states_land(hybrid_draft, a):
    sc = Scripted(hybrid_draft)
    c = (sc.win.tokens[a] + 1) % 300 if a < 3 else 17
    nxt, err = after(sc, ee_with(sc.win.tokens, {a: [c]}), a, c)
    assert nxt.source == "reuse" and nxt.tokens == sc.fresh(a, c)
    assert err <= ATOL_STATE


def test_fallback_lands_the_main_cache(hybrid_draft):
    sc = Scripted(hybrid_draft)
    nxt, err = after(sc, ee_with(sc.win.tokens, {}), 1, 123)
    assert nxt.source == "fallback" and nxt.tokens == sc.fresh(1, 123)
    assert err <= ATOL_STATE


def test_branch_cut_short_is_resumed_from_its_forked_states(hybrid_draft):
    sc = Scripted(Gate(hybrid_draft, at=2))
    nxt, c = sc.cut_short(settle=0.05)
    assert nxt.source == "resume" and nxt.tokens == sc.fresh(1, c)
    assert state_err(hybrid_draft, sc.w.cache, sc.w.seq + nxt.tokens) <= ATOL_STATE


def test_drafts_that_cannot_fork_their_states_are_refused(models, tiny_dir):
    from runtime.drafts.mtp.torch import MTPDraft

    target = models["target"]
    redecode = TorchCausalLM(models["torch_near"].module, hybrid_rollback="redecode")
    assert "drop --hybrid-rollback redecode" in cannot_run("mirror", target, redecode)
    mtp_target = load_model(tiny_dir("qwen3_5_text", seed=1, mtp=True), "torch", threads=1)
    mtp = MTPDraft.load(mtp_target, tiny_dir("qwen3_5_text", seed=1, mtp=True))
    assert "cannot fork its states per row" in cannot_run("mirror", mtp_target, mtp)
    assert cannot_run("mirror", target, models["onnx_near"]) is None


def test_process_worker_with_a_hybrid_onnx_draft_equals_ar(models, tiny_dir, tmp_path):
    """--draft-process: the worker's process loads the ONNX hybrid draft from its load_spec
    and keeps its cache between generations (the second one starts from the first's prefix)."""
    from converters.onnx_export import export_onnx

    export_onnx(tiny_dir("qwen3_5_text", num_layers=2, seed=2), tmp_path / "d.onnx")
    draft, target = load_model(tmp_path / "d.onnx", intra_threads=1), models["target"]
    try:
        for prompt in (PROMPT, PROMPT + [9, 8, 7]):
            ar = ar_greedy(target, prompt, 12)
            got = greedy_run("mirror", target, draft, prompt, 12, gamma=3, draft_process=True)
            assert got.tokens == ar
    finally:
        draft._duet_draft_host.close()


def test_mirror_with_a_hybrid_draft_on_a_prompt_longer_than_the_log(models):
    """A prompt near the cache's 64-position log: the forward that overflows the log shortens it
    from the front (landing its base by replay) instead of restarting it at the live offset, so
    the draft can still fork at the committed length before it (this failed with 'length 62
    outside the log [64, ...]', first seen on the trained hybrid pair's chat prompts)."""
    target, d = models["target"], models["torch_near"]
    prompt = [int(t) for t in np.random.default_rng(62).integers(0, 320, 62)]
    ar = ar_greedy(target, prompt, N_NEW)
    dc = d.new_cache()
    got = greedy_run("mirror", target, d, prompt, N_NEW, gamma=4, exit_layer=1, draft_cache=dc)
    assert got.tokens == ar
    assert state_err(d, dc, prompt + ar) <= ATOL_STATE
