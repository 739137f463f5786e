"""The one text-tower rule (runtime/text_tower.py) every backend loads a multimodal checkpoint
through: both prefixes renamed, vision weights dropped with one stderr line, `mtp.*` set aside
unless kept, a plain checkpoint's names untouched."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import save_file

from runtime.text_tower import is_vision, say_vision_ignored, text_name, text_tower

GEMMA = {  # a multimodal gemma3 layout (both spellings transformers has written)
    "model.language_model.layers.0.self_attn.q_proj.weight": 1,
    "language_model.model.norm.weight": 2,
    "language_model.lm_head.weight": 3,
    "vision_tower.vision_model.embeddings.patch_embedding.weight": 4,
    "model.multi_modal_projector.mm_input_projection_weight": 5,
}
QWEN = {  # a multimodal qwen3_5 layout
    "model.language_model.embed_tokens.weight": 1,
    "model.visual.blocks.0.attn.qkv.weight": 2,
    "lm_head.weight": 3,
    "mtp.fc.weight": 4,
}


def test_both_prefixes_become_the_text_models_names():
    assert text_tower(GEMMA) == {
        "model.layers.0.self_attn.q_proj.weight": 1,
        "model.norm.weight": 2,
        "lm_head.weight": 3,
    }
    assert text_name("language_model.model.x") == text_name("model.language_model.x") == "model.x"


def test_vision_is_dropped_with_one_line_naming_the_checkpoint(capsys):
    assert text_tower(QWEN, "ckpt") == {"model.embed_tokens.weight": 1, "lm_head.weight": 3}
    assert capsys.readouterr().err == "ckpt: text tower only; ignoring 1 vision weights\n"
    text_tower(GEMMA, "g")
    assert "g: text tower only; ignoring 2 vision weights" in capsys.readouterr().err
    text_tower(GEMMA)  # no path: silent
    assert capsys.readouterr().err == ""


def test_mtp_is_set_aside_unless_kept():
    assert "mtp.fc.weight" not in text_tower(QWEN)
    assert text_tower(QWEN, keep_mtp=True)["mtp.fc.weight"] == 4


def test_a_text_checkpoint_passes_unchanged(capsys):
    plain = {"model.embed_tokens.weight": 1, "model.layers.0.mlp.up_proj.weight": 2,
             "lm_head.weight": 3}  # fmt: skip
    assert text_tower(plain, "p") == plain
    assert not any(is_vision(k) for k in plain)
    assert capsys.readouterr().err == ""


def test_vision_weights_are_counted_from_the_files(tmp_path, capsys):
    z = np.zeros(1, np.float32)
    save_file({k: z for k in GEMMA}, str(tmp_path / "model.safetensors"))
    say_vision_ignored(tmp_path)
    assert capsys.readouterr().err == f"{tmp_path}: text tower only; ignoring 2 vision weights\n"
