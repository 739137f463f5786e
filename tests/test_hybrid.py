"""Hybrid Qwen3.5 (Gated DeltaNet + gated attention) on the PyTorch reference: parity with
Hugging Face, exact rollback of linear states, and lossless greedy `sd` on hybrid targets."""

import numpy as np
import pytest
import torch
from decode_helpers import greedy_run, greedy_steps, prefill

from runtime.backends import load_model
from runtime.backends.torch.causal_lm import TorchCausalLM
from runtime.errors import DuetError

ATOL_HF = 2e-4  # logits (|x| up to ~10) vs transformers: a chunked vs token-by-token delta rule
ATOL_STATE = 1e-4  # landed states vs a fresh prefill: the same sums over different batch shapes
PROMPT = [5, 17, 42, 99, 7, 256, 3]
N_NEW = 20


@pytest.fixture(scope="module")
def models(tiny_dir):
    tdir = tiny_dir("qwen3_5_text", seed=1)
    return {
        "dir": tdir,
        "target": load_model(tdir, "torch", threads=1),
        "hybrid_draft": load_model(
            tiny_dir("qwen3_5_text", num_layers=2, seed=2), "torch", threads=1
        ),
        "attn_draft": load_model(tiny_dir("qwen3", num_layers=1, seed=3), "torch", threads=1),
        "near_draft": near_copy(tdir),
    }


def near_copy(path, scale=0.02):
    """The target with 2 % noise on its weights: accepts 0, 1, 3 or all 4 of a window."""
    m = load_model(path, "torch", threads=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.module.parameters():
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=g) * scale * p.std())
    return m


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_logits_match_hugging_face_prefill_and_cached_decode(models):
    check_hf_parity(models["target"], models["dir"])


def check_hf_parity(m, path) -> tuple[np.ndarray, np.ndarray]:
    """`m`'s logits over a prefill, a one-token step and a window equal Hugging Face's
    uncached forward and its own cached one-step decode; returns (ids, m's logits)."""
    ids = np.random.default_rng(0).integers(0, 320, (2, 12))
    c = m.new_cache(batch=2)
    ours = np.concatenate(
        [m.forward(ids[:, :8], c), m.forward(ids[:, 8:9], c), m.forward(ids[:, 9:], c)], axis=1
    )
    hf = hf_model(path)
    with torch.no_grad():
        full = hf(torch.from_numpy(ids)).logits.numpy()
        out = hf(torch.from_numpy(ids[:, :8]), use_cache=True)  # HF's own cached decode
        step = hf(torch.from_numpy(ids[:, 8:9]), past_key_values=out.past_key_values).logits
    np.testing.assert_allclose(ours, full, atol=ATOL_HF)
    np.testing.assert_allclose(ours[:, 8:9], step.numpy(), atol=ATOL_HF)
    return ids, ours


def test_multimodal_layout_loads_its_text_tower(tiny_dir, models, capsys):
    check_text_tower(load_model(tiny_dir("qwen3_5", seed=1), "torch", threads=1), models, capsys)


def check_text_tower(mm, models, capsys) -> None:
    """A multimodal checkpoint's model drops its vision weights (and says so) and computes
    what the text-only checkpoint's does."""
    assert "ignoring 1 vision weights" in capsys.readouterr().err
    ids = np.array([PROMPT])
    target = models["target"]
    np.testing.assert_array_equal(
        mm.forward(ids, mm.new_cache()), target.forward(ids, target.new_cache())
    )


def assert_states_close(cache, fresh, atol=ATOL_STATE):
    """Every layer's states in `cache` equal `fresh`'s (torch or MLX arrays)."""
    assert cache.offset == fresh.offset
    for i, (got, want) in enumerate(zip(cache.states(), fresh.states(), strict=True)):
        for g, w in zip(got, want, strict=True):
            g, w = (x.numpy() if isinstance(x, torch.Tensor) else np.array(x) for x in (g, w))
            assert g.shape == w.shape, f"layer {i}: {g.shape} vs {w.shape}"
            np.testing.assert_allclose(g, w, atol=atol, err_msg=f"layer {i}")


@pytest.mark.parametrize("keep", [0, 1, 3, 5])
def test_trim_lands_every_state_on_the_prefix(models, keep):
    check_trim_lands_on_the_prefix(models["target"], keep, ATOL_STATE)


def check_trim_lands_on_the_prefix(m, keep: int, atol_state: float) -> None:
    """After a 5-token window trimmed to its first `keep`, every state and the next token's
    logits are the prefix's."""
    window = [11, 12, 13, 14, 15]
    c = prefill(m, PROMPT)
    m.forward(np.array([window]), c)
    c.trim(len(window) - keep)
    fresh = prefill(m, PROMPT + window[:keep])
    assert_states_close(c, fresh, atol_state)
    nxt = m.forward(np.array([[77]]), c)
    np.testing.assert_allclose(nxt, m.forward(np.array([[77]]), fresh), atol=ATOL_HF)


