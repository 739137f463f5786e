"""FlexSpec's evolving targets: LoRA adapters merged at load, and the anchor draft (§IV-A)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_generate_cli import refusal

from runtime.adapter import merged_target_dir, write_base_record
from runtime.errors import DuetError
from runtime.loading import load_pair

# Merged float32 weights vs PEFT's unmerged W x + s B A x: the same sums in another order.
MERGE_LOGIT_ATOL = 1e-4


def make_adapter(base: Path, out: Path, seed: int = 0, r: int = 4) -> Path:
    """A PEFT LoRA adapter with random, non-zero A and B on layers 0..L-2, as evolve writes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    L = m.config.num_hidden_layers
    cfg = LoraConfig(
        r=r,
        lora_alpha=2 * r,
        target_modules=["q_proj", "v_proj", "down_proj"],
        layers_to_transform=list(range(L - 1)),
        layers_pattern="layers",
        init_lora_weights=False,
    )
    torch.manual_seed(seed)
    pm = get_peft_model(m, cfg)
    pm.save_pretrained(str(out))
    write_base_record(out, base)
    return out


def peft_logits(base: Path, adapter: Path, ids: np.ndarray) -> np.ndarray:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    pm = PeftModel.from_pretrained(m, str(adapter)).eval()
    with torch.no_grad():
        return pm(input_ids=torch.from_numpy(ids)).logits.float().numpy()


@pytest.fixture(scope="module")
def base_and_adapter(tmp_path_factory):
    from runtime.testing.random_checkpoint import make_checkpoint

    d = tmp_path_factory.mktemp("evolving")
    base = make_checkpoint(d / "base", "qwen3", num_layers=3, initializer_range=0.1)
    return base, make_adapter(base, d / "lora")


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_adapter_merged_at_load_equals_peft(base_and_adapter, backend):
    base, adapter = base_and_adapter
    ids = np.array([[5, 17, 99, 3, 250, 42, 7]], dtype=np.int64)
    ref = peft_logits(base, adapter, ids)
    plain = load_pair(str(base), None, need_draft=False, target_backend=backend).target
    pair = load_pair(
        str(base), None, need_draft=False, target_backend=backend, adapter=str(adapter)
    )
    got = pair.target.forward(ids, pair.target.new_cache())
    assert np.abs(got - ref).max() <= MERGE_LOGIT_ATOL
    # the adapter does change the model (the comparison is not vacuous)
    assert np.abs(plain.forward(ids, plain.new_cache()) - ref).max() > 100 * MERGE_LOGIT_ATOL


def test_adapter_for_another_base_is_refused(base_and_adapter, tmp_path, capsys):
    from runtime.testing.random_checkpoint import make_checkpoint

    _, adapter = base_and_adapter
    other = make_checkpoint(tmp_path / "other", "qwen3", num_layers=3, seed=1)
    with pytest.raises(DuetError, match="another base"):
        merged_target_dir(other, adapter)
    wider = make_checkpoint(tmp_path / "wide", "qwen3", num_layers=3, hidden_size=96, num_heads=4)
    capsys.readouterr()
    ar = ["--method", "ar", "--prompt-ids", "1,2,3", "--max-tokens", "2"]
    err = refusal(capsys, "--target", str(wider), "--adapter", str(adapter), *ar)
    assert "hidden_size=64" in err, err


def train_anchor(base: Path, out: Path, steps: int = 4, keep_first: int = 0) -> tuple:
    """A few Alg. 1 steps on random tokens; returns (student, out dir)."""
    from apps.train.anchor import AnchorStudent, anchor_step, save_anchor
    from apps.train.checkpoint import load_model
    from apps.train.loop import LoopConfig, train_loop

    teacher = load_model(base).requires_grad_(False)
    student = AnchorStudent(base, seed=0, keep_first=keep_first)
    rng = np.random.default_rng(0)

    def batches():
        while True:
            w = torch.from_numpy(rng.integers(3, 300, size=(2, 17)))
            yield w[:, :-1], w[:, 1:]

    cfg = LoopConfig(stage="anchor-test", steps=steps, lr=1e-2, warmup=1, bf16=False)
    out.mkdir(parents=True, exist_ok=True)
    train_loop(
        student,
        anchor_step(teacher, student, 0.01, 1.0, 1.0),
        batches(),
        cfg,
        out / "loss_log.jsonl",
    )
    save_anchor(student, out, base, {"anchor_layer": 2, "steps": steps, "keep_first": keep_first})
    return student, out


