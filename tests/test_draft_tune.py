"""`python -m apps.train draft-tune` on a tiny random pair: it trains, saves a draft that loads
back, leaves the starting draft alone, evaluates, and turns bad input into one line, exit 2."""

import hashlib
import json

import numpy as np
import pytest

from apps.train import draft_tune
from apps.train.draft_eval import law_metrics


@pytest.fixture
def setup(tiny_dir, tmp_path):
    target = tiny_dir("qwen3", num_layers=2)
    draft = tiny_dir("qwen3", hidden_size=32, num_layers=1, tie_word_embeddings=True, seed=1)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        body = "".join(f"def f{j}(x):\n    return x * {j} + {i}\n" for j in range(30))
        (corpus / f"m{i}.py").write_text(body)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"def g{i}(y):\n"]}) + "\n" for i in range(2)))
    common = ["--target", str(target), "--corpus", str(corpus), "--prompts", str(prompts),
              "--eval-prompts", "2", "--eval-tokens", "4", "--eval-heldout-tokens", "64",
              "--seq-len", "32", "--batch-size", "2", "--threads", "1"]  # fmt: skip
    return target, draft, tmp_path, common


def _sha(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_tune_saves_a_loadable_draft(setup, capsys):
    from apps.train.checkpoint import load_model
    from runtime.backends import load_model as load_runtime

    target, draft, tmp, common = setup
    before = _sha(draft)
    out = tmp / "tuned"
    argv = [*common, "--draft", str(draft), "--out", str(out), "--steps", "4", "--log-every",
            "2", "--ckpt-every", "2", "--lr", "1e-2", "--tv-weight", "1.0"]  # fmt: skip
    assert draft_tune.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 4 and report["tv_weight"] == 1.0
    assert _sha(draft) == before  # the starting draft is only read
    assert _sha(out) != before  # and the saved one moved
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "draft_tune.json"):
        assert (out / name).is_file(), name
    logged = [json.loads(x) for x in (out / "loss_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 4] and all("tv" in r for r in logged)
    m = load_model(out)
    assert m.config.vocab_size == 320 and next(m.parameters()).dtype.is_floating_point
    rt = load_runtime(out, "torch", threads=1)
    assert rt.forward(np.array([[5, 6, 7]]), rt.new_cache()).shape == (1, 3, 320)
    ev = report["evaluation"]
    assert ev["positions"] == 8 and ev["heldout_tokens"] == 64
    assert 0.0 <= ev["accept_T1_topp0.9"] <= 1.0 and 0.0 <= ev["tv_T1"] <= 1.0


def test_eval_only_target_as_its_own_draft(setup, capsys):
    target, draft, _, common = setup
    argv = [*common, "--draft", str(target), "--compare", str(draft), "--eval-only"]
    assert draft_tune.main(argv) == 0
    ev = json.loads(capsys.readouterr().out)["evaluation"]
    assert ev["accept_T1_topp0.9"] == pytest.approx(1.0, abs=1e-4)
    assert ev["greedy_top1"] == 1.0 and ev["greedy_top1_T0_contexts"] == 1.0
    assert ev["tv_T1"] == pytest.approx(0.0, abs=1e-4) and ev["heldout_top1"] == 1.0
    # the random draft, paired on the same contexts: the difference is 1 - its acceptance
    cmp, diff = ev["compare"], ev["draft_minus_compare"]
    assert cmp["positions"] == ev["positions"] and cmp["accept_T1_topp0.9"] < 0.9
    d = diff["accept_T1_topp0.9"]
    assert d["diff"] == pytest.approx(1.0 - cmp["accept_T1_topp0.9"], abs=2e-4)
    assert 0 < d["ci95"][0] <= d["diff"] <= d["ci95"][1]


def test_law_metrics_by_hand():
    t = np.log(np.array([[0.5, 0.3, 0.2]], np.float32))
    d = np.log(np.array([[0.2, 0.3, 0.5]], np.float32))
    m = law_metrics(t, d, 1.0)
    assert m["accept"][0] == pytest.approx(0.2 + 0.3 + 0.2, abs=1e-5)  # Σ min(p, q)
    assert m["tv"][0] == pytest.approx(0.3, abs=1e-5) and m["greedy"][0] == 0.0
    # top-p 0.75: p keeps {0, 1} -> (0.625, 0.375, 0); q keeps {2, 1} -> (0, 0.375, 0.625)
    assert law_metrics(t, d, 0.75)["accept"][0] == pytest.approx(0.375, abs=1e-5)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--lr", "0", "--steps", "1"], "--lr"),
        (["--tv-weight", "-1", "--steps", "1"], "--tv-weight"),
        (["--eval-top-p", "1.5", "--eval-only"], "--eval-top-p"),
        (["--steps", "1"], "--out"),
        (["--out", "OUT"], "--steps or --time-budget-min"),
        (["--out", "TARGET", "--steps", "1"], "target directory"),
        (["--out", "JUNK", "--steps", "1"], "not a checkpoint directory"),
        (["--draft", "MISSING", "--eval-only"], "--draft"),
        (["--compare", "OUT", "--out", "OUT", "--steps", "1"], "--eval-only"),
    ],
)
def test_bad_input_is_one_line_exit_2(setup, capsys, extra, needle):
    target, draft, tmp, common = setup
    junk = tmp / "junk"
    junk.mkdir(exist_ok=True)
    (junk / "notes.txt").write_text("keep me")
    subst = {"OUT": str(tmp / "o"), "TARGET": str(target), "JUNK": str(junk),
             "MISSING": str(tmp / "missing")}  # fmt: skip
    extra = [subst.get(x, x) for x in extra]
    argv = [*common, *([] if "--draft" in extra else ["--draft", str(draft)]), *extra]
    assert draft_tune.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert (junk / "notes.txt").read_text() == "keep me"


def test_a_real_tokenizers_end_token_separates_documents(tiny_dir, tmp_path):
    """A tokenizer without our <|endoftext|> (Gemma 3's) ends documents with the end token its
    checkpoint's config names; with neither, one clear error."""
    import json

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from apps.train.tokenizer import eos_id
    from runtime.config import ModelConfig
    from runtime.errors import DuetError

    cfg = json.loads(
        (tiny_dir("gemma3_text", num_layers=1, hidden_size=32, seed=7) / "config.json").read_text()
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"eos_token_id": 1}))
    tok = Tokenizer(WordLevel({"a": 0, "<eos>": 1}, unk_token="a"))
    assert eos_id(tok, tmp_path) == ModelConfig.from_dir(tmp_path).eos_token_ids[0] == 1
    with pytest.raises(DuetError, match="nothing ends a document"):
        eos_id(tok)