def pure_replay(cache):
    """`cache` with no recurrent state kept: every landing replays the log from its base."""
    cache.keep = cache.stride = 0
    return cache


def test_kept_states_land_exactly_where_replay_does(models):
    """Landing on a kept state (or replaying from the nearest one) gives the very tensors a
    replay from the base gives, bit for bit: through verify windows of every acceptance,
    single-token forwards, and a log that overflows its window (the front moved to a kept
    state, not replayed)."""
    m = models["target"]
    kept, plain = m.new_cache(), pure_replay(m.new_cache())
    for c in (kept, plain):
        c.window, c.stride = 12, c.stride and 4
    rng = np.random.default_rng(5)
    for step in range(12):
        window = rng.integers(0, 320, (1, 1 if step % 3 == 2 else 5))
        drop = int(rng.integers(0, window.shape[1])) if step >= 6 else 0  # first: overflow
        for c in (kept, plain):
            m.forward(window, c)
            c.trim(drop)
        if step == 5:  # 22 positions through a 12-position log: its front moved on, twice
            lin = kept._layers[0]
            assert lin.base >= 8 and lin.logged() < kept.window + kept.stride
        assert kept.offset == plain.offset
        for got, want in zip(kept.states(), plain.states(), strict=True):
            for g, w in zip(got, want, strict=True):
                assert torch.equal(g, w), f"step {step}"
    landed = [la for la in kept._layers if hasattr(la, "marks")]
    assert landed and all(len(la.marks) <= kept.keep + kept.window // 4 + 1 for la in landed)


def test_sd_with_kept_states_equals_sd_by_replay(models, monkeypatch):
    """sd (γ = 4, a near draft: rejections at every depth) lands its target and draft caches on
    the same tensors with and without kept states, after every step; with them, no landing
    replays a single recurrence step."""
    import runtime.caches.hybrid as hc
    import runtime.caches.linear_state as hl

    target, draft = models["target"], models["near_draft"]
    replayed, inner = [], hc.replay
    for mod in (hc, hl):
        monkeypatch.setattr(mod, "replay", lambda *a, **k: replayed.append(1) or inner(*a, **k))
    runs, replays = [], []
    for fresh in (lambda c: c, pure_replay):
        tc, dc = fresh(target.new_cache()), fresh(draft.new_cache())
        replayed.clear()
        steps = greedy_steps(
            "sd", target, draft, PROMPT, 30, gamma=4, target_cache=tc, draft_cache=dc
        )
        runs.append(
            [(ev.tokens, [t.clone() for s in tc.states() + dc.states() for t in s]) for ev in steps]
        )
        replays.append(len(replayed))
    assert replays[0] == 0 < replays[1]
    assert len(runs[0]) == len(runs[1])
    for (tok_a, st_a), (tok_b, st_b) in zip(*runs, strict=True):
        assert tok_a == tok_b and all(torch.equal(x, y) for x, y in zip(st_a, st_b, strict=True))


def test_trim_across_single_token_forwards(models):
    """A draft feeds one token per forward; trimming several lands across forwards."""
    m = models["target"]
    c = prefill(m, PROMPT)
    for t in (21, 22, 23, 24):
        m.forward(np.array([[t]]), c)
    c.trim(3)
    assert_states_close(c, prefill(m, PROMPT + [21]))


def test_trim_before_the_log_restarts_from_empty(models):
    m = models["target"]
    c = prefill(m, PROMPT)
    m.forward(np.array([[21]]), c)
    c.trim(1)  # lands, and the log restarts here
    c.trim(3)  # before the log: the cache empties, and decoding re-feeds the prefix
    assert c.offset == 0
    m.forward(np.array([PROMPT[:4]]), c)
    assert_states_close(c, prefill(m, PROMPT[:4]))


def hf_greedy(path, n):
    hf = hf_model(path)
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False)
    return out[0, len(PROMPT) :].tolist()


def generate(method, target, draft=None, **opts):
    return greedy_run(method, target, draft, PROMPT, N_NEW, **opts).tokens


@pytest.mark.parametrize("draft", ["hybrid_draft", "attn_draft", "near_draft"])
def test_greedy_sd_equals_ar_and_hugging_face(models, draft):
    target = models["target"]
    ar = generate("ar", target)
    assert ar == hf_greedy(models["dir"], N_NEW)
    assert generate("sd", target, models[draft], gamma=3) == ar


