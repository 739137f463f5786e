"""The registry's real models (`python -m apps.models pull NAME`): greedy `ar` equals Hugging Face
`generate` token for token, on plain and chat-templated prompts, on the PyTorch and MLX
backends; `sd` with a draft cut from the target's first layers equals `ar`, and so does
`flexspec` through a loopback verifier (raw rows of the real vocabulary, ids, K* over K ≥ 0).

Marked `real`: each test skips, naming the pull command, where its model is not pulled
(`.ci/run` pulls both first), so `python -m pytest` stays offline.
"""

import json

import pytest

from runtime.registry import KNOWN, cached_checkpoint, pull_command

pytestmark = pytest.mark.real

NEW_TOKENS = 64
PLAIN = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
CHAT = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


def pulled(name: str):
    d = cached_checkpoint(name)
    if d is None:
        pytest.skip(f"{name} is not pulled: `{pull_command(name)}`")
    return d


@pytest.fixture(scope="module", params=list(KNOWN))
def real(request):
    """(name, checkpoint dir, HF tokenizer, HF model) for each known model that is pulled."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = pulled(request.param)
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return request.param, d, tok, model


def prompt_ids(tok, kind: str) -> list[int]:
    if kind == "plain":
        return tok(PLAIN).input_ids
    if tok.chat_template is None:
        pytest.skip("a base model without a chat template: plain completion only")
    out = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)
    return list(out["input_ids"])


def hf_greedy(model, ids: list[int]) -> list[int]:
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(ids) :].tolist()


def duet(capsys, target, ids, *extra) -> list[int]:
    from runtime.generate import main

    rc = main(
        [
            "--target",
            str(target),
            "--prompt-ids",
            ",".join(map(str, ids)),
            "--max-tokens",
            str(NEW_TOKENS),
            "--json",
            *extra,
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)["tokens"]


@pytest.mark.parametrize("kind", ["plain", "chat"])
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_greedy_ar_equals_hugging_face_generate(real, capsys, kind, backend):
    name, d, tok, model = real
    ids = prompt_ids(tok, kind)
    want = hf_greedy(model, ids)
    got = duet(capsys, name, ids, "--method", "ar", "--target-backend", backend)
    assert got == want, f"{name} {backend} {kind}: first difference at " + str(
        next(
            (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
            min(len(got), len(want)),
        )
    )
    assert len(got) == NEW_TOKENS  # the prompts run past 64 tokens: the whole window is compared


def cut_draft(src, out, layers: int = 4):
    """A draft made of the target's first `layers` layers (and its embeddings, norm and head)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:layers]
    (out / "config.json").write_text(json.dumps(cfg))
    keep = {}
    for f in src.glob("*.safetensors"):
        for k, v in load_file(str(f)).items():
            parts = k.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            keep[k] = v
    save_file(keep, str(out / "model.safetensors"))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).is_file():
            shutil.copy(src / f, out / f)
    return out


def test_sd_with_a_draft_cut_from_the_target_equals_ar(real, capsys, tmp_path):
    name, d, tok, _ = real
    ids = prompt_ids(tok, "plain")
    draft = cut_draft(d, tmp_path / "draft")
    ar = duet(capsys, name, ids, "--method", "ar")
    sd = duet(
        capsys,
        name,
        ids,
        "--method",
        "sd",
        "--draft",
        str(draft),
        "--draft-backend",
        "torch",
        "--gamma",
        "4",
    )
    assert sd == ar


def test_flexspec_over_the_wire_equals_ar(real, verifier, tmp_path):
    """FlexSpec on a real vocabulary through a loopback verifier: raw rows (49,152 or 262,144
    floats a draft token), ids, and K* over K ≥ 0; greedy equals the target's own `ar`."""
    from edge_helpers import ar_tokens, flexspec

    from devices.kstar import AdaptiveK
    from runtime.backends import load_model
    from runtime.edge.client import Connection

    name, d, tok, _ = real
    ids = prompt_ids(tok, "plain")
    target = load_model(d, "torch", threads=2)
    draft = load_model(cut_draft(d, tmp_path / "draft"), "torch", threads=1)
    ref = ar_tokens(target, ids, 24)
    st = verifier(target)
    conn = Connection(st.host, st.port)
    try:
        for opts in (
            {"k": 3, "codec": "raw"},
            {"k": 3, "codec": "ids"},
            {"controller": AdaptiveK(k_min=0), "codec": "ids"},
        ):
            assert flexspec(conn, draft, ids, 24, **opts).tokens == ref, (name, opts)
    finally:
        conn.close()
