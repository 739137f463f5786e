"""Drafts copied from the target's own layers (`draft-tune --from-target-layers`, issue 11's
scaled drafts): the copy is the target's computation when it keeps every layer, an ordinary
checkpoint the runtime's loaders read when it keeps some, and bad layer lists are one line,
exit 2."""

import json

import numpy as np
import pytest
import torch

from apps.train import draft_tune
from apps.train.checkpoint import BF16_LOGIT_RTOL, REFERENCE_ATOL, load_model, save_model
from apps.train.draft_tune import parse_layers, target_layer_draft
from apps.train.tokenizer import eos_id, load_tokenizer, save_tokenizer
from runtime.errors import DuetError

IDS = [[5, 6, 7, 8, 9, 10, 11]]
ONNX_ATOL = 1e-4  # ONNX Runtime against the torch backend on the same float32 weights


@pytest.fixture(scope="module")
def target(tiny_dir):
    return tiny_dir("qwen3", num_layers=3)


@torch.no_grad()
def _logits(model, ids=IDS) -> torch.Tensor:
    return model(input_ids=torch.tensor(ids)).logits.float()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_all_layers_in_order_is_the_target(tiny_dir, arch):
    teacher = load_model(tiny_dir(arch, num_layers=3))
    draft = target_layer_draft(teacher, [0, 1, 2])
    assert torch.equal(_logits(draft), _logits(teacher))  # the same modules, the same sums
    assert all(p.requires_grad for p in draft.parameters())  # it is trained next
    assert not any(p.requires_grad for p in teacher.requires_grad_(False).parameters())


def test_subset_is_a_renumbered_copy(target):
    teacher = load_model(target)
    before = _logits(teacher)
    draft = target_layer_draft(teacher, [2, 0])  # order as given, not sorted
    assert draft.config.num_hidden_layers == 2 and len(draft.model.layers) == 2
    assert [m.self_attn.layer_idx for m in draft.model.layers] == [0, 1]
    assert torch.equal(
        draft.model.layers[0].mlp.up_proj.weight, teacher.model.layers[2].mlp.up_proj.weight
    )
    # a copy, not a view: training the draft leaves the target alone
    with torch.no_grad():
        draft.model.layers[0].mlp.up_proj.weight.add_(1.0)
        draft.lm_head.weight.add_(1.0)
    assert teacher.config.num_hidden_layers == 3
    assert [m.self_attn.layer_idx for m in teacher.model.layers] == [0, 1, 2]
    assert torch.equal(_logits(teacher), before)


def test_subset_saves_and_loads_in_the_runtime(target, tmp_path):
    from runtime.backends import load_model as load_runtime

    teacher = load_model(target)
    layers = [0, 2]
    draft = target_layer_draft(teacher, layers).eval()
    tok = tmp_path / "tok"
    save_tokenizer(load_tokenizer(target), tok)
    out = save_model(draft, tmp_path / "draft", tok, eos_id(load_tokenizer(target)))
    ref = _logits(draft).numpy()
    scale = max(float(np.abs(ref).max()), 1.0)
    hf = _logits(load_model(out)).numpy()  # bf16 weights on disk
    assert np.abs(hf - ref).max() <= BF16_LOGIT_RTOL * scale
    ids = np.array(IDS)
    rt = load_runtime(out, "torch", threads=1)
    assert rt.config.num_layers == len(layers)
    got = rt.forward(ids, rt.new_cache())
    assert np.abs(got - hf).max() <= REFERENCE_ATOL * scale  # Duet's reference = transformers
    ox = load_runtime(out, "onnx")  # exported on the fly, as the runtime runs drafts
    assert ox.config.num_layers == len(layers)
    assert np.abs(ox.forward(ids, ox.new_cache()) - got).max() <= ONNX_ATOL * scale


def test_linear_attention_layers_are_refused(tiny_dir):
    teacher = load_model(tiny_dir("qwen3_5_text", num_layers=4))
    linear = teacher.config.layer_types.index("linear_attention")
    with pytest.raises(DuetError, match=f"not {linear} \\(linear_attention\\)"):
        target_layer_draft(teacher, [linear])


@pytest.mark.parametrize(
    "text, needle",
    [
        ("3", "0..2"),
        ("-1", "0..2"),
        ("0,0", "distinct"),
        ("", "distinct"),
        (",", "distinct"),
        ("0,x", "layer numbers"),
        ("1.5", "layer numbers"),
    ],
)
def test_parse_layers_refusals(text, needle):
    with pytest.raises(DuetError, match=needle) as e:
        parse_layers(text, 3)
    assert "\n" not in str(e.value) and "--from-target-layers" in str(e.value)


def test_parse_layers_keeps_order():
    assert parse_layers("2, 0,1", 3) == [2, 0, 1]


@pytest.fixture
def tune_args(target, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        body = "".join(f"def f{j}(x):\n    return x * {j} + {i}\n" for j in range(20))
        (corpus / f"m{i}.py").write_text(body)
    return [
        "--target",
        str(target),
        "--corpus",
        str(corpus),
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--threads",
        "1",
        "--eval-heldout-tokens",
        "32",
    ]


def test_tune_from_target_layers_end_to_end(tune_args, tmp_path, capsys):
    from runtime.backends import load_model as load_runtime

    out = tmp_path / "l1"
    argv = [*tune_args, "--from-target-layers", "0,2", "--steps", "2", "--no-eval",
            "--out", str(out)]  # fmt: skip
    assert draft_tune.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] == 2 and report["start_draft"] == "target layers 0,2"
    assert report["device"] == "cpu" and "evaluation" not in report
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    rt = load_runtime(out, "torch", threads=1)
    assert rt.forward(np.array(IDS), rt.new_cache()).shape == (1, len(IDS[0]), 320)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--from-target-layers", "3"], "0..2"),
        (["--from-target-layers", ""], "distinct"),
        (["--from-target-layers", "0,a"], "layer numbers"),
        (["--from-target-layers", "0", "--draft", "TARGET"], "not with --draft"),
        (["--from-target-layers", "0", "--eval-only"], "not with --draft or --eval-only"),
        (["--from-target-layers", "0", "--device", "cuda"], "--device cuda"),
    ],
)
def test_bad_tune_input_is_one_line_exit_2(tune_args, target, tmp_path, capsys, extra, needle):
    if "cuda" in extra and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: --device cuda is valid here")
    out = tmp_path / "o"
    extra = [str(target) if x == "TARGET" else x for x in extra]
    assert draft_tune.main([*tune_args, *extra, "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()  # refused before anything is written