@pytest.mark.parametrize("rollback", ["replay", "redecode"])
def test_states_equal_a_fresh_prefill_after_every_sd_step(models, rollback):
    target, draft = models["target"], models["near_draft"]
    if rollback == "redecode":
        target = TorchCausalLM(target.module, hybrid_rollback="redecode")
    tc, dc = target.new_cache(), draft.new_cache()
    seq = list(PROMPT)
    steps = greedy_steps(
        "sd", target, draft, PROMPT, N_NEW, gamma=4, target_cache=tc, draft_cache=dc
    )
    accepted = set()
    for ev in steps:
        seq += ev.tokens
        accepted.add(ev.accepted)
        assert_states_close(tc, prefill(target, seq[: tc.offset]))
        assert_states_close(dc, prefill(draft, seq[: dc.offset]))
    assert {0, 4} < accepted, f"want rejections, partial and full windows (got {accepted})"


def test_replay_and_redecode_give_identical_output(models, tiny_dir):
    tdir = models["dir"]
    redecode = TorchCausalLM.load(tdir, threads=1, hybrid_rollback="redecode")
    draft = models["near_draft"]
    want = generate("sd", models["target"], draft, gamma=4)
    assert generate("sd", redecode, draft, gamma=4) == want
    own_pass = redecode.new_cache()
    own_pass.reverify = False  # the re-run as a pass of its own inside `trim`
    assert generate("sd", redecode, draft, gamma=4, target_cache=own_pass) == want
    assert own_pass.redecoded > 0
    # redecode restores the checkpoint before the window and re-runs the kept tokens
    c = prefill(redecode, PROMPT)
    redecode.forward(np.array([[11, 12, 13]]), c)
    c.trim(1)
    assert c.offset == len(PROMPT) + 2 and c.redecoded == 2
    assert_states_close(c, prefill(redecode, PROMPT + [11, 12]))
    c.trim(1)  # lands on the checkpoint at the committed length: only [11] re-runs
    assert c.offset == len(PROMPT) + 1 and c.redecoded == 3
    assert_states_close(c, prefill(redecode, PROMPT + [11]))


def counted(model):
    """`model` with its forward_layers wrapped: returns the list of T of every forward from
    layer 0 (verify windows, prefill, and redecode's re-runs all go through it)."""
    calls, inner = [], model.forward_layers

    def forward_layers(x, cache, start, stop, **kw):
        if start == 0:
            calls.append(np.asarray(x).shape[1])
        return inner(x, cache, start, stop, **kw)

    model.forward_layers = forward_layers
    return calls


def rounds_of(target, draft, calls):
    """Greedy sd (γ = 4, 40 tokens) with `calls` = counted(target): per step (the tokens of each
    target forward from layer 0, accepted, drafted)."""
    tc = target.new_cache()
    rounds = []
    steps = greedy_steps("sd", target, draft, PROMPT, 40, gamma=4, target_cache=tc)
    for ev in steps:
        rounds.append((list(calls), ev.accepted, ev.drafted))
        calls.clear()
    return rounds, tc


def test_redecode_re_verifies_the_kept_tokens_as_llama_cpp_does(models):
    """llama.cpp's loop, not more and not less: after a rejection (A of γ accepted) the target
    restores the checkpoint before that window, and its next window is [last, d1..dA, c] with no
    new drafts, which re-decodes the A + 1 kept tokens and yields one more token; then windows
    are γ + 1 again. Nothing is re-run as a pass of its own, and a full acceptance restores
    nothing. Replay's rounds never re-feed a token."""
    draft = models["near_draft"]
    replay = TorchCausalLM(models["target"].module, hybrid_rollback="replay")
    redecode = TorchCausalLM(models["target"].module, hybrid_rollback="redecode")
    assert_llama_cpp_rounds(replay, redecode, draft)


def assert_llama_cpp_rounds(replay, redecode, draft):
    """The round structure test_redecode_re_verifies_the_kept_tokens_as_llama_cpp_does names."""
    rounds_replay, _ = rounds_of(replay, draft, counted(replay))
    rounds, tc = rounds_of(redecode, draft, counted(redecode))
    n = len(PROMPT)
    # replay: the first window carries the prompt, then [last, d1..dγ]; no token fed twice
    assert all(fed == [(n if i == 0 else 1) + g] for i, (fed, _, g) in enumerate(rounds_replay))
    # redecode prefills the prompt but its last token first (a checkpoint there, as llama.cpp)
    assert rounds[0][0] == [n - 1, 1 + rounds[0][2]]
    refed = 0
    for i, (fed, a, g) in enumerate(rounds[1:], start=1):
        prev = rounds[i - 1]
        if prev[1] < prev[2]:  # after a rejection: the kept tokens and c, no drafts, one pass
            assert (g, a, fed) == (0, 0, [prev[1] + 2])
            refed += prev[1] + 1
        else:
            assert fed == [1 + g]  # [last, d1..dγ]: nothing re-run as a pass of its own
    assert tc.redecoded == refed
    rejected = [a for _, a, g in rounds if a < g]
    assert len(rejected) >= 3 and any(0 < a for a in rejected)