def assert_sd_equals_ar(base: Path, adapter: Path, anchor: Path, n: int, gamma: int) -> None:
    """Greedy sd with the anchor draft equals ar on base + adapter, for n new tokens."""
    from runtime.decoding import make_steps, run
    from runtime.decoding.events import GREEDY

    pair = load_pair(
        str(base), str(anchor), need_draft=True, target_backend="torch", adapter=str(adapter)
    )
    ids = [5, 17, 99, 3]
    ar = run(
        make_steps("ar", pair.target, None, ids, max_new=n, sampling=GREEDY, seed=0), max_new=n
    )
    sd = run(
        make_steps(
            "sd", pair.target, pair.draft, ids, max_new=n, sampling=GREEDY, seed=0, gamma=gamma
        ),
        max_new=n,
    )
    assert sd.tokens == ar.tokens and len(ar.tokens) == n


def test_anchor_frozen_parts_stay_bit_identical(base_and_adapter, tmp_path):
    from safetensors.torch import load_file

    from runtime.anchor import materialize

    base, _ = base_and_adapter
    student, out = train_anchor(base, tmp_path / "anchor")
    b = load_file(str(base / "model.safetensors"))
    s = student.draft.state_dict()
    for k, v in b.items():
        if k.startswith("model.layers.2."):  # the anchor block B_L
            assert torch.equal(s["model.layers.0." + k[len("model.layers.2.") :]], v.float()), k
    assert torch.equal(s["model.embed_tokens.weight"], b["model.embed_tokens.weight"].float())
    assert torch.equal(s["lm_head.weight"], b["lm_head.weight"].float())
    assert torch.count_nonzero(s["model.layers.1.self_attn.o_proj.weight"]) == 0
    # the shipped draft, assembled against the base, has the same frozen block
    d = load_file(str(materialize(out, [base]) / "model.safetensors"))
    assert torch.equal(
        d["model.layers.0.mlp.down_proj.weight"], b["model.layers.2.mlp.down_proj.weight"].float()
    )
    assert json.loads((out / "anchor.json").read_text())["base"]["model_type"] == "qwen3"


def test_anchor_refuses_another_base(base_and_adapter, tmp_path):
    from runtime.anchor import materialize
    from runtime.testing.random_checkpoint import make_checkpoint

    base, _ = base_and_adapter
    _, out = train_anchor(base, tmp_path / "anchor", steps=1)
    (out / "anchor.json").write_text(
        json.dumps({**json.loads((out / "anchor.json").read_text()), "base_hint": "nowhere"})
    )
    other = make_checkpoint(tmp_path / "other", "qwen3", num_layers=3, seed=3)
    with pytest.raises(DuetError, match="anchor draft for the base"):
        materialize(out, [other])


def test_anchor_draft_exports_to_onnx_with_parity(base_and_adapter, tmp_path, capsys):
    from test_onnx_export import export_onnx_cli

    from runtime.anchor import materialize

    base, _ = base_and_adapter
    _, out = train_anchor(base, tmp_path / "anchor", steps=2)
    d = materialize(out, [base])
    capsys.readouterr()
    rc = export_onnx_cli(d, tmp_path / "anchor.onnx", "--json")
    info = json.loads(capsys.readouterr().out)
    assert rc == 0 and info["ok"] and info["parity"]["max_abs"] <= info["tolerance"]


def test_greedy_sd_with_anchor_equals_ar_on_evolved_target(base_and_adapter, tmp_path):

    base, adapter = base_and_adapter
    _, out = train_anchor(base, tmp_path / "anchor", steps=2)
    assert_sd_equals_ar(base, adapter, out, n=24, gamma=4)


