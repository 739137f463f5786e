"""`python -m apps.train eagle` and `--draft head`: a feature-level head (fused taps of three
target layers, a cut vocabulary) fitted a few steps on a tiny target loads back from the
sidecar and drafts losslessly: greedy equals `ar`, and at T = 1 the joint law is the target's
(chi-square, with a negative control that must fail); the features cached for training are the
ones the target records while it verifies, and the unrolled training chain is the drafting
chain."""

import json
import shutil

import numpy as np
import pytest
import torch
from decode_helpers import ar_greedy, greedy_run, greedy_steps

from apps.train.eagle import chain_outputs, init_head, main, save_head
from apps.train.eagle_data import _generate, _hf_model
from runtime.backends import load_model
from runtime.decoding import run
from runtime.decoding import sd as sd_module
from runtime.drafts.head.onnx import KINDS
from runtime.drafts.head.torch import HeadDraft, head_sidecar, tap_layers
from runtime.errors import DuetError

PROMPT = [5, 17, 42, 99, 7]
N_NEW = 16
ATOL = 1e-4


def _fit(target_dir, steps, *extra):
    return main(
        [
            "--target",
            str(target_dir),
            "--prompts",
            "6",
            "--doc-files",
            "2",
            "--max-prompt",
            "200",
            "--gen-batch",
            "3",
            "--max-new",
            "12",
            "--steps",
            str(steps),
            "--seq-len",
            "48",
            "--batch-size",
            "2",
            "--vocab",
            "96",
            "--ckpt-every",
            "1",
            "--unroll",
            "2",
            "--threads",
            "1",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def fitted(tiny_dir, tmp_path_factory):
    """A Llama target with its head fitted 2 steps, then resumed to 3 on the cached data (what
    each run printed)."""
    import contextlib
    import io

    target_dir = tmp_path_factory.mktemp("eagle") / "target"
    shutil.copytree(tiny_dir("llama", seed=3), target_dir)
    printed = []
    for steps, extra in ((2, []), (3, ["--data-budget-min", "0"])):  # then the cached data only
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert _fit(target_dir, steps, *extra) == 0
        printed.append(buf.getvalue())
    return target_dir, printed


def test_fitted_head_loads_back_resumes_and_is_lossless(fitted):
    target_dir, printed = fitted
    rec = json.loads(printed[1][printed[1].index("{\n") :])
    side = head_sidecar(target_dir)
    assert "resuming" in printed[1] and rec["steps"] == 3 and rec["wrote"] == str(side)
    meta = json.loads((side / "head.json").read_text())
    assert meta["kind"] == "duet-eagle-head" and meta["layers"] == [1, 1, 0]
    assert meta["vocab"] == 96 and meta["data"]["prompts"] == 6
    assert (side / "data" / "shard_00000.pt").is_file()  # the cached teacher features
    target = load_model(target_dir, "torch", threads=1)
    draft = HeadDraft.load(target, target_dir)
    kept = set(draft.head_module.vocab_ids.tolist())
    ar = ar_greedy(target, PROMPT, N_NEW)
    for gamma in (1, 4):
        assert greedy_run("sd", target, draft, PROMPT, N_NEW, gamma=gamma).tokens == ar
    row = draft.forward(np.array([PROMPT]), draft.new_cache())[0, -1]
    assert np.isneginf(row[[i for i in range(row.size) if i not in kept]]).all()
    assert np.isfinite(row[sorted(kept)]).all()  # q is the softmax over the kept ids, 0 elsewhere


@pytest.mark.parametrize("quant", ["fp32", "int8"])
def test_the_head_steps_in_onnx_runtime(fitted, quant):
    """The head's step as ONNX graphs (one reading the target's taps, one its own output) gives
    the PyTorch step's rows: the same kept ids finite, values within the export's checks
    (float32 1e-3, int8 weights 5 % of the largest logit); and it drafts losslessly."""
    target_dir, _ = fitted
    target = load_model(target_dir, "torch", threads=1)
    ref = HeadDraft.load(target, target_dir)
    onx = HeadDraft.load(target, target_dir, backend="onnx", quant=quant)
    tag = "" if quant == "fp32" else ".int8"
    assert onx.backend == "onnx"
    assert all((head_sidecar(target_dir) / f"step.{k}{tag}.onnx").is_file() for k in KINDS)
    target.forward(np.array([PROMPT]), target.new_cache())  # records the taps the head reads
    c_ref, c_onx = ref.new_cache(), onx.new_cache()
    tol = 1e-3 if quant == "fp32" else 0.05
    for x in ([PROMPT], [[5]], [[7]]):  # the prompt (taps), then two chained steps
        want, got = ref.forward(np.array(x), c_ref), onx.forward(np.array(x), c_onx)
        assert np.array_equal(np.isfinite(want), np.isfinite(got))
        fin = np.isfinite(want)
        assert np.abs(want[fin] - got[fin]).max() <= tol * max(1.0, np.abs(want[fin]).max())
    ar = ar_greedy(target, PROMPT, N_NEW)
    assert greedy_run("sd", target, onx, PROMPT, N_NEW, gamma=4).tokens == ar


def test_generate_cli_finds_the_head(fitted, capsys):
    from runtime.generate import main as generate

    target_dir, _ = fitted
    ids = ",".join(map(str, PROMPT))
    outs = []
    runs = (("ar", []), ("sd", ["--draft", "head", "--gamma", "3"]),
            ("sd", ["--draft", "head+suffix", "--gamma", "3"]))  # fmt: skip
    for method, extra in runs:
        assert (
            generate(
                [
                    "--target",
                    str(target_dir),
                    "--method",
                    method,
                    "--prompt-ids",
                    ids,
                    "--max-tokens",
                    "10",
                    "--json",
                    *extra,
                ]
            )
            == 0
        )
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[1]["tokens"] == outs[0]["tokens"] and outs[1]["stats"]["steps"] >= 1
    assert outs[2]["tokens"] == outs[0]["tokens"]
    assert (
        generate(
            [
                "--target",
                str(target_dir),
                "--method",
                "tree",
                "--draft",
                "head+lookup",
                "--prompt-ids",
                ids,
                "--max-tokens",
                "4",
            ]
        )
        == 2
    )
    assert "`sd` chains only" in capsys.readouterr().err


def test_no_head_is_one_line(tiny_dir, capsys):
    from runtime.generate import main as generate

    d = tiny_dir("llama", seed=4)
    capsys.readouterr()
    rc = generate(
        [
            "--target",
            str(d),
            "--draft",
            "head",
            "--method",
            "sd",
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "4",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "apps.train eagle" in err[0]


@pytest.mark.parametrize("quantize", ["none", "int4"])
def test_the_head_beside_the_onnx_target_is_lossless(fitted, quantize):
    """The ONNX target records the taps off its whole graph (`full.taps.*`): float32, they are the
    PyTorch target's (within the graph's tolerance); int4 (accuracy level 4), greedy sd with the
    head equals that target's own ar token for token."""
    from runtime.backends.onnx.target import OnnxTargetLM

    target_dir, _ = fitted
    target = OnnxTargetLM(target_dir, quantize, intra_threads=1)
    draft = HeadDraft.load(target, target_dir)
    assert target.record_layers == draft.head_module.layers_tapped
    ar_steps = greedy_steps("ar", target, None, PROMPT, N_NEW)
    target.record_hidden = False  # ar reads no taps (as the bench and generate run it)
    ar = run(ar_steps, max_new=N_NEW).tokens
    target.record_hidden = True
    for gamma in (1, 4):
        got = greedy_run("sd", target, draft, PROMPT, N_NEW, gamma=gamma)
        assert got.tokens == ar, gamma
    if quantize == "none":
        ref = load_model(target_dir, "torch", threads=1)
        ref.record_hidden, ref.record_layers = True, target.record_layers
        ids = np.array([PROMPT + ar[:6]])
        c_ref, c = ref.new_cache(), target.new_cache()
        ref.forward(ids, c_ref), target.forward(ids, c)
        assert (
            np.abs(c.hidden[: ids.shape[1]].numpy() - c_ref.hidden[: ids.shape[1]].numpy()).max()
            < ATOL
        )
        assert c.hidden_ids == c_ref.hidden_ids == ids[0].tolist()


def test_a_head_beside_an_mlx_target_is_one_line(fitted):
    """The head reads the target's layer outputs, which the PyTorch and the ONNX target record:
    another backend is refused in one line before anything is built."""

    class Other:
        backend, record_layers = "mlx", None

    with pytest.raises(DuetError, match="PyTorch or an ONNX target"):
        HeadDraft.load(Other(), fitted[0])


def _taps(target, ids):
    target.record_hidden, target.record_layers = True, tap_layers(target.config.num_layers)
    c = target.new_cache()
    target.forward(np.array([ids]), c)
    return c.hidden[: len(ids)]


def test_cached_features_are_the_recorded_taps(tiny_dir):
    """Training reads the taps Hugging Face's forward gave; drafting, those the PyTorch target
    records while verifying: the same numbers. The teacher's top-1 is the target's argmax."""
    d = tiny_dir("llama", seed=3)
    target = load_model(d, "torch", threads=1)
    ids = [3, 9, 27, 81, 243, 7, 21, 63, 189, 5, 15]
    seq, taps, top_ids, _ = _generate(_hf_model(d, 1), [ids], 4, 0, {0}, True, tap_layers(4), 4)[0]
    assert seq[: len(ids)] == ids and len(seq) == len(taps) == len(top_ids) >= len(ids)
    ids = seq  # the prompt and its answer (features of all but the answer's last token)
    np.testing.assert_allclose(
        taps.float().numpy(), _taps(target, ids).numpy(), rtol=2e-3, atol=1e-3
    )  # cached as float16
    logits = target.forward(np.array([ids]), target.new_cache())[0]
    assert (top_ids[:, 0].numpy() == logits.argmax(-1)).all()


def test_training_chain_is_the_drafting_chain(tiny_dir):
    """Step r of the unrolled loss at entry j gives the logits the head drafts its r-th token
    with, when the target has committed x_0..x_{c-1} and the drafts are the true tokens."""
    target = load_model(tiny_dir("llama", seed=3), "torch", threads=1)
    taps = tap_layers(target.config.num_layers)
    head = init_head(target, taps, torch.arange(0, 320, 2))
    with torch.no_grad():  # move off the identity start so every part of the layer counts
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.tensor([[3, 9, 27, 81, 243, 7, 21, 63, 189, 5, 15]])
    c = 6
    outs = chain_outputs(target, head, x, _taps(target, x[0].tolist())[None].clone(), 3)
    draft = HeadDraft(target, head)
    tc, dc = target.new_cache(), draft.new_cache()
    target.forward(x[:, :c].numpy(), tc)  # records the taps at 0 .. c-1
    got = [draft.forward(x[:, : c + 1].numpy(), dc)[0, -1]]
    got += [draft.forward(x[:, c + r : c + r + 1].numpy(), dc)[0, -1] for r in (1, 2)]
    for r in (1, 2, 3):
        want = head.lm_head(outs[r - 1][0, c + r - 2]).detach().numpy()
        np.testing.assert_allclose(got[r - 1][head.vocab_ids.numpy()], want, atol=ATOL, rtol=ATOL)


V = 8
N = 500
ALPHA = 1e-3


@pytest.fixture(scope="module")
def gof_pair(tiny_dir, tmp_path_factory):
    """A V = 8 target and a head over 5 of its 8 ids (q = 0 on the other 3), saved and loaded."""
    d = tiny_dir("qwen3", seed=1, vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = load_model(d, "torch", threads=1)
    head = init_head(target, tap_layers(target.config.num_layers), torch.tensor([0, 2, 3, 5, 6]))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p, generator=torch.Generator().manual_seed(0)))
    target_dir = tmp_path_factory.mktemp("gof_target")
    for f in d.iterdir():
        (target_dir / f.name).symlink_to(f)
    side = head_sidecar(target_dir)
    side.mkdir(parents=True)
    save_head(head, side, d, {"steps": 0})
    return target, HeadDraft.load(target, target_dir)


def test_sampling_with_the_head_matches_the_target(gof_pair):
    from test_sampling_gof import exact_joint, gof_pvalue, sample_pairs

    target, draft = gof_pair
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert p > ALPHA, f"sd with the head: joint law differs from the target's (p = {p:.2e})"


def test_negative_control_full_vocabulary_q_fails(gof_pair, monkeypatch):
    """Verifying with q spread over the whole vocabulary (as if the cut ids had mass) must break
    the law: the test has power against a q that is not the law the token came from."""
    from test_sampling_gof import exact_joint, gof_pvalue, sample_pairs

    target, draft = gof_pair
    real = sd_module.verify_sampling

    def wrong_q(p, q, d, ua, ur):
        return real(p, (np.asarray(q) + 0.2) / (1 + 0.2 * V), d, ua, ur)

    monkeypatch.setattr(sd_module, "verify_sampling", wrong_q)
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"


def test_bad_flags_are_one_line():
    with pytest.raises(DuetError, match="--vocab must be positive"):
        main(["--target", "x", "--vocab", "0"])
    with pytest.raises(DuetError, match="--self-prompts must be >= 0"):
        main(["--target", "x", "--self-prompts", "-1"])


def test_eval_reports_tokens_per_step_on_held_out_prompts(fitted, tmp_path, capsys):
    from apps.train.eagle_eval import main as evaluate

    target_dir, _ = fitted
    q = tmp_path / "q.jsonl"
    q.write_text(
        "\n".join(
            json.dumps({"question_id": i, "category": c, "turns": [t]})
            for i, (c, t) in enumerate([("qa", "Why?"), ("math", "2 + 2")])
        )
    )
    capsys.readouterr()
    assert (
        evaluate(
            [
                "--target",
                str(target_dir),
                "--prompts",
                str(q),
                "--per-category",
                "1",
                "--max-tokens",
                "6",
                "--threads",
                "1",
                "--json",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = json.loads(out[out.index("{\n") :])["rows"]
    assert set(rows) == {"qa", "math", "all"} and rows["all"]["greedy_equals_ar"] == "2/2"
    assert 1 <= rows["all"]["tokens_per_step"] <= 5 and 0 <= rows["all"]["accept_rate"] <= 1
    cal = json.loads(out[out.index("{\n") :])["calibration"]
    assert cal and all(0 <= r["accepted"] <= 1 and 0 < r["mean_q"] <= 1 for r in cal)


def test_a_refreshed_vocabulary_keeps_the_trained_rows(tiny_dir):
    from apps.train.eagle import refit_rows

    target = load_model(tiny_dir("llama", seed=3), "torch", threads=1)
    old = init_head(target, (1, 1, 0), torch.tensor([4, 9, 30, 31]))
    with torch.no_grad():
        old.lm_head.weight.mul_(3.0)  # "trained"
    new = init_head(target, (1, 1, 0), torch.tensor([9, 31, 50, 60]))
    new.load_state_dict(refit_rows(old.state_dict(), old.vocab_ids, new), strict=True)
    w = new.lm_head.weight.detach()
    torch.testing.assert_close(w[:2], old.lm_head.weight.detach()[[1, 3]])  # ids 9 and 31
    torch.testing.assert_close(w[2:], target.module.lm_head.weight.detach()[[50, 60]])
    assert new.vocab_ids.tolist() == [9, 31, 50, 60]


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_the_head_drafts_trees(fitted, backend):
    """`tree` and `heterospec` draft with the head along its chain (one node expanded per
    level, runner-up siblings as leaves): greedy equals `ar` over the PyTorch and the int4 ONNX
    target, and the hidden rows the target recorded follow the accepted nodes (commit), so the
    head reads the target's own features at every committed position."""
    from runtime.backends.onnx.target import OnnxTargetLM
    from runtime.decoding.heterospec import pair_bins

    target_dir, _ = fitted
    if backend == "torch":
        target = load_model(target_dir, "torch", threads=1)
    else:
        target = OnnxTargetLM(target_dir, "int4", intra_threads=1)
    draft = HeadDraft.load(target, target_dir)
    target.record_hidden = False
    ar = ar_greedy(target, PROMPT, N_NEW)
    target.record_hidden = True
    bins = head_sidecar(target_dir) / "bins.json"  # heterospec finds the head's own bins
    assert pair_bins(draft) is None
    bins.write_text(json.dumps({"thresholds": [0.5 * i for i in range(1, 8)], "top_k": 2}))
    try:
        assert pair_bins(draft) == bins
        for method in ("tree", "heterospec"):
            tc = target.new_cache()
            got = greedy_run(
                method, target, draft, PROMPT, N_NEW, target_cache=tc, tree_k=3, top_n=8, depth=4
            )
            assert got.tokens == ar, method
            seq = PROMPT + ar
            assert tc.hidden_ids[: tc.offset] == seq[: tc.offset]
    finally:
        bins.unlink()
    with pytest.raises(DuetError, match="one node per level"):
        greedy_run("tree", target, draft, PROMPT, N_NEW, tree_k=2, expand=2)


def test_a_tree_commit_moves_the_recorded_rows(fitted):
    """After a tree verify accepts a sibling's branch, the target's recorded taps at the
    committed positions are those of a plain pass over the committed sequence."""
    from runtime.decoding.tree_pass import commit, tree_logits

    target_dir, _ = fitted
    target = load_model(target_dir, "torch", threads=1)
    target.record_hidden, target.record_layers = True, (1, 1, 0)
    tokens, parents, path = [11, 23, 31], [-1, -1, 1], [1, 2]  # the second root child, its child
    cache = target.new_cache()
    tree_logits(target, cache, PROMPT, tokens, parents)
    commit(cache, len(PROMPT), path)
    seq = PROMPT + [tokens[i] for i in path]
    ref = target.new_cache()
    target.forward(np.array([seq]), ref)
    n = len(seq)
    assert cache.offset == n and cache.hidden_ids[:n] == ref.hidden_ids[:n] == seq
    assert torch.allclose(cache.hidden[:n], ref.hidden[:n], atol=ATOL)


def test_an_adapter_and_a_fine_tuned_copy_draft_with_the_base_head(fitted, tmp_path):
    """FlexSpec's evolved targets keep the base's head: an adapter's merged checkpoint reads the
    base's sidecar, and a fully fine-tuned copy reads it through `heads_from`."""
    from safetensors.torch import load_file, save_file
    from test_evolving import make_adapter

    from runtime.loading import load_pair

    base, _ = fitted
    adapter = make_adapter(base, tmp_path / "lora")
    ft = tmp_path / "full"
    shutil.copytree(base, ft, ignore=shutil.ignore_patterns(".duet", "*.onnx"))
    state = load_file(str(ft / "model.safetensors"))
    state = {k: v * 1.05 if ".mlp." in k else v for k, v in state.items()}  # a changed target
    save_file(state, str(ft / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DuetError, match="apps.train eagle"):  # no head of its own
        load_pair(str(ft), "head", need_draft=True, target_backend="torch")
    for target, kw in ((str(base), {"adapter": str(adapter)}), (str(ft), {"heads_from": base})):
        pair = load_pair(
            target, "head", need_draft=True, target_backend="torch", draft_backend="torch", **kw
        )
        ar = greedy_run("ar", pair.target, None, PROMPT, N_NEW)
        sd = greedy_run("sd", pair.target, pair.draft, PROMPT, N_NEW, gamma=3)
        assert sd.tokens == ar.tokens and len(ar.tokens) == N_NEW, kw


TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _templated(tiny_dir, tmp_path):
    d = tmp_path / "templated"
    shutil.copytree(tiny_dir("llama", seed=3), d)
    (d / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE})
    )
    return d


def test_self_written_prompts_are_finished_new_questions(tiny_dir, tmp_path):
    """Magpie: the target continues its template's pre-query prefix; kept are the rows that end
    within the budget, hold three words, and are neither seen nor held out."""
    from apps.train import eagle_data as ed
    from runtime.chat_template import ChatTemplate
    from runtime.tokenizer import Tokenizer

    d = _templated(tiny_dir, tmp_path)
    tok, tmpl = Tokenizer(d), ChatTemplate.load(d)
    prefix = ed.query_prefix(tmpl)
    assert tok.decode(prefix) == "<user>"
    eos, pad = 0, 1
    texts = ["how do bees fly", "how do bees fly", "held out question here", "two words",
             "a question that never ends", "why is the sky blue"]  # fmt: skip
    rows = [tok.encode(t) + ([eos] if i != 4 else []) for i, t in enumerate(texts)]
    width = max(map(len, rows))

    class Fake:
        def generate(self, input_ids, **kw):
            assert input_ids[0].tolist() == prefix and kw["do_sample"]
            assert kw["temperature"] == 1.0 and kw["top_p"] == 0.95
            body = [r + [pad] * (width - len(r)) for r in rows]
            return torch.cat(
                [input_ids[:, :0].new_tensor([prefix] * len(rows)), torch.tensor(body)], 1
            )

    got = ed.self_prompts(
        Fake(),
        tok,
        tmpl,
        10,
        seed=0,
        batch=len(rows),
        eos={eos},
        pad=pad,
        banned={"held out question here"},
    )
    assert got == ["how do bees fly", "why is the sky blue"]
    assert ed.self_prompts(Fake(), tok, tmpl, 1, seed=0, batch=6, eos={eos}, pad=pad) == [
        "how do bees fly"
    ]


def test_a_rerun_with_self_prompts_goes_on_after_the_answered_ones(tiny_dir, tmp_path, monkeypatch):
    """The plan (DATA/plan.jsonl) keeps the answered prompts first and in order; self-written
    prompts and document tasks over the target's own cached answers are added after them and
    answered by the rerun; a target without a chat template cannot write prompts."""
    from apps.train import eagle_data as ed

    d = _templated(tiny_dir, tmp_path)
    assert _fit(d, 1) == 0
    data = head_sidecar(d) / "data"
    first = ed.read_plan(data)
    assert [r["kind"] for r in first] == ["template"] * 6 and ed.done_prompts(data) == 6
    from runtime.tokenizer import Tokenizer

    docs = ed.answer_doc_prompts(data, Tokenizer(d), 2, seed=0, min_tokens=1)
    assert len(docs) == 2
    assert all(any(p.startswith(f.split("{doc}")[0]) for f in ed.DOC_FORMS) for p in docs)
    mine = ["what is a bee", "write me a poem", "how far is the moon"]
    monkeypatch.setattr(ed, "self_prompts", lambda *a, **k: mine[: a[3]])
    monkeypatch.setattr(ed, "answer_doc_prompts", lambda data, tok, n, seed: ["Sum up: x y z"] * n)
    assert _fit(d, 2, "--self-prompts", "4") == 0
    plan = ed.read_plan(data)
    assert plan[:6] == first and ed.done_prompts(data) == len(plan) == 10
    assert sorted(r["prompt"] for r in plan[6:]) == sorted([*mine, "Sum up: x y z"])
    assert {r["kind"] for r in plan[6:]} == {"self", "answer-doc"}
    assert _fit(d, 3, "--self-prompts", "4") == 0 and ed.read_plan(data) == plan  # nothing new
    bare = tmp_path / "bare"
    shutil.copytree(tiny_dir("llama", seed=3), bare)
    with pytest.raises(DuetError, match="no chat template"):
        _fit(bare, 1, "--self-prompts", "2")


def _mixed(draft, target, **kw):
    from runtime.drafts.mixed import MixedDraft
    from runtime.drafts.suffix import SuffixDraft

    return MixedDraft(draft, SuffixDraft(target.config), name="head+suffix", **kw)


def test_the_head_with_a_suffix_draft_beside_it_is_lossless(fitted):
    """`--draft head+suffix`: on a prompt that repeats, the text drafts some steps and the head
    the others (catching up on the tokens committed meanwhile); greedy equals `ar`, whatever
    the bar; trees refuse it in one line."""
    from runtime.decoding import cannot_run
    from runtime.loading import load_pair

    target_dir, _ = fitted
    pair = load_pair(
        str(target_dir), "head+suffix", need_draft=True, target_backend="torch", target_threads=1
    )
    assert pair.draft.mixed and "suffix (model-free)" in pair.settings["draft_backend"]
    prompt = [5, 17, 42, 99, 7, 11, 5, 17, 42, 99, 7, 11, 5, 17]
    n = 24
    ar = ar_greedy(pair.target, prompt, n)
    for min_len, min_score in ((1, 0.5), (3, 2.0), (99, 99.0)):
        draft = _mixed(pair.draft.model, pair.target, min_len=min_len, min_score=min_score)
        got = greedy_run("sd", pair.target, draft, prompt, n, gamma=4)
        assert got.tokens == ar, (min_len, min_score)
        if min_len == 1:
            assert draft.free_steps > 0 and draft.model_steps > 0  # both drafted
        if min_len == 99:  # the bar is cleared only where γ is cut to 1 (the last window)
            assert draft.free_steps <= 1 and draft.model_steps > 3
    assert "`sd` chains only" in cannot_run("tree", pair.target, pair.draft)
    assert cannot_run("sd", pair.target, pair.draft) is None


def test_sampling_with_the_head_and_suffix_matches_the_target(gof_pair):
    from test_sampling_gof import exact_joint, gof_pvalue, sample_pairs

    target, head = gof_pair
    draft = _mixed(head, target, min_len=1, min_score=0.5)
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert draft.free_steps > 50 and draft.model_steps > 50  # both laws verified, many times
    assert p > ALPHA, f"sd with head+suffix: joint law differs from the target's (p = {p:.2e})"


def test_negative_control_the_texts_chain_verified_with_another_q_fails(gof_pair):
    """Verifying the text's chain against a q it was not drawn from (uniform rows, not the point
    masses) must break the law: the test has power against a mixed draft that mislabels which
    law a window came from."""
    from test_sampling_gof import exact_joint, gof_pvalue, sample_pairs

    target, head = gof_pair
    draft = _mixed(head, target, min_len=1, min_score=0.5)
    real = draft.free_window

    def wrong(cache, seq, gamma, sampling):
        got = real(cache, seq, gamma, sampling)
        return None if got is None else (got[0], np.full((len(got[0]), V), 1.0 / V, np.float32))

    draft.free_window = wrong
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"


def test_the_bench_runs_the_head_with_a_suffix_draft(fitted, tmp_path, capsys):
    """`apps.bench --drafts head+suffix` adds an `sd+head+suffix` row beside the head's own
    rows (no tree row: chains only), equal to `ar` on every prompt."""
    from apps.bench.__main__ import main as bench

    target_dir, _ = fitted
    q = tmp_path / "q.jsonl"
    q.write_text(
        "".join(
            json.dumps({"question_id": i, "category": "c", "turns": [t]}) + "\n"
            for i, t in enumerate(["ab ab ab ab", "the cat the cat"])
        )
    )
    assert (
        bench(
            [
                "--target",
                str(target_dir),
                "--draft",
                "head",
                "--draft-backend",
                "torch",
                "--methods",
                "ar,sd,tree",
                "--drafts",
                "head+suffix",
                "--prompts",
                str(q),
                "--max-tokens",
                "8",
                "--temps",
                "0",
                "--no-warmup",
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in res["rows"]] == ["ar", "sd", "tree", "sd+head+suffix"]
    assert res["mismatches"] == [] and all(r["matches_ar"] == "2/2" for r in res["rows"])


def test_the_head_ends_its_chain_when_unsure(fitted, gof_pair):
    """`stop_below`: the head stops drafting once the product of its max probabilities falls
    below it (EAGLE-2's dynamic length), so windows vary in length; greedy still equals `ar`,
    and at T = 1 the joint law is the target's."""
    from test_sampling_gof import exact_joint, gof_pvalue, sample_pairs

    target_dir, _ = fitted
    target = load_model(target_dir, "torch", threads=1)
    draft = HeadDraft.load(target, target_dir)
    ar = ar_greedy(target, PROMPT, N_NEW)
    draft.stop_below = 0.5
    events = list(greedy_steps("sd", target, draft, PROMPT, N_NEW, gamma=4))
    assert [t for ev in events for t in ev.tokens][:N_NEW] == ar
    assert any(ev.drafted < 4 for ev in events[:-1])  # some windows ended early
    target, head = gof_pair
    head.stop_below = 0.6  # above this head's first max q here: each window stops after one
    try:
        p = gof_pvalue(sample_pairs("sd", target, head, N, seed=0), exact_joint(target))
    finally:
        head.stop_below = 0.0
    assert p > ALPHA, f"sd with an early-stopping head: joint law differs (p = {p:.2e})"


def test_auto_drafts_with_the_targets_own_head(fitted, capsys):
    """A target named alone under `--method auto` drafts with its fitted head, and the output
    is still its own `ar`'s (issue 57: the draft by default)."""
    from runtime.cli_args_auto import own_draft
    from runtime.generate import main as generate

    target_dir, _ = fitted
    assert own_draft(target_dir) == "head"
    ids = ",".join(map(str, PROMPT))
    base = ["--target", str(target_dir), "--prompt-ids", ids, "--max-tokens", "10", "--json"]
    outs = []
    for extra in (["--method", "ar"], []):
        assert generate([*base, "--target-backend", "torch", *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[1]["tokens"] == outs[0]["tokens"]
    assert outs[1]["stats"]["draft_backend"].startswith("head (fitted")