@pytest.mark.parametrize("method", ["tree", "heterospec"])
def test_tree_methods_refuse_hybrid_targets(models, method):
    with pytest.raises(DuetError, match="hybrid linear-attention target"):
        generate(method, models["target"], models["attn_draft"])


def test_auto_offers_only_what_the_hybrid_pair_can_run(models):
    from devices.pair_probe import runnable_methods

    # mirror forks a hybrid draft's states per branch row (tests/test_hybrid_mirror.py)
    assert runnable_methods(models["target"], models["hybrid_draft"]) == ["ar", "sd", "mirror"]
    assert runnable_methods(models["target"], models["attn_draft"]) == ["ar", "sd", "mirror"]


@pytest.mark.parametrize("exit_layer", [1, 2])  # stop after a linear / an attention layer
def test_mirror_on_a_hybrid_target_equals_ar_and_lands_states(models, exit_layer):
    check_mirror_lands_states(models, exit_layer, generate("ar", models["target"]), ATOL_STATE)


def check_mirror_lands_states(models, exit_layer: int, want: list[int], atol_state: float):
    """Greedy mirror with the attention draft gives `want`, the target's states equal a fresh
    prefill's after every step."""
    target, draft = models["target"], models["attn_draft"]
    tc = target.new_cache()
    seq = list(PROMPT)
    steps = greedy_steps(
        "mirror", target, draft, PROMPT, N_NEW, gamma=3, exit_layer=exit_layer, target_cache=tc
    )
    for ev in steps:
        seq += ev.tokens
        assert_states_close(tc, prefill(target, seq[: tc.offset]), atol_state)
    assert seq[len(PROMPT) :][:N_NEW] == want


def test_non_causal_mask_is_refused(models):
    m = models["target"]
    mask = np.ones((2, 2), dtype=bool)
    with pytest.raises(DuetError, match="causal windows only"):
        m.forward(np.array([[1, 2]]), m.new_cache(), mask=mask)


def test_fork_and_select_rows_carry_states_and_logs(models):
    check_fork_and_select(models["target"], ATOL_STATE)


def check_fork_and_select(m, atol_state: float) -> None:
    """A forked cache's rows each land by replay; selecting one keeps its states; the
    original cache is unchanged."""
    c = prefill(m, PROMPT)
    two = c.fork([0, 0])
    m.forward(np.array([[11, 12], [13, 14]]), two)
    two.trim(1)  # lands both rows by replay
    two.select([1])
    assert_states_close(two, prefill(m, PROMPT + [13]), atol_state)
    assert c.offset == len(PROMPT)  # the original is unchanged


def test_log_window_bounds_what_can_be_landed(models):
    m = models["target"]
    c = prefill(m, PROMPT)
    c.window = 3  # keep at most 3 logged positions across forwards
    for t in (21, 22, 23, 24):
        m.forward(np.array([[t]]), c)
    c.trim(1)  # inside the log (restarted at the 4th forward): exact
    assert_states_close(c, prefill(m, PROMPT + [21, 22, 23]))
    c.trim(1)  # before the log: the cache empties rather than guess
    assert c.offset == 0


def test_generate_cli_runs_hybrid_pairs_with_either_rollback(models, tiny_dir, capsys):
    import json

    from runtime.generate import main

    draft = tiny_dir("qwen3_5_text", num_layers=2, seed=2)  # defaults to ONNX (exported here)
    outs = []
    sd = ["--method", "sd", "--draft", str(draft)]
    for extra in (["--method", "ar"], sd, [*sd, "--hybrid-rollback", "redecode"]):
        argv = ["--target", str(models["dir"]), "--prompt-ids", "5,17,42", "--max-tokens", "6",
                "--json", *extra]  # fmt: skip
        assert main(argv) == 0
        outs.append(json.loads(capsys.readouterr().out)["tokens"])
    assert outs[0] == outs[1] == outs[2]


def test_rollback_bench_runs_sd_both_ways(models, tiny_dir, capsys):
    import json

    from apps.bench.studies.hybrid_rollback import main

    draft = tiny_dir("qwen3_5_text", num_layers=2, seed=2)
    argv = ["--target", str(models["dir"]), "--draft", str(draft), "--gamma", "2", "--reps", "1",
            "--prompt-len", "4", "--max-new", "8", "--e2e-reps", "1"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["redecode_ms"]) == {"0", "1", "2"} and res["verify_ms"] > 0
    sd = res["sd"]
    assert sd["same_tokens"] and sd["replay"]["redecoded"] == 0
    assert sd["redecode"]["processed"] >= sd["redecode"]["generated"] + sd["redecode"]["redecoded"]