def test_the_evolving_bench_runs_on_any_base(base_and_adapter, tmp_path, capsys):
    """`apps.bench evolving --base DIR --evolved DIR --generic DIR`: a base other than the
    embedded one, its LoRA targets found by name, a missing full fine-tune reported with the
    command that builds it, and every row's acceptance a fraction."""
    import shutil

    from apps.bench import evolving
    from runtime.testing.random_checkpoint import make_checkpoint

    base, adapter = base_and_adapter
    ev = tmp_path / "evolved"
    shutil.copytree(adapter, ev / "lora-docstrings")  # the domain every Python has
    train_anchor(base, ev / "anchor", steps=1)
    generic = make_checkpoint(tmp_path / "generic", "qwen3", num_layers=1, seed=5)
    capsys.readouterr()
    rc = evolving.main(
        [
            "--base",
            str(base),
            "--evolved",
            str(ev),
            "--generic",
            str(generic),
            "--link",
            "none",
            "--prompts",
            "1",
            "--prompt-tokens",
            "8",
            "--max-tokens",
            "6",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    rows = json.loads(out)["rows"]
    assert rc == 0 and "full fine-tune missing" in err and "--full" in err
    seen = {(r["draft"], r["target"], r["prompts"]) for r in rows}
    assert seen == {
        (d, t, p)
        for d in ("generic", "anchor")
        for t, p in (("base", "stdlib"), ("lora-docstrings", "docstrings"), ("base", "docstrings"))
    }
    assert all(0 <= r[k] <= 1 for r in rows for k in ("acceptance_greedy", "acceptance_t1"))
    assert (
        evolving.main(["--base", str(base), "--evolved", str(tmp_path / "none"), "--link", "none"])
        == 2
    )  # no generic draft: one line
    err = capsys.readouterr().err
    assert "no generic draft" in err and len(err.strip().splitlines()) == 1


def test_an_anchor_for_a_tied_base_materializes(tmp_path):
    """A base whose LM head is its embedding (SmolLM2, Gemma 3) gets an anchor draft with a
    separate LM head tensor equal to that embedding."""
    from safetensors.torch import load_file

    from runtime.anchor import materialize
    from runtime.testing.random_checkpoint import make_checkpoint

    base = make_checkpoint(tmp_path / "tied", "llama", num_layers=2, tie_word_embeddings=True)
    _, out = train_anchor(base, tmp_path / "anchor", steps=1)
    d = load_file(str(materialize(out, [base]) / "model.safetensors"))
    assert torch.equal(d["lm_head.weight"], d["model.embed_tokens.weight"])


def test_the_ablation_anchor_keeps_the_first_blocks_and_is_lossless(base_and_adapter, tmp_path):
    """`apps.train anchor --keep-first 1` (an ablation, not eq. 4): the base's block 0, then its
    last block, then the head; frozen parts bit-exact, the head's the only trained tensors, and
    greedy sd with it equals ar on an evolved target."""
    from safetensors.torch import load_file

    from runtime.anchor import materialize

    base, adapter = base_and_adapter
    student, out = train_anchor(base, tmp_path / "ablation", steps=2, keep_first=1)
    assert {k for k, p in student.draft.named_parameters() if p.requires_grad} == {
        k
        for k in student.draft.state_dict()
        if k.startswith(
            ("model.layers.2.mlp.", "model.layers.2.post_attention_layernorm.", "model.norm.")
        )
    }
    assert set(load_file(str(out / "anchor_head.safetensors"))) <= {
        k for k in student.draft.state_dict() if k.startswith(("model.layers.2.", "model.norm."))
    }
    b = load_file(str(base / "model.safetensors"))
    d = materialize(out, [base])
    s = load_file(str(d / "model.safetensors"))
    assert json.loads((d / "config.json").read_text())["num_hidden_layers"] == 3
    for k, v in b.items():
        if k.startswith("model.layers.0."):
            assert torch.equal(s[k], v.float()), k
        if k.startswith("model.layers.2."):  # the base's last block is the draft's block 1
            assert torch.equal(s["model.layers.1." + k[len("model.layers.2.") :]], v.float()), k
    assert torch.count_nonzero(s["model.layers.2.self_attn.o_proj.weight"]) == 0
    assert_sd_equals_ar(base, adapter, out, n=16, gamma=3)


def test_keep_first_beyond_the_base_is_one_line(base_and_adapter, tmp_path):
    from apps.train.anchor import build_parser, run

    base, _ = base_and_adapter  # 3 blocks: 0 or 1 may be kept before the last
    with pytest.raises(DuetError, match="--keep-first 2: the base has 3 blocks; keep 0 to 1"):
        run(
            build_parser().parse_args(
                ["--base", str(base), "--out", str(tmp_path / "a"), "--keep-first", "2"]
            )
        )
